"""The results directory of one run: written as the run goes, read back for analysis.

`results/<run-id>/`: manifest.json, requests.parquet, spans.parquet, servers.parquet,
summary.json, logs/. Each slot's rows are appended when the slot ends (the tables are
rewritten whole, atomically), so an interrupted run keeps what it measured. Layout and
columns: docs/RESULTS.md.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, fields
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from harness.errors import BenchError
from harness.records import SCHEMA_VERSION, RequestRecord, ServerRecord, SpanRecord

TABLES = {"requests": RequestRecord, "spans": SpanRecord, "servers": ServerRecord}


def new_run_id(scenario: str) -> str:
    return time.strftime("%Y%m%d-%H%M%S") + f"-{scenario}"


def machine() -> dict:
    import torch

    info = {
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": None,
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    tmp.replace(path)


class RunDir:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "logs").mkdir(exist_ok=True)
        self._rows: dict[str, list[dict]] = {name: [] for name in TABLES}

    def log_path(self, server: str) -> Path:
        return self.path / "logs" / f"{server}.log"

    def write_manifest(self, manifest: dict) -> None:
        _write_json(self.path / "manifest.json", {"schema_version": SCHEMA_VERSION, **manifest})

    def update_manifest(self, **changes) -> None:
        manifest = json.loads((self.path / "manifest.json").read_text())
        manifest.update(changes)
        _write_json(self.path / "manifest.json", manifest)

    def append_slot(
        self, requests: list[RequestRecord], spans: list[SpanRecord], server: ServerRecord
    ) -> None:
        for name, rows in (("requests", requests), ("spans", spans), ("servers", [server])):
            self._rows[name].extend(asdict(r) for r in rows)
            self._write_table(name)

    def _write_table(self, name: str) -> None:
        frame = pd.DataFrame(self._rows[name], columns=[f.name for f in fields(TABLES[name])])
        table = pa.Table.from_pandas(frame, preserve_index=False)
        meta = dict(table.schema.metadata or {})
        meta[b"bench.schema_version"] = str(SCHEMA_VERSION).encode()
        table = table.replace_schema_metadata(meta)
        tmp = self.path / f"{name}.parquet.tmp"
        pq.write_table(table, tmp)
        tmp.replace(self.path / f"{name}.parquet")

    def write_summary(self, summary: dict) -> None:
        _write_json(self.path / "summary.json", summary)


def load_run(path: Path) -> tuple[dict, dict[str, pd.DataFrame]]:
    """The manifest and the three tables of a run directory."""
    path = Path(path)
    manifest_path = path / "manifest.json"
    if not manifest_path.exists():
        raise BenchError(f"{path} is not a run directory (no manifest.json)")
    manifest = json.loads(manifest_path.read_text())
    version = manifest.get("schema_version")
    if version != SCHEMA_VERSION:
        raise BenchError(
            f"{path} has results schema {version}, this bench reads {SCHEMA_VERSION}; "
            "re-run it or use the bench version that wrote it"
        )
    frames = {}
    for name, record in TABLES.items():
        file = path / f"{name}.parquet"
        columns = [f.name for f in fields(record)]
        frames[name] = pd.read_parquet(file) if file.exists() else pd.DataFrame(columns=columns)
    return manifest, frames
