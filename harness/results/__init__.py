"""The results directory: the one package that reads and writes it (docs/RESULTS.md).

`results/<run-id>/`: manifest.json, the tables, summary.json, scenarios/, logs/. run_dir.py
writes a run as it is measured; recorded.py reads it back and summarises it once; files.py
holds the paths, the whole-file writes and the results other commands write for a report to
quote. The rest of the harness imports these names from here."""

from harness.results.files import (
    RESULTS,
    host,
    machine,
    new_run_id,
    new_run_path,
    report_context,
    write_calibration,
    write_power,
)
from harness.results.recorded import load_run, load_runs, load_summary, summarise, tables_left_out
from harness.results.run_dir import RunDir

__all__ = [
    "RESULTS",
    "RunDir",
    "host",
    "load_run",
    "load_runs",
    "load_summary",
    "machine",
    "new_run_id",
    "new_run_path",
    "report_context",
    "summarise",
    "tables_left_out",
    "write_calibration",
    "write_power",
]
