"""csd_kernels.integrations.transformers: ``model.generate(custom_generate=...)`` on Emu3 and on the Lumina-mGPT
layout of Chameleon, and ``janus_generate_image``, against transformers' own generate on the tiny random fixtures.

Greedy (top-k 1 / do_sample=False) Jacobi decoding through custom_generate returns the stock call's output token for
token; sampled, the first image token has the stock call's law (chi-square against the stock call's own processed
scores where transformers returns them, two-sample against stock samples for Janus)."""

from __future__ import annotations

import pytest
import torch
from conftest import JANUS_BOI, JANUS_BOS, LUMINA_KW, janus_image_generate
from scipy.stats import chi2
from test_emu3 import CFG, EOS, GRID, NEGATIVE, PAD, PROMPTS, _transformers_greedy, build_tiny_emu3, left_padded
from transformers import LogitsProcessor, LogitsProcessorList

from csd_kernels.integrations.transformers import custom_generate_path, janus_generate_image

pytestmark = pytest.mark.usefixtures("one_thread")
HEIGHT, WIDTH = GRID
IMAGE_LENGTH = (WIDTH + 1) * HEIGHT + 3


@pytest.fixture(scope="module")
def emu3():
    return build_tiny_emu3()


def _emu3_custom(model, ids, mask, negative=None, **kwargs):
    extra = {} if negative is None else dict(negative_prompt_ids=negative.expand(ids.shape[0], -1),
                                             negative_prompt_attention_mask=torch.ones(ids.shape[0], negative.shape[1],
                                                                                       dtype=torch.long))
    return model.generate(ids, attention_mask=mask, custom_generate=custom_generate_path(), trust_remote_code=True,
                          guidance_scale=CFG, pad_token_id=PAD, eos_token_id=EOS, grid=GRID, **extra, **kwargs)


@pytest.mark.parametrize("negative", [NEGATIVE, None], ids=["negative_prompt", "default_uncond"])
@pytest.mark.parametrize("mode, window", [("sjd", 16), ("csd", 5)])
def test_emu3_greedy_custom_generate_is_the_stock_generate(emu3, negative, mode, window):
    ids, mask = left_padded(PROMPTS)
    negative = None if negative is None else torch.tensor([negative])
    stock = _transformers_greedy(emu3, ids, mask, negative)  # the new tokens of transformers' own call
    out = _emu3_custom(emu3, ids, mask, negative, max_new_tokens=IMAGE_LENGTH, do_sample=False, mode=mode,
                       window=window)
    assert torch.equal(out, torch.cat([ids, stock], 1))
    short = _emu3_custom(emu3, ids, mask, negative, max_new_tokens=7, do_sample=False, mode=mode, window=window)
    assert torch.equal(short, torch.cat([ids, stock[:, :7]], 1))  # max_new_tokens cuts as the stock call does


def test_emu3_reads_its_grid_from_the_prompts_size_text():
    """The stock call unchanged plus custom_generate=: no grid=, the prompt's "3*4" (Emu3Processor's size text) read
    through config.vocabulary_map, which a real Emu3 config carries whole (the tokenizer's vocabulary); the tokens
    equal the stock call's; rows asking for different sizes, or a prompt without size text, are refused."""
    from test_emu3 import BOI, BOS, WRAPPER

    model = build_tiny_emu3()
    model.config.vocabulary_map = {**model.config.vocabulary_map, "3": 9, "*": 10, "4": 11, "2": 12}
    ids, mask = left_padded([[BOS, 5, 6, 7, BOI, 9, 10, 11, WRAPPER], [BOS, 13, BOI, 9, 10, 11, WRAPPER]])
    stock = _transformers_greedy(model, ids, mask, None)  # GRID = (3, 4), the size text
    out = model.generate(ids, attention_mask=mask, custom_generate=custom_generate_path(), trust_remote_code=True,
                         max_new_tokens=IMAGE_LENGTH, do_sample=False, guidance_scale=CFG, pad_token_id=PAD,
                         eos_token_id=EOS, mode="sjd", window=16)
    assert torch.equal(out, torch.cat([ids, stock], 1))
    ids, mask = left_padded([[BOS, 5, BOI, 9, 10, 11, WRAPPER], [BOS, 5, BOI, 12, 10, 11, WRAPPER]])
    with pytest.raises(ValueError, match=r"different sizes \[\(2, 4\), \(3, 4\)\]"):
        model.generate(ids, attention_mask=mask, custom_generate=custom_generate_path(), trust_remote_code=True)
    ids, mask = left_padded([[BOS, 5, BOI, 9, 10, WRAPPER]])  # "3*": no width
    with pytest.raises(ValueError, match=r"read '3\*'.*grid=\(H, W\)"):
        model.generate(ids, attention_mask=mask, custom_generate=custom_generate_path(), trust_remote_code=True)


def _first_token_counts(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.bincount(tokens.long(), minlength=vocab).double()


def _chi2_against(counts: torch.Tensor, law: torch.Tensor) -> None:
    """Chi-square goodness of fit at alpha 1e-4 over the cells with positive law (none observed elsewhere)."""
    support = law > 0
    assert counts[~support].sum() == 0
    n = counts.sum()
    stat = ((counts[support] - n * law[support]) ** 2 / (n * law[support])).sum().item()
    assert stat < chi2.ppf(1 - 1e-4, int(support.sum()) - 1), stat


def test_emu3_sampled_first_image_token_has_the_stock_law(emu3):
    """2 000 rows of one prompt, top-k 5, temperature 1, CFG with the negative prompt: the stock call's processed
    scores of the first step (output_scores) give the law; csd's sjd through custom_generate is chi-square tested
    against it (4 df at alpha 1e-4; the stock law puts >= 0.05 on each of the 5 tokens)."""
    ids, mask = left_padded(PROMPTS[:1])
    negative = torch.tensor([NEGATIVE])
    visual = emu3.model.vocabulary_mapping.image_tokens
    stock = emu3.generate(ids, attention_mask=mask, max_new_tokens=1, do_sample=True, top_k=5, guidance_scale=CFG,
                          negative_prompt_ids=negative, prefix_allowed_tokens_fn=lambda b, x: visual,
                          pad_token_id=PAD, eos_token_id=EOS, output_scores=True, return_dict_in_generate=True)
    law = torch.softmax(stock.scores[0][0].double(), -1)
    rows = 2000
    out = _emu3_custom(emu3, ids.expand(rows, -1), mask.expand(rows, -1), negative, max_new_tokens=1,
                       do_sample=True, top_k=5, mode="sjd", window=5, seed=7)
    _chi2_against(_first_token_counts(out[:, -1], law.shape[0]), law)


# ----------------------------------------------------------------------------------------------------------------------
# Chameleon in the Lumina-mGPT layout
# ----------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def chameleon():
    """conftest's tiny Chameleon but with its IMGIMG vocabulary outside the Lumina layout's code range (ids 56..63):
    transformers' Chameleon.forward masks those ids, so its stock generate could not emit codes 8..15 otherwise."""
    from conftest import _seeded
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    cfg = ChameleonConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.3,
        vq_config=dict(embed_dim=8, num_embeddings=32, latent_channels=32, base_channels=32, channel_multiplier=[1, 1],
                       num_res_blocks=1, resolution=16, attn_resolutions=[]),
        vocabulary_map={f"IMGIMG{chr(65 + i)}Z": 56 + i for i in range(8)})
    return _seeded(lambda: ChameleonForConditionalGeneration(cfg), 1)


LUMINA_PROMPTS = torch.tensor([[1, 5, 6], [1, 7, 9], [1, 3, 2]])
L_HEIGHT, L_WIDTH = LUMINA_KW["grid"]
PREFIX = [LUMINA_KW["image_start_token_id"], LUMINA_KW["size_token_offset"] + L_HEIGHT // 2,
          LUMINA_KW["size_token_offset"] + L_WIDTH // 2]
LUMINA_LENGTH = 3 + L_HEIGHT * (L_WIDTH + 1) + 1


class LuminaCFG(LogitsProcessor):
    """Lumina-mGPT's image-start-triggered CFG (inference_solver.py): once the image start and the two size tokens
    are in, mix u + s·(c − u) with u the model's logits on the image part alone (from the image start on)."""

    def __init__(self, model, scale):
        self.model, self.scale = model, scale

    def __call__(self, input_ids, scores):
        start = (input_ids == PREFIX[0]).int().argmax(1)
        if not (input_ids == PREFIX[0]).any(1).all() or input_ids.shape[1] - int(start[0]) < 3:
            return scores
        uncond = torch.stack([self.model(input_ids=row[int(s):][None]).logits[0, -1]
                              for row, s in zip(input_ids, start)])
        return uncond + self.scale * (scores - uncond)


def _lumina_allowed(prompt_length):
    start, end = LUMINA_KW["image_token_range"]

    def allowed(batch_id, input_ids):
        k = input_ids.shape[0] - prompt_length  # new tokens so far
        if k < 3:
            return [PREFIX[k]]
        body = k - 3
        if body == L_HEIGHT * (L_WIDTH + 1):
            return [LUMINA_KW["image_end_token_id"]]
        if body % (L_WIDTH + 1) == L_WIDTH:
            return [LUMINA_KW["row_end_token_id"]]
        return list(range(start, end))
    return allowed


def _lumina_stock(model, prompts, scale, **kwargs):
    return model.generate(prompts, max_new_tokens=LUMINA_LENGTH, prefix_allowed_tokens_fn=_lumina_allowed(
        prompts.shape[1]), logits_processor=LogitsProcessorList([LuminaCFG(model, scale)]), pad_token_id=0, **kwargs)


def _lumina_custom(model, prompts, **kwargs):
    return model.generate(prompts, custom_generate=custom_generate_path(), trust_remote_code=True,
                          max_new_tokens=LUMINA_LENGTH, **LUMINA_KW, **kwargs)


@pytest.mark.parametrize("mode, window", [("sjd", 16), ("csd", 5)])
def test_chameleon_lumina_greedy_custom_generate_is_the_stock_generate(chameleon, mode, window):
    stock = _lumina_stock(chameleon, LUMINA_PROMPTS, 3.0, do_sample=False)
    out = _lumina_custom(chameleon, LUMINA_PROMPTS, do_sample=False, guidance_scale=3.0, mode=mode, window=window)
    assert stock.shape == (3, 3 + LUMINA_LENGTH) and torch.equal(out, stock)


def test_chameleon_lumina_sampled_first_image_token_has_the_stock_law(chameleon):
    """The first code (new token 3, after the forced image prefix) of 2 000 rows, temperature 1, top-k 6, CFG 3: the
    stock call's processed scores at that step give the law (5 df at alpha 1e-4)."""
    prompt = LUMINA_PROMPTS[:1]
    stock = _lumina_stock(chameleon, prompt, 3.0, do_sample=True, top_k=6, output_scores=True,
                          return_dict_in_generate=True)
    law = torch.softmax(stock.scores[3][0].double(), -1)
    rows = 2000
    out = _lumina_custom(chameleon, prompt.expand(rows, -1), do_sample=True, top_k=6, guidance_scale=3.0, mode="sjd",
                         window=5, seed=3)
    _chi2_against(_first_token_counts(out[:, prompt.shape[1] + 3], law.shape[0]), law)


# ----------------------------------------------------------------------------------------------------------------------
# Janus' image mode
# ----------------------------------------------------------------------------------------------------------------------
JANUS_PROMPTS = torch.tensor([[JANUS_BOS, 5, 6, 7, JANUS_BOI], [JANUS_BOS, 9, 10, 11, JANUS_BOI]])


@pytest.mark.parametrize("mode, window", [("sjd", 16), ("csd", 5)])
def test_janus_greedy_generate_image_is_the_stock_image_mode(tiny_janus, mode, window):
    stock = janus_image_generate(tiny_janus, JANUS_PROMPTS, do_sample=False, guidance_scale=2.0)
    out = janus_generate_image(tiny_janus, JANUS_PROMPTS, attention_mask=torch.ones_like(JANUS_PROMPTS),
                               generation_mode="image", do_sample=False, guidance_scale=2.0, mode=mode, window=window)
    assert out.shape == stock.shape and torch.equal(out, stock)


def test_janus_sampled_first_image_token_has_the_stock_law(tiny_janus):
    """Two-sample chi-square (alpha 1e-4) of the first image token: 3 000 stock samples (transformers' image mode,
    do_sample, temperature 1, CFG 2) against 3 000 of sjd through janus_generate_image; the tiny model's law has
    mass on all 32 codes, cells below 5 expected are pooled."""
    rows = 3000
    prompt = JANUS_PROMPTS[:1].expand(rows, -1)
    torch.manual_seed(0)
    stock = janus_image_generate(tiny_janus, prompt, do_sample=True, guidance_scale=2.0, max_new_tokens=1)[:, 0]
    ours = janus_generate_image(tiny_janus, prompt, attention_mask=torch.ones_like(prompt), do_sample=True,
                                guidance_scale=2.0, mode="sjd", window=5, seed=11)[:, 0]
    a, b = _first_token_counts(stock, 32), _first_token_counts(ours, 32)
    keep = (a + b) >= 10
    a = torch.cat([a[keep], a[~keep].sum()[None]]) if (~keep).any() else a[keep]
    b = torch.cat([b[keep], b[~keep].sum()[None]]) if (~keep).any() else b[keep]
    total = a + b
    expected_a, expected_b = total * a.sum() / total.sum(), total * b.sum() / total.sum()
    stat = (((a - expected_a) ** 2 / expected_a) + ((b - expected_b) ** 2 / expected_b)).sum().item()
    assert stat < chi2.ppf(1 - 1e-4, len(a) - 1), stat


# ----------------------------------------------------------------------------------------------------------------------
# errors and the folder
# ----------------------------------------------------------------------------------------------------------------------
def test_bad_calls_raise_naming_the_argument(emu3, tiny_janus):
    ids, mask = left_padded(PROMPTS)
    with pytest.raises(ValueError, match=r"grid=\(H, W\)"):
        emu3.generate(ids, attention_mask=mask, custom_generate=custom_generate_path(), trust_remote_code=True)
    with pytest.raises(ValueError, match="streamer"):
        _emu3_custom(emu3, ids, mask, streamer=object())
    with pytest.raises(ValueError, match="num_beams"):
        _emu3_custom(emu3, ids, mask, num_beams=2)
    with pytest.raises(TypeError, match="no_such_setting"):
        _emu3_custom(emu3, ids, mask, no_such_setting=1)
    with pytest.raises(ValueError, match="janus_generate_image"):
        tiny_janus.generate(JANUS_PROMPTS, custom_generate=custom_generate_path(), trust_remote_code=True)


def test_the_folder_is_where_transformers_looks():
    import os

    path = custom_generate_path()
    assert os.path.isfile(os.path.join(path, "custom_generate", "generate.py"))
