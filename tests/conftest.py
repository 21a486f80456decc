from __future__ import annotations

import http.client
import json
import shutil
import tempfile
import time

import pytest

from harness.measure.server import ServerProcess


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _free_cuda_after_gpu_tests(request):
    """A GPU test's engines (graphs, memory pools, pinned buffers) are freed when it ends,
    not whenever the collector next runs, possibly inside a later test's capture."""
    yield
    if "gpu" in request.keywords:
        import gc

        import torch

        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


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
