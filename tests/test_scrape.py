"""The runner's /metrics scrapes at the steady window's edges (harness/measure/scrape.py) and
their table, metrics.parquet (schema version 5; docs/RESULTS.md; INVARIANTS 67)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from harness.analysis.schema import ServerRecord, Slot
from harness.measure.lanes import Progress
from harness.measure.run_plan import SlotLoad
from harness.measure.scrape import SteadyScrape
from harness.results import RunDir, load_run

SLOT = Slot("main", "A", "A0", 0, 0)


class Exporter:
    """A /metrics of a counter, a labelled counter born later and a gauge, set by the test."""

    def __init__(self, serve: bool = True):
        self.tokens, self.finished, self.running = 0, None, 0
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if not serve or self.path != "/metrics":
                    self.send_error(404)
                    return
                lines = ["# TYPE x:tokens_total counter", f"x:tokens_total {exporter.tokens}",
                         "# TYPE x:done_total counter", "# TYPE x:running gauge",
                         f"x:running {exporter.running}"]  # fmt: skip
                if exporter.finished is not None:
                    lines.insert(3, f'x:done_total{{reason="length"}} {exporter.finished}')
                body = ("\n".join(lines) + "\n").encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/v1"

    def close(self):
        self.httpd.shutdown()


@pytest.fixture
def exporter():
    e = Exporter()
    yield e
    e.close()


def _tick(scrape, sent, done, elapsed=1.0):
    scrape.observe(Progress(sent=sent, done=done, failed=0, tokens=0, elapsed_s=elapsed))


def test_closed_loop_scrapes_as_all_lanes_fill_and_as_the_drain_begins(exporter):
    t0 = time.perf_counter()
    scrape = SteadyScrape(exporter.url, SlotLoad(4), warmup=2, total=20)
    exporter.tokens, exporter.running = 100, 4
    _tick(scrape, sent=4, done=1)  # busy, but the warmup is not done
    assert scrape.start is None
    _tick(scrape, sent=6, done=2)  # C in flight, warmup done: the window opens
    scrape.start.result()
    exporter.tokens, exporter.finished, exporter.running = 160, 5, 3
    _tick(scrape, sent=12, done=8)  # still C in flight
    assert scrape.end is None
    _tick(scrape, sent=20, done=17)  # 3 in flight: the drain
    rows = {r.name + r.labels: r for r in scrape.rows(SLOT, t0)}
    tokens = rows["x:tokens_total"]
    assert (tokens.start, tokens.end, tokens.delta, tokens.kind) == (100, 160, 60, "counter")
    done = rows["x:done_total" + "reason=length"]  # born inside the window: counted from 0
    assert (done.start, done.delta) == (0, 5)
    running = rows["x:running"]
    assert (running.start, running.end, running.delta) == (4, 3, None)
    assert 0 < tokens.start_s < tokens.end_s < time.perf_counter() - t0
    assert (tokens.server, tokens.letter, tokens.block) == ("A0", "A", 0)


def test_open_loop_window_and_an_end_the_ticks_never_saw(exporter):
    scrape = SteadyScrape(exporter.url, SlotLoad(8, arrivals=object()), warmup=2, total=10)
    _tick(scrape, sent=2, done=2)  # only warmup sent
    assert scrape.start is None
    _tick(scrape, sent=3, done=2)
    scrape.start.result()
    exporter.tokens = 7
    rows = scrape.rows(SLOT, 0.0)  # the load ended before a tick saw its last arrival
    assert {r.name: r.delta for r in rows}["x:tokens_total"] == 7


def test_no_window_or_no_metrics_endpoint_leaves_no_rows(exporter):
    assert SteadyScrape(exporter.url, SlotLoad(4), 0, 8).rows(SLOT, 0.0) == []
    silent = Exporter(serve=False)
    try:
        scrape = SteadyScrape(silent.url, SlotLoad(1), 0, 8)
        _tick(scrape, sent=1, done=0)
        _tick(scrape, sent=8, done=8)
        assert scrape.rows(SLOT, 0.0) == []
    finally:
        silent.close()


def test_metrics_rows_are_stored_and_an_older_run_reads_without_them(tmp_path, exporter):
    scrape = SteadyScrape(exporter.url, SlotLoad(1), 0, 8)
    _tick(scrape, sent=1, done=0)
    rows = scrape.rows(SLOT, 0.0)
    run = RunDir(tmp_path / "run")
    run.write_manifest({"run_id": "r"})
    server = ServerRecord(**SLOT.__dict__, port=1, log="l", t0_unix=0.0, start_unix=0.0)
    run.append_slot([], [], server, metrics=rows)
    _, frames = load_run(tmp_path / "run")
    assert sorted(frames["metrics"]["name"]) == ["x:running", "x:tokens_total"]
    (tmp_path / "run" / "metrics.parquet").unlink()  # as a version-4 run was written
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    manifest["schema_version"] = 4
    (tmp_path / "run" / "manifest.json").write_text(json.dumps(manifest))
    _, frames = load_run(tmp_path / "run")
    assert frames["metrics"].empty and len(frames["servers"]) == 1
