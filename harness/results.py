"""The results directory of one run: the one module that reads and writes it (docs/RESULTS.md).

`results/<run-id>/`: manifest.json, requests.parquet, spans.parquet, servers.parquet,
summary.json, scenarios/, logs/. The runner appends each slot's rows when the slot ends (the
tables are rewritten whole, atomically), so an interrupted run keeps what it measured, and a
write that fails moves the run to a fresh directory rather than losing it (`RunDir`).
`summarise` writes summary.json once, when the run ends; the report reads it back. The
results other commands write for the report to quote live beside the runs:
calibration/latest.json (`bench calibrate`) and power/<scenario>.json (`bench power`).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from harness.analysis import schema
from harness.analysis.schema import (
    SCHEMA_VERSION,
    MetricRecord,
    RequestRecord,
    ServerRecord,
    SpanRecord,
)
from harness.analysis.summary import Summary, from_summary_json, summarize, summary_json
from harness.errors import BenchError

RESULTS = Path("results")  # under the current directory, wherever bench is installed
CALIBRATION = Path("calibration") / "latest.json"


def new_run_id(scenario: str) -> str:
    return time.strftime("%Y%m%d-%H%M%S") + f"-{scenario}"


def new_run_path(scenario: str, results: Path = RESULTS) -> Path:
    """results/<run-id>, with -2, -3, ... added when a run started in the same second."""
    run_id = new_run_id(scenario)
    path, n = results / run_id, 2
    while path.exists():
        path, n = results / f"{run_id}-{n}", n + 1
    return path


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


def write_text(path: Path, text: str) -> None:
    """Write `text` whole or not at all (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def write_json(path: Path, data: dict) -> None:
    write_text(path, json.dumps(data, indent=2, default=str) + "\n")


def read_json(path: Path) -> dict | None:
    """A result another command writes, or None when absent or unreadable (then the report
    says it has none)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class RunDir:
    """A run directory being written by the runner; its manifest, scenario files and rows are
    held in memory too.

    Every write goes through `_writing`. A write that fails once something was measured (a
    full disk, a directory made read-only) moves the run to a fresh directory under the temp
    directory, writes everything measured so far there from memory, and raises a BenchError
    saying so; later writes go there too. Tables are replaced atomically, so the first
    directory keeps every slot it took before the failure, and its manifest still describes
    them."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.manifest: dict = {}
        self.moved_from: Path | None = None
        self._rows: dict[str, list[dict]] = {name: [] for name in schema.TABLES}
        self._recorded: dict[str, pd.DataFrame] = {}  # a continued run's tables as it found them
        self._scenarios: dict[str, dict] = {}
        with self._writing(self.path):
            (self.path / "logs").mkdir(parents=True, exist_ok=True)

    @classmethod
    def fresh(cls, path: Path, overwrite: bool = False) -> RunDir:
        """A run directory at `path` that mixes with no other run: an empty or new directory,
        or, with `overwrite`, one holding a run (removed first). A directory holding anything
        else is never touched."""
        path = Path(path)
        try:
            taken = path.exists() and (not path.is_dir() or any(path.iterdir()))
        except OSError as exc:
            raise BenchError(f"cannot read {path} ({exc.strerror})") from None
        if taken and not (path / "manifest.json").is_file():
            raise BenchError(f"{path} is not empty and holds no run; give an empty or new one")
        if taken and not overwrite:
            raise BenchError(
                f"{path} already holds a run; give --overwrite to replace it, or another --out"
            )
        if taken:
            try:
                shutil.rmtree(path)
            except OSError as exc:
                raise BenchError(f"cannot remove the run in {path} ({exc.strerror})") from None
        return cls(path)

    @classmethod
    def continued(cls, path: Path) -> RunDir:
        """The run in `path`, to add blocks to (`bench run --continue`): its manifest and tables
        as recorded (an older schema's read as this one's), nothing written yet. Each table is
        written back whole, the recorded rows first, when the next slot ends."""
        manifest, frames = load_run(path)
        if frames["servers"].empty:
            raise BenchError(
                tables_left_out(path, "cannot be continued")
                or f"{path} has no servers (0 blocks): nothing to continue; rerun it"
            )
        rundir = cls(path)
        rundir.manifest, rundir._recorded = manifest, frames
        return rundir

    @property
    def next_block(self) -> int:
        """The block after the recorded ones (0 for a fresh run): a continued run's first."""
        servers = self._recorded.get("servers")
        return 0 if servers is None or servers.empty else int(servers["block"].max()) + 1

    def log_path(self, server: str) -> Path:
        """The server's log, made now (empty), so a directory that cannot take it fails here."""
        path = self.path / "logs" / f"{server}.log"
        with self._writing(path):
            path.touch()
        return path

    def scenario_path(self, letter: str) -> Path:
        return self.path / "scenarios" / f"{letter}.yaml"

    def write_scenario(self, letter: str, source: dict) -> Path:
        """The scenario file arm `letter`'s servers run (engine.config.scenario_source)."""
        self._scenarios[letter] = source
        with self._writing(self.scenario_path(letter)):
            self._save_scenario(letter)
        return self.scenario_path(letter)

    def write_manifest(self, manifest: dict) -> None:
        self.manifest = {"schema_version": SCHEMA_VERSION, **manifest}
        with self._writing(self.path / "manifest.json"):
            self._save_manifest()

    def update_manifest(self, **changes) -> None:
        self.manifest |= changes
        with self._writing(self.path / "manifest.json"):
            self._save_manifest()

    def append_slot(
        self,
        requests: list[RequestRecord],
        spans: list[SpanRecord],
        server: ServerRecord,
        failed: str | None = None,
        metrics: list[MetricRecord] = (),
    ) -> None:
        """A slot's rows, written at once. A slot that failed (`failed` says how) is named in
        the manifest's `failed_servers` before its rows are written, so they are never read
        without it: analysis leaves it out of the comparison."""
        tables = (("requests", requests), ("spans", spans), ("servers", [server]))
        for name, rows in (*tables, ("metrics", metrics)):
            self._rows[name].extend(asdict(r) for r in rows)
        if failed is not None:
            self.update_manifest(
                failed_servers=self.manifest.get("failed_servers", {}) | {server.server: failed}
            )
        for name in schema.TABLES:
            with self._writing(self.path / f"{name}.parquet"):
                self._save_table(name)

    def summarise(self) -> Summary:
        """`summarise` of this run (summary.json), through the same guard as every write."""
        with self._writing(self.path / "summary.json"):
            return summarise(self.path)

    def _save_manifest(self) -> None:
        write_json(self.path / "manifest.json", self.manifest)

    def _save_scenario(self, letter: str) -> None:
        write_text(
            self.scenario_path(letter), yaml.safe_dump(self._scenarios[letter], sort_keys=False)
        )

    def _save_table(self, name: str) -> None:
        frame = pd.DataFrame(self._rows[name], columns=schema.columns(name))
        recorded = self._recorded.get(name)
        if recorded is not None and not recorded.empty:
            frame = pd.concat([recorded, frame], ignore_index=True) if len(frame) else recorded
        table = pa.Table.from_pandas(frame, preserve_index=False)
        meta = dict(table.schema.metadata or {})
        meta[b"bench.schema_version"] = str(SCHEMA_VERSION).encode()
        table = table.replace_schema_metadata(meta)
        tmp = self.path / f"{name}.parquet.tmp"
        pq.write_table(table, tmp, write_page_checksum=True)  # a flipped bit fails the read
        tmp.replace(self.path / f"{name}.parquet")

    @contextmanager
    def _writing(self, target: Path) -> Iterator[None]:
        try:
            yield
        except OSError as exc:
            raise self._move_after(target, exc) from None

    def _move_after(self, target: Path, exc: OSError) -> BenchError:
        """The error to raise for a failed write, the run moved first when it holds a slot."""
        problem = f"cannot write {target} ({exc.strerror or exc})"
        if self.moved_from is not None or not self._rows["servers"]:
            return BenchError(problem)  # nothing measured yet, or the new place fails too
        self.moved_from = self.path
        self.manifest |= {"error": problem, "moved_from": str(self.moved_from)}
        try:
            self.path = Path(tempfile.mkdtemp(prefix="bench-run-"))
            (self.path / "logs").mkdir()
            self._save_manifest()
            for letter in self._scenarios:
                self._save_scenario(letter)
            for name in schema.TABLES:
                self._save_table(name)
            for log in (self.moved_from / "logs").glob("*.log"):
                shutil.copyfile(log, self.path / "logs" / log.name)
        except OSError as again:
            return BenchError(f"{problem}, nor could the run be moved ({again.strerror or again})")
        try:  # the first directory says where the run went, if it still takes a small file
            write_json(
                self.moved_from / "manifest.json", self.manifest | {"moved_to": str(self.path)}
            )
        except OSError:
            pass  # it does not: the error names the new place, and its manifest is as it was
        return BenchError(f"{problem}; everything measured so far was written to {self.path}")


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
