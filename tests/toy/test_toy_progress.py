"""The optional per-step hook of ``dfpo.toy.train.run`` (the explorer's progress bar and Stop)."""

from __future__ import annotations

import pytest
import torch

from dfpo.toy.train import ToyConfig, run

pytestmark = pytest.mark.usefixtures("one_thread")

CONFIG = ToyConfig(task="tenplusten", objectives=("gspo", "dfpo_min"), seeds=2, steps=3, group_size=4, inner_steps=2)


def test_on_step_is_called_after_every_step_and_changes_nothing():
    """The hook sees each (objective, step) once, in order, and the results equal a run without it."""
    calls = []
    _, hooked = run(CONFIG, on_step=lambda name, step: calls.append((name, step)))
    _, plain = run(CONFIG)
    assert calls == [("gspo", 0), ("gspo", 1), ("gspo", 2), ("dfpo_min", 0), ("dfpo_min", 1), ("dfpo_min", 2)]
    for name in CONFIG.objectives:
        assert hooked[name].keys() == plain[name].keys()
        for key in plain[name]:
            torch.testing.assert_close(hooked[name][key], plain[name][key], rtol=0, atol=0)


def test_an_exception_from_on_step_stops_the_run_at_that_step():
    class Stop(Exception):
        pass

    calls = []

    def hook(name, step):
        calls.append((name, step))
        if step == 1:
            raise Stop

    with pytest.raises(Stop):
        run(CONFIG, on_step=hook)
    assert calls == [("gspo", 0), ("gspo", 1)]
