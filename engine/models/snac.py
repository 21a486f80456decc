"""SNAC's decoder (Multi-Scale Neural Audio Codec, hubertsiuzdak/snac): codes -> PCM.

Our own module, not the `snac` package's: the package's decoder adds fresh Gaussian noise on
every call (NoiseBlock), so a window's samples would depend on the call and on what else is
in the batch, and it recomputes weight norm on every forward. Here the structure, shapes and
parameter names are the package's (`quantizer.quantizers.N.{codebook,out_proj}`,
`decoder.model.N...`; weight norm folded into plain weights), and each noise block draws its
noise once, seeded, for the fixed window length it serves: decoding is a pure function of the
codes, batched or alone. The decode path only: no encoder, no quantizer projections in.

Three code levels at strides 4, 2, 1 (in latent steps) sum into the latent; the decoder
upsamples it by prod(rates) = the hop (512 at 24 kHz).

Kernels (`engine.codec_kernels`, CODEC_KERNELS): on CUDA tensors the Snakes can run as one
Triton kernel each (`snake`), and each residual unit's Snake -> depthwise conv -> Snake as one
(`fused`; engine/kernels/triton_snac.py, docs/KERNELS.md); `folded` is `fused` with each
residual unit's 1x1 conv one GEMM that adds its product into the unit's input in place (the
residual add as the GEMM's accumulator) and leaves its bias out, handed on as a per-channel
shift that the next kernel to read the activations adds (the next unit's, or the next Snake's;
the shifts of a block's units add up). `folded_noise` is `folded` with each block's noise block
folded too: its transposed conv runs without its bias, which becomes the block's first shift,
and the noise block, x + noise * W x on x + shift, is one kernel making (x + shift) * noise and
one GEMM adding W times that into x in place (the noise is one value a step, so it commutes
with the 1x1 conv). The torch expressions here are the reference and what a CPU runs whatever
the setting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from engine.config import check_one_of
from engine.models.random_weights import on_meta, random_model, seeded

# engine.codec_kernels: the torch reference; each Snake one Triton kernel; and each residual
# unit's Snake -> depthwise conv -> Snake one kernel too; and the units' 1x1 convs with their
# residual adds and biases folded (the module docstring); and each block's noise block and
# its transposed conv's bias folded as well. CUDA tensors only.
CODEC_KERNELS = ("torch", "snake", "fused", "folded", "folded_noise")
FOLDED = ("folded", "folded_noise")
# engine.codec_sine: the sines of those Triton kernels, libdevice's sinf ("exact", correctly
# reduced for any argument) or the hardware's sin.approx ("approx": one SFU op, ~2^-21
# absolute error on the O(1) arguments of the codec, far below bf16's rounding).
CODEC_SINES = ("exact", "approx")


@dataclass(frozen=True)
class SnacConfig:
    latent_dim: int
    decoder_dim: int
    decoder_rates: tuple[int, ...] = (8, 8, 4, 2)
    codebook_size: int = 4096
    codebook_dim: int = 8
    vq_strides: tuple[int, ...] = (4, 2, 1)
    noise: bool = True
    depthwise: bool = True
    sample_rate: int = 24_000
    latent_steps: int = 16  # latent steps a decoded window spans (its noise is drawn for it)

    @property
    def hop(self) -> int:
        return math.prod(self.decoder_rates)


PRESETS: dict[str, SnacConfig] = {
    # hubertsiuzdak/snac_24khz: 19.8M parameters in all, the decoder and codebooks here.
    "24khz": SnacConfig(latent_dim=768, decoder_dim=1024),
    # The same hop, codebooks and levels, a few thousand channels fewer: CPU tests and CI.
    "tiny": SnacConfig(latent_dim=32, decoder_dim=64),
}


def snake(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """x + sin^2(alpha x) / alpha, per channel (alpha [1, C, 1]): the reference, op by op."""
    return x + (alpha + 1e-9).reciprocal() * torch.sin(alpha * x).pow(2)


def _triton_snac():
    """engine/kernels/triton_snac.py, imported when first used: it imports triton, which only
    CUDA machines have."""
    from engine.kernels import triton_snac

    return triton_snac


class Snake1d(nn.Module):
    """x + sin^2(alpha x) / alpha, per channel; on CUDA one Triton kernel unless `kernels` is
    "torch"."""

    def __init__(self, channels: int, kernels: str = "torch", sine: str = "exact"):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))
        self.triton = kernels != "torch"
        self.approx = sine == "approx"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.triton and x.is_cuda:
            return _triton_snac().snake(x, self.alpha, approx=self.approx)
        return snake(x, self.alpha)


class ResidualUnit(nn.Module):
    """x + conv1x1(snake(dwconv(snake(x)))); with `kernels` "fused" (and a depthwise conv), on
    CUDA the part before the 1x1 conv is one Triton kernel."""

    def __init__(
        self, dim: int, dilation: int, groups: int, kernels: str = "torch", sine: str = "exact"
    ):
        super().__init__()
        size = 7
        pad = (size - 1) * dilation // 2
        self.block = nn.Sequential(
            Snake1d(dim, kernels, sine),
            nn.Conv1d(dim, dim, size, dilation=dilation, padding=pad, groups=groups),
            Snake1d(dim, kernels, sine),
            nn.Conv1d(dim, dim, 1),
        )
        self.fused = kernels in ("fused", *FOLDED) and groups == dim
        self.approx = sine == "approx"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused and x.is_cuda:
            return x + self.block[3](self._snake_conv(x))
        return x + self.block(x)

    def _snake_conv(self, x: torch.Tensor, shift: torch.Tensor | None = None) -> torch.Tensor:
        """The unit's Snake -> depthwise conv -> Snake on `x + shift`: one Triton kernel."""
        snake1, conv, snake2, _ = self.block
        weights = (snake1.alpha, conv.weight, conv.bias, snake2.alpha, conv.dilation[0])
        return _triton_snac().residual_snake_conv(x, *weights, shift, approx=self.approx)

    def folded(
        self, x: torch.Tensor, shift: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The unit on `x + shift` (shift [C] fp32, or None: 0), as `engine.codec_kernels:
        folded` runs it: x + shift + pointwise(y) is returned as x, updated in place by one
        batched GEMM (x += W y), and the shift to add to it, shift + the 1x1 conv's bias. The
        caller owns x: no one else may hold it."""
        pointwise = self.block[3]
        y = self._snake_conv(x, shift)
        x.baddbmm_(pointwise.weight[..., 0].expand(x.shape[0], -1, -1), y)
        bias = pointwise.bias.float()
        return x, bias if shift is None else shift + bias


class NoiseBlock(nn.Module):
    """x + noise * linear(x), the noise [1, 1, steps] drawn once (reset_noise), not per call."""

    def __init__(self, dim: int, steps: int):
        super().__init__()
        self.linear = nn.Conv1d(dim, dim, 1, bias=False)
        self.register_buffer("noise", torch.zeros(1, 1, steps), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.noise * self.linear(x)

    def folded(
        self, x: torch.Tensor, shift: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The block on `x + shift` (shift [C] fp32, or None: 0), as `engine.codec_kernels:
        folded_noise` runs it: noise * linear(x + shift) = linear((x + shift) * noise), the
        noise being one value a step, so x += W ((x + shift) * noise), one Triton kernel and one
        batched GEMM adding into x in place; the shift is still x's to add, returned as it
        came. The caller owns x."""
        y = _triton_snac().shift_scale(x, shift, self.noise)
        x.baddbmm_(self.linear.weight[..., 0].expand(x.shape[0], -1, -1), y)
        return x, shift


def _transposed_conv(conv: nn.ConvTranspose1d, x: torch.Tensor) -> torch.Tensor:
    """`conv` on x without its bias (a fresh tensor)."""
    return torch.nn.functional.conv_transpose1d(
        x, conv.weight, None, conv.stride, conv.padding, conv.output_padding, conv.groups,
        conv.dilation,
    )  # fmt: skip


class DecoderBlock(nn.Module):
    def __init__(
        self, in_dim: int, out_dim: int, stride: int, noise_steps: int | None, groups: int,
        kernels: str, sine: str = "exact",
    ):  # fmt: skip
        super().__init__()
        self.fold_noise = kernels == "folded_noise" and noise_steps is not None
        layers: list[nn.Module] = [
            Snake1d(in_dim, kernels, sine),
            nn.ConvTranspose1d(
                in_dim, out_dim, 2 * stride, stride=stride,
                padding=math.ceil(stride / 2), output_padding=stride % 2,
            ),
        ]  # fmt: skip
        if noise_steps is not None:
            layers.append(NoiseBlock(out_dim, noise_steps))
        layers += [ResidualUnit(out_dim, d, groups, kernels, sine) for d in (1, 3, 9)]
        self.block = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)

    def folded(
        self, x: torch.Tensor, shift: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The block on `x + shift` (the last block's units' biases, per channel; None: 0), its
        units folded (ResidualUnit.folded), and with `folded_noise` its noise block too
        (NoiseBlock.folded), the transposed conv's bias then handed on with the units':
        returns x and the shift still to add to it."""
        snake, upsample, *rest = self.block
        x = _triton_snac().snake(x, snake.alpha, shift, approx=snake.approx)
        if self.fold_noise:  # the upsampled x without its bias, which becomes the shift
            x, shift = _transposed_conv(upsample, x), upsample.bias.float()
        else:
            x, shift = upsample(x), None
        for layer in rest:
            if isinstance(layer, ResidualUnit) or self.fold_noise:
                x, shift = layer.folded(x, shift)
            else:  # the noise block, before the units
                if shift is not None:
                    raise AssertionError("a layer after a folded unit cannot take its shift")
                x = layer(x)
        return x, shift


class Decoder(nn.Module):
    def __init__(self, c: SnacConfig, kernels: str, sine: str = "exact"):
        super().__init__()
        if c.depthwise:
            layers: list[nn.Module] = [
                nn.Conv1d(c.latent_dim, c.latent_dim, 7, padding=3, groups=c.latent_dim),
                nn.Conv1d(c.latent_dim, c.decoder_dim, 1),
            ]
        else:
            layers = [nn.Conv1d(c.latent_dim, c.decoder_dim, 7, padding=3)]
        steps = c.latent_steps
        for i, stride in enumerate(c.decoder_rates):
            out_dim = c.decoder_dim // 2 ** (i + 1)
            steps *= stride
            layers.append(
                DecoderBlock(
                    c.decoder_dim // 2**i, out_dim, stride, steps if c.noise else None,
                    groups=out_dim if c.depthwise else 1, kernels=kernels, sine=sine,
                )
            )  # fmt: skip
        layers += [
            Snake1d(out_dim, kernels, sine), nn.Conv1d(out_dim, 1, 7, padding=3), nn.Tanh()
        ]  # fmt: skip
        self.model = nn.Sequential(*layers)
        self.folded = kernels in FOLDED and c.depthwise

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.folded and x.is_cuda):
            return self.model(x)
        shift = None  # the residual units' biases not yet added to x, per channel (fp32)
        for layer in self.model:
            if isinstance(layer, DecoderBlock):
                x, shift = layer.folded(x, shift)
            elif isinstance(layer, Snake1d) and shift is not None:
                x, shift = _triton_snac().snake(x, layer.alpha, shift, approx=layer.approx), None
            else:  # the first convolutions, the last one and the tanh: no shift pending
                if shift is not None:
                    raise AssertionError("a layer after a folded block cannot take its shift")
                x = layer(x)
        return x


class Quantizer(nn.Module):
    """One level: a code's embedding, projected to the latent, held for `stride` steps."""

    def __init__(self, c: SnacConfig, stride: int):
        super().__init__()
        self.stride = stride
        self.codebook = nn.Embedding(c.codebook_size, c.codebook_dim)
        self.out_proj = nn.Conv1d(c.codebook_dim, c.latent_dim, 1)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        z = self.out_proj(self.codebook(codes).transpose(1, 2))
        return z.repeat_interleave(self.stride, dim=-1)


class ResidualQuantizer(nn.Module):
    def __init__(self, c: SnacConfig):
        super().__init__()
        self.quantizers = nn.ModuleList(Quantizer(c, s) for s in c.vq_strides)

    def from_codes(self, codes: list[torch.Tensor]) -> torch.Tensor:
        return sum(q(level) for q, level in zip(self.quantizers, codes, strict=True))


class SnacDecoder(nn.Module):
    def __init__(self, config: SnacConfig, kernels: str = "torch", sine: str = "exact"):
        """`kernels`: one of CODEC_KERNELS (engine.codec_kernels), `sine` one of CODEC_SINES
        (engine.codec_sine, the Triton kernels' sines), for CUDA tensors."""
        super().__init__()
        check_one_of("engine.codec_kernels", kernels, CODEC_KERNELS)
        check_one_of("engine.codec_sine", sine, CODEC_SINES)
        self.config = config
        self.kernels, self.sine = kernels, sine
        self.quantizer = ResidualQuantizer(config)
        self.decoder = Decoder(config, kernels, sine)

    @torch.no_grad()
    def decode(self, codes: list[torch.Tensor]) -> torch.Tensor:
        """Codes per level [B, latent_steps / stride] -> audio [B, 1, latent_steps * hop] in
        [-1, 1]. Rows are independent: a batch decodes each row as it would alone. Every op
        here works within a row: codebook lookups, 1x1 and temporal convolutions (grouped over
        channels, never over the batch), Snake per channel, the noise blocks' fixed noise
        broadcast over the batch, the tanh; no batch norm, no statistics over the batch, no
        state kept between calls. So rows added to pad a batch (the codec graphs' buckets,
        engine/worker/codec_graphs.py) cannot change a real row's samples, only, through the
        kernels a batch size selects, their float rounding."""
        return self.decoder(self.quantizer.from_codes(codes))

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def reset_noise(self, seed: int) -> None:
        for name, module in self.named_modules():
            if isinstance(module, NoiseBlock):
                noise = torch.randn(module.noise.shape, generator=seeded(seed, name + ".noise"))
                module.noise.copy_(noise)

    @classmethod
    def random(
        cls, config: SnacConfig, seed: int, dtype: torch.dtype, device, kernels: str = "torch",
        sine: str = "exact",
    ) -> SnacDecoder:  # fmt: skip
        """Seeded random weights (`_random_weight`): the same for every `kernels` and `sine`."""
        probe = on_meta(lambda: cls(config))
        transposed = {
            f"{name}.weight"
            for name, module in probe.named_modules()
            if isinstance(module, nn.ConvTranspose1d)
        }
        model = random_model(
            lambda: cls(config, kernels, sine),
            lambda name, shape: _random_weight(name, shape, seed, name in transposed),
            dtype,
            device,
        )
        model.reset_noise(seed)
        return model


RESIDUAL_SCALE = 0.2  # what a residual unit or a noise block adds: the sums stay O(1)
OUTPUT_SCALE = 0.2


def _random_weight(name: str, shape: tuple[int, ...], seed: int, transposed: bool):
    """Snake's alpha at 1 (as trained models start), biases at 0, codebooks N(0, 1), conv
    weights at fan-in scale (a transposed conv [in, out, k] at stride k / 2 sums 2 taps of
    each input per output), a residual unit's last conv at RESIDUAL_SCALE of it: every stage
    keeps O(1) activations, and the output (before the tanh) has an RMS of about 0.4."""
    gen = seeded(seed, name)
    if name.endswith("alpha"):
        return torch.ones(shape)
    if name.endswith("bias"):
        return torch.zeros(shape)
    if name.endswith("codebook.weight"):
        return torch.randn(shape, generator=gen)
    fan_in = shape[0] * 2 if transposed else shape[1] * shape[2]
    std = fan_in**-0.5
    if name.endswith((".block.3.weight", "linear.weight")):  # a residual unit's, noise's
        std *= RESIDUAL_SCALE
    elif shape[0] == 1:  # the conv to one channel before the tanh: speech-like levels
        std *= OUTPUT_SCALE
    return torch.randn(shape, generator=gen) * std
