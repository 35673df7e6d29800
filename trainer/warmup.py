"""A supervised warm-up of any model before RL, built once and shared by every run of an experiment (issue 58).

Sampled at temperature 1, the pretrained SmolLM2 does not restate a sum before its result, so its groups share no
token: the shared contexts of Prop. 3.1 that the objectives treat differently are not there to measure. A short
supervised warm-up on the task's targets (``tasks.sft_target``; for ``sum_template``: "a + b + c = N") puts them
there. It is the tiny preset's warm start (``policy.sft_warm_start``: prompt -> target<eos>, loss on the target's
tokens, AdamW), run on the prompts as the policy reads them (``prompts.encode_prompts``: the chat template and
data.system_prompt), on any model.

What is cached, and when it is reused:

1. The warm-up draws its train problems and their order from its own seed (warmup.seed), not the run's, so the runs
   of every seed of an experiment start from one warmed-up model. Its held-out problems must be the runs': a
   generated task needs data.eval_seed set (``config.check_warmup``), and the warm-up trains on the train split of
   ``tasks.load_splits(data, warmup.seed)``, which excludes them.
2. The folder is ``cache_root / <key>``: the SHA-256 of what makes the weights (``warmup_settings``: the model, its
   resolved source, every data setting and the warm-up's keys but its cache folder). Another setting of the run
   (the objective, the learning rate, the run seed) reuses it.
3. It is written into a temporary folder beside its place and renamed there (as ``packaged_model.converted_folder``
   does): a folder under the key is complete, an interrupted warm-up leaves none, and of two runs that warm up at
   once the second to finish uses the first one's folder. ``WARMUP_RECORD`` inside says what made it.
4. The tiny preset is warmed up from its own start: built from warmup.seed with its model.sft_steps, then
   warmup.steps on the task's targets. A real model starts from its weights (float32).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ..core.files import write_text_atomic
from .packaged_model import resolve_model_name
from .policy import check_pad_token, load_pretrained_policy, sft_warm_start, warm_started_tiny
from .prompts import encode_prompts
from .run import logs
from .tasks import load_splits, sft_target

WARMUP_RECORD = "warmup.json"
"""In a warm-up folder: the settings it was keyed by, its losses and seconds (written last, before the rename)."""
WARMUP_VERSION = 1
"""Part of the key: a change to how a warm-up is made gives new folders."""
MODEL_KEYS = ("name", "pad_token", "trust_remote_code")
"""The model keys a warm-up depends on (dtype, autocast, LoRA and checkpointing are how the run trains it)."""
TINY_KEYS = ("tiny_hidden", "tiny_layers", "tiny_heads", "tiny_intermediate", "sft_steps", "sft_batch_size", "sft_lr")
"""The tiny preset's keys that shape its start."""


def cache_root(cache_dir: str) -> Path:
    """Where warm-ups are kept: warmup.cache_dir, else $DFPO_CACHE/warmup, else ~/.cache/dfpo/warmup."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    base = os.environ.get("DFPO_CACHE")
    return (Path(base).expanduser() if base else Path.home() / ".cache" / "dfpo") / "warmup"


def warmup_settings(cfg) -> dict:
    """What makes a warm-up's weights: the model keys (``MODEL_KEYS``, and ``TINY_KEYS`` for the tiny preset), the
    folder the model name resolves to (a packaged model's is named by its file's SHA-256), every data setting, and
    the warm-up's keys but cache_dir."""
    m = cfg.model
    model = {k: getattr(m, k) for k in MODEL_KEYS + (TINY_KEYS if m.name == "tiny" else ())}
    source = m.name if m.name == "tiny" else resolve_model_name(m.name)
    warm = {k: v for k, v in dataclasses.asdict(cfg.warmup).items() if k != "cache_dir"}
    return {"version": WARMUP_VERSION, "model": model, "source": source, "data": dataclasses.asdict(cfg.data), "warmup": warm}


def warmup_key(settings: dict) -> str:
    """SHA-256 of ``warmup_settings`` (sorted JSON)."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def warm_folder(cfg) -> Path | None:
    """The cached warm-up folder of ``cfg`` (None when warmup.steps = 0): ``cache_root / warmup_key``."""
    if cfg.warmup.steps == 0:
        return None
    return cache_root(cfg.warmup.cache_dir) / warmup_key(warmup_settings(cfg))


def is_complete(folder: Path) -> bool:
    """Whether ``folder`` holds a finished warm-up (its record is written last)."""
    return (folder / WARMUP_RECORD).is_file()


def ensure_warm_model(cfg, *, device, say: Callable[[str], None] = lambda line: None) -> Path:
    """The warm-up folder of ``cfg``, built now when it is missing (``build_warm_model``) and reused when it is there."""
    folder = warm_folder(cfg)
    if folder is None:
        raise ValueError("warmup.steps = 0 asks for no warm-up; set warmup.steps > 0")
    if is_complete(folder):
        say(f"warm-up: reusing {folder}")
        return folder
    if folder.exists():  # not a rename of ours: something else wrote there, or damaged it
        raise ValueError(
            f"{folder} is in the way of the warm-up: it holds no {WARMUP_RECORD}, so dfpo did not finish it; nothing was "
            "deleted. Remove it, or set warmup.cache_dir to another folder"
        )
    folder.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        build_warm_model(cfg, work, device=device, say=say)
        try:
            os.rename(work, folder)
        except OSError:  # another run finished the same warm-up first: its folder holds the same weights' recipe
            if not is_complete(folder):
                raise
            say(f"warm-up: {folder} was written by another run meanwhile; using it")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return folder


def warmup_examples(cfg) -> list:
    """The warm-up's train problems: the train split drawn from warmup.seed (its held-out problems are the runs':
    ``config.check_warmup``)."""
    return load_splits(cfg.data, cfg.warmup.seed)[0]


def base_model(cfg, examples: list, *, device, say: Callable[[str], None]):
    """(model, tokenizer) the warm-up starts from, float32 on ``device``: the tiny preset from warmup.seed with its
    own warm start, or the pretrained model's weights."""
    m = cfg.model
    if m.name == "tiny":
        return warm_started_tiny(m, cfg.data.task, examples, seed=cfg.warmup.seed, device=device, say=say)
    model, tok = load_pretrained_policy(m.name, m, device, torch.float32)
    check_pad_token(tok, m.pad_token)
    return model, tok


def build_warm_model(cfg, out: Path, *, device, say: Callable[[str], None] = lambda line: None) -> list[float]:
    """Warm ``cfg``'s model up into the folder ``out``: warmup.steps supervised steps of warmup.batch_size examples
    (``policy.sft_warm_start`` on the prompts as the policy reads them), model and tokenizer saved, then
    ``WARMUP_RECORD``. Returns the losses."""
    w = cfg.warmup
    examples = warmup_examples(cfg)
    model, tok = base_model(cfg, examples, device=device, say=say)
    say(
        f"warm-up: {w.steps} supervised steps of {w.batch_size} examples on data.task {cfg.data.task!r}'s targets "
        f"(lr {w.lr:g}, seed {w.seed}), into {out.parent}"
    )
    t0, lines = time.time(), logs.Every(logs.PROGRESS_EVERY_S)

    def progress(done: int, loss: float) -> None:
        if done < w.steps and lines.due():
            say(f"warm-up: step {done}/{w.steps}, loss {loss:.3f}, {time.time() - t0:.0f} s")

    losses = sft_warm_start(
        model,
        tok,
        examples,
        target_fn=sft_target(cfg.data.task),
        steps=w.steps,
        batch_size=w.batch_size,
        lr=w.lr,
        seed=w.seed,
        device=device,
        on_step=progress,
        encode_prompt=lambda ex: encode_prompts(tok, [ex], cfg.data)[0],
    )
    seconds = time.time() - t0
    model.save_pretrained(out)
    tok.save_pretrained(out)
    record = {"settings": warmup_settings(cfg), "losses": losses, "seconds": seconds}
    write_text_atomic(out / WARMUP_RECORD, json.dumps(record, indent=2, sort_keys=True))
    say(f"warm-up: {w.steps} steps in {seconds:.1f} s, loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    return losses
