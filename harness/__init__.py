"""The `bench` harness: run arms against fresh servers, collect facts, compare, report."""
