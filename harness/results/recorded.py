"""A recorded run read back: its manifest and tables, each checked to be what the runner wrote
(an older schema's read as this one's), one run or a directory of them; and its summary,
written to summary.json once when the run ends and read back by the report.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa

from harness.analysis import schema
from harness.analysis.schema import SCHEMA_VERSION
from harness.analysis.summary import Summary, from_summary_json, summarize, summary_json
from harness.errors import BenchError
from harness.results.files import read_json, write_json


def load_run(path: Path) -> tuple[dict, dict[str, pd.DataFrame]]:
    """The manifest and the three tables of a run directory (an older version's read as this
    version's: schema.upgrade). What cannot be what the runner wrote (a file that is not JSON
    or parquet, a manifest field of the wrong type, a table without its columns, one table of
    three missing) is a BenchError naming the file (docs/RELIABILITY.md fault 20). A run with
    no table at all has measured nothing yet (or was kept without them: `tables_left_out`)."""
    path = Path(path)
    manifest_path = path / "manifest.json"
    if not manifest_path.exists():
        raise BenchError(f"{path} is not a run directory (no manifest.json)")
    manifest = _read_manifest(manifest_path)
    version = manifest.get("schema_version")
    if isinstance(version, bool) or version not in range(1, SCHEMA_VERSION + 1):
        raise BenchError(
            f"{path} has results schema {version!r}, this bench reads 1 to {SCHEMA_VERSION};"
            " re-run it or use the bench version that wrote it"
        )
    files = {name: path / f"{name}.parquet" for name in schema.TABLES}
    missing = [files[name] for name in schema.REQUIRED if not files[name].exists()]
    if missing and len(missing) < len(schema.REQUIRED):  # metrics.parquet: since version 5
        raise BenchError(
            f"{missing[0]} is missing beside the run's other tables: the run directory is"
            " incomplete; restore the file or re-run"
        )
    frames = {name: _read_table(file, name) for name, file in files.items()}
    if version == SCHEMA_VERSION:
        return manifest, frames
    try:
        return manifest, schema.upgrade(frames, version)
    except KeyError as exc:
        raise BenchError(
            f"a table of {path} lacks the column {exc}: not what bench wrote"
        ) from None


# A manifest's fields that readers use, and the type each must have when present.
MANIFEST_FIELDS = {"scenario": dict, "arms": list, "kind": str, "complete": bool}
MANIFEST_FIELDS |= {"failed_servers": dict, "run_id": str, "calls": list}


def _read_manifest(file: Path) -> dict:
    try:
        manifest = json.loads(file.read_bytes())
    except (OSError, ValueError) as exc:
        raise BenchError(f"cannot read {file}: {_short(exc)}; restore it or re-run") from None
    if not isinstance(manifest, dict):
        raise BenchError(f"{file} is not a JSON object: not a run's manifest")
    wrong = [
        key
        for key, kind in MANIFEST_FIELDS.items()
        if not isinstance(manifest.get(key, kind()), kind)
    ]
    scenario = manifest.get("scenario", {})
    if not wrong and not all(isinstance(scenario.get(k, ""), str) for k in ("name", "headline")):
        wrong = ["scenario.name or scenario.headline"]
    arms = manifest.get("arms", [])
    if not wrong and not all(
        isinstance(arm, dict) and isinstance(arm.get("letter"), str) for arm in arms
    ):
        wrong = ["arms"]
    if wrong:
        raise BenchError(
            f"{file}: {wrong[0]} is not of the type bench writes; restore it or re-run"
        )
    return manifest


def _read_table(file: Path, name: str) -> pd.DataFrame:
    """A table as written, or a BenchError naming the file: unreadable, or without whole
    block and slot columns (every row's place in the schedule; the rest `schema.upgrade`
    checks)."""
    if not file.exists():
        return schema.empty(name)
    try:
        frame = pd.read_parquet(file, page_checksum_verification=True)
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise BenchError(f"cannot read {file}: {_short(exc)}; restore it or re-run") from None
    place = frame.reindex(columns=["block", "slot"])
    if not all(pd.api.types.is_integer_dtype(place[c]) for c in place) and len(frame):
        raise BenchError(f"{file} has no whole block and slot columns: not what bench wrote")
    return frame


def _short(exc: Exception) -> str:
    return " ".join(str(exc).split())[:160] or type(exc).__name__


def tables_left_out(path: Path, consequence: str) -> str | None:
    """What to say of a run that ended (its summary.json is there) but whose tables are not:
    kept without them (docs/evidence/, gpu_suite's evidence tarballs), not a run that measured
    nothing. None for any other run."""
    path = Path(path)
    missing = [
        f"{name}.parquet" for name in schema.REQUIRED if not (path / f"{name}.parquet").exists()
    ]
    if (path / "summary.json").exists() and missing:
        return (
            f"{path} was kept without its tables ({', '.join(missing)} missing): it "
            f"{consequence}; its report.md and summary.json hold its figures"
        )
    return None


def load_runs(path: Path) -> list[tuple[Path, dict, dict[str, pd.DataFrame]]]:
    """The run directory at `path`, or the run directories inside it (by name): each with its
    manifest and tables. A run that measured no server is refused."""
    path = Path(path)
    if (path / "manifest.json").exists() or not path.is_dir():
        paths = [path]  # load_run says what is wrong with a path that is no directory
    else:
        paths = sorted(p for p in path.iterdir() if (p / "manifest.json").exists())
        if not paths:
            raise BenchError(
                f"{path} is not a run directory (no manifest.json) and holds none; give a run"
                " directory or a directory of them"
            )
    out = []
    for run in paths:
        manifest, frames = load_run(run)
        if frames["servers"].empty:
            raise BenchError(
                tables_left_out(run, "cannot be read again")
                or f"{run} has no servers: nothing was measured; rerun it"
            )
        out.append((run, manifest, frames))
    return out


def summarise(path: Path) -> Summary:
    """Summarise a run once it has ended: its summary, written to summary.json."""
    manifest, frames = load_run(path)
    summary = summarize(manifest, frames)
    write_json(Path(path) / "summary.json", summary_json(manifest, summary))
    return summary


def load_summary(path: Path) -> Summary | None:
    """The summary summary.json holds; None for a run that was never summarised."""
    data = read_json(Path(path) / "summary.json")
    return None if data is None else from_summary_json(data)
