"""A speculative Jacobi loop for Janus text-to-image in the shape of the CSD authors' loop, verified by the fused op.

The shape (deepseek-ai/Janus' ``generation_inference.py`` extended with a Jacobi window, as the CSD authors run it):

* one prompt, two model rows: the conditional prompt and the unconditional one (every token but BOS and the
  image-start token replaced by pad); image tokens are embedded with the generation embeddings + aligner and scored
  by the generation head; CFG mixes the two rows' logits (``uncond + s·(cond − uncond)``);
* a window of W draft tokens after the committed prefix, initialised uniformly at random (q = 1/V); each iteration is
  ONE model call over [last committed token, drafts 0 .. W − 2] on a KV cache cropped to the committed prefix;
* ``csd_kernels.verify`` decides the whole window in one call (CSD's relaxed rule by default): the accepted drafts
  and one resampled token are committed, and the tokens it drew for the positions after them (with their p as q)
  become the next window's drafts — the Jacobi step.

Everything a decoder does around the op is here, on one page; ``csd_kernels.generate`` is the batched, sync-free
version of the same loop. Run: ``python examples/janus_jacobi.py`` (a tiny random-config Janus built here; nothing
downloads — with real weights use ``JanusForConditionalGeneration.from_pretrained`` and the SFT prompt,
``csd_kernels.models.janus_prompt``).
"""

from __future__ import annotations

import torch

import csd_kernels as ck


def _cache_kwarg(module) -> str:
    import inspect

    return "cache" if "cache" in inspect.signature(type(module).forward).parameters else "past_key_values"


@torch.no_grad()
def jacobi_generate(model, input_ids: torch.Tensor, *, bos: int, boi: int, pad: int, cfg_scale: float = 5.0,
                    temperature: float = 1.0, window: int = 8, rule: str = "csd", seed: int = 0):
    """(image tokens [1, N], model calls after the prefill) for one prompt [1, S] ending with the image-start token."""
    from transformers import DynamicCache

    lm, gen_head = model.model.language_model, model.model.generation_head
    total = model.config.vision_config.num_image_tokens  # N (576 = 24 x 24 for the released models)
    vocab = gen_head.vision_head.out_features  # V image codes
    device = input_ids.device
    keep = (input_ids == bos) | (input_ids == boi)
    rows = torch.cat([input_ids, torch.where(keep, input_ids, torch.full_like(input_ids, pad))])  # [2, S]
    cache, cache_kw = DynamicCache(config=model.config.text_config), _cache_kwarg(lm)
    lm(inputs_embeds=model.get_input_embeddings()(rows[:, :-1]), use_cache=True, **{cache_kw: cache})  # prefill
    prompt_cached = rows.shape[1] - 1

    image = torch.zeros(total, dtype=torch.int64, device=device)
    n, calls = 0, 0  # committed image tokens, model calls
    uniform = torch.full((1, 1), 1.0 / vocab, device=device)
    drafts = torch.randint(0, vocab, (window,), generator=torch.Generator().manual_seed(seed)).to(device)
    q = uniform.expand(window, vocab)  # [W, V]
    while n < total:
        length = min(window, total - n)
        # keep the prompt and the committed inputs x_{-1} .. x_{n-2} (crop takes how many to drop, negative)
        if cache.get_seq_length() > prompt_cached + n:
            cache.crop(prompt_cached + n - cache.get_seq_length())
        last = model.get_input_embeddings()(rows[:, -1:]) if n == 0 else \
            model.prepare_embeddings_for_image_generation(image[n - 1:n].expand(2, 1))
        window_embeds = model.prepare_embeddings_for_image_generation(drafts[: length - 1].expand(2, -1))
        hidden = lm(inputs_embeds=torch.cat([last, window_embeds.to(last.dtype)], 1), use_cache=True,
                    **{cache_kw: cache}).last_hidden_state  # [2, length, D]
        logits = gen_head(hidden).float()  # [2, length, V]
        calls += 1
        res = ck.verify(logits[:1], drafts[None, :length], q[None, :length].contiguous(), uncond_logits=logits[1:],
                        cfg_scale=cfg_scale, temperature=temperature, rule=rule, positions=n, seed=seed,
                        offset=calls)
        accepted = res.accept_len_host[0]  # validate=True read it with the status (one sync per step)
        emitted = min(accepted + 1, length)
        image[n:n + emitted] = res.tokens[0, :emitted]
        n += emitted
        # Jacobi step: the tokens the op drew after the accepted prefix (from p) are the next drafts, p their q
        carried = length - emitted
        fresh = torch.randint(0, vocab, (window - carried,), generator=torch.Generator().manual_seed(seed + calls))
        drafts = torch.cat([res.tokens[0, emitted:length], fresh.to(device)])
        q = torch.cat([res.probs[0, emitted:length], uniform.expand(window - carried, vocab)])
    return image[None], calls


def tiny_janus():
    """A tiny random-config JanusForConditionalGeneration (text vocab 64: pad 0, BOS 1, BOI 60; 4 x 4 image grid of
    32 codes). Nothing is downloaded."""
    from transformers import JanusConfig, JanusForConditionalGeneration

    config = JanusConfig(
        text_config=dict(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         initializer_range=0.2, pad_token_id=0, bos_token_id=1, eos_token_id=2),
        vision_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, image_size=32, patch_size=8,
                           projection_dim=32, num_image_tokens=16, mlp_ratio=2.0),
        vq_config=dict(embed_dim=8, num_embeddings=32, latent_channels=32, base_channels=32, channel_multiplier=[1, 1],
                       num_res_blocks=1, projection_dim=32, image_token_embed_dim=32, initializer_range=0.2),
        image_token_id=63,
    )
    torch.manual_seed(0)
    return JanusForConditionalGeneration(config).eval()


def main() -> None:
    model = tiny_janus()
    prompt = torch.tensor([[1, 5, 6, 7, 60]])  # BOS, text, BOI (a real prompt: csd_kernels.models.janus_prompt)
    tokens, calls = jacobi_generate(model, prompt, bos=1, boi=60, pad=0, cfg_scale=5.0, window=6)
    print("image tokens:", tokens[0].tolist())
    print(f"{calls} model calls for {tokens.shape[1]} image tokens")
    pixels = model.decode_image_tokens(tokens)  # [1, H, W, 3] in [-1, 1] (with real weights: the image)
    print("decoded image:", tuple(pixels.shape))


if __name__ == "__main__":
    main()
