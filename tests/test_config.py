"""Scenarios: sizes by machine, typed overrides, clear errors."""

from __future__ import annotations

import pytest

from engine.config import ConfigError, parse_overrides
from harness.scenario import load_scenario
from tests.fresh_python import fresh_python


def test_default_size_follows_the_machine():
    s = load_scenario("qwen35")
    assert s.size == "tiny" and s.size_reason == "no CUDA on this machine"
    assert s.engine.device == "cpu" and s.load.output_tokens == (16, 48)
    big = load_scenario("qwen35", "0.8b")
    assert big.model.preset == "0.8b" and big.engine.dtype == "bfloat16"
    assert big.load.output_tokens == (256, 512)  # the reference engine's qwen35 runs


def test_overrides_are_typed():
    s = load_scenario("qwen35", "tiny", parse_overrides("engine.mixing=true,engine.max_rows=32"))
    assert s.engine.mixing is True and s.engine.max_rows == 32
    s = load_scenario(
        "qwen35", "tiny", parse_overrides("model.eos_token_ids=[5, 6],engine.mixing=true")
    )
    assert s.model.eos_token_ids == [5, 6] and s.engine.mixing is True
    s = load_scenario("orpheus", "tiny", parse_overrides("engine.codec_graphs=false"))
    assert s.engine.codec_graphs is False and s.to_dict()["engine"]["codec_graphs"] is False
    assert load_scenario("orpheus", "3b").engine.codec_graphs is True  # the default
    s = load_scenario("orpheus", "tiny", parse_overrides("engine.codec_overlap=true"))
    assert s.engine.codec_overlap is True and s.to_dict()["engine"]["codec_overlap"] is True
    assert load_scenario("orpheus", "3b").engine.codec_overlap is False  # until measured
    text = "engine.gdn_split=states_bv=32,outputs_bv=64,engine.mixing=true"
    s = load_scenario("qwen35", "tiny", parse_overrides(text))  # a split config's commas
    assert (s.engine.gdn_split, s.engine.mixing) == ("states_bv=32,outputs_bv=64", True)
    served = load_scenario("qwen35", "0.8b").engine  # ours up to 64 rows (docs/evidence/dense)
    assert (served.dense_kernel, served.dense_rows, served.dense_epilogues) == ("triton", 64, True)
    assert load_scenario("qwen35", "0.8b").engine.gdn_decode == "grid"  # until measured
    s = load_scenario("qwen35", "0.8b", parse_overrides("engine.gdn_decode=pipelined"))
    assert s.to_dict()["engine"]["gdn_decode"] == "pipelined"  # an arm's manifest
    s = load_scenario("qwen35", "tiny", parse_overrides("engine.dense_kernel=triton"))
    assert s.engine.dense_kernel == "triton" and s.to_dict()["engine"]["dense_kernel"] == "triton"
    s = load_scenario("orpheus", "tiny", parse_overrides("engine.dense_kernel=head"))
    assert s.engine.dense_kernel == "head"
    assert load_scenario("orpheus", "3b").engine.decode_attention == "triton"  # the default
    s = load_scenario("orpheus", "3b", parse_overrides("engine.decode_attention=flashinfer"))
    assert s.engine.decode_attention == "flashinfer"
    assert load_scenario("qwen35", "0.8b").to_dict()["engine"]["decode_attention"] == "triton"
    s = load_scenario("qwen35", "0.8b", parse_overrides("engine.decode_attention=flashinfer"))
    assert s.to_dict()["engine"]["decode_attention"] == "flashinfer"  # a run's manifest
    big = load_scenario("qwen35", "0.8b").engine  # 0.8b's defaults, an arm turns them off
    assert big.prefill_stream and big.piecewise_gdn
    text = "engine.prefill_stream=false,engine.piecewise_gdn=false"
    off = load_scenario("qwen35", "0.8b", parse_overrides(text)).to_dict()["engine"]
    assert (off["prefill_stream"], off["piecewise_gdn"]) == (False, False)
    text = "engine.piecewise_graphs=false,engine.piecewise_gdn=false"  # the piecewise arm
    off = load_scenario("qwen35", "0.8b", parse_overrides(text)).to_dict()["engine"]
    assert (off["piecewise_graphs"], off["piecewise_gdn"]) == (False, False)
    with pytest.raises(ConfigError, match="set engine.prefill_stream=false with them"):
        load_scenario("qwen35", "0.8b", parse_overrides("engine.mixing=true"))
    s = load_scenario(
        "qwen35", "0.8b", parse_overrides("engine.mixing=true,engine.prefill_stream=false")
    )
    assert s.engine.mixing and not s.engine.prefill_stream


@pytest.mark.parametrize("name,size,overrides,message", [
    ("nosuch", None, "", "unknown scenario 'nosuch'; known scenarios: orpheus, qwen35"),
    ("qwen35", "huge", "", "has no size 'huge'"),
    ("qwen35", "tiny", "engine.mixing=maybe", "engine.mixing must be true or false"),
    ("orpheus", "tiny", "engine.codec_graphs=1", "engine.codec_graphs must be true or false"),
    ("orpheus", "tiny", "engine.codec_overlap=2", "engine.codec_overlap must be true or false"),
    ("qwen35", "tiny", "engine.max_rows=-1", "must not be negative"),
    ("qwen35", "tiny", "engine.max_rows=1.5", "must be an integer"),
    ("qwen35", "tiny", "engine.prefill_hold_steps=-2", "prefill_hold_steps must not be negative"),
    ("qwen35", "tiny", "engine.nosuch=1", "unknown setting engine.nosuch"),
    ("qwen35", "tiny", "load.prompt_tokens=[5,2]", "1 <= low <= high"),
    ("qwen35", "tiny", "mixing=true", "must be model.X, engine.X or load.X"),
    ("qwen35", "tiny", "engine.mixing", "is not key=value"),
    ("qwen35", "tiny", "engine.gdn_split=states_bv=12", "engine.gdn_split: states_bv must be"),
    ("qwen35", "tiny", "engine.gdn_split=chunk=32,warps=8", "unknown split config field 'warps'"),
    ("qwen35", "tiny", "engine.dense_kernel=cublas",
     "engine.dense_kernel must be one of torch, triton, head, got 'cublas'"),
    ("qwen35", "tiny", "engine.dense_rows=129", "engine.dense_rows must be 1 to 128, got 129"),
    ("qwen35", "0.8b", "engine.piecewise_graphs=false",
     "set engine.piecewise_gdn=false with engine.piecewise_graphs=false"),
    ("qwen35", "0.8b", "engine.gdn_decode=persistent",
     "engine.gdn_decode must be one of grid, pipelined, got 'persistent'"),
    ("qwen35", "0.8b", "engine.decode_attention=fa3",
     "engine.decode_attention must be one of flashinfer, triton, got 'fa3'"),
    ("qwen35", "tiny", "engine.device=tpu", "engine.device must be one of cpu, cuda, got 'tpu'"),
    ("qwen35", "tiny", "engine.dtype=int8",
     "engine.dtype must be one of float32, bfloat16, float16, got 'int8'"),
    ("qwen35", "tiny", "engine.cpu_threads=0", "engine.cpu_threads must be at least 1, got 0"),
    ("orpheus", "tiny", "engine.decode_attention=true",
     "engine.decode_attention must be a string, got True"),
])  # fmt: skip
def test_bad_scenarios_and_overrides_are_clear_errors(name, size, overrides, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")):
        load_scenario(name, size, parse_overrides(overrides))


def test_the_api_server_reads_a_scenario_without_importing_torch():
    """The API server process (and `bench`) read scenarios; torch's import (over a second on
    2 cores) is the worker's alone. engine.config parses engine.gdn_split itself
    (engine/config/gdn_split.py), and the kernels' modules it shares are plain Python."""
    code = (
        "import sys; from engine.config import load_served; import engine.serve; "
        "from harness.scenario import load_scenario; import engine.kernels.gdn_tables; "
        "load_served('qwen35', 'tiny'); load_scenario('orpheus', 'tiny'); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    )
    assert fresh_python(code) == "[]"
