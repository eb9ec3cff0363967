"""What the strict checkpoint loaders share: reading a folder's JSON and sharded-weights index with one-line errors,
and what they say about a checkpoint they refuse or partly ignore — one error listing every missing, unknown and
mis-shaped tensor by name (a loader never leaves a tensor randomly initialised)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

__all__ = ["GENERIC_FIELDS", "MAX_LISTED", "indexed_shards", "log_ignored", "raise_problems", "read_json"]

MAX_LISTED = 12  # problems listed per kind in one error
# transformers 4.x PretrainedConfig fields: bookkeeping and generation defaults, none shapes the network (a field
# that did, e.g. pruned_heads, would show as a shape mismatch)
GENERIC_FIELDS = frozenset("""
    _name_or_path _commit_hash _attn_implementation_autoset _attn_implementation_internal transformers_version
    architectures model_type return_dict output_hidden_states output_attentions torchscript use_bfloat16
    tf_legacy_loss pruned_heads chunk_size_feed_forward is_encoder_decoder is_decoder cross_attention_hidden_size
    add_cross_attention tie_encoder_decoder max_length min_length do_sample early_stopping num_beams
    num_beam_groups diversity_penalty temperature top_k top_p typical_p repetition_penalty length_penalty
    no_repeat_ngram_size encoder_no_repeat_ngram_size bad_words_ids num_return_sequences output_scores
    return_dict_in_generate forced_bos_token_id forced_eos_token_id remove_invalid_values
    exponential_decay_length_penalty suppress_tokens begin_suppress_tokens finetuning_task id2label label2id
    tokenizer_class prefix sep_token_id decoder_start_token_id task_specific_params problem_type
""".split())


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read JSON ({exc})") from exc


def folder_config(path: Path, family: str, contents: str) -> dict:
    """config.json of a checkpoint folder, as a dict; ValueError naming the folder (``family``'s checkpoint holds
    ``contents``) when it is not a folder or has no config.json."""
    if not path.is_dir():
        raise ValueError(f"{path}: not a directory (pass a {family} checkpoint folder: {contents}; for a hub id, "
                         "download it first, e.g. huggingface_hub.snapshot_download(repo_id))")
    if not (path / "config.json").is_file():
        raise ValueError(f"{path}: no config.json")
    return read_json(path / "config.json")


def indexed_shards(path: Path, index: str) -> list:
    """The weight files that ``path / index`` (a ``*.index.json`` with a weight_map) names, each checked to exist."""
    weight_map = read_json(path / index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"{path / index}: no weight_map")
    files = [path / f for f in sorted(set(weight_map.values()))]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise ValueError(f"{path}: shards named in {index} are missing: {missing}")
    return files


def raise_problems(where: str, family: str, missing: list, unknown: list, bad_shape: list) -> None:
    """ValueError naming every problem (the first MAX_LISTED of each kind) when there is any."""
    problems = [(kind, items) for kind, items in (("missing tensors", missing), ("unknown tensors", unknown),
                                                  ("shapes no rule converts", bad_shape)) if items]
    if problems:
        text = "; ".join(f"{kind}: " + ", ".join(items[:MAX_LISTED])
                         + (f" and {len(items) - MAX_LISTED} more" if len(items) > MAX_LISTED else "")
                         for kind, items in problems)
        raise ValueError(f"{where}: cannot load as {family}: {text}")


def log_ignored(log: logging.Logger, where: str, ignored: dict) -> None:
    """One info line per reason: the tensors a loader skipped by name."""
    for reason, names in ignored.items():
        log.info("%s: ignored %d tensors (%s ...): %s", where, len(names), names[0], reason)
