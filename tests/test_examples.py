"""The examples/ loops (another decoder calling the op) run, and hold the properties their decoders promise.

Tiny random-config models built by the examples themselves; nothing downloads.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch
from conftest import janus_image_generate

pytestmark = pytest.mark.usefixtures("one_thread")
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def text():
    return _load("text_speculative")


@pytest.fixture(scope="module")
def janus():
    return _load("janus_jacobi")


@pytest.fixture(scope="module")
def llama_pair(text):
    target = text.tiny_llama(97, layers=4, seed=0)
    return target, text.early_exit_draft(target, layers=2)


PROMPT = torch.tensor([[1, 17, 42, 5]])


# ---------------------------------------------------------------------------------------------------------------------
# Text: a transformers draft / target pair through chain_speculative_sampling
# ---------------------------------------------------------------------------------------------------------------------
def test_text_greedy_equals_the_targets_own_greedy_decoding(text, llama_pair):
    target, draft = llama_pair
    tokens, calls, _ = text.speculative_generate(target, draft, PROMPT, 12, n_draft=3, temperature=0)
    expected = PROMPT
    for _ in range(12):
        expected = torch.cat([expected, target(expected).logits[:, -1:].argmax(-1)], 1)
    assert torch.equal(tokens, expected)
    assert calls < 12  # the early-exit draft agrees with the target on some argmaxes


def test_text_a_draft_equal_to_the_target_is_always_accepted(text, llama_pair):
    target, _ = llama_pair
    tokens, calls, accepted = text.speculative_generate(target, target, PROMPT, 12, n_draft=3, seed=1)
    assert accepted == [3] * calls and calls == math.ceil(12 / 4) and tokens.shape == (1, 16)


def test_text_top_k_masks_are_respected(text, llama_pair):
    """top-k masks logits with −inf before the softmax: every emitted token is in the target's top k there."""
    target, draft = llama_pair
    tokens, _, _ = text.speculative_generate(target, draft, PROMPT, 16, n_draft=4, top_k=3, seed=2)
    logits = target(tokens).logits[0, PROMPT.shape[1] - 1:-1]  # the target's logits for each generated token
    top = torch.topk(logits, 3, dim=-1).indices
    assert (top == tokens[0, PROMPT.shape[1]:, None]).any(-1).all()


# ---------------------------------------------------------------------------------------------------------------------
# Janus: the CSD authors' loop shape (CFG rows, Jacobi window, cache crop) through verify
# ---------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def janus_model(janus):
    return janus.tiny_janus()


JANUS_PROMPT = torch.tensor([[1, 5, 6, 7, 60]])


def test_janus_greedy_equals_transformers_image_generation(janus, janus_model):
    janus_model.generation_config.generation_kwargs = {"boi_token_id": 60}
    janus_model.generation_config.pad_token_id, janus_model.generation_config.bos_token_id = 0, 1
    expected = janus_image_generate(janus_model, JANUS_PROMPT, do_sample=False, guidance_scale=2.0)
    for rule in ("strict", "csd"):
        tokens, calls = janus.jacobi_generate(janus_model, JANUS_PROMPT, bos=1, boi=60, pad=0, cfg_scale=2.0,
                                              temperature=0, window=5, rule=rule)
        assert torch.equal(tokens, expected), rule
        assert calls <= 16


def test_janus_sampling_is_seeded_and_in_range(janus, janus_model):
    runs = [janus.jacobi_generate(janus_model, JANUS_PROMPT, bos=1, boi=60, pad=0, window=6, seed=s) for s in (3, 3, 4)]
    (tokens, calls), again, other = runs
    assert tokens.shape == (1, 16) and 0 <= int(tokens.min()) and int(tokens.max()) < 32
    assert torch.equal(tokens, again[0]) and calls == again[1]
    assert not torch.equal(tokens, other[0])
    assert 1 <= calls <= 16
