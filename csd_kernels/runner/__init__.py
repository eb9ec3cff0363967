"""``csd run``: sharded, resumable generation on torch.distributed (see :mod:`.run`); usage.py: what the command line
and the runner share (UsageError, flag errors, output-folder checks)."""

from .files import LOCK, MANIFEST, SUMMARY, TABLE, RunLock, item_complete
from .run import CRASH_ENV, image_seed, parse_modes, read_prompts, run, shard, work_items
from .summary import format_table

__all__ = ["CRASH_ENV", "LOCK", "MANIFEST", "SUMMARY", "TABLE", "RunLock", "format_table", "image_seed",
           "item_complete", "parse_modes", "read_prompts", "run", "shard", "work_items"]
