"""Models at real shapes with random weights, for timing the decoding loop (never for images): built from configs
here, nothing downloaded. Shared by benchmarks/static_loop_cpu.py (meta device) and benchmarks/gpu_loop.py.

* ``janus_pro_7b``: transformers' JanusForConditionalGeneration shaped like Janus-Pro-7B's generation path: a
  30-layer Llama, hidden 4096 (32 heads, MLP 11008), text vocabulary 102400, 576 image tokens (24 x 24), image
  vocabulary 16384 scored by a 4096-wide generation head.
* ``llamagen_gpt_l``: LlamaGen GPT-L class-conditional at 24 x 24 tokens (384 px), vocabulary 16384, 1000 classes.
"""

from __future__ import annotations

import torch

JANUS_BOS, JANUS_BOI, JANUS_PAD = 100000, 100016, 100015
JANUS_PROMPT_LENGTH = 24  # a short caption in Janus-Pro's SFT format


def janus_pro_7b_config(layers: int = 30):
    from transformers import JanusConfig

    return JanusConfig(
        text_config=dict(model_type="llama", vocab_size=102400, hidden_size=4096, intermediate_size=11008,
                         num_hidden_layers=layers, num_attention_heads=32, num_key_value_heads=32,
                         max_position_embeddings=16384, bos_token_id=JANUS_BOS, eos_token_id=100001,
                         pad_token_id=JANUS_PAD),
        vision_config=dict(num_image_tokens=576, num_hidden_layers=1),  # the understanding tower is never run
        vq_config=dict(num_embeddings=16384, embed_dim=8, projection_dim=4096, image_token_embed_dim=4096),
    )


def janus_pro_7b(device="meta", dtype=torch.bfloat16, layers: int = 30):
    """Built (and randomly initialised by transformers) on ``device`` itself: buffers such as RoPE's come out right."""
    from transformers import JanusForConditionalGeneration

    with torch.device(device):
        model = JanusForConditionalGeneration(janus_pro_7b_config(layers))
    model = model.to(dtype=dtype)
    model.generation_config.generation_kwargs = {"boi_token_id": JANUS_BOI}
    model.generation_config.pad_token_id = JANUS_PAD
    model.generation_config.bos_token_id = JANUS_BOS
    return model.eval()


def janus_prompt(batch: int, device="cpu") -> torch.Tensor:
    body = torch.arange(JANUS_PROMPT_LENGTH - 2)[None, :].expand(batch, -1) + 1000
    bos, boi = torch.full((batch, 1), JANUS_BOS), torch.full((batch, 1), JANUS_BOI)
    return torch.cat([bos, body, boi], 1).to(device)


def llamagen_gpt_l(device="meta", dtype=torch.bfloat16):
    from csd_kernels.models import LlamaGenAdapter
    from csd_kernels.models.llamagen.gpt import PRESETS, ModelArgs, Transformer

    args = ModelArgs(**PRESETS["GPT-L"], vocab_size=16384, block_size=576, num_classes=1000, model_type="c2i")
    with torch.device(device):  # PyTorch's default initialisation, on the device
        model = Transformer(args)
    return LlamaGenAdapter(model.to(dtype=dtype).eval())


def llamagen_prompt(batch: int, device="cpu") -> torch.Tensor:
    return (torch.arange(batch)[:, None] * 7 % 1000).to(device)
