"""Measuring: the arms, the servers, the load generator, the span collector, the runner
that drives a schedule of slots, and the mock server. What it records follows
analysis/schema.py; it imports analysis, never show."""
