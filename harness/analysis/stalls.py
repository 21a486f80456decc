"""A stall at a server's start: its first token came far later after its first request than
the other servers' did (JIT compiles on the first prefill, a cold cache). Pure: the requests
and servers frames in, one `StartStall` per stalled server out (docs/METRICS.md, "A stall at
the start").

A server's start delay is its earliest first token less its earliest send, over all its
requests (warmup included). It stalled when that delay exceeds both STALL_FLOOR_S and
STALL_FACTOR times the median of the other servers' start delays (the floor alone for a
server with no other). Comparing like with like keeps a slow first burst out: every server
of the run prefills its first C prompts at once, so every start delay holds that burst.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

STALL_FLOOR_S = 10.0  # never a stall below this, whatever the other servers did
STALL_FACTOR = 10.0  # a stall is this many times the other servers' median start delay


@dataclass(frozen=True)
class StartStall:
    server: str
    delay_s: float  # its first token less its first send
    others_s: tuple[float, float] | None  # the servers that did not stall: least, most delay
    measured: int  # measured requests sent before its first token: their TTFT holds the stall
    steady_after: bool | None  # its steady window opens after the stall (None: no window)


def start_delays(requests: pd.DataFrame) -> pd.Series:
    """Seconds from each server's first send to its first token, by server id, warmup
    included; a server that received no first token is left out."""
    if requests.empty:
        return pd.Series(dtype=float)
    rows = requests.assign(first_token_s=requests["first_token_s"].astype(float))
    by = rows.groupby("server")
    return (by["first_token_s"].min() - by["send_s"].min()).dropna()


def start_stalls(requests: pd.DataFrame, servers: pd.DataFrame) -> list[StartStall]:
    """The servers that stalled at their start (the module's rule), by server id."""
    delays = start_delays(requests)
    stalled = [server for server, delay in delays.items() if delay > _bound(delays.drop(server))]
    calm = delays.drop(stalled)  # never empty beside a stall: the least delay is under its bound
    windows = dict(zip(servers["server"], servers["steady_start_s"], strict=True))
    out = []
    for server in stalled:
        mine = requests[requests["server"] == server]
        first_token = mine["send_s"].min() + delays[server]
        waited = mine[(mine["send_s"] < first_token) & ~mine["warmup"].astype(bool)]
        steady = windows.get(server)
        out.append(
            StartStall(
                str(server),
                float(delays[server]),
                (float(calm.min()), float(calm.max())) if len(delays) > 1 else None,
                len(waited),
                None if steady is None or pd.isna(steady) else bool(steady >= first_token),
            )
        )
    return out


def _bound(others: pd.Series) -> float:
    """The start delay past which a server stalled, given the other servers' start delays."""
    return max(STALL_FLOOR_S, STALL_FACTOR * others.median()) if len(others) else STALL_FLOOR_S
