"""`--cluster` (harness/cluster/, docs/SCALE.md) on a local Ray of 2 CPUs, driving `bench mock`
servers given as URL arms: a cluster run's folder is a local run's (same tables, same verdict
columns; report and --continue read it), a lost block attempt is recorded and retried, and
`bench measure --clients` merges two clients' loads; `bench nightly --cluster` writes a local
night's asv results and records a lost commit. INVARIANTS 80-82, 85."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[cluster]')")

from harness.cli import app  # noqa: E402
from harness.cluster import clock  # noqa: E402
from harness.measure import asv_runs, nightly  # noqa: E402
from harness.measure.arms import git_or_none  # noqa: E402
from harness.measure.server import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LOAD = ["-c", "4", "--requests", "16", "--warmup", "4", "--output-len", "8", "--input-len", "8"]
# Every run here is A/A on one mock and tests a folder's shape, not a verdict: a 2-CPU CI runner
# shared with Ray can make one arm >=1% slower with confidence (it did once), so the exit code's
# line is moved out of the noise's reach. The verdicts' own tests are tests/test_verdicts.py.
AA = ["--fail-at", "0.5", "--allow-interference"]


@pytest.fixture(scope="module")
def mock_url():
    port = free_port()
    command = [sys.executable, "-m", "harness", "mock", "--port", str(port), "--itl-ms", "4"]
    proc = subprocess.Popen([*command, "--ttft-ms", "2"], cwd=ROOT, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    try:
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=1):
                    break
            except OSError:
                assert time.monotonic() < deadline, "the mock did not start"
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray of 2 CPUs for the module: `--cluster auto` uses the Ray already joined."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _run(url: str, out: Path, *extra: str):
    args = ["run", "qwen35", "--abba", "--blocks", "2", *LOAD, *AA]
    args += ["--arm", f"a={url}", "--arm", f"b={url}", "--out", str(out), *extra]
    return CliRunner().invoke(app, args)


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


@pytest.mark.slow
def test_a_two_block_cluster_run_has_a_local_runs_tables_and_verdict_columns(
    local_ray, mock_url, tmp_path
):
    """INVARIANTS 80: a cluster run's folder is a local run's: the same tables and columns, the
    same figures with the same verdict fields; each block ran whole on one node, named in the
    manifest; report and --continue read it unchanged."""
    here, there = tmp_path / "local", tmp_path / "cluster"
    local = _run(mock_url, here)
    cluster = _run(mock_url, there, "--cluster", "auto")
    assert local.exit_code == 0 and cluster.exit_code == 0, cluster.output
    for table in ("requests", "spans", "servers", "metrics"):
        a, b = (
            pd.read_parquet(here / f"{table}.parquet"),
            pd.read_parquet(there / f"{table}.parquet"),
        )
        assert list(a.columns) == list(b.columns), table
    servers = pd.read_parquet(there / "servers.parquet")
    assert servers.sort_values("slot")["letter"].tolist() == list("ABBABAAB")
    assert servers["block"].tolist() == sorted(servers["block"])  # gathered in block order
    assert servers["requests"].tolist() == [16] * 8
    a, b = _summary(here), _summary(there)
    assert [f["figure"] for f in a["figures"]] == [f["figure"] for f in b["figures"]]
    for fa, fb in zip(a["figures"], b["figures"], strict=True):
        assert fa.keys() == fb.keys() and (fa["change"] or {}).keys() == (fb["change"] or {}).keys()
    headline = next(f for f in b["figures"] if f["figure"] == b["headline"])
    assert headline["change"]["blocks"] == 2 and headline["change"]["verdict"]
    manifest = json.loads((there / "manifest.json").read_text())
    blocks = manifest["cluster"]["blocks"]
    assert sorted(blocks) == ["0", "1"] and all(
        e["node_id"] and e["attempt"] == 1 for e in blocks.values()
    )
    assert manifest["cluster"]["lost"] == [] and manifest["complete"] is True
    for server in servers["log"]:  # the logs came back into this folder
        assert Path(server).parent == there / "logs"
    assert CliRunner().invoke(app, ["report", str(there)]).exit_code == 0
    more = CliRunner().invoke(
        app,
        ["run", "qwen35", "--abba", "--blocks", "1", *LOAD, *AA, "--arm",
         f"a={mock_url}", "--arm", f"b={mock_url}", "--out", str(there), "--continue",
         "--cluster", "auto"],
    )  # fmt: skip
    assert more.exit_code == 0, more.output
    assert sorted(json.loads((there / "manifest.json").read_text())["cluster"]["blocks"]) == [
        "0", "1", "2"
    ]  # fmt: skip
    assert pd.read_parquet(there / "servers.parquet")["block"].max() == 2


@pytest.mark.slow
def test_a_lost_block_attempt_is_recorded_its_rows_discarded_and_the_retry_named(
    local_ray, mock_url, tmp_path, monkeypatch
):
    """INVARIANTS 81: block 1's first attempt dies after one slot (its worker exits, as on a
    lost node); Ray reruns the block; the manifest names the lost attempt (block, node, what
    happened) and the retry, and the tables hold each server once: the lost slot's rows never
    reach them."""
    monkeypatch.setenv("BENCH_CLUSTER_FAULT", "1")
    out = tmp_path / "run"
    result = _run(mock_url, out, "--cluster", "auto")
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    [lost] = manifest["cluster"]["lost"]
    assert lost["block"] == 1 and lost["attempt"] == 1 and lost["node_id"]
    assert "worker process died" in lost["error"] and "attempt 2" in lost["error"]
    assert manifest["cluster"]["blocks"]["1"]["attempt"] == 2
    assert manifest["cluster"]["blocks"]["0"]["attempt"] == 1
    servers = pd.read_parquet(out / "servers.parquet")
    assert sorted(servers["server"]) == sorted(f"{x}{i}" for i, x in enumerate("ABBABAAB"))
    requests = pd.read_parquet(out / "requests.parquet")
    assert requests.groupby("server").size().tolist() == [20] * 8  # 16 + 4 warmup, once each
    assert "attempt 1" in result.output


@pytest.mark.slow
def test_measure_with_two_clients_merges_their_loads_on_one_clock(local_ray, mock_url, tmp_path):
    """INVARIANTS 82: two client actors drive one server; every request of the sequence is
    sent once, by one of them; both start at the same instant on the driver's clock (their
    offsets measured, min round trip, and recorded); the steady window is one window."""
    out = tmp_path / "m"
    args = ["measure", mock_url, *LOAD, "--clients", "2", "--out", str(out), "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    requests = pd.read_parquet(out / "requests.parquet")
    assert sorted(requests["index"]) == list(range(20))
    first = requests.sort_values("index").head(2)["send_s"]  # index 0: client 0's, 1: client 1's
    assert first.max() < 0.2 and first.min() >= -0.01
    manifest = json.loads((out / "manifest.json").read_text())
    clients = manifest["clients"]
    assert [c["client"] for c in clients] == [0, 1]
    assert all(0 < c["rtt_s"] < 0.5 and abs(c["offset_s"]) < 0.05 for c in clients)
    servers = pd.read_parquet(out / "servers.parquet")
    assert servers["steady_end_s"].iloc[0] > servers["steady_start_s"].iloc[0]


def test_the_clock_offset_is_the_shortest_round_trips():
    """A remote clock 2.5 s ahead: the sample with the shortest round trip gives the offset
    within half its round trip; a slow, lopsided sample is passed over."""
    samples = [(10.0, 12.9, 10.8), (20.0, 22.5005, 20.001), (30.0, 32.6, 30.3)]
    got = clock.estimate(samples)
    assert got.rtt_s == pytest.approx(0.001)
    assert got.offset_s == pytest.approx(2.5, abs=got.rtt_s / 2)
    ticks = iter(range(100))
    measured = clock.measure(lambda: next(ticks) + 100.0, lambda: float(next(ticks)), count=4)
    assert measured.offset_s == pytest.approx(100.0) and measured.rtt_s == 2.0


@pytest.mark.parametrize(
    "extra, said",
    [
        (["--cluster", "nowhere"], "--cluster 'nowhere': give 'auto'"),
        (["--cluster", "auto", "--time-budget", "60"], "--time-budget counts blocks"),
    ],
)
def test_bad_cluster_options_are_one_line_errors(extra, said, mock_url, tmp_path):
    result = _run(mock_url, tmp_path / "x", *extra)
    assert result.exit_code == 2 and said in result.output
    assert "Traceback" not in result.output


def test_clients_need_a_url_and_no_more_than_the_lanes(mock_url, tmp_path):
    result = CliRunner().invoke(app, ["measure", "qwen35", *LOAD, "--clients", "2"])
    assert result.exit_code == 2 and "give its URL" in result.output
    result = CliRunner().invoke(app, ["measure", mock_url, *LOAD, "--clients", "5"])
    assert result.exit_code == 2 and "more than -c 4 lanes" in result.output


TINY_SUITE = """
import os


def track_cost():
    \"\"\"Three samples that depend on the commit only, as a session's servers' values.\"\"\"
    level = int(os.environ["BENCH_COMMIT"][:2], 16) + 1.0
    return {"samples": [level, level * 1.1, level * 0.9], "number": 1}
"""


def _night_config(folder: Path, suite: Path, tip: str) -> Path:
    """asv.conf.json for one night, as tests/test_asv.py makes it (a results directory of its
    own), on a suite of one tiny benchmark and main's history up to `tip`."""
    folder.mkdir()
    conf = asv_runs.load_config() | {
        "repo": str(asv_runs.REPO),
        "benchmark_dir": str(suite),
        "results_dir": str(folder / "results"),
        "html_dir": str(folder / "html"),
        "env_dir": str(folder / "env"),
        "branches": [tip],  # fixed: others may commit while the test runs
    }
    (folder / "asv.conf.json").write_text(json.dumps(conf))
    return folder / "asv.conf.json"


def _asv_files(results: Path) -> dict[str, dict]:
    """Every file asv wrote, without the times it took (the one thing two runs differ in)."""
    files = {}
    for path in sorted(results.rglob("*.json")):
        data = json.loads(path.read_text())
        data.pop("durations", None)
        columns = data.get("result_columns", [])
        for name, row in data.get("results", {}).items():
            data["results"][name] = [
                value for column, value in zip(columns, row, strict=False)
                if column not in ("started_at", "duration")
            ]  # fmt: skip
        files[str(path.relative_to(results))] = data
    return files


@pytest.mark.slow
def test_a_cluster_night_writes_a_local_nights_asv_results_and_records_a_lost_commit(
    local_ray, tmp_path, monkeypatch
):
    """INVARIANTS 85: the night's commits as Ray tasks give the asv files a local night gives
    (one process writes them, in commit order), with each commit's node recorded; commit 0's
    task is lost after asv measured it (its worker exits): it is recorded (commit, node, why),
    reported as not measured, and none of its results reach the series."""
    if git_or_none("rev-parse", "--verify", "--quiet", "HEAD~2") is None:
        pytest.skip("a history of 3 commits (a shallow clone has 1)")
    three = [git_or_none("rev-parse", f"HEAD~{k}") for k in (2, 1, 0)]
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "__init__.py").write_text("")
    (suite / "bench_tiny.py").write_text(TINY_SUITE)
    monkeypatch.setenv("HOME", str(tmp_path))  # asv machine --yes writes ~/.asv-machine.json
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the commits' worktrees
    here = nightly.nightly(
        three[0], False, "ci-night", None, _night_config(tmp_path / "here", suite, three[2])
    )
    monkeypatch.setenv("BENCH_CLUSTER_FAULT", "0")
    config = _night_config(tmp_path / "there", suite, three[2])
    there = nightly.nightly(f"{three[0]}~1", False, "ci-night", "auto", config)

    assert here.measured == there.measured == three[1:] and here.failed == there.failed == []
    assert _asv_files(tmp_path / "here" / "results") == _asv_files(tmp_path / "there" / "results")
    kept = [nightly.samples(tmp_path / n / "results", "ci-night", three) for n in ("here", "there")]
    assert kept[0] == kept[1] and kept[1]["bench_tiny.track_cost"][0] is None  # what steps read
    assert [r.benchmark for r in here.regressions] == [r.benchmark for r in there.regressions]
    [lost] = there.cluster["lost"]
    assert lost["commit"] == three[0] and lost["node_id"] and "worker process died" in lost["error"]
    assert there.lost == [three[0]] and here.lost == []
    nodes = there.cluster["commits"]
    assert list(nodes) == three[1:] and all(n["node_id"] and n["host"] for n in nodes.values())
    recorded = json.loads((tmp_path / "there" / "nodes" / "ci-night.json").read_text())
    assert recorded["commits"] == nodes and recorded["lost"] == [lost]
