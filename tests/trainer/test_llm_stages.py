"""The seams of the training step: the one-process strategy answers every parallel question with this process's own
value, the stages never ask the world size themselves, and the task-specific pieces the trainer calls give the
values the step logged before they moved to the task."""

import random
import re
from pathlib import Path

import torch

from dfpo.trainer import parallel
from dfpo.trainer.diagnostics import StepDiagnostics
from dfpo.trainer.minibatches import accumulation_weights
from dfpo.trainer.stages.old_logp import FirstPass
from dfpo.trainer.tasks import Example, sft_target, surface_form_shares

LLM = Path(__file__).resolve().parents[2] / "trainer"


def test_one_process_answers_every_question_with_its_own_value():
    one = parallel.OneProcess()
    rows, groups = torch.tensor([4, 5, 6, 7]), torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    masks = [torch.ones(2, 3, dtype=torch.bool), torch.tensor([[True, False, False], [True, True, False]])]
    first = FirstPass.empty(torch.ones(4, 3, dtype=torch.bool))
    diag = StepDiagnostics(shared_num=1.5, shared_den=3.0, shared_positions=2)
    assert (one.rank, one.world, one.is_main, one.builds_checkpoint, one.stop_early) == (0, 1, True, True, True)
    assert one.my_share(3) == [0, 1, 2] and one.gather_objects("x") == ["x"] and one.any_signal(15) == 15
    assert torch.equal(one.rank_share(rows, groups), rows)
    assert one.anywhere(False) is False and one.anywhere(True) is True
    assert one.accumulation_weights(masks, "token_mean") == accumulation_weights(masks, "token_mean") == [6 / 9, 3 / 9]
    assert one.combine_gradients(True, {"loss/policy": 0.25}, [1.0], []) == (True, {"loss/policy": 0.25})
    assert one.share_first_pass(first, torch.ones(4, dtype=torch.bool)) is first
    assert one.reduce_diagnostics(diag) is diag
    assert one.on_rank0(lambda: 7) == 7 and one.agree(lambda: 8) == 8


def test_a_world_of_one_is_the_one_process_strategy_whatever_train_parallel_says():
    """Without a process group ``join`` gives OneProcess, for ddp and fsdp2 alike (no layer is sharded)."""
    from test_llm_e2e import tiny_config

    for mode in ("ddp", "fsdp2"):
        strategy = parallel.join(tiny_config(Path("/nonexistent"), f"train.parallel={mode}"), "cpu")
        assert type(strategy) is parallel.OneProcess


def test_no_stage_asks_the_world_size_or_fsdp_itself():
    """Every question that depends on the number of processes goes to the strategy (``parallel.py``)."""
    asks = re.compile(r"world\s*[>=!]=?\s*1|fsdp|is_sharded|dp\.\w+\(|import distributed")
    for name in (
        "train.py",
        "stages/rollout.py",
        "stages/advantages.py",
        "stages/old_logp.py",
        "stages/update.py",
        "stages/metrics.py",
        "run/state.py",
    ):
        hits = [line.strip() for line in (LLM / name).read_text().splitlines() if asks.search(line) and not line.lstrip().startswith("#")]
        assert not hits, (name, hits)


def test_surface_form_shares_of_the_arithmetic_tasks_and_none_elsewhere():
    ex = Example("37+45=", "82", {"a": 37, "b": 45})
    texts = ["82", "45+37", "37+45", "80+2", "eighty"]
    shares = {"forms/number": 0.2, "forms/swap": 0.2, "forms/split": 0.2, "forms/echo": 0.2, "forms/invalid": 0.2}
    assert surface_form_shares("equiv", texts, [ex] * 5) == shares
    assert surface_form_shares("add", texts, [ex] * 5) == shares
    assert surface_form_shares("jsonl", texts, [ex] * 5) == {}


def test_the_warm_start_target_is_a_correct_form_for_equiv_and_the_answer_otherwise():
    """equiv draws its form from the warm start's generator; add takes the answer and draws nothing."""
    ex = Example("37+45=", "82", {"a": 37, "b": 45})
    rng = random.Random(0)
    targets = [sft_target("equiv")(ex, rng) for _ in range(30)]
    assert all(sum(int(x) for x in t.split("+")) == 82 for t in targets) and len(set(targets)) > 2
    rng, untouched = random.Random(1), random.Random(1)
    assert sft_target("add")(ex, rng) == "82" and rng.random() == untouched.random()
