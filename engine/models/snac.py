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

The layers (Snake, residual units, noise blocks, decoder blocks) and their kernels
(`engine.codec_kernels`) are snac_layers.py's; here the config, the quantizer, the decoder
stack and the model with its seeded random weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from engine.models.random_weights import on_meta, random_model, seeded
from engine.models.snac_layers import FOLDED, DecoderBlock, NoiseBlock, Snake1d, _triton_snac


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
        (engine.codec_sine, the Triton kernels' sines), for CUDA tensors; both checked where
        the configuration is made (engine/config/codec.py)."""
        super().__init__()
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
