"""`bench <verb> --help` as a newcomer reads it: no typer type tags, a plain word for each
value (N, X, PATH, TEXT), nothing for a flag, and the defaults that come from elsewhere said."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from harness.cli import COMMANDS, app

TAGS = ("<bool>", "<int", "<float", "<str>", "<list[", "<path>", "[x>=", "[x<=")


@pytest.mark.parametrize("verb", [verb for verb, _module in COMMANDS])
def test_help_shows_no_type_tags(verb):
    result = CliRunner().invoke(app, [verb, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert not [tag for tag in TAGS if tag in result.output], result.output


def test_run_help_says_the_defaults_of_the_load_and_what_the_period_is():
    text = " ".join(
        CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "200"}).output.split()
    )
    assert "--blocks N" not in text and "--blocks" in text  # the word sits in its own column
    assert "give -c or --request-rate" in text and "default there: 1024" in text
    assert text.count("(default: the scenario's; bench scenarios)") == 2  # requests, warmup
    assert "each span's timings are sent as one record" in text


def test_output_to_a_log_is_wide_enough_to_keep_numbers_whole(monkeypatch):
    """Not a terminal (pytest captures stdout) and no COLUMNS: the tables' width is LOG_WIDTH,
    not rich's 80, at which a change column split its numbers across lines; COLUMNS rules."""
    from harness.show import console

    monkeypatch.delenv("COLUMNS", raising=False)
    assert console.output().width == console.notes().width == console.LOG_WIDTH
    monkeypatch.setenv("COLUMNS", "100")
    assert console.output().width == 100
