"""Model adapters (csd_kernels.models) driven by csd_kernels.generate: Janus, Lumina-mGPT on Chameleon, ImageGPT.

CPU, tiny random-config models from conftest.py; no downloads.
"""

from __future__ import annotations

import pytest
import torch
from conftest import JANUS_BOI, JANUS_BOS, LUMINA_KW, build_tiny_llama, janus_image_generate

from csd_kernels.decoding import MODES, generate
from csd_kernels.models import ImageGPT, JanusAdapter, LuminaMGPT, get_adapter

# tiny matmuls: thread hand-off costs more than the work on a shared 2-core machine
pytestmark = pytest.mark.usefixtures("one_thread")


JANUS_PROMPTS = torch.tensor([[JANUS_BOS, 5, 6, 7, JANUS_BOI], [JANUS_BOS, 9, 10, 11, JANUS_BOI],
                              [JANUS_BOS, 12, 13, 3, JANUS_BOI]])
LUMINA_PROMPTS = torch.tensor([[1, 5, 6], [1, 7, 9], [1, 3, 2]])


def _check_output(out, batch, grid, vocab):
    h, w = grid
    assert out.tokens.shape == (batch, h * w) and out.tokens.dtype == torch.int64
    assert int(out.tokens.min()) >= 0 and int(out.tokens.max()) < vocab
    for name in ("entropy_map", "accept_map", "distortion_map", "tvd_map"):
        assert getattr(out, name).shape == (batch, h, w)
    assert sum(sum(a) for a in out.accepted) == batch * h * w


# ----------------------------------------------------------------------------------------------------------------------
# Janus
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("batch", [1, 3])
def test_janus_greedy_matches_transformers_generate(tiny_janus, batch):
    prompts = JANUS_PROMPTS[:batch]
    expected = janus_image_generate(tiny_janus, prompts, do_sample=False, guidance_scale=2.0)
    for mode in MODES:
        out = generate(tiny_janus, prompts, mode=mode, window=5, cfg_scale=2.0, temperature=0)
        assert torch.equal(out.tokens, expected), mode


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("mode", MODES)
def test_janus_every_mode_end_to_end(tiny_janus, forward_counter, mode, batch):
    counter = forward_counter(tiny_janus.model.language_model)
    out = generate(tiny_janus, JANUS_PROMPTS[:batch], mode=mode, window=6, cfg_scale=3.0, seed=4)
    _check_output(out, batch, (4, 4), 32)
    assert out.prefill_passes == 1 and counter.calls == out.forward_passes + 1
    assert out.images.dtype == torch.uint8 and out.images.shape == (batch, 8, 8, 3)


def test_janus_unconditional_rows_like_transformers(tiny_janus):
    adapter = JanusAdapter(tiny_janus)
    assert adapter.grid == (4, 4) and adapter.vocab_size == 32
    ids, _ = adapter._prompt_rows(JANUS_PROMPTS[:1], None, cfg=True)
    assert ids.tolist() == [[JANUS_BOS, 5, 6, 7, JANUS_BOI], [JANUS_BOS, 0, 0, 0, JANUS_BOI]]


# ----------------------------------------------------------------------------------------------------------------------
# Lumina-mGPT on Chameleon
# ----------------------------------------------------------------------------------------------------------------------
def _naive_lumina_greedy(model, prompt: list[int], cfg_scale: float) -> list[int]:
    """No cache, no padding: rebuild [prompt, prefix, rows with row ends] each step; CFG rows = [prefix, ...]."""
    height, width = LUMINA_KW["grid"]
    start, end = LUMINA_KW["image_token_range"]
    # Lumina-mGPT's size tokens count 32-pixel patches: half the token grid
    prefix = [LUMINA_KW["image_start_token_id"], LUMINA_KW["size_token_offset"] + height // 2,
              LUMINA_KW["size_token_offset"] + width // 2]
    head = model.lm_head.weight[start:end]
    codes: list[int] = []
    for _ in range(height * width):
        image = []
        for i, c in enumerate(codes):
            image.append(start + c)
            if i % width == width - 1:
                image.append(LUMINA_KW["row_end_token_id"])
        cond = model.model(input_ids=torch.tensor([prompt + prefix + image])).last_hidden_state[0, -1] @ head.T
        uncond = model.model(input_ids=torch.tensor([prefix + image])).last_hidden_state[0, -1] @ head.T
        codes.append(int((uncond + cfg_scale * (cond - uncond)).argmax()))
    return codes


@torch.no_grad()
def test_lumina_greedy_matches_uncached_reference(tiny_chameleon):
    adapter = LuminaMGPT(tiny_chameleon, **LUMINA_KW)
    expected = [_naive_lumina_greedy(tiny_chameleon, p.tolist(), 3.0) for p in LUMINA_PROMPTS]
    for mode in MODES:
        out = generate(adapter, LUMINA_PROMPTS, mode=mode, window=5, cfg_scale=3.0, temperature=0)
        assert out.tokens.tolist() == expected, mode


def test_lumina_row_end_tokens_in_place(tiny_chameleon, forward_counter):
    adapter = LuminaMGPT(tiny_chameleon, **LUMINA_KW)
    fed = []
    handle = tiny_chameleon.model.register_forward_pre_hook(lambda mod, args, kw: fed.append(kw["input_ids"][0]),
                                                            with_kwargs=True)
    try:
        out = generate(adapter, LUMINA_PROMPTS[:1], mode="ar", cfg_scale=1.0, seed=0)
    finally:
        handle.remove()
    seq = out.sequences[0].tolist()
    height, width = LUMINA_KW["grid"]
    assert seq[:3] == [42, 44 + height // 2, 44 + width // 2] and seq[-1] == 43
    body = seq[3:-1]
    assert len(body) == height * (width + 1)
    for r in range(height):
        row = body[r * (width + 1) : (r + 1) * (width + 1)]
        assert row[-1] == 41 and all(8 <= t < 40 for t in row[:-1])
        assert [t - 8 for t in row[:-1]] == out.tokens[0, r * width : (r + 1) * width].tolist()
    # what the model was fed, concatenated, is the prompt + the image sequence up to its last code
    fed_all = torch.cat(fed).tolist()
    assert fed_all == LUMINA_PROMPTS[0].tolist() + seq[: 3 + len(body) - 2]


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("mode", MODES)
def test_lumina_every_mode_end_to_end(tiny_chameleon, forward_counter, mode, batch):
    decoded = []
    adapter = LuminaMGPT(tiny_chameleon, **LUMINA_KW,
                         decode=lambda t: decoded.append(t) or torch.zeros(t.shape[0], 6, 8, 3))
    counter = forward_counter(tiny_chameleon.model)
    out = generate(adapter, LUMINA_PROMPTS[:batch], mode=mode, window=5, cfg_scale=3.0, seed=4)
    _check_output(out, batch, LUMINA_KW["grid"], 32)
    assert counter.calls == out.forward_passes + out.prefill_passes
    assert out.images.shape == (batch, 6, 8, 3) and out.images.dtype == torch.uint8
    assert torch.equal(decoded[0], out.tokens)
    height, width = LUMINA_KW["grid"]
    assert out.sequences.shape == (batch, 3 + height * (width + 1) + 1)


def test_bare_chameleon_gets_the_lumina_adapter(tiny_chameleon):
    # a bare Chameleon model gets Lumina-mGPT's defaults, whose token ids need the real 65536-token vocabulary
    with pytest.raises(ValueError, match="image_token_range"):
        get_adapter(tiny_chameleon)


# ----------------------------------------------------------------------------------------------------------------------
# ImageGPT (LlamaGen-style)
# ----------------------------------------------------------------------------------------------------------------------
def test_image_gpt_wraps_the_digits_model():
    from csd_kernels.zoo.digits import model as digits

    lm = digits.build_lm(seed=0, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=2).eval()
    gpt = ImageGPT(lm, image_token_range=(0, digits.NUM_CODES), grid=digits.GRID, null_token_id=digits.NULL_TOKEN_ID,
                   decode=lambda t: torch.rand(t.shape[0], 32, 32))
    assert get_adapter(gpt) is gpt
    prompts = digits.prompt_ids([3, 7])
    expected = digits.sample_ar(lm, [3, 7], cfg_scale=3.0, temperature=0)
    out = generate(gpt, prompts, mode="csd", window=16, cfg_scale=3.0, temperature=0)
    assert torch.equal(out.tokens, expected)
    assert out.forward_passes < 256
    assert out.images.shape == (2, 32, 32, 3) and out.images.dtype == torch.uint8


def test_image_gpt_left_padded_prompts_equal_unpadded():
    lm = build_tiny_llama(24, seed=5, init=0.5)
    gpt = ImageGPT(lm, image_token_range=(0, 16), grid=(3, 3), null_token_id=23)
    prompts = torch.tensor([[16, 17, 18], [0, 19, 20]])
    mask = torch.tensor([[1, 1, 1], [0, 1, 1]])
    batched = generate(gpt, prompts, attention_mask=mask, mode="sjd", window=4, cfg_scale=2.0, temperature=0)
    first = generate(gpt, prompts[:1], mode="sjd", window=4, cfg_scale=2.0, temperature=0)
    second = generate(gpt, prompts[1:, 1:], mode="sjd", window=4, cfg_scale=2.0, temperature=0)
    assert torch.equal(batched.tokens, torch.cat([first.tokens, second.tokens]))


def test_image_gpt_bad_arguments(tiny_llama):
    with pytest.raises(ValueError, match="image_token_range"):
        ImageGPT(tiny_llama, image_token_range=(0, 99), grid=(2, 2))
    gpt = ImageGPT(tiny_llama, image_token_range=(0, 16), grid=(2, 2))
    with pytest.raises(ValueError, match="null_token_id"):
        generate(gpt, torch.tensor([[16]]), cfg_scale=2.0)
    assert generate(gpt, torch.tensor([[16]]), cfg_scale=1.0, mode="sjd", window=3).tokens.shape == (1, 4)


def _byte_tokenizer(specials):
    """A byte-level BPE tokenizer without merges (any text encodes) with Janus' special tokens, BOS prepended."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(["<pad>", "<bos>"] + specials + sorted(alphabet))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<bos>", pad_token="<pad>")
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    return tokenizer


def test_janus_prompt_is_the_sft_format_of_deepseek_janus():
    """The expected strings are what deepseek-ai/Janus' own conversation code (janus/utils/conversation.py,
    template "deepseek", system prompt "") prints for these turns, followed by its image_start_tag."""
    from csd_kernels.models import janus_prompt
    from csd_kernels.models.janus.adapter import JANUS_ROLES

    tokenizer = _byte_tokenizer(["<|User|>", "<|Assistant|>", "<begin_of_image>"])
    out = janus_prompt(tokenizer, ["A red cube on a table.", "  a cat  "])
    ids, mask = out["input_ids"], out["attention_mask"]
    first = ids[0][mask[0].bool()].tolist()
    assert tokenizer.decode(first) == "<bos><|User|>: A red cube on a table.\n\n<|Assistant|>:<begin_of_image>"
    assert first[0] == tokenizer.bos_token_id and first[-1] == tokenizer.convert_tokens_to_ids("<begin_of_image>")
    second = ids[1][mask[1].bool()].tolist()  # shorter: left-padded, stripped like the SFT template strips turns
    assert tokenizer.decode(second) == "<bos><|User|>: a cat\n\n<|Assistant|>:<begin_of_image>"
    assert mask[1, 0] == 0 and ids[1, 0] == tokenizer.pad_token_id and mask[1, -1] == 1
    plain = janus_prompt(tokenizer, "A red cube on a table.", roles=JANUS_ROLES)["input_ids"][0].tolist()
    assert tokenizer.decode(plain) == "<bos>User: A red cube on a table.\n\nAssistant:<begin_of_image>"


# ----------------------------------------------------------------------------------------------------------------------
# The registry: a family is its folder plus one entry
# ----------------------------------------------------------------------------------------------------------------------
def test_the_registry_reads_without_torch():
    """The names and help come from registry.py alone: loaded by path (no csd_kernels package run), it imports
    neither torch nor transformers, so a torch-free command-line parser can list the models."""
    import pathlib
    import subprocess
    import sys

    from csd_kernels.models import registry

    code = ("import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('registry', {registry.__file__!r})\n"
            "module = importlib.util.module_from_spec(spec); sys.modules['registry'] = module\n"
            "spec.loader.exec_module(module)\n"
            "heavy = sorted(m for m in ('torch', 'transformers', 'numpy', 'csd_kernels') if m in sys.modules)\n"
            "print(','.join(f.name for f in module.FAMILIES), heavy)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["llamagen,lumina-mgpt,janus-pro,emu3,image-gpt", "[]"]
    assert {f.name for f in registry.FAMILIES} >= {"llamagen", "lumina-mgpt", "janus-pro", "emu3"}
    for family in registry.FAMILIES:  # every reference names real code, in the family's own folder
        for ref in filter(None, (family.loader, family.adapter)):
            assert callable(registry.resolve(ref)), (family.name, ref)
            folder = ref.split(":")[0].split(".")[2]
            assert (pathlib.Path(registry.__file__).parent / folder).is_dir(), ref


def test_zoo_and_command_read_the_registry():
    from csd_kernels import zoo
    from csd_kernels.cli import parser
    from csd_kernels.constants import SHIPPED_MODELS
    from csd_kernels.models import registry

    families = [f.name for f in registry.FAMILIES if f.loader is not None]
    assert zoo.MODEL_NAMES == (*SHIPPED_MODELS, *families) and SHIPPED_MODELS.keys() == {"digits", "scenes"}
    help_text = parser.build_parser()._subparsers._group_actions[0].choices["generate"].format_help()
    assert all(name in help_text for name in zoo.MODEL_NAMES)
    with pytest.raises(ValueError, match="unknown model; choose from digits, scenes, llamagen"):
        zoo.load("nothing")


def test_a_new_family_is_one_entry(monkeypatch):
    """A family added to FAMILIES alone is recognised by get_adapter and loaded by the zoo."""
    from csd_kernels import zoo
    from csd_kernels.models import registry

    class ToyForImages:  # a model class no other family knows
        pass

    toy = registry.Family("toy", "a toy", loader=lambda device=None, **options: ("loaded", options),
                          adapter=lambda model: ("adapter of", model), recognises=("ToyForImages",), hint="a toy")
    model = ToyForImages()
    with pytest.raises(ValueError, match="no csd_kernels adapter can drive a ToyForImages: pass a LlamaGen"):
        get_adapter(model)
    monkeypatch.setattr(registry, "FAMILIES", (*registry.FAMILIES, toy))
    assert get_adapter(model) == ("adapter of", model)
    assert registry.family_of(type("Derived", (ToyForImages,), {})()) is toy  # subclasses too, as isinstance would
    monkeypatch.setattr(zoo, "MODELS", (*zoo.MODELS, toy))
    assert zoo.load.__wrapped__("toy", weights="w") == ("loaded", {"weights": "w"})
