"""The public ops, one a file: verify.py (ck.verify), verify_tree.py (ck.verify_tree), drafts.py (the decoding loop's
draft tokens), interop.py (FlashInfer's and vLLM's conventions over verify), neighbours.py (ck.codebook_neighbours:
the table lantern's rules take). Shared by the ops: checks.py (argument
checks) and registry.py (which backend runs: available, in which order, and why not). Each op is one
``torch.library`` custom op with a fake implementation; its backends are :mod:`csd_kernels.backends`' and the torch
reference (:mod:`csd_kernels.reference`)."""

# Importing the package registers its custom ops (torch.ops.csd_kernels.verify, .verify_tree and the compiled rows).
from . import verify, verify_tree  # noqa: E402,F401
