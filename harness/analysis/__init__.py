"""Analysis: the results schema, metrics, phases, statistics, the comparison, power.
Pure functions over DataFrames and dataclasses: no printing, no plotting, no file writes
(tests/test_harness_layers.py holds it to that)."""
