"""Speculative decoding of text with a plain transformers draft / target pair, verified by the fused op.

The loop is the textbook one (Leviathan et al.; Chen et al.): the draft model proposes n tokens one at a time with
their probabilities q, the target scores the n + 1 positions in one call, and
``csd_kernels.chain_speculative_sampling`` (FlashInfer's convention) keeps the accepted prefix plus one token drawn
from the target: from max(p − q, 0) at the first rejection, or the bonus token after n acceptances. A top-k filter
masks logits with −inf before the softmax, as transformers' ``TopKLogitsWarper`` does; the zeros it leaves in p and q
are handled by the op (a masked token is never drawn, a draft the target masks is rejected).

No KV cache, to keep the loop on one page: each call re-reads the whole sequence. Real decoders keep a cache and crop
it to the accepted prefix (see examples/janus_jacobi.py).

Run: ``python examples/text_speculative.py`` (a tiny random-config Llama and an early-exit draft cut from it;
nothing downloads.
With real weights, load e.g. a 68M draft and a 7B target that share a tokenizer).
"""

from __future__ import annotations

from typing import Optional

import torch

import csd_kernels as ck


def filtered_probs(logits: torch.Tensor, temperature: float, top_k: Optional[int]) -> torch.Tensor:
    """Softmax of logits / T with everything outside the top k masked to −inf (one-hot at the argmax for T = 0)."""
    logits = logits.float()
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.softmax(logits / temperature, dim=-1)


@torch.no_grad()
def speculative_generate(target, draft, input_ids: torch.Tensor, max_new_tokens: int, *, n_draft: int = 4,
                         temperature: float = 1.0, top_k: Optional[int] = None, seed: int = 0):
    """(tokens [1, S + max_new_tokens], target calls, tokens accepted per call) for one prompt [1, S]."""
    generator = torch.Generator(device=input_ids.device).manual_seed(seed)
    seq = input_ids
    calls, accepted_per_call = 0, []
    while seq.shape[1] - input_ids.shape[1] < max_new_tokens:
        # 1. the draft proposes n tokens and their probabilities q
        drafted, q_rows = seq, []
        for _ in range(n_draft):
            q = filtered_probs(draft(drafted).logits[:, -1], temperature, top_k)  # [1, V]
            token = torch.multinomial(q, 1, generator=generator)  # the argmax when q is one-hot (T = 0)
            drafted, q_rows = torch.cat([drafted, token], 1), q_rows + [q]
        draft_ids = drafted[:, seq.shape[1]:]  # [1, n]
        # 2. one target call scores the n + 1 positions (the last one is the bonus position)
        p = filtered_probs(target(drafted).logits[:, -(n_draft + 1):], temperature, top_k)  # [1, n + 1, V]
        calls += 1
        # 3. verify: accepted drafts, then one token from the target; -1 after the emitted tokens
        out, _, emitted = ck.chain_speculative_sampling(torch.stack(q_rows, 1), draft_ids, p, seed=seed,
                                                        offset=calls)
        new = out[0, : int(emitted[0]) + 1].to(seq.dtype)
        seq = torch.cat([seq, new[None]], 1)
        accepted_per_call.append(int(emitted[0]))
    return seq[:, : input_ids.shape[1] + max_new_tokens], calls, accepted_per_call


def tiny_llama(vocab_size: int, layers: int, seed: int):
    """A small random-config LlamaForCausalLM (no weights are downloaded)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         initializer_range=0.3, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def early_exit_draft(target, layers: int):
    """A draft that is the target's first ``layers`` layers with its embeddings, final norm and head (LayerSkip-style
    self-speculation): close enough to the target to have its drafts accepted, and it needs no second checkpoint."""
    draft = tiny_llama(target.config.vocab_size, layers, seed=0)
    missing, _ = draft.load_state_dict(target.state_dict(), strict=False)
    assert not missing
    return draft


def main() -> None:
    target = tiny_llama(97, layers=4, seed=0)
    draft = early_exit_draft(target, layers=2)
    prompt = torch.tensor([[1, 17, 42, 5]])
    tokens, calls, accepted = speculative_generate(target, draft, prompt, 24, n_draft=4, temperature=1.0, top_k=20)
    print("tokens:", tokens[0].tolist())
    print(f"{calls} target calls for 24 tokens; drafts accepted per call: {accepted}")


if __name__ == "__main__":
    main()
