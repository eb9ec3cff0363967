"""Shared test set-up.

Triton runs on CPU only through its interpreter, which must be switched on before triton is first imported, so the
suite sets it here on machines without a GPU: every test then sees the 'triton' backend for CPU tensors. With a GPU
the kernels must be compiled (tests/test_gpu.py), so the interpreter stays off unless TRITON_INTERPRET says so.
"""

import os

import torch  # does not import triton

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


# ----------------------------------------------------------------------------------------------------------------------
# Tiny random-config image generators for tests/test_decoding.py and tests/test_adapters.py (no downloads).
# ----------------------------------------------------------------------------------------------------------------------
import pytest  # noqa: E402


class ForwardCounter:
    """Counts calls of a module's forward (a forward pre-hook); ``.calls``."""

    def __init__(self, module):
        self.calls = 0
        self._handle = module.register_forward_pre_hook(self._hook)

    def _hook(self, module, args):
        self.calls += 1

    def remove(self):
        self._handle.remove()


@pytest.fixture
def forward_counter():
    counters = []

    def make(module):
        counters.append(ForwardCounter(module))
        return counters[-1]

    yield make
    for c in counters:
        c.remove()


def _seeded(build, seed):
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return build().eval()
    finally:
        torch.random.set_rng_state(state)


# Janus: text vocab 64 (pad 0, bos 1, boi 60), 4x4 image grid, image vocab 32.
JANUS_BOS, JANUS_PAD, JANUS_BOI = 1, 0, 60


def build_tiny_janus():
    """The tiny Janus (a plain function as well as the fixture: tests/test_golden.py builds it outside pytest)."""
    from transformers import JanusConfig, JanusForConditionalGeneration

    cfg = JanusConfig(
        text_config=dict(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         initializer_range=0.2, pad_token_id=JANUS_PAD, bos_token_id=JANUS_BOS, eos_token_id=2),
        vision_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, image_size=32, patch_size=8,
                           projection_dim=32, num_image_tokens=16, mlp_ratio=2.0),
        vq_config=dict(embed_dim=8, num_embeddings=32, latent_channels=32, base_channels=32, channel_multiplier=[1, 1],
                       num_res_blocks=1, projection_dim=32, image_token_embed_dim=32, initializer_range=0.2),
        image_token_id=63,
    )
    model = _seeded(lambda: JanusForConditionalGeneration(cfg), 0)
    model.generation_config.generation_kwargs = {"boi_token_id": JANUS_BOI}
    model.generation_config.pad_token_id = JANUS_PAD
    model.generation_config.bos_token_id = JANUS_BOS
    return model


@pytest.fixture(scope="session")
def tiny_janus():
    return build_tiny_janus()


def janus_image_generate(model, prompts, **kwargs):
    """transformers' own Janus image generation (the tests' greedy reference), skipping the test where that code is
    broken upstream: transformers 5.17's JanusForConditionalGeneration.generate calls
    GenerationMixin._prepare_static_cache without its required prefill_chunk_size (TypeError)."""
    try:
        return model.generate(prompts, attention_mask=torch.ones_like(prompts), generation_mode="image", **kwargs)
    except TypeError as error:
        if "prefill_chunk_size" not in str(error):
            raise
        import transformers

        pytest.skip(f"transformers {transformers.__version__}: its Janus generate() fails upstream ({error}); "
                    "no reference to compare with")


# Lumina-mGPT layout on Chameleon: text vocab 64, image codes = ids 8..39 (V = 32), row end 41, image start 42,
# image end 43, size tokens 44 + grid/2; grid 2 x 4 (non-square so that rows and columns cannot be confused).
LUMINA_KW = dict(grid=(2, 4), image_token_range=(8, 40), row_end_token_id=41, image_start_token_id=42,
                 image_end_token_id=43, size_token_offset=44)


def _image_vocabulary(ids) -> dict:
    """Chameleon's names of image tokens: code c is "IMGIMG" + c's digits as letters (0 -> A) + "Z"."""
    return {"IMGIMG" + "".join(chr(65 + int(d)) for d in str(c)) + "Z": i for c, i in enumerate(ids)}


def build_tiny_chameleon():
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    cfg = ChameleonConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.3,
        vq_config=dict(embed_dim=8, num_embeddings=32, latent_channels=32, base_channels=32, channel_multiplier=[1, 1],
                       num_res_blocks=1, resolution=16, attn_resolutions=[]),
        vocabulary_map=_image_vocabulary(range(8, 40)),  # the 32 codes: the adapter's codebook() maps each
    )
    return _seeded(lambda: ChameleonForConditionalGeneration(cfg), 1)


@pytest.fixture(scope="session")
def tiny_chameleon():
    return build_tiny_chameleon()


def build_tiny_llama(vocab_size: int, seed: int = 0, init: float = 0.3, dtype=torch.float32):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      initializer_range=init, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return _seeded(lambda: LlamaForCausalLM(cfg), seed).to(dtype)


@pytest.fixture(scope="session")
def tiny_llama():
    """LlamaForCausalLM over 16 image codes (ids 0..15), class tokens 16..22, null class 23 (float64: exact-ish)."""
    return build_tiny_llama(24, seed=0, init=0.5, dtype=torch.float64)


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for the module's tests (tiny models: with the cores shared, a second thread only waits)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
