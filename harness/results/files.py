"""Where results live and how a file in them is written: the results directory, a new run's
path, the machine a result was measured on, whole-file writes (a reader never sees half a
file), and the results other commands write for a report to quote: calibration/latest.json
(`bench calibrate`) and power/<scenario>.json (`bench power`).
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

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
