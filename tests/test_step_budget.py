"""The decode step's budget by kernel class (benchmarks/bench_step_budget.py): names fall in
their class, the bytes a class must move come from the engine's own tensors, and the table's
arithmetic holds on made-up kernels; the whole benchmark runs on the CPU's ops."""

from __future__ import annotations

import json

import pytest
import torch

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
        ("_conv_decode_kernel", "conv"),  # not attention's `decode_kernel`
        ("_decode_kernel", "attention"),
        ("_skinny_gemm_kernel", "gemm"),
        ("_split_sum_kernel", "gemm"),  # our GEMM's K-split sum
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


def test_a_conv_fused_into_the_gemm_moves_its_bytes_to_the_gemms_row():
    """engine.dense_epilogues runs a decode step's conv in the in-projection's GEMM: with no
    conv kernel, the conv's bytes are the GEMM's to move (its floor grows by them); with
    one, the conv keeps its own row."""
    moved = {"gemm": 4_800_000, "conv": 480_000}
    fused = {r.name: r for r in sb.budget([("nvjet_gemm", 2.0)], 1, moved, 4800.0)}
    assert set(fused) == {"gemm"} and fused["gemm"].bytes == 5_280_000
    assert fused["gemm"].floor_us == 1.1
    kernels = [("nvjet_gemm", 2.0), ("_conv_decode_kernel", 1.0)]
    apart = {r.name: r for r in sb.budget(kernels, 1, moved, 4800.0)}
    assert apart["gemm"].bytes == 4_800_000 and apart["conv"].bytes == 480_000


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


@pytest.mark.parametrize(
    "name, label",
    [
        ("aten::conv_transpose1d", "upsample"),
        ("void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>", "upsample"),
        ("_snake_kernel", "snake"),
        ("aten::sin", "snake"),
        ("sm90_xmma_fprop_implicit_gemm_bf16bf16", "conv"),
        ("_folded_unit_kernel", "conv"),
        ("Memcpy DtoH (Device -> Pinned)", "copy"),
        ("aten::mul", "other"),
    ],
)
def test_each_codec_kernel_name_falls_in_its_class(name, label):
    assert sb.classify(name, sb.CODEC_CLASSES) == label


def test_orpheus_with_the_codec_writes_both_tables_and_the_codecs_weights(tmp_path):
    """--codec-windows: the LLM step's table and the codec's step's, both in the markdown and
    the JSON; the codec's bytes are its weights, the transposed convolutions apart."""
    out, rows = tmp_path / "budget.md", tmp_path / "b.json"
    sb.main(["--scenario", "orpheus", "--size", "tiny", "--batch", "2", "--context", "16",
             "--steps", "2", "--codec-windows", "3", "--markdown", str(out),
             "--json", str(rows)])  # fmt: skip
    text = out.read_text()
    assert "decode step, batch 2" in text and "codec step, 3 windows, kernels torch" in text
    tables = json.loads(rows.read_text())
    assert set(tables) == {"step", "codec"}
    codec = {r["name"]: r for r in tables["codec"]}
    assert codec["conv"]["us"] > 0 and sum(r["share"] for r in codec.values()) == pytest.approx(1)
    from engine.models import build_streams

    ((network, _),) = build_streams("orpheus", "tiny", 0, "float32", "cpu")
    moved = sb.codec_traffic(network)
    upsampling = [m for m in network.modules() if isinstance(m, torch.nn.ConvTranspose1d)]
    assert upsampling and moved["upsample"] == sum(
        p.numel() * 4 for m in upsampling for p in m.parameters()
    )
    total = sum(p.numel() * 4 for p in network.parameters())
    assert moved["upsample"] + moved["conv"] == total
    assert codec["conv"]["bytes"] == moved["conv"]


def test_codec_windows_is_orpheus_only():
    with pytest.raises(SystemExit):
        sb.main(["--size", "tiny", "--codec-windows", "4"])


def test_the_floors_take_the_named_gpus_bandwidth():
    """The H100's table read "x floor" at the H200's 4,800 GB/s (2026-12-07): the default is now
    the device's own."""
    assert sb.peak_gbs_of("NVIDIA H100 80GB HBM3") == 3350.0
    assert sb.peak_gbs_of("NVIDIA H200") == 4800.0
    assert sb.peak_gbs_of(None) == sb.peak_gbs_of("NVIDIA A10G") == sb.PEAK_GBS
