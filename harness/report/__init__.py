"""The pull-request report of a run: report.md with PNG plots beside it, optionally report.html.

`write_report(run_dir)` reads a run directory and writes its report there; `write(evidence,
out)` writes the report of any `Evidence` (e.g. `bench compare`'s two runs) into `out`.
Tables come from the `Comparison` (harness/compare.py), never recomputed here; plots draw its
figures and the raw rows (plots.py, series.py; style.py is the one module that imports
matplotlib). docs/REPORTS.md says what each part shows.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from harness.compare import Comparison
from harness.errors import BenchError
from harness.results import load_run
from harness.summarize import summarize

RESULTS = Path(__file__).resolve().parents[2] / "results"
CALIBRATION = Path("calibration") / "latest.json"  # written by `bench calibrate`
CLIENT_LIMIT_SHARE = 0.5  # a server this close to the client's measured max is doubtful


@dataclass
class Evidence:
    """Everything a report shows: the run's facts, its raw rows and its comparison."""

    manifest: dict
    frames: dict[str, pd.DataFrame]  # requests, spans, servers; each row has its `letter`
    comparison: Comparison
    calibration: dict | None = None  # results/calibration/latest.json
    power: dict | None = None  # results/power/<scenario>.json
    doubts: list[str] = field(default_factory=list)  # the comparison's, then the report's


def gather(
    manifest: dict, frames: dict[str, pd.DataFrame], comparison: Comparison, results: Path
) -> Evidence:
    """Evidence from a comparison, with the calibration and power results on record."""
    frames = with_letters(frames)
    scenario = manifest.get("scenario", {}).get("name", "")
    evidence = Evidence(
        manifest,
        frames,
        comparison,
        calibration=_read_json(results / CALIBRATION),
        power=_read_json(results / "power" / f"{scenario}.json"),
    )
    evidence.doubts = [*comparison.doubts, *client_limit_doubts(evidence)]
    return evidence


def write_report(
    run_dir: Path,
    html: bool = False,
    comparison: Comparison | None = None,
    results: Path = RESULTS,
) -> Path:
    """Write report.md, plots/ and, with `html`, report.html into the run directory; returns
    the path of report.md. Without `comparison` (the run's `summarize()`), summarizes the run
    first, which also rewrites its summary.json."""
    manifest, frames = load_run(run_dir)
    if frames["servers"].empty:
        raise BenchError(f"{run_dir} has no servers yet: nothing to report")
    comparison = comparison if comparison is not None else summarize(run_dir)
    return write(gather(manifest, frames, comparison, results), Path(run_dir), html)


def write(evidence: Evidence, out: Path, html: bool = False) -> Path:
    from harness.report import plots  # matplotlib: loaded only when a report is written
    from harness.report.document import document
    from harness.report.html import to_html
    from harness.report.markdown import to_markdown

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    blocks = document(evidence, plots.draw_all(evidence, out / "plots"), relative_to=out)
    path = out / "report.md"
    path.write_text(to_markdown(blocks))
    if html:
        (out / "report.html").write_text(to_html(blocks, out, _title(evidence)))
    return path


def with_letters(frames: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """Each request and span row gets its server's schedule letter (A or B)."""
    servers = frames["servers"]
    letters = servers[["block", "slot", "letter"]]
    out = {"servers": servers}
    for name in ("requests", "spans"):
        frame = frames[name].drop(columns="letter", errors="ignore")
        out[name] = frame.merge(letters, on=["block", "slot"], how="left")
    return out


def client_limit(calibration: dict | None) -> float | None:
    """The most tokens per second one client core reads when each token is its own SSE
    event (as the engine streams them), from `bench calibrate`'s paced run."""
    return ((calibration or {}).get("latency") or {}).get("tokens_per_s_per_core")


def client_limit_doubts(evidence: Evidence) -> list[str]:
    """Servers whose output tok/s reaches CLIENT_LIMIT_SHARE of the most the client could read
    in calibration may have measured the client, not the server."""
    limit = client_limit(evidence.calibration)
    if not limit:
        return []
    rates = [s.output_tok_per_s for s in evidence.comparison.servers]
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


def _read_json(path: Path) -> dict | None:
    """A result another command writes, or None when absent or unreadable (then the report
    says it has none)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _title(evidence: Evidence) -> str:
    return f"bench report: {evidence.manifest.get('run_id', '')}"
