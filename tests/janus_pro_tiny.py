"""A tiny Janus-Pro in deepseek-ai's original ``MultiModalityCausalLM`` layout, shared by tests/test_janus_pro.py and
the fixture script scripts/upstream/janus_pro_fixtures.py (which runs in a transformers 4.57 venv with deepseek-ai's
``janus`` package: torch, json and safetensors only here, no csd_kernels import).

The fixture script builds the model with deepseek's own classes, fills it with ``seeded_weights`` and saves it with
its ``save_pretrained`` in each LAYOUT; it records the config.json and index that call wrote, every tensor's
name/shape/file/digest, and deepseek's outputs. The tests rebuild the same bytes from the seed and write them back
in the recorded layout (``write_checkpoint``), so the checkpoint under test is the one deepseek's code wrote and
scored, without shipping megabytes of weights.

deepseek's code builds its VQ (``VQ-16``) and SigLIP tower (``siglip_large_patch16_384``) from fixed presets whatever
config.json says; the fixture script shrinks what those two names build (VQ channels 32 instead of 128, a 64-entry
codebook, z 32; SigLIP width 32, 2 blocks, the preset's 16 heads and MLP ratio 4) and keeps the release's
config.json names.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Optional

import torch

SEED = 7
# token ids of the tiny vocabulary (deepseek's tokenizer: bos 100000, pad 100002, <begin_of_image> 100003)
BOS, PAD, BOI = 1, 0, 60
VOCAB = 64
HIDDEN = 32
CODEBOOK = 64  # image vocabulary
VQ_CH, VQ_Z = 32, 32  # VQ-16 base channels and latent channels (release: 128, 256)
VIT_WIDTH, VIT_LAYERS, VIT_HEADS = 32, 2, 16
IMAGE_SIZE, PATCH = 64, 16  # 4 x 4 image tokens, 64 x 64 pixels (release: 384 px, 24 x 24)
GRID = IMAGE_SIZE // PATCH

CONFIG = {
    "architectures": ["MultiModalityCausalLM"],
    "model_type": "multi_modality",
    "torch_dtype": "float32",
    "aligner_config": {"cls": "MlpProjector", "model_type": "aligner",
                       "params": {"depth": 2, "input_dim": VIT_WIDTH, "n_embed": HIDDEN, "projector_type": "mlp_gelu"}},
    "gen_aligner_config": {"cls": "MlpProjector", "model_type": "gen_aligner",
                           "params": {"depth": 2, "input_dim": 8, "n_embed": HIDDEN, "projector_type": "mlp_gelu"}},
    "gen_head_config": {"cls": "vision_head", "model_type": "gen_head",
                        "params": {"image_token_embed": HIDDEN, "image_token_size": CODEBOOK, "n_embed": HIDDEN}},
    "gen_vision_config": {"cls": "VQ-16", "model_type": "gen_vision",
                          "params": {"image_token_size": CODEBOOK, "n_embed": 8}},
    "language_config": {"hidden_size": HIDDEN, "intermediate_size": 64, "num_attention_heads": 4,
                        "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": VOCAB,
                        "max_position_embeddings": 128, "torch_dtype": "float32"},
    "vision_config": {"cls": "CLIPVisionTower", "model_type": "vision",
                      "params": {"image_size": IMAGE_SIZE, "model_name": "siglip_large_patch16_384",
                                 "select_feature": "same", "select_layer": -1}},
}

# name -> save_pretrained keywords of deepseek's model
LAYOUTS = {
    "bin_shards": dict(safe_serialization=False, max_shard_size="2MB"),  # pytorch_model-0000x-of-0000n.bin + index
    "bin": dict(safe_serialization=False, max_shard_size="1GB"),  # one pytorch_model.bin
    "safetensors": dict(safe_serialization=True, max_shard_size="1GB"),  # one model.safetensors
}

# prompts (token ids): BOS, text, <begin_of_image>; the two differ in length (a left-padded batch)
PROMPTS = [[BOS, 11, 12, 13, 14, 15, 9, 16, BOI], [BOS, 11, 17, 18, 9, 16, BOI]]
CFG = 5.0


def seeded_weights(shapes: dict, seed: int = SEED) -> dict:
    """{name: shape} -> {name: float32 tensor}: name-sorted draws from one seeded generator, scaled so that hidden
    states stay O(1) and the image logits spread over several units (greedy choices far from ties)."""
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for name in sorted(shapes):
        shape = tuple(shapes[name])
        x = torch.randn(shape, generator=gen)
        if name.endswith("codebook_used"):
            x = torch.zeros(shape)
        elif name.endswith(".weight") and "norm" in name.split(".")[-2]:
            x = 1 + 0.2 * x  # RMSNorm / LayerNorm / GroupNorm gains
        elif name.endswith(".bias"):
            x = 0.1 * x
        elif name.endswith("gen_head.vision_head.weight"):
            x = x * (3 / math.sqrt(shape[-1]))
        elif len(shape) >= 2 and not name.endswith(("embed_tokens.weight", "gen_embed.weight", "pos_embed",
                                                    "quantize.embedding.weight")):
            x = x / math.sqrt(math.prod(shape[1:]))  # fan-in scaling (linears and convolutions)
        weights[name] = x.contiguous()
    return weights


def tensor_digest(t: torch.Tensor) -> str:
    h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()


def write_checkpoint(path: Path, config: dict, weights: dict, weight_map: Optional[dict], layout: str) -> Path:
    """A checkpoint directory as deepseek's ``save_pretrained`` writes it in ``layout``: config.json, then
    model.safetensors, pytorch_model.bin, or the .bin shards named in ``weight_map`` + pytorch_model.bin.index.json."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if layout == "safetensors":
        save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    elif layout == "bin":
        torch.save(weights, path / "pytorch_model.bin")
    else:
        files: dict = {}
        for name, file in weight_map.items():
            files.setdefault(file, {})[name] = weights[name]
        for file, tensors in files.items():
            torch.save(tensors, path / file)
        total = sum(weights[n].numel() * weights[n].element_size() for n in weight_map)
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (path / "pytorch_model.bin.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return path
