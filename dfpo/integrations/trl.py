"""dfpo's objectives in TRL: ``DFPOGRPOTrainer``, a ``trl.GRPOTrainer`` whose loss is ``dfpo.policy_loss``.

    from dfpo.integrations.trl import DFPOGRPOTrainer
    trainer = DFPOGRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...), train_dataset=..., objective="dfpo_min")
    trainer.train()

Everything else is TRL's: generation (transformers or a vLLM server), rewards, advantages, the optimiser,
accelerate / DeepSpeed, logging. Two methods change:

- ``_prepare_inputs``: TRL shuffles the rows of a generation batch before cutting it into the
  ``steps_per_generation`` slices, which scatters a group's completions over several optimiser steps.
  DFPO's transforms need a whole group in one loss call, so the group order is shuffled instead (the
  completions of a prompt stay together) and every slice must hold whole groups: the slice size
  (``per_device_train_batch_size``; ``per_device_eval_batch_size`` for evaluation, with
  ``num_generations_eval``) must be a multiple of the group size (checked at construction). Before the
  shuffle, each block of ``num_generations`` consecutive rows is checked to share one prompt. Each row carries
  its group id into the loss; ids are unique across processes.
- ``_compute_loss``: per-token log-probs as TRL computes them, then ``dfpo.policy_loss`` with the objective
  (any preset or label, e.g. ``"dfpo_min:stopgrad=score"``), TRL's old and reference log-probs; every call
  checks that it holds whole groups. dfpo's metrics (``weights/asym``, clip fractions, ...) are logged through
  TRL's logger under ``dfpo/``, combined over the processes and over TRL's logging window by each key's declared
  reduction (``dfpo.core.metric_registry``: ``ratio/max`` stays a maximum, a count a sum).

Several processes (``accelerate launch``): each process builds its own generation batch from TRL's
``RepeatSampler`` (every prompt ``num_generations`` times in a row, the same order on every process), and
accelerate gives process p every p-th run of ``per_device_train_batch_size x steps_per_generation``
consecutive rows. TRL only asks the global batch to be a multiple of ``num_generations``, so a per-device batch
that is not a multiple splits groups across processes (per-device 2 with 4 generations on 2 processes puts 2
rows of every group on each); that is refused at construction. With a multiple, every process holds whole
groups, and TRL's advantages (computed on the rewards gathered from all processes, ``num_generations``
consecutive rows a group) are normalised over exactly the groups the loss sees.

Rollout correction: an objective's own ``rollout_correction`` / ``rollout_rejection`` reads TRL's
``sampling_per_token_logps`` (vLLM's, so ``use_vllm=True``; refused without) and replaces TRL's vLLM importance-sampling
correction. An objective without one gets TRL's (on by default under vLLM) as dfpo's correction of the same mode
(``trl_correction_overrides``: the same weight, cross-checked in ``tests/core/test_trl_crosscheck.py``). vLLM's
log-probs are those of the top-k / top-p truncated distribution (TRL issue 6789): TRL's own correction carries that
bias as TRL does; an objective's own correction with truncated sampling is refused.

Skywork-OR1's adaptive entropy coefficient (an objective with ``entropy_target``): ``AdaptiveEntropyCallback`` keeps
its state (coef, enabled) between optimiser steps. Every training loss call of a step uses the coefficient the
previous steps left (``entropy_coef`` at the first) and adds its pi_old tokens to the step's measure; after the
optimiser step, -mean log pi_old over the step's real tokens on every process moves the state once with the loss
core's ``next_entropy_control`` (the rule dfpo's own trainer calls), and ``dfpo/entropy/coef`` (the coefficient the
step used) and ``dfpo/entropy/controlled`` (the measure) reach TRL's log. A TRL step is an optimiser step, so with
``steps_per_generation`` > 1 the coefficient moves several times per generation batch (dfpo train and Skywork-OR1 move
it once per rollout batch): ``entropy_coef_delta`` is per optimiser step. TRL checkpoints keep the state in
trainer_state.json (``stateful_callbacks``, plain floats and a bool, with the four settings), and
``resume_from_checkpoint`` restores it whatever ``restore_callback_states_from_checkpoint`` says; a checkpoint
without it, or written with other settings, is refused before its weights load.

What stays TRL's and is not translated: the KL term is the objective's (``kl_estimator``; TRL's
``use_bias_correction_kl`` is ``kl_ratio_weight``, not read from TRL's config), TRL's ``loss_type``, ``epsilon``, ``delta``, ``top_entropy_quantile`` and
``off_policy_mask_threshold`` are ignored in favour of the objective's components (a warning says so when
they differ from TRL's defaults), and gradient accumulation divides each micro-batch loss by the number of
accumulation steps, as TRL's ``grpo`` loss does; the processes' gradients are averaged by DDP. Each loss call
is thus normalised over its own rows: with several processes or accumulation steps, a token-level
aggregation's denominator is that call's, not the whole batch's as in dfpo's own trainer.
"""

from __future__ import annotations

import math
import os
import warnings

import torch

from dfpo.core.loss import ObjectiveSpec, objective_from_label, policy_loss
from dfpo.core.loss.adaptive_entropy import EntropyControl, initial_entropy_control, measured_entropy, next_entropy_control
from dfpo.core.loss.advantages import GREEDY_BASELINE, TOKEN_LEVEL
from dfpo.core.metric_registry import reduce_values
from dfpo.trainer.entropy_control import step_spec

try:
    from accelerate.utils import gather_object
    from transformers import TrainerCallback, TrainerState
    from transformers.trainer_callback import ExportableState
    from transformers.trainer_utils import get_last_checkpoint
    from trl import GRPOTrainer
    from trl.trainer.utils import split_tensor_dict
except ImportError as err:  # pragma: no cover - the [dev] extra installs TRL
    raise ImportError("dfpo.integrations.trl needs TRL: pip install 'trl==1.16.*'") from err

GROUP_KEY = "dfpo_group_ids"
DFPO_PREFIX = "dfpo/"
"""dfpo's metrics in TRL's logs: ``dfpo/<key of dfpo.core.metric_registry>``."""


def shuffle_groups(batch: dict, group_size: int, generator: torch.Generator | None = None, first_group: int = 0) -> dict:
    """The rows of a generation batch (prompt-major, ``group_size`` consecutive rows a prompt) in a random group
    order, each group's rows kept together, with a ``dfpo_group_ids`` entry (B,) naming each row's group:
    ``first_group`` + its block index (a process's offset makes the ids unique across processes)."""
    n_rows = next(len(v) for v in batch.values() if isinstance(v, torch.Tensor) and v.ndim >= 1)
    if n_rows % group_size:
        raise ValueError(f"a generation batch of {n_rows} rows does not hold whole groups of num_generations={group_size}")
    n_groups = n_rows // group_size
    order = torch.randperm(n_groups, generator=generator)
    rows = (order[:, None] * group_size + torch.arange(group_size)).flatten()  # (B,)

    def permute(v):
        if v is None or (isinstance(v, torch.Tensor) and v.ndim == 0):
            return v
        if isinstance(v, torch.Tensor):
            return v[rows.to(v.device)]
        return [v[i] for i in rows.tolist()]

    out = {k: permute(v) for k, v in batch.items()}
    device = next(v.device for v in batch.values() if isinstance(v, torch.Tensor))
    out[GROUP_KEY] = (first_group + rows // group_size).to(device)
    return out


def check_group_prompts(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, group_size: int) -> None:
    """ValueError unless each block of ``group_size`` consecutive rows of a generation batch holds one prompt
    (prompt_ids, prompt_mask (B, P) equal within the block): the rows TRL normalised as a group are the rows
    dfpo's loss will treat as one."""
    n_rows = prompt_ids.size(0)
    if n_rows % group_size:
        raise ValueError(f"a generation batch of {n_rows} rows does not hold whole groups of num_generations={group_size}")
    ids = prompt_ids.reshape(n_rows // group_size, group_size, -1)  # (n, G, P)
    mask = prompt_mask.reshape(n_rows // group_size, group_size, -1)  # (n, G, P)
    same = (ids == ids[:, :1]).all(dim=(1, 2)) & (mask == mask[:, :1]).all(dim=(1, 2))  # (n,)
    if not bool(same.all()):
        block = int((~same).nonzero()[0])
        raise ValueError(
            f"rows {block * group_size}..{(block + 1) * group_size - 1} of this process's generation batch are not one "
            f"prompt's completions: the data loader did not give this process whole groups of num_generations={group_size}"
        )


def check_whole_groups(group_ids: torch.Tensor, group_size: int) -> list[int]:
    """The rows per group present in ``group_ids`` (B,); ValueError unless each has all ``group_size`` rows."""
    counts = torch.bincount(group_ids)
    present = counts[counts > 0].tolist()
    if any(n != group_size for n in present):
        raise ValueError(f"a loss call holds part of a group (rows per group {present}, num_generations={group_size})")
    return present


def trl_correction_overrides(args) -> dict[str, object]:
    """TRL's vLLM importance-sampling correction as dfpo overrides: the mode of the same name, clip_max as the cap, clip_min
    (None: none) as the mask modes' lower bound and the truncate modes' floor."""
    low = args.vllm_importance_sampling_clip_min or 0.0
    cap = args.vllm_importance_sampling_clip_max
    return {
        "rollout_correction": args.vllm_importance_sampling_mode,
        "rollout_cap": float("inf") if cap is None else cap,
        "rollout_low": low,
        "rollout_floor": low,
    }


ENTROPY_SETTINGS = ("entropy_target", "entropy_coef_delta", "entropy_coef_min", "entropy_coef_max")
"""The objective's fields that move the adaptive entropy coefficient: a checkpoint keeps them beside the state."""


def saved_entropy_control(entry, spec: ObjectiveSpec, checkpoint: str) -> EntropyControl | None:
    """The adaptive entropy state a TRL checkpoint's trainer_state.json keeps (``entry``: its
    ``stateful_callbacks["AdaptiveEntropyCallback"]``, None when absent) for an objective ``spec``; None when neither
    sets it. ValueError in one sentence when the checkpoint and the objective disagree, or the entry is malformed."""
    name, wanted = spec.name, {k: getattr(spec, k) for k in ENTROPY_SETTINGS}
    if spec.entropy_target is None:
        if entry is not None:
            raise ValueError(
                f"checkpoint {checkpoint} holds Skywork-OR1's adaptive entropy state ({entry!r}) but objective {name!r} sets no "
                "entropy_target: resume with the objective that wrote it, or start a new run"
            )
        return None
    attributes = entry.get("attributes") if isinstance(entry, dict) else None
    coef = attributes.get("coef") if isinstance(attributes, dict) else None
    enabled = attributes.get("enabled") if isinstance(attributes, dict) else None
    if not isinstance(coef, float) or not math.isfinite(coef) or not isinstance(enabled, bool):
        raise ValueError(
            f"checkpoint {checkpoint} holds no adaptive entropy state (AdaptiveEntropyCallback: {entry!r}) although objective "
            f"{name!r} sets entropy_target={spec.entropy_target!r}: it was not written with this objective, so start a new run"
        )
    if entry.get("args") != wanted:
        raise ValueError(
            f"checkpoint {checkpoint} moved the adaptive entropy coefficient with {entry.get('args')!r}, objective {name!r} with "
            f"{wanted!r}: resume with the same settings, or start a new run"
        )
    return EntropyControl(coef=coef, enabled=enabled)


class AdaptiveEntropyCallback(TrainerCallback, ExportableState):
    """Skywork-OR1's adaptive entropy coefficient (``dfpo.core.loss.adaptive_entropy``) carried between TRL's optimiser
    steps, as dfpo's own trainer carries it between its steps (``dfpo.trainer.entropy_control``).

    Each training loss call of an optimiser step uses ``entropy_control.coef_in_loss`` and adds its pi_old tokens to
    the step's measure (``observe``); ``on_step_end`` (after the optimiser step, before TRL logs and saves) moves the
    state once with ``next_entropy_control`` from -mean log pi_old over the step's real tokens on every process, and
    logs ``entropy/coef`` (the coefficient the step's loss used) and ``entropy/controlled`` (the measure that moved
    it). ``state()`` is the entry of a checkpoint's trainer_state.json: the settings and the state, plain floats and
    a bool (JSON keeps every bit of a float)."""

    def __init__(self, spec: ObjectiveSpec, sum_over_processes, log):
        self.spec = spec
        self.entropy_control = initial_entropy_control(spec)
        self._sum_over_processes, self._log = sum_over_processes, log
        self._surprisal, self._tokens = 0.0, 0  # this process's training loss calls since the last optimiser step

    def observe(self, old_logp: torch.Tensor, mask: torch.Tensor) -> None:
        """Adds a training loss call's pi_old log-probs (B, T) over its real tokens ``mask`` (B, T) to the step's measure."""
        tokens = int(mask.sum())
        self._surprisal += measured_entropy(old_logp, mask) * tokens
        self._tokens += tokens

    def on_step_end(self, args, state, control, **kwargs):
        totals = self._sum_over_processes(torch.tensor([self._surprisal, float(self._tokens)], dtype=torch.float64))  # (2,)
        measured = float(totals[0] / totals[1].clamp(min=1))  # as measured_entropy: 0 for a step without real tokens
        self._log({"entropy/coef": self.entropy_control.coef_in_loss, "entropy/controlled": measured})
        self.entropy_control = next_entropy_control(self.entropy_control, measured, self.spec)
        self._surprisal, self._tokens = 0.0, 0
        return control

    def state(self) -> dict:
        return {
            "args": {k: getattr(self.spec, k) for k in ENTROPY_SETTINGS},
            "attributes": {"coef": float(self.entropy_control.coef), "enabled": bool(self.entropy_control.enabled)},
        }


class DFPOGRPOTrainer(GRPOTrainer):
    """``trl.GRPOTrainer`` with ``dfpo.policy_loss`` as its loss and whole groups in every loss call, on every process."""

    def __init__(self, *args, objective: str | ObjectiveSpec = "dfpo_min", **kwargs):
        self.dfpo_spec = objective if isinstance(objective, ObjectiveSpec) else objective_from_label(objective)
        super().__init__(*args, **kwargs)
        self._check_batch_sizes()
        needs_ref = self.dfpo_spec.required_inputs().get("ref_logp")
        if needs_ref is not None and not self.args.beta:
            raise ValueError(
                f"objective {self.dfpo_spec.name!r} reads the reference log-probs ({needs_ref}): set GRPOConfig(beta=...) > 0 so TRL "
                "computes them (with a dfpo objective, TRL's beta only switches them on)"
            )
        ignored = {
            k: getattr(self.args, k)
            for k in ("top_entropy_quantile", "off_policy_mask_threshold", "delta")
            if getattr(self.args, k) not in (None, 1.0)
        }
        if ignored:
            warnings.warn(f"DFPOGRPOTrainer: the objective's components replace TRL's {ignored}", stacklevel=2)
        self._check_rollout_inputs()
        self._check_advantage_estimator()
        self.dfpo_groups_seen: list[list[int]] = []  # rows per group of every loss call (the check's record)
        self.dfpo_entropy: AdaptiveEntropyCallback | None = None  # Skywork-OR1's coefficient, when entropy_target is set
        if self.dfpo_spec.entropy_target is not None:
            self.dfpo_entropy = AdaptiveEntropyCallback(self.dfpo_spec, self._sum_over_processes, self._log_train_metrics)
            self.add_callback(self.dfpo_entropy)
        self._dfpo_resumed_entropy: EntropyControl | None = None

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """TRL's train; a resume is first checked to hold the adaptive entropy state this objective needs (before the
        checkpoint's weights load)."""
        self._dfpo_resumed_entropy = self._entropy_control_of(resume_from_checkpoint)
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _entropy_control_of(self, resume_from_checkpoint) -> EntropyControl | None:
        """The adaptive entropy state in the checkpoint a resume reads (True: the last in output_dir), None when there is
        none to read; transformers reports a missing checkpoint itself."""
        checkpoint = resume_from_checkpoint
        if isinstance(checkpoint, bool):
            checkpoint = get_last_checkpoint(self.args.output_dir) if checkpoint and os.path.isdir(self.args.output_dir) else None
        path = None if checkpoint is None else os.path.join(checkpoint, "trainer_state.json")
        if path is None or not os.path.isfile(path):
            return None
        entry = TrainerState.load_from_json(path).stateful_callbacks.get(AdaptiveEntropyCallback.__name__)
        return saved_entropy_control(entry, self.dfpo_spec, checkpoint)

    def _load_callback_state(self) -> None:
        """A resume restores the adaptive entropy state whatever ``restore_callback_states_from_checkpoint`` says (it is
        part of the optimisation, as the scheduler's state is); transformers restores the other callbacks as it does."""
        saved = self.state.stateful_callbacks
        if self.dfpo_entropy is not None and self._dfpo_resumed_entropy is not None:
            self.dfpo_entropy.entropy_control = self._dfpo_resumed_entropy
        self.state.stateful_callbacks = {k: v for k, v in saved.items() if k != AdaptiveEntropyCallback.__name__}
        try:  # transformers would rebuild the callback from its state alone, without the trainer it reports to
            super()._load_callback_state()
        finally:
            self.state.stateful_callbacks = saved

    def _sum_over_processes(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` (float64) summed over the processes (every process calls this at the same optimiser step)."""
        if self.accelerator.num_processes == 1:
            return values
        return self.accelerator.reduce(values.to(self.accelerator.device), reduction="sum").cpu()

    def _log_train_metrics(self, metrics: dict[str, float]) -> None:
        """dfpo's metrics of a training step into TRL's logging window, under ``dfpo/``."""
        for key, value in metrics.items():
            self._metrics["train"][f"{DFPO_PREFIX}{key}"].append(value)

    def _check_rollout_inputs(self) -> None:
        """An objective that reads the sampler's log-probs needs vLLM's (TRL returns none otherwise), untruncated."""
        needs = self.dfpo_spec.required_inputs().get("rollout_logp")
        if needs is None:
            return
        if not self.args.use_vllm:
            raise ValueError(
                f"objective {self.dfpo_spec.name!r} reads the sampler's log-probs ({needs}): TRL returns them only with GRPOConfig(use_vllm=True)"
            )
        truncating = (self.args.top_p or 1.0) < 1.0 or (self.args.top_k or 0) > 0 or (self.args.min_p or 0.0) > 0
        if truncating:
            raise ValueError(
                f"objective {self.dfpo_spec.name!r} reads the sampler's log-probs ({needs}), but under top_p / top_k / min_p vLLM returns "
                "those of the truncated distribution, whose ratio to pi_old carries the kept mass (TRL issue 6789): sample without truncation"
            )

    def _check_advantage_estimator(self) -> None:
        """TRL computes the advantages: an objective whose estimator is GDPO needs TRL's own (multi_objective_aggregation=
        'normalize_then_sum', the same computation); ReMax's greedy completion TRL does not generate, so it is refused."""
        scale = self.dfpo_spec.adv_scale
        if scale == "gdpo" and self.args.multi_objective_aggregation != "normalize_then_sum":
            raise ValueError(
                f"objective {self.dfpo_spec.name!r} uses adv_scale='gdpo', which TRL computes as "
                f"GRPOConfig(multi_objective_aggregation='normalize_then_sum'), got {self.args.multi_objective_aggregation!r}"
            )
        if scale in TOKEN_LEVEL:
            raise ValueError(
                f"objective {self.dfpo_spec.name!r} uses adv_scale={scale!r}, one advantage per token, which neither TRL "
                "computes nor dfpo's loss takes (one per completion)"
            )
        if scale in GREEDY_BASELINE:
            raise ValueError(
                f"objective {self.dfpo_spec.name!r} uses adv_scale={scale!r}, whose baseline is a greedy completion per prompt that "
                "TRL's GRPOTrainer does not generate: train it with dfpo train, or in verl with algorithm.adv_estimator='remax'"
            )

    def _check_batch_sizes(self) -> None:
        """Each process's loss calls must hold whole groups. TRL only asks the global batches to be multiples of
        the group size, so with several processes a group can straddle two of them (e.g. per-device 2, 4
        generations, 2 processes): refused here, naming the setting."""
        sizes = [("per_device_train_batch_size", self.args.per_device_train_batch_size, "num_generations", self.num_generations)]
        if self.args.eval_strategy != "no":
            sizes.append(
                ("per_device_eval_batch_size", self.args.per_device_eval_batch_size, "num_generations_eval", self.num_generations_eval)
            )
        for name, size, group_name, group in sizes:
            if size % group:
                raise ValueError(
                    f"{name}={size} must be a multiple of {group_name}={group}: dfpo's objectives need whole groups "
                    f"in each loss call of each process ({self.accelerator.num_processes} process(es))"
                )

    def _group_size(self) -> int:
        return self.num_generations if self.model.training else self.num_generations_eval

    def _whole_groups(self, batch: dict, seed: int) -> dict:
        """A generation batch of this process, checked to hold whole groups, in a shuffled group order with group
        ids unique across processes (process p's groups follow those of processes 0..p-1, as in TRL's gather)."""
        group = self._group_size()
        if self.environment_factories is None:  # an environment may give a group's rollouts different prompts
            check_group_prompts(batch["prompt_ids"], batch["prompt_mask"], group)
        n_groups = batch["prompt_ids"].size(0) // group
        first = self.accelerator.process_index * n_groups
        return shuffle_groups(batch, group, torch.Generator().manual_seed(seed), first_group=first)

    def _prepare_inputs(self, generation_batch):
        if not self.model.training:
            return self._whole_groups(self._generate_and_score_completions(generation_batch), seed=0)
        generate_every = self.args.steps_per_generation * self.num_iterations
        if self._step % generate_every == 0 or self._buffered_inputs is None:
            batch = self._generate_and_score_completions(generation_batch)
            batch = self._whole_groups(batch, seed=int(self.args.seed) * 1_000_003 + int(self._step))
            self._buffered_inputs = split_tensor_dict(batch, self.args.steps_per_generation)
        return self._buffered_inputs[self._step % self.args.steps_per_generation]

    def _compute_loss(self, model, inputs):
        spec = self.dfpo_spec if self.dfpo_entropy is None else step_spec(self.dfpo_spec, self.dfpo_entropy.entropy_control)
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        needs_entropy = spec.needs_entropy
        logp, entropy, _ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=needs_entropy
        )  # (B, T) each
        group_ids = inputs[GROUP_KEY]  # (B,)
        self.dfpo_groups_seen.append(check_whole_groups(group_ids, self._group_size()))
        old = inputs.get("old_per_token_logps")
        advantages = inputs["advantages"]
        rollout_logp, extra = inputs.get("sampling_per_token_logps"), {}
        if not spec.needs_rollout_logp and "importance_sampling_ratio" in inputs:  # TRL's own vLLM IS correction
            extra = trl_correction_overrides(self.args)
        old_logp = logp.detach() if old is None else old  # (B, T)
        if self.dfpo_entropy is not None and self.model.training:
            self.dfpo_entropy.observe(old_logp, completion_mask.bool())
        loss, metrics = policy_loss(
            spec,
            logp=logp,
            old_logp=old_logp,
            advantages=advantages if advantages.ndim == 1 else advantages[:, 0],
            mask=completion_mask.bool(),
            group_ids=group_ids,
            entropy=entropy if needs_entropy else None,
            ref_logp=inputs.get("ref_per_token_logps") if spec.needs_ref_logp else None,
            rollout_logp=rollout_logp if (spec.needs_rollout_logp or extra) else None,
            token_ids=completion_ids if spec.needs_token_ids else None,  # the exact-cancellation arm: a group shares its prompt
            **extra,
        )
        mode = "train" if self.model.training else "eval"
        for key, value in self._across_processes({k: float(v) for k, v in metrics.items()}).items():
            self._metrics[mode][f"{DFPO_PREFIX}{key}"].append(value)
        if mode == "train":  # the Trainer loop sets the window's step count; outside it, the configured one
            loss = loss / getattr(self, "current_gradient_accumulation_steps", self.args.gradient_accumulation_steps)
        return loss

    def _across_processes(self, metrics: dict[str, float]) -> dict[str, float]:
        """One loss call's metrics over all processes, each key by its declared reduction (every process calls
        this once a loss call, as TRL gathers its own loss metrics)."""
        if self.accelerator.num_processes == 1:
            return metrics
        per_process = gather_object([metrics])  # one dict a process
        values = {k: [m[k] for m in per_process if k in m] for k in sorted({k for m in per_process for k in m})}
        return {k: reduce_values(k, v) for k, v in values.items()}

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """TRL averages every metric over its logging window; dfpo's keys are first combined by their declared
        reduction (a maximum over the window, a sum of counts), so TRL's average of one value keeps it."""
        mode = "train" if self.model.training else "eval"
        window = self._metrics[mode]
        for key in [k for k in window if k.startswith(DFPO_PREFIX) and window[k]]:
            window[key] = [reduce_values(key.removeprefix(DFPO_PREFIX), window[key])]
        super().log(logs, start_time)
