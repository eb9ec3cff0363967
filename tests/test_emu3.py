"""Emu3 (csd_kernels.models.emu3) against transformers' own Emu3 image generation on a tiny random config: greedy
tokens of every mode equal ``Emu3ForConditionalGeneration.generate`` with the ``prefix_allowed_tokens_fn`` and
negative-prompt CFG of transformers' Emu3 docs; the loader, the prompt and the command line on a local folder."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from csd_kernels import cli, zoo
from csd_kernels.decoding import MODES, generate
from csd_kernels.models import EMU3_DEFAULTS, Emu3Adapter, emu3_grid, emu3_prompt, get_adapter, load_emu3

pytestmark = pytest.mark.usefixtures("one_thread")

PAD, BOS, EOS = 0, 1, 2
VISUAL = 20  # <|visual token 000000|> .. <|visual token 000031|> = ids 20..51
EOL, EOF, EOI, BOI, WRAPPER, IMAGE = 52, 53, 54, 55, 56, 57
GRID = (3, 4)  # non-square: rows and columns cannot be confused
PROMPTS = [[BOS, 5, 6, 7, 8, BOI, 9, 10, WRAPPER], [BOS, 11, 12, BOI, 9, 10, WRAPPER]]
NEGATIVE = [BOS, 13, 14, 15, 16, 17]
CFG = 3.0


def _vocabulary_map() -> dict:
    vocab = {"<pad>": PAD, "<bos>": BOS, "<eos>": EOS}
    vocab.update({f"<|visual token {i:06d}|>": VISUAL + i for i in range(32)})
    vocab.update({"<|extra_200|>": EOL, "<|extra_201|>": EOF, "<|image end|>": EOI, "<|image start|>": BOI,
                  "<|image token|>": WRAPPER, "<image>": IMAGE})
    return vocab


def build_tiny_emu3():
    """The tiny Emu3 (a plain function as well as the fixture: tests/test_golden.py builds it outside pytest)."""
    from transformers import Emu3Config, Emu3ForConditionalGeneration

    config = Emu3Config(
        text_config=dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, pad_token_id=PAD,
                         bos_token_id=BOS, eos_token_id=EOS, initializer_range=0.3, attention_dropout=0.0),
        vq_config=dict(codebook_size=32, embed_dim=4, latent_channels=4, base_channels=32, channel_multiplier=[1, 1],
                       num_res_blocks=1, attn_resolutions=[], hidden_size=32, num_attention_heads=1),
        vocabulary_map=_vocabulary_map())
    state = torch.random.get_rng_state()
    torch.manual_seed(5)
    try:
        return Emu3ForConditionalGeneration(config).eval()
    finally:
        torch.random.set_rng_state(state)


@pytest.fixture(scope="module")
def tiny_emu3():
    return build_tiny_emu3()


def left_padded(prompts):
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def _transformers_greedy(model, ids, mask, negative) -> torch.Tensor:
    """transformers' Emu3 image generation as its docs show it, greedy: visual tokens only, an end-of-line after
    every row, then end of frame / image / text; CFG through negative_prompt_ids."""
    height, width = GRID
    visual = model.vocabulary_mapping.image_tokens

    def prefix_allowed_tokens_fn(batch_id, input_ids):
        position = torch.nonzero(input_ids == WRAPPER, as_tuple=True)[0][0]
        offset = input_ids.shape[0] - position
        if offset % (width + 1) == 0:
            return (EOL,)
        if offset == (width + 1) * height + 1:
            return (EOF,)
        if offset == (width + 1) * height + 2:
            return (EOI,)
        if offset >= (width + 1) * height + 3:
            return (EOS,)
        return visual

    kwargs = {}
    if negative is not None:
        kwargs = dict(negative_prompt_ids=negative.expand(ids.shape[0], -1),
                      negative_prompt_attention_mask=torch.ones(ids.shape[0], negative.shape[1], dtype=torch.long))
    out = model.generate(ids, attention_mask=mask, max_new_tokens=(width + 1) * height + 3, do_sample=False,
                         guidance_scale=CFG, prefix_allowed_tokens_fn=prefix_allowed_tokens_fn, pad_token_id=PAD,
                         eos_token_id=EOS, **kwargs)
    return out[:, ids.shape[1]:]  # [B, H*(W+1) + 3]


@pytest.mark.parametrize("negative", [NEGATIVE, None], ids=["negative_prompt", "default_uncond"])
def test_greedy_tokens_match_transformers_in_every_mode(tiny_emu3, negative):
    ids, mask = left_padded(PROMPTS)  # two prompts of different length: a left-padded batch
    expected = _transformers_greedy(tiny_emu3, ids, mask, None if negative is None else torch.tensor([negative]))
    adapter = Emu3Adapter(tiny_emu3, GRID, negative_prompt_ids=negative)
    for mode in MODES:
        out = generate(adapter, ids, attention_mask=mask, mode=mode, window=5, cfg_scale=CFG, temperature=0)
        assert torch.equal(out.sequences, expected), mode  # the whole image part: rows, row ends, tail
    assert int((expected[:, :-3] == EOL).sum()) == 2 * GRID[0]


def test_static_loop_and_trees_match_transformers(tiny_emu3):
    """The static loop (per-row cache, the row ends in place) and draft trees (a row end below every node at a row's
    last grid position, models/row_end.py): transformers' greedy tokens too."""
    ids, mask = left_padded(PROMPTS)
    expected = _transformers_greedy(tiny_emu3, ids, mask, torch.tensor([NEGATIVE]))
    adapter = Emu3Adapter(tiny_emu3, GRID, negative_prompt_ids=NEGATIVE)
    for kw in (dict(mode="ar"), dict(mode="csd"), dict(mode="sjd", window=8, tree=(2, 2)),
               dict(mode="sjd", window=12, tree=(3, 2))):
        out = generate(adapter, ids, attention_mask=mask, cfg_scale=CFG, temperature=0, static=True,
                       **{"window": 5, **kw})
        assert torch.equal(out.sequences, expected), kw


def test_layout_and_pixels(tiny_emu3):
    adapter = Emu3Adapter(tiny_emu3, GRID, negative_prompt_ids=NEGATIVE)
    tokens = torch.arange(24).reshape(2, 12) % 32
    sequence = adapter.image_sequence(tokens)
    assert sequence[0].tolist() == [20, 21, 22, 23, EOL, 24, 25, 26, 27, EOL, 28, 29, 30, 31, EOL, EOF, EOI, EOS]
    pixels = tiny_emu3.decode_image_tokens(image_tokens=sequence, height=GRID[0], width=GRID[1])  # [B, 3, h, w]
    images = adapter.decode(tokens)
    assert images.dtype == torch.uint8 and images.shape == (2, pixels.shape[2], pixels.shape[3], 3)
    expected = ((pixels.permute(0, 2, 3, 1).clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    assert torch.equal(images, expected)
    assert adapter.defaults == EMU3_DEFAULTS == dict(cfg_scale=3.0, top_k=2048, temperature=1.0)


def test_grid_and_prompt():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    assert emu3_grid() == (90, 90) and emu3_grid(1024, 512) == (64, 128)
    with pytest.raises(ValueError, match="multiples of 8"):
        emu3_grid(700, 720)
    vocab = {"<pad>": PAD, "<bos>": BOS, "a": 5, "fox": 6, "3": 9, "*": 10, "4": 11, "<unk>": 63,
             "<|image start|>": BOI, "<|image token|>": WRAPPER}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", unk_token="<unk>")
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|image start|>", "<|image token|>", "*"]})
    inputs = emu3_prompt(tokenizer, ["a fox", "fox"], (3, 4))
    assert inputs["input_ids"].tolist() == [[5, 6, BOI, 9, 10, 11, WRAPPER], [PAD, 6, BOI, 9, 10, 11, WRAPPER]]
    assert inputs["attention_mask"].tolist() == [[1] * 7, [0] + [1] * 6]


def test_loader_and_command_line(tiny_emu3, tmp_path, monkeypatch):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    path = tmp_path / "emu3"
    tiny_emu3.save_pretrained(path)
    core = Tokenizer(models.WordLevel(vocab={k: v for k, v in _vocabulary_map().items() if v < 64} | {"<unk>": 63},
                                      unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", unk_token="<unk>").save_pretrained(path)
    adapter = load_emu3(path, grid=GRID, negative_prompt_ids=NEGATIVE, dtype=torch.float32)
    ids, mask = left_padded(PROMPTS)
    expected = _transformers_greedy(tiny_emu3, ids, mask, torch.tensor([NEGATIVE]))
    out = generate(adapter, ids, attention_mask=mask, mode="csd", window=5, cfg_scale=CFG, temperature=0)
    assert torch.equal(out.sequences, expected)
    with pytest.raises(ValueError, match="needs its image grid"):
        get_adapter(tiny_emu3)

    zoo.load.cache_clear()
    out_dir = tmp_path / "out"
    argv = ["generate", "--model", "emu3", "--weights", str(path), "--size", "32x24", "--prompt", "a red fox",
            "--num", "2", "--window", "4", "--dtype", "float32", "--device", "cpu", "--quiet", "--out", str(out_dir)]
    try:
        assert cli.main(argv) == 0
    finally:
        zoo.load.cache_clear()
    from PIL import Image

    assert np.asarray(Image.open(out_dir / "img_000.png")).ndim == 3
    stats = json.loads((out_dir / "stats.json").read_text())
    assert stats["parameters"]["top_k"] == 2048 and stats["tokens_per_image"] == 12


def test_bad_folders_raise_one_clear_error(tiny_emu3, tmp_path, capsys):
    with pytest.raises(ValueError, match="no config.json"):
        load_emu3(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "Emu3", "architectures": ["Emu3ForCausalLM"]}))
    with pytest.raises(ValueError, match="model_type 'Emu3' is not transformers' 'emu3'"):
        load_emu3(other)
    broken = tmp_path / "broken"
    tiny_emu3.save_pretrained(broken)
    from safetensors.torch import load_file, save_file

    weights = load_file(str(broken / "model.safetensors"))
    weights.pop("text_model.lm_head.weight")  # transformers saves Emu3 under the Emu3-*-hf releases' key names
    save_file(weights, str(broken / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"missing tensors \[.*lm_head\.weight"):
        load_emu3(broken)
    zoo.load.cache_clear()
    capsys.readouterr()
    assert cli.main(["generate", "--model", "emu3", "--weights", str(tmp_path / "nowhere"), "--prompt", "a fox",
                     "--device", "cpu", "--quiet", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no such folder" in err
