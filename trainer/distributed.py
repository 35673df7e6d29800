"""Data parallelism over whole groups: the pieces that make N ranks compute one process's gradient.

Each rank holds whole groups (``rank_share``): DFPO's transforms need a group in one loss
call, so groups are never split across ranks. The loss normalisation is global: a micro-batch's accumulation
weight is its ``aggregation_count`` over the count of the whole mini-batch across ALL ranks
(``global_accumulation_weights``, one all-reduce), so after the gradients are summed over ranks
(``all_reduce_gradients``) every aggregation mode gives exactly the gradient one process computes on the
whole batch. Without an initialised process group every function is the single-process one.

``dfpo train`` under torchrun (or ``--nproc N``): every rank samples and scores its share of the prompts, the
completions and rewards are gathered so that every rank holds the whole rollout batch (advantages, the
mini-batch plan and the metrics are then computed from the global batch, identically on every rank), and each
rank trains on its share of the groups of every mini-batch. Rank 0 alone writes the run folder.
"""

from __future__ import annotations

import math
import os
from contextlib import contextmanager

import torch
import torch.distributed as dist

from ..core.loss.aggregation import aggregation_count
from ..core.metric_registry import reduce_records


def distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) of the initialised process group, (0, 1) without one."""
    if not distributed():
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def launched_world_size() -> int:
    """The world size torchrun set in the environment (1 when not launched by it)."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def launched_rank() -> int:
    """This process's rank as its launcher set it in the environment (0 when not launched as one of several)."""
    try:
        return max(0, int(os.environ.get("RANK", "0")))
    except ValueError:
        return 0


def check_world_size(cfg, world: int) -> None:
    """The config can be trained on ``world`` processes: whole groups per rank in every step and mini-batch, and
    settings the parallel mode supports. ValueError naming the key and value; no work done."""
    if world < 1:
        raise ValueError(f"--nproc must be >= 1, got {world}")
    if world == 1:
        return
    for key, value in (("rollout.prompts_per_step", cfg.rollout.prompts_per_step), ("optim.minibatch_groups", cfg.optim.minibatch_groups)):
        if value % world:
            raise ValueError(
                f"{key}={value} is not divisible by the world size {world}: every process trains whole groups, "
                f"the same number of them; make {key} a multiple of {world}"
            )
    if cfg.train.parallel == "fsdp2":
        if cfg.optim.max_tokens_per_microbatch:
            raise ValueError(
                f'train.parallel = "fsdp2" needs the same number of micro-batches on every process; optim.max_tokens_per_microbatch='
                f'{cfg.optim.max_tokens_per_microbatch} splits by tokens. Set it to 0 (split by optim.microbatch_groups) or use "ddp"'
            )
        if cfg.rollout.engine != "hf":
            raise ValueError(
                f'train.parallel = "fsdp2" samples with the sharded model itself; rollout.engine = {cfg.rollout.engine!r} needs "ddp"'
            )


def init_from_env(device_type: str) -> tuple[int, int]:
    """Join the process group torchrun described in the environment (gloo on CPU, nccl on CUDA) unless one is
    initialised already or the world size is 1; returns (rank, world size)."""
    if launched_world_size() > 1 and not (dist.is_available() and dist.is_initialized()):
        if device_type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
    return rank_and_world()


def rank_share(rows: torch.Tensor, group_ids: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """The rows (b,) of a mini-batch's ``rows`` (B,) that rank ``rank`` trains: the groups at positions
    rank, rank + world, ... in the order the groups first appear in ``rows`` (whole groups, in that order)."""
    if world == 1:
        return rows
    order = list(dict.fromkeys(group_ids[rows].tolist()))  # groups in order of first appearance
    mine = torch.tensor(order[rank::world], dtype=group_ids.dtype)
    return rows[torch.isin(group_ids[rows], mine)]


def global_accumulation_weights(masks: list[torch.Tensor], aggregation: str) -> list[float]:
    """w_u = count_u / (count of the mini-batch summed over all ranks), for this rank's micro-batches."""
    counts = torch.tensor([float(aggregation_count(m, aggregation)) for m in masks], dtype=torch.float64)
    total = sum_tensor(counts.sum())
    return [float(c / total) if total > 0 else 0.0 for c in counts]


def _device() -> torch.device:
    """Where collectives of this backend take their tensors (nccl: the current CUDA device)."""
    if distributed() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_gradients(params, bucket_elements: int = 2**24) -> None:
    """Sum every parameter's gradient over the ranks (the weights above are already global shares), in
    flattened buckets of about ``bucket_elements`` values per all-reduce."""
    params = list(params)
    if not distributed() or not params:
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    bucket: list[torch.Tensor] = []
    size = 0
    for p in params + [None]:
        if p is not None and (not bucket or (size + p.grad.numel() <= bucket_elements and p.grad.dtype == bucket[0].dtype)):
            bucket.append(p.grad)
            size += p.grad.numel()
            continue
        flat = torch.cat([g.flatten() for g in bucket])  # (sum of numels,)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for g in bucket:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
        if p is not None:
            bucket, size = [p.grad], p.grad.numel()


def sum_tensor(t: torch.Tensor) -> torch.Tensor:
    """``t`` summed over the ranks (a new tensor on t's device; ``t`` itself without a process group)."""
    if not distributed():
        return t
    out = t.detach().to(_device()).clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out.to(t.device)


def all_ranks(flag: bool) -> bool:
    """Whether ``flag`` holds on every rank."""
    if not distributed():
        return bool(flag)
    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=_device())
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def any_true(flag: bool) -> bool:
    """Whether ``flag`` holds on some rank."""
    return not all_ranks(not flag)


def any_rank(value: int | None) -> int | None:
    """The largest non-None ``value`` over the ranks (None if every rank has None): a signal number seen by any rank."""
    if not distributed():
        return value
    t = torch.tensor([-1 if value is None else int(value)], dtype=torch.int64, device=_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return None if int(t.item()) < 0 else int(t.item())


def gather_objects(obj) -> list:
    """Every rank's ``obj`` (picklable), in rank order, on every rank; ``[obj]`` without a process group."""
    if not distributed():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def combine_metrics(parts: list[tuple[dict, float]]) -> dict:
    """One optimiser step's loss metrics from every rank's (metrics over its micro-batches, the summed accumulation
    weight of those micro-batches): each key by its declared reduction (``metric_registry``), means weighted by
    each rank's share of the mini-batch."""
    return reduce_records([m for m, _ in parts], [w for _, w in parts])


class RankZeroFailed(ValueError):
    """Raised on every other rank when rank 0's part failed; rank 0 reports the error itself."""

    already_reported = True  # the command line prints nothing more for it


def on_rank0(fn):
    """Run ``fn`` on rank 0 only and wait for it on every rank: its result on rank 0 (None elsewhere); when it
    raises, rank 0 re-raises and every other rank raises ValueError with the same message (no rank hangs)."""
    if not distributed():
        return fn()
    result, error, message = None, None, None
    if dist.get_rank() == 0:
        try:
            result = fn()
        except BaseException as err:  # noqa: BLE001 - passed on to the other ranks, then re-raised
            error, message = err, f"{type(err).__name__}: {err}" if not isinstance(err, ValueError) else str(err)
    box = [message]
    dist.broadcast_object_list(box, src=0)
    if error is not None:
        raise error
    if box[0] is not None:
        raise RankZeroFailed(f"rank 0 failed: {box[0]}")
    return result


def agree(fn):
    """Run ``fn`` on every rank (checks that need no collective); when it fails on any rank, it fails on all: rank 0
    raises a ValueError holding each distinct message once (tagged with its ranks when they differ), the others
    ``RankZeroFailed``, so the error is printed once and no rank waits for another that gave up."""
    if not distributed():
        return fn()
    result, message, error = None, None, None
    try:
        result = fn()
    except Exception as err:  # noqa: BLE001 - shared with the other ranks, then raised everywhere
        error, message = err, str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}"
    failures = [(rank, m) for rank, m in enumerate(gather_objects(message)) if m is not None]
    if not failures:
        return result
    if dist.get_rank() != 0:
        raise RankZeroFailed(f"rank 0 reports the error: {failures[0][1]}")
    distinct = dict.fromkeys(m for _, m in failures)
    if len(distinct) == 1:
        raise ValueError(next(iter(distinct))) from (error if error is not None else None)
    raise ValueError("; ".join(f"rank {rank}: {m}" for rank, m in failures))


def barrier() -> None:
    if distributed():
        dist.barrier()


def shutdown() -> None:
    """Leave the process group (if this process is in one)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


# ----------------------------------------------------------------------------- FSDP2 (train.parallel = "fsdp2")


def shard_layers(model) -> list:
    """Shard every decoder layer of ``model`` with FSDP2 (``fully_shard``, dim 0 over the ranks); the embeddings,
    final norm and LM head stay whole on every rank (the trainer calls the decoder and the head separately).
    Returns the sharded layers."""
    from torch.distributed.fsdp import fully_shard

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    layers = [m for m in base.modules() if type(m).__name__.endswith("DecoderLayer")]
    if not layers:
        raise ValueError(
            f'train.parallel = "fsdp2" found no decoder layers (modules named *DecoderLayer) in {type(base).__name__}; use "ddp"'
        )
    for layer in layers:
        fully_shard(layer)
    return layers


def is_sharded(t) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


@contextmanager
def gathered(layers: list):
    """Keep FSDP2 ``layers`` whole for the duration: forward passes whose number differs between ranks
    (sampling, evaluation, no-grad scoring) then need no collective. A no-op for an empty list."""
    for layer in layers:
        layer.unshard()
        layer.set_reshard_after_forward(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.set_reshard_after_forward(True)
            layer.reshard()


def sync_gradients(params, world: int) -> None:
    """Make every gradient the sum over the ranks: whole (replicated) parameters by an all-reduce; FSDP2's
    reduce-scatter averaged the sharded ones, so they are multiplied by the world size."""
    params = [p for p in params if p.requires_grad]
    whole = [p for p in params if not is_sharded(p)]
    all_reduce_gradients(whole)
    with torch.no_grad():
        for p in params:
            if is_sharded(p) and p.grad is not None:
                p.grad.mul_(world)


def global_norm(tensors) -> float:
    """The L2 norm of all ``tensors`` together over sharded and whole ones (each shard counted once; a collective
    when any is sharded: every rank calls it), summed in float64."""
    local = torch.zeros((), dtype=torch.float64)
    whole = torch.zeros((), dtype=torch.float64)
    for t in tensors:
        if is_sharded(t):
            local += t.to_local().detach().double().pow(2).sum().cpu()
        else:
            whole += t.detach().double().pow(2).sum().cpu()
    return math.sqrt(float(sum_tensor(local) + whole))


def clip_grad_norm(params, max_norm: float) -> float:
    """``torch.nn.utils.clip_grad_norm_`` over sharded and whole parameters together: the global L2 norm of
    all gradients (each shard counted once), and every gradient scaled by min(1, max_norm / (norm + 1e-6))."""
    grads = [p.grad for p in params if p.grad is not None]
    norm = global_norm(grads)
    coef = min(1.0, max_norm / (norm + 1e-6)) if math.isfinite(norm) else 1.0
    if coef < 1.0:
        with torch.no_grad():
            for g in grads:
                g.mul_(coef)
    return norm


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a shard (a collective: every rank calls it), or ``t`` itself."""
    return t.full_tensor() if is_sharded(t) else t


def load_full(param: torch.Tensor, full: torch.Tensor) -> None:
    """Copy a whole tensor into ``param``: its own shard of it when ``param`` is sharded (no communication)."""
    from torch.distributed.tensor import distribute_tensor

    full = full.to(param.device, param.dtype)
    with torch.no_grad():
        if is_sharded(param):
            param.copy_(distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None))
        else:
            param.copy_(full)


def full_optimizer_state(optimizer) -> dict:
    """``optimizer.state_dict()`` with every sharded state tensor made whole: the one-process format."""
    state = optimizer.state_dict()
    state["state"] = {k: {kk: full_tensor(v) for kk, v in entry.items()} for k, entry in state["state"].items()}
    return state


def shard_optimizer_state(optimizer) -> None:
    """After ``load_state_dict`` of a whole (one-process) state: keep only this rank's shard of the state of sharded parameters."""
    from torch.distributed.tensor import distribute_tensor

    for group in optimizer.param_groups:
        for p in group["params"]:
            if not is_sharded(p) or p not in optimizer.state:
                continue
            entry = optimizer.state[p]
            for k, v in entry.items():
                if isinstance(v, torch.Tensor) and not is_sharded(v) and v.shape == p.shape:
                    entry[k] = distribute_tensor(v.to(p.device), p.device_mesh, p.placements, src_data_rank=None)
