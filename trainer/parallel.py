"""How the training step runs on one process, on N data-parallel processes (DDP) or with sharded layers (FSDP2).

The stages of a training step never ask how many processes there are; they ask the strategy. Its answers:

====================  ===============  =============================  =================================
method                OneProcess       DataParallel (DDP)             ShardedDataParallel (FSDP2)
====================  ===============  =============================  =================================
my_share              every group      every world-th group           every world-th group
gather_rollout        as sampled       shares gathered                shares gathered
gathered              no-op            no-op                          decoder layers unsharded
anywhere(flag)        flag             flag                           flag on any rank
stop_early            yes              yes                            no: all run every micro-batch
accumulation_weights  local counts     counts over all ranks          counts over all ranks
combine_gradients     as accumulated   all-reduce (sum)               reduce-scatter; whole ones summed
clip_grad_norm        clip_grad_norm_  clip_grad_norm_                norm over shards and whole
share_first_pass      as recorded      from the rank that trained it  from the rank that trained it
reduce_diagnostics    as summed        summed over the ranks          summed over the ranks
trainable_state       the parameters   rank 0's (all hold the same)   shards gathered (collective)
====================  ===============  =============================  =================================

Every rank trains whole groups (``dfpo.trainer.distributed``); the gradient after ``combine_gradients`` is
the one a single process computes on the whole mini-batch, so N processes take the optimiser steps one would.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import torch

from . import distributed as dp
from .diagnostics import StepDiagnostics
from .minibatches import accumulation_weights
from .rewards.compute import RewardBatch
from .sampler import Samples

KERNEL_KEYS = ("fused", "foreach")
"""An optimiser's implementation keywords, which ``load_state_dict`` would take from the checkpoint's param groups."""


def load_keeping_kernel(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Load ``state`` into ``optimizer`` but keep the kernel this process chose (``KERNEL_KEYS``): a checkpoint written
    with torch's fused AdamW on one process must not switch FSDP2's sharded parameters to the fused kernel, which
    refuses DTensors, nor a fused-capable layout back to the loop."""
    kernel = [{k: group.get(k) for k in KERNEL_KEYS} for group in optimizer.param_groups]
    optimizer.load_state_dict(state)
    for group, keys in zip(optimizer.param_groups, kernel):
        group.update(keys)


def gather_groups(parts: list[tuple], n_groups: int, G: int) -> tuple[Samples, list[str], RewardBatch]:
    """The whole batch from every process's (group indices, Samples, texts, RewardBatch) of its groups,
    laid out group-major in global group order as one process would have sampled it."""
    slots: list = [None] * n_groups
    counts = {"errors": 0, "timeouts": 0, "invalid": 0}
    for mine, smp, texts, rew in parts:
        for k, g in enumerate(mine):
            rows = slice(k * G, (k + 1) * G)
            slots[g] = (
                smp.tokens[rows],
                smp.logprobs[rows],
                smp.entropies[rows],
                texts[rows],
                rew.total[rows],
                rew.correct[rows],
                rew.format[rows],
                None if smp.logprobs_untruncated is None else smp.logprobs_untruncated[rows],
                [values[rows] for values in rew.extra],  # each further reward function's values (reward.functions)
            )
        for key in counts:
            counts[key] += getattr(rew, key)
    flat = lambda j: [x for slot in slots for x in slot[j]]  # noqa: E731
    untruncated = None if any(slot[7] is None for slot in slots) else flat(7)
    extra = tuple([x for slot in slots for x in slot[8][k]] for k in range(len(slots[0][8]))) if slots else ()
    return Samples(flat(0), flat(1), flat(2), untruncated), flat(3), RewardBatch(flat(4), flat(5), flat(6), **counts, extra=extra)


class OneProcess:
    """Training on one process: every question a multi-process run asks its peers has this process's answer."""

    stop_early = True
    """Skip a mini-batch's remaining micro-batches at a non-finite loss (nothing else waits for their forwards)."""
    optimizer_foreach: bool | None = None
    """AdamW's ``foreach`` (None: torch's default)."""

    def __init__(self, rank: int = 0, world: int = 1):
        self.rank, self.world = rank, world

    @property
    def is_main(self) -> bool:
        """Whether this process writes the run folder and speaks for the run."""
        return self.rank == 0

    @property
    def alone(self) -> bool:
        """Whether this process is the whole run: it may stop at once, or write a checkpoint, without its peers (on
        several processes the others may be anywhere, and a checkpoint needs them all)."""
        return self.world == 1

    # -- set-up and control -----------------------------------------------------------------

    def local_device(self, device: torch.device) -> torch.device:
        return device

    def seed_per_group(self, rollout) -> bool:
        """Whether rollouts draw each group from its own seed (``rollout.seed_per_group``)."""
        return rollout.seed_per_group

    def shard(self, model) -> None:
        """Make ``model`` this strategy's (nothing to do: every process holds it whole)."""

    def on_rank0(self, fn):
        """``fn()`` on rank 0, every rank waiting for it (``distributed.on_rank0``)."""
        return fn()

    def agree(self, fn):
        """``fn()`` on every rank; a failure on one is a failure on all (``distributed.agree``)."""
        return fn()

    def gather_objects(self, obj) -> list:
        """Every rank's ``obj``, in rank order."""
        return [obj]

    def any_signal(self, signum: int | None) -> int | None:
        """A signal number recorded by any rank (None: none)."""
        return signum

    # -- rollout -----------------------------------------------------------------------------

    def my_share(self, n: int) -> list[int]:
        """The indices of ``n`` groups (or prompts) this process samples: every world-th, from its rank."""
        return list(range(self.rank, n, self.world))

    def gathered(self):
        """A context in which the model is whole here, so forwards whose number differs between ranks need no collective."""
        return contextlib.nullcontext()

    def gather_rollout(self, mine: list[int], samples: Samples, texts: list[str], rewards: RewardBatch, n_groups: int, G: int):
        """(samples, texts, rewards) of the whole batch from this process's share ``mine`` of its ``n_groups`` groups."""
        return samples, texts, rewards

    # -- old log-probs ------------------------------------------------------------------------

    def anywhere(self, flag: bool) -> bool:
        """``flag`` here, or on any rank when every rank must join a forward pass (sharded layers)."""
        return flag

    def share_first_pass(self, first, owned: torch.Tensor):
        """Every row's old log-probs and entropy, each from the process that ``owned`` (B,) bool it."""
        return first

    # -- update -------------------------------------------------------------------------------

    def rank_share(self, rows: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        """The rows of a mini-batch this process trains (whole groups)."""
        return rows

    def accumulation_weights(self, masks: list[torch.Tensor], aggregation: str) -> list[float]:
        """Micro-batch weights that make the summed gradient the mini-batch loss's (``minibatches.accumulation_weights``)."""
        return accumulation_weights(masks, aggregation)

    def combine_gradients(self, finite: bool, metrics: dict, weights: list[float], params: list) -> tuple[bool, dict]:
        """After a mini-batch's backward passes: (finite everywhere, the step's loss metrics), gradients summed over ranks."""
        return finite, metrics

    def clip_grad_norm(self, params: list, max_norm: float) -> float:
        """The gradients' global L2 norm, every gradient scaled to at most ``max_norm`` (``clip_grad_norm_``)."""
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))

    def reduce_diagnostics(self, d: StepDiagnostics) -> StepDiagnostics:
        """The step's diagnostic sums over all processes."""
        return d

    def update_norm(self, params: list, start: list) -> float:
        """The L2 norm of the parameters' change since ``start`` (their copies), summed in float64 on their device: one read."""
        total = torch.zeros((), dtype=torch.float64, device=params[0].device if params else None)
        for p, s in zip(params, start):
            total += torch.linalg.vector_norm(p.detach() - s, dtype=torch.float64).square()
        return math.sqrt(float(total))

    # -- checkpoint ---------------------------------------------------------------------------

    @property
    def builds_checkpoint(self) -> bool:
        """Whether this process builds the checkpoint's state (rank 0 writes it)."""
        return True

    def trainable_state(self, model) -> dict:
        """Whole trainable parameters on the CPU."""
        return {n: p.detach().cpu().clone() for n, p in model.named_parameters() if p.requires_grad}

    def optimizer_state(self, optimizer) -> dict:
        """The optimiser's state in the one-process format."""
        return optimizer.state_dict()

    def load_parameter(self, param: torch.Tensor, full: torch.Tensor) -> None:
        """Copy a checkpoint's whole tensor into ``param``."""
        dp.load_full(param, full)

    def load_optimizer_state(self, optimizer, state: dict) -> None:
        """Load a one-process optimiser state (``load_keeping_kernel``)."""
        load_keeping_kernel(optimizer, state)


class DataParallel(OneProcess):
    """N processes, each with the whole model (DDP): each samples and scores every world-th group and the shares
    are gathered, each trains its share of every mini-batch, gradients are summed by an all-reduce."""

    def local_device(self, device: torch.device) -> torch.device:
        if device.type == "cuda":
            return torch.device("cuda", torch.cuda.current_device())  # torchrun's LOCAL_RANK (init_from_env)
        return device

    def seed_per_group(self, rollout) -> bool:
        """On by itself with the HF engine: every process samples its groups from their own seeds, so the rollout
        does not depend on the world size."""
        return rollout.seed_per_group or rollout.engine == "hf"

    def on_rank0(self, fn):
        return dp.on_rank0(fn)

    def agree(self, fn):
        return dp.agree(fn)

    def gather_objects(self, obj) -> list:
        return dp.gather_objects(obj)

    def any_signal(self, signum: int | None) -> int | None:
        return dp.any_rank(signum)

    def gather_rollout(self, mine, samples, texts, rewards, n_groups, G):
        return gather_groups(self.gather_objects((mine, samples, texts, rewards)), n_groups, G)

    def share_first_pass(self, first, owned: torch.Tensor):
        keep = owned[:, None]  # (B, 1)
        logp = dp.sum_tensor(torch.where(keep, first.logp, 0.0))  # (B, T)
        entropy = dp.sum_tensor(torch.where(keep, first.entropy, 0.0))  # (B, T)
        done = dp.sum_tensor((first.done & owned).to(torch.int32)) > 0  # (B,)
        return dataclasses.replace(first, logp=logp, entropy=entropy, done=done)

    def rank_share(self, rows, group_ids):
        return dp.rank_share(rows, group_ids, self.rank, self.world)

    def accumulation_weights(self, masks, aggregation):
        # the mini-batch's count over all processes normalises every process's micro-batches
        return dp.global_accumulation_weights(masks, aggregation)

    def combine_gradients(self, finite, metrics, weights, params):
        finite = dp.all_ranks(finite)  # one verdict for all processes, then the summed (global) gradient
        if finite:
            dp.sync_gradients(params, self.world)
            metrics = dp.combine_metrics(self.gather_objects((metrics, sum(weights))))
        return finite, metrics

    def reduce_diagnostics(self, d: StepDiagnostics) -> StepDiagnostics:
        out = StepDiagnostics()
        for part in self.gather_objects(d):  # every process's sums (StepDiagnostics.merge adds each field)
            out.merge(part)
        return out

    @property
    def builds_checkpoint(self) -> bool:
        return self.is_main  # rank 0 holds the same parameters and optimiser state as every other


class ShardedDataParallel(DataParallel):
    """FSDP2: every decoder layer is sharded over the processes (``fully_shard``), the embeddings, final norm and
    LM head stay whole. Sampling, evaluation and no-grad scoring gather the layers first (their number of
    forwards differs between ranks); every rank joins every forward and backward of the update."""

    stop_early = False
    optimizer_foreach = False  # sharded and whole parameters do not mix in one foreach call

    def __init__(self, rank: int, world: int):
        super().__init__(rank, world)
        self.layers: list = []

    def shard(self, model) -> None:
        self.layers = dp.shard_layers(model)

    def gathered(self):
        return dp.gathered(self.layers)

    def anywhere(self, flag: bool) -> bool:
        return dp.any_true(flag)

    def clip_grad_norm(self, params, max_norm):
        return dp.clip_grad_norm(params, max_norm)

    def update_norm(self, params, start):
        return dp.global_norm(p.detach() - s for p, s in zip(params, start))

    @property
    def builds_checkpoint(self) -> bool:
        return True  # gathering the shards is a collective: every rank takes part

    def trainable_state(self, model) -> dict:
        return {n: dp.full_tensor(p.detach()).cpu().clone() for n, p in model.named_parameters() if p.requires_grad}

    def optimizer_state(self, optimizer) -> dict:
        return dp.full_optimizer_state(optimizer)

    def load_optimizer_state(self, optimizer, state: dict) -> None:
        load_keeping_kernel(optimizer, state)
        dp.shard_optimizer_state(optimizer)


def check_launch(cfg) -> None:
    """Before any work and before joining the process group: the config can be trained on the world size the
    launcher set (``distributed.check_world_size``; ValueError naming the key)."""
    dp.check_world_size(cfg, dp.launched_world_size())


def join(cfg, device_type: str) -> OneProcess:
    """Join the process group torchrun described (``distributed.init_from_env``), check that the config can be
    trained on its world size, and return the strategy: one process, DDP, or FSDP2 (``train.parallel``)."""
    rank, world = dp.init_from_env(device_type)
    dp.check_world_size(cfg, world)
    if world == 1:
        return OneProcess()
    if cfg.train.parallel == "fsdp2":
        return ShardedDataParallel(rank, world)
    return DataParallel(rank, world)
