"""The load options `bench run`, `bench measure` and `bench sweep` share, and what they build:
the request sequence (random token ids, fixed lengths, or a prompt file), the open loop's
arrivals, the headers (docs/LOADGEN.md). Not a command: the three import it."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import typer

from harness.analysis.goodput import parse_slos
from harness.errors import BenchError
from harness.measure.arrivals import ArrivalSchedule
from harness.measure.prompt_file import read_prompt_file
from harness.measure.request_sequence import build_requests
from harness.measure.run_plan import RunPlan, SlotLoad
from harness.scenario import Scenario

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


# name -> (type, option): what `with_load_options` adds to a command's signature
OPTIONS = {
    "concurrency": (int | None, CONCURRENCY),
    "requests": (int | None, REQUESTS),
    "duration": (float | None, DURATION),
    "warmup": (int | None, WARMUP),
    "request_rate": (float | None, REQUEST_RATE),
    "burstiness": (float, BURSTINESS),
    "input_len": (int | None, INPUT_LEN),
    "output_len": (int | None, OUTPUT_LEN),
    "prompts": (Path | None, PROMPTS),
    "tokenizer": (str | None, TOKENIZER),
    "seed": (int | None, SEED),
    "chat": (bool, CHAT),
    "header": (list[str], HEADER),
    "goodput": (str | None, GOODPUT),
}


def with_load_options(*names: str) -> Callable:
    """Give a command the shared load options `names` (default: all of them); they reach it
    as one dict, `load_options`, so each command declares and passes them once."""
    chosen = names or tuple(OPTIONS)

    def decorate(command: Callable) -> Callable:
        signature = inspect.signature(command, eval_str=True)
        own = [p for p in signature.parameters.values() if p.name != "load_options"]
        kind = inspect.Parameter.KEYWORD_ONLY
        added = [
            inspect.Parameter(n, kind, default=OPTIONS[n][1], annotation=OPTIONS[n][0])
            for n in chosen
        ]

        @functools.wraps(command)
        def wrapper(**kwargs):
            options = {n: kwargs.pop(n) for n in chosen}
            return command(**kwargs, load_options=options)

        wrapper.__signature__ = inspect.Signature(own + added)
        wrapper.__annotations__ = {p.name: p.annotation for p in own + added}
        del wrapper.__wrapped__  # typer must read the signature above, not the command's
        return wrapper

    return decorate


@dataclass(frozen=True)
class Workload:
    requests: object  # a RequestSequence or PromptList
    warmup: int
    measured: int
    concurrency: int
    arrivals: ArrivalSchedule | None
    headers: dict[str, str]
    chat: bool
    slos_ms: dict[str, float] | None
    duration_s: float | None  # seconds of load per server (None: the requests' count)

    def plan(
        self,
        scenario: Scenario,
        arms: dict,
        letters: list[str],
        block_size: int,
        period: int,
        shards: int,
        points: list[SlotLoad] | None = None,
        **settings,
    ) -> RunPlan:
        """The schedule that drives this load against `arms` in the order of `letters`;
        `settings` are the plan's other fields (stall_s, margin)."""
        return RunPlan(
            scenario=scenario,
            arms=arms,
            letters=letters,
            block_size=block_size,
            concurrency=self.concurrency,
            requests=self.requests,
            warmup=self.warmup,
            period=period,
            duration_s=self.duration_s,
            shards=shards,
            arrivals=self.arrivals,
            headers=self.headers,
            chat=self.chat,
            points=points,
            **settings,
        )


def workload(
    scenario: Scenario,
    vocab_size: int,
    *,
    concurrency: int | None = None,
    requests: int | None = None,
    duration: float | None = None,
    warmup: int | None = None,
    request_rate: float | None = None,
    burstiness: float = 1.0,
    input_len: int | None = None,
    output_len: int | None = None,
    prompts: Path | None = None,
    tokenizer: str | None = None,
    seed: int | None = None,
    chat: bool = False,
    header: list[str] = (),
    goodput: str | None = None,
) -> Workload:
    """The load the options describe; a BenchError says which option is wrong."""
    if requests is not None and duration is not None:
        raise BenchError("give --requests or --duration, not both")
    if concurrency is None and request_rate is None:
        raise BenchError("give --concurrency (closed loop) or --request-rate (open loop)")
    if request_rate is not None and not (request_rate > 0 and burstiness > 0):
        raise BenchError("--request-rate and --burstiness must be > 0")
    if prompts is not None and input_len is not None:
        raise BenchError("--input-len sets random prompts' length; a prompt file has its own")
    load = scenario.load
    warm = load.warmup if warmup is None else warmup
    measured = load.requests if requests is None else requests
    count = warm + (measured if duration is None else 1_000_000)
    seed = load.seed if seed is None else seed
    if chat and scenario.load.api != "completions":
        raise BenchError(
            f"--chat sends chat completions; {scenario.name}'s load is {scenario.load.api}"
        )
    if prompts is not None:
        sequence = read_prompt_file(prompts, count, output_len, tokenizer)
        if chat and any(not isinstance(p, str) for p in sequence.prompts):
            raise BenchError("--chat sends text: the prompt file holds token-id prompts")
    else:
        if chat:
            raise BenchError("--chat needs text prompts: give a --prompts file")
        fixed = {
            "prompt_tokens": (input_len, input_len) if input_len else load.prompt_tokens,
            "output_tokens": (output_len, output_len) if output_len else load.output_tokens,
        }
        sequence = build_requests(dataclasses.replace(load, **fixed), vocab_size, count, seed)
    arrivals = None
    if request_rate is not None:
        arrivals = ArrivalSchedule(float(request_rate), float(burstiness), seed, count)
    try:
        slos = parse_slos(goodput) if goodput else None
    except ValueError as exc:
        raise BenchError(str(exc)) from None
    cap = concurrency or OPEN_LOOP_CAP
    return Workload(sequence, warm, measured, cap, arrivals, headers(header), chat, slos, duration)


def headers(options: list[str]) -> dict[str, str]:
    """`--header K:V` options as a dict."""
    out = {}
    for option in options:
        name, sep, value = option.partition(":")
        if not sep or not name.strip() or any(c in option for c in "\r\n"):
            raise BenchError(f"--header {option!r} must be NAME:VALUE on one line")
        out[name.strip()] = value.strip()
    return out


def rate_text(rate: float | None) -> str:
    return "-" if rate is None else "inf" if math.isinf(rate) else f"{rate:g}"
