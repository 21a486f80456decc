"""Where the worker's time goes: span windows turned into ms per iteration and per request.

The spans frame has one row per `SpanRecord`: per server, one row per span name per window
of worker iterations (a name with no sample in a window has no row). Figures are pooled as
sum over sum, never as a mean of per-window ratios (docs/METRICS.md, "Worker phases"). Span
names are the span wire's (engine/spans.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from engine import spans as names
from harness.analysis.schema import SERVER_KEY

BY_SERVER = tuple(SERVER_KEY)
BY_ARM = ("letter",)
POSTPROCESS = names.POSTPROCESS_BATCH
# Waits timed inside worker.postprocess_batch, subtracted to leave the postprocess's own work:
# the wait for the step's output, and the stop check's host copy. A span listed here must be
# nested in postprocess_batch by the worker; a negative work figure says one is not.
POSTPROCESS_WAITS = (names.COMPLETION_WAIT, names.PREMATERIALIZE)
POSTPROCESS_WORK = "postprocess work"
MESSAGE = names.MESSAGE
ALL_MESSAGES = MESSAGE + "*"
_WINDOW = [*BY_SERVER, "server", "first_iter", "last_iter"]


def iterations(spans: pd.DataFrame, by: Sequence[str] = BY_SERVER) -> pd.Series:
    """Worker iterations covered, counting each window of each worker once."""
    windows = spans.drop_duplicates(_WINDOW)
    return windows.groupby(list(by))["iterations"].sum()


def ms_per_iteration(spans: pd.DataFrame, by: Sequence[str] = BY_SERVER) -> pd.DataFrame:
    """[*by, name, ms_per_iter]: each span's total time over all iterations covered."""
    timed = spans[spans["kind"] == names.SPAN]
    ns = timed.groupby([*by, "name"])["sum"].sum().rename("ns").reset_index()
    out = ns.merge(iterations(spans, by).rename("iterations").reset_index(), on=list(by))
    out["ms_per_iter"] = out["ns"] / out["iterations"] / 1e6
    return out[[*by, "name", "ms_per_iter"]]


def postprocess_work(
    per_iteration: pd.DataFrame,
    by: Sequence[str] = BY_SERVER,
    waits: Sequence[str] = POSTPROCESS_WAITS,
) -> pd.DataFrame:
    """[*by, name, ms_per_iter] rows named POSTPROCESS_WORK: worker.postprocess_batch less the
    waits in it; a wait with no samples counts as zero."""
    wide = per_iteration.pivot_table(
        index=list(by), columns="name", values="ms_per_iter", aggfunc="sum"
    )
    if POSTPROCESS not in wide:
        return per_iteration.iloc[:0]
    present = [w for w in waits if w in wide]
    work = wide[POSTPROCESS] - wide[present].fillna(0.0).sum(axis=1)
    work = work.dropna().rename("ms_per_iter").reset_index()
    return work.assign(name=POSTPROCESS_WORK)[[*by, "name", "ms_per_iter"]]


def phase_table(
    spans: pd.DataFrame, by: Sequence[str] = BY_SERVER, waits: Sequence[str] = POSTPROCESS_WAITS
) -> pd.DataFrame:
    """ms per iteration of every span, plus the derived postprocess work."""
    per_iteration = ms_per_iteration(spans, by)
    work = postprocess_work(per_iteration, by, waits)
    return pd.concat([per_iteration, work], ignore_index=True) if len(work) else per_iteration


def message_parent(name: str) -> str | None:
    """The message a stage lap belongs to (worker.msg.add_request.engine -> ...add_request)."""
    if not name.startswith(MESSAGE) or name == ALL_MESSAGES:
        return None
    parts = name[len(MESSAGE) :].split(".")
    return MESSAGE + parts[0] if len(parts) > 1 else None


def is_message(name: str) -> bool:
    """A span of one message's handling: worker.msg.<tag>, not a stage lap inside one and not
    the request removal that shares the prefix (engine.spans.NOT_MESSAGES)."""
    return (
        name.startswith(MESSAGE)
        and message_parent(name) is None
        and name not in names.NOT_MESSAGES
        and name != ALL_MESSAGES
    )


def message_costs(spans: pd.DataFrame, by: Sequence[str] = BY_SERVER) -> pd.DataFrame:
    """[*by, name, ms_per_request, requests]: ms of each worker.msg.* span and stage lap per
    request (requests = samples of worker.msg.add_request), plus ALL_MESSAGES, the sum over
    the messages received (`is_message`: laps are inside their message's span, and the
    request removal runs inside the postprocess's tail or the abort message)."""
    messages = spans[(spans["kind"] == names.SPAN) & spans["name"].str.startswith(MESSAGE)]
    added = messages[messages["name"] == names.ADD_REQUEST].groupby(list(by))["n"].sum()
    ns = messages.groupby([*by, "name"])["sum"].sum().reset_index()
    tops = ns[ns["name"].map(is_message).astype(bool)]
    total = tops.groupby(list(by))["sum"].sum().reset_index().assign(name=ALL_MESSAGES)
    out = pd.concat([ns, total], ignore_index=True)
    out = out.merge(added.rename("requests").reset_index(), on=list(by))
    out = out[out["requests"] > 0]
    out["ms_per_request"] = out["sum"] / out["requests"] / 1e6
    return out[[*by, "name", "ms_per_request", "requests"]]


def count_means(spans: pd.DataFrame, by: Sequence[str] = BY_SERVER) -> pd.DataFrame:
    """[*by, name, mean]: the mean sample of each count (e.g. worker.rows_per_step)."""
    counts = spans[spans["kind"] == names.COUNT]
    sums = counts.groupby([*by, "name"])[["sum", "n"]].sum()
    return (sums["sum"] / sums["n"]).rename("mean").reset_index()
