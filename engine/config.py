"""Scenarios: one YAML per workload, resolved for one size, with typed overrides.

A scenario names the model (architecture, preset, seed), the engine settings and the load
profile. `sizes.<name>` holds per-size overrides; the machine picks the default size
(`default_size.cuda` where CUDA is present, else `default_size.cpu`).
"""

from __future__ import annotations

import copy
import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

SCENARIO_DIR = Path(__file__).resolve().parent.parent / "scenarios"


class ConfigError(ValueError):
    """A scenario, size or override that cannot be used; the message says what to do."""


@dataclass(frozen=True)
class EngineConfig:
    page_size: int = 16
    max_rows: int = 256  # rows (requests) in one step
    max_tokens_per_step: int = 2048  # tokens in one step; longer prompts are chunked
    mixing: bool = False  # may prefill rows join a decode step
    # Mixed steps (prompt rows join decode steps, as with `mixing`) in two launches back to
    # back on the stream: the decode rows replay their decode graph, then the prompt rows run
    # on the piecewise runner (or eagerly), where `mixing` alone runs every row of a mixed
    # step through the piecewise runner. The decode rows keep their graph's cost, and the
    # host plans the prompt rows while the GPU runs the decode graph and the step before it
    # (a prompt no longer holds every decoding row up for its host's launches). Two stagings
    # a step: each staged host buffer and FlashInfer plan waits for its last copy first
    # (INVARIANTS 64). Turns mixing's scheduling on whatever `mixing` says.
    split_mixed: bool = False
    # Prefill steps on a CUDA stream of their own, beside the decode steps: a step's prompt
    # rows launch apart from its decode rows (the scheduler's `schedule_apart`) on a second
    # set of staged resources (ops, step inputs, piecewise graphs), and join the decode steps
    # once their prefill has completed and been postprocessed; the decode rows go on decoding
    # meanwhile instead of waiting for it. One prefill step in flight at a time. Not with
    # `mixing` or `split_mixed` (those put prompt rows in decode steps). INVARIANTS 65.
    prefill_stream: bool = False
    # A new request's prefill may wait up to this many steps while other rows decode, so that
    # requests arriving a few steps apart prefill together: fewer prefill steps (each holds up
    # every decoding row, and costs the host about as much for one row as for four) for a
    # later first token. 0: prefill at once (TGI's router has this trade as
    # max_waiting_tokens). Never holds with no row decoding, nor once a step's worth of prompt
    # tokens waits (docs/ENGINE.md, INVARIANTS 53).
    prefill_hold_steps: int = 0
    max_model_len: int = 4096  # prompt + output tokens of one request
    kv_pages: int = 8192  # pages in the paged KV pool
    state_slots: int = 512  # recurrent-state slots (one per running request)
    dtype: str = "float32"
    device: str = "cpu"
    # Intra-op threads of the worker on a CPU. The worker shares the machine with the API
    # server and the load generator; more threads than free cores make torch's spinning
    # thread pools fight (measured: a tiny decode step 24 ms with 1 thread, 550 ms with 2
    # threads on a loaded 2-core machine).
    cpu_threads: int = 1
    runtime_stops: bool = True  # declared stop policies checked in the runtime
    # Kernel backend of the model step (engine/kernels): "auto" runs the CUDA kernels
    # (Triton, FlashInfer, flash-linear-attention) on a CUDA device and the torch reference
    # elsewhere; "torch" forces the reference, "cuda" the kernels (an error without CUDA).
    kernels: str = "auto"
    # Decode steps replay CUDA graphs captured per batch bucket (engine/worker/graphs.py);
    # needs the CUDA kernels with FlashInfer attention (bf16/fp16). Off: every step eager.
    cuda_graphs: bool = True
    # The Gated DeltaNet kernel of bf16/fp16 prefill and mixed steps on the CUDA kernels:
    # "triton" (ours, engine/kernels/triton_gdn.py, one launch a layer), "triton_split" (ours
    # in three launches, a short serial part), "auto" (per step: triton_split when the longest
    # row is 512 tokens or more, else triton) or "fla" (flash-linear-attention's chunked
    # kernel, ~9 launches a layer). Ours run a mixed step's decode rows through the recurrence.
    # "auto" is the default since session 5 (faster than either alone at every step measured).
    gdn_prefill: str = "auto"
    # How the split Gated DeltaNet kernel (triton_split, `auto`'s long rows, and the captured
    # form of piecewise_gdn) launches: SplitConfig's fields as `name=value,...`
    # (engine/kernels/gdn_config.py; e.g. `states_bv=32,outputs_bv=64`), "default" for its
    # defaults. A setting so that a tuned launch can be an arm of `bench run`.
    gdn_split: str = "default"
    # `auto`'s threshold: a step whose longest chunked row has this many new tokens or more
    # runs the split kernel, a shorter one the one-launch kernel (whose single launch costs
    # less host time; measured on the H200 in session 7: split ahead from 256 tokens).
    # gdn_config.SPLIT_FROM_TOKENS, written out: this module cannot import the kernels'.
    gdn_split_from_tokens: int = 256
    # The storage of the recurrent (Gated DeltaNet) state slots: "float32", or "bfloat16" or
    # "float16", which halve a decode step's state traffic (vLLM's default keeps it in the
    # model's dtype); the math on it is fp32 either way. bf16 rounds to 8 significant bits
    # (0.8b, H200: greedy agreement with fp32 82%, session 8), fp16 to 11 with a range to
    # 65,504 (the states' entries stay far inside it: keys are L2-normalised).
    state_dtype: str = "float32"
    # FlashInfer's decode attention on tensor cores (its prefill kernel run for one query a
    # row), which FlashInfer advises for grouped-query heads of 4 or more (0.8b: 8 over 2).
    decode_tensor_cores: bool = False
    # The kernel of decode steps' attention on the CUDA kernels: "flashinfer" (its decode
    # wrappers; `decode_tensor_cores` picks which) or "triton" (ours, split over each row's
    # tokens, engine/kernels/triton_decode.py: FlashInfer's decode in graphs read the cache at
    # 1.7-1.8 TB/s of the H200's 4.8). Prefill and mixed steps run FlashInfer's prefill either
    # way. "triton" since session 13 (H200, batch 64, graphs: 0.8b's step 3.01 -> 2.66 ms,
    # 3b's 5.12 -> 4.67 ms; docs/BENCHMARKS.md).
    decode_attention: str = "triton"
    # Prefill and mixed steps (and decode steps past the largest decode bucket) replay CUDA
    # graphs of the token-wise pieces between the attention and Gated DeltaNet ops, captured
    # per token bucket (engine/worker/piecewise.py); same requirements as cuda_graphs.
    piecewise_graphs: bool = True
    # The piecewise graphs capture the Gated DeltaNet op too (only attention stays eager): its
    # kernels on grids fixed per token bucket, reading the step's row and chunk tables from
    # the staged inputs (engine/kernels/gdn_tables.py). Needs piecewise_graphs (an arm turning
    # those off turns this off too). On at qwen35 0.8b (scenarios/qwen35.yaml).
    piecewise_gdn: bool = False
    # The codec stage (Orpheus's SNAC) replays its decode as CUDA graphs captured per
    # window-count bucket up to max_rows (engine/worker/codec_graphs.py); ignored on a CPU.
    # On since its GPU tests passed and it measured +28% audio-s/s (docs/evidence/codec_graphs).
    codec_graphs: bool = True
    # The codec stage's step in two phases (engine/worker/stream_stage.py): begin (decode
    # queued, PCM copied back without blocking) in one worker iteration, finish (wait, then
    # the postprocess and frames) in the next, so the host no longer waits out the codec's
    # device work. Off (strict) until measured on a GPU. The same frames either way.
    codec_overlap: bool = False
    # The codec's elementwise work on Triton kernels (engine/kernels/triton_snac.py), CUDA
    # only: "torch" (the reference: each Snake five elementwise kernels), "snake" (each Snake
    # one kernel), "fused" (that, and each residual unit's Snake -> depthwise conv -> Snake
    # one kernel) or "folded" (that, and each unit's 1x1 conv one GEMM adding into the unit's
    # input in place, its bias handed on to the next kernel: 24 elementwise kernels fewer a
    # decode; engine/models/snac.py) or "folded_noise" (that, and each block's noise block one
    # kernel and a GEMM into x, its transposed conv's bias handed on too). Captured by the
    # codec graphs like the rest. "torch" here; Orpheus 3b runs "folded_noise" since session
    # 16 (scenarios/orpheus.yaml; the 64-window step on graphs 5.56 -> 3.30 ms with approx).
    codec_kernels: str = "torch"
    # The sines of those Triton kernels (engine/kernels/triton_snac.py): "exact" (libdevice's
    # sinf, ~40 instructions and a local-memory stack frame) or "approx" (the SFU's
    # sin.approx.f32, ~2^-21 absolute error at the codec's O(1) arguments, far under bf16's
    # rounding). The fused unit computes 8 sines an output (7 taps, then its second Snake);
    # its kernel is ~58% of the 3b codec step on graphs (session 15's profile). "exact" here;
    # Orpheus 3b runs "approx" since session 16 (+7.1% and +7.4% audio-s/s at c=64 in two
    # ABBA blocks, docs/evidence/codec_sine*).
    codec_sine: str = "exact"
    # The dense projections of a step on the CUDA kernels (engine/kernels/triton_gemm.py):
    # "torch" (cuBLAS through torch), "triton" (ours for steps of up to 128 rows in bf16/fp16,
    # the weight streamed once; more rows, and fp32, stay on torch's) or "head" (ours for the
    # LM head alone, the one shape where the H200 measured it ahead: 3b's 156,940 x 3072 at 64
    # rows, 247 against 364 us). Ignored by the torch reference.
    dense_kernel: str = "torch"
    # A node whose logit mask never leaves a span of the vocabulary (Orpheus: its 28,672 audio
    # codes of 156,940 ids) gets logits of that span only: the LM head's product over those
    # rows of its weight (engine/models/decoder.py `CausalLM.restrict_head`). The same windows
    # are sampled from the same logits; the head's weight read shrinks 5.5x at 3b (~1 GB a
    # step). Ignored by a node that declares no span. Off by default; on in Orpheus's `tiny`
    # and `3b` (scenarios/orpheus.yaml; at 3b measured on the H200 in session 11).
    masked_head: bool = False
    # How the CUDA ops launch their Triton kernels (engine/kernels/triton_launch.py): "jit"
    # (Triton's own launch, which finds the compiled kernel on every call) or "bound" (the
    # compiled kernel kept per call signature, its launcher called directly: less host time a
    # launch). One setting per worker process; ignored by the torch reference. "jit" until
    # measured on a GPU.
    triton_launch: str = "jit"
    # The Gated DeltaNet recurrence of decode steps (and a mixed step's leading decode rows) on
    # the CUDA kernels (engine/kernels/triton_gdn.py): "grid" (a program per row, value head
    # and value block; the fp32 state read, updated and written back by each) or "pipelined"
    # (persistent programs striding over those tiles, each tile's state read a tile ahead by
    # Triton's pipeliner while the one before computes: the recurrence is ~a third of 0.8b's
    # decode step, its state traffic at ~72% of the H200's bandwidth). "grid" until measured
    # on a GPU (`bench_gdn_kernels --recurrent`). The same arithmetic either way.
    gdn_decode: str = "grid"
    # Programmatic dependent launch of our Triton kernels of a step (engine/kernels/
    # triton_launch.py; Hopper's griddepcontrol): each may start its programs while the kernel
    # before it finishes, waiting on the device before it touches that kernel's data; the
    # dense GEMM (`dense_kernel: triton`) prefetches its weight into L2 meanwhile. Captured in
    # the CUDA graphs as programmatic edges. CUDA only (an error on a CPU: the interpreter
    # has no such instructions). Off: on the H200 it took 5.8% off 0.8b's decode graph but
    # served "no change" at c=64 over 3 ABBA blocks (+0.7%; docs/evidence/pdl, session 16).
    pdl: bool = False
    # Resources that stage host data behind a non-blocking copy (the step inputs, FlashInfer's
    # plans) keep two host buffers used in turn; off: one (the staging hazard, for an A/B).
    double_buffer: bool = True
    # The overlapped loop: launch step N+1 (decode rows fed step N's tokens on the device)
    # before postprocessing step N, hiding the host's work under the GPU's. Off: the strict
    # loop (launch, wait, postprocess). On a CPU it gains nothing: the step runs at launch.
    overlap: bool = False
    # Before it says Ready, the worker runs a few throwaway steps (prefill below and above
    # gdn_split_from_tokens, several rows, decode, mixed, sampled; engine/worker/warmup.py), so
    # that the kernels compile then, not under the first requests (an H200 server's first
    # prefill stalled 104 s). On every device: nothing compiles on a CPU, but a tiny model's
    # warmup costs ~0.13 s of a ~1.4 s start, and every test server then runs it.
    warmup: bool = True
    # Planted slowdown of the worker loop, for `bench power` and harness tests only.
    planted_delay_us: int = 0
    # Planted slowdown of the device: a spin kernel of this many microseconds queued after
    # each decode-lane step (on a CPU, a busy-wait at launch); for the harness's verdict
    # checks on a GPU-bound loop, where a host delay hides under the GPU's work.
    planted_gpu_delay_us: int = 0
    # The API server's guards (docs/ENGINE.md, docs/RELIABILITY.md faults 15 and 16): a worker
    # silent (no frame, no heartbeat) this many seconds past its longest step so far is
    # stalled (every open stream ends with an error, the server kills it and exits 1); a
    # connection with no whole request head this long after it opened or after its last
    # response is closed; a body not all there this long after its head is a 408; one
    # connection over the cap (lowered to what the file limit allows) is answered 503.
    stall_timeout_s: float = 10.0
    idle_timeout_s: float = 15.0
    body_timeout_s: float = 30.0
    max_connections: int = 4096

    @property
    def mixes(self) -> bool:
        """Whether prompt rows join decode steps (`mixing`, or `split_mixed`'s two launches)."""
        return self.mixing or self.split_mixed

    def __post_init__(self) -> None:
        # checked here, not when the worker builds its ops: a bad arm of `bench run` is then a
        # one-line error before any server starts
        check_sizes(self)
        split_setting(self.gdn_split)
        check_dense_kernel(self.dense_kernel)
        check_decode_attention(self.decode_attention)
        check_one_of("engine.gdn_decode", self.gdn_decode, GDN_DECODES)
        if self.prefill_stream and self.mixes:
            raise ConfigError(
                "engine.prefill_stream launches prompt rows apart from decode rows; it cannot "
                "be combined with engine.mixing or engine.split_mixed (set "
                "engine.prefill_stream=false with them)"
            )
        if self.piecewise_gdn and not self.piecewise_graphs:
            raise ConfigError(
                "engine.piecewise_gdn captures Gated DeltaNet inside the piecewise graphs; it "
                "needs engine.piecewise_graphs: true (set engine.piecewise_gdn=false with "
                "engine.piecewise_graphs=false)"
            )
        if self.pdl and self.device != "cuda":
            raise ConfigError("engine.pdl needs engine.device: cuda (Hopper's launch control)")
        check_one_of("engine.triton_launch", self.triton_launch, TRITON_LAUNCHES)


# Sizes of 0 leave a worker that never schedules a row (its warmup never ends: "starting"
# for good); timeouts must be positive seconds.
AT_LEAST_ONE = ("page_size", "max_rows", "max_model_len", "kv_pages", "state_slots")
AT_LEAST_ONE += ("max_connections",)
SECONDS = ("stall_timeout_s", "idle_timeout_s", "body_timeout_s")


def check_sizes(config: EngineConfig) -> None:
    """A ConfigError naming the first size that would leave the engine hanging."""
    for name in AT_LEAST_ONE:
        if getattr(config, name) < 1:
            raise ConfigError(f"engine.{name} must be at least 1, got {getattr(config, name)}")
    if config.max_tokens_per_step < config.max_rows:
        raise ConfigError(
            f"engine.max_tokens_per_step ({config.max_tokens_per_step}) must be at least "
            f"engine.max_rows ({config.max_rows}): a step holds a token of each row"
        )
    for name in SECONDS:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e9:
            raise ConfigError(f"engine.{name} must be a positive number of seconds, got {value!r}")


DENSE_KERNELS = ("torch", "triton", "head")  # engine.dense_kernel
DECODE_ATTENTIONS = ("flashinfer", "triton")  # engine.decode_attention
TRITON_LAUNCHES = ("jit", "bound")  # engine.triton_launch
GDN_DECODES = ("grid", "pipelined")  # engine.gdn_decode


def split_setting(text: str):
    """engine.gdn_split's SplitConfig (engine/kernels/gdn_config.py), or a ConfigError naming
    the setting and what is wrong with it."""
    from engine.kernels.gdn_config import parse_split_config  # plain Python, no triton

    try:
        return parse_split_config(text)
    except ValueError as exc:
        raise ConfigError(f"engine.gdn_split: {exc}") from None


def check_one_of(setting: str, value, choices) -> None:
    """A ConfigError naming `setting` unless `value` is one of `choices`."""
    if value not in choices:
        raise ConfigError(f"{setting} must be one of {', '.join(choices)}, got {value!r}")


def check_dense_kernel(name: str) -> None:
    check_one_of("engine.dense_kernel", name, DENSE_KERNELS)


def check_decode_attention(name: str) -> None:
    check_one_of("engine.decode_attention", name, DECODE_ATTENTIONS)


@dataclass(frozen=True)
class ModelSpec:
    arch: str = "qwen35"
    preset: str = "tiny"
    seed: int = 0
    path: str | None = None  # a Hugging Face-format directory instead of random weights
    # a tokenizer.json (or a directory holding one) for text prompts, or `bytes` (the built-in
    # byte-level tokenizer); default: the checkpoint's own, else a word per id of the model's
    # vocabulary (engine/tokenizer.py WordTokenizer, served at /v1/tokenizer.json)
    tokenizer: str | None = None
    eos_token_ids: list[int] | None = None  # replaces the model's own EOS ids


APIS = ("completions", "speech")


@dataclass(frozen=True)
class LoadProfile:
    prompt_tokens: tuple[int, int] = (16, 64)
    output_tokens: tuple[int, int] = (16, 48)  # max_tokens (with ignore_eos: the length)
    requests: int = 256
    warmup: int = 16
    seed: int = 1234
    # The endpoint the load drives: /v1/completions (SSE tokens) or /v1/audio/speech (PCM).
    api: str = "completions"

    def __post_init__(self) -> None:
        check_one_of("load.api", self.api, APIS)


@dataclass(frozen=True)
class Scenario:
    name: str
    size: str
    size_reason: str
    description: str
    headline: str
    model: ModelSpec
    engine: EngineConfig
    load: LoadProfile
    sizes: tuple[str, ...] = field(default=())
    source: str = ""  # the file it was read from

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def scenario_names() -> list[str]:
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))


def scenario_path(name: str) -> Path:
    """A scenario's file: `name` itself when it names a .yaml/.yml file, else
    scenarios/<name>.yaml."""
    path = Path(name)
    if path.suffix in (".yaml", ".yml"):
        if not path.exists():
            raise ConfigError(f"no scenario file {name}")
        return path.resolve()
    path = SCENARIO_DIR / f"{name}.yaml"
    if not path.exists():
        known = ", ".join(scenario_names()) or "none"
        raise ConfigError(f"unknown scenario {name!r}; known scenarios: {known}")
    return path


def _read(path: Path) -> dict:
    """A scenario file's mapping, or a one-line ConfigError saying what is wrong with it."""
    see = f"see {SCENARIO_DIR / 'qwen35.yaml'} for the format"
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read scenario {path} ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"scenario {path} is not text (UTF-8)") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise ConfigError(f"scenario {path} is not valid YAML{at}: {problem}") from None
    if raw is None:
        raise ConfigError(f"scenario {path} is empty; {see}")
    if not isinstance(raw, dict):
        kind = "list" if isinstance(raw, list) else type(raw).__name__
        raise ConfigError(f"scenario {path} is a YAML {kind}, not a mapping of settings; {see}")
    if not isinstance(raw.get("name"), str) or not raw["name"].strip():
        raise ConfigError(f"scenario {path} has no `name:` (a string, e.g. name: qwen35)")
    for key in ("model", "engine", "load", "sizes", "default_size"):
        if not isinstance(raw.get(key) or {}, dict):
            raise ConfigError(f"scenario {path}: {key} must be a mapping, got {raw[key]!r:.60}")
    for size, extra in (raw.get("sizes") or {}).items():
        extra = extra or {}
        if not isinstance(extra, dict) or not all(
            isinstance(v or {}, dict) for v in extra.values()
        ):
            raise ConfigError(
                f"scenario {path}: sizes.{size} must map model, engine and load to settings,"
                f" got {extra!r:.60}"
            )
    return raw


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def parse_overrides(text: str | None) -> dict[str, object]:
    """`engine.mixing=true,load.requests=64` -> {"engine.mixing": True, "load.requests": 64}.

    A comma starts a new item only when a `section.key=` follows it, so
    `model.eos_token_ids=[1,2]` and `engine.gdn_split=states_bv=32,outputs_bv=64` stay one
    item each."""
    out: dict[str, object] = {}
    parts = re.split(r",(?=\s*[A-Za-z_]\w*\.[\w.]*=)", text or "")
    for item in filter(None, (part.strip() for part in parts)):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} is not key=value (e.g. engine.mixing=true)")
        out[key.strip()] = yaml.safe_load(value) if value.strip() else ""
    return out


def _merge(base: dict, extra: dict) -> dict:
    merged = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _coerce(cls: type, section: str, values: dict):
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in values.items():
        if key not in known:
            raise ConfigError(f"unknown setting {section}.{key}; known: {', '.join(sorted(known))}")
        kwargs[key] = _check_type(f"{section}.{key}", hints[key], value)
    return cls(**kwargs)


def _check_type(name: str, hint, value):
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(hint):
            return None
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
        origin = typing.get_origin(hint)
    if origin is tuple:
        if not isinstance(value, list | tuple) or len(value) != 2:
            raise ConfigError(f"{name} must be a [low, high] pair, got {value!r}")
        low, high = (_check_type(name, int, v) for v in value)
        if low < 1 or high < low:
            raise ConfigError(f"{name} must satisfy 1 <= low <= high, got {value!r}")
        return (low, high)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{name} must be a list, got {value!r}")
        return [_check_type(name, typing.get_args(hint)[0], v) for v in value]
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{name} must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name} must be an integer, got {value!r}")
        if value < 0:
            raise ConfigError(f"{name} must not be negative, got {value!r}")
        return value
    if hint is str and not isinstance(value, str):
        raise ConfigError(f"{name} must be a string, got {value!r}")
    return value


def _resolve(
    name: str, size: str | None, overrides: dict[str, object] | None
) -> tuple[Path, dict, str, str, dict]:
    """The file, its mapping, the size (asked for, or by machine) and why, and its model,
    engine and load sections at that size with the overrides applied (no default filled in)."""
    path = scenario_path(name)
    raw = _read(path)
    sizes = raw.get("sizes") or {}
    if size is None:
        has_cuda = cuda_available()
        machine = "cuda" if has_cuda else "cpu"
        size = (raw.get("default_size") or {}).get(machine)
        if size is None:
            raise ConfigError(f"scenario {path} has no default_size.{machine}; give --size")
        reason = "CUDA found" if has_cuda else "no CUDA on this machine"
    else:
        reason = "asked for"
    if size not in sizes:
        raise ConfigError(f"scenario {raw['name']} has no size {size!r}; sizes: {', '.join(sizes)}")
    resolved = _merge({k: raw.get(k) or {} for k in ("model", "engine", "load")}, sizes[size] or {})
    for key, value in (overrides or {}).items():
        section, _, leaf = key.partition(".")
        if section not in resolved or not leaf or "." in leaf:
            raise ConfigError(f"override {key!r} must be model.X, engine.X or load.X")
        resolved[section][leaf] = value
    return path, raw, size, reason, resolved


def load_scenario(
    name: str, size: str | None = None, overrides: dict[str, object] | None = None
) -> Scenario:
    path, raw, size, reason, resolved = _resolve(name, size, overrides)
    return Scenario(
        name=raw["name"],
        size=size,
        size_reason=reason,
        description=raw.get("description", ""),
        headline=raw.get("headline", "output_tok_per_s"),
        model=_coerce(ModelSpec, "model", resolved["model"]),
        engine=_coerce(EngineConfig, "engine", resolved["engine"]),
        load=_coerce(LoadProfile, "load", resolved["load"]),
        sizes=tuple(raw.get("sizes") or {}),
        source=str(path),
    )


def scenario_source(
    name: str, size: str | None = None, overrides: dict[str, object] | None = None
) -> dict:
    """The scenario at one size with `overrides` applied, as a scenario file of that one size:
    the settings its file and the overrides state, and no default filled in. Loaded back, it
    resolves to `load_scenario(name, size, overrides)`'s settings; an engine of another revision
    fills what it leaves out with its own defaults, as it does for its own scenarios. The harness
    starts every server of an arm with this file."""
    _, raw, size, _, resolved = _resolve(name, size, overrides)
    head = {key: raw[key] for key in ("name", "description", "headline") if key in raw}
    return {**head, **resolved, "default_size": {"cuda": size, "cpu": size}, "sizes": {size: {}}}
