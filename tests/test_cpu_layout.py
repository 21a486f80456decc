"""A CPU run's layout (INVARIANTS 84): the worker, the API server and the load generator each on
the cores cpu_layout declares, the manifest saying so, and the deciding-run estimate."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest

from engine import env
from engine.env import EnvError
from harness.analysis.deciding import deciding_estimate, slot_values
from harness.analysis.schema import RequestRecord, ServerRecord
from harness.analysis.verdict import Rule
from harness.measure.arms import Arm
from harness.measure.cpu_layout import CpuLayout, cpu_layout, pinned
from harness.measure.run_plan import RunPlan
from harness.measure.server import ServerProcess
from harness.scenario import load_scenario
from harness.show.cpu_run import estimate_text, layout_text
from tests.conftest import MACHINE_CORES

TWO_CORES = len(MACHINE_CORES) >= 2


def test_two_cores_put_the_worker_alone_and_the_rest_together():
    assert cpu_layout("cpu", {0, 1}) == CpuLayout(worker=(1,), api=(0,), client=(0,))
    assert cpu_layout("cpu", {4, 5, 6, 7}) == CpuLayout(worker=(6, 7), api=(4,), client=(5,))
    assert cpu_layout("cpu", {3}) is None  # nothing to keep apart
    assert cpu_layout("cuda", {0, 1, 2, 3}) is None  # a GPU run is never pinned


def test_the_worker_cores_variable_is_typed_and_checked(monkeypatch):
    monkeypatch.setenv(env.WORKER_CPUS.name, "0")
    assert env.worker_cpus() == {0}
    for bad in ("one", "0;1", str(os.cpu_count() + 5)):
        monkeypatch.setenv(env.WORKER_CPUS.name, bad)
        with pytest.raises(EnvError, match=env.WORKER_CPUS.name):
            env.worker_cpus()
    monkeypatch.delenv(env.WORKER_CPUS.name)
    assert env.worker_cpus() is None


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
        except (OSError, ValueError):
            continue
    return found


@pytest.mark.skipif(not TWO_CORES, reason="a layout needs two cores")
@pytest.mark.fresh_worker  # the worker as bench run starts it: the API server's child
def test_a_laid_out_server_runs_its_api_and_worker_on_their_cores(machine_cores):
    layout = cpu_layout("cpu")
    server = ServerProcess(
        "qwen35",
        size="tiny",
        env=layout.worker_environment(),
        cpus=layout.api,
        overrides="engine.warmup=false",
    )
    with server:
        workers = _children(server.proc.pid)
        assert len(workers) == 1, workers
        assert os.sched_getaffinity(server.proc.pid) == set(layout.api)
        assert os.sched_getaffinity(workers[0]) == set(layout.worker)
    with pinned(layout.client):  # the load generator's, for a slot's load
        assert os.sched_getaffinity(0) == set(layout.client)
    assert os.sched_getaffinity(0) != set(layout.client) or len(layout.client) > 1


def test_the_manifest_records_the_layout_and_a_url_arm_has_none(machine_cores):
    tiny_scenario = load_scenario("qwen35", "tiny")
    arms = {"A": Arm("A", "a", "worktree", "worktree"), "B": Arm("B", "b", "worktree", "worktree")}
    plan = RunPlan(tiny_scenario, arms, list("ABBA"), 4, 4, [], 0, 50)
    expected = cpu_layout("cpu")
    manifest = plan.manifest("r", "bench run", 0, [])
    assert manifest["cpu_layout"] == (expected.manifest() if expected else None)
    url = {
        "A": arms["A"],
        "B": Arm("B", "u", "url", "http://127.0.0.1:1", url="http://127.0.0.1:1"),
    }
    assert RunPlan(tiny_scenario, url, list("ABBA"), 4, 4, [], 0, 50).cpu_layout is None


def _values(tok_s: list[float], letters: str = "ABBA") -> pd.DataFrame:
    return pd.DataFrame({"letter": list(letters), "block": 0, "value": tok_s})


def test_a_quiet_block_decides_at_two_blocks_and_a_noisy_one_asks_for_many():
    quiet = deciding_estimate(_values([1000, 1005, 995, 1002]), 60.0)
    assert quiet.servers == 4 and quiet.spread == pytest.approx(0.01, abs=0.002)
    assert quiet.blocks == 2 and quiet.seconds == 120.0
    noisy = deciding_estimate(_values([1132, 945, 1163, 1055]), 60.0)  # issue 41's A/A block
    assert noisy.spread > 0.15 and noisy.blocks > 12
    assert "out of reach" in estimate_text(noisy, Rule())
    wild = deciding_estimate(_values([1072, 1313, 1251, 1704]), 60.0)  # a neighbour came and went
    assert wild.blocks == 1000 and "take at least 1000 blocks" in estimate_text(wild, Rule())
    text = estimate_text(quiet, Rule())
    assert "about 2 blocks here (~2.0 min at 60 s a block)" in text and "1.0%" in text
    assert deciding_estimate(_values([1000, 1000], "AA"), 60.0) is None  # one arm: no residual


def test_slot_values_read_each_servers_steady_tok_per_s():
    def server(letter):
        fields = dict(arm=letter, letter=letter, server=f"{letter}0", block=0, slot=0)
        return ServerRecord(**fields, port=0, log="", t0_unix=0.0, start_unix=0.0), fields

    record, fields = server("A")
    record.steady_start_s, record.steady_end_s = 0.0, 2.0
    tokens = [0.1 * i for i in range(1, 21)]  # 20 tokens inside 2 s: 10 tok/s
    request = RequestRecord(
        **fields, index=0, warmup=False, prompt_tokens=4, max_tokens=20, intended_send_s=0.0,
        send_s=0.0, first_token_s=0.1, end_s=2.0, output_tokens=20, token_times_s=tokens,
        status=200,
    )  # fmt: skip
    values = slot_values([(record, [request])])
    assert values.to_dict("records") == [{"letter": "A", "block": 0, "value": 10.0}]
    assert "worker on core 1, API server on core 0" in layout_text(
        cpu_layout("cpu", {0, 1}).manifest()
    )
