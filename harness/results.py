"""The results directory of one run: the one module that reads and writes it (docs/RESULTS.md).

`results/<run-id>/`: manifest.json, requests.parquet, spans.parquet, servers.parquet,
summary.json, logs/. The runner appends each slot's rows when the slot ends (the tables are
rewritten whole, atomically), so an interrupted run keeps what it measured. `summarise`
writes summary.json once, when the run ends; the report reads it back. The results other
commands write for the report to quote live beside the runs: calibration/latest.json
(`bench calibrate`) and power/<scenario>.json (`bench power`).
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from harness.analysis import schema
from harness.analysis.compare import Comparison
from harness.analysis.schema import SCHEMA_VERSION, RequestRecord, ServerRecord, SpanRecord
from harness.analysis.summary import summarize, summary_json
from harness.errors import BenchError

RESULTS = Path(__file__).resolve().parent.parent / "results"
CALIBRATION = Path("calibration") / "latest.json"


def new_run_id(scenario: str) -> str:
    return time.strftime("%Y%m%d-%H%M%S") + f"-{scenario}"


def host() -> dict:
    """The machine a result was measured on, as every result records it."""
    return {
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
    }


def machine() -> dict:
    """The host and its torch build: what an engine run's figures depend on."""
    import torch

    info = {**host(), "torch": torch.__version__, "cuda": torch.version.cuda, "gpu": None}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def write_json(path: Path, data: dict) -> None:
    """Write `data` whole or not at all (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    tmp.replace(path)


def read_json(path: Path) -> dict | None:
    """A result another command writes, or None when absent or unreadable (then the report
    says it has none)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class RunDir:
    """A run directory being written by the runner."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "logs").mkdir(exist_ok=True)
        self._rows: dict[str, list[dict]] = {name: [] for name in schema.TABLES}

    def log_path(self, server: str) -> Path:
        return self.path / "logs" / f"{server}.log"

    def write_manifest(self, manifest: dict) -> None:
        write_json(self.path / "manifest.json", {"schema_version": SCHEMA_VERSION, **manifest})

    def update_manifest(self, **changes) -> None:
        manifest = json.loads((self.path / "manifest.json").read_text())
        write_json(self.path / "manifest.json", manifest | changes)

    def append_slot(
        self, requests: list[RequestRecord], spans: list[SpanRecord], server: ServerRecord
    ) -> None:
        for name, rows in (("requests", requests), ("spans", spans), ("servers", [server])):
            self._rows[name].extend(asdict(r) for r in rows)
            self._write_table(name)

    def _write_table(self, name: str) -> None:
        frame = pd.DataFrame(self._rows[name], columns=schema.columns(name))
        table = pa.Table.from_pandas(frame, preserve_index=False)
        meta = dict(table.schema.metadata or {})
        meta[b"bench.schema_version"] = str(SCHEMA_VERSION).encode()
        table = table.replace_schema_metadata(meta)
        tmp = self.path / f"{name}.parquet.tmp"
        pq.write_table(table, tmp)
        tmp.replace(self.path / f"{name}.parquet")


def load_run(path: Path) -> tuple[dict, dict[str, pd.DataFrame]]:
    """The manifest and the three tables of a run directory (an older version's read as this
    version's: schema.upgrade)."""
    path = Path(path)
    manifest_path = path / "manifest.json"
    if not manifest_path.exists():
        raise BenchError(f"{path} is not a run directory (no manifest.json)")
    manifest = json.loads(manifest_path.read_text())
    version = manifest.get("schema_version")
    if version not in range(1, SCHEMA_VERSION + 1):
        raise BenchError(
            f"{path} has results schema {version}, this bench reads 1 to {SCHEMA_VERSION};"
            " re-run it or use the bench version that wrote it"
        )
    frames = {}
    for name in schema.TABLES:
        file = path / f"{name}.parquet"
        frames[name] = pd.read_parquet(file) if file.exists() else schema.empty(name)
    return manifest, frames if version == SCHEMA_VERSION else schema.upgrade(frames, version)


def summarise(path: Path) -> Comparison:
    """Summarise a run once it has ended: its comparison, written to summary.json."""
    manifest, frames = load_run(path)
    comparison = summarize(manifest, frames)
    write_json(Path(path) / "summary.json", summary_json(manifest, comparison))
    return comparison


def load_summary(path: Path) -> Comparison | None:
    """The comparison summary.json holds; None for a run that was never summarised."""
    data = read_json(Path(path) / "summary.json")
    return None if data is None else Comparison.from_json(data)


def write_calibration(result: dict, directory: Path = RESULTS / "calibration") -> Path:
    """`bench calibrate`'s result as <UTC time>.json and latest.json; the latter's path."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(result["unix_time"]))
    write_json(directory / f"{stamp}.json", result)
    write_json(directory / "latest.json", result)
    return directory / "latest.json"


def write_power(result: dict, directory: Path = RESULTS / "power") -> Path:
    """`bench power`'s result as <scenario>.json, the figures reports quote."""
    path = Path(directory) / f"{result['scenario']}.json"
    write_json(path, result)
    return path


def report_context(results: Path, scenario: str) -> tuple[dict | None, dict | None]:
    """The calibration and the power result a report of `scenario` quotes (None: absent)."""
    return read_json(results / CALIBRATION), read_json(results / "power" / f"{scenario}.json")
