"""Which Ray cluster `--cluster` names, joined once per process, and what a unit of work claims
on it: one GPU where the cluster has GPUs, else one CPU."""

from __future__ import annotations

import os
from dataclasses import dataclass

from harness.errors import BenchError

AUTO = "auto"  # a local Ray started on the spot with this machine's CPUs (and GPUs)
INSTALL = "pip install -e '.[cluster]'"


def ray_module():
    """Ray, or a BenchError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise BenchError(f"--cluster needs Ray, which is not installed: {INSTALL}") from None
    return ray


@dataclass(frozen=True)
class Cluster:
    """A joined cluster: its address as given, and the resources each unit of work claims."""

    address: str
    gpus: int  # GPUs in the cluster when joined (0: a CPU cluster)
    cpus: int

    @property
    def claim(self) -> dict[str, float]:
        """A unit's resources: one GPU (the server's) on a GPU cluster, else one CPU."""
        return {"num_gpus": 1, "num_cpus": 1} if self.gpus else {"num_cpus": 1}

    @property
    def slots(self) -> int:
        """How many units run at once."""
        return self.gpus or self.cpus

    def manifest(self) -> dict:
        return {"address": self.address, "gpus": self.gpus, "cpus": self.cpus}


def check_address(address: str) -> str:
    """--cluster's value: `auto`, `ray://HOST:PORT` (Ray Client) or `HOST:PORT` (a cluster this
    machine is a node of); refused in one line before anything starts."""
    address = address.strip()
    if address == AUTO:
        return address
    bare = address.removeprefix("ray://")
    host, _, port = bare.rpartition(":")
    if not host or not port.isdigit():
        raise BenchError(
            f"--cluster {address!r}: give 'auto' (a local Ray), ray://HOST:PORT or HOST:PORT"
        )
    return address


def connect(address: str) -> Cluster:
    """Join the cluster at `address` (`check_address`), or start a local one for `auto`; a Ray
    already joined in this process is used as it is (the tests start one with 2 CPUs)."""
    address = check_address(address)
    ray = ray_module()
    if not ray.is_initialized():
        kwargs = {"include_dashboard": False, "log_to_driver": False}
        if address == AUTO:
            kwargs["num_cpus"] = os.cpu_count() or 1
        else:
            kwargs["address"] = address
        try:
            ray.init(**kwargs)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            said = " ".join(str(exc).split())[:160]
            raise BenchError(f"cannot join the Ray cluster at {address}: {said}") from None
    resources = ray.cluster_resources()
    return Cluster(address, int(resources.get("GPU", 0)), int(resources.get("CPU", 0)))
