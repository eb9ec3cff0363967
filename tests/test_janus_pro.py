"""Janus-Pro as deepseek-ai releases it (MultiModalityCausalLM, csd_kernels.models.load_janus_pro): the tiny
checkpoint deepseek's own code saved, in each of its layouts, against deepseek's own generation code.

Golden values come from tests/fixtures/janus_pro/golden.pt, written by scripts/upstream/janus_pro_fixtures.py with
deepseek-ai/Janus' ``janus`` package (transformers 4.57) and generation_inference.py's ``generate`` (greedy). The
checkpoints are rebuilt here from their seed (tests/janus_pro_tiny.py) in the layout deepseek's save_pretrained
wrote, and checked against the digests it recorded. CPU only.
"""

from __future__ import annotations

import json
from pathlib import Path

import janus_pro_tiny as tiny
import numpy as np
import pytest
import torch

from csd_kernels import cli, zoo
from csd_kernels.decoding import MODES, generate
from csd_kernels.models import JanusAdapter, get_adapter, load_janus_pro
from csd_kernels.models.janus.checkpoint import janus_original_config

pytestmark = pytest.mark.usefixtures("one_thread")

GOLDEN = torch.load(Path(__file__).parent / "fixtures" / "janus_pro" / "golden.pt")
LAYOUTS = sorted(tiny.LAYOUTS)


def _weights(layout: str = "safetensors") -> dict:
    return tiny.seeded_weights({n: t["shape"] for n, t in GOLDEN["layouts"][layout]["tensors"].items()})


def _write(path: Path, layout: str, config=None, weights=None) -> Path:
    fx = GOLDEN["layouts"][layout]
    weight_map = None if fx["index"] is None else fx["index"]["weight_map"]
    return tiny.write_checkpoint(path, config or fx["config"], weights or _weights(layout), weight_map, layout)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("janus_pro")
    return {layout: _write(root / layout, layout) for layout in LAYOUTS}


@pytest.fixture(scope="module")
def models(checkpoints) -> dict:
    return {layout: load_janus_pro(path, dtype=torch.float32) for layout, path in checkpoints.items()}


def _adapter(model) -> JanusAdapter:
    return JanusAdapter(model, bos_token_id=tiny.BOS, boi_token_id=tiny.BOI, pad_token_id=tiny.PAD)


def _left_padded(prompts):
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[tiny.PAD] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


# ----------------------------------------------------------------------------------------------------------------------
# the checkpoints under test are deepseek's
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
def test_rebuilt_checkpoint_is_the_one_deepseek_wrote(layout, checkpoints):
    fx = GOLDEN["layouts"][layout]
    path = checkpoints[layout]
    assert sorted(p.name for p in path.iterdir()) == fx["files"]
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "multi_modality" and config["architectures"] == ["MultiModalityCausalLM"]
    seen = {}
    for file in path.iterdir():
        if file.suffix in (".bin", ".safetensors"):
            from safetensors.torch import load_file

            tensors = load_file(str(file)) if file.suffix == ".safetensors" else torch.load(file, weights_only=True)
            seen.update({name: (t, file.name) for name, t in tensors.items()})
    assert sorted(seen) == sorted(fx["tensors"])
    for name, (tensor, file) in seen.items():
        assert tiny.tensor_digest(tensor) == fx["tensors"][name]["digest"] and file == fx["tensors"][name]["file"]


# ----------------------------------------------------------------------------------------------------------------------
# against deepseek's own code
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
def test_image_logits_match_deepseek(layout, models):
    """The generation head's logits along deepseek's greedy trajectory, cond and uncond rows, every step."""
    adapter = _adapter(models[layout])
    for prompt, golden in zip(tiny.PROMPTS, GOLDEN["generate"]):
        adapter.prefill(torch.tensor([prompt]), None, cfg=True)
        tokens = golden["tokens"]  # [1, H*W]
        cond, uncond = adapter.forward(torch.cat([torch.zeros_like(tokens[:, :1]), tokens[:, :-1]], 1), -1)
        expected = golden["logits"]  # [steps, 2, V]: deepseek's rows 0::2 cond, 1::2 uncond
        torch.testing.assert_close(cond[0], expected[:, 0], atol=5e-5, rtol=0)
        torch.testing.assert_close(uncond[0], expected[:, 1], atol=5e-5, rtol=0)


def test_greedy_tokens_match_deepseek_in_every_mode(models):
    adapter = _adapter(models["safetensors"])
    ids, mask = _left_padded(tiny.PROMPTS)  # two prompts of different length: a left-padded batch
    expected = torch.cat([g["tokens"] for g in GOLDEN["generate"]])
    for mode in MODES:
        out = generate(adapter, ids, attention_mask=mask, mode=mode, window=5, cfg_scale=GOLDEN["cfg"],
                       temperature=0)
        assert torch.equal(out.tokens, expected), mode


def test_cfg_rows_are_deepseeks(models):
    """deepseek interleaves cond/uncond rows and pads positions 1..L-2 of the uncond row (no attention mask); the
    adapter stacks [cond; uncond] and keeps BOS and <begin_of_image>: the same rows for prompts that start with BOS
    and end with the image-start tag."""
    adapter = _adapter(models["safetensors"])
    for prompt, golden in zip(tiny.PROMPTS, GOLDEN["generate"]):
        rows, mask = adapter._prompt_rows(torch.tensor([prompt]), None, True)
        assert mask is None and torch.equal(rows, golden["rows"])  # [cond, uncond] = deepseek's rows 0 and 1


def test_vq_decode_and_pixels(models):
    """VQ decode equals deepseek's; pixels: the package rounds (x + 1) * 127.5, deepseek truncates
    clip((x + 1) / 2 * 255) to uint8, so they differ by at most 1 per channel (and only where rounding goes up)."""
    model = models["bin_shards"]
    for golden in GOLDEN["generate"]:
        decoded = model.decode_image_tokens(golden["tokens"]).permute(0, 3, 1, 2)  # [1, 3, H, W]
        torch.testing.assert_close(decoded, golden["decoded"], atol=1e-5, rtol=0)
        ours = _adapter(model).decode(golden["tokens"])[0].int()  # [H, W, 3]
        theirs = golden["pixels"].int()
        diff = ours - theirs
        assert diff.min() >= 0 and diff.max() <= 1
        x = golden["decoded"][0].permute(1, 2, 0).double()
        assert torch.equal(theirs, ((x + 1) / 2 * 255).clamp(0, 255).floor().int())  # deepseek: truncation
        assert 0.2 < diff.float().mean() < 0.8  # about half the channels round up


def test_understanding_tower_and_vq_encoder_match_deepseek(models):
    """The SigLIP tower + aligner (qkv split, pos_embed, post-norm) and the VQ encoder (conv_blocks -> down, mid)."""
    model = models["bin"]
    with torch.no_grad():
        features = model.model.get_image_features(GOLDEN["image"]).pooler_output
        encoded = model.model.vqmodel.quant_conv(model.model.vqmodel.encoder(GOLDEN["image"]))
    torch.testing.assert_close(features, GOLDEN["understanding_features"], atol=1e-5, rtol=0)
    torch.testing.assert_close(encoded, GOLDEN["vq_encoded"], atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------------------------------------------------
# conversion rules
# ----------------------------------------------------------------------------------------------------------------------
def test_every_parameter_comes_from_the_checkpoint(models):
    weights = _weights()
    model = models["safetensors"]
    assert not model.config.tie_word_embeddings and not model.training
    assert torch.equal(model.lm_head.weight, weights["language_model.lm_head.weight"])
    assert not torch.equal(model.lm_head.weight, model.model.language_model.embed_tokens.weight)
    assert model.model.language_model.rotary_emb.inv_freq.dtype == torch.float32
    qkv = weights["vision_model.vision_tower.blocks.1.attn.qkv.weight"]
    attn = model.model.vision_model.encoder.layers[1].self_attn
    assert torch.equal(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]), qkv)
    assert torch.equal(model.model.generation_aligner.hidden_layers[0].weight, weights["gen_aligner.layers.2.weight"])
    loaded = sum(p.numel() for p in model.parameters())
    ignored = sum(t.numel() for n, t in weights.items() if ".attn_pool." in n or n.endswith("codebook_used"))
    assert loaded == sum(t.numel() for t in weights.values()) - ignored  # every other stored number, once


def test_dtype_defaults_to_the_config_and_is_one_for_the_whole_model(tmp_path):
    """The releases say torch_dtype bfloat16: every parameter in it, RoPE frequencies kept in float32."""
    config = dict(GOLDEN["layouts"]["safetensors"]["config"], torch_dtype="bfloat16")
    config.pop("dtype", None)
    model = load_janus_pro(_write(tmp_path / "bf16", "safetensors", config))
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.model.language_model.rotary_emb.inv_freq.dtype == torch.float32
    adapter = _adapter(model)
    golden = GOLDEN["generate"][0]
    adapter.prefill(torch.tensor([tiny.PROMPTS[0]]), None, cfg=True)
    cond, _ = adapter.forward(torch.cat([torch.zeros_like(golden["tokens"][:, :1]), golden["tokens"][:, :-1]], 1), -1)
    torch.testing.assert_close(cond[0].float(), golden["logits"][:, 0], atol=0.25, rtol=0)  # bf16; |logits| <= 8


def test_missing_language_fields_take_llama_defaults():
    """deepseek builds LlamaConfig(**language_config): a field the release leaves out is transformers 4.x's default."""
    fx = GOLDEN["layouts"]["safetensors"]
    stored = {n: torch.empty(t["shape"], device="meta") for n, t in fx["tensors"].items()}
    config = dict(fx["config"], language_config={"vocab_size": 102400, "max_position_embeddings": 16384,
                                                  "num_hidden_layers": 30, "torch_dtype": "bfloat16"})
    text = janus_original_config(config, stored).text_config
    assert (text.hidden_size, text.intermediate_size, text.num_attention_heads, text.num_key_value_heads) == \
        (4096, 11008, 32, 32)
    assert text.rms_norm_eps == 1e-6 and text.rope_parameters["rope_theta"] == 10000.0
    assert (text.num_hidden_layers, text.vocab_size) == (30, 102400) and not text.tie_word_embeddings


@pytest.mark.parametrize("mutate, message", [
    (lambda c, w: w.pop("gen_head.vision_head.weight"),
     r"missing tensors: model\.generation_head\.vision_head\.weight \[64, 32\]"),
    (lambda c, w: w.update({"gen_head.extra.weight": torch.ones(2)}),
     r"unknown tensors: gen_head\.extra\.weight \[2\]"),
    (lambda c, w: w.update({"gen_embed.weight": torch.ones(65, 8)}),
     r"shapes no rule converts: gen_embed\.weight \[65, 8\] \(expected model\.generation_embeddings\.weight \[64, 8\]"),
    (lambda c, w: w.update({"vision_model.vision_tower.blocks.0.attn.qkv.weight": torch.ones(96, 31)}),
     r"blocks\.0\.attn\.qkv\.weight \[96, 31\] \(expected .*q_proj\.weight \[32, 32\]"),
    (lambda c, w: c["gen_vision_config"].update(cls="VQ-8"), r"gen_vision_config\.cls 'VQ-8'"),
    (lambda c, w: c["vision_config"]["params"].update(model_name="siglip_base"), r"model_name 'siglip_base'"),
    (lambda c, w: c["language_config"].update(rope_scaling={"type": "linear", "factor": 2.0}), r"rope_scaling"),
    (lambda c, w: c["language_config"].update(tie_word_embeddings=True), r"tie_word_embeddings"),
    (lambda c, w: c["language_config"].update(sliding_window=4),
     r"unknown language_config fields \['sliding_window'\]"),
    (lambda c, w: c.update(model_type="janus"), r"model_type 'janus' is not deepseek's"),
    (lambda c, w: c["gen_head_config"]["params"].update(image_token_embed=16), r"gen_aligner n_embed 32 != gen_head"),
])
def test_bad_checkpoints_raise_one_clear_error(tmp_path, mutate, message):
    config, weights = json.loads(json.dumps(GOLDEN["layouts"]["safetensors"]["config"])), _weights()
    mutate(config, weights)
    path = _write(tmp_path / "bad", "safetensors", config, weights)
    with pytest.raises(ValueError, match=message):
        load_janus_pro(path)


def test_missing_files_raise_one_clear_error(tmp_path, checkpoints):
    import shutil

    with pytest.raises(ValueError, match="not a directory"):
        load_janus_pro(tmp_path / "nowhere")
    sharded = tmp_path / "sharded"
    shutil.copytree(checkpoints["bin_shards"], sharded)
    next(sharded.glob("pytorch_model-00003-*.bin")).unlink()
    with pytest.raises(ValueError, match="shards named in pytorch_model.bin.index.json are missing"):
        load_janus_pro(sharded)
    truncated = tmp_path / "truncated"
    shutil.copytree(checkpoints["bin"], truncated)
    (truncated / "pytorch_model.bin").write_bytes((truncated / "pytorch_model.bin").read_bytes()[:1000])
    with pytest.raises(ValueError, match="pytorch_model.bin: cannot read tensors"):
        load_janus_pro(truncated)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text(json.dumps(GOLDEN["layouts"]["bin"]["config"]))
    with pytest.raises(ValueError, match="no model.safetensors, pytorch_model.bin"):
        load_janus_pro(empty)


# ----------------------------------------------------------------------------------------------------------------------
# the command line on the original layout
# ----------------------------------------------------------------------------------------------------------------------
def _tokenizer_files(path: Path) -> None:
    """A word-level tokenizer over the tiny vocabulary with deepseek's processor_config.json tags."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = [":", "a", "red", "fox", "in", "the", "snow", "<|User|>", "<|Assistant|>"]
    vocab = {"<pad>": tiny.PAD, "<bos>": tiny.BOS, "<unk>": 59, "<begin_of_image>": tiny.BOI}
    vocab.update({word: 3 + i for i, word in enumerate(words)})
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", tiny.BOS)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<bos>", pad_token="<pad>", unk_token="<unk>")
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|User|>", "<|Assistant|>", "<begin_of_image>"]})
    tokenizer.save_pretrained(path)
    (path / "processor_config.json").write_text(json.dumps({"pad_tag": "<pad>", "image_start_tag": "<begin_of_image>",
                                                            "sft_format": "deepseek", "num_image_tokens": 16}))


def test_cli_runs_the_original_layout_without_a_default_size_model(tmp_path, monkeypatch):
    from transformers import JanusForConditionalGeneration

    path = _write(tmp_path / "ckpt", "bin_shards")
    _tokenizer_files(path)
    built = []
    init = JanusForConditionalGeneration.__init__

    def recording_init(self, config, *args, **kwargs):
        built.append(config.text_config.hidden_size)
        if config.text_config.hidden_size != tiny.HIDDEN:  # fail here rather than be killed for memory
            raise AssertionError(f"a Janus of hidden size {config.text_config.hidden_size} was built")
        init(self, config, *args, **kwargs)

    monkeypatch.setattr(JanusForConditionalGeneration, "__init__", recording_init)
    zoo.load.cache_clear()
    out = tmp_path / "out"
    argv = ["generate", "--model", "janus-pro", "--weights", str(path), "--prompt", "a red fox in the snow",
            "--num", "2", "--window", "4", "--dtype", "float32", "--device", "cpu", "--quiet", "--out", str(out)]
    try:
        assert cli.main(argv) == 0
        assert built == [tiny.HIDDEN]  # one model, the tiny one (never transformers' default-size Janus)
        entry = zoo.load("janus-pro", device="cpu", weights=str(path), dtype="float32")
    finally:
        zoo.load.cache_clear()
    side = tiny.IMAGE_SIZE
    from PIL import Image

    assert np.asarray(Image.open(out / "img_001.png")).shape == (side, side, 3)
    stats = json.loads((out / "stats.json").read_text())
    assert stats["parameters"]["cfg_scale"] == 5.0 and stats["tokens_per_image"] == tiny.GRID ** 2
    adapter = get_adapter(entry.model)  # the ids came from the folder's tokenizer and processor_config.json
    assert (adapter.bos_token_id, adapter.boi_token_id, adapter.pad_token_id) == (tiny.BOS, tiny.BOI, tiny.PAD)


def test_cli_refuses_a_foreign_folder(tmp_path, capsys):
    path = _write(tmp_path / "ckpt", "safetensors", weights={k: v for k, v in _weights().items()
                                                             if not k.startswith("gen_head.")})
    zoo.load.cache_clear()
    argv = ["generate", "--model", "janus-pro", "--weights", str(path), "--prompt", "a fox", "--device", "cpu",
            "--quiet", "--out", str(tmp_path / "out")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "missing tensors: model.generation_head" in err, err
