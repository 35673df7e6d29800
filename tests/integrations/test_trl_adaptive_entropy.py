"""Skywork-OR1's adaptive entropy coefficient in TRL (issue 30): DFPOGRPOTrainer carries it between optimiser steps with
dfpo's own update rule, feeds it to the loss, logs it, keeps it in TRL's checkpoints and refuses a mis-set one up front."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("trl")

from test_trl_integration import _trainer  # noqa: E402

import dfpo.integrations.trl as trl_integration  # noqa: E402
from dfpo import resolve_objective  # noqa: E402
from dfpo.core.loss.adaptive_entropy import EntropyControl, initial_entropy_control, measured_entropy, next_entropy_control  # noqa: E402
from dfpo.integrations.trl import AdaptiveEntropyCallback, DFPOGRPOTrainer, saved_entropy_control  # noqa: E402

RISING = "dapo:entropy_target=100.0:entropy_coef_delta=0.01:entropy_coef_max=1.0"  # a target no tiny model reaches
FALLING = "dapo:entropy_target=0.0:entropy_coef=0.015:entropy_coef_delta=0.01:entropy_coef_max=1.0"  # one it is always above
STEPS = 3


def _entropy_rows(trainer) -> list[dict]:
    """TRL's log history, one row an optimiser step: the coefficient the step's loss used and the entropy that moved it."""
    return [row for row in trainer.state.log_history if "dfpo/entropy/coef" in row]


def _replay(spec, rows, state: EntropyControl) -> EntropyControl:
    """dfpo's update rule on the logged entropies; each row's coefficient must be the one the rule had reached."""
    for row in rows:
        assert row["dfpo/entropy/coef"] == state.coef_in_loss
        state = next_entropy_control(state, row["dfpo/entropy/controlled"], spec)
    return state


@pytest.mark.parametrize("objective", [RISING, FALLING])
def test_the_coefficient_follows_dfpos_update_rule_on_the_logged_entropies(tmp_path, monkeypatch, objective):
    """Each optimiser step's loss calls use the coefficient the rule gives on the entropies logged before it; the
    logged entropy is -mean log pi_old over the step's real tokens (measured here on what the loss received)."""
    calls = []
    real_loss = trl_integration.policy_loss

    def spy(spec, **kw):
        calls.append((spec.entropy_coef, kw["old_logp"].detach().clone(), kw["mask"].clone()))
        return real_loss(spec, **kw)

    monkeypatch.setattr(trl_integration, "policy_loss", spy)
    trainer = _trainer(tmp_path, objective=objective, steps=STEPS)
    trainer.train()
    rows, spec = _entropy_rows(trainer), trainer.dfpo_spec
    assert len(rows) == STEPS and len(calls) == STEPS  # one loss call an optimiser step (no accumulation here)
    final = _replay(spec, rows, initial_entropy_control(spec))
    assert trainer.dfpo_entropy.entropy_control == final
    assert [coef for coef, _, _ in calls] == [row["dfpo/entropy/coef"] for row in rows]  # the loss got the logged value
    for (_, old, mask), row in zip(calls, rows):
        assert row["dfpo/entropy/controlled"] == pytest.approx(measured_entropy(old, mask), rel=1e-12)
    expected = [0.0, 0.01, 0.02] if objective == RISING else [0.015, 0.0, 0.0]
    assert [row["dfpo/entropy/coef"] for row in rows] == pytest.approx(expected, abs=1e-15)
    assert ("dfpo/entropy/bonus" in rows[-1]) == (objective == RISING)  # the bonus is on only below the target


@pytest.mark.parametrize("restore_callbacks", [False, True])
def test_a_resume_restores_the_coefficient_from_trls_checkpoint(tmp_path, restore_callbacks):
    """trainer_state.json keeps the state as plain JSON; resume_from_checkpoint brings it back exactly, whatever
    restore_callback_states_from_checkpoint says, and the resumed steps go on from it by the same rule."""
    full = _trainer(tmp_path / "full", objective=RISING, steps=STEPS, save_strategy="steps", save_steps=1)
    full.train()
    checkpoint = tmp_path / "full" / "checkpoint-2"
    saved = json.loads((checkpoint / "trainer_state.json").read_text())["stateful_callbacks"]["AdaptiveEntropyCallback"]
    spec = full.dfpo_spec
    assert saved == {
        "args": {"entropy_target": 100.0, "entropy_coef_delta": 0.01, "entropy_coef_min": 0.0, "entropy_coef_max": 1.0},
        "attributes": {"coef": _replay(spec, _entropy_rows(full)[:2], initial_entropy_control(spec)).coef, "enabled": True},
    }
    resumed = _trainer(tmp_path / "resumed", objective=RISING, steps=STEPS, restore_callback_states_from_checkpoint=restore_callbacks)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    rows = _entropy_rows(resumed)[2:]  # the checkpoint's history, then the resumed step
    assert len(rows) == 1 and rows[0]["dfpo/entropy/coef"] == saved["attributes"]["coef"]
    assert resumed.dfpo_entropy.entropy_control == _replay(spec, rows, EntropyControl(**saved["attributes"]))
    assert resumed.dfpo_entropy.entropy_control == full.dfpo_entropy.entropy_control  # the rising coefficient, both ways
    assert resumed.dfpo_entropy in resumed.callback_handler.callbacks  # transformers did not replace it


@pytest.mark.parametrize(
    ("objective", "message"),
    [
        ("dapo:entropy_target=0.2:entropy_coef_min=0.01", "entropy_coef_min=0.01 must be at most entropy_coef_max=0.005"),
        ("dapo:entropy_target=-1", "entropy_target must be >= 0, got -1.0"),
        ("dapo:entropy_target=nan", "entropy_target must be a finite number, got nan"),
        ("dapo:entropy_target=0.2:entropy_coef_delta=nan", "entropy_coef_delta must be a finite number, got nan"),
    ],
)
def test_a_mis_set_coefficient_is_refused_before_trl_builds_anything(objective, message):
    with pytest.raises(ValueError, match=message):
        DFPOGRPOTrainer(objective=objective)  # no model, no data: refused from the label alone


def _entry(coef=0.02, enabled=True, **settings):
    args = {"entropy_target": 100.0, "entropy_coef_delta": 0.01, "entropy_coef_min": 0.0, "entropy_coef_max": 1.0, **settings}
    return {"args": args, "attributes": {"coef": coef, "enabled": enabled}}


def test_a_checkpoint_that_does_not_match_the_objective_is_refused_in_one_sentence():
    spec = resolve_objective("dapo", entropy_target=100.0, entropy_coef_delta=0.01, entropy_coef_max=1.0)
    assert saved_entropy_control(_entry(), spec, "ck") == EntropyControl(0.02, True)
    assert saved_entropy_control(None, resolve_objective("dapo"), "ck") is None
    with pytest.raises(ValueError, match=r"checkpoint ck holds no adaptive entropy state \(AdaptiveEntropyCallback: None\)"):
        saved_entropy_control(None, spec, "ck")
    with pytest.raises(ValueError, match="holds no adaptive entropy state"):
        saved_entropy_control(_entry(coef="0.02"), spec, "ck")  # a string is not the float it was written as
    with pytest.raises(ValueError, match="holds no adaptive entropy state"):
        saved_entropy_control(_entry(coef=float("nan")), spec, "ck")
    with pytest.raises(ValueError, match="moved the adaptive entropy coefficient with .*'entropy_target': 0.3.*resume with the same"):
        saved_entropy_control(_entry(entropy_target=0.3), spec, "ck")
    with pytest.raises(ValueError, match="sets no entropy_target: resume with the objective that wrote it"):
        saved_entropy_control(_entry(), resolve_objective("dapo"), "ck")


def test_a_resume_from_a_checkpoint_without_the_state_is_refused_before_its_weights_load(tmp_path):
    """A checkpoint a fixed-coefficient run wrote has no state to continue: refused at train(), nothing trained."""
    from transformers import TrainerState

    checkpoint = tmp_path / "checkpoint-1"
    checkpoint.mkdir()
    TrainerState(global_step=1).save_to_json(str(checkpoint / "trainer_state.json"))
    trainer = _trainer(tmp_path / "out", objective=RISING, steps=STEPS)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    with pytest.raises(ValueError, match=f"checkpoint {checkpoint} holds no adaptive entropy state"):
        trainer.train(resume_from_checkpoint=str(checkpoint))
    assert all(torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())
    assert trainer.state.global_step == 0


def test_the_callback_state_is_plain_json():
    spec = resolve_objective("dapo", entropy_target=0.2)
    callback = AdaptiveEntropyCallback(spec, sum_over_processes=lambda t: t, log=lambda m: None)
    assert json.loads(json.dumps(callback.state())) == callback.state()
    assert callback.state()["attributes"] == {"coef": 0.0, "enabled": True}
