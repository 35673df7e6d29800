"""Run configuration of the LLM trainer: frozen dataclasses parsed from TOML, strictly.

A config file is TOML with a few top-level keys and one table per section::

    seed = 0
    [model]      policy, tokenizer, tiny preset, LoRA, reference model
    [data]       task, prompt template, train/eval split
    [reward]     correctness reward, format reward, user callable, timeout
    [rollout]    group size, sampling, max new tokens
    [objective]  name of a dfpo.OBJECTIVES preset and its overrides
    [optim]      AdamW, schedule, mini-batches, accumulation, clipping
    [train]      steps, checkpoints, non-finite guard
    [eval]       avg@k every N steps
    [log]        samples, TensorBoard, progress bar, diagnostics

Every key is checked: an unknown key, a value of the wrong type or outside its choices
raises ``ValueError`` naming the key, the bad value and what to write instead.
``--set section.key=value`` overrides are parsed as TOML values (``--set optim.lr=1e-4``,
``--set objective.name=\"gspo\"`` or simply ``--set objective.name=gspo``).
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, get_type_hints

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")
TASKS = ("add", "equiv", "jsonl", "reasoning_gym", "hf")
REWARD_KINDS = ("auto", "exact", "math_verify", "equiv", "reasoning_gym", "user")
CHAT_TEMPLATE = ("auto", "on", "off")
ADV_SCALES = ("auto", "group", "batch", "none")


@dataclass(frozen=True)
class ModelConfig:
    name: str = "tiny"
    """'tiny' (built-in offline preset), a local directory, or a hub name (needs the hub)."""
    dtype: str = "auto"
    """Parameter dtype: auto (= float32 master weights), float32, bfloat16 (e.g. a frozen LoRA base), float16."""
    amp: str = "auto"
    """Autocast of forward passes: auto (bf16 on CUDA, none on CPU), bf16, fp16, none."""
    pad_token: str = ""
    """Pad token to use when the tokenizer has none: '' (fail with a message), 'eos', or a token string."""
    trust_remote_code: bool = False
    """Passed to from_pretrained."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (saves memory on large models)."""
    lora_r: int = 0
    """LoRA rank through peft; 0 trains every parameter."""
    lora_alpha: int = 16
    """LoRA alpha."""
    lora_dropout: float = 0.0
    """LoRA dropout (keep 0 for exact old/new log-prob agreement)."""
    lora_target_modules: str = "all-linear"
    """peft target_modules: 'all-linear' or a comma-separated list of module names."""
    tiny_hidden: int = 64
    """Tiny preset: hidden size."""
    tiny_layers: int = 2
    """Tiny preset: number of decoder layers."""
    tiny_heads: int = 4
    """Tiny preset: attention heads (key/value heads are half of these, at least 1)."""
    tiny_intermediate: int = 256
    """Tiny preset: MLP width."""
    sft_steps: int = 300
    """Tiny preset: supervised warm-start steps on the task's train split (0 = none)."""
    sft_batch_size: int = 64
    """Tiny preset: supervised batch size."""
    sft_lr: float = 3e-3
    """Tiny preset: supervised AdamW learning rate."""


@dataclass(frozen=True)
class DataConfig:
    task: str = "add"
    """add (integer 'a+b='), equiv (a+b with several correct surface forms), jsonl, reasoning_gym, hf."""
    path: str = ""
    """task=jsonl: a JSONL file with one {"prompt": ..., "answer": ...} object per line."""
    eval_path: str = ""
    """task=jsonl: optional held-out JSONL file; '' splits eval_size examples off the train file."""
    name: str = ""
    """task=hf: dataset name (e.g. 'openai/gsm8k'); task=reasoning_gym: generator (e.g. 'gsm_symbolic')."""
    subset: str = ""
    """task=hf: dataset config name (e.g. 'main' for gsm8k)."""
    split: str = "train"
    """task=hf: train split name."""
    eval_split: str = "test"
    """task=hf: eval split name."""
    prompt_field: str = "question"
    """task=hf: field holding the prompt."""
    answer_field: str = "answer"
    """task=hf: field holding the answer (gsm8k's '#### 72' tail is extracted)."""
    max_operand: int = 99
    """Built-in tasks: operands are drawn from 0..max_operand."""
    train_size: int = 5000
    """Built-in and reasoning_gym tasks: number of train problems generated."""
    eval_size: int = 64
    """Number of held-out problems for evaluation."""
    prompt_template: str = "{prompt}"
    """Prompt text with {prompt} replaced by the raw prompt (plain replacement: other braces stay)."""
    chat_template: str = "auto"
    """auto (use the tokenizer's chat template when it has one), on (require one), off."""
    enable_thinking: bool = False
    """Passed to chat templates that understand it (Qwen3)."""
    shuffle: bool = True
    """Shuffle the train split each epoch (seeded, resumable)."""


@dataclass(frozen=True)
class RewardConfig:
    kind: str = "auto"
    """Correctness reward: auto (by task), exact, math_verify, equiv, reasoning_gym, user."""
    user_fn: str = ""
    """kind=user: 'module:function' called as fn(prompt=, completion=, answer=) -> float."""
    format_weight: float = 0.0
    """Weight of the format reward added to correctness (0 = off)."""
    format_regex: str = r"\\boxed\{.+\}"
    """A completion earns the format reward when this regex is found in it."""
    timeout_s: float = 5.0
    """A reward call running longer than this gives 0 and is counted in reward/timeouts."""


@dataclass(frozen=True)
class RolloutConfig:
    engine: str = "hf"
    """Rollout engine: 'hf' (transformers generate). vLLM plugs in through RolloutEngine."""
    prompts_per_step: int = 8
    """Prompts sampled per rollout batch."""
    group_size: int = 8
    """Completions per prompt (G)."""
    max_new_tokens: int = 8
    """Generation length limit; completions that hit it are counted as truncated."""
    temperature: float = 1.0
    """Sampling temperature."""
    top_p: float = 1.0
    """Nucleus sampling (1 = off)."""
    top_k: int = 0
    """Top-k sampling (0 = off)."""
    mask_truncated: bool = False
    """Give completions that hit max_new_tokens zero loss weight (DAPO overlong filtering)."""
    batch_size: int = 0
    """Completions generated per generate() call; 0 = all at once."""


@dataclass(frozen=True)
class ObjectiveConfig:
    name: str = "dfpo_min"
    """A preset of dfpo.OBJECTIVES (grpo, dr_grpo, dapo, gspo, dfpo_min, dfpo_orth, ...)."""
    overrides: dict = field(default_factory=dict)
    """ObjectiveSpec fields to override (eps_low, eps_high, transform, stopgrad, beta, ...)."""
    advantage_scale: str = "auto"
    """Advantage scaling: auto (the preset's), group, batch or none."""
    advantage_eps: float = 1e-4
    """Epsilon added to the std in advantage scaling."""


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-4
    """Peak learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.999
    """AdamW beta2."""
    adam_eps: float = 1e-8
    """AdamW epsilon."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this (0 = no clipping)."""
    warmup_ratio: float = 0.03
    """Linear warmup over this share of all optimiser steps (the paper: 3%)."""
    min_lr_ratio: float = 0.2
    """Cosine decay ends at lr * min_lr_ratio (the paper: 0.2)."""
    minibatch_groups: int = 1
    """Whole groups per optimiser step; prompts_per_step / minibatch_groups steps per epoch."""
    microbatch_groups: int = 0
    """Whole groups per forward/backward (gradient accumulation); 0 = the whole mini-batch."""
    epochs: int = 1
    """Passes over each rollout batch; K = epochs * prompts_per_step / minibatch_groups."""


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 50
    """Rollout batches (training steps) in the run."""
    save_every: int = 10
    """Write a checkpoint every this many steps (and at the end)."""
    max_nonfinite_in_row: int = 3
    """Stop after this many optimiser steps in a row with a non-finite loss or gradient."""


@dataclass(frozen=True)
class EvalConfig:
    every: int = 10
    """Evaluate every this many steps (0 = never); also at step 0 and the end."""
    k: int = 4
    """Samples per eval prompt for avg@k."""
    temperature: float = 1.0
    """Eval sampling temperature."""
    kappa: float = 0.5
    """Threshold of Steps(reward >= kappa) (eq 19), on the train reward curve."""


@dataclass(frozen=True)
class LogConfig:
    samples_every: int = 10
    """Write sample completions every this many steps (0 = never)."""
    samples_per_step: int = 4
    """Completions written per sampled step."""
    tensorboard: bool = True
    """Write TensorBoard events under RUN_DIR/tb."""
    wandb_project: str = ""
    """Also log to this wandb project when wandb is installed ('' = off)."""
    progress: bool = True
    """Show a progress bar."""
    energy_buckets: list = field(default_factory=lambda: [0.5, 0.8])
    """Energy (eq 24) buckets: cumulative token-occurrence shares splitting frequent/mid/rare tokens."""
    diagnostics: bool = True
    """Compute Energy and shared-prefix residual (costs one softmax over the vocab per token)."""


@dataclass(frozen=True)
class Config:
    seed: int = 0
    """Seed of data, model init, sampling."""
    run_dir: str = "runs/default"
    """Output folder (created; must be empty or absent unless resuming)."""
    device: str = "auto"
    """auto (cuda when available), cpu, cuda."""
    threads: int = 0
    """CPU threads for torch (0 = torch's default). 1 is fastest for the tiny preset on a busy machine."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)


def _section_types() -> dict[str, type]:
    hints = get_type_hints(Config)
    return {name: tp for name, tp in hints.items() if dataclasses.is_dataclass(tp)}


def _check_value(where: str, value: Any, expected: type) -> Any:
    """Return ``value`` coerced to ``expected`` (int -> float only) or raise a ValueError."""
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if expected is int and isinstance(value, bool):
        raise ValueError(f"{where} must be an integer, got {value!r}")
    if not isinstance(value, expected):
        raise ValueError(f"{where} must be of type {expected.__name__}, got {value!r} ({type(value).__name__})")
    if expected is float and not math.isfinite(value):
        raise ValueError(f"{where} must be a finite number, got {value!r}")
    return value


def _build_section(name: str, cls: type, table: Any) -> Any:
    if not isinstance(table, dict):
        raise ValueError(f"[{name}] must be a table, got {table!r}")
    hints = get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    kwargs = {}
    for key, value in table.items():
        if key not in known:
            raise ValueError(f"unknown config key {name}.{key}; valid keys of [{name}]: {', '.join(sorted(known))}")
        kwargs[key] = _check_value(f"{name}.{key}", value, hints[key])
    return cls(**kwargs)


def config_from_dict(raw: dict) -> Config:
    """Build a validated Config from a nested dict (a parsed TOML document)."""
    sections = _section_types()
    hints = get_type_hints(Config)
    kwargs = {}
    for key, value in raw.items():
        if key in sections:
            kwargs[key] = _build_section(key, sections[key], value)
        elif key in hints:
            kwargs[key] = _check_value(key, value, hints[key])
        else:
            valid = sorted(hints)
            raise ValueError(f"unknown config key {key!r}; valid top-level keys and sections: {', '.join(valid)}")
    cfg = Config(**kwargs)
    validate(cfg)
    return cfg


def config_to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def _parse_value(text: str) -> Any:
    """A --set value as TOML (numbers, booleans, quoted strings, arrays); bare words are strings."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(raw: dict, assignments: list[str]) -> dict:
    """Apply ``section.key=value`` assignments to a nested dict (returns a new dict).

    ``objective.overrides.eps_high=0.28`` sets one objective override.
    """
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    for item in assignments:
        if "=" not in item:
            raise ValueError(f"--set expects key=value, got {item!r}")
        key, text = item.split("=", 1)
        parts = key.strip().split(".")
        node = out
        for part in parts[:-1]:
            child = node.get(part, {})
            if not isinstance(child, dict):
                raise ValueError(f"--set {key}: {part!r} is not a section")
            child = dict(child)
            node[part] = child
            node = child
        node[parts[-1]] = _parse_value(text.strip())
    return out


def load_config(path: str | Path | None, assignments: list[str] = ()) -> Config:
    """Read a TOML file (or start from defaults when ``path`` is None), apply --set, validate."""
    raw: dict = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ValueError(f"--config {path}: no such file")
        try:
            raw = tomllib.loads(p.read_text())
        except tomllib.TOMLDecodeError as err:
            raise ValueError(f"--config {path}: not valid TOML: {err}") from None
    return config_from_dict(apply_overrides(raw, list(assignments)))


def _choice(where: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{where} must be one of {', '.join(choices)}; got {value!r}")


def _positive(where: str, value: float, *, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{where} must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")


def validate(cfg: Config) -> None:
    """Cross-field checks that need no model, data or network. Raises ValueError."""
    from dfpo import OBJECTIVES, resolve_objective

    _choice("device", cfg.device, DEVICES)
    _choice("model.dtype", cfg.model.dtype, DTYPES)
    _choice("model.amp", cfg.model.amp, ("auto", "bf16", "fp16", "none"))
    _choice("data.task", cfg.data.task, TASKS)
    _choice("data.chat_template", cfg.data.chat_template, CHAT_TEMPLATE)
    _choice("reward.kind", cfg.reward.kind, REWARD_KINDS)
    _choice("rollout.engine", cfg.rollout.engine, ("hf",))
    _choice("objective.advantage_scale", cfg.objective.advantage_scale, ADV_SCALES)
    if cfg.objective.name not in OBJECTIVES:
        raise ValueError(f"objective.name must be one of {', '.join(OBJECTIVES)}; got {cfg.objective.name!r}")
    try:
        resolve_objective(cfg.objective.name, **cfg.objective.overrides)
    except (TypeError, ValueError) as err:
        raise ValueError(f"objective.overrides {cfg.objective.overrides!r}: {err}") from None
    for where, value in [
        ("rollout.prompts_per_step", cfg.rollout.prompts_per_step),
        ("rollout.max_new_tokens", cfg.rollout.max_new_tokens),
        ("rollout.temperature", cfg.rollout.temperature),
        ("optim.lr", cfg.optim.lr),
        ("optim.minibatch_groups", cfg.optim.minibatch_groups),
        ("optim.epochs", cfg.optim.epochs),
        ("train.steps", cfg.train.steps),
        ("train.save_every", cfg.train.save_every),
        ("train.max_nonfinite_in_row", cfg.train.max_nonfinite_in_row),
        ("eval.k", cfg.eval.k),
        ("data.eval_size", cfg.data.eval_size),
        ("reward.timeout_s", cfg.reward.timeout_s),
    ]:
        _positive(where, value)
    if cfg.rollout.group_size < 2:
        raise ValueError(f"rollout.group_size must be >= 2 (group-relative advantages), got {cfg.rollout.group_size}")
    for where, value in [
        ("optim.weight_decay", cfg.optim.weight_decay),
        ("optim.max_grad_norm", cfg.optim.max_grad_norm),
        ("optim.microbatch_groups", cfg.optim.microbatch_groups),
        ("threads", cfg.threads),
        ("rollout.top_k", cfg.rollout.top_k),
        ("rollout.batch_size", cfg.rollout.batch_size),
        ("eval.every", cfg.eval.every),
        ("log.samples_every", cfg.log.samples_every),
        ("model.lora_r", cfg.model.lora_r),
        ("model.sft_steps", cfg.model.sft_steps),
        ("reward.format_weight", cfg.reward.format_weight),
    ]:
        _positive(where, value, allow_zero=True)
    if not 0 < cfg.rollout.top_p <= 1:
        raise ValueError(f"rollout.top_p must be in (0, 1], got {cfg.rollout.top_p}")
    if not 0 <= cfg.optim.warmup_ratio < 1:
        raise ValueError(f"optim.warmup_ratio must be in [0, 1), got {cfg.optim.warmup_ratio}")
    if not 0 <= cfg.optim.min_lr_ratio <= 1:
        raise ValueError(f"optim.min_lr_ratio must be in [0, 1], got {cfg.optim.min_lr_ratio}")
    if cfg.rollout.prompts_per_step % cfg.optim.minibatch_groups:
        raise ValueError(
            f"optim.minibatch_groups={cfg.optim.minibatch_groups} must divide rollout.prompts_per_step="
            f"{cfg.rollout.prompts_per_step} (mini-batches hold whole groups)"
        )
    micro = cfg.optim.microbatch_groups
    if micro and cfg.optim.minibatch_groups % micro:
        raise ValueError(
            f"optim.microbatch_groups={micro} must divide optim.minibatch_groups={cfg.optim.minibatch_groups} "
            "(micro-batches hold whole groups); 0 = no accumulation"
        )
    if cfg.data.task == "jsonl" and not cfg.data.path:
        raise ValueError('data.task = "jsonl" needs data.path = "FILE.jsonl"')
    if cfg.data.task in ("hf", "reasoning_gym") and not cfg.data.name:
        raise ValueError(f'data.task = "{cfg.data.task}" needs data.name (e.g. "openai/gsm8k" or "gsm_symbolic")')
    if "{prompt}" not in cfg.data.prompt_template:
        raise ValueError(f"data.prompt_template must contain '{{prompt}}', got {cfg.data.prompt_template!r}")
    if cfg.reward.kind == "user" and ":" not in cfg.reward.user_fn:
        raise ValueError(f"reward.kind = \"user\" needs reward.user_fn = \"module:function\", got {cfg.reward.user_fn!r}")
    buckets = cfg.log.energy_buckets
    if not all(isinstance(b, (int, float)) and 0 < b < 1 for b in buckets) or list(buckets) != sorted(buckets):
        raise ValueError(f"log.energy_buckets must be increasing shares in (0, 1), got {buckets!r}")
    if cfg.reward.kind in ("equiv",) and cfg.data.task not in ("equiv", "add"):
        raise ValueError("reward.kind = \"equiv\" works only with data.task = \"add\" or \"equiv\"")


def config_to_toml(cfg: Config) -> str:
    """The resolved config as TOML text (tomllib reads it back to an equal Config)."""
    data = config_to_dict(cfg)
    top = [f"{k} = {_toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    lines = top + [""]
    for section, table in data.items():
        if not isinstance(table, dict):
            continue
        lines.append(f"[{section}]")
        nested = []
        for k, v in table.items():
            if isinstance(v, dict):
                nested.append((k, v))
            else:
                lines.append(f"{k} = {_toml_value(v)}")
        for k, v in nested:
            lines.append(f"{k} = {{ {', '.join(f'{kk} = {_toml_value(vv)}' for kk, vv in v.items())} }}")
        lines.append("")
    return "\n".join(lines)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise ValueError(f"cannot write {v!r} as TOML")
