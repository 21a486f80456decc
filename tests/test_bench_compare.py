"""`bench compare RUN_A RUN_B`: two recorded runs as arms A and B, and the run directories it
reads: another schema refused, a version-1 directory read with the same figures."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest
from typer.testing import CliRunner

from harness.analysis.summary import summarize
from harness.cli import app
from harness.results import load_run
from tests.synthetic_run import ARMS, PLOTS, RATES, steady_tok_per_s, write_run

SINGLE = [{**ARMS[0], "letter": letter, "name": "nightly"} for letter in "AB"]


def test_one_run_a_side_is_a_descriptive_change_with_no_verdict(tmp_path):
    """Between recorded runs the run is the unit: one run a side cannot tell the code from the
    day, so the change has no interval, no verdict and no failing exit code (defect 1)."""
    single = {"letters": "AA", "arms": SINGLE}
    last = write_run(
        tmp_path / "last", [1000.0, 1010.0, 990.0, 1005.0], **single, run_id="last-night"
    )
    today = write_run(tmp_path / "today", [900.0, 905.0, 890.0, 910.0], **single, run_id="today")
    out = tmp_path / "report"
    args = ["compare", str(tmp_path / "last"), str(tmp_path / "today")]
    result = CliRunner().invoke(app, [*args, "--json", "--report", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout[: result.stdout.rindex("}") + 1])
    assert data["labels"] == {"A": "last-night", "B": "today"} and not data["regression"]
    assert data["unit"] == "runs"
    headline = data["figures"][0]
    for key, rows in (("servers_a", last), ("servers_b", today)):
        expect = [steady_tok_per_s(rows["requests"], s) for s in rows["servers"]]
        assert headline[key] == pytest.approx(expect, rel=1e-6)
    change = headline["change"]
    assert change["verdict"] == "no verdict" and change["method"] == "descriptive"
    assert change["low"] is None and change["ratio"] == pytest.approx(0.9, abs=0.01)
    assert any("the change is descriptive, with no verdict" in d for d in data["doubts"])
    md = (out / "report.md").read_text()
    assert "**No verdict** on output tok/s (steady)" in md and "descriptive" in md
    assert "| B | today: nightly |" in md and re.search(r"\| `worker.step.forward` \|", md)
    assert all((out / "plots" / f"{p}.png").exists() for p in PLOTS)
    shown = CliRunner().invoke(app, args)
    assert "one run a side: every change is descriptive" in " ".join(shown.output.split())


def test_repeated_runs_a_side_give_a_verdict_over_runs(tmp_path):
    single = {"letters": "AA", "arms": SINGLE}
    for i, level in enumerate((1000.0, 1012.0, 994.0)):
        write_run(tmp_path / "base" / f"r{i}", [level, level + 5, level - 5, level], **single)
    for i, level in enumerate((900.0, 905.0, 897.0)):
        write_run(tmp_path / "pr" / f"r{i}", [level, level + 5, level - 5, level], **single)
    result = CliRunner().invoke(
        app, ["compare", str(tmp_path / "base"), str(tmp_path / "pr"), "--json"]
    )
    assert result.exit_code == 1, result.output  # B slower over runs: a regression
    data = json.loads(result.stdout[: result.stdout.rindex("}") + 1])
    change = data["figures"][0]["change"]
    assert change["method"] == "runs" and change["df"] == 4 and change["blocks"] == 6
    assert change["verdict"] == "slower" and change["low"] <= 0.9 <= change["high"]
    assert data["labels"] == {"A": "base (3 runs)", "B": "pr (3 runs)"}
    assert len({s["block"] for s in data["servers"]}) == 6  # one block per run
    # the same runs at --confidence 0.9999: t at 4 df is 15.5, not 2.78, so the interval holds
    # the 95% one and is over 5 times as wide; still "slower" (-10%, runs within 1%)
    strict = CliRunner().invoke(
        app, ["compare", str(tmp_path / "base"), str(tmp_path / "pr"), "--json",
              "--confidence", "0.9999"],
    )  # fmt: skip
    assert strict.exit_code == 1, strict.output
    wide = json.loads(strict.stdout[: strict.stdout.rindex("}") + 1])
    assert wide["rule"]["level"] == 0.9999 and data["rule"]["level"] == 0.95
    wider = wide["figures"][0]["change"]
    assert wider["low"] < change["low"] and change["high"] < wider["high"] < 1
    assert wider["high"] - wider["low"] > 5 * (change["high"] - change["low"])


def test_bench_compare_refuses_another_schema(tmp_path):
    write_run(tmp_path / "a", RATES[:4])
    write_run(tmp_path / "b", RATES[:4])
    manifest = json.loads((tmp_path / "b/manifest.json").read_text())
    (tmp_path / "b/manifest.json").write_text(json.dumps(manifest | {"schema_version": 0}))
    result = CliRunner().invoke(app, ["compare", str(tmp_path / "a"), str(tmp_path / "b")])
    assert result.exit_code == 2 and result.output.count("error:") == 1
    assert "has results schema 0" in " ".join(result.output.split())


def test_a_version_1_directory_is_read_with_the_same_figures(tmp_path):
    """Version 1 stored no letter or server on request and span rows (and no server id on
    servers); it is read as version 2, its rows given their server's, and summarised alike."""
    write_run(tmp_path / "run", RATES[:4])
    manifest, frames = load_run(tmp_path / "run")
    old = tmp_path / "old"
    old.mkdir()
    (old / "manifest.json").write_text(json.dumps(manifest | {"schema_version": 1}))
    dropped = {"requests": ["letter", "server"], "spans": ["letter"], "servers": ["server"]}
    for name, columns in dropped.items():
        frames[name].drop(columns=columns).to_parquet(old / f"{name}.parquet")
    manifest_1, frames_1 = load_run(old)
    for name, frame in frames.items():
        pd.testing.assert_frame_equal(frames_1[name], frame, check_dtype=False)
    assert summarize(manifest_1, frames_1).to_json() == summarize(manifest, frames).to_json()


@pytest.mark.parametrize("aa_check", [True, False])
def test_an_aa_checks_verdict_is_said_to_be_a_false_one(tmp_path, aa_check):
    """A run whose arms are one code (manifest `aa_check`) that still reads "slower": the
    doubts say the verdict is a false one and how often the level gives one; a run of two codes
    says nothing of the kind."""
    from harness.analysis.summary import summarize

    rates = [1000.0, 900.0, 905.0, 1004.0, 998.0, 897.0, 902.0, 1001.0]
    write_run(tmp_path / "run", rates, letters="ABBA")
    manifest, frames = load_run(tmp_path / "run")
    result = summarize({**manifest, "aa_check": aa_check}, frames)
    assert result.headline_row.change.verdict == "slower"
    said = [d for d in result.doubts if d.startswith("an A/A check")]
    if aa_check:
        (doubt,) = said
        assert "read 'slower' on its headline: a false verdict" in doubt
        assert "intervals at 95% give in up to 5% of A/A runs" in doubt and "0.999" in doubt
    else:
        assert said == []
