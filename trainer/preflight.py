"""Checks before any work: every one a sentence naming the setting or file and what to do, raised before the model
loads, the warm start runs or a file is written.

    the prompts' lengths against the model's context (measured with the tokenizer, in characters first)
    a model folder that holds no model; more prompts per step than the train split has
    the memory the settings need at the least, against the free RAM or GPU memory (``memory.py``)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .config import Config
from .decode import DecodeOptions, static_cache_width
from .memory import available_memory, check_memory, memory_needs, pretrained_shape, tiny_shape
from .packaged_model import resolve_model_name
from .policy import check_completion_fits, resolve_amp, tokenizer_and_context
from .prompts import encode_prompts, prompt_char_limit


@dataclass(frozen=True)
class PromptLengths:
    """What the prompts' check measured (``measure_prompts``)."""

    limit: int | None
    """The longest prompt the model's context leaves beside rollout.max_new_tokens (None: no limit known)."""
    shortest: int
    """Tokens of the shortest encoded prompt."""
    vocab: int
    """The tokenizer's size."""
    char_limit: int | None
    """The most characters a prompt within ``limit`` can have (``prompts.prompt_char_limit``; None: no limit known)."""


def measure_prompts(cfg: Config, train_examples: list, eval_examples: list) -> PromptLengths:
    """Every train and eval prompt checked against the longest the model's context leaves beside
    ``rollout.max_new_tokens``: a ValueError names the first that does not fit. Needs only the tokenizer and the
    model's config, so it runs before any weights load."""
    tok, context = tokenizer_and_context(cfg.model)
    check_completion_fits(cfg.rollout.max_new_tokens, context)
    limit = None if context is None else context - cfg.rollout.max_new_tokens
    ids = encode_prompts(tok, [*train_examples, *eval_examples], cfg.data, limit)
    return PromptLengths(limit, min((len(i) for i in ids), default=1), len(tok), prompt_char_limit(tok, limit))


def check_lengths(cfg: Config, train_examples: list, eval_examples: list) -> int | None:
    """``measure_prompts``'s check; returns the longest prompt the context leaves (None: no limit known)."""
    return measure_prompts(cfg, train_examples, eval_examples).limit


def check_model_folder(name: str) -> None:
    """ValueError naming ``model.name`` when it names a folder on this machine that holds no model (a transformers
    model folder has a config.json), a file, or a path that does not exist; a hub name is left to
    ``policy.check_model_available`` (the local cache, then the hub)."""
    name = resolve_model_name(name)  # a GGUF file or a packaged model: its converted folder
    if name == "tiny":
        return
    path = Path(name).expanduser()
    where = f"model.name {name!r}" + (f" ({path.resolve()})" if str(path.resolve()) != name else "")
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(
                f"{where} is a folder without a model in it (no config.json); name a folder written by save_pretrained, "
                'a hub name such as "Qwen/Qwen3-0.6B", or "tiny" (the offline preset)'
            )
    elif path.exists():
        raise ValueError(f'{where} is a file; name a model folder (written by save_pretrained), a hub name, or "tiny"')
    elif name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name:  # a path, never a hub name
        raise ValueError(f'{where}: no such folder; name a model folder, a hub name such as "Qwen/Qwen3-0.6B", or "tiny"')


def check_prompts_per_step(cfg: Config, train_examples: list) -> None:
    """ValueError unless a rollout batch's prompts are distinct prompts of the train split (more would repeat prompts
    within a step, and 100 million of them exhaust memory before a message could say so)."""
    if cfg.rollout.prompts_per_step > len(train_examples):
        raise ValueError(
            f"rollout.prompts_per_step={cfg.rollout.prompts_per_step} is more than the {len(train_examples)} prompts of the train "
            "split: each step would sample some prompts twice; lower it, or give more train data"
        )


def check_memory_fits(cfg: Config, lengths: PromptLengths, *, device: torch.device, world: int, with_ref: bool, resume: bool) -> None:
    """The memory the settings need at the least (``memory.memory_needs``) against what the device has free now;
    a ValueError names the setting that weighs most and its value. Nothing is checked for a model whose config
    does not give its sizes."""
    if cfg.model.name == "tiny":
        shape = tiny_shape(cfg.model, lengths.vocab)
    else:
        from transformers import AutoConfig  # deferred: transformers loads only when a trainer is built

        try:  # the config tokenizer_and_context just read: in the local folder or cache
            shape = pretrained_shape(
                AutoConfig.from_pretrained(
                    resolve_model_name(cfg.model.name), local_files_only=True, trust_remote_code=cfg.model.trust_remote_code
                )
            )
        except (OSError, ValueError):
            shape = None
    if shape is None:
        return
    decode, amp = DecodeOptions.from_config(cfg.rollout).resolve(device), resolve_amp(cfg.model.amp, device)
    static = cfg.rollout.engine == "hf" and decode.static_cache
    static_width = static_cache_width(lengths.shortest, cfg.rollout.max_new_tokens) if static else 0
    needs = memory_needs(
        cfg, shape, shortest_prompt=lengths.shortest, with_ref=with_ref, world=world, resume=resume, static_width=static_width,
        amp_bytes=amp.itemsize if amp else 0,
    )  # fmt: skip
    available, where = available_memory(device)
    check_memory(needs, available, where, processes=world if device.type == "cpu" else 1)
