"""Two gloo processes on CPU, each with half of the groups, produce the gradient one process computes on the
whole batch, for every aggregation mode (the normalisation is global, groups are never split)."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from dfpo import resolve_objective
from dfpo.trainer.config import ModelConfig
from dfpo.trainer.distributed import (
    all_reduce_gradients,
    combine_metrics,
    global_accumulation_weights,
    rank_share,
)
from dfpo.trainer.minibatches import micro_batch, split_groups
from dfpo.trainer.policy import build_char_tokenizer, build_tiny_model
from dfpo.trainer.sampler import build_batch
from dfpo.trainer.stages.update import accumulate_gradients

CASES = [("grpo", {}), ("dapo", {}), ("dr_grpo", {"max_completion_length": 6}), ("dfpo_min", {"eps_low": 0.05, "eps_high": 0.05})]


def _setup():
    torch.manual_seed(0)
    tok = build_char_tokenizer()
    model = build_tiny_model(ModelConfig(tiny_hidden=32, tiny_layers=1, tiny_heads=2, tiny_intermediate=64), tok, seed=0)
    g = torch.Generator().manual_seed(1)
    prompts = [tok(f"{i}+{i * 3}=", add_special_tokens=False).input_ids for i in range(4)]
    completions = [torch.randint(3, 13, (int(torch.randint(1, 6, (1,), generator=g)),), generator=g).tolist() for _ in range(16)]
    batch = build_batch(prompts, completions, 4, pad_id=tok.pad_token_id, eos_ids=set(), max_new_tokens=6)
    old = torch.where(batch.mask, -2.0 + 0.3 * torch.randn(batch.mask.shape, generator=g), 0.0)
    adv = torch.randn(16, generator=g)
    return model, batch, old, adv


def _grads(model, batch, old, adv, spec, rows) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    micro_rows = split_groups(rows, batch.group_ids, 1)  # one group per micro-batch
    weights = global_accumulation_weights([batch.mask[r] for r in micro_rows], spec.aggregation)
    micros = [micro_batch(batch, r, old, None, adv, w) for r, w in zip(micro_rows, weights)]
    assert accumulate_gradients(model, micros, spec, torch.device("cpu"))[1]
    all_reduce_gradients(list(model.parameters()), bucket_elements=1000)  # several buckets
    return [p.grad.clone() for p in model.parameters()]


def _rank(rank: int, world: int, init_file: str, out_file: str, name: str, overrides: dict) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    model, batch, old, adv = _setup()
    rows = rank_share(torch.arange(batch.group_ids.numel()), batch.group_ids, rank, world)  # whole groups
    grads = _grads(model, batch, old, adv, resolve_objective(name, **overrides), rows)
    if rank == 0:
        torch.save(grads, out_file)
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.parametrize("name, overrides", CASES)
def test_two_gloo_ranks_give_the_one_process_gradient(tmp_path, name, overrides):
    model, batch, old, adv = _setup()
    single = _grads(model, batch, old, adv, resolve_objective(name, **overrides), torch.arange(16))
    out = tmp_path / "grads.pt"
    # fork, not spawn: spawn re-imports __main__, which other tests (Streamlit's AppTest) may have replaced
    mp.start_processes(_rank, args=(2, str(tmp_path / "init"), str(out), name, overrides), nprocs=2, join=True, start_method="fork")
    for a, b in zip(single, torch.load(out)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_every_rank_gets_the_same_number_of_whole_groups_of_a_mini_batch():
    gid = torch.arange(8).repeat_interleave(2)
    rows = torch.isin(gid, torch.tensor([6, 1, 3, 4])).nonzero().flatten()  # a mini-batch of 4 groups
    parts = [rank_share(rows, gid, r, 2) for r in range(2)]
    assert sorted(torch.cat(parts).tolist()) == rows.tolist()
    assert [sorted(set(gid[p].tolist())) for p in parts] == [[1, 4], [3, 6]]
    assert torch.equal(rank_share(rows, gid, 0, 1), rows)


def test_rank_metrics_combine_by_their_declared_reduction():
    """Means weighted by each rank's share of the mini-batch; a maximum, a minimum and a count stay one."""
    parts = [
        ({"loss/policy": 0.25, "ratio/max": 1.5, "rollout/seq_ratio_min": 0.5, "rollout/seq_ratio_max": 2.0}, 0.25),
        ({"loss/policy": 0.5, "ratio/max": 1.25, "entropy/mean": 0.1, "rollout/seq_ratio_min": 0.75, "rollout/seq_ratio_max": 3.0}, 0.75),
    ]
    assert combine_metrics(parts) == pytest.approx(
        {
            "loss/policy": 0.25 * 0.25 + 0.5 * 0.75,
            "ratio/max": 1.5,
            "rollout/seq_ratio_min": 0.5,
            "rollout/seq_ratio_max": 3.0,
            "entropy/mean": 0.1,
        }
    )
