"""The mock server (`bench mock`): server.py answers, pacer.py writes tokens on time, stats.py
keeps what it saw."""
