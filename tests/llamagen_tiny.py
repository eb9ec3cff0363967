"""Tiny LlamaGen configs, their weights and prompts: shared by tests/test_llamagen.py and the fixture script
scripts/upstream/llamagen_fixtures.py (which runs upstream LlamaGen on the same weights).

Weights are a pure function of (seed, key name, shape), so the tests regenerate them without upstream code and the
fixture script fills upstream's modules with the same numbers. Scales give well-conditioned random models: unit-RMS
activations, logits spread over a few nats (greedy decisions far from float ties).
"""

from __future__ import annotations

import math
import zlib

import torch

SEED = 1
GRID_C2I, GRID_T2I = 6, 4  # image tokens per side
DOWNSAMPLE = 2  # the tiny VQ decoder upsamples 2x (decoder_ch_mult of length 2)
VOCAB = 128

GPT_CONFIGS = {
    "c2i": dict(dim=64, n_layer=2, n_head=4, multiple_of=32, vocab_size=VOCAB, num_classes=10, model_type="c2i",
                cls_token_num=1, block_size=GRID_C2I**2),
    # grouped-query attention: upstream's cached generate cannot run it (its cache has n_head heads), its
    # cache-free forward can
    "c2i_gqa": dict(dim=64, n_layer=2, n_head=4, n_kv_head=2, multiple_of=32, vocab_size=VOCAB, num_classes=10,
                    model_type="c2i", cls_token_num=1, block_size=GRID_C2I**2),
    "t2i": dict(dim=64, n_layer=2, n_head=4, multiple_of=32, vocab_size=VOCAB, caption_dim=32, model_type="t2i",
                cls_token_num=120, block_size=GRID_T2I**2),
}
# upstream VQ ModelArgs fields; the decoder's base width (upstream's Decoder(ch=128) default) is VQ_CH
VQ_CONFIG = dict(codebook_size=VOCAB, codebook_embed_dim=4, encoder_ch_mult=[1, 2], decoder_ch_mult=[1, 2],
                 z_channels=32)
VQ_CH = 32

CFG_SCALE = 4.0
CLASSES = [3, 7]
CAPTION_VALID = [100, 37]  # real caption tokens per row (the rest is left padding)
# tables read by index (unit-variance rows): tokens, classes, codebook, the unconditional caption
EMBEDDING_TABLES = ("tok_embeddings.weight", "embedding_table.weight", "quantize.embedding.weight", "uncond_embedding")
# logits of the head have std ~0.5 per model: first-token entropies 1.5-3.3 nats at cfg 4 (of ln 128 = 4.85), the
# greedy path's smallest top-2 CFG-logit gap 0.0025 (float32 noise is ~1e-6)
OUTPUT_GAIN = 0.5
PROB_SETTINGS = [(1.0, 0), (0.7, 20)]  # (temperature, top_k; 0 = none) of the first-token probabilities


def seeded_tensor(key: str, shape, seed: int = SEED) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(key.encode()))
    noise = torch.randn(tuple(shape), generator=g)
    if key.endswith("codebook_used"):
        return torch.zeros(tuple(shape))
    if len(shape) == 1 and key.endswith(".weight"):  # RMSNorm / GroupNorm gains
        return 1 + 0.1 * noise
    if key.endswith(".bias"):
        return 0.1 * noise
    if key.endswith(EMBEDDING_TABLES):
        return noise
    fan_in = math.prod(shape[1:])
    gain = OUTPUT_GAIN if key == "output.weight" else 1.0
    return noise * gain / math.sqrt(fan_in)


def seeded_state_dict(shapes: dict, seed: int = SEED) -> dict:
    """{key: shape} -> {key: tensor} (float32)."""
    return {key: seeded_tensor(key, shape, seed) for key, shape in shapes.items()}


def captions(left_padded: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Caption features [2, 120, C] (padded rows hold noise: the model must zero and hide them) and their mask
    [2, 120]: left-padded (upstream sample_t2i.py's default) or right-padded (its --no-left-padding, where the
    last condition position, which predicts the first image token, is a padded one)."""
    g = torch.Generator().manual_seed(SEED + 1)
    embeds = torch.randn(len(CAPTION_VALID), 120, GPT_CONFIGS["t2i"]["caption_dim"], generator=g)
    mask = torch.zeros(len(CAPTION_VALID), 120, dtype=torch.long)
    for row, valid in enumerate(CAPTION_VALID):
        mask[row, 120 - valid :] = 1
    return (embeds, mask) if left_padded else (embeds, mask.flip(-1))
