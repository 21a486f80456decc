"""A run directory as the runner writes it (`RunDir`): the manifest, the scenario files and
each slot's rows, appended when the slot ends (the tables rewritten whole, atomically), and a
run moved to a fresh directory when a write fails rather than lost.
"""

from __future__ import annotations

import shutil
import tempfile
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
from harness.analysis.summary import Summary
from harness.errors import BenchError
from harness.results.files import write_json, write_text
from harness.results.recorded import load_run, summarise, tables_left_out


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
