"""The update's AdamW kernel (trainer.stages.update.adamw_kernel): torch's fused one where the layout allows it."""

from __future__ import annotations

import torch

from dfpo.trainer.stages.update import adamw_kernel


def test_plain_float_parameters_take_the_fused_kernel_and_a_layout_choice_is_kept():
    params = [torch.nn.Parameter(torch.randn(3, 4)), torch.nn.Parameter(torch.randn(5, dtype=torch.bfloat16))]
    assert adamw_kernel(params, None) == {"fused": True}
    assert adamw_kernel(params, False) == {"foreach": False}  # FSDP2's: sharded and whole parameters
    assert adamw_kernel([], None) == {"foreach": None}


def test_the_fused_kernel_takes_the_loops_steps_to_round_off():
    """Fused AdamW is the same algorithm: 5 steps from one start agree with the per-parameter loop to float32 round-off."""
    torch.manual_seed(0)
    start = [torch.randn(64, 32), torch.randn(32)]
    grads = [[torch.randn_like(p) for p in start] for _ in range(5)]
    ends = []
    for kw in ({"foreach": False}, adamw_kernel([torch.nn.Parameter(p.clone()) for p in start], None)):
        params = [torch.nn.Parameter(p.clone()) for p in start]
        opt = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1, **kw)
        for g in grads:
            for p, gi in zip(params, g):
                p.grad = gi.clone()
            opt.step()
        ends.append([p.detach() for p in params])
    for a, b in zip(*ends):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_a_checkpoint_written_by_the_fused_kernel_does_not_switch_the_loader_to_it():
    """A fused run's optimiser state, loaded where the layout asks for the loop (FSDP2), keeps the loop and the moments."""
    from dfpo.trainer.parallel import load_keeping_kernel

    params = [torch.nn.Parameter(torch.randn(4, 3))]
    fused = torch.optim.AdamW(params, lr=1e-3, fused=True)
    params[0].grad = torch.randn(4, 3)
    fused.step()
    loop = torch.optim.AdamW([torch.nn.Parameter(params[0].detach().clone())], lr=1e-3, foreach=False)
    load_keeping_kernel(loop, fused.state_dict())
    group = loop.param_groups[0]
    assert (group["fused"], group["foreach"]) == (None, False)
    moment = next(iter(loop.state.values()))["exp_avg"]
    assert torch.equal(moment, next(iter(fused.state.values()))["exp_avg"])
