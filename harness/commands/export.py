"""`bench export RUN --format vllm|csv`: a run's requests in forms other tools read: the
result file of `vllm bench serve --save-result`, or one CSV row per request."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from harness.analysis.export import records_frame, vllm_result
from harness.errors import BenchError
from harness.results import load_run
from harness.show.console import fail, notes


def main(
    run_dir: Path = typer.Argument(..., help="A run directory (results/<run-id>)."),
    format: str = typer.Option("vllm", "--format", help="vllm (JSON) or csv."),
    arm: str | None = typer.Option(None, help="The arm's letter (A or B); a run of two needs it."),
    out: Path | None = typer.Option(None, help="File to write (default: in the run directory)."),
) -> None:
    """Write the run's requests as vLLM's result JSON or as CSV; print the file's path."""
    if format not in ("vllm", "csv"):
        fail(f"--format {format!r}: give vllm or csv")
    try:
        manifest, frames = load_run(run_dir)
    except BenchError as exc:
        fail(str(exc))
    requests = frames["requests"]
    letters = sorted(set(requests["letter"])) if len(requests) else []
    if arm is not None:
        if arm not in letters:
            fail(f"--arm {arm}: the run has arms {', '.join(letters) or 'none'}")
        requests = requests[requests["letter"] == arm]
    elif format == "vllm" and len(letters) > 1:
        fail("the run has two arms: say which with --arm A or --arm B")
    suffix = f"-{arm}" if arm else ""
    if format == "vllm":
        path = out or Path(run_dir) / f"vllm{suffix}.json"
        path.write_text(json.dumps(vllm_result(manifest, requests, manifest.get("goodput"))))
    else:
        path = out or Path(run_dir) / f"requests{suffix}.csv"
        records_frame(requests).to_csv(path, index=False)
    notes().print(f"wrote {path}")
