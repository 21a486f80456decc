"""The decode step's budget by kernel class (benchmarks/bench_step_budget.py): names fall in
their class, the bytes a class must move come from the engine's own tensors, and the table's
arithmetic holds on made-up kernels; the whole benchmark runs on the CPU's ops."""

from __future__ import annotations

import pytest

from benchmarks import bench_step_budget as sb


@pytest.mark.parametrize(
    "name, label",
    [
        ("sm90_xmma_gemm_bf16bf16_bf16f32", "gemm"),
        ("nvjet_tst_64x8_64x16_4x1_v_bz_TNN", "gemm"),
        ("aten::mm", "gemm"),
        ("_recurrent_decode_kernel", "gdn"),
        ("BatchDecodeWithPagedKVCacheKernel", "attention"),
        ("_causal_conv1d_update", "conv"),
        ("_rmsnorm_gated_kernel", "norm"),
        ("_argmax_rows", "sampler"),
        ("elementwise_kernel<128, 4>", "other"),
    ],
)
def test_each_kernel_name_falls_in_its_class(name, label):
    assert sb.classify(name) == label


def test_the_table_sums_each_class_and_divides_by_steps():
    kernels = [("aten::mm", 30.0)] * 4 + [("_recurrent_decode", 50.0)] * 2 + [("copy", 20.0)]
    rows = {r.name: r for r in sb.budget(kernels, 2, {"gemm": 4_800_000, "gdn": 0}, 4800.0)}
    assert rows["gemm"].us == 60.0 and rows["gemm"].launches == 2
    assert rows["gemm"].floor_us == pytest.approx(1.0)  # 4.8 MB at 4,800 GB/s
    assert rows["gemm"].gbs == pytest.approx(80.0)  # 4.8 MB in 60 us
    assert rows["gdn"].us == 50.0 and rows["gdn"].floor_us is None  # no bytes: no floor
    assert rows["other"].bytes is None and rows["other"].top == [("copy", 10.0)]
    assert sum(r.share for r in rows.values()) == pytest.approx(1.0)
    assert [r.name for r in sb.budget(kernels, 2, {}, 4800.0)] == ["gemm", "gdn", "other"]


def test_the_whole_benchmark_runs_on_the_cpu_and_counts_the_engines_bytes(tmp_path, capsys):
    out = tmp_path / "budget.md"
    sb.main(["--size", "tiny", "--batch", "4", "--context", "16", "--steps", "2",
             "--markdown", str(out), "--json", str(tmp_path / "b.json")])  # fmt: skip
    text = out.read_text()
    assert "eager, host ops" in text and "| gemm |" in text
    from benchmarks.bench_gpu_step import build
    from harness.scenario import load_scenario

    engine = build(load_scenario("qwen35", "tiny"), 4, 16, 4, "auto", graphs=False)
    moved = sb.traffic(engine, 4, 16)
    cfg = engine.model.config
    # the recurrent state: each row's heads x k x v fp32, read and written, in every linear layer
    linear = sum(1 for t in engine.cache.ssm_state)
    per_row = cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim
    assert moved["gdn"] == 2 * 4 * linear * per_row * 4
    assert (
        moved["attention"]
        == 4 * 16 * len(engine.cache.k) * 2 * cfg.num_key_value_heads * (cfg.head_dim) * 4
    )  # fp32 K and V of every full-attention layer
    assert moved["gemm"] > cfg.vocab_size * cfg.hidden_size * 4  # the LM head at least
