"""The load `bench run`, `bench measure` and `bench sweep` drive, from their load options
(`LoadOptions`, declared once in options.py): the request sequence (random token ids, fixed
lengths, or a prompt file), the open loop's arrivals, the headers (docs/LOADGEN.md). Not a
command: the three import it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.analysis.goodput import parse_slos
from harness.commands.options import OPEN_LOOP_CAP
from harness.errors import BenchError
from harness.measure.arrivals import ArrivalSchedule
from harness.measure.prompt_file import read_prompt_file
from harness.measure.request_sequence import build_requests
from harness.measure.run_plan import RunPlan, SlotLoad
from harness.scenario import Scenario


@dataclass(frozen=True)
class LoadOptions:
    """The load options as a command was given them (options.py: --concurrency, --requests,
    ...); None where not given: the scenario's value, or none."""

    concurrency: int | None = None
    requests: int | None = None
    duration: float | None = None
    warmup: int | None = None
    request_rate: float | None = None
    burstiness: float = 1.0
    input_len: int | None = None
    output_len: int | None = None
    prompts: Path | None = None
    tokenizer: str | None = None
    seed: int | None = None
    chat: bool = False
    header: tuple[str, ...] = ()
    goodput: str | None = None

    @classmethod
    def given(cls, parameters: Mapping[str, object]) -> LoadOptions:
        """The options among a command's parameters (its `locals()`, each option declared in
        its signature under the field's name); a field the command does not declare keeps its
        default. --header's list becomes a tuple."""
        names = [f.name for f in dataclasses.fields(cls) if f.name in parameters]
        given = {name: parameters[name] for name in names}
        if "header" in given:
            given["header"] = tuple(given["header"])
        return cls(**given)


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


def workload(scenario: Scenario, vocab_size: int, options: LoadOptions) -> Workload:
    """The load the options describe; a BenchError says which option is wrong."""
    o, load = options, scenario.load
    if o.requests is not None and o.duration is not None:
        raise BenchError("give --requests or --duration, not both")
    if o.concurrency is None and o.request_rate is None:
        raise BenchError("give --concurrency (closed loop) or --request-rate (open loop)")
    if o.request_rate is not None and not (o.request_rate > 0 and o.burstiness > 0):
        raise BenchError("--request-rate and --burstiness must be > 0")
    if o.prompts is not None and o.input_len is not None:
        raise BenchError("--input-len sets random prompts' length; a prompt file has its own")
    warm = load.warmup if o.warmup is None else o.warmup
    measured = load.requests if o.requests is None else o.requests
    count = warm + (measured if o.duration is None else 1_000_000)
    seed = load.seed if o.seed is None else o.seed
    if o.chat and load.api != "completions":
        raise BenchError(f"--chat sends chat completions; {scenario.name}'s load is {load.api}")
    if o.prompts is not None:
        sequence = read_prompt_file(o.prompts, count, o.output_len, o.tokenizer)
        if o.chat and any(not isinstance(p, str) for p in sequence.prompts):
            raise BenchError("--chat sends text: the prompt file holds token-id prompts")
    else:
        if o.chat:
            raise BenchError("--chat needs text prompts: give a --prompts file")
        fixed = {
            "prompt_tokens": (o.input_len, o.input_len) if o.input_len else load.prompt_tokens,
            "output_tokens": (o.output_len, o.output_len) if o.output_len else load.output_tokens,
        }
        sequence = build_requests(dataclasses.replace(load, **fixed), vocab_size, count, seed)
    arrivals = None
    if o.request_rate is not None:
        arrivals = ArrivalSchedule(float(o.request_rate), float(o.burstiness), seed, count)
    try:
        slos = parse_slos(o.goodput) if o.goodput else None
    except ValueError as exc:
        raise BenchError(str(exc)) from None
    cap = o.concurrency or OPEN_LOOP_CAP
    return Workload(
        sequence, warm, measured, cap, arrivals, headers(o.header), o.chat, slos, o.duration
    )


def headers(options: Sequence[str]) -> dict[str, str]:
    """`--header K:V` options as a dict."""
    out = {}
    for option in options:
        name, sep, value = option.partition(":")
        if not sep or not name.strip() or any(c in option for c in "\r\n"):
            raise BenchError(f"--header {option!r} must be NAME:VALUE on one line")
        out[name.strip()] = value.strip()
    return out
