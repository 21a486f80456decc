from __future__ import annotations

import http.client
import json
import os
import shutil
import tempfile
import time

import pytest

from engine.env import WORKER_TEMPLATE
from engine.worker.template import Template
from harness.measure.server import ServerProcess, die_with_parent

# Test files whose servers' workers must be fresh interpreters, children of their API server
# (they find the worker by its parent, its process group or its command line); a test
# elsewhere says so with @pytest.mark.fresh_worker.
FRESH_WORKER_FILES = {"test_faults_engine.py", "test_faults_harness.py"}


def pytest_addoption(parser):
    parser.addoption(
        "--order",
        default="file",
        help="the tests' order: file (as collected), reverse, or shuffle:SEED",
    )
    parser.addoption(
        "--gpu-log",
        default=None,
        metavar="PATH",
        help="append one JSON line per GPU test: seconds, memory before/after/peak, and the "
        "global settings it left changed (tests/gpu_isolation.py)",
    )
    parser.addoption(
        "--gpu-poison",
        action="store_true",
        help="before each GPU test, fill the device memory the allocator hands out next with "
        "0xFF (NaN in bf16 and fp32): a read of memory nobody wrote reads NaN every time, not "
        "what the tests before left (benchmarks/probe_graph_order.py, `poison`)",
    )
    parser.addoption(
        "--fresh-workers",
        action="store_true",
        help="start every server's worker as a fresh interpreter (as bench run does), not "
        "forked from the suite's worker template (engine/worker/template.py)",
    )


_template: Template | None = None


def pytest_configure(config):
    global _template
    # The suite's own processes (pytest, its mocks, the worker template) run beside every run
    # it starts, outside the run: bench's interference check would withhold their verdicts
    # (exit 5) whenever they differ between servers. The interference tests set it themselves.
    os.environ.setdefault("BENCH_ALLOW_INTERFERENCE", "1")
    xdist_controller = getattr(config.option, "numprocesses", None) and not hasattr(
        config, "workerinput"
    )
    worker = getattr(config, "workerinput", {})
    if "workerid" in worker:  # before the template, whose forks inherit the core
        _pin_xdist_worker(int(worker["workerid"][2:]), int(worker["workercount"]))
    if not (config.option.fresh_workers or config.option.collectonly or xdist_controller):
        _template = Template(preexec_fn=die_with_parent())


# The machine's cores, before any pinning below: a pinned xdist worker's children (and its
# second import of this file, as tests.conftest) read them from the environment
MACHINE_CORES = frozenset(
    int(core) for core in os.environ.get("BENCH_TEST_MACHINE_CORES", "").split(",") if core
) or frozenset(os.sched_getaffinity(0))


def _pin_xdist_worker(index: int, count: int) -> None:
    """Under pytest-xdist (-n N) worker i keeps to its share of the cores, and so do the
    servers its tests start: each is a machine of its own, and a CPU run's layout
    (harness/measure/cpu_layout.py) never puts two workers' servers on one core. With more
    workers than cores nothing is pinned."""
    cores = sorted(MACHINE_CORES)
    os.environ["BENCH_TEST_MACHINE_CORES"] = ",".join(map(str, cores))
    if count <= len(cores):
        os.sched_setaffinity(0, cores[index::count])


@pytest.fixture
def machine_cores():
    """The test (and what it starts) on every core of the machine, as a plain run is: for the
    tests of a CPU run's layout under -n."""
    saved = os.sched_getaffinity(0)
    os.sched_setaffinity(0, MACHINE_CORES)
    yield sorted(MACHINE_CORES)
    os.sched_setaffinity(0, saved)


def pytest_unconfigure(config):
    if _template is not None:
        _template.stop()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before the test's fixtures: its servers fork their workers from the template, unless
    the test needs fresh ones."""
    fresh = item.path.name in FRESH_WORKER_FILES or item.get_closest_marker("fresh_worker")
    if _template is not None and not fresh and _template.wait_ready():
        os.environ[WORKER_TEMPLATE.name] = _template.socket
    else:
        os.environ.pop(WORKER_TEMPLATE.name, None)


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    """--order: the tests reversed, or shuffled by a seed (GPU tests must pass in any order);
    without CUDA, the `gpu` tests skip. Under pytest-xdist (-n) the file order starts with the
    `slow` tests (servers, whole runs: 10-60 s each), so the cores share them first and the
    short tests fill in after: the longest first, the suite's wall time its total over the
    cores rather than that plus a long test begun last."""
    order = config.getoption("order")
    if order == "file" and getattr(config.option, "numprocesses", None):
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable
    elif order == "reverse":
        items.reverse()
    elif order.startswith("shuffle:"):
        import random

        random.Random(int(order.split(":", 1)[1])).shuffle(items)
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def _gpu_session(request):
    """One random model per shape for the session's GPU tests, and the guard around each."""
    from tests.gpu_isolation import Guard, RandomModels

    models = RandomModels()
    models.install()
    options = request.config.getoption
    yield Guard(options("gpu_log"), models, poison=options("gpu_poison"))
    models.uninstall()


@pytest.fixture(autouse=True)
def _isolate_gpu_tests(request):
    """A GPU test starts with what the one before found (settings, stream, launch mode, RNG
    state) and its engines, graphs and pools are freed when it ends (tests/gpu_isolation.py)."""
    if "gpu" not in request.keywords:
        yield
        return
    guard = request.getfixturevalue("_gpu_session")
    yield from guard.around(request.node.nodeid)


class Api:
    """A small blocking client for the engine's HTTP API."""

    def __init__(self, port: int):
        self.port = port

    def request(self, method: str, path: str, body: bytes | None = None, timeout: float = 60):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        return resp.status, (json.loads(data) if data else None)

    def complete(self, **body):
        return self.request("POST", "/v1/completions", json.dumps(body).encode())

    def stream(self, **body) -> list[dict]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        conn.request("POST", "/v1/completions", body=json.dumps(dict(body, stream=True)).encode())
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        events = []
        for line in resp:
            line = line.strip()
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                events.append(json.loads(line[6:]))
        conn.close()
        return events

    def stats(self) -> dict:
        return self.request("GET", "/v1/engine/stats")[1]

    def wait_idle(self, timeout: float = 20) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            stats = self.stats()
            if stats["running"] == 0 and stats["waiting"] == 0:
                return stats
            if time.monotonic() > deadline:
                return stats
            time.sleep(0.05)


@pytest.fixture(scope="session")
def tiny_server():
    server = ServerProcess(
        "qwen35", size="tiny", overrides="engine.max_rows=16,engine.kv_pages=512"
    )
    with server:
        yield Api(server.port)


@pytest.fixture
def short_tmp():
    """A temp directory for a server's IPC directories (short: ipc paths have a length cap)."""
    path = tempfile.mkdtemp(prefix="ft-")
    yield path
    shutil.rmtree(path, ignore_errors=True)
