"""``csd run``: sharded, resumable generation on torch.distributed (see :mod:`.run`); usage.py: what the command line
and the runner share (UsageError, flag errors, output-folder checks).

Importing this package imports no torch (the command line refuses bad flags with usage.py before it imports torch):
the names of run.py, files.py and summary.py load on first use."""

from .._lazy import lazy_package

__all__ = ["CRASH_ENV", "LOCK", "MANIFEST", "SUMMARY", "TABLE", "RunLock", "format_table", "image_seed",
           "item_complete", "parse_modes", "read_prompts", "run", "shard", "work_items"]
lazy_package(__name__, {**dict.fromkeys(("LOCK", "MANIFEST", "SUMMARY", "TABLE", "RunLock", "item_complete"), ".files"),
                        **dict.fromkeys(("CRASH_ENV", "image_seed", "parse_modes", "read_prompts", "run", "shard",
                                         "work_items"), ".run"),
                        "format_table": ".summary"})
