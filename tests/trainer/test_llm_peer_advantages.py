"""The trainer's side of the peers' advantages that read more than one total reward per completion (issue 30, item 4):
GDPO's reward matrix (one column per reward function) and ReMax's greedy completion per prompt."""

import json

import pytest
import torch
from test_llm_e2e import tiny_config

from dfpo.trainer.rewards.compute import REWARD_FUNCTIONS, RewardBatch, reward_matrix, reward_weights
from dfpo.trainer.run.layout import RunDir
from dfpo.trainer.sampler import HFGenerateEngine, greedy_params
from dfpo.trainer.stages import advantages as stage_advantages
from dfpo.trainer.train import Trainer


def _spy(monkeypatch) -> list[dict]:
    """Every call of the advantage stage's group_advantages: its rewards and keyword arguments."""
    seen = []
    real = stage_advantages.group_advantages

    def spy(rewards, group_ids, **kw):
        seen.append({"rewards": rewards.clone(), **kw})
        return real(rewards, group_ids, **kw)

    monkeypatch.setattr(stage_advantages, "group_advantages", spy)
    return seen


def _rows(tmp_path) -> list[dict]:
    return [json.loads(line) for line in RunDir(tmp_path / "run").metrics.read_text().splitlines()]


def test_the_reward_matrix_holds_each_function_and_its_weights_give_the_total():
    """One column per reward function (correctness, format); weighted by (1, format_weight) they sum to the total."""
    batch = RewardBatch(total=[1.5, 0.0, 0.5], correct=[1.0, 0.0, 0.0], format=[1.0, 0.0, 1.0])
    m = reward_matrix(batch)
    assert REWARD_FUNCTIONS == ("correct", "format") and m.shape == (3, 2)
    torch.testing.assert_close(m @ reward_weights(0.5), torch.tensor(batch.total))


def test_gdpo_trains_two_steps_on_the_reward_matrix(tmp_path, monkeypatch):
    """adv_scale=gdpo: the advantage stage passes the (B, 2) matrix of correctness and format with weights (1, 1), two
    steps train, and both functions' rewards are logged apart."""
    seen = _spy(monkeypatch)
    cfg = tiny_config(tmp_path, "objective.name=grpo", "objective.overrides.adv_scale=gdpo", "eval.every=0")
    Trainer(cfg, quiet=True).run()
    assert len(seen) == 2
    for call in seen:
        assert call["scale"] == "gdpo" and call["rewards"].shape == (8, 2)
        torch.testing.assert_close(call["reward_weights"], torch.tensor([1.0, 1.0]))
    for row in _rows(tmp_path):
        assert {"reward/correct", "reward/format", "grad/norm"} <= set(row)


def test_gdpo_needs_a_second_reward_function(tmp_path):
    with pytest.raises(ValueError, match=r"adv_scale='gdpo' normalises each reward function separately, but reward.format_weight = 0"):
        tiny_config(tmp_path, "objective.overrides.adv_scale=gdpo", "reward.format_weight=0.0")  # validated as it is built


def test_remax_trains_two_steps_against_the_greedy_reward(tmp_path, monkeypatch):
    """adv_scale=remax: each step decodes one greedy completion per prompt, scores it, passes its reward as every
    completion's baseline of the group, and trains on the sampled groups only (the batch keeps its 2 x 4 rows)."""
    seen = _spy(monkeypatch)
    cfg = tiny_config(tmp_path, "objective.name=grpo", "objective.overrides.adv_scale=remax", "eval.every=0")
    Trainer(cfg, quiet=True).run()
    assert len(seen) == 2
    for call in seen:
        b = call["baselines"]
        assert call["scale"] == "remax" and call["rewards"].shape == (8,) and b.shape == (8,)
        assert bool((b.view(2, 4) == b.view(2, 4)[:, :1]).all())  # one greedy reward per prompt, repeated over its group
    rows = _rows(tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    for row, call in zip(rows, seen):
        assert row["reward/greedy"] == pytest.approx(float(call["baselines"].view(2, 4)[:, 0].mean()))


def test_remax_refuses_dynamic_sampling(tmp_path):
    with pytest.raises(ValueError, match=r"adv_scale='remax' subtracts the greedy completion's reward.*rollout.dynamic_sampling = false"):
        tiny_config(tmp_path, "objective.overrides.adv_scale=remax", "rollout.dynamic_sampling=true")


def test_the_greedy_completion_is_transformers_greedy_decoding(tmp_path):
    """The HF engine's greedy mode picks what transformers' generate(do_sample=False) picks, draws nothing from the RNG,
    and gives the same completion every time."""
    trainer = Trainer(tiny_config(tmp_path, "train.steps=1"), quiet=True)
    model, tok, eos = trainer.model, trainer.policy.tok, trainer.policy.eos_ids
    prompts = trainer.rollout_stage.encode(trainer.rollout_stage.train_examples[:3])
    engine = HFGenerateEngine(model, tok.pad_token_id, eos)
    state = torch.random.get_rng_state()
    ours = engine.sample(prompts, 1, greedy_params(5)).tokens
    assert torch.equal(torch.random.get_rng_state(), state)
    assert engine.sample(prompts, 1, greedy_params(5)).tokens == ours
    model.eval()
    for prompt, completion in zip(prompts, ours):
        ids = torch.tensor([prompt])
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=5,
            eos_token_id=sorted(eos),
            pad_token_id=tok.pad_token_id,
        )
        theirs = out[0, len(prompt) :].tolist()
        cut = next((j + 1 for j, t in enumerate(theirs) if t in eos), len(theirs))
        assert completion == theirs[:cut]


def test_otb_trains_two_steps_on_one_advantage_per_token(tmp_path, monkeypatch):
    """adv_scale=otb: before the advantages, a no-grad pass gives pi_old's log-prob and sum_v pi_v^2 at every token
    (pi_t^2 <= sum pi^2 <= 1), the optimal token baseline turns them into (B, T) advantages, and two steps train on them."""
    seen = []
    real = stage_advantages.optimal_token_baseline

    def spy(rewards, group_ids, mask, old_logp, pi_squared, **kw):
        adv = real(rewards, group_ids, mask, old_logp, pi_squared, **kw)
        seen.append({"mask": mask.clone(), "old_logp": old_logp, "pi_squared": pi_squared, "adv": adv})
        return adv

    monkeypatch.setattr(stage_advantages, "optimal_token_baseline", spy)
    cfg = tiny_config(tmp_path, "objective.name=dapo", "objective.overrides.adv_scale=otb", "eval.every=0")
    Trainer(cfg, quiet=True).run()
    assert len(seen) == 2
    for call in seen:
        mask, pi_sq, p_t = call["mask"], call["pi_squared"], call["old_logp"].exp()
        assert call["adv"].shape == mask.shape and bool((call["adv"][~mask] == 0).all())
        assert bool((pi_sq[mask] <= 1 + 1e-6).all() and (pi_sq[mask] >= p_t[mask] ** 2 - 1e-6).all())
        assert not bool((call["adv"][mask] == call["adv"][mask][0]).all())  # per token, not one number per row
    for row in _rows(tmp_path):
        assert row["grad/norm"] == row["grad/norm"] and "loss/policy" in row


def test_otb_with_a_sequence_level_objective_is_refused_at_config_time(tmp_path):
    """The optimal token baseline gives one advantage per token; GSPO weighs a whole completion by one advantage."""
    with pytest.raises(ValueError, match=r"adv_scale='otb' gives one advantage per token, but ratio_level='sequence'"):
        tiny_config(tmp_path, "objective.name=gspo", "objective.overrides.adv_scale=otb")


def test_gdpo_trains_on_further_reward_functions(tmp_path, monkeypatch):
    """reward.functions adds reward functions beside correctness and format: each is scored in its own workers, kept apart
    (a third column of GDPO's matrix, weighted by reward.weights), logged as reward/fn0 and added to the total."""
    seen = _spy(monkeypatch)
    cfg = tiny_config(
        tmp_path,
        "objective.name=grpo",
        "objective.overrides.adv_scale=gdpo",
        "eval.every=0",
        'reward.functions=["reward_fixtures:half_informative_reward"]',
        "reward.weights=[0.5]",
        "reward.workers=1",
    )
    Trainer(cfg, quiet=True).run()
    assert len(seen) == 2
    for call in seen:
        assert call["rewards"].shape == (8, 3)
        torch.testing.assert_close(call["reward_weights"], torch.tensor([1.0, 1.0, 0.5]))
    for row in _rows(tmp_path):
        assert row["reward/mean"] == pytest.approx(row["reward/correct"] + row["reward/format"] + 0.5 * row["reward/fn0"], abs=1e-6)


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (['reward.functions=["reward_fixtures:half_informative_reward"]', "reward.weights=[1.0, 2.0]"], "reward.weights must be 1 finite"),
        (
            ['reward.functions=["not a function"]'],
            r"reward.functions entries must look like 'package.module:function', got 'not a function'",
        ),
    ],
)
def test_bad_further_reward_functions_are_refused_before_any_work(tmp_path, sets, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(tmp_path, *sets)


def test_gathering_the_groups_of_several_processes_keeps_each_functions_values():
    """parallel.gather_groups lays every process's rows out in group order, reward.functions' values with them."""
    from dfpo.trainer.parallel import gather_groups
    from dfpo.trainer.sampler import Samples

    def part(groups, base):
        rows = [base + k for k in range(2 * len(groups))]  # 2 completions a group
        smp = Samples([[r] for r in rows], [[0.0]] * len(rows), [[0.0]] * len(rows))
        rew = RewardBatch([float(r) for r in rows], [0.0] * len(rows), [0.0] * len(rows), extra=([10.0 * r for r in rows],))
        return groups, smp, [str(r) for r in rows], rew

    _, texts, rew = gather_groups([part([1], 100), part([0], 0)], n_groups=2, G=2)
    assert texts == ["0", "1", "100", "101"] and rew.extra == ([0.0, 10.0, 1000.0, 1010.0],)


def test_a_further_reward_function_that_cannot_be_imported_is_named(tmp_path):
    from dfpo.trainer.rewards.compute import RewardComputer, RewardSpec

    with pytest.raises(ValueError, match=r"reward.functions entry 'no_such_module_xyz:score': cannot import module"):
        RewardComputer(RewardSpec("exact"), functions=["no_such_module_xyz:score"], workers=1)


def test_the_greedy_baseline_benchmark_runs_and_prints_both_settings():
    """benchmarks/remax_greedy.py at one ABBA pair: a benchmark no test runs breaks silently when the stage it times changes."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "benchmarks/remax_greedy.py", "--pairs", "1"], cwd=root, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "sampling only" in out.stdout and "with greedy baseline" in out.stdout and "ratio with/without" in out.stdout


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), True, "1"])
def test_a_reward_weight_that_is_not_a_finite_number_is_refused_in_one_sentence(bad):
    """reward.weights: NaN, an infinity, a bool or a string is refused, naming the list; whole numbers are weights."""
    from dfpo.trainer.rewards.compute import function_weights

    with pytest.raises(ValueError, match=r"reward.weights must be 2 finite numbers.*got \["):
        function_weights(["a", "b"], [1.0, bad])
    assert function_weights(["a", "b"], [1, 2.5]) == (1.0, 2.5) and function_weights(["a"], []) == (1.0,)
