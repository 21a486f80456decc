"""The graph runtime: per-request walks and loops, declared stop policies, phased postprocess."""
