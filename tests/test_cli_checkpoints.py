"""`csd generate / compare / run` on local checkpoints of the three families, written in their upstream formats
(tiny random weights), and one clear line for every bad --weights."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import llamagen_tiny
import lumina_tiny
import numpy as np
import pytest
import torch
from PIL import Image

from csd_kernels import cli, zoo

pytestmark = pytest.mark.usefixtures("one_thread")

FIXTURES = Path(__file__).parent / "fixtures"
LUMINA_SIZE = "96x64"  # 64 x 96 pixels: the tiny checkpoint's 4 x 6 grid


@pytest.fixture(autouse=True)
def fresh_zoo():
    zoo.load.cache_clear()
    yield
    zoo.load.cache_clear()


@pytest.fixture(scope="module")
def llamagen_files(tmp_path_factory) -> list[str]:
    """A released-layout c2i GPT, its VQ, and a JSON config of the tiny model: the flags of `csd generate`."""
    golden = torch.load(FIXTURES / "llamagen" / "golden.pt")
    root = tmp_path_factory.mktemp("llamagen")
    weights, vq, config = root / "c2i_T.pt", root / "vq_ds2_c2i.pt", root / "gpt_t.json"
    torch.save({"model": llamagen_tiny.seeded_state_dict(golden["layout"]["c2i"])}, weights)
    torch.save({"model": llamagen_tiny.seeded_state_dict(golden["layout"]["vq"])}, vq)
    fields = dict(llamagen_tiny.GPT_CONFIGS["c2i"], vq_config=dict(llamagen_tiny.VQ_CONFIG, ch=llamagen_tiny.VQ_CH),
                  downsample=llamagen_tiny.DOWNSAMPLE)
    config.write_text(json.dumps(fields))
    side = llamagen_tiny.GRID_C2I * llamagen_tiny.DOWNSAMPLE
    return ["--model", "llamagen", "--weights", str(weights), "--config", str(config), "--vq", str(vq),
            "--image-size", str(side)]


@pytest.fixture(scope="module")
def lumina_dir(tmp_path_factory) -> Path:
    """A Lumina-mGPT checkpoint folder as Alpha-VLLM releases it (config, safetensors), with its tokenizer files."""
    fx = json.loads((FIXTURES / "lumina" / "mp1.json").read_text())
    weights = lumina_tiny.seeded_weights({name: t["shape"] for name, t in fx["tensors"].items()}, fx["seed"])
    path = lumina_tiny.write_checkpoint(tmp_path_factory.mktemp("lumina") / "ckpt", fx["config"], weights)
    for file in (FIXTURES / "lumina" / "tokenizer").iterdir():
        shutil.copy(file, path / file.name)
    return path


@pytest.fixture(scope="module")
def janus_dir(tiny_janus, tmp_path_factory) -> Path:
    """A transformers-format Janus folder: the tiny model and a word-level tokenizer over its 64-token vocabulary."""
    from conftest import JANUS_BOI, JANUS_BOS, JANUS_PAD
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = [":", "a", "red", "fox", "in", "the", "snow", "cat", "<|User|>", "<|Assistant|>"]
    vocab = {"<pad>": JANUS_PAD, "<bos>": JANUS_BOS, "<unk>": 59, "<begin_of_image>": JANUS_BOI}
    vocab.update({word: 3 + i for i, word in enumerate(words)})
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<bos>", pad_token="<pad>", unk_token="<unk>")
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|User|>", "<|Assistant|>", "<begin_of_image>"]})
    tokenizer._tokenizer.post_processor = __import__("tokenizers").processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", JANUS_BOS)])
    path = tmp_path_factory.mktemp("janus") / "ckpt"
    tiny_janus.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_llamagen_generate_writes_images(llamagen_files, tmp_path):
    out = tmp_path / "out"
    argv = ["generate", *llamagen_files, "--prompt", "3", "--num", "2", "--window", "4", "--mode", "csd",
            "--device", "cpu", "--quiet", "--out", str(out)]
    assert cli.main(argv) == 0
    side = llamagen_tiny.GRID_C2I * llamagen_tiny.DOWNSAMPLE
    assert np.asarray(Image.open(out / "img_001.png")).shape == (side, side, 3)
    stats = json.loads((out / "stats.json").read_text())
    assert stats["parameters"]["cfg_scale"] == 4.0 and stats["parameters"]["top_k"] == 2000  # sample_c2i.py
    assert stats["tokens_per_image"] == llamagen_tiny.GRID_C2I ** 2


def test_llamagen_greedy_cli_tokens_equal_upstream(llamagen_files, tmp_path):
    """At T = 0 the command's images come from upstream LlamaGen's greedy tokens (fixtures, classes 3 and 7)."""
    golden = torch.load(FIXTURES / "llamagen" / "golden.pt")
    expected = golden["c2i"]["tokens"]  # [2, 36]: upstream generate(sample_logits=False) for classes 3, 7
    entry = zoo.load("llamagen", device="cpu", **dict(zip(["weights", "config", "vq", "image_size"],
                                                              llamagen_files[3::2])))
    out = __import__("csd_kernels").generate(entry.model, **entry.prompt_inputs(["3", "7"]), mode="sjd", window=4,
                                             cfg_scale=4.0, temperature=0.0)
    assert torch.equal(out.tokens.cpu(), torch.as_tensor(expected))


def test_lumina_generate_writes_tokens_in_its_layout(lumina_dir, tmp_path):
    out = tmp_path / "out"
    argv = ["generate", "--model", "lumina-mgpt", "--weights", str(lumina_dir), "--size", LUMINA_SIZE,
            "--prompt", "a red fox", "--num", "2", "--window", "4", "--dtype", "float32", "--device", "cpu",
            "--quiet", "--out", str(out)]
    assert cli.main(argv) == 0
    tokens = json.loads((out / "tokens.json").read_text())
    height, width = lumina_tiny.GRID
    assert [len(t) for t in tokens] == [3 + height * (width + 1) + 1] * 2  # prefix, rows + row ends, image end
    assert tokens[0][0] == 8197 and tokens[0][-1] == 8196
    assert json.loads((out / "stats.json").read_text())["parameters"]["top_k"] == 2000


def test_janus_generate_and_compare(janus_dir, tmp_path):
    common = ["--model", "janus-pro", "--weights", str(janus_dir), "--prompt", "a red fox in the snow",
              "--window", "4", "--dtype", "float32", "--device", "cpu", "--quiet"]
    assert cli.main(["generate", *common, "--num", "2", "--out", str(tmp_path / "gen")]) == 0
    assert (tmp_path / "gen" / "img_000.png").exists()
    assert json.loads((tmp_path / "gen" / "stats.json").read_text())["parameters"]["cfg_scale"] == 5.0
    assert cli.main(["compare", *common, "--num", "2", "--seeds", "1", "--out", str(tmp_path / "cmp")]) == 0


def test_run_takes_the_same_model_flags(llamagen_files, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("3\n7\n")
    argv = ["run", *llamagen_files, "--prompts", str(prompts), "--modes", "ar,csd", "--window", "4",
            "--batch-size", "2", "--quiet", "--out", str(tmp_path / "run")]
    assert cli.main(argv) == 0
    manifest = json.loads((tmp_path / "run" / "run.json").read_text())
    assert manifest["model"] == "llamagen" and manifest["model_options"]["weights"] == llamagen_files[3]
    assert cli.main(argv) == 0  # resumes: nothing to redo
    changed = [*argv]
    changed[changed.index("--image-size") + 1] = "24"
    assert cli.main(changed) == 2  # another model: the folder holds a run with other options


@pytest.mark.parametrize("argv, expected", [
    (["--model", "llamagen", "--weights", "missing.pt", "--config", "GPT-B"], "no such file"),
    (["--model", "llamagen", "--weights", "{bad_pt}", "--config", "GPT-B", "--image-size", "256"], "missing"),
    (["--model", "llamagen", "--weights", "{bad_pt}"], "--config is required"),
    (["--model", "lumina-mgpt", "--weights", "{empty}"], "--weights"),
    (["--model", "lumina-mgpt", "--weights", "missing_dir"], "no such folder"),
    (["--model", "janus-pro", "--weights", "{empty}"], "--weights"),
    (["--model", "digits", "--weights", "{bad_pt}"], "ships its weights"),
    (["--model", "llamagen", "--weights", "{bad_pt}", "--config", "GPT-B", "--size", "512"], "takes no --size"),
])
def test_bad_weights_give_one_line(argv, expected, tmp_path, capsys):
    bad_pt = tmp_path / "c2i_B_256.pt"
    torch.save({"model": {"tok_embeddings.weight": torch.zeros(3, 2)}}, bad_pt)
    (tmp_path / "empty").mkdir()
    argv = [a.format(bad_pt=bad_pt, empty=tmp_path / "empty") for a in argv]
    assert cli.main(["generate", *argv, "--prompt", "3", "--device", "cpu", "--quiet", "--out",
                     str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expected in err, err
