"""Peer cross-check: ``dfpo.policy_loss`` against TRL 1.16's own ``GRPOTrainer`` loss.

For ``grpo``, ``dapo``, ``dr_grpo``, ``gspo`` (and ``gspo_token``, ``grpo_fix``) the loss value and its
gradient with respect to ``logp`` must equal what TRL's ``GRPOTrainer.compute_loss``
returns for the matching settings, to 1e-6 in float64, on batches where

- ratios are away from 1 (``old_logp != logp``) so clipping is active on BOTH sides
  (asserted with TRL's own ``clip_ratio/low_mean`` and ``clip_ratio/high_mean`` metrics),
- masks are ragged: each row's real tokens are a random subset of its positions (holes, as TRL's
  ``tool_mask`` makes them), so completion lengths differ and padding sits inside rows too; padding
  holds finite garbage, and there are several groups.

Which TRL code runs
-------------------
TRL's loss lives inside ``GRPOTrainer._compute_loss`` (a method of a trainer that needs a
model, a dataset and an accelerator to construct). We do not re-type it. We build the
trainer with ``object.__new__(GRPOTrainer)`` (``__init__`` is skipped) and call the real
public ``GRPOTrainer.compute_loss(model, inputs)``, i.e. TRL's ``profiling_decorator`` and
every line of ``_compute_loss``. What is stubbed, and why:

1. ``args``: a REAL ``trl.GRPOConfig`` (so ``delta``, ``use_bias_correction_kl``,
   ``steps_per_generation``... keep TRL's defaults and validation).
2. Instance attributes that ``GRPOTrainer.__init__`` copies from ``args`` and
   ``_compute_loss`` reads: ``loss_type``, ``importance_sampling_level``, ``epsilon_low``,
   ``epsilon_high``, ``beta``, ``max_completion_length``, ``top_entropy_quantile``,
   ``off_policy_mask_threshold``, ``use_vllm``, ``vllm_importance_sampling_correction``,
   ``_entropy_bonus_enabled``, ``_metrics``. They are set with the same expressions as
   ``__init__`` (grpo_trainer.py lines ~782-1080), see ``_trl_trainer``.
3. ``aux_loss_enabled = False``: ``__init__`` derives it from the model config; no MoE model here.
4. ``_get_per_token_logps_and_entropies``: replaced on the instance by a function that
   returns our ``logp`` tensor (and zero entropies), because it would run a transformer
   forward pass. This is the only place a model enters the loss.
5. ``model``: ``SimpleNamespace(training=True)`` (``_compute_loss`` only reads
   ``self.model.training`` to choose the "train" mode).
6. ``accelerator``: a single-process stand-in (``num_processes=1``, ``is_main_process``,
   identity ``gather``/``reduce``); with one process accelerate's own functions are the
   identity too. It is used by the "dapo" normaliser and by the metric logging.
7. ``state``: a real ``transformers.TrainerState`` (read by ``profiling_decorator``).
8. ``current_gradient_accumulation_steps = args.gradient_accumulation_steps`` (``Trainer``'s
   training loop sets it to the number of micro-batches in the accumulation window; 1 by default).
9. ``inputs["num_items_in_batch"]`` (the "dapo" normaliser) is the number of real tokens of the
   generation batch, what ``_generate_and_score_completions`` puts there for one process;
   TRL's own ``split_tensor_dict`` cuts a generation batch into micro-batches in
   ``test_accumulated_micro_batches_equal_one_dfpo_call``.

Setting correspondence (TRL -> dfpo)
------------------------------------
- loss_type="grpo", importance_sampling_level="token"  -> ``grpo`` (seq_mean_token_mean)
- loss_type="bnpo" and "dapo" (epsilon_high=0.28)      -> ``dapo`` (token_mean)
- loss_type="dr_grpo", max_completion_length=M         -> ``dr_grpo`` (constant, M)
- loss_type="grpo", importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4
  -> ``gspo``. TRL's sequence ratio is exp(mean_t mask*log r_it), the geometric mean of
  the token ratios: the paper's eq (44).
- the same with dfpo ``gspo_token`` (one advantage per sequence: GSPO's value and gradient).
- loss_type="luspo", importance_sampling_level="sequence", epsilon=2e-3, epsilon_high=2.5e-3 (the LUSPO
  paper's range, as TRL's paper index configures it) -> ``luspo``. TRL's GRPOConfig default epsilon=0.2
  is GRPO's range, not LUSPO's: with TRL's defaults on both sides the two differ only there, and
  ``luspo:eps_low=0.2:eps_high=0.2`` equals TRL's default luspo (``test_trl_defaults_are_the_preset_...``).
- loss_type="cispo", epsilon_high=5.0 (ScaleRL's eps_max, TRL's recommended value) -> ``cispo``; TRL's
  default leaves epsilon_high = epsilon = 0.2, i.e. ``cispo:eps_high=0.2``.
- loss_type="grpo", epsilon=1.0, epsilon_high=e, delta=1+e -> ``grpo_fix`` (eq 79-80).
  (TRL computes coef_2 = clamp(r, 1-1, 1+e) BEFORE clamping coef_1 at delta, so
  -min(min(r, 1+e) A, clamp(r, 0, 1+e) A) = -A clip(r, 0, 1+e).)
- beta > 0 -> TRL with ``use_bias_correction_kl=False``.

Where the two sides part (each pinned by a test, so a change on either side shows up)
-----------------------------------------------------------------------------------
1. Completions with no real token: TRL "grpo", "sapo" and "luspo" count them in their mean over B
   rows; dfpo ignores them, so dfpo = TRL * B / (non-empty rows) (``test_all_masked_rows``).
2. GSPO clip metrics: TRL logs the share of clipped SEQUENCES, dfpo the share of real
   TOKENS in clipped sequences (``test_gspo_clip_fractions_are_token_weighted_...``).
3. KL: TRL's default ``use_bias_correction_kl=True`` multiplies k3 by the ratio; dfpo's default
   k3 term has no such factor (it matches TRL with the option off); ``kl_ratio_weight`` adds it.
4. Gradient accumulation: TRL "dapo" divides every micro-batch by the token count of the
   whole generation batch, "bnpo" by its own; dfpo sees one call, so a trainer that splits a
   batch must weight micro-batches by their token share to get TRL's "dapo".

Advantages: TRL computes them inline in ``_generate_and_score_completions`` (not callable
without a model, a tokenizer and reward functions). ``test_group_advantages_match_trl``
therefore restates those lines (group mean via ``view(-1, G)``, std via TRL's own
``trl.trainer.utils.nanstd`` -- the unbiased, Bessel-corrected std -- and ``+ 1e-4``)
and compares ``dfpo.group_advantages`` against them.
"""

from __future__ import annotations

import math
import tempfile
import warnings
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

trl = pytest.importorskip("trl")

from trl import GRPOConfig, GRPOTrainer  # noqa: E402
from trl.trainer.utils import nanstd, split_tensor_dict  # noqa: E402

from dfpo import group_advantages, policy_loss  # noqa: E402

DTYPE = torch.float64
TOL = dict(rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------------
# TRL side: run GRPOTrainer.compute_loss on given tensors
# ---------------------------------------------------------------------------------------
class _SingleProcessAccelerator:
    """What ``_compute_loss`` asks of ``accelerate.Accelerator`` with one process."""

    num_processes = 1
    process_index = 0
    is_main_process = True

    @staticmethod
    def gather(tensor):
        return tensor

    @staticmethod
    def gather_for_metrics(tensor):
        return tensor

    @staticmethod
    def reduce(tensor, reduction="sum"):
        return tensor


def _trl_trainer(logp: torch.Tensor, **config) -> GRPOTrainer:
    """A ``GRPOTrainer`` without ``__init__`` whose model forward returns ``logp``."""
    from transformers import TrainerState

    with warnings.catch_warnings():  # transformers' FutureWarning about gradient_checkpointing
        warnings.simplefilter("ignore", FutureWarning)
        args = GRPOConfig(output_dir=tempfile.gettempdir(), report_to=[], use_cpu=True, **config)
    trainer = object.__new__(GRPOTrainer)
    trainer.args = args
    # The same expressions as GRPOTrainer.__init__:
    trainer.loss_type = args.loss_type
    trainer.importance_sampling_level = args.importance_sampling_level
    trainer.epsilon_low = args.epsilon
    trainer.epsilon_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
    trainer.beta = args.beta
    trainer.max_completion_length = args.max_completion_length
    trainer.top_entropy_quantile = args.top_entropy_quantile
    trainer.off_policy_mask_threshold = args.off_policy_mask_threshold
    trainer.use_vllm = args.use_vllm
    trainer.vllm_importance_sampling_correction = args.vllm_importance_sampling_correction
    trainer.entropy_coef = args.entropy_coef
    trainer.use_adaptive_entropy = args.use_adaptive_entropy
    trainer._entropy_bonus_enabled = trainer.entropy_coef != 0.0 or trainer.use_adaptive_entropy
    trainer._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    # Set elsewhere by __init__ / the Trainer loop; see the module docstring.
    trainer.aux_loss_enabled = False
    trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps
    trainer.model = SimpleNamespace(training=True)
    trainer.accelerator = _SingleProcessAccelerator()
    trainer.state = TrainerState()

    def per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, **kwargs):
        assert logits_to_keep == logp.shape[1]
        return logp, torch.zeros_like(logp.detach()), None

    trainer._get_per_token_logps_and_entropies = per_token_logps_and_entropies
    return trainer


def trl_loss(*, logp, old_logp, advantages, mask, ref_logp=None, num_items_in_batch=None, importance_sampling_ratio=None, **config):
    """TRL's loss for these tensors and the metrics TRL logged while computing it.

    ``num_items_in_batch``: real tokens of the whole generation batch (default: of this one).
    """
    B, T = logp.shape
    config.setdefault("max_completion_length", T)
    trainer = _trl_trainer(logp, **config)
    completion_mask = mask.long()  # TRL builds an int64 mask
    inputs = {
        "prompt_ids": torch.ones(B, 3, dtype=torch.long),
        "prompt_mask": torch.ones(B, 3, dtype=torch.long),
        "completion_ids": torch.ones(B, T, dtype=torch.long),
        "completion_mask": completion_mask,
        "advantages": advantages,
        "old_per_token_logps": old_logp,
        "num_items_in_batch": completion_mask.sum() if num_items_in_batch is None else num_items_in_batch,
    }
    if ref_logp is not None:
        inputs["ref_per_token_logps"] = ref_logp
    if importance_sampling_ratio is not None:  # what _generate_and_score_completions hands _compute_loss under vLLM IS
        inputs["importance_sampling_ratio"] = importance_sampling_ratio
    loss = trainer.compute_loss(None, inputs)
    return loss, {k: v[-1] for k, v in trainer._metrics["train"].items()}


# ---------------------------------------------------------------------------------------
# Batches: several groups, unequal lengths, ratios on every side of the clip range
# ---------------------------------------------------------------------------------------
def trl_group_advantages(rewards: torch.Tensor, num_generations: int, scale: str) -> torch.Tensor:
    """The lines of ``GRPOTrainer._generate_and_score_completions`` (TRL 1.16,
    "sum_then_normalize") that turn rewards into advantages; groups are contiguous blocks."""
    mean_grouped = torch.nanmean(rewards.view(-1, num_generations), dim=1)
    mean_grouped = mean_grouped.repeat_interleave(num_generations, dim=0)
    if scale in ["group", "none"]:
        std = nanstd(rewards.view(-1, num_generations), dim=1).repeat_interleave(num_generations, dim=0)
    else:  # "batch"
        std = nanstd(rewards).expand_as(rewards)
    advantages = rewards - mean_grouped
    if scale != "none":
        advantages = advantages / (std + 1e-4)
    return torch.nan_to_num(advantages, nan=0.0)


def ragged_mask(g: torch.Generator, B: int, T: int) -> torch.Tensor:
    """(B, T) bool: each row keeps a random subset of its positions (density 0.3-1), at least one; row 0 is
    full and row 1 holds exactly two real tokens at random positions, so lengths differ for sure."""
    density = 0.3 + 0.7 * torch.rand(B, 1, generator=g)  # (B, 1)
    mask = torch.rand(B, T, generator=g) < density  # (B, T)
    mask[torch.arange(B), torch.randint(0, T, (B,), generator=g)] = True  # no empty row
    mask[0] = True
    mask[1] = False
    mask[1, torch.randperm(T, generator=g)[:2]] = True
    return mask


def make_batch(seed: int, *, level: str, eps_low: float, eps_high: float, n_groups: int = 3, group_size: int = 4, T: int = 9):
    """Random batch whose rows are grouped contiguously (TRL's layout), with ragged masks (``ragged_mask``).

    Token level: every token log-ratio is uniform in (-0.6, 0.6), so with eps ~ 0.2 tokens
    fall below, inside and above the clip range in rows of both advantage signs.
    Sequence level: each row gets a log-ratio shift; four rows are then pinned so that a
    positive row is clipped high, a negative row clipped low, a negative row sits above
    1 + eps_high (the dual-clip / GRPO-fix case) and a positive row stays inside.
    """
    g = torch.Generator().manual_seed(seed)
    B = n_groups * group_size
    mask = ragged_mask(g, B, T)  # (B, T)
    lengths = mask.sum(-1)  # (B,)

    rewards = torch.rand(B, generator=g, dtype=DTYPE)  # distinct a.s.: both signs in every group
    advantages = trl_group_advantages(rewards, group_size, "group")  # (B,)

    logp = -3.0 * torch.rand(B, T, generator=g, dtype=DTYPE)  # (B, T)
    if level == "token":
        log_ratio = 1.2 * torch.rand(B, T, generator=g, dtype=DTYPE) - 0.6  # (B, T)
    else:
        shift = 8.0 * max(eps_low, eps_high) * (2 * torch.rand(B, 1, generator=g, dtype=DTYPE) - 1)  # (B, 1)
        noise = 0.1 * eps_low * (2 * torch.rand(B, T, generator=g, dtype=DTYPE) - 1)  # (B, T)
        log_ratio = shift + noise - (noise * mask).sum(1, keepdim=True) / lengths[:, None]  # (B, T)
        pos, neg = torch.nonzero(advantages > 0).flatten(), torch.nonzero(advantages < 0).flatten()
        log_ratio[pos[0]] = 3.0 * eps_high  # clipped high
        log_ratio[neg[0]] = -3.0 * eps_low  # clipped low
        log_ratio[neg[1]] = 3.0 * eps_high  # A < 0, ratio > 1 + eps_high
        log_ratio[pos[1]] = 0.1 * eps_high  # inside the range
    old_logp = logp - log_ratio  # (B, T)

    # Padding: finite garbage (TRL multiplies by the mask, so it needs finite padding).
    garbage = torch.randn(B, T, generator=g, dtype=DTYPE)  # (B, T)
    logp = torch.where(mask, logp, garbage)
    old_logp = torch.where(mask, old_logp, -garbage.abs())
    group_ids = torch.arange(B) // group_size  # (B,)
    return SimpleNamespace(
        logp=logp, old_logp=old_logp, advantages=advantages, mask=mask, group_ids=group_ids, rewards=rewards, group_size=group_size
    )


def run_trl(batch, **config):
    """TRL's (loss, d loss / d logp, logged metrics) on ``batch``."""
    logp = batch.logp.clone().requires_grad_(True)  # (B, T)
    loss, metrics = trl_loss(
        logp=logp,
        old_logp=batch.old_logp,
        advantages=batch.advantages,
        mask=batch.mask,
        ref_logp=getattr(batch, "ref_logp", None),
        **config,
    )
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.detach(), grad, metrics


def run_trl_accumulated(batch, steps: int, **config):
    """TRL over one generation batch cut into ``steps`` micro-batches by TRL's ``split_tensor_dict``
    (as ``_prepare_inputs`` does, without the shuffle), gradients accumulated as ``Trainer`` does:
    (sum of the micro-batch losses, d sum / d logp)."""
    logp = batch.logp.clone().requires_grad_(True)  # (B, T)
    whole = {"logp": logp, "old_logp": batch.old_logp, "advantages": batch.advantages, "mask": batch.mask}
    total = 0.0
    for micro in split_tensor_dict(whole, steps):
        loss, _ = trl_loss(
            **micro, num_items_in_batch=batch.mask.sum(), gradient_accumulation_steps=steps, steps_per_generation=steps, **config
        )
        total = total + loss
    (grad,) = torch.autograd.grad(total, logp)
    return total.detach(), grad


def run_dfpo(batch, objective, **overrides):
    """dfpo's (loss, d loss / d logp, metrics) on ``batch``."""
    logp = batch.logp.clone().requires_grad_(True)  # (B, T)
    loss, metrics = policy_loss(
        objective,
        logp=logp,
        old_logp=batch.old_logp,
        advantages=batch.advantages,
        mask=batch.mask,
        group_ids=batch.group_ids,
        ref_logp=getattr(batch, "ref_logp", None),
        **overrides,
    )
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.detach(), grad, metrics


# ---------------------------------------------------------------------------------------
# Loss and gradient: dfpo presets (their own defaults) == TRL with the literature settings
# ---------------------------------------------------------------------------------------
# (id, dfpo objective, dfpo overrides, TRL GRPOConfig settings, batch ratio level)
CASES = [
    ("grpo", "grpo", {}, dict(loss_type="grpo", epsilon=0.2), "token"),
    ("dapo", "dapo", {}, dict(loss_type="dapo", epsilon=0.2, epsilon_high=0.28), "token"),
    ("dapo~bnpo", "dapo", {}, dict(loss_type="bnpo", epsilon=0.2, epsilon_high=0.28), "token"),
    ("dr_grpo", "dr_grpo", {}, dict(loss_type="dr_grpo", epsilon=0.2), "token"),
    ("dr_grpo_M=16", "dr_grpo", {"max_completion_length": 16}, dict(loss_type="dr_grpo", epsilon=0.2, max_completion_length=16), "token"),
    ("gspo", "gspo", {}, dict(loss_type="grpo", importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4), "sequence"),
    # GSPO-token with one advantage per sequence has GSPO's value and gradient (GSPO paper sec. 4.3).
    (
        "gspo_token",
        "gspo_token",
        {},
        dict(loss_type="grpo", importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4),
        "sequence",
    ),
    # GRPO-fix's preset follows eq 80 (seq_mean_token_sum); TRL reaches it through its loss types:
    # grpo (per-sequence mean) and dr_grpo (sum / (B * T_max)), with epsilon=1, delta=1+e.
    (
        "grpo_fix~grpo",
        "grpo_fix",
        {"aggregation": "seq_mean_token_mean"},
        dict(loss_type="grpo", epsilon=1.0, epsilon_high=0.2, delta=1.2),
        "token",
    ),
    (
        "grpo_fix~dr_grpo",
        "grpo_fix",
        {"aggregation": "constant"},
        dict(loss_type="dr_grpo", epsilon=1.0, epsilon_high=0.2, delta=1.2),
        "token",
    ),
]
SEEDS = [0, 1, 2, 3]


def _batch_for(level: str, trl_config: dict, seed: int):
    eps_low = trl_config["epsilon"]
    eps_high = trl_config.get("epsilon_high") or eps_low
    return make_batch(seed, level=level, eps_low=min(eps_low, 0.2), eps_high=eps_high)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("objective", "overrides", "trl_config", "level"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_loss_and_gradient_equal_trl(objective, overrides, trl_config, level, seed):
    batch = _batch_for(level, trl_config, seed)
    trl_value, trl_grad, trl_metrics = run_trl(batch, **trl_config)
    value, grad, _ = run_dfpo(batch, objective, **overrides)

    # The batch exercises clipping on both sides (TRL's own clip metrics say so) ...
    if trl_config["epsilon"] < 1.0:
        assert trl_metrics["clip_ratio/low_mean"] > 0 and trl_metrics["clip_ratio/high_mean"] > 0
    else:  # GRPO-fix: some negative-advantage ratio above 1 + e, where PPO clipping does not bound it
        ratio = torch.exp(batch.logp - batch.old_logp)  # (B, T)
        assert ((ratio > 1.0 + trl_config["epsilon_high"]) & batch.mask & (batch.advantages[:, None] < 0)).any()
    # ... and no gradient leaks into padding on either side.
    assert not trl_grad[~batch.mask].any() and not grad[~batch.mask].any()
    # Some real tokens have zero gradient (clipped) and some do not.
    assert (trl_grad[batch.mask] == 0).any() and (trl_grad[batch.mask] != 0).any()

    torch.testing.assert_close(value, trl_value, **TOL)
    torch.testing.assert_close(grad, trl_grad, **TOL)


# The losses TRL 1.16 added beside GRPO: soft gates, length-scaled GSPO, Gamma weights, two-sided
# clipping and off-policy sequence masking. (id, dfpo objective, dfpo overrides, TRL settings, batch level)
PEER_CASES = [
    ("sapo", "sapo", {}, dict(loss_type="sapo", epsilon=0.2), "token"),
    ("luspo", "luspo", {}, dict(loss_type="luspo", importance_sampling_level="sequence", epsilon=2e-3, epsilon_high=2.5e-3), "sequence"),
    ("vespo", "vespo", {}, dict(loss_type="vespo", epsilon=0.2), "token"),
    ("cispo", "cispo", {}, dict(loss_type="cispo", epsilon=0.2, epsilon_high=5.0), "token"),
    ("delta~dual_clip", "grpo", {"dual_clip_c": 1.3}, dict(loss_type="grpo", epsilon=0.2, delta=1.3), "token"),
    ("off_policy_mask~opsm", "opsm", {"opsm_delta": 0.02}, dict(loss_type="grpo", epsilon=0.2, off_policy_mask_threshold=0.02), "token"),
]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("objective", "overrides", "trl_config", "level"), [c[1:] for c in PEER_CASES], ids=[c[0] for c in PEER_CASES])
def test_newer_trl_losses_equal_dfpo_presets(objective, overrides, trl_config, level, seed):
    """SAPO, LUSPO, VESPO, CISPO, TRL's delta (dfpo's dual_clip_c) and OPSM: value and gradient equal TRL's to 1e-6."""
    batch = _batch_for(level, trl_config, seed)
    trl_value, trl_grad, _ = run_trl(batch, **trl_config)
    value, grad, metrics = run_dfpo(batch, objective, **overrides)
    torch.testing.assert_close(value, trl_value, **TOL)
    torch.testing.assert_close(grad, trl_grad, **TOL)
    assert not grad[~batch.mask].any()
    if objective == "opsm":  # the threshold bites: some negative sequences are dropped, not all
        assert 0 < metrics["mask/frac"] < 1
    if "dual_clip_c" in overrides:  # some A < 0 token sits above the cap, where both sides give no gradient
        ratio = torch.exp(batch.logp - batch.old_logp)
        assert ((ratio > overrides["dual_clip_c"]) & batch.mask & (batch.advantages[:, None] < 0)).any()


TOKEN_PPO_CASES = [c for c in CASES if c[4] == "token" and c[3]["epsilon"] < 1.0]


@pytest.mark.parametrize(
    ("objective", "overrides", "trl_config", "level"), [c[1:] for c in TOKEN_PPO_CASES], ids=[c[0] for c in TOKEN_PPO_CASES]
)
def test_token_clip_fractions_equal_trl_logged_metrics(objective, overrides, trl_config, level):
    """``clip/frac_low`` / ``clip/frac_high`` are TRL's ``clip_ratio/low_mean`` / ``high_mean``:
    the share of real tokens where A < 0 and r < 1 - eps_low (A > 0 and r > 1 + eps_high)."""
    batch = _batch_for(level, trl_config, seed=0)
    _, _, trl_metrics = run_trl(batch, **trl_config)
    _, _, metrics = run_dfpo(batch, objective, **overrides)
    assert metrics["clip/frac_low"].item() == pytest.approx(trl_metrics["clip_ratio/low_mean"], abs=1e-6)
    assert metrics["clip/frac_high"].item() == pytest.approx(trl_metrics["clip_ratio/high_mean"], abs=1e-6)


def test_gspo_clip_fractions_count_sequences_as_trl_does():
    """At sequence level both sides flag the same sequences and both report the share of
    SEQUENCES clipped (TRL ``clip_ratio/*_mean``, dfpo ``clip/frac_*``). The per-sequence
    flags come from TRL itself (one row at a time)."""
    trl_config = CASES[[c[0] for c in CASES].index("gspo")][3]
    batch = _batch_for("sequence", trl_config, seed=0)
    flags = {"low": [], "high": []}
    for i in range(batch.mask.shape[0]):
        row = SimpleNamespace(**{k: getattr(batch, k)[i : i + 1] for k in ("logp", "old_logp", "advantages", "mask")})
        _, _, row_metrics = run_trl(row, **trl_config)
        for side in flags:
            flags[side].append(row_metrics[f"clip_ratio/{side}_mean"])
    _, _, trl_metrics = run_trl(batch, **trl_config)
    _, _, metrics = run_dfpo(batch, "gspo")
    for side in flags:
        flag = torch.tensor(flags[side], dtype=DTYPE)  # (B,) in {0, 1}
        assert 0 < flag.sum() < len(flag)
        assert trl_metrics[f"clip_ratio/{side}_mean"] == pytest.approx(flag.mean().item(), abs=1e-6)
        assert metrics[f"clip/frac_{side}"].item() == pytest.approx(flag.mean().item(), abs=1e-6)


def trl_vllm_is_ratio(old_logp, sampling_logp, mask, mode: str, clip_min, clip_max):
    """TRL 1.16 grpo_trainer.py _generate_and_score_completions (vllm_importance_sampling_correction), as read: exp of
    the masked log-difference old - sampling per token, or of its row sum for sequence_* modes ((B, 1)); *_truncate
    clamps it to [clip_min, clip_max], *_mask zeroes it outside."""
    diff = (old_logp - sampling_logp) * mask  # (B, T)
    if mode.startswith("sequence"):
        diff = diff.sum(-1, keepdim=True)  # (B, 1)
    ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    low = -math.inf if clip_min is None else clip_min
    return ratio.masked_fill((ratio < low) | (ratio > clip_max), 0.0)


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
@pytest.mark.parametrize("seed", [8, 9])
def test_vllm_importance_sampling_correction_equals_trl(mode, seed):
    """TRL's vLLM IS correction (its weight restated from the generation step, multiplied in by TRL's own _compute_loss)
    is dfpo's rollout_correction of the same name: loss and gradient, grpo and dapo, ragged masks. TRL 1.16's defaults:
    clip_max 3.0, clip_min None (the mask modes here at 0.5 so that both ends bite)."""
    batch = make_batch(seed, level="token", eps_low=0.2, eps_high=0.2)
    g = torch.Generator().manual_seed(seed + 70)
    scale = 0.4 if mode.startswith("sequence") else 0.6
    sampling = batch.old_logp + scale * torch.randn(batch.old_logp.shape, generator=g, dtype=DTYPE)  # (B, T)
    clip_min = 0.5 if mode.endswith("mask") else None
    ratio = trl_vllm_is_ratio(batch.old_logp, sampling, batch.mask.to(DTYPE), mode, clip_min, 3.0)
    assert 0 < float(((ratio == 0) | (ratio == 3.0)).float().mean()) < 1  # the treatment bites somewhere, not everywhere
    for objective, trl_config in (
        ("grpo", dict(loss_type="grpo", epsilon=0.2)),
        ("dapo", dict(loss_type="dapo", epsilon=0.2, epsilon_high=0.28)),
    ):
        logp = batch.logp.clone().requires_grad_(True)
        trl_value, _ = trl_loss(
            logp=logp, old_logp=batch.old_logp, advantages=batch.advantages, mask=batch.mask, importance_sampling_ratio=ratio,
            use_vllm=True, vllm_importance_sampling_correction=True, **trl_config,
        )  # fmt: skip
        (trl_grad,) = torch.autograd.grad(trl_value, logp)
        value, grad, _ = run_dfpo(
            batch, objective, rollout_correction=mode, rollout_cap=3.0, rollout_low=clip_min or 0.0, rollout_logp=sampling,
            **({"eps_high": 0.28} if objective == "dapo" else {}),
        )  # fmt: skip
        torch.testing.assert_close(value, trl_value.detach(), **TOL)
        torch.testing.assert_close(grad, trl_grad, **TOL)


def test_k3_kl_term_equals_trl_without_bias_correction():
    """beta > 0: dfpo adds beta * k3(ref, logp) per token; that is TRL with
    ``use_bias_correction_kl=False`` (TRL's default True also multiplies k3 by the ratio)."""
    batch = make_batch(5, level="token", eps_low=0.2, eps_high=0.2)
    g = torch.Generator().manual_seed(55)
    batch.ref_logp = batch.logp - 0.3 * torch.randn(batch.logp.shape, generator=g, dtype=DTYPE)  # (B, T)
    trl_value, trl_grad, trl_metrics = run_trl(batch, loss_type="grpo", epsilon=0.2, beta=0.04, use_bias_correction_kl=False)
    value, grad, metrics = run_dfpo(batch, "grpo", beta=0.04)
    torch.testing.assert_close(value, trl_value, **TOL)
    torch.testing.assert_close(grad, trl_grad, **TOL)
    assert metrics["kl/ref"].item() == pytest.approx(trl_metrics["kl"], rel=1e-6)
    # TRL's default (use_bias_correction_kl=True) weighs k3 by the ratio: not dfpo's term.
    default_value, _, _ = run_trl(batch, loss_type="grpo", epsilon=0.2, beta=0.04)
    assert abs(default_value - value) > 1e-5


@pytest.mark.parametrize(
    ("objective", "level", "trl_config", "weight"),
    [
        ("grpo", "token", dict(loss_type="grpo", epsilon=0.2), "token"),
        ("dapo", "token", dict(loss_type="dapo", epsilon=0.2, epsilon_high=0.28), "token"),
        ("gspo", "sequence", dict(loss_type="grpo", importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4), "sequence"),
    ],
)
@pytest.mark.parametrize("seed", [6, 7])
def test_bias_corrected_kl_equals_trl_default(objective, level, trl_config, weight, seed):
    """TRL's default use_bias_correction_kl=True (k3 times coef_1 = pi / pi_old with its gradient, at TRL's
    importance-sampling level) is kl_ratio_weight=token, or =sequence under GSPO: loss, gradient and logged KL."""
    eps = (0.2, 0.28) if objective == "dapo" else ((3e-4, 4e-4) if objective == "gspo" else (0.2, 0.2))
    batch = make_batch(seed, level=level, eps_low=eps[0], eps_high=eps[1])
    g = torch.Generator().manual_seed(seed + 50)
    batch.ref_logp = batch.logp - 0.3 * torch.randn(batch.logp.shape, generator=g, dtype=DTYPE)  # (B, T)
    trl_value, trl_grad, trl_metrics = run_trl(batch, beta=0.04, **trl_config)
    value, grad, metrics = run_dfpo(batch, objective, beta=0.04, kl_ratio_weight=weight)
    torch.testing.assert_close(value, trl_value, **TOL)
    torch.testing.assert_close(grad, trl_grad, **TOL)
    assert metrics["kl/ref"].item() == pytest.approx(trl_metrics["kl"], rel=1e-6)


@pytest.mark.parametrize(
    ("objective", "trl_config"),
    [
        ("grpo", dict(loss_type="grpo", epsilon=0.2)),
        ("dapo", dict(loss_type="dapo", epsilon=0.2, epsilon_high=0.28)),
        ("dr_grpo", dict(loss_type="dr_grpo", epsilon=0.2)),
    ],
)
def test_accumulated_micro_batches_equal_one_dfpo_call(objective, trl_config):
    """TRL trains on a generation batch as ``steps_per_generation`` micro-batches whose gradients
    are accumulated. For grpo (equal-size micro-batches), dapo (every micro-batch divided by the
    generation batch's token count) and dr_grpo, the accumulated TRL loss and gradient equal ONE
    dfpo call on the whole batch. (TRL's "bnpo" divides each micro-batch by its own tokens:
    it is dfpo's token_mean per micro-batch, averaged; see the next test.)"""
    batch = make_batch(3, level="token", eps_low=0.2, eps_high=0.28)
    trl_value, trl_grad = run_trl_accumulated(batch, 2, **trl_config)
    value, grad, _ = run_dfpo(batch, objective)
    torch.testing.assert_close(value, trl_value, **TOL)
    torch.testing.assert_close(grad, trl_grad, **TOL)


def test_bnpo_accumulates_micro_batch_token_means():
    """TRL "bnpo" over 2 micro-batches = the mean of dfpo ``dapo`` (token_mean) on each half,
    which differs from dapo on the whole batch when the halves hold different token counts."""
    batch = make_batch(3, level="token", eps_low=0.2, eps_high=0.28)
    trl_value, trl_grad = run_trl_accumulated(batch, 2, loss_type="bnpo", epsilon=0.2, epsilon_high=0.28)
    B = batch.mask.shape[0]
    halves = [
        SimpleNamespace(**{k: getattr(batch, k)[sl] for k in ("logp", "old_logp", "advantages", "mask", "group_ids")})
        for sl in (slice(0, B // 2), slice(B // 2, B))
    ]
    assert halves[0].mask.sum() != halves[1].mask.sum()
    parts = [run_dfpo(half, "dapo") for half in halves]
    torch.testing.assert_close(sum(p[0] for p in parts) / 2, trl_value, **TOL)
    torch.testing.assert_close(torch.cat([p[1] for p in parts]) / 2, trl_grad, **TOL)
    whole_value, _, _ = run_dfpo(batch, "dapo")
    assert abs(whole_value - trl_value) > 1e-4


# ---------------------------------------------------------------------------------------
# Where the two conventions part: completions with no real token
# ---------------------------------------------------------------------------------------
LUSPO_TRL = dict(loss_type="luspo", importance_sampling_level="sequence", epsilon=2e-3, epsilon_high=2.5e-3)


@pytest.mark.parametrize(
    ("objective", "trl_config", "level"),
    [
        ("grpo", dict(loss_type="grpo", epsilon=0.2), "token"),
        ("dapo", dict(loss_type="dapo", epsilon=0.2, epsilon_high=0.28), "token"),
        ("dr_grpo", dict(loss_type="dr_grpo", epsilon=0.2), "token"),
        ("sapo", dict(loss_type="sapo", epsilon=0.2), "token"),
        ("gspo", dict(loss_type="grpo", importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4), "sequence"),
        ("luspo", LUSPO_TRL, "sequence"),
    ],
)
def test_all_masked_rows(objective, trl_config, level):
    """A completion with no real token (e.g. TRL's ``mask_truncated_completions``, or a random mask)
    adds nothing to either loss. TRL's "grpo", "sapo" and "luspo" still count it in their mean over
    B rows; dfpo ignores it (an all-masked row is no completion), so for the per-sequence means
    dfpo = TRL * B / (number of non-empty rows). Token-mean and constant agree exactly."""
    batch = make_batch(7, level=level, eps_low=trl_config["epsilon"], eps_high=trl_config.get("epsilon_high") or 0.2)
    batch.mask[[2, 5]] = False  # two empty completions
    B = batch.mask.shape[0]
    trl_value, trl_grad, _ = run_trl(batch, **trl_config)
    value, grad, _ = run_dfpo(batch, objective)
    factor = B / (B - 2) if trl_config["loss_type"] in ("grpo", "sapo", "luspo") else 1.0
    torch.testing.assert_close(value, trl_value * factor, **TOL)
    torch.testing.assert_close(grad, trl_grad * factor, **TOL)
    assert torch.isfinite(grad).all() and not grad[[2, 5]].any()


@pytest.mark.parametrize(
    ("objective", "trl_config", "level", "overrides"),
    [
        ("luspo", dict(loss_type="luspo", importance_sampling_level="sequence"), "sequence", {"eps_low": 0.2, "eps_high": 0.2}),
        ("cispo", dict(loss_type="cispo"), "token", {"eps_high": 0.2}),
    ],
)
def test_trl_defaults_are_the_preset_at_trls_default_clip_range(objective, trl_config, level, overrides):
    """Why dfpo's ``luspo`` / ``cispo`` and TRL's loss types differ "with default settings on both sides":
    TRL's GRPOConfig default range (epsilon=0.2, epsilon_high=None -> 0.2) is GRPO's, for every loss type;
    dfpo's presets take the papers' ranges (LUSPO 2e-3 / 2.5e-3 and CISPO's cap 5.0, the values TRL's own
    docs recommend). The formulas are the same: TRL's defaults equal the preset at range 0.2 to 1e-6 on
    ragged masks, and differ from the preset by a large share of the gradient."""
    for seed in SEEDS:
        batch = make_batch(seed, level=level, eps_low=0.2, eps_high=0.2)
        trl_value, trl_grad, _ = run_trl(batch, **trl_config)
        value, grad, _ = run_dfpo(batch, objective, **overrides)
        torch.testing.assert_close(value, trl_value, **TOL)
        torch.testing.assert_close(grad, trl_grad, **TOL)
        _, preset_grad, _ = run_dfpo(batch, objective)
        assert float((preset_grad - trl_grad).abs().max() / trl_grad.abs().max()) > 0.1


# ---------------------------------------------------------------------------------------
# Advantages
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_advantages_match_trl(scale):
    """dfpo's eq (43) == TRL's advantage lines (TRL's unbiased ``nanstd``, eps 1e-4, group mean
    even under ``scale_rewards="batch"``), including a group whose rewards are all equal,
    and wherever the groups' completions sit in the batch."""
    g = torch.Generator().manual_seed(11)
    G, n_groups = 5, 4
    rewards = torch.randint(0, 3, (n_groups * G,), generator=g).to(DTYPE) + 0.1 * torch.rand(n_groups * G, generator=g, dtype=DTYPE)  # (B,)
    rewards[G : 2 * G] = 1.0  # an all-equal group: zero advantage on both sides
    contiguous_ids = torch.arange(n_groups * G) // G  # (B,)
    expected = trl_group_advantages(rewards, G, scale)  # (B,)
    torch.testing.assert_close(group_advantages(rewards, contiguous_ids, scale=scale), expected, **TOL)
    assert not expected[G : 2 * G].any()

    perm = torch.randperm(n_groups * G, generator=g)  # groups scattered, labels arbitrary
    labels = torch.tensor([7, -3, 100, 42])[contiguous_ids]
    torch.testing.assert_close(group_advantages(rewards[perm], labels[perm], scale=scale), expected[perm], **TOL)
