"""What qualifies a comparison: each doubt says what might make a figure wrong and what to do
about it (rerun with more blocks, see a server's log, add client shards)."""

from __future__ import annotations

import math
from collections.abc import Collection

import pandas as pd

from harness.analysis.block_model import MIN_BLOCKS
from harness.analysis.comparison import Comparison
from harness.analysis.phases import POSTPROCESS_WORK
from harness.analysis.schema import LETTERS
from harness.analysis.stalls import StartStall, start_stalls
from harness.analysis.stats import IN_BLOCKS
from harness.analysis.verdict import NOT_ENOUGH, ONE_BLOCK, Change

CLIENT_LIMIT_SHARE = 0.5  # a server this close to the client's measured max is doubtful


def comparison_doubts(
    result: Comparison,
    requests: pd.DataFrame,
    per_server: pd.DataFrame,
    servers: pd.DataFrame,
    spans: pd.DataFrame,
    external: Collection[str],
) -> list[str]:
    """Failed requests, unhealthy servers, stalls at a server's start, missing steady
    windows, untimed tokens, too few blocks, figures too noisy to decide, missing spans, a
    postprocess work below zero. `external` names the letters whose servers send no spans by
    design."""
    doubts = []
    for letter in LETTERS:
        failed = sum(s.failed for s in result.servers if s.letter == letter)
        if failed:
            doubts.append(f"{failed} failed requests in arm {letter}: see status/error in requests")
    for s in servers.itertuples(index=False):
        where = f"server {s.letter} block {s.block} slot {s.slot}"
        error = s.error if isinstance(s.error, str) and s.error else None  # NaN: a table
        if not s.healthy or error:  # that mixes failed and healthy slots fills the others
            doubts.append(f"{where}: {error or 'never healthy'}; see {s.log}")
        if pd.isna(s.steady_start_s) or pd.isna(s.steady_end_s):
            doubts.append(f"{where}: no steady window, so no steady tok/s")
    doubts += start_stall_doubts(requests, servers)
    first = next((c for c in ("ttft_p50_ms", "ttfa_p50_ms") if c in per_server.columns), None)
    windowed = servers["steady_start_s"].notna() & servers["steady_end_s"].notna()
    keys = servers.loc[windowed, ["block", "slot"]]
    latency = per_server.merge(keys, on=["block", "slot"])[first] if first else []
    if len(latency) and latency.isna().all():
        doubts.append(
            "no request was both sent and ended inside a steady window, so the steady "
            "latency percentiles (TTFT, TPOT, E2E) have no samples: give more --requests "
            "(a steady window several requests long)"
        )
    untimed = per_server["output_tokens"] - per_server["timed_tokens"]
    if (untimed > 0).any():
        doubts.append(
            f"{int(untimed.sum())} output tokens have no arrival time (text-only stream?):"
            " steady tok/s and ITL undercount them; compare the whole-run tok/s"
        )
    if result.unit == IN_BLOCKS and result.blocks < MIN_BLOCKS:
        doubts.append(_too_few_blocks(result))
    noisy = [
        (name, c)
        for name, c in _decisive(result)
        if c.verdict == NOT_ENOUGH and c.blocks and c.method != ONE_BLOCK
    ]
    if noisy:
        needed = max(c.blocks_needed or 0 for _, c in noisy)
        more = f"about {needed} blocks in all" if needed else "more blocks"
        doubts.append(
            f"too noisy to decide: {', '.join(n for n, _ in noisy)}{_spread_words(result)};"
            f" rerun with {more} (--blocks auto adds them until decided)"
            + (_OUT_OF_REACH if needed and needed > FAR_BLOCKS else "")
        )
    for letter in LETTERS:
        if not (spans["letter"] == letter).any():
            doubts.append(
                f"no spans from arm {letter} (none expected: an external server, or timing off)"
                if letter in external
                else f"no spans from arm {letter}: run its servers with the phase-timing flag"
            )
    work = [p for p in result.phases if p.name == POSTPROCESS_WORK]
    if any(min(p.a_ms or 0, p.b_ms or 0) < 0 for p in work):
        doubts.append("postprocess work < 0: a subtracted wait is not inside postprocess_batch")
    return doubts


# More blocks than this to decide is no advice to follow: the noise must be found first.
FAR_BLOCKS = 12
_OUT_OF_REACH = (
    "; that many is out of reach: find the noise first (other jobs on this machine, the"
    " servers' outside CPU in servers.parquet, a CPU run's shared cores: docs/STATISTICS.md,"
    ' "Noise")'
)


def _spread_words(result: Comparison) -> str:
    """The headline's server-to-server spread within each arm (max/min - 1), the noise a
    reader can check against the margin."""
    row = result.headline_row
    if row is None:
        return ""
    spreads = []
    for letter, values in (("A", row.servers_a), ("B", row.servers_b)):
        good = [v for v in values if v is not None and math.isfinite(v) and v > 0]
        if len(good) >= 2:
            spreads.append(f"{letter} {max(good) / min(good) - 1:.1%}")
    if not spreads:
        return ""
    return (
        f" (the headline's servers spread {', '.join(spreads)} max/min within an arm,"
        f" against a {result.rule.margin:.0%} margin)"
    )


def start_stall_doubts(requests: pd.DataFrame, servers: pd.DataFrame) -> list[str]:
    """One line per server that stalled at its start (stalls.start_stalls)."""
    return [_stall_line(s) for s in start_stalls(requests, servers)]


def _stall_line(stall: StartStall) -> str:
    if stall.others_s is None:
        others = "no other server to compare"
    else:
        low, high = (_seconds(x) for x in stall.others_s)
        others = f"the servers that did not stall: {low if low == high else f'{low}-{high}'} s"
    steady = {
        True: ", its steady window does not: read the steady figures",
        False: ", and so does its steady window: give more --warmup (the window opens when"
        " the last warmup request ends)",
        None: "; it has no steady window",
    }[stall.steady_after]
    held = "its whole-load figures"
    if stall.measured:
        n, plural = stall.measured, "s" if stall.measured > 1 else ""
        held = f"the TTFT{plural} of {n} measured request{plural} and {held}"
    return (
        f"server {stall.server}: no first token for {stall.delay_s:.1f} s after its first request"
        f" ({others}): a stall at start (JIT compiles? a cold cache?); {held} include it{steady}"
    )


def _seconds(value: float) -> str:
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"


def _too_few_blocks(result: Comparison) -> str:
    """Why fewer than MIN_BLOCKS blocks give no faster/slower verdict, and what to run. One
    block's spread (2 degrees of freedom at most) cannot say how many blocks a verdict needs
    (docs/STATISTICS.md, "Blocks needed"): MIN_BLOCKS is asked for, and the headline's own
    estimate, when larger, is given as a rough hint."""
    if not result.blocks:
        return "no block holds both arms (see the servers' errors): nothing to compare; rerun"
    headline = next((f.change for f in result.figures if f.figure == result.headline), None)
    hint = headline.blocks_needed if headline else None
    rough = (
        f"; one block's spread is too rough to say how many a decisive verdict needs (the"
        f" headline's, over {headline.df} degrees of freedom, hints at about {hint})"
        if hint and hint > MIN_BLOCKS
        else ""
    )
    return (
        "1 block with both arms: no faster/slower verdict (the change and its interval are"
        " shown): in one block each arm holds fixed positions (A B B A: A the first and last"
        " server), so whatever a server's position does to it (e.g. slower first and last"
        f" servers) reads as a change of code; rerun with --blocks {MIN_BLOCKS} or more, or"
        " add blocks to this run with --out DIR --continue (the next block, in turned order,"
        f" cancels it){rough}"
    )


def _decisive(result: Comparison) -> list[tuple[str, Change]]:
    """The figures whose noise decides how many blocks a run needs: the headline, which
    decides the exit code, and the postprocess's own work, where a worker change shows."""
    out = [(f.label, f.change) for f in result.figures if f.figure == result.headline]
    return out + [(p.name, p.change) for p in result.phases if p.name == POSTPROCESS_WORK]


def client_limit(calibration: dict | None) -> float | None:
    """The most tokens per second one client core reads when each token is its own SSE
    event (as the engine streams them), from `bench calibrate`'s paced run."""
    return ((calibration or {}).get("latency") or {}).get("tokens_per_s_per_core")


def client_limit_doubts(comparison: Comparison, calibration: dict | None) -> list[str]:
    """Servers whose output tok/s reaches CLIENT_LIMIT_SHARE of the most the client could read
    in calibration may have measured the client, not the server."""
    limit = client_limit(calibration)
    if not limit:
        return []
    rates = [s.output_tok_per_s for s in comparison.servers]
    near = [
        r for r in rates if r is not None and math.isfinite(r) and r >= CLIENT_LIMIT_SHARE * limit
    ]
    if not near:
        return []
    return [
        f"{len(near)} server(s) ran at {CLIENT_LIMIT_SHARE:.0%} or more of the client's calibrated"
        f" maximum ({limit:,.0f} tok/s), up to {max(near):,.0f} tok/s ({max(near) / limit:.0%}):"
        " the client may be the limit; rerun with more --shards"
    ]
