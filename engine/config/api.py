"""The API server's guards (engine/api/serving.py, connections.py, worker_client.py;
docs/ENGINE.md, docs/RELIABILITY.md faults 15 and 16)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.config.checks import check_at_least_one, check_seconds, setting


@dataclass(frozen=True)
class ApiConfig:
    # Past its longest step so far: every open stream ends with an error, the server kills
    # the worker and exits 1.
    stall_timeout_s: float = setting(10.0, "a worker silent this long is stalled")
    idle_timeout_s: float = setting(
        15.0, "a connection with no whole request head this long is closed"
    )
    body_timeout_s: float = setting(30.0, "a body not all there this long after its head: 408")
    # Lowered to what the file limit allows.
    max_connections: int = setting(4096, "connections over this cap are answered 503")

    def __post_init__(self) -> None:
        check_at_least_one(self, "max_connections")
        check_seconds(self, "stall_timeout_s", "idle_timeout_s", "body_timeout_s")
