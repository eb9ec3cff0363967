"""The pixel side of LlamaGen's VQ tokenizer (``tokenizer/tokenizer_image/vq_model.py``): codebook lookup,
``post_quant_conv`` and the decoder, with upstream's module names (so the state-dict keys are upstream's).

The encoder and ``quant_conv`` only turn images into codes; a released VQ checkpoint holds them and the loader
accepts and skips them by name (:data:`ENCODER_PREFIXES`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["ENCODER_PREFIXES", "VQ_PRESETS", "VQArgs", "VQDecoder", "to_uint8_like_save_image"]

VQ_PRESETS = {
    "VQ-16": dict(encoder_ch_mult=[1, 1, 2, 2, 4], decoder_ch_mult=[1, 1, 2, 2, 4]),
    "VQ-8": dict(encoder_ch_mult=[1, 2, 2, 4], decoder_ch_mult=[1, 2, 2, 4]),
}
# keys of a full VQ checkpoint that decoding does not use: the image -> code path and the training-time usage counter
ENCODER_PREFIXES = ("encoder.", "quant_conv.", "quantize.codebook_used")


@dataclass
class VQArgs:
    """Upstream's VQ ModelArgs minus its loss weights and dropout; ``ch`` and ``num_res_blocks`` are the Decoder's
    constructor defaults upstream (not ModelArgs fields there), fields here so that small decoders can be built."""

    codebook_size: int = 16384
    codebook_embed_dim: int = 8
    codebook_l2_norm: bool = True
    encoder_ch_mult: list = field(default_factory=lambda: [1, 1, 2, 2, 4])
    decoder_ch_mult: list = field(default_factory=lambda: [1, 1, 2, 2, 4])
    z_channels: int = 256
    ch: int = 128
    num_res_blocks: int = 2

    def __post_init__(self):
        widths = [self.ch * m for m in self.decoder_ch_mult]
        if any(w % 32 for w in widths):
            raise ValueError(f"VQArgs: decoder widths {widths} must be multiples of 32 (GroupNorm with 32 groups)")

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.decoder_ch_mult) - 1)


def _norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(num_groups=32, num_channels=channels, eps=1e-6, affine=True)


class ResnetBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.norm1 = _norm(in_channels)
        self.conv1 = nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1)
        self.norm2 = _norm(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, kernel_size=3, padding=1)
        self.nin_shortcut = nn.Conv2d(in_channels, out_channels, kernel_size=1) if in_channels != out_channels else None

    def forward(self, x):
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return (x if self.nin_shortcut is None else self.nin_shortcut(x)) + h


class AttnBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.norm = _norm(channels)
        self.q = nn.Conv2d(channels, channels, kernel_size=1)
        self.k = nn.Conv2d(channels, channels, kernel_size=1)
        self.v = nn.Conv2d(channels, channels, kernel_size=1)
        self.proj_out = nn.Conv2d(channels, channels, kernel_size=1)

    def forward(self, x):
        b, c, h, w = x.shape
        normed = self.norm(x)

        def tokens(conv):  # [B, 1, h*w, C]: one head over the pixels
            return conv(normed).reshape(b, 1, c, h * w).transpose(2, 3)

        out = F.scaled_dot_product_attention(tokens(self.q), tokens(self.k), tokens(self.v))  # scale C^-1/2
        return x + self.proj_out(out.transpose(2, 3).reshape(b, c, h, w))


class Upsample(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size=3, padding=1)

    def forward(self, x):
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class UpBlock(nn.Module):
    """One resolution of the decoder: num_res_blocks + 1 resnet blocks (each followed by attention at the lowest
    resolution), then a 2x upsample except at the last level."""

    def __init__(self, in_channels: int, out_channels: int, blocks: int, attention: bool, upsample: bool):
        super().__init__()
        self.res = nn.ModuleList(ResnetBlock(in_channels if i == 0 else out_channels, out_channels)
                                 for i in range(blocks))
        self.attn = nn.ModuleList(AttnBlock(out_channels) for _ in range(blocks if attention else 0))
        self.upsample = Upsample(out_channels) if upsample else None

    def forward(self, h):
        for i, block in enumerate(self.res):
            h = block(h)
            if len(self.attn):
                h = self.attn[i](h)
        return h if self.upsample is None else self.upsample(h)


class Decoder(nn.Module):
    def __init__(self, args: VQArgs):
        super().__init__()
        mult = args.decoder_ch_mult
        levels = len(mult)
        width = args.ch * mult[-1]
        self.conv_in = nn.Conv2d(args.z_channels, width, kernel_size=3, padding=1)
        self.mid = nn.ModuleList([ResnetBlock(width, width), AttnBlock(width), ResnetBlock(width, width)])
        self.conv_blocks = nn.ModuleList()
        for level in reversed(range(levels)):  # lowest resolution (widest) first
            out = args.ch * mult[level]
            self.conv_blocks.append(UpBlock(width, out, args.num_res_blocks + 1, attention=level == levels - 1,
                                            upsample=level != 0))
            width = out
        self.norm_out = _norm(width)
        self.conv_out = nn.Conv2d(width, 3, kernel_size=3, padding=1)

    def forward(self, z):
        h = self.conv_in(z)
        for block in self.mid:
            h = block(h)
        for block in self.conv_blocks:
            h = block(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class Codebook(nn.Module):
    def __init__(self, args: VQArgs):
        super().__init__()
        self.l2_norm = args.codebook_l2_norm
        self.embedding = nn.Embedding(args.codebook_size, args.codebook_embed_dim)

    def lookup(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [...] -> vectors [..., C]; rows l2-normalised at lookup when the codebook was trained so."""
        table = F.normalize(self.embedding.weight, p=2, dim=-1) if self.l2_norm else self.embedding.weight
        return table[codes]


class VQDecoder(nn.Module):
    def __init__(self, args: VQArgs):
        super().__init__()
        self.args = args
        self.quantize = Codebook(args)
        self.post_quant_conv = nn.Conv2d(args.codebook_embed_dim, args.z_channels, kernel_size=1)
        self.decoder = Decoder(args)

    def decode_code(self, codes: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """codes [B, h*w] raster order -> images [B, 3, h·f, w·f], about [-1, 1] (upstream ``decode_code``)."""
        height, width = grid
        z = self.quantize.lookup(codes).reshape(codes.shape[0], height, width, -1).permute(0, 3, 1, 2)  # [B, C, h, w]
        return self.decoder(self.post_quant_conv(z.contiguous()))


def to_uint8_like_save_image(images: torch.Tensor) -> torch.Tensor:
    """[B, 3, H, W] in [-1, 1] -> uint8 [B, H, W, 3] as upstream's samples are saved (torchvision ``save_image`` with
    ``normalize=True, value_range=(-1, 1)``: clamp, map to [0, 1], ×255, +0.5, truncate)."""
    unit = (images.float().clamp(-1, 1) + 1) / 2
    return unit.mul(255).add(0.5).clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous()
