"""The worker template (engine/worker/template.py, INVARIANTS 78): a worker it forks runs the
server's module under the server's environment, directory and import path, answers as a
Popen (exit code, kill), and dies when its server's end of the link closes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.env import WORKER_TEMPLATE
from engine.worker import template
from harness.measure.server import ServerProcess
from tests.conftest import Api

PROBE = """
import json, os, sys, time
import engine
out = os.environ["PROBE_OUT"]
Path = __import__("pathlib").Path
Path(out).write_text(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(),
    "engine": engine.__file__, "ppid": os.getppid(), "pid": os.getpid()}))
if "--sleep" in sys.argv:
    time.sleep(60)
sys.exit(int(sys.argv[-1]))
"""


@pytest.fixture(scope="module")
def own_template():
    started = template.Template()
    assert started.wait_ready()
    yield started.socket
    started.stop()


@pytest.fixture
def probe(tmp_path, monkeypatch, own_template):
    """`python -m probe ARGS` on an import path whose first entry has its own `engine`
    package (as a git arm's tree has), run in `tmp_path`; the probe's report file."""
    (tmp_path / "probe.py").write_text(PROBE)
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(WORKER_TEMPLATE.name, own_template)
    monkeypatch.setenv("PROBE_OUT", str(tmp_path / "report.json"))
    return tmp_path / "report.json"


def _wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_a_forked_worker_runs_the_servers_module_in_its_setting(probe, tmp_path):
    worker = template.start_worker([sys.executable, "-m", "probe", "--x", "3"])
    assert isinstance(worker, template.TemplateWorker)  # forked, not a fresh interpreter
    assert worker.wait() == 3 and worker.poll() == 3
    report = json.loads(probe.read_text())
    assert report["argv"] == ["--x", "3"] and report["cwd"] == str(tmp_path)
    assert report["engine"] == str(tmp_path / "engine" / "__init__.py")  # the server's tree's
    assert report["ppid"] != os.getpid()  # the template's child, not ours


def test_a_forked_worker_is_killed_as_a_popen_is(probe):
    worker = template.start_worker([sys.executable, "-m", "probe", "--sleep", "0"])
    _wait_for(probe.exists)
    assert worker.poll() is None
    worker.kill()
    assert worker.wait() == -signal.SIGKILL


def test_a_forked_worker_hangs_up_when_its_server_is_gone(probe):
    worker = template.start_worker([sys.executable, "-m", "probe", "--sleep", "0"])
    _wait_for(probe.exists)
    worker.link.close()  # as the kernel closes it when the API server dies
    _wait_for(lambda: not Path(f"/proc/{worker.pid}").exists())


def test_another_python_is_refused_and_started_fresh(probe, own_template):
    request = {"argv": ["probe", "0"], "executable": "/elsewhere/python", "env": {}}
    request |= {"cwd": "/", "path": []}
    with pytest.raises(ValueError, match="refused this template runs"):
        template._ask(own_template, request)
    fresh = template.start_worker([sys.executable, "-I", "-c", "pass"])  # not `-m`: fresh
    assert isinstance(fresh, subprocess.Popen) and fresh.wait() == 0


def test_a_server_whose_worker_is_forked_serves_and_stops(monkeypatch, own_template):
    monkeypatch.setenv(WORKER_TEMPLATE.name, own_template)
    with ServerProcess("qwen35", size="tiny") as server:
        status, body = Api(server.port).complete(prompt=[1, 2, 3], max_tokens=4, ignore_eos=True)
        assert status == 200 and len(body["choices"][0]["token_ids"]) == 4
        children = subprocess.run(["pgrep", "-P", str(server.proc.pid)], capture_output=True)
        assert not children.stdout.split()  # the worker is the template's child
    assert server.proc.returncode == 0
