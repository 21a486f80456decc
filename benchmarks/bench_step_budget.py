"""The decode step's time budget by kernel class: what each class of kernel costs a step, the
bytes it must move, and the bandwidth that makes against the GPU's peak.

    python -m benchmarks.bench_step_budget --batch 64 --context 512 --markdown budget.md
    python -m benchmarks.bench_step_budget --size tiny --batch 8 --context 64   # a CPU: ops
    python -m benchmarks.bench_step_budget --scenario orpheus --batch 64 --codec-windows 64

On CUDA with graphs, `--replays` replays of the staged decode graph run under the torch
profiler and each device kernel's time is summed; elsewhere eager steps run and each op's
self time on the host is summed instead (the same table, a CPU's figures). Each kernel falls
into one class by its name (`CLASSES`, first match; "other" lists its kernels so a new name
is seen). The bytes a class must move a step are worked out from the engine itself
(`traffic`): the dense weights for the GEMMs (each read once a step, whatever the rows), the
recurrent states read and written for Gated DeltaNet, the K/V pages read for attention, the
conv states, the logits for the sampler. Bytes over time is the class's achieved bandwidth;
its floor is bytes over `--peak-gbs` (the GPU's: 4,800 GB/s on an H200, 3,350 on an H100),
so "x floor" says how far each class is from the memory limit. Norms, activations and copies
move activations only: no floor is given for them.

`--codec-windows N` (Orpheus): a second table, the codec's step of N windows (the SNAC decode
a worker iteration runs for the windows its streams completed; at c=64 up to 64), profiled the
same way (the bucket's codec graph replayed on its stream; the eager decode on a CPU) with the
scenario's codec kernels and sines. Its classes are the decoder's (`CODEC_CLASSES`); the bytes
it must move are its weights, read once a step (the 1-d convolutions apart from the transposed
ones that upsample); its activations, which grow with the audio, get no floor.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from benchmarks.options import positive_int

PEAK_GBS = 4800.0  # the H200's HBM3e, GB/s
PEAKS_GBS = {"H200": 4800.0, "H100": 3350.0}  # by the device's name (the H100 SXM's HBM3)


def peak_gbs_of(device_name: str | None) -> float:
    """The HBM bandwidth the floors are taken at: the named GPU's, the H200's otherwise (and on
    a CPU, whose tables hold host time)."""
    return next((gbs for gpu, gbs in PEAKS_GBS.items() if gpu in (device_name or "")), PEAK_GBS)


CLASSES: tuple[tuple[str, str], ...] = (  # class, pattern over a kernel's (or op's) name
    ("gdn", r"recurren|gdn|gated_delta|delta_rule|chunk_"),
    ("conv", r"conv"),  # before attention: Gated DeltaNet's `_conv_decode_kernel`
    ("attention", r"attention|attn|batchdecode|flashinfer|paged|decode_kernel"),
    ("sampler", r"argmax|sampl|topk|softmax|logsumexp"),
    ("norm", r"norm|rms"),
    (
        "gemm",
        r"gemm|matmul|\bmm\b|aten::mm|addmm|linear|cublas|cutlass|xmma|nvjet|sm90|splitk|"
        r"split_sum",
    ),  # fmt: skip
)


# A class whose work a kernel of another class may do (engine.dense_epilogues: a decode step's
# conv in the in-projection's GEMM): with no kernel of its own, its bytes count with that one.
FUSED_INTO = {"conv": "gemm"}

CODEC_CLASSES: tuple[tuple[str, str], ...] = (  # the codec's step (SNAC's decoder)
    ("upsample", r"conv_transpose|convtranspose|col2im|dgrad|transpose_conv"),
    ("snake", r"snake|\bsin|_sin|sine"),
    ("conv", r"conv|cudnn|implicit|winograd|fprop|gemm|matmul|\bmm\b|xmma|nvjet|sm90|cutlass|fold"),
    ("copy", r"copy|memcpy|memset|fill|\bcat\b|pad"),
)


@dataclass(frozen=True)
class ClassBudget:
    name: str
    us: float  # a step's time in this class
    share: float  # of the step's summed kernel time
    launches: float  # kernels a step
    bytes: int | None  # it must move a step (None: activations only)
    gbs: float | None  # bytes / us
    floor_us: float | None  # bytes at the peak
    top: list[tuple[str, float]]  # its costliest kernels: name, us a step


def classify(name: str, classes: tuple[tuple[str, str], ...] = CLASSES) -> str:
    lowered = name.lower()
    for label, pattern in classes:
        if re.search(pattern, lowered):
            return label
    return "other"


def traffic(engine, batch: int, context: int) -> dict[str, int]:
    """Bytes each class must move in one decode step of `batch` rows of `context` tokens."""
    model, cache = engine.model, engine.cache
    weights = sum(
        p.numel() * p.element_size()
        for name, p in model.named_parameters()
        if p.dim() == 2 and "embed" not in name  # an embedding reads its `batch` rows alone
    )
    head = getattr(model, "lm_head", None)
    if head is not None and head.weight is getattr(
        getattr(model, "embed_tokens", None), "weight", None
    ):
        weights += head.weight.numel() * head.weight.element_size()  # tied: read as the head
    per_slot = lambda tensors: sum(t[0].numel() * t.element_size() for t in tensors)  # noqa: E731
    per_token = sum(t[0, 0].numel() * t.element_size() for t in (*cache.k, *cache.v))
    vocab = model.config.vocab_size
    return {
        "gemm": weights,
        "gdn": 2 * batch * per_slot(cache.ssm_state),  # each row's state read and written
        "conv": 2 * batch * per_slot(cache.conv_state),
        "attention": batch * context * per_token,  # every cached K/V read once
        "sampler": batch * vocab * 4,  # fp32 logits read
    }


def codec_traffic(network: torch.nn.Module) -> dict[str, int]:
    """Bytes the codec's step must move at least: its weights, each read once (the transposed
    convolutions, which upsample, apart from the rest)."""
    moved = {"upsample": 0, "conv": 0}
    for module in network.modules():
        own = sum(p.numel() * p.element_size() for p in module.parameters(recurse=False))
        if own:
            upsample = isinstance(module, torch.nn.ConvTranspose1d)
            moved["upsample" if upsample else "conv"] += own
    return moved


def budget(
    kernels: list[tuple[str, float]], steps: int, moved: dict[str, int], peak_gbs: float,
    classes: tuple[tuple[str, str], ...] = CLASSES,
) -> list[ClassBudget]:  # fmt: skip
    """`kernels`: (name, us) of every kernel run over `steps` steps; one row a class, costliest
    first."""
    by_class: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for name, us in kernels:
        by_class[classify(name, classes)][name].append(us)
    moved = dict(moved)
    for label, into in FUSED_INTO.items():  # no kernel of its own: its bytes are `into`'s
        if label in moved and label not in by_class and into in moved:
            moved[into] += moved.pop(label)
    total = sum(us for _, us in kernels) or 1.0
    rows = []
    for label, names in by_class.items():
        us = sum(sum(v) for v in names.values()) / steps
        count = sum(len(v) for v in names.values()) / steps
        moves = moved.get(label)
        top = sorted(((n, sum(v) / steps) for n, v in names.items()), key=lambda x: -x[1])[:4]
        rows.append(
            ClassBudget(
                label,
                us,
                us * steps / total,
                count,
                moves,
                moves / us / 1e3 if moves and us else None,
                moves / peak_gbs / 1e3 if moves else None,
                top,
            )  # fmt: skip
        )
    return sorted(rows, key=lambda r: -r.us)


def render(rows: list[ClassBudget], title: str, peak_gbs: float) -> str:
    floor = sum(r.floor_us or 0.0 for r in rows)
    lines = [
        f"### {title}",
        "",
        f"Kernel time {sum(r.us for r in rows):,.1f} us a step; the bytes it must move a step"
        f" take {floor:,.1f} us at {peak_gbs:,.0f} GB/s.",
        "",
        "| class | us a step | share | kernels a step | MB a step | GB/s | floor us | x floor |"
        " costliest |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mb = f"{r.bytes / 1e6:,.1f}" if r.bytes else "-"
        gbs = f"{r.gbs:,.0f}" if r.gbs else "-"
        fl = f"{r.floor_us:,.1f}" if r.floor_us else "-"
        times = f"{r.us / r.floor_us:.1f}" if r.floor_us else "-"
        top = "; ".join(f"{n[:48]} {us:.1f}" for n, us in r.top)
        lines.append(
            f"| {r.name} | {r.us:,.1f} | {r.share:.0%} | {r.launches:.0f} | {mb} | {gbs} | {fl}"
            f" | {times} | {top} |"
        )
    return "\n".join(lines) + "\n"


def profiled_kernels(engine, steps: int) -> list[tuple[str, float]]:
    """(name, us) of each kernel of `steps` decode steps: graph replays' device kernels on
    CUDA, eager steps' ops (self time on the host) elsewhere."""
    if engine.graphs is not None:
        step = engine.graphs.replay(engine.scheduler.schedule())
        return profiled(step.graph.replay, steps, cuda=True)
    return profiled(engine.run_step, steps, cuda=False)


def profiled(run, steps: int, cuda: bool) -> list[tuple[str, float]]:
    """(name, us) of each kernel `steps` calls of `run` launch, after 3 calls unprofiled: the
    device's kernels on CUDA, each op's self time on the host elsewhere."""
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.device_streams import device_spans

    for _ in range(3):
        run()
    if cuda:
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                run()
            torch.cuda.synchronize()
        return [(s.name, s.end_us - s.start_us) for s in device_spans(prof.events())]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            run()
    return [(e.key, e.self_cpu_time_total) for e in prof.key_averages() if e.self_cpu_time_total]


def codec_budget(scenario, windows: int, steps: int, peak_gbs: float) -> tuple[str, list]:
    """The codec's step of `windows` windows: its title and rows (`--codec-windows`)."""
    from benchmarks.bench_codec import Codec, windows_of

    config = scenario.engine
    codec = Codec(
        scenario.model.preset, config.dtype, config.device, config.codec_kernels, windows,
        config.codec_sine,
    )  # fmt: skip
    codes = codec.node.codes(windows_of(windows))
    cuda = codec.decoder.cuda_stream is not None
    mode = "graphs" if cuda and config.codec_graphs else "eager"
    kernels = profiled(lambda: codec.step(codes, mode), steps, cuda)
    rows = budget(kernels, steps, codec_traffic(codec.network), peak_gbs, CODEC_CLASSES)
    where = f"{mode}, device kernels" if cuda else "eager, host ops"
    title = (
        f"{scenario.name} {scenario.size} codec step, {windows} windows, kernels"
        f" {config.codec_kernels}, sine {config.codec_sine} ({where}, {steps} steps)"
    )
    return title, rows


def main(argv: list[str] | None = None) -> None:
    from benchmarks.bench_gpu_step import build
    from harness.scenario import load_scenario

    parser = argparse.ArgumentParser(prog="benchmarks.bench_step_budget")
    parser.add_argument("--scenario", default="qwen35", choices=["qwen35", "orpheus"])
    parser.add_argument("--size", default=None, help="default: the scenario's for this machine")
    parser.add_argument("--batch", type=positive_int, default=64)
    parser.add_argument("--context", type=positive_int, default=512)
    parser.add_argument("--steps", type=positive_int, default=20, help="steps profiled")
    parser.add_argument(
        "--peak-gbs", type=float, default=None,
        help="the floors' bandwidth, GB/s (default: the GPU's, PEAKS_GBS; else the H200's)",
    )  # fmt: skip
    parser.add_argument("--markdown", default=None, help="write the table here")
    parser.add_argument("--json", default=None, help="write the rows here")
    parser.add_argument(
        "--codec-windows", type=positive_int, default=None,
        help="orpheus: also the codec's step of this many windows (a second table)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.codec_windows and args.scenario != "orpheus":
        parser.error("--codec-windows: only orpheus has a codec")
    scenario = load_scenario(args.scenario, args.size)
    cuda = torch.cuda.is_available()
    if args.peak_gbs is None:
        args.peak_gbs = peak_gbs_of(torch.cuda.get_device_name() if cuda else None)
    engine = build(scenario, args.batch, args.context, args.steps + 8, "auto", graphs=cuda)
    rows = budget(
        profiled_kernels(engine, args.steps), args.steps,
        traffic(engine, args.batch, args.context), args.peak_gbs,
    )  # fmt: skip
    where = "graph replays, device kernels" if engine.graphs is not None else "eager, host ops"
    title = (
        f"{scenario.name} {scenario.size} decode step, batch {args.batch}, context"
        f" {args.context} ({where}, {args.steps} steps)"
    )
    text = render(rows, title, args.peak_gbs)
    tables = {"step": [asdict(r) for r in rows]}
    if args.codec_windows:
        del engine
        codec_title, codec_rows = codec_budget(
            scenario, args.codec_windows, args.steps, args.peak_gbs
        )
        text += "\n" + render(codec_rows, codec_title, args.peak_gbs)
        tables["codec"] = [asdict(r) for r in codec_rows]
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps(tables, indent=1))


if __name__ == "__main__":
    main()
