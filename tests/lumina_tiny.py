"""Tiny Lumina-mGPT checkpoints in the release's on-disk format, shared by tests/test_lumina.py and the fixture
script scripts/upstream/lumina_fixtures.py (which runs in a transformers 4.44 venv: torch, json and safetensors only
here, no csd_kernels import).

The fixture script builds each case with Lumina-mGPT's own ChameleonXLLMXForConditionalGeneration, fills it with
``seeded_weights`` and writes it with the class's ``save_pretrained``; it records the config.json and index it wrote,
the name/shape of every tensor and a hash of its bytes. The tests rebuild the same bytes from the seed and write
them back in the recorded layout (``write_checkpoint``), so the checkpoint under test is the one upstream's code
wrote and scored, without shipping megabytes of weights.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Optional

import torch

# Lumina-mGPT's token ids (FlexARItemProcessor): image codes are BPE ids 4..8195, <eoss> 8196 ends an image,
# <racm3:break> 8197 starts one, <reserved08799> 8803 ends a row, <reserved{8800+n}> = 8804 + n gives a size in
# 32-pixel patches. The tiny vocabulary covers them all, since upstream's logits processors hard-code them.
TINY_VOCAB = 8832
GRID = (4, 6)  # (H, W) tokens: 64 x 96 pixels, size tokens 8806 and 8807

BASE_CONFIG = dict(
    vocab_size=TINY_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=4, max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0,
    model_parallel_size=1, swin_norm=False, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
    # the release's training-time fields (Lumina-mGPT-7B-768 config.json)
    mask_image_logits=False, dropout=0.05, z_loss_weight=1e-5,
    vocabulary_map={"<s>": 0, "<pad>": 1, "</s>": 2, "<image>": 8711, "IMGIMGAZ": 4, "IMGIMGBZ": 5, "IMGIMGCZ": 6},
    # a tiny VQ-GAN config in the converted-Chameleon style (Meta's names next to transformers' names)
    vq_config=dict(embed_dim=8, num_embeddings=8192, n_embed=8192, latent_channels=32, z_channels=32,
                   base_channels=32, ch=32, channel_multiplier=[1, 1], ch_mult=[1, 1], num_res_blocks=1,
                   resolution=16, attn_resolutions=[], out_channels=3, out_ch=3),
)

# name -> (config overrides, weight seed, save_pretrained max_shard_size or None for one file)
CASES = {
    # Lumina-mGPT-7B's layout: one model-parallel shard, plain pre-norm blocks, one safetensors file
    "mp1": (dict(), 11, None),
    # the 30B/34B family's layout: 2 model-parallel shards (q/k-norm [2, head_dim]), grouped KV heads (one KV head
    # per shard), swin norm, a non-default RoPE base, weights split over several safetensors files + index
    "mp2": (dict(num_key_value_heads=2, model_parallel_size=2, swin_norm=True, rope_theta=500000.0), 12, "300KB"),
}


def case_config(name: str) -> dict:
    overrides, _, _ = CASES[name]
    return {**BASE_CONFIG, **overrides}


def seeded_weights(shapes: dict, seed: int) -> dict:
    """{name: shape} -> {name: bf16 tensor}: name-sorted draws from one seeded generator, scaled so that hidden
    states stay O(1) and the logits spread over several units (greedy choices far from ties)."""
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for name in sorted(shapes):
        shape = tuple(shapes[name])
        x = torch.randn(shape, generator=gen)
        if name.endswith("norm.weight"):  # RMSNorm gains and q/k LayerNorm gains
            x = 1 + 0.2 * x
        elif name.endswith(".bias"):
            x = 0.2 * x
        elif name.endswith("lm_head.weight"):
            x = x * (3 / math.sqrt(shape[-1]))
        elif not name.endswith("embed_tokens.weight"):  # projections: fan-in scaling
            x = x / math.sqrt(shape[-1])
        weights[name] = x.to(torch.bfloat16)
    return weights


def tensor_digest(t: torch.Tensor) -> str:
    """sha256 of a tensor's dtype, shape and bytes (bf16 viewed as int16: numpy has no bfloat16)."""
    raw = t.contiguous().view(torch.int16) if t.dtype == torch.bfloat16 else t.contiguous()
    h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update(raw.numpy().tobytes())
    return h.hexdigest()


def write_checkpoint(path: Path, config: dict, weights: dict, weight_map: Optional[dict] = None) -> Path:
    """A checkpoint directory as ``save_pretrained`` writes it: config.json and model.safetensors, or the shards
    named in ``weight_map`` (tensor name -> file name) plus model.safetensors.index.json."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if weight_map is None:
        save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
        return path
    files: dict = {}
    for name, file in weight_map.items():
        files.setdefault(file, {})[name] = weights[name]
    for file, tensors in files.items():
        save_file(tensors, str(path / file), metadata={"format": "pt"})
    total = sum(weights[name].numel() * weights[name].element_size() for name in weight_map)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return path
