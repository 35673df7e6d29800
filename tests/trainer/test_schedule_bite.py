"""Tests that bite the lr schedule (issue 57 item 11, mutation/realmodel.toml): the warm-up's length is
``optim.warmup_ratio`` of the optimiser steps rounded to the nearest, and the schedule applies it."""

from __future__ import annotations

import pytest
import torch

from dfpo.trainer.stages.update import lr_schedule, warmup_updates


@pytest.mark.parametrize("total, ratio, steps", [(10, 0.27, 3), (10, 0.21, 2), (20, 0.2, 4), (7, 0.0, 0), (3, 0.5, 2)])
def test_the_warm_up_is_the_ratio_of_the_steps_rounded_to_the_nearest(total, ratio, steps):
    assert warmup_updates(total, ratio) == steps


def test_a_warm_up_of_2_7_steps_takes_3_and_the_fourth_step_applies_the_full_lr():
    """10 optimiser steps at warmup_ratio 0.27: steps 1-3 apply 1/3, 2/3 and 3/3 of the lr, step 4 the cosine's start."""
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=0.3)
    schedule = lr_schedule(opt, total=10, warmup_ratio=0.27, min_ratio=0.0)
    applied = []
    for _ in range(4):
        applied.append(opt.param_groups[0]["lr"])
        opt.step()
        schedule.step()
    assert applied == pytest.approx([0.1, 0.2, 0.3, 0.3])
