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
  (``per_device_train_batch_size``) must be a multiple of ``num_generations`` (checked at construction).
  Each row carries its group id into the loss.
- ``_compute_loss``: per-token log-probs as TRL computes them, then ``dfpo.policy_loss`` with the objective
  (any preset or label, e.g. ``"dfpo_min:stopgrad=score"``), TRL's old and reference log-probs; dfpo's
  metrics (``weights/asym``, clip fractions, ...) are logged through TRL's logger under ``dfpo/``.

What stays TRL's and is not translated: the KL term uses dfpo's k3 (TRL's ``use_bias_correction_kl`` is not
applied), TRL's ``loss_type``, ``epsilon``, ``delta``, ``top_entropy_quantile`` and
``off_policy_mask_threshold`` are ignored in favour of the objective's components (a warning says so when
they differ from TRL's defaults), and gradient accumulation divides each micro-batch loss by the number of
accumulation steps, as TRL's ``grpo`` loss does.
"""

from __future__ import annotations

import warnings

import torch

from dfpo.trainer.loss import ObjectiveSpec, objective_from_label, policy_loss
from dfpo.trainer.loss.masks import ENTROPY_MASKS

try:
    from trl import GRPOTrainer
    from trl.trainer.utils import split_tensor_dict
except ImportError as err:  # pragma: no cover - the [dev] extra installs TRL
    raise ImportError("dfpo.integrations.trl needs TRL: pip install 'trl==1.16.*'") from err

GROUP_KEY = "dfpo_group_ids"


def shuffle_groups(batch: dict, group_size: int, generator: torch.Generator | None = None) -> dict:
    """The rows of a generation batch (prompt-major, ``group_size`` consecutive rows a prompt) in a random group
    order, each group's rows kept together, with a ``dfpo_group_ids`` entry (B,) naming each row's group."""
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
    out[GROUP_KEY] = (rows // group_size).to(device)
    return out


def check_whole_groups(group_ids: torch.Tensor, group_size: int) -> list[int]:
    """The rows per group present in ``group_ids`` (B,); ValueError unless each has all ``group_size`` rows."""
    counts = torch.bincount(group_ids)
    present = counts[counts > 0].tolist()
    if any(n != group_size for n in present):
        raise ValueError(f"a loss call holds part of a group (rows per group {present}, num_generations={group_size})")
    return present


class DFPOGRPOTrainer(GRPOTrainer):
    """``trl.GRPOTrainer`` with ``dfpo.policy_loss`` as its loss and whole groups in every loss call."""

    def __init__(self, *args, objective: str | ObjectiveSpec = "dfpo_min", **kwargs):
        self.dfpo_spec = objective if isinstance(objective, ObjectiveSpec) else objective_from_label(objective)
        super().__init__(*args, **kwargs)
        per_step = self.args.per_device_train_batch_size
        if per_step % self.num_generations:
            raise ValueError(
                f"per_device_train_batch_size={per_step} must be a multiple of num_generations={self.num_generations}: "
                "dfpo's objectives need whole groups in each loss call"
            )
        if self.dfpo_spec.beta > 0 and not self.args.beta:
            raise ValueError(
                f"objective {self.dfpo_spec.name!r} has beta={self.dfpo_spec.beta}: set GRPOConfig(beta=...) > 0 so TRL computes the reference log-probs"
            )
        ignored = {
            k: getattr(self.args, k)
            for k in ("top_entropy_quantile", "off_policy_mask_threshold", "delta")
            if getattr(self.args, k) not in (None, 1.0)
        }
        if ignored:
            warnings.warn(f"DFPOGRPOTrainer: the objective's components replace TRL's {ignored}", stacklevel=2)
        self.dfpo_groups_seen: list[list[int]] = []  # rows per group of every loss call (the check's record)

    def _prepare_inputs(self, generation_batch):
        mode = "train" if self.model.training else "eval"
        if mode != "train":
            inputs = self._generate_and_score_completions(generation_batch)
            return shuffle_groups(inputs, self.num_generations, torch.Generator().manual_seed(0))
        generate_every = self.args.steps_per_generation * self.num_iterations
        if self._step % generate_every == 0 or self._buffered_inputs is None:
            batch = self._generate_and_score_completions(generation_batch)
            seed = int(self.args.seed) * 1_000_003 + int(self._step)
            batch = shuffle_groups(batch, self.num_generations, torch.Generator().manual_seed(seed))
            self._buffered_inputs = split_tensor_dict(batch, self.args.steps_per_generation)
        return self._buffered_inputs[self._step % self.args.steps_per_generation]

    def _compute_loss(self, model, inputs):
        spec = self.dfpo_spec
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        needs_entropy = spec.token_mask in ENTROPY_MASKS or spec.entropy_coef > 0
        logp, entropy, _ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=needs_entropy
        )  # (B, T) each
        group_ids = inputs[GROUP_KEY]  # (B,)
        self.dfpo_groups_seen.append(check_whole_groups(group_ids, self.num_generations))
        old = inputs.get("old_per_token_logps")
        advantages = inputs["advantages"]
        loss, metrics = policy_loss(
            spec,
            logp=logp,
            old_logp=logp.detach() if old is None else old,
            advantages=advantages if advantages.ndim == 1 else advantages[:, 0],
            mask=completion_mask.bool(),
            group_ids=group_ids,
            entropy=entropy if needs_entropy else None,
            ref_logp=inputs.get("ref_per_token_logps") if spec.beta > 0 else None,
        )
        mode = "train" if self.model.training else "eval"
        for key, value in metrics.items():
            self._metrics[mode][f"dfpo/{key}"].append(float(value))
        if mode == "train":  # the Trainer loop sets the window's step count; outside it, the configured one
            loss = loss / getattr(self, "current_gradient_accumulation_steps", self.args.gradient_accumulation_steps)
        return loss
