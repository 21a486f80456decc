"""`python -m harness ...` is `bench ...`."""

from harness.cli import app

app(prog_name="bench")
