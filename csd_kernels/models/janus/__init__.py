"""Janus-Pro: the adapter over transformers' JanusForConditionalGeneration (adapter.py) and the loader of released
checkpoints, deepseek-ai's original layout included (checkpoint.py)."""

from .adapter import JANUS_DEFAULTS, JANUS_PRO_ROLES, JANUS_ROLES, JanusAdapter, janus_prompt
from .checkpoint import load_janus_pro

__all__ = ["JANUS_DEFAULTS", "JANUS_PRO_ROLES", "JANUS_ROLES", "JanusAdapter", "janus_prompt", "load_janus_pro"]
