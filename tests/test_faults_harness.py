"""Faults injected into the harness; each test makes one happen and asserts what the user sees,
within a bound, with no process left behind (docs/RELIABILITY.md, harness faults 6-14;
INVARIANTS 28-34).

The fast tests drive `bench run` against a mock server or a stub (URL arms) or stop before any
server starts. The `slow` ones start engine servers and kill, stop or stall their processes, or
kill `bench` itself.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from engine.spans import ROWS_PER_STEP
from harness.cli import app
from harness.measure.event_loop import run_loop
from harness.measure.http_client import Endpoint, Lane
from harness.measure.lanes import Progress
from harness.measure.mock.server import MockConfig, MockServer
from harness.measure.preflight import check_window, steady_window
from harness.measure.server import free_port
from harness.measure.watch import Watch
from harness.results import load_run
from harness.scenario import load_scenario
from tests.test_bench_run import bench
from tests.test_faults_engine import _wait_for

ROOT = Path(__file__).resolve().parent.parent
LOAD = ["--size", "tiny", "-c", "4", "--requests", "16", "--warmup", "4"]
SMALL = [*LOAD, "--blocks", "1"]  # one block: these runs are about failures, not verdicts


def one_line_error(proc, code: int = 2) -> str:
    """The error `bench` printed (a finished process, or CliRunner's result): one line, no
    traceback, exit code `code`."""
    err, returncode = proc.stderr, getattr(proc, "returncode", getattr(proc, "exit_code", None))
    assert returncode == code, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    return " ".join(err[err.index("error:") :].split())


def _processes_mentioning(*texts: str) -> list[tuple[int, str]]:
    """Live processes (not zombies) whose command line names any of `texts`."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and any(t in cmdline for t in texts) and int(proc.name) != os.getpid():
            found.append((int(proc.name), cmdline[:200]))
    return found


def _assert_nothing_left(*texts: str, timeout: float = 5) -> None:
    _wait_for(lambda: not _processes_mentioning(*texts), timeout, "every process to end")


# --- servers the URL arms drive --------------------------------------------------------------


@pytest.fixture(scope="module")
def mock_url():
    """`bench mock` in its own process: fast replies (TTFT 5 ms, 2 ms between tokens)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", "mock", "--port", str(port), "--ttft-ms", "5"]
        + ["--itl-ms", "2"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for(lambda: _answers(url + "/health"), 30, "the mock")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return resp.status == 200
    except OSError:
        return False


class Stub(BaseHTTPRequestHandler):
    """An OpenAI-like server that lists one model (with `max_model_len` when set) and refuses
    every completion with 503."""

    protocol_version = "HTTP/1.1"
    max_model_len: int | None = None

    def do_GET(self):
        card = {"id": "stub"} | (
            {"max_model_len": self.max_model_len} if self.max_model_len else {}
        )
        self._reply(200, {"object": "list", "data": [card]})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._reply(503, {"error": {"message": "overloaded", "type": "server_error"}})

    def _reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def stub():
    def serve(max_model_len: int | None = None) -> str:
        handler = type("Handler", (Stub,), {"max_model_len": max_model_len})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    servers: list[ThreadingHTTPServer] = []
    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()


# --- 13. bad scenario files, an unwritable --out (INVARIANTS 34) -----------------------------

BAD_SCENARIOS = {
    "empty": ("", "is empty"),
    "no-name": ("description: x\nmodel: {arch: qwen35}\n", "has no `name:`"),
    "list": ("- name: qwen35\n- sizes: {}\n", "is a YAML list, not a mapping"),
    "not-yaml": ("name: [qwen35\n", "is not valid YAML at line 2"),
    "sizes-not-a-mapping": ("name: x\nsizes: [tiny]\n", "sizes must be a mapping"),
    "size-not-a-mapping": ("name: x\nsizes: {tiny: 3}\n", "sizes.tiny must map"),
}


@pytest.mark.parametrize("kind", list(BAD_SCENARIOS))
def test_a_bad_scenario_file_is_one_line_exit_2(tmp_path, kind):
    text, message = BAD_SCENARIOS[kind]
    path = tmp_path / f"{kind}.yaml"
    path.write_text(text)
    proc = bench("run", str(path), *SMALL, "--out", str(tmp_path / "run"), timeout=60)
    assert message in one_line_error(proc)
    assert not (tmp_path / "run").exists()


def test_a_scenario_path_that_is_missing_or_a_directory_is_one_line(tmp_path):
    (tmp_path / "dir.yaml").mkdir()
    for name, message in (("missing.yaml", "no scenario file"), ("dir.yaml", "Is a directory")):
        proc = bench("run", str(tmp_path / name), *SMALL, timeout=60)
        assert message in one_line_error(proc)


def test_an_unwritable_out_is_one_line_before_any_server(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    out = tmp_path / "file" / "run"
    proc = bench(
        "run", "qwen35", *SMALL, "--arm", "a=worktree", "--arm", "b=worktree", "--out", str(out)
    )
    assert "cannot write" in one_line_error(proc) and "Not a directory" in proc.stderr
    assert not _processes_mentioning(str(tmp_path))


# --- 10. an --out that holds something (INVARIANTS 32) -------------------------------------


def test_an_out_holding_a_run_is_refused_unless_overwritten(tmp_path, mock_url):
    out = tmp_path / "run"
    arms = ["--arm", f"a={mock_url}", "--arm", f"b={mock_url}"]
    first = bench("run", "qwen35", *SMALL, *arms, "--out", str(out))
    assert first.returncode == 0, first.stderr
    (out / "report.md").write_text("the first run's report")
    again = bench("run", "qwen35", *SMALL, *arms, "--out", str(out))
    assert "already holds a run; give --overwrite" in one_line_error(again)
    assert (out / "report.md").exists()
    replaced = bench("run", "qwen35", *SMALL, *arms, "--out", str(out), "--overwrite")
    assert replaced.returncode == 0, replaced.stderr
    assert not (out / "report.md").exists()  # nothing of the first run is left beside it
    assert len(load_run(out)[1]["servers"]) == 2
    other = tmp_path / "notes"
    other.mkdir()
    (other / "mine.txt").write_text("keep")
    refused = bench("run", "qwen35", *SMALL, *arms, "--out", str(other), "--overwrite")
    assert "holds no run" in one_line_error(refused)
    assert (other / "mine.txt").read_text() == "keep"


def test_a_time_budget_ends_the_schedule_between_whole_blocks(tmp_path, mock_url):
    """`--time-budget`: a block starts only while the time so far plus the longest block yet
    fits. With a budget one block fills, 1 of 3 ABBA blocks runs, whole (its 4 servers), and
    the run is a finished, shorter schedule: compared, exit 0 (not 130), the manifest and the
    doubts say why it stopped. The first block always runs; alone, it gives no verdict
    (INVARIANTS 50)."""
    out = tmp_path / "run"
    arms = ["--arm", f"a={mock_url}", "--arm", f"b={mock_url}"]
    cut = bench("run", "qwen35", *LOAD, *arms, "--abba", "--blocks", "3", "--time-budget", "1",
                "--out", str(out))  # fmt: skip
    assert cut.returncode == 0, cut.stderr
    manifest, frames = load_run(out)
    assert manifest["complete"] and manifest["time_budget_s"] == 1
    assert "ended the schedule after 1 of 3 blocks" in manifest["budget_stop"]
    assert sorted(frames["servers"]["letter"]) == ["A", "A", "B", "B"]
    summary = json.loads((out / "summary.json").read_text())
    assert any("time budget" in doubt for doubt in summary["doubts"])
    assert any(doubt.startswith("1 block with both arms") for doubt in summary["doubts"])
    assert bench("run", "qwen35", *arms, "--time-budget", "0").returncode == 2  # min 1 s


def test_a_reader_that_leaves_early_changes_no_exit_code(tmp_path, mock_url):
    """`bench run ... | head -1`: the pipe closes while bench still has tables to print. The
    run finishes and is written, and the exit code is the verdict's (0 for this A/A run), not
    the 1 click gives a broken pipe, which would read "B is slower"; the same for a usage
    error (2) and a command whose reader was never there."""
    out = tmp_path / "run"
    arms = ["--arm", f"a={mock_url}", "--arm", f"b={mock_url}"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", "run", "qwen35", *SMALL, *arms, "--out", str(out)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    proc.stdout.readline()  # `head -1`
    proc.stdout.close()
    assert proc.wait(timeout=300) == 0
    assert len(load_run(out)[1]["servers"]) == 2
    for args, code in ((["scenarios"], 0), (["run", "qwen35", "--arm", "x=main"], 2)):
        gone = subprocess.Popen(
            [sys.executable, "-m", "harness", *args], cwd=ROOT, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        gone.stdout.close()
        assert gone.wait(timeout=60) == code, args


# --- 9 and 14. checked before the first server starts (INVARIANTS 31) ---------------------


def test_a_load_that_does_not_fit_an_arms_engine_is_refused_before_any_server(tmp_path):
    out = tmp_path / "run"
    started = time.monotonic()
    proc = bench(
        "run", "qwen35", *SMALL, "--arm", "a=worktree", "--arm", "b=engine.max_model_len=100",
        "--out", str(out),
    )  # fmt: skip
    error = one_line_error(proc)
    assert "does not fit arm b's engine.max_model_len" in error and "64 + outputs up to 48" in error
    assert not out.exists() and time.monotonic() - started < 60


def test_a_load_without_a_steady_window_is_refused_with_what_would_do(tmp_path):
    """-c 64, 80 requests and 16 warmup in the tiny scenario's lengths: a load that never has
    a steady window."""
    proc = bench(
        "run", "qwen35", "--size", "tiny", "-c", "64", "--requests", "80", "--warmup", "16",
        "--arm", "a=worktree", "--arm", "b=worktree", "--out", str(tmp_path / "run"),
    )  # fmt: skip
    error = one_line_error(proc)
    assert "no steady window at -c 64" in error and "give --requests 210 or more" in error
    assert not (tmp_path / "run").exists()


def test_a_window_shorter_than_a_request_is_a_note_before_the_run():
    """A load too short for its window (0.8b, -c 64, 96 measured + 32 warmup on the H200: the steady window held no
    whole request, so no TTFT) gets a note naming the requests that would; a window with room
    (320 + 64, the evidence stage's load since) gets none."""
    from harness.measure.request_sequence import build_requests

    load = load_scenario("qwen35", "0.8b").load
    short = build_requests(load, 1000, 128, seed=load.seed)
    note = check_window(short, 64, 32)
    assert note is not None and note.startswith("at -c 64 the steady window (~")
    assert "shorter than the longest request (512 tokens)" in note
    fewest = int(note.split("give --requests ")[1].split()[0])
    assert 96 < fewest <= 320  # more than this run's measured requests, within the fix's
    longer = build_requests(load, 1000, 32 + fewest, seed=load.seed)
    assert check_window(longer, 64, 32) is None  # the advice suffices
    assert check_window(build_requests(load, 1000, 384, seed=load.seed), 64, 64) is None


def test_the_steady_window_model():
    assert steady_window([10] * 4, 4, 0) == 10  # the first end finds the sequence exhausted
    assert steady_window([10] * 8, 4, 0) == 20  # two waves
    assert steady_window([10] * 8, 4, 4) == 10  # from the warmup wave's end
    assert steady_window([10] * 8, 4, 8) == 0  # the warmup runs to the drain
    assert steady_window([10] * 3, 4, 0) == 0  # never 4 in flight
    assert steady_window([30] + [10] * 11, 4, 1) == 0  # one long warmup request
    for size, requests, warmup in (("0.8b", 80, 16), ("0.8b", 1024, 64), ("tiny", 256, 16)):
        load = load_scenario("qwen35", size).load
        from harness.measure.request_sequence import build_requests

        seq = build_requests(load, 1000, requests + warmup)
        window = steady_window([seq[i].max_tokens for i in range(len(seq))], 64, warmup)
        assert (window > 0) == (requests > 80), (size, requests, window)


def test_an_unreachable_url_arm_is_refused_before_the_other_arms_server(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    out = tmp_path / "run"
    started = time.monotonic()
    proc = bench(
        "run", "qwen35", *SMALL, "--arm", "a=worktree", "--arm", f"b={dead}", "--out", str(out)
    )
    assert f"cannot reach {dead}/v1/models" in one_line_error(proc)
    assert not out.exists() and time.monotonic() - started < 60


def test_a_url_arm_whose_window_is_too_short_is_refused(tmp_path, stub):
    url = stub(max_model_len=100)
    proc = bench("run", "qwen35", *SMALL, "--arm", f"a={url}", "--arm", f"b={url}")
    assert f"does not fit arm a ({url})" in one_line_error(proc)


def test_a_run_in_which_most_requests_failed_is_an_error(tmp_path, stub):
    url = stub()
    out = tmp_path / "run"
    proc = bench(
        "run", "qwen35", *SMALL, "--arm", f"a={url}", "--arm", f"b={url}", "--out", str(out)
    )
    error = one_line_error(proc)
    assert (
        "32 of 32 measured requests failed (the first: HTTP 503" in error and "no result" in error
    )
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and "no result" in manifest["error"]
    assert set(manifest["failed_servers"]) == {"A0", "B1"}  # and each slot failed
    assert (out / "summary.json").exists()  # summarised: its report shows the failures


# --- 19. what cannot give a result, refused before any server (INVARIANTS 31, 34) ----

SCENARIO = (ROOT / "scenarios" / "qwen35.yaml").read_text()


@pytest.mark.parametrize(
    "text,arms,message",
    [
        (SCENARIO.replace("headline: output_tok_per_s", "headline: no_such_metric"), [],
         "headline 'no_such_metric' is not a figure of a completions load; use one of"),
        (SCENARIO.replace("  arch: qwen35", "  arch: nosuch"), [],
         "unknown architecture 'nosuch'; known: orpheus, qwen35"),
        (SCENARIO, ["--arm", "a=worktree", "--arm", "b=model.preset=nosuch"],
         "arm b: unknown qwen35 preset 'nosuch'; presets: 0.8b, tiny"),
        (SCENARIO, ["--arm", "a=worktree", "--arm", "b=engine.state_slots=0"],
         "engine.state_slots must be at least 1, got 0"),
    ],
    ids=["headline", "arch", "preset", "hanging-config"],
)  # fmt: skip
def test_a_run_that_cannot_give_a_result_is_refused_before_any_server(
    tmp_path, text, arms, message
):
    """Unchecked, each would run every server and exit 0 with nothing (a headline no figure has), exit 3
    with a KeyError (arch, preset) or wait 180 s for a worker that never warmed up (a config
    that hangs): now exit 2, one line, before anything is written (RELIABILITY 18, 19)."""
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    out = tmp_path / "run"
    arms = arms or ["--arm", "a=worktree", "--arm", "b=worktree"]
    started = time.monotonic()
    result = CliRunner().invoke(app, ["run", str(path), *SMALL, *arms, "--out", str(out)])
    assert message in one_line_error(result)
    assert not out.exists() and time.monotonic() - started < 30
    assert not _processes_mentioning(str(tmp_path))


# --- 20. a results directory that is damaged or partial (INVARIANTS 74) --------------


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes(b ^ 0xFF for b in data[at : at + 64]) + data[at + 64 :]


def _with(key: str, value):
    return lambda data: json.dumps(json.loads(data) | {key: value}).encode()


DAMAGE = {
    "requests-truncated": ("requests.parquet", lambda d: d[: len(d) // 2], "cannot read"),
    "requests-empty": ("requests.parquet", lambda d: b"", "cannot read"),
    "requests-bits-flipped": ("requests.parquet", lambda d: _flip(d, 4), "cannot read"),
    "requests-footer-flipped": ("requests.parquet", lambda d: _flip(d, len(d) - 200), "cannot"),
    "spans-truncated": ("spans.parquet", lambda d: d[:-10], "cannot read"),
    "servers-bits-flipped": ("servers.parquet", lambda d: _flip(d, 4), "cannot read"),
    "requests-missing": ("requests.parquet", None, "is missing beside the run's other tables"),
    "manifest-a-list": ("manifest.json", lambda d: b"[1, 2]", "is not a JSON object"),
    "manifest-truncated": ("manifest.json", lambda d: d[: len(d) // 2], "cannot read"),
    "manifest-empty": ("manifest.json", lambda d: b"", "cannot read"),
    "manifest-scenario-a-string": ("manifest.json", _with("scenario", "x"), "scenario is not"),
    "manifest-arms-a-mapping": ("manifest.json", _with("arms", {"A": 1}), "arms is not"),
    "manifest-version-a-string": ("manifest.json", _with("schema_version", "4"), "schema '4'"),
}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    from tests.synthetic_run import write_run

    path = tmp_path_factory.mktemp("recorded") / "run"
    write_run(path, [100.0, 110.0, 105.0, 100.0])
    return path


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_results_directory_is_one_line_naming_the_file(tmp_path, recorded, damage):
    """bench report, compare and run --continue on a run with one file damaged: exit 2, one
    line naming the file, never a traceback (8 of 13 such runs were exit 3), and nothing in
    the run changed (RELIABILITY 20)."""
    name, change, message = DAMAGE[damage]
    run = tmp_path / "run"
    shutil.copytree(recorded, run)
    file = run / name
    if change is None:
        file.unlink()
    else:
        file.write_bytes(change(file.read_bytes()))
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    continued = ["run", "qwen35", *SMALL, "--continue", "--out", str(run)]
    for args in (["report", str(run)], ["compare", str(recorded), str(run)], continued):
        error = one_line_error(CliRunner().invoke(app, args))
        assert message in error and (str(file) in error or str(run) in error), (args, error)
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


# --- 12. a refused connection has no status -----------------------------------------------


def test_a_refused_connection_is_recorded_with_status_0_not_the_last_one():
    async def main():
        async with MockServer(MockConfig(ttft_ms=0, itl_ms=0, output_tokens=2)) as mock:
            lane = Lane(Endpoint(mock.url + "/v1/completions"))
            body = json.dumps({"prompt": [1], "max_tokens": 2, "stream": True}).encode()
            status = await lane.post(body, b"", lambda *_: None, 5)
        with pytest.raises(OSError):  # the mock is gone: connection refused
            await lane.post(body, b"", lambda *_: None, 5)
        return status, lane.last_status

    assert run_loop(main()) == (200, 0)


def test_a_connection_lost_as_it_opens_fails_the_request_not_bench(monkeypatch):
    """A server killed as it accepts a lane's new connection: the connection is lost before
    the lane resumes, and the request fails (an OSError the lane records) instead of bench
    crashing on a transport that is gone (seen as exit 3 when an API server was killed)."""

    async def lost_at_once(self, factory, *args, **kwargs):
        conn = factory()
        conn.connection_made(None)
        conn.connection_lost(ConnectionResetError())
        return None, conn

    async def main():
        loop = asyncio.get_running_loop()
        monkeypatch.setattr(type(loop), "create_connection", lost_at_once)
        lane = Lane(Endpoint("http://127.0.0.1:9/v1/completions"))
        with pytest.raises(OSError, match="closed the connection as it opened"):
            await lane.post(b"{}", b"", lambda *_: None, 5)
        assert lane.conn is None  # the next request opens a new one

    run_loop(main())


# --- 11. a write that fails mid-run (INVARIANTS 33) ----------------------------------------


def test_a_write_error_mid_run_keeps_everything_and_says_so_in_one_line(
    tmp_path, mock_url, monkeypatch
):
    """The disk fills as the second slot is written (ENOSPC from the table writer): one line,
    the first slot stays where it was, everything (both slots) is in the directory named."""
    out = tmp_path / "run"
    write_table = pq.write_table

    def full_disk(table, where, *args, **kwargs):
        if Path(where).parent == out and (out / "servers.parquet").exists():
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(where))
        return write_table(table, where, *args, **kwargs)

    monkeypatch.setattr(pq, "write_table", full_disk)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the run moves
    args = ["run", "qwen35", *SMALL, "--arm", f"a={mock_url}", "--arm", f"b={mock_url}"]
    result = CliRunner().invoke(app, [*args, "--out", str(out)])
    error = one_line_error(result)
    assert "No space left on device" in error and "everything measured so far" in error
    moved = Path(error.split("was written to ")[1].split()[0].rstrip(";"))
    assert moved.parent == tmp_path and moved != out
    manifest, frames = load_run(moved)
    assert manifest["moved_from"] == str(out) and "No space left" in manifest["error"]
    assert frames["servers"]["server"].tolist() == ["A0", "B1"]
    assert len(frames["requests"]) == 2 * 20
    assert sorted(p.name for p in (moved / "logs").iterdir()) == ["A0.log", "B1.log"]
    kept_manifest, kept = load_run(out)
    assert kept["servers"]["server"].tolist() == ["A0"]  # the first slot, as written
    assert kept_manifest["complete"] is False and kept_manifest["moved_to"] == str(moved)


def _lock(path: Path) -> str | None:
    """Make `path` refuse new files (chmod for a user, chattr +i for root); how, or None."""
    if os.geteuid() != 0:
        path.chmod(0o555)
        return "chmod"
    if shutil.which("chattr") and subprocess.run(["chattr", "+i", str(path)]).returncode == 0:
        return "chattr"
    return None


def _unlock(path: Path, how: str | None) -> None:
    if how == "chmod":
        path.chmod(0o755)
    elif how == "chattr":
        subprocess.run(["chattr", "-i", str(path)])


def test_a_results_directory_made_read_only_mid_run(tmp_path, mock_url):
    out = tmp_path / "run"
    args = ["run", "qwen35", *SMALL, "--abba", "--arm", f"a={mock_url}", "--arm", f"b={mock_url}"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", *args, "--out", str(out)],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    how = None
    try:
        _wait_for(lambda: (out / "servers.parquet").exists(), 60, "the first slot")
        how = _lock(out)
        if how is None:
            proc.kill()
            pytest.skip("cannot make a directory read-only here (root without chattr)")
        _, err = proc.communicate(timeout=60)
    finally:
        _unlock(out, how)
        if proc.poll() is None:
            proc.kill()
    proc.stderr = err
    error = one_line_error(proc)
    assert "cannot write" in error and "everything measured so far was written to" in error
    moved = next(p for p in tmp_path.glob("bench-run-*"))
    servers = load_run(moved)[1]["servers"]["server"].tolist()
    assert servers[:2] == ["A0", "B1"] and len(servers) >= 2
    assert load_run(out)[1]["servers"]["server"].tolist() == ["A0"]


# --- 6. the watch: a death, a stall (INVARIANTS 30) -----------------------------------------


class FakeServer:
    def __init__(self):
        self.code: int | None = None

    def exited(self) -> int | None:
        return self.code

    def last_log_line(self) -> str:
        return "engine.serve ERROR the worker exited with code -9; stopping"

    def answers_health(self) -> bool:
        return self.code is None


def test_the_watch_stops_a_load_whose_server_exits_or_stalls():
    server = FakeServer()
    watch = Watch(server, stall_s=5)
    assert not watch.check(Progress(8, 4, 0, 100, 1.0))
    assert not watch.check(Progress(9, 5, 0, 120, 5.9))  # requests finish: not a stall
    server.code = 1
    assert watch.check(Progress(10, 6, 0, 130, 6.2))
    assert watch.fault([]) == (
        "died under load (exit code 1); its log ends:"
        " engine.serve ERROR the worker exited with code -9; stopping"
    )
    stalled = Watch(FakeServer(), stall_s=5)
    assert not stalled.check(Progress(4, 0, 0, 0, 0.3))
    assert not stalled.check(Progress(8, 4, 0, 80, 2.0))
    assert not stalled.check(Progress(8, 4, 0, 80, 6.9))
    assert stalled.check(Progress(8, 4, 0, 80, 7.0))
    assert stalled.fault([]) == "stalled 2.0 s into the load: no request finished for 5 s"
    idle = Watch(FakeServer(), stall_s=5)
    assert not idle.check(Progress(4, 4, 0, 80, 1.0))
    assert not idle.check(Progress(4, 4, 0, 80, 60.0))  # nothing in flight: not a stall


# --- end to end: engine servers killed, stalled (INVARIANTS 30); `bench` killed (29) -------


class BenchRun:
    """`bench run` of two worktree arms (A B) in the background, against the tiny engine."""

    def __init__(self, out: Path, tmp: str, *extra: str, requests: int = 60):
        self.out, self.tmp, self.started = out, tmp, time.monotonic()
        args = ["run", "qwen35", "--size", "tiny", "-c", "4", "--requests", str(requests)]
        args += ["--warmup", "4", "--period", "10", "--blocks", "1"]
        args += ["--arm", "a=worktree", "--arm", "b=worktree"]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "harness", *args, *extra, "--out", str(out)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "TMPDIR": tmp},
        )

    def wait_load(self, server: str, timeout: float = 120) -> None:
        """Until `server` is healthy and has served for a moment."""
        log = self.out / "logs" / f"{server}.log"
        _wait_for(lambda: log.exists() and "listening" in log.read_text(), timeout, server)
        time.sleep(1.0)

    def pids(self, server: str) -> tuple[int, int]:
        """The API server's pid and its worker's."""
        api = [
            pid
            for pid, cmd in _processes_mentioning(str(self.out))
            if "engine serve" in cmd and f"--server-id {server}" in cmd
        ]
        assert len(api) == 1, api
        children = subprocess.run(["pgrep", "-P", str(api[0])], capture_output=True, text=True)
        (worker,) = [int(p) for p in children.stdout.split()]
        return api[0], worker

    def finish(self, timeout: float = 180) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out, err

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        _assert_nothing_left(str(self.out), self.tmp, timeout=10)
        assert not list(Path(self.tmp).glob("engine-ipc-*"))


@pytest.fixture
def bench_run(tmp_path, short_tmp):
    runs: list[BenchRun] = []

    def start(*extra: str, **kwargs) -> BenchRun:
        runs.append(BenchRun(tmp_path / "run", short_tmp, *extra, **kwargs))
        return runs[-1]

    yield start
    for run in runs:
        run.close()


def _failed_slot(out: Path, server: str) -> tuple[dict, pd.Series, dict]:
    manifest, frames = load_run(out)
    servers = frames["servers"].set_index("server")
    summary = json.loads((out / "summary.json").read_text())
    return manifest, servers.loc[server], summary


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_worker_killed_mid_load_fails_its_slot_and_the_exit_code_says_so(bench_run):
    run = bench_run()
    run.wait_load("B1")
    os.kill(run.pids("B1")[1], signal.SIGKILL)
    killed = time.time()
    code, _, err = run.finish()
    assert code == 4, err
    assert "failed and left out of the comparison: B1" in err and "Traceback" not in err
    manifest, b1, summary = _failed_slot(run.out, "B1")
    assert b1["error"].startswith("died ") and "the worker exited with code -9" in b1["error"]
    assert manifest["failed_servers"] == {"B1": b1["error"]} and manifest["complete"]
    assert b1["stop_unix"] - killed < 6  # seen, the load stopped and the server stopped
    assert "server B1 failed during the run: left out of the comparison" in summary["doubts"]
    assert any("died" in d and "logs/B1.log" in d for d in summary["doubts"])
    headline = summary["figures"][0]
    assert headline["servers_b"] == [None] and headline["change"]["verdict"] == "not enough data"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_an_api_server_killed_mid_load_fails_its_slot(bench_run):
    run = bench_run()
    run.wait_load("B1")
    api, worker = run.pids("B1")
    os.kill(api, signal.SIGKILL)
    code, _, err = run.finish()
    assert code == 4, err
    _, b1, _ = _failed_slot(run.out, "B1")
    assert "exit code -9 (SIGKILL)" in b1["error"]
    _wait_for(lambda: not Path(f"/proc/{worker}").exists(), 5, "the orphaned worker to exit")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_stalled_worker_fails_its_slot_after_the_stall_timeout(bench_run):
    run = bench_run("--stall-timeout", "3")
    run.wait_load("B1")
    os.kill(run.pids("B1")[1], signal.SIGSTOP)
    stopped = time.time()
    code, _, err = run.finish()
    assert code == 4, err
    _, b1, _ = _failed_slot(run.out, "B1")
    assert "stalled" in b1["error"] and "no request finished for 3 s" in b1["error"]
    assert b1["stop_unix"] - stopped < 3 + 5


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_short_stall_is_survived(bench_run):
    run = bench_run("--stall-timeout", "30")
    run.wait_load("B1")
    worker = run.pids("B1")[1]
    os.kill(worker, signal.SIGSTOP)
    time.sleep(2)
    os.kill(worker, signal.SIGCONT)
    code, _, err = run.finish()
    assert code in (0, 1), err
    manifest, frames = load_run(run.out)
    assert "failed_servers" not in manifest and frames["servers"]["error"].isna().all()
    assert (frames["requests"]["status"] == 200).all()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_bench_killed_with_sigkill_leaves_no_server_and_keeps_finished_slots(bench_run):
    run = bench_run()
    run.wait_load("B1")
    api, worker = run.pids("B1")
    run.proc.kill()
    killed = time.monotonic()
    run.proc.wait(5)
    _assert_nothing_left(str(run.out), run.tmp, timeout=5)  # PR_SET_PDEATHSIG, then SIGHUP
    assert time.monotonic() - killed < 5
    assert not list(Path(run.tmp).glob("engine-ipc-*"))
    manifest, frames = load_run(run.out)
    assert manifest["complete"] is False
    assert frames["servers"]["server"].tolist() == ["A0"]  # written when it ended
    assert (frames["requests"]["status"] == 200).all() and len(frames["requests"]) == 64


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_bench_hung_up_stops_its_server_and_writes_the_slot(bench_run):
    run = bench_run(requests=200)
    run.wait_load("A0")
    run.proc.send_signal(signal.SIGHUP)
    code, _, err = run.finish(timeout=30)
    assert code == 130, err
    _assert_nothing_left(str(run.out), run.tmp, timeout=5)
    manifest, frames = load_run(run.out)
    assert manifest["complete"] is False
    assert frames["servers"]["error"].tolist() == ["interrupted"]
    assert (frames["requests"]["status"] == 200).sum() > 0


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_bench_serve_killed_with_sigkill_takes_its_server_along(short_tmp):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", "serve", "qwen35", "--size", "tiny", "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "TMPDIR": short_tmp},
    )
    try:
        _wait_for(lambda: _answers(f"http://127.0.0.1:{port}/health"), 90, "the server")
        assert _processes_mentioning(short_tmp)  # the worker, whose IPC directory is there
        proc.kill()
        proc.wait(5)
        _assert_nothing_left(f"--port {port}", short_tmp, timeout=5)
        assert not list(Path(short_tmp).glob("engine-ipc-*"))
    finally:
        proc.kill()


# --- 8. the servers run the scenario the manifest records (INVARIANTS 28) ------------------


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_scenario_file_is_what_the_servers_run(tmp_path, short_tmp):
    """A file outside the repository, its name unknown there, with max_rows 2: the workers run
    at most 2 rows a step at -c 4, and the manifest and the servers' files agree."""
    source = (ROOT / "scenarios" / "qwen35.yaml").read_text().replace("name: qwen35", "name: mine")
    path = tmp_path / "mine.yaml"
    path.write_text(source.replace("max_rows: 256", "max_rows: 2"))
    out = tmp_path / "run"
    proc = bench(
        "run", str(path), *SMALL, "--period", "5", "--arm", "a=worktree",
        "--arm", "b=engine.max_model_len=512", "--out", str(out), timeout=180,
        env={"TMPDIR": short_tmp},
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr
    manifest, frames = load_run(out)
    spans = frames["spans"]
    rows = spans[spans["name"] == ROWS_PER_STEP]
    assert not rows.empty and rows["max"].max() == 2
    assert manifest["scenario"]["source"] == str(path) and manifest["scenario"]["name"] == "mine"
    for arm in manifest["arms"]:
        ran = json.loads(
            json.dumps(load_scenario(str(out / arm["scenario_file"]), "tiny").to_dict())
        )
        for section in ("model", "engine", "load"):
            assert ran[section] == arm["scenario"][section], section
    assert manifest["arms"][1]["scenario"]["engine"]["max_model_len"] == 512
    assert manifest["arms"][0]["scenario"]["engine"]["max_rows"] == 2
