"""Live progress of a run on the terminal; silent when stderr is not a terminal.

It shows what the runner reports for each slot (harness/measure/slot.py, SlotStatus):
which slot and arm, its phase, and during the load the requests done and in flight, tok/s
and failures.
"""

from __future__ import annotations

from typing import Protocol

from rich.console import Console
from rich.live import Live
from rich.text import Text


class LoadProgress(Protocol):
    done: int
    failed: int
    tokens: int
    elapsed_s: float
    in_flight: int


class SlotProgress(Protocol):
    slot: int
    slots: int
    letter: str
    arm: str
    phase: str  # "starting" | "load" | "stopping"
    progress: LoadProgress | None


class RunProgress:
    def __init__(self, console: Console, slots: int, requests_per_slot: int):
        self.console = console
        self.slots = slots
        self.per_slot = requests_per_slot
        self._live = Live(console=console, refresh_per_second=4, transient=True)
        self._enabled = console.is_terminal

    def __enter__(self) -> RunProgress:
        if self._enabled:
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._enabled:
            self._live.__exit__(*exc)

    def show(self, status: SlotProgress) -> None:
        if not self._enabled:
            return
        line = Text(
            f"slot {status.slot + 1}/{status.slots}  arm {status.letter} "
            f"({status.arm})  {status.phase}"
        )
        p = status.progress
        if p is not None and status.phase == "load":
            rate = p.tokens / p.elapsed_s if p.elapsed_s > 0 else 0.0
            line.append(
                f"  requests {p.done}/{self.per_slot}  in flight {p.in_flight}"
                f"  {rate:,.0f} tok/s  failed {p.failed}"
            )
            if p.failed:
                line.stylize("yellow")
        self._live.update(line)
