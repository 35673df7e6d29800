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

import tomli_w

from dfpo.trainer.loss.correction import CORRECTIONS

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")
TASKS = ("add", "equiv", "jsonl", "reasoning_gym", "hf")
REWARD_KINDS = ("auto", "exact", "math_verify", "equiv", "reasoning_gym", "user")
CHAT_TEMPLATE = ("auto", "on", "off")
MOVED_KEYS = {
    "objective.advantage_scale": "the advantage estimator is a component of the objective: set objective.overrides.adv_scale "
    "(group, batch, none, rloo or reinforce_pp; leave it out for the preset's own)",
}
"""Keys that earlier versions accepted, and where their setting lives now."""
AMPS = ("auto", "bf16", "fp16", "none")
ENGINES = ("hf", "vllm")
PARALLEL = ("ddp", "fsdp2")


def bounded(default: float, low: float, high: float, *, low_open: bool = False, high_open: bool = False):
    """A numeric field whose bounds live with its definition; ``validate`` reads them."""
    return field(default=default, metadata={"bounds": (low, high, low_open, high_open)})


def one_of(default: str, choices: tuple[str, ...]):
    """A string field with a fixed set of values; ``validate`` reads them."""
    return field(default=default, metadata={"choices": choices})


def _number(x: float) -> str:
    """A bound as people write it: whole numbers in full (4294967295, not 4.29497e+09), others in %g."""
    return str(int(x)) if math.isfinite(x) and float(x).is_integer() else f"{x:g}"


def _interval(low: float, high: float, low_open: bool, high_open: bool) -> str:
    if high == math.inf:
        return f"{'>' if low_open else '>='} {_number(low)}"
    return f"in {'(' if low_open else '['}{_number(low)}, {_number(high)}{')' if high_open else ']'}"


def field_checks(cfg: Config) -> None:
    """Every field's bounds and choices, from the dataclass metadata; ValueError naming the key."""
    sections = [("", cfg)] + [(f.name + ".", getattr(cfg, f.name)) for f in fields(cfg) if dataclasses.is_dataclass(getattr(cfg, f.name))]
    for prefix, section in sections:
        for f in fields(section):
            value, where = getattr(section, f.name), prefix + f.name
            if "choices" in f.metadata and value not in f.metadata["choices"]:
                raise ValueError(f"{where} must be one of {', '.join(f.metadata['choices'])}; got {value!r}")
            if "bounds" in f.metadata:
                low, high, low_open, high_open = f.metadata["bounds"]
                inside = (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
                if not inside:
                    raise ValueError(f"{where} must be {_interval(low, high, low_open, high_open)}, got {value!r}")


@dataclass(frozen=True)
class ModelConfig:
    name: str = "tiny"
    """'tiny' (built-in offline preset), a local directory, or a hub name (needs the hub)."""
    dtype: str = one_of("auto", DTYPES)
    """Parameter dtype: auto (= float32 master weights), float32, bfloat16 (e.g. a frozen LoRA base), float16."""
    amp: str = one_of("auto", AMPS)
    """Autocast of forward passes: auto (bf16 on CUDA, none on CPU), bf16, fp16, none."""
    pad_token: str = ""
    """Pad token to use when the tokenizer has none: '' (fail with a message), 'eos', or a token string."""
    trust_remote_code: bool = False
    """Passed to from_pretrained."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (saves memory on large models)."""
    lora_r: int = bounded(0, 0, math.inf)
    """LoRA rank through peft; 0 trains every parameter."""
    lora_alpha: int = bounded(16, 0, math.inf, low_open=True)
    """LoRA alpha."""
    lora_dropout: float = bounded(0.0, 0, 1, high_open=True)
    """LoRA dropout (keep 0 for exact old/new log-prob agreement)."""
    lora_target_modules: str = "all-linear"
    """peft target_modules: 'all-linear' or a comma-separated list of module names."""
    tiny_hidden: int = bounded(64, 1, math.inf)
    """Tiny preset: hidden size."""
    tiny_layers: int = bounded(2, 1, math.inf)
    """Tiny preset: number of decoder layers."""
    tiny_heads: int = bounded(4, 1, math.inf)
    """Tiny preset: attention heads (key/value heads are half of these, at least 1)."""
    tiny_intermediate: int = bounded(256, 1, math.inf)
    """Tiny preset: MLP width."""
    sft_steps: int = bounded(300, 0, math.inf)
    """Tiny preset: supervised warm-start steps on the task's train split (0 = none)."""
    sft_batch_size: int = bounded(64, 1, math.inf)
    """Tiny preset: supervised batch size."""
    sft_lr: float = bounded(3e-3, 0, math.inf, low_open=True)
    """Tiny preset: supervised AdamW learning rate."""


@dataclass(frozen=True)
class DataConfig:
    task: str = one_of("add", TASKS)
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
    max_operand: int = bounded(99, 1, math.inf)
    """Built-in tasks: operands are drawn from 0..max_operand."""
    train_size: int = bounded(5000, 1, math.inf)
    """Built-in and reasoning_gym tasks: number of train problems generated."""
    eval_size: int = bounded(64, 1, math.inf)
    """Number of held-out problems for evaluation."""
    prompt_template: str = "{prompt}"
    """Prompt text with {prompt} replaced by the raw prompt (plain replacement: other braces stay)."""
    chat_template: str = one_of("auto", CHAT_TEMPLATE)
    """auto (use the tokenizer's chat template when it has one), on (require one), off."""
    enable_thinking: bool = False
    """Passed to chat templates that understand it (Qwen3)."""
    shuffle: bool = True
    """Shuffle the train split each epoch (seeded, resumable)."""
    truncate_prompts: bool = False
    """A prompt longer than the model's context minus rollout.max_new_tokens is an error naming its
    file and line; true keeps its last tokens instead (left truncation)."""


@dataclass(frozen=True)
class RewardConfig:
    kind: str = one_of("auto", REWARD_KINDS)
    """Correctness reward: auto (by task), exact, math_verify, equiv, reasoning_gym, user."""
    user_fn: str = ""
    """kind=user: 'module:function' called as fn(prompt=, completion=, answer=) -> float."""
    format_weight: float = bounded(0.0, 0, math.inf)
    """Weight of the format reward added to correctness (0 = off)."""
    format_regex: str = r"\\boxed\{.+\}"
    """A completion earns the format reward when this regex is found in it."""
    timeout_s: float = bounded(5.0, 0, math.inf, low_open=True)
    """Time limit of one reward call, in its worker process; a call still running after it has its worker killed
    (with what it started), gives 0 and is counted in reward/timeouts. A batch's calls run reward.workers at a time."""
    workers: int = bounded(0, 0, 256)
    """Worker processes that run user, math_verify and reasoning_gym rewards (0 = min(8, CPU count), shared out
    among the processes of a --nproc run); exact and equiv run in the trainer's process."""


@dataclass(frozen=True)
class RolloutConfig:
    engine: str = one_of("hf", ENGINES)
    """Rollout engine: 'hf' (the trainer's own model with a KV cache) or 'vllm' (vLLM in this process; see
    dfpo.trainer.llm.vllm_engine and scripts/vllm_env.sh)."""
    prompts_per_step: int = bounded(8, 1, math.inf)
    """Prompts sampled per rollout batch."""
    group_size: int = bounded(8, 2, math.inf)
    """Completions per prompt (G)."""
    max_new_tokens: int = bounded(8, 1, math.inf)
    """Generation length limit; completions that hit it are counted as truncated."""
    temperature: float = bounded(1.0, 0, math.inf, low_open=True)
    """Sampling temperature."""
    top_p: float = bounded(1.0, 0, 1, low_open=True)
    """Nucleus sampling (1 = off)."""
    top_k: int = bounded(0, 0, math.inf)
    """Top-k sampling (0 = off)."""
    mask_truncated: bool = False
    """Give completions that hit max_new_tokens zero loss weight (DAPO overlong filtering)."""
    batch_size: int = bounded(0, 0, math.inf)
    """Completions generated per generate() call; 0 = all at once."""
    correction: str = one_of("none", CORRECTIONS)
    """Rollout/trainer mismatch correction, a detached pi_old/pi_rollout weight on the policy term: none,
    token_truncate, token_mask, sequence_truncate, sequence_mask (sets the objective's rollout_correction)."""
    correction_low: float = bounded(0.5, 0, 1)
    """Mask modes: weights below this are zeroed."""
    correction_cap: float = bounded(2.0, 1, math.inf)
    """Truncate modes: the cap; mask modes: weights above it are zeroed."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling: drop groups whose rewards are all equal and draw more prompts to fill the batch."""
    max_extra_batches: int = bounded(3, 0, math.inf)
    """Dynamic sampling: at most this many extra rollout batches per step; then train on the groups at hand."""
    seed_per_group: bool = False
    """Sample every group from its own generator seeded by (seed, step, the group's index in the step), so the
    completions do not depend on how the prompts are batched or shared between processes; always on when
    training on more than one process (hf engine)."""
    old_logp: str = one_of("auto", ("auto", "sampler", "recompute"))
    """Where pi_old comes from: 'sampler' takes the log-probs the rollout engine sampled with (no extra forward
    pass); 'recompute' runs the trainer's model on the rollout (the first optimiser step's own forward serves its
    rows); 'auto' = 'sampler' when sampling is the policy itself (temperature 1, no top-k/top-p, float32, no
    autocast), else 'recompute'."""


@dataclass(frozen=True)
class ObjectiveConfig:
    name: str = "dfpo_min"
    """A preset of dfpo.OBJECTIVES (grpo, dr_grpo, dapo, gspo, dfpo_min, dfpo_orth, ...)."""
    overrides: dict = field(default_factory=dict)
    """ObjectiveSpec fields to override (eps_low, eps_high, transform, stopgrad, beta, ...)."""
    advantage_eps: float = bounded(1e-4, 0, math.inf)
    """Epsilon added to the std in advantage scaling."""


@dataclass(frozen=True)
class OptimConfig:
    lr: float = bounded(1e-4, 0, math.inf, low_open=True)
    """Peak learning rate."""
    weight_decay: float = bounded(0.0, 0, math.inf)
    """AdamW weight decay."""
    beta1: float = bounded(0.9, 0, 1, high_open=True)
    """AdamW beta1."""
    beta2: float = bounded(0.999, 0, 1, high_open=True)
    """AdamW beta2."""
    adam_eps: float = bounded(1e-8, 0, math.inf, low_open=True)
    """AdamW epsilon."""
    max_grad_norm: float = bounded(1.0, 0, math.inf)
    """Clip the global gradient norm to this (0 = no clipping)."""
    warmup_ratio: float = bounded(0.03, 0, 1, high_open=True)
    """Linear warmup over this share of all optimiser steps (the paper: 3%)."""
    min_lr_ratio: float = bounded(0.2, 0, 1)
    """Cosine decay ends at lr * min_lr_ratio (the paper: 0.2)."""
    minibatch_groups: int = bounded(1, 1, math.inf)
    """Whole groups per optimiser step; prompts_per_step / minibatch_groups steps per epoch."""
    microbatch_groups: int = bounded(0, 0, math.inf)
    """Whole groups per forward/backward (gradient accumulation); 0 = the whole mini-batch."""
    max_tokens_per_microbatch: int = bounded(0, 0, math.inf)
    """Token budget of one forward/backward: micro-batches of whole groups whose rows x longest row fit it
    (a larger group alone); 0 = split by microbatch_groups instead."""
    epochs: int = bounded(1, 1, math.inf)
    """Passes over each rollout batch; K = epochs * prompts_per_step / minibatch_groups."""


@dataclass(frozen=True)
class TrainConfig:
    steps: int = bounded(50, 1, math.inf)
    """Rollout batches (training steps) in the run."""
    save_every: int = bounded(10, 1, math.inf)
    """Write a checkpoint every this many steps (and at the end)."""
    max_nonfinite_in_row: int = bounded(3, 1, math.inf)
    """Stop after this many optimiser steps in a row with a non-finite loss or gradient."""
    parallel: str = one_of("ddp", PARALLEL)
    """Several processes (torchrun, or dfpo train --nproc N): 'ddp' keeps a full model on every process and sums
    the gradients; 'fsdp2' shards the decoder layers' parameters, gradients and optimiser state (torch fully_shard;
    embeddings, final norm and LM head stay whole). Checkpoints hold whole tensors either way. One process: unused."""


@dataclass(frozen=True)
class EvalConfig:
    every: int = bounded(10, 0, math.inf)
    """Evaluate every this many steps (0 = never); also at step 0 and the end."""
    k: int = bounded(4, 1, math.inf)
    """Samples per eval prompt for avg@k."""
    temperature: float = bounded(1.0, 0, math.inf, low_open=True)
    """Eval sampling temperature."""
    kappa: float = bounded(0.5, -math.inf, math.inf)
    """Threshold of Steps(reward >= kappa) (eq 19), on the train reward curve."""


@dataclass(frozen=True)
class LogConfig:
    samples_every: int = bounded(10, 0, math.inf)
    """Write sample completions every this many steps (0 = never)."""
    samples_per_step: int = bounded(4, 0, math.inf)
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
    seed: int = bounded(0, 0, 2**32 - 1)
    """Seed of data, model init, sampling (NumPy and the seeds derived from it need it below 2^32)."""
    run_dir: str = "runs/default"
    """Output folder (created; must be empty or absent unless resuming)."""
    device: str = one_of("auto", DEVICES)
    """auto (cuda when available), cpu, cuda."""
    threads: int = bounded(0, 0, math.inf)
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
        if f"{name}.{key}" in MOVED_KEYS:
            raise ValueError(f"config key {name}.{key} is no longer read: {MOVED_KEYS[f'{name}.{key}']}")
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
        from dfpo.files import read_utf8

        try:
            raw = tomllib.loads(read_utf8(p))
        except tomllib.TOMLDecodeError as err:
            raise ValueError(f"--config {path}: not valid TOML: {err}") from None
    return config_from_dict(apply_overrides(raw, list(assignments)))


def validate(cfg: Config) -> None:
    """Cross-field checks that need no model, data or network. Raises ValueError."""
    from dfpo import OBJECTIVES, resolve_objective

    field_checks(cfg)
    if cfg.objective.name not in OBJECTIVES:
        raise ValueError(f"objective.name must be one of {', '.join(OBJECTIVES)}; got {cfg.objective.name!r}")
    try:
        resolve_objective(cfg.objective.name, **cfg.objective.overrides)
    except (TypeError, ValueError) as err:
        raise ValueError(f"objective.overrides {cfg.objective.overrides!r}: {err}") from None
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
    if cfg.rollout.seed_per_group and cfg.rollout.engine != "hf":
        raise ValueError(f"rollout.seed_per_group = true needs rollout.engine = 'hf'; got rollout.engine = {cfg.rollout.engine!r}")
    if cfg.data.task == "jsonl" and not cfg.data.path:
        raise ValueError('data.task = "jsonl" needs data.path = "FILE.jsonl"')
    if cfg.data.task in ("hf", "reasoning_gym") and not cfg.data.name:
        raise ValueError(f'data.task = "{cfg.data.task}" needs data.name (e.g. "openai/gsm8k" or "gsm_symbolic")')
    if "{prompt}" not in cfg.data.prompt_template:
        raise ValueError(f"data.prompt_template must contain '{{prompt}}', got {cfg.data.prompt_template!r}")
    if cfg.reward.kind == "user" and ":" not in cfg.reward.user_fn:
        raise ValueError(f'reward.kind = "user" needs reward.user_fn = "module:function", got {cfg.reward.user_fn!r}')
    buckets = cfg.log.energy_buckets
    if not all(isinstance(b, (int, float)) and 0 < b < 1 for b in buckets) or list(buckets) != sorted(buckets):
        raise ValueError(f"log.energy_buckets must be increasing shares in (0, 1), got {buckets!r}")
    if cfg.reward.kind in ("equiv",) and cfg.data.task not in ("equiv", "add"):
        raise ValueError('reward.kind = "equiv" works only with data.task = "add" or "equiv"')


def config_to_toml(cfg: Config) -> str:
    """The resolved config as TOML text (tomllib reads it back to an equal Config; every string escaped, control
    characters included)."""
    return dict_to_toml(config_to_dict(cfg))


def dict_to_toml(data: dict) -> str:
    """A config dict (``config_to_dict``, or one read back from JSON) as TOML text."""
    return tomli_w.dumps(data)


def flat_items(table: dict, prefix: str = "") -> dict[str, Any]:
    """``{"optim": {"lr": 1e-4}}`` -> ``{"optim.lr": 1e-4}`` (nested tables as dotted keys)."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict) and value:
            out.update(flat_items(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_differences(a: dict, b: dict, *, ignore: tuple[str, ...] = ()) -> list[str]:
    """Dotted keys whose values differ between two config dicts (``config_to_dict``), except ``ignore`` and the
    keys under them."""
    fa, fb = flat_items(a), flat_items(b)
    skipped = lambda key: any(key == p or key.startswith(p + ".") for p in ignore)  # noqa: E731
    return sorted(k for k in set(fa) | set(fb) if not skipped(k) and fa.get(k, _MISSING) != fb.get(k, _MISSING))


_MISSING = object()

RESUME_SETTABLE = ("train.steps", "train.save_every", "log.progress", "log.samples_every", "eval.every", "train.parallel")
"""Keys that --set may change when resuming without breaking exact continuation."""
RESUME_IGNORED = (*RESUME_SETTABLE, "run_dir")
"""Config keys a resume may change: those --set may change with --resume, and where the folder now is."""


def check_same_config(run_dir: str | Path, saved: dict | None, cfg: Config) -> None:
    """ValueError naming each key (and both values) in which ``cfg`` differs from the config the checkpoint was made
    with (``saved``), the resume-settable keys aside; nothing to check for a checkpoint of an older dfpo (None)."""
    if saved is None:
        return
    current = config_to_dict(cfg)
    diff = config_differences(saved, current, ignore=RESUME_IGNORED)
    if diff:
        raise ValueError(config_mismatch_message(run_dir, diff, saved, current))


def config_mismatch_message(run_dir: str | Path, keys: list[str], saved: dict, current: dict) -> str:
    a, b = flat_items(saved), flat_items(current)
    shown = ", ".join(f"{k} ({a.get(k)!r} in the checkpoint, {b.get(k)!r} in config.toml)" for k in keys[:5])
    more = f" and {len(keys) - 5} more" if len(keys) > 5 else ""
    return (
        f"--resume {run_dir}: {Path(run_dir) / 'config.toml'} differs from the config checkpoint.pt was made with: {shown}{more}. "
        "A resume continues that run exactly: put config.toml back as it was (dfpo train --resume RUN --restore-config "
        "writes it from the checkpoint), or start a new run with --config"
    )
