"""`bench run orpheus --concurrency 8 --size tiny` on the CPU: both nodes on each server, the
speech load's audio counted from the bytes received, audio-seconds/s the headline of the
table, spans per node. One A B block, two servers: what is held here is each server's, and
the schedule's order (A B B A) is the scenario-blind runner's, held by test_bench_run."""

from __future__ import annotations

import json
import math

import pytest

from harness.results import load_run
from tests.test_bench_run import bench

pytestmark = pytest.mark.slow


def test_orpheus_run_has_audio_seconds_per_second_in_the_table(tmp_path):
    out = tmp_path / "run"
    args = ["run", "orpheus", "--concurrency", "8", "--blocks", "1", "--size", "tiny"]
    args += ["--requests", "16", "--warmup", "8", "--period", "10"]
    args += ["--arm", "a=worktree", "--arm", "b=worktree", "--out", str(out)]
    proc = bench(*args)
    assert proc.returncode in (0, 1), proc.stderr
    assert "Traceback" not in proc.stderr
    assert "audio-seconds/s (steady)" in proc.stdout and "RTF p50" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    headline = summary["figures"][0]
    assert summary["headline"] == headline["figure"] == "audio_s_per_s"
    assert all(v > 0 and math.isfinite(v) for v in headline["servers_a"] + headline["servers_b"])
    manifest, frames = load_run(out)
    assert manifest["schedule"] == ["A", "B"] and len(headline["servers_b"]) == 1
    requests, spans = frames["requests"], frames["spans"]
    assert (requests["status"] == 200).all() and requests["error"].isna().all()
    # every reply's PCM is its windows' samples: 2048 per window, 2 bytes each
    windows = requests["max_tokens"] // 7 - 3
    assert (requests["audio_bytes"].map(sum) == 4096 * windows.clip(lower=0)).all()
    names = set(spans["name"])
    assert {"worker.step.forward", "worker.snac.step.forward"} <= names
    assert {"worker.postprocess_batch", "worker.snac.postprocess_batch"} <= names
