"""Checks before the first server starts (docs/RELIABILITY.md, faults 9, 14 and 19): the
scenario's headline is a figure the run measures, every engine arm's model is one the engine
builds, every URL arm answers, the load fits every arm's engine, and the load can reach a
steady window at all. A run that fails one would spend its servers' minutes on nothing; each is
one line instead.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence

import msgspec

from harness.analysis import server_figures
from harness.errors import BenchError
from harness.measure.request_sequence import PromptList, RequestSequence, RequestSpec
from harness.measure.run_plan import RunPlan
from harness.measure.server import model_card
from harness.scenario import ConfigError, Scenario

WINDOW_CHECK_MAX = 20_000  # longer sequences are not modelled (their window is not in doubt)


def preflight(plan: RunPlan, engines: Mapping[str, Scenario | None]) -> list[str]:
    """Raise a BenchError when the run cannot give a result; else the notes on what it will
    give less of (`check_window`). `engines` holds each arm's resolved scenario by letter
    (None for a URL arm, whose server is asked instead)."""
    check_headline(plan.scenario, plan.api)
    for letter, arm in sorted(plan.arms.items()):
        if arm.kind != "url":
            check_model(engines[letter], f"arm {arm.name}")
    for letter, arm in sorted(plan.arms.items()):
        if arm.kind == "url":
            card = model_card(arm.url, plan.headers)
            limit = (card or {}).get("max_model_len")
            if isinstance(limit, int) and limit > 0:
                check_fits(plan.requests, limit, f"arm {arm.name} ({arm.url})")
        else:
            limit = engines[letter].engine.max_model_len
            check_fits(plan.requests, limit, f"arm {arm.name}'s engine.max_model_len")
    if plan.duration_s is None and len(plan.requests) <= WINDOW_CHECK_MAX:
        loads = [plan.load(slot) for slot in range(len(plan.letters))]
        closed = {load.concurrency for load in loads if load.arrivals is None}
        notes = [check_window(plan.requests, c, plan.warmup) for c in sorted(closed)]
        pools: dict[tuple, list[str]] = {}  # arms whose engines hold alike: one note
        for letter, arm in sorted(plan.arms.items()):
            if arm.kind != "url":
                pools.setdefault(tuple(pool(engines[letter]).items()), []).append(arm.name)
        notes += [
            check_capacity(plan.requests, c, dict(held), f"the engine of arm {', '.join(names)}")
            for held, names in pools.items()
            for c in sorted(closed)
        ]
        return [note for note in notes if note]  # the open loop's window is its arrivals'
    return []


def pool(scenario: Scenario) -> dict[str, int]:
    """What an engine holds at once: rows, state slots, KV pages and their size."""
    engine = scenario.engine
    names = ("max_rows", "state_slots", "kv_pages", "page_size")
    return {name: getattr(engine, name) for name in names}


def check_headline(scenario: Scenario, api: str) -> None:
    """The scenario's headline must be a figure of its load (server_figures.figures): else every
    server would run and the comparison would have no verdict to give."""
    names = [figure.name for figure in server_figures.figures(audio=api == "speech")]
    if scenario.headline not in names:
        raise BenchError(
            f"scenario {scenario.name}: headline {scenario.headline!r} is not a figure of a"
            f" {api} load; use one of {', '.join(names)}"
        )


def check_model(scenario: Scenario, where: str) -> None:
    """The arm's model must be one the engine builds: a known model.arch and model.preset
    (or a model.path whose config.json gives its vocabulary)."""
    from engine.models import vocab_size  # torch: not at `bench` start-up

    try:
        vocab_size(scenario.model)
    except ConfigError as exc:
        raise BenchError(f"{where}: {exc}") from None
    except (OSError, KeyError, ValueError) as exc:
        raise BenchError(
            f"{where}: cannot read model.path {scenario.model.path}'s config.json ({exc})"
        ) from None


def check_fits(requests: Sequence[RequestSpec], max_model_len: int, where: str) -> None:
    """The longest request of the load (prompt + output) within the engine's window. A text
    prompt's tokens are the server's to count: only its output counts here."""
    prompt, output = longest(requests)
    if prompt + output > max_model_len:
        shorten = (
            "the prompt file's requests or --output-len"
            if isinstance(requests, PromptList)
            else "the scenario's load.prompt_tokens or load.output_tokens (or --input-len,"
            " --output-len)"
        )
        raise BenchError(
            f"the load does not fit {where}: prompts up to {prompt} + outputs up to {output}"
            f" tokens > {max_model_len}; shorten {shorten}, or raise engine.max_model_len"
        )


def longest(requests: Sequence[RequestSpec]) -> tuple[int, int]:
    """The prompt and output tokens of the load's longest request (random lengths: of the
    longest each range allows)."""
    if isinstance(requests, RequestSequence):
        return requests.prompt_tokens[1], requests.output_tokens[1]
    if isinstance(requests, PromptList):
        entries = zip(requests.prompts, requests.output_tokens, strict=True)
    else:
        entries = ((r.prompt, r.max_tokens) for r in requests)
    sizes = [(len(p) if isinstance(p, list) else 0, n) for p, n in entries]
    return max(sizes, key=sum, default=(0, 0))


def check_window(requests: Sequence[RequestSpec], concurrency: int, warmup: int) -> str | None:
    """Refuse a load whose closed loop has no steady window even in `steady_window`'s model;
    note one shorter than the load's longest request: the run's throughput stands, but few
    requests (none, below the shortest) are both sent and ended inside a server's window, so
    its TTFT, TPOT and E2E percentiles have few samples or none (128 requests at -c 64, 2 a
    client, leave the 0.8b window none). None when the window has room. Either says the fewest `--requests`
    whose modelled window lasts one longest request."""
    lengths = [requests[i].max_tokens for i in range(len(requests))]
    window = steady_window(lengths, concurrency, warmup)
    if window and window >= max(lengths):
        return None
    enough = _fewest_measured(requests, concurrency, warmup, max(lengths))
    advice = f"--requests {enough} or more" if enough is not None else "more --requests"
    if window > 0:
        return (
            f"at -c {concurrency} the steady window (~{window} steps, modelled) is shorter than "
            f"the longest request ({max(lengths)} tokens): few requests or none will both start "
            f"and end inside it, so its TTFT, TPOT and E2E percentiles may be empty (its "
            f"throughput stands); for them give {advice}"
        )
    measured = len(requests) - warmup
    if len(requests) < concurrency:
        why = f"{len(requests)} requests in all never keep {concurrency} in flight"
    else:
        why = f"the last of {warmup} warmup requests ends after the {measured} measured run out"
    raise BenchError(
        f"no steady window at -c {concurrency}: {why}; give {advice}, or fewer --warmup"
    )


def steady_window(lengths: Sequence[int], concurrency: int, warmup: int) -> int:
    """Steps of the closed loop's steady window (docs/LOADGEN.md) if request i took
    lengths[i] steps: C lanes start together; the window opens when the last warmup request
    ends and closes at the first end that finds the sequence exhausted; 0 when it has none. With
    C requests in flight the batch, hence a step, keeps one size, so steps stand for time."""
    if len(lengths) < concurrency:
        return 0  # the lanes are never all busy
    ends = [(lengths[i], i) for i in range(concurrency)]
    heapq.heapify(ends)
    warmup_done = max(lengths[: min(warmup, concurrency)], default=0)
    following = concurrency
    while True:
        end, _ = heapq.heappop(ends)
        if following == len(lengths):
            return max(0, end - warmup_done)
        finish = end + lengths[following]
        if following < warmup:
            warmup_done = max(warmup_done, finish)
        heapq.heappush(ends, (finish, following))
        following += 1


def _fewest_measured(
    requests: Sequence[RequestSpec], concurrency: int, warmup: int, margin: int
) -> int | None:
    """The fewest measured requests whose modelled window lasts `margin` steps (the longest
    request): a window with room to spare. None when the sequence cannot be drawn longer."""
    if not isinstance(requests, RequestSequence):
        return None
    lengths: list[int] = []

    def window(measured: int) -> int:
        count = warmup + measured
        if len(lengths) < count:  # the same seed: a longer sequence begins with this one
            longer = msgspec.structs.replace(requests, count=count)
            lengths.extend(longer[i].max_tokens for i in range(len(lengths), count))
        return steady_window(lengths[:count], concurrency, warmup)

    low = high = len(requests) - warmup  # window(low) < margin <= window(high), once found
    while window(high) < margin:
        low, high = high, 2 * high
        if warmup + high > 8 * WINDOW_CHECK_MAX:
            return None
    while high - low > 1:  # the window only grows with the measured requests
        middle = (low + high) // 2
        low, high = (low, middle) if window(middle) >= margin else (middle, high)
    return high


CAPACITY_SAMPLE = 4096  # requests whose reservations estimate the pool's mean one


def check_capacity(
    requests: Sequence[RequestSpec], concurrency: int, pool: Mapping[str, int], where: str
) -> str | None:
    """Note a closed loop that keeps more requests in flight than the engine holds at once:
    the rest wait in its queue, so their TTFT counts the wait and the run measures fewer in
    flight than -c says. `pool`: the engine's max_rows, state_slots, kv_pages and page_size.
    Admission reserves each request's prompt + output pages up front (engine/worker/
    scheduler.py), so the KV pool holds kv_pages / (mean pages reserved) of the load's requests;
    a text prompt, whose length the client does not know, counts its output alone (at most)."""
    sample = [requests[i] for i in range(min(len(requests), CAPACITY_SAMPLE))]
    if not sample:
        return None
    page = pool["page_size"]
    mean = sum(-(-(r.prompt_tokens + r.max_tokens) // page) for r in sample) / len(sample)
    limits = {
        f"engine.max_rows {pool['max_rows']}": pool["max_rows"],
        f"engine.state_slots {pool['state_slots']}": pool["state_slots"],
        f"its KV pool of {pool['kv_pages']} pages ({page} tokens a page; a request reserves"
        f" its prompt + output, {mean:.0f} pages on average)": int(pool["kv_pages"] // mean),
    }
    why, holds = min(limits.items(), key=lambda item: item[1])
    if concurrency <= holds:
        return None
    if why.startswith("its KV pool"):
        need = -(-int(concurrency * mean * 1.1) // 1024) * 1024
        fix = f"engine.kv_pages {need} or more"
    else:
        fix = f"{why.split()[0]} {concurrency} or more"
    return (
        f"at -c {concurrency} {where} holds ~{holds} of these requests at once ({why}): the"
        f" other {concurrency - holds} wait in its queue, so TTFT counts the wait and the run"
        f" measures ~{holds} in flight; give {fix}, or a smaller -c"
    )
