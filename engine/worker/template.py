"""A worker template: one process that has imported torch once and forks each worker a server
asks it for, so a worker's start skips the interpreter and torch's import (~1.1 s of CPU on 2
cores, most of a tiny server's start). For test suites, which start hundreds of servers:
tests/conftest.py starts one (`python -m engine.worker.template SOCKET`) and names its socket
in BENCH_WORKER_TEMPLATE, and `engine serve` asks it for its worker instead of starting a
fresh interpreter (`start_worker`). `bench run` never sets it: a measured server's worker is a
fresh interpreter.

A forked worker runs what a fresh one would: `python -m MODULE ARGS` under the API server's
environment, working directory, `sys.path` (so a git arm's tree runs its own engine: the
template imports only third-party modules) and standard streams. The API server holds a
`TemplateWorker`, which answers as the `subprocess.Popen` it replaces (pid, poll, wait, kill,
returncode): the template reaps the worker and sends its exit code. The worker is not the
API server's child nor in its process group; it learns that its server died from the
server's end of the link closing (SIGHUP, as PR_SET_PDEATHSIG says it to a fresh worker).
The template refuses a server of another Python (then `start_worker` starts a fresh one).
"""

from __future__ import annotations

import json
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

from engine import env

log = logging.getLogger("engine.serve")

PRELOADED = ("torch", "numpy", "zmq", "msgspec", "yaml")  # third-party only: no engine code
MAX_REQUEST = 1 << 20
REPLY_TIMEOUT_S = 10.0


class TemplateWorker:
    """The API server's handle on a worker the template forked: `subprocess.Popen`'s calls
    that the server makes. One thread waits (`wait`); `poll` never blocks it."""

    def __init__(self, link: socket.socket, pid: int):
        self.link, self.pid = link, pid
        self.returncode: int | None = None
        self._reading = threading.Lock()

    def _read_exit(self, block: bool) -> None:
        if not self._reading.acquire(blocking=block):
            return
        try:
            if self.returncode is None:
                if not block and not select.select([self.link], [], [], 0)[0]:
                    return
                self.link.settimeout(None)
                reply = self.link.recv(64)
                # the template gone: its worker got SIGHUP with it (PR_SET_PDEATHSIG)
                self.returncode = int(reply.split()[1]) if reply else -signal.SIGHUP
                self.link.close()
        finally:
            self._reading.release()

    def poll(self) -> int | None:
        self._read_exit(block=False)
        return self.returncode

    def wait(self) -> int:
        self._read_exit(block=True)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def start_worker(argv: list[str]) -> subprocess.Popen | TemplateWorker:
    """The worker `argv` (`python -m MODULE ...`) names: forked by the template that
    BENCH_WORKER_TEMPLATE names, else (none named, or it refused) a fresh process."""
    path = env.WORKER_TEMPLATE.raw()
    if path and argv[:2] == [sys.executable, "-m"]:
        request = {
            "argv": argv[2:],
            "executable": sys.executable,
            "env": dict(os.environ),
            "cwd": os.getcwd(),
            "path": sys.path,
        }
        try:
            return _ask(path, request)
        except (OSError, ValueError) as exc:
            log.info("worker template %s: %s; starting a fresh worker", path, exc)
    return subprocess.Popen(argv)


def _ask(path: str, request: dict) -> TemplateWorker:
    link = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        link.settimeout(REPLY_TIMEOUT_S)
        link.connect(path)
        socket.send_fds(link, [json.dumps(request).encode()], [0, 1, 2])
        reply = link.recv(256).decode().split(maxsplit=1)
        if reply[:1] != ["pid"]:
            raise ValueError(" ".join(reply) or "no reply")
        return TemplateWorker(link, int(reply[1]))
    except BaseException:
        link.close()
        raise


class Template:
    """A template process of this interpreter (`python -m engine.worker.template SOCKET`), its
    socket in a fresh short directory (a unix socket's path has a cap): the test suite's
    (tests/conftest.py) and benchmarks/bench_startup.py's `--template`. `stop` waits for it,
    so the CPU time of the workers it reaped counts in its starter's children's."""

    def __init__(self, preexec_fn: Callable[[], None] | None = None):
        self.dir = tempfile.mkdtemp(prefix="wt-")
        self.socket = os.path.join(self.dir, "sock")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engine.worker.template", self.socket],
            start_new_session=True,
            preexec_fn=preexec_fn,
        )
        self.ready = False

    def wait_ready(self, timeout: float = 60.0) -> bool:
        """Whether the socket is up (False: the template exited, or `timeout` passed)."""
        deadline = time.monotonic() + timeout
        while not self.ready and time.monotonic() < deadline and self.proc.poll() is None:
            self.ready = os.path.exists(self.socket)
            time.sleep(0.01)
        return self.ready

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


# --- the template process ---------------------------------------------------------------------


def serve(path: str) -> None:
    """Fork a worker for each request on the socket at `path`, until SIGTERM."""
    for name in PRELOADED:
        __import__(name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path + ".tmp")
    listener.listen(64)
    os.rename(path + ".tmp", path)  # the socket appears ready to accept
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    links: dict[int, socket.socket] = {}  # a live worker's pid -> its server's link
    while True:
        try:
            readable = select.select([listener, wake_read], [], [])[0]
        except InterruptedError:
            continue
        if wake_read in readable:
            os.read(wake_read, 512)
            _reap(links)
        if listener in readable:
            link = listener.accept()[0]
            try:
                pid = _fork(link, [listener, wake_read, wake_write, *links.values()])
            except (OSError, ValueError, KeyError) as exc:
                link.send(f"refused {exc}".encode())
                link.close()
                continue
            links[pid] = link
            link.send(f"pid {pid}".encode())


def _reap(links: dict[int, socket.socket]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if link := links.pop(pid, None):
            try:
                link.send(f"exit {os.waitstatus_to_exitcode(status)}".encode())
            except OSError:
                pass  # its server is gone
            link.close()


def _fork(link: socket.socket, template_fds: list) -> int:
    data, fds, _flags, _addr = socket.recv_fds(link, MAX_REQUEST, 3)
    try:
        request = json.loads(data)
        if request["executable"] != sys.executable:
            raise ValueError(f"this template runs {sys.executable}")
        if len(fds) != 3:
            raise ValueError("no standard streams sent")
        pid = os.fork()
        if pid == 0:
            _run_worker(request, link, fds, template_fds)
        return pid
    finally:
        for fd in fds:
            os.close(fd)


def _run_worker(request: dict, link: socket.socket, fds: list[int], template_fds) -> None:
    """In the forked child: become `python -m MODULE ARGS` as the server would start it."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        for item in template_fds:
            item.close() if isinstance(item, socket.socket) else os.close(item)
        for name in [n for n in sys.modules if n == "engine" or n.startswith("engine.")]:
            del sys.modules[name]  # the server's tree's engine is imported, not the template's
        os.setpgid(0, 0)  # signals to the template's group are not the worker's
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        sys.path[:] = request["path"]
        threading.Thread(target=_hang_up_when_closed, args=(link,), daemon=True).start()
        import runpy

        module, *args = request["argv"]
        sys.argv = [module, *args]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _hang_up_when_closed(link: socket.socket) -> None:
    """The server's end closed (it exited or was killed): SIGHUP, as a fresh worker gets."""
    try:
        while link.recv(64):
            pass
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGHUP)


if __name__ == "__main__":
    serve(sys.argv[1])
