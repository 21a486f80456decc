"""The options `bench run`, `bench measure` and `bench sweep` declare alike, each declared once
here: the run's, then the load's (what they build: workload.py's LoadOptions and Workload)."""

from __future__ import annotations

import typer

from harness.analysis.verdict import FAIL_AT, LEVEL, MARGIN
from harness.measure.watch import STALL_S

SIZE = typer.Option(None, help="Model size (default: by machine).")
PERIOD = typer.Option(
    100,
    min=1,
    help="Span window: every this many worker iterations each span's timings are sent as one "
    "record (docs/SPANS.md); smaller is finer in time, with more records.",
)
SHARDS = typer.Option(1, min=1, help="Client processes for the load.")
OUT = typer.Option(None, help="Run directory (default results/<run-id> under this directory).")
OVERWRITE = typer.Option(False, "--overwrite", help="Replace the run already in --out.")
STALL_TIMEOUT = typer.Option(
    STALL_S, min=1, help="Seconds without a finished request before a server has stalled."
)
TIME_BUDGET = typer.Option(
    None,
    "--time-budget",
    min=1.0,
    help="Seconds the schedule may take: a block (a sweep: a load) starts only if the longest"
    " so far still fits; what ran is whole and summarised.",
)
AS_JSON = typer.Option(False, "--json", help="Print the summary as JSON.")
MARGIN_OPTION = typer.Option(
    MARGIN, min=0.0, help="No change: the interval covers 0 and lies within +-this (0.02: 2%)."
)
FAIL_AT_OPTION = typer.Option(
    FAIL_AT,
    min=0.0,
    help="Exit 1 when the headline is slower by at least this (0.01: 1%); a smaller"
    " significant slowdown is reported and exits 0.",
)
CONFIDENCE_OPTION = typer.Option(
    LEVEL,
    min=0.5,
    max=0.9999,
    help="Two-sided confidence level of the intervals that decide the verdicts (0.95): an A/A"
    " run reads 'faster' or 'slower' at most 1 - this of the time; higher: fewer false"
    " verdicts, more blocks to decide a change.",
)
MAX_BLOCKS = 8  # --blocks auto's cap by default: 32 servers with --abba
ALLOW_INTERFERENCE = typer.Option(
    False,
    "--allow-interference",
    envvar="BENCH_ALLOW_INTERFERENCE",
    help="Keep the verdict (and its exit code) when the servers saw different loads from"
    " outside the run; the doubt is still shown. For a machine known to be shared (the"
    " project's own test suite sets it: its pytest and fixtures run outside each run).",
)
URL_SCENARIO = typer.Option("qwen35", help="For a URL: the scenario whose load to send.")
CLUSTER = typer.Option(
    None,
    "--cluster",
    help="Run the blocks as Ray tasks, each block whole on one node (one GPU, or a CPU):"
    " 'auto' (a local Ray on this machine), ray://HOST:PORT or HOST:PORT (docs/SCALE.md).",
)

# the load (docs/LOADGEN.md)
OPEN_LOOP_CAP = 1024  # requests in flight at most in the open loop, unless -c says otherwise

CONCURRENCY = typer.Option(
    None,
    "--concurrency",
    "-c",
    min=1,
    help="Requests in flight (closed loop; no default: give -c or --request-rate), or their "
    f"cap with --request-rate (default there: {OPEN_LOOP_CAP}).",
)
REQUESTS = typer.Option(
    None, min=1, help="Measured requests per server (default: the scenario's; bench scenarios)."
)
DURATION = typer.Option(None, min=0.1, help="Seconds of load per server.")
WARMUP = typer.Option(
    None, min=0, help="Warmup requests per server (default: the scenario's; bench scenarios)."
)
REQUEST_RATE = typer.Option(
    None, "--request-rate", help="Open loop: mean requests/s (Poisson arrivals); inf: all at once."
)
BURSTINESS = typer.Option(
    1.0, help="Gamma shape of the arrivals (1: Poisson, <1 burstier), as vLLM's."
)
INPUT_LEN = typer.Option(None, "--input-len", min=1, help="Fixed prompt length in tokens.")
OUTPUT_LEN = typer.Option(None, "--output-len", min=1, help="Fixed output length in tokens.")
PROMPTS = typer.Option(
    None, "--prompts", help="JSONL prompt file (text or token ids; ShareGPT-like accepted)."
)
TOKENIZER = typer.Option(
    None, help="tokenizer.json or bytes, counting a prompt file's replies (default: words)."
)
SEED = typer.Option(None, help="Seed of the requests and arrivals (default: the scenario's).")
CHAT = typer.Option(False, "--chat", help="Send /v1/chat/completions (text prompts only).")
HEADER = typer.Option([], "--header", help="K:V header on every request (repeatable).")
GOODPUT = typer.Option(None, help="SLOs in ms, e.g. ttft:200,tpot:50,e2e:2000 (as vLLM's).")
