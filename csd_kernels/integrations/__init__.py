"""The op where other decoders already run, each module under its engine's own name and signature.

* :mod:`.vllm`: ``rejection_sample`` with vLLM V1's signature (``vllm/v1/sample/rejection_sampler.py``) and a
  ``vllm.general_plugins`` entry point that rebinds vLLM's function to it (off unless ``CSD_KERNELS_VLLM`` names a
  rule); :mod:`.vllm_mrv2`: Model Runner V2's ``rejection_sample`` (vLLM 0.33's default runner), which the same
  plugin rebinds.
* :mod:`.sglang`: ``tree_speculative_sampling_target_only`` with sgl-kernel's signature and in-place outputs, and a
  ``sglang.srt.plugins`` entry point (off unless ``CSD_KERNELS_SGLANG`` names a rule).
* :mod:`.transformers`: a ``custom_generate`` folder for ``model.generate(..., custom_generate=...)`` (Emu3, the
  Lumina-mGPT layout on Chameleon) and ``janus_generate_image`` with the arguments of Janus' image mode.

None of them imports its engine at import time: vLLM and SGLang are imported only by the plugins' ``register()``,
which those engines call themselves. docs/drop-in.md says what each call does and what the tests hold it to.
"""
