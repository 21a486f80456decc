"""The API server's own ceiling: how many streamed tokens a second it delivers when the worker
is never the limit.

    python -m benchmarks.bench_api --concurrency 64 --tick-ms 1 --requests 512 --warmup 64

Starts the real API server (engine/api: aiohttp, the ZMQ link, the streaming replies) in one
process and, in another, a stand-in worker that speaks the worker's protocol: Ready, then
every `--tick-ms` one token for each running request in one StepFrames message, as the real
worker's iteration does, the last with finish_reason "length"; no model. Then drives it with
`bench measure` (the harness's closed loop at the given concurrency, the qwen35 scenario's
load at `--size`). The stand-in can emit `concurrency x 1000 / tick_ms` tokens a second; what
the client receives, and how many requests the stand-in holds on average (its occupancy: a
request the client has not yet resent is in neither), say whether the API server keeps up.
`--profile FILE` writes the API server's cProfile table (where its CPU goes).

`--tree A --tree B --rounds N`: two trees' API servers (a worktree of the commit before, and
this one) in alternation, A B then B A, N rounds: a JSON line a run, then each round's B/A of
the delivered tokens and TTFT p50, and how many rounds B was ahead. The way to judge a change
of the serving path on a machine whose speed wanders over minutes:

    git worktree add /tmp/base HEAD~1
    python -m benchmarks.bench_api -c 256 --tick-ms 0.5 --requests 1024 --warmup 128 \
      --tree /tmp/base --tree . --rounds 4

On a machine where the real engine's worker iterates at ~2.5 ms with 45 of 64 requests in it
(the H200), a ceiling near the engine's own throughput says the API server, not the
GPU, bounds the run (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import zmq

from engine.messages import (
    Abort,
    AddRequest,
    GetStats,
    Heartbeat,
    Ready,
    Shutdown,
    StepFrames,
    TokenFrame,
    WorkerStats,
    decode_to_worker,
    encode,
)
from engine.worker.heartbeat import HEARTBEAT_S

VOCAB = 248_320  # the 0.8b preset's: the load's token ids must be valid
MAX_LEN = 4096


def one_token_each(running: dict[int, int], vocab: int) -> list[TokenFrame]:
    """A stand-in worker's iteration: one token (rid % vocab) for each running request
    (rid -> tokens left), the last with finish_reason "length"; finished requests leave
    `running`."""
    frames = []
    for rid in list(running):
        running[rid] -= 1
        last = running[rid] == 0
        frames.append(TokenFrame(rid, [rid % vocab], finish_reason="length" if last else None))
        if last:
            del running[rid]
    return frames


def stand_in_worker(ipc: str, tick_s: float, report: str) -> None:
    """The worker's side of the link, at a fixed iteration time; writes its occupancy (mean
    running requests over the ticks with any) and tokens sent to `report` on Shutdown."""
    for sig in (signal.SIGINT, signal.SIGTERM):  # its server's stop reaches the whole process
        signal.signal(sig, signal.SIG_IGN)  # group: it ends on the Shutdown the server sends
    ctx = zmq.Context()
    inbox, outbox = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    inbox.bind(f"ipc://{ipc}/to_worker")
    outbox.connect(f"ipc://{ipc}/from_worker")
    outbox.send(encode(Ready("stand-in", "0.8b", "none", 0, VOCAB, MAX_LEN, [])))
    running: dict[int, int] = {}
    ticks = busy = tokens = 0
    began = None
    stop = False
    next_tick = beat = time.perf_counter()
    while not stop:
        while inbox.poll(0):
            msg = decode_to_worker(inbox.recv())
            if isinstance(msg, AddRequest):
                running[msg.rid] = msg.max_tokens
                began = began or time.perf_counter()
            elif isinstance(msg, Abort):
                running.pop(msg.rid, None)
            elif isinstance(msg, GetStats):
                outbox.send(encode(WorkerStats(8, 8, 4, 4, len(running), 0)))
            elif isinstance(msg, Shutdown):
                stop = True
        frames = one_token_each(running, VOCAB)
        if frames:
            ticks += 1
            busy += len(frames)
            tokens += len(frames)
            outbox.send(encode(StepFrames(frames)))
        if time.perf_counter() - beat >= HEARTBEAT_S:  # alive, for the server's watchdog
            beat = time.perf_counter()
            outbox.send(encode(Heartbeat(tick_s)))
        next_tick += tick_s
        time.sleep(max(0.0, next_tick - time.perf_counter()))
    seconds = time.perf_counter() - (began or time.perf_counter())
    figures = {"ticks": ticks, "mean_running": busy / max(ticks, 1), "tokens": tokens}
    Path(report).write_text(json.dumps(figures | {"seconds": seconds}))
    inbox.close(0)
    outbox.close(0)
    ctx.term()


def api_server(port: int, tick_ms: float, report: str, profile: str | None) -> None:
    """The API server as `engine serve` runs it (engine.serve.serve: the port, the IPC
    directory, the signals, the worker's start and stop), its worker the stand-in."""
    from engine.config import load_served
    from engine.serve import serve

    def stand_in(ipc: str) -> list[str]:
        return [sys.executable, "-m", "benchmarks.bench_api", "--role", "worker", "--ipc", ipc,
                "--tick-ms", str(tick_ms), "--report", report]  # fmt: skip

    scenario = load_served("qwen35", "0.8b")
    prof = cProfile.Profile() if profile else None
    if prof:
        prof.enable()
    serve(scenario, "127.0.0.1", port, worker_command=stand_in)
    if prof:
        prof.disable()
        with open(profile, "w") as out:
            pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(40)


def run(args: argparse.Namespace, tree: str | None = None) -> dict:
    """One run; `tree`: the API server (and the client) of that source tree."""
    from harness.measure.server import ServerProcess, free_port

    report = os.path.join(tempfile.mkdtemp(prefix="bench-api-"), "worker.json")
    port = free_port()
    command = [sys.executable, "-m", "benchmarks.bench_api", "--role", "api", "--port", str(port),
               "--tick-ms", str(args.tick_ms), "--report", report,
               *(["--profile", args.profile] if args.profile else [])]  # fmt: skip
    api = ServerProcess("qwen35", port=port, command=command, cwd=tree).start()
    env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve())} if tree else None
    try:
        api.wait_healthy(timeout=60)
        out = Path(args.out or tempfile.mkdtemp(prefix="bench-api-run-"))
        measure = subprocess.run(
            [sys.executable, "-m", "harness", "measure", api.url,
             "--scenario", "qwen35", "--size", args.size, "-c", str(args.concurrency),
             "--requests", str(args.requests), "--warmup", str(args.warmup),
             "--out", str(out), "--overwrite", "--json"],
            capture_output=True, text=True, check=False, cwd=tree, env=env,
        )  # fmt: skip
        if measure.returncode not in (0, 1):
            raise SystemExit(f"bench measure failed ({measure.returncode}):\n{measure.stderr}")
        summary = json.loads(measure.stdout[measure.stdout.index("{") :])
    finally:
        api.stop()  # the server sends the stand-in its Shutdown, which writes its report
    import pandas as pd

    stand_in = json.loads(Path(report).read_text())
    requests = pd.read_parquet(out / "requests.parquet")
    figures = {f["figure"]: f["value"] for f in summary["figures"]}
    return {
        "capacity_tok_per_s": args.concurrency * 1000.0 / args.tick_ms,
        "delivered_tok_per_s_steady": figures["output_tok_per_s"],
        "delivered_tok_per_s_run": figures["output_tok_per_s_run"],
        "ttft_p50_ms": figures["ttft_p50_ms"],
        "ttft_p99_ms": figures["ttft_p99_ms"],
        "itl_p99_ms": figures["itl_p99_ms"],
        "tokens_sent": stand_in["tokens"],
        "tokens_received": int(requests["output_tokens"].sum()),
        "tokens_asked": int(requests["max_tokens"].sum()),
        "failed": int((requests["status"] != 200).sum()),
        "stand_in_mean_running": stand_in["mean_running"],
        "run": str(out),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", "-c", type=int, default=64)
    parser.add_argument("--tick-ms", type=float, default=1.0, help="the stand-in's iteration")
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--warmup", type=int, default=64)
    parser.add_argument("--size", default="0.8b", help="the qwen35 load profile to send")
    parser.add_argument("--out", default=None, help="bench measure's run directory")
    parser.add_argument("--profile", default=None, help="the API server's cProfile table here")
    parser.add_argument("--role", choices=["bench", "worker", "api"], default="bench")
    parser.add_argument("--ipc", default=None)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--report", default=None)
    parser.add_argument("--tree", action="append", default=[], help="twice: A, then B")
    parser.add_argument("--rounds", type=int, default=3, help="with --tree: A B / B A rounds")
    args = parser.parse_args()
    if args.tree and (len(args.tree) != 2 or args.rounds < 1):
        parser.error("--tree twice (A, then B), with --rounds 1 or more")
    if args.role == "worker":
        stand_in_worker(args.ipc, args.tick_ms / 1000.0, args.report)
    elif args.role == "api":
        api_server(args.port, args.tick_ms, args.report, args.profile)
    elif args.tree:
        alternate(args)
    else:
        print(json.dumps(run(args), indent=1))


def alternate(args: argparse.Namespace) -> None:
    """`--tree A --tree B`: A B, then B A, `rounds` times; each round's B/A."""
    rounds = []
    for i in range(args.rounds):
        order = (0, 1) if i % 2 == 0 else (1, 0)
        got: dict[int, dict] = {}
        for side in order:
            got[side] = run(args, args.tree[side])
            keep = ("delivered_tok_per_s_steady", "ttft_p50_ms", "itl_p99_ms", "failed")
            line = {"round": i, "tree": "AB"[side], **{k: got[side][k] for k in keep}}
            print(json.dumps(line), flush=True)
        rounds.append(got)
    tok = [r[1]["delivered_tok_per_s_steady"] / r[0]["delivered_tok_per_s_steady"] for r in rounds]
    ttft = [r[1]["ttft_p50_ms"] / r[0]["ttft_p50_ms"] for r in rounds]
    print(f"B/A delivered tok/s by round: {', '.join(f'{x:.3f}' for x in tok)}"
          f" (B ahead in {sum(x > 1 for x in tok)} of {len(tok)});"
          f" TTFT p50: {', '.join(f'{x:.2f}' for x in ttft)}")  # fmt: skip


if __name__ == "__main__":
    main()
