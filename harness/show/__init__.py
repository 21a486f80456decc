"""Showing: terminal tables, progress, the report and its plots and HTML. It lays out what
analysis computed and computes nothing of its own; it imports analysis, never measure."""
