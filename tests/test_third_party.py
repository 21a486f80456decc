"""A widely used third-party load generator, GuideLLM (from PyPI, in the dev extra), drives the
engine at a fixed concurrency, and its output tok/s agrees with `bench measure` on the same
load within 15% (below: why not 10%).

The same load: one prompt file both read (text prompts and `output_tokens_count`, GuideLLM's
column name), sent as chat completions at concurrency C, against one engine whose
tokenizer.json (made here, nothing downloaded) GuideLLM also reads.

The engine shares two cores with the client, so a heavier client slows the engine itself:
GuideLLM's processes took enough CPU from the tiny model's steps to cut its throughput by a
third. To measure the tools' accounting rather than their CPU appetite, the engine is paced:
a planted 30 ms per iteration (engine.planted_delay_us, a wall-clock wait) dominates its
step time, so its throughput hardly depends on what else runs. Each tool runs once
(A B), the pace making drift small against the bound.

The bound is 15%: GuideLLM reads high by construction. Against `bench mock`, whose rate is
known exactly (the second test), `bench measure` read 268.4 tok/s of a known 269.5 and
GuideLLM 298 (+11%), its mean being a time-weighted rate of token events rather
than the steady rate at C. On the engine the two read 10.4% apart in two CI runs,
GuideLLM higher both times: the same gap. So the engine test holds the tools within
15% (it exists to catch an accounting error, a lost time base or a miscounted stream, and to
show GuideLLM drives the engine), and the mock test holds bench to the known rate within 2%."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from harness.measure.server import ServerProcess, free_port
from tests.word_tokenizer import word_tokenizer

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
CONCURRENCY, REQUESTS, PROMPT_WORDS, OUTPUT_TOKENS = 8, 64, 32, 32
PACE_US = 30_000
AGREEMENT = 0.15


def prompt_file(path: Path, vocab: int) -> Path:
    rng = random.Random(1)
    lines = []
    for _ in range(REQUESTS):
        words = " ".join(f"w{rng.randrange(1, vocab)}" for _ in range(PROMPT_WORDS))
        lines.append(json.dumps({"prompt": words, "output_tokens_count": OUTPUT_TOKENS}))
    path.write_text("\n".join(lines) + "\n")
    return path


def guidellm_tok_per_s(
    url: str, prompts: Path, tokenizer: Path, out: Path, chat: bool = True
) -> float:
    """GuideLLM's output tokens per second (its results table's mean) at the concurrency, as
    chat completions or (`chat` False) text completions."""
    route = "/v1/chat/completions" if chat else "/v1/completions"
    cmd = [
        sys.executable, "-m", "guidellm", "run",
        "--backend", f"kind=openai_http,target={url},model=qwen35,request_format={route}",
        "--profile", f"kind=concurrent,streams={CONCURRENCY}",
        "--constraint", f"kind=max_requests,count={REQUESTS}",
        "--data", f"kind=json_file,path={prompts}",
        "--tokenizer", f"kind=huggingface_auto,model={tokenizer}",
        "--output", f"kind=json,path={out}",
        "--disable-console",
    ]  # fmt: skip
    # GuideLLM's own process layout (a worker process per stream). With its C streams in one
    # process (faster to start) a fresh-clone CI run read GuideLLM 221 against bench 183
    # tok/s (+21%, past the bound), where the default layout reads about +10%; which of the two clients leaves the engine more of the 2
    # shared cores is not measured.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    benchmark = json.loads(out.read_text())["benchmarks"][0]
    tokens = benchmark["metrics"]["text"]["tokens"]
    assert tokens["output"]["successful"]["count"] == REQUESTS
    assert tokens["output"]["successful"]["total_sum"] == REQUESTS * OUTPUT_TOKENS
    return tokens["output_per_second"]["successful"]["mean"]


def bench_tok_per_s(url: str, prompts: Path, out: Path, chat: bool = True) -> float:
    """`bench measure`'s output tok/s (steady: exactly C in flight) on the same load."""
    cmd = [
        sys.executable, "-m", "harness", "measure", url,
        "-c", str(CONCURRENCY), "--prompts", str(prompts), *(["--chat"] if chat else []),
        "--requests", str(REQUESTS), "--warmup", str(CONCURRENCY),
        "--out", str(out), "--json",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout)
    assert summary["failed"] == 0 and summary["requests"] == REQUESTS
    return next(f["value"] for f in summary["figures"] if f["figure"] == "output_tok_per_s")


def test_guidellm_and_bench_measure_agree_on_output_tok_per_s(tmp_path):
    pytest.importorskip("guidellm", reason="GuideLLM is in the dev extra")
    vocab = 4096  # the tiny preset's
    tokenizer = word_tokenizer(tmp_path / "tokenizer", vocab).parent
    prompts = prompt_file(tmp_path / "prompts.jsonl", vocab)
    overrides = (
        f"model.tokenizer={tokenizer},engine.max_rows=16,engine.kv_pages=512,"
        f"engine.planted_delay_us={PACE_US}"
    )
    with ServerProcess("qwen35", size="tiny", overrides=overrides) as server:
        guidellm = guidellm_tok_per_s(server.url, prompts, tokenizer, tmp_path / "g.json")
        bench = bench_tok_per_s(server.url, prompts, tmp_path / "b")
    print(f"output tok/s: GuideLLM {guidellm:.0f}, bench measure {bench:.0f}")
    assert abs(bench / guidellm - 1) <= AGREEMENT, (guidellm, bench)


def test_on_a_server_of_known_rate_bench_measure_reads_that_rate(tmp_path):
    """`bench mock` streams every request at a fixed pace (TTFT 20 ms, then a token every
    30 ms, 32 tokens), so with C requests always in flight its output rate is known exactly:
    C x 32 / (0.020 + 31 x 0.030) = 269.5 tok/s at C = 8. `bench measure`'s steady figure
    reads it within 2% (the client's own turnaround between a request and the next is the
    only slack, and it can only lower the figure). GuideLLM's mean on the same load and server
    read 298 tok/s (+11%), its time-weighted rate of token events not being the steady rate
    at C; that is the gap the test above allows for. (GuideLLM does not run here: it would
    only print that figure, ~15 s of CI for no assertion.)"""
    ttft_s, itl_s = 0.020, 0.030
    known = CONCURRENCY * OUTPUT_TOKENS / (ttft_s + (OUTPUT_TOKENS - 1) * itl_s)
    vocab = 4096
    prompts = prompt_file(tmp_path / "prompts.jsonl", vocab)
    port = free_port()
    mock = [sys.executable, "-m", "harness", "mock", "--port", str(port), "--model", "qwen35",
            "--ttft-ms", str(ttft_s * 1e3), "--itl-ms", str(itl_s * 1e3),
            "--output-tokens", str(OUTPUT_TOKENS)]  # fmt: skip
    with ServerProcess("mock", port=port, command=mock, cwd=ROOT) as server:
        bench = bench_tok_per_s(server.url, prompts, tmp_path / "b", chat=False)
    print(f"known {known:.1f} tok/s: bench measure {bench:.1f}")
    assert known * 0.98 <= bench <= known * 1.001, (known, bench)
