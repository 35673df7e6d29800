"""log.param_drift: the trainer's drift stage logs declared drift/* keys, leaves the run exactly as it would have been,
sums the probed steps into summary.json, costs nothing when off, and is refused on several processes."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from test_llm_e2e import tiny_config

from dfpo.core.metric_registry import lookup
from dfpo.trainer.probe.stage import DriftStage, check_drift_settings, drift_summary
from dfpo.trainer.run.layout import RunDir
from dfpo.trainer.train import Trainer


def _rows(run: str) -> list[dict]:
    return [json.loads(line) for line in (RunDir(run).metrics).read_text().splitlines()]


def test_param_drift_logs_declared_keys_and_leaves_the_run_as_it_was(tmp_path):
    off = tiny_config(tmp_path / "off")
    on = tiny_config(tmp_path / "on", "log.param_drift=true", "log.param_drift_every=1")
    t_off = Trainer(off, quiet=True)  # built and run one after the other: sampling reads the global RNG
    s_off = t_off.run()
    t_on = Trainer(on, quiet=True)
    s_on = t_on.run()
    assert t_off.drift_stage is None and t_on.drift_stage is not None
    for (n, a), (_, b) in zip(t_off.model.named_parameters(), t_on.model.named_parameters()):
        assert torch.equal(a, b), n  # the trial step was put back: the run trained exactly as without it
    rows_off, rows_on = _rows(off.run_dir), _rows(on.run_dir)
    for r_off, r_on in zip(rows_off, rows_on, strict=True):
        assert not any(k.startswith("drift/") for k in r_off)
        assert "drift/shared_events" in r_on and "drift/equiv_pairs" in r_on
        for key, value in r_on.items():
            if key.startswith("drift/"):
                assert lookup(key).where == "trainer" and math.isfinite(value)
            elif not key.startswith("time/"):
                assert r_off[key] == value, key
    assert s_on["drift/probed_steps"] == 2 and "drift/probed_steps" not in s_off


def _stage_inputs():
    """A rollout of two groups whose completions share their first two tokens; rows 0, 1 and 4, 5 correct with
    different tokens (equivalent pairs); pi_old a little off the model, as after a real optimiser step."""
    from dfpo.core.loss import group_advantages
    from dfpo.trainer.config import ModelConfig
    from dfpo.trainer.policy import build_char_tokenizer, build_tiny_model
    from dfpo.trainer.rewards.compute import RewardBatch
    from dfpo.trainer.sampler import build_batch
    from dfpo.trainer.stages.old_logp import FirstPass, OldLogProbs
    from dfpo.trainer.stages.rollout import Rollout

    tok = build_char_tokenizer()
    model = build_tiny_model(ModelConfig(tiny_hidden=32, tiny_layers=1, tiny_heads=2, tiny_intermediate=64), tok, seed=0).double()
    prompts = [tok(p, add_special_tokens=False).input_ids for p in ("1+2=", "3+4=")]
    completions = [[5, 6, 7], [5, 6, 8], [5, 6, 9, 10], [5, 6, 11], [12, 13, 7], [12, 13, 8], [12, 13, 9], [12, 13, 14, 15]]
    batch = build_batch(prompts, completions, 4, pad_id=tok.pad_token_id, eos_ids={0}, max_new_tokens=4)
    correct = [1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    rewards = RewardBatch(correct, correct, [0.0] * 8)
    from dfpo.trainer.forward import completion_logprobs

    with torch.no_grad():
        logp = completion_logprobs(model, batch, "cpu").logp
    old_logp = torch.where(batch.mask, logp + 0.01 * torch.randn(logp.shape, generator=torch.Generator().manual_seed(0)), 0.0)
    first = FirstPass(old_logp.float(), torch.zeros_like(old_logp), torch.ones(8, dtype=torch.bool))
    rollout = Rollout([None, None], batch, [""] * 8, rewards, old_logp.float(), torch.zeros_like(old_logp))
    adv = group_advantages(torch.tensor(correct, dtype=torch.float64), batch.group_ids)
    return model, rollout, OldLogProbs(first, None, True), adv


def test_drift_stage_probes_shared_events_and_equivalent_pairs():
    from dfpo.core.loss import resolve_objective

    model, rollout, old, adv = _stage_inputs()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    log_cfg = SimpleNamespace(param_drift_every=5, param_drift_events=16)
    stage = DriftStage(model, resolve_objective("gspo_noclip"), optimizer, log_cfg=log_cfg, max_grad_norm=1.0, device="cpu", amp=None)
    plan = [[torch.arange(8)]]
    before = [p.detach().clone() for p in model.parameters()]
    assert stage.run(2, rollout, plan, old, adv) == {}  # not due: nothing runs
    m = stage.run(1, rollout, plan, old, adv)
    assert m["drift/shared_events"] == 4 and m["drift/equiv_pairs"] == 3  # 2 shared positions x 2 groups; pairs 0-1, 4-5, 5-7
    for kind in ("shared", "equiv_logodds"):
        for part in ("coef", "direct", "cross", "measured", "error", "cross_share", "step"):
            assert math.isfinite(m[f"drift/{kind}_{part}"]), (kind, part)
        for part in ("momentum", "decay", "predicted", "error_ratio", "direct_share", "momentum_share", "decay_share", "batch_cross_share"):
            assert math.isfinite(m[f"drift/{kind}_{part}"]), (kind, part)  # issue 45: every part of the split is logged
        shares = sum(m[f"drift/{kind}_{part}_share"] for part in ("direct", "cross", "momentum", "decay"))
        assert math.isclose(shares, 1.0, rel_tol=1e-9)  # shares of the first-order prediction
        assert m[f"drift/{kind}_momentum"] <= 1e-6 * m[f"drift/{kind}_predicted"]  # the optimiser had no state: no momentum part
    assert m["drift/shared_step"] > 0  # pi_old is off the model: the events moved since
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before)) and not optimizer.state


def test_drift_summary_sums_the_probed_steps():
    rows = [
        {"step": 1, "drift/shared_events": 2.0, "drift/shared_step": 0.5, "drift/shared_measured": 0.25},
        {"step": 2},
        {"step": 3, "drift/shared_events": 0.0, "drift/equiv_pairs": 0.0},
        {"step": 4, "drift/shared_events": 1.0, "drift/shared_step": 1.0, "drift/equiv_logodds_step": 2.0},
    ]
    assert drift_summary(rows) == {
        "drift/probed_steps": 3.0,
        "drift/cumulative_shared_step": 1.5,
        "drift/cumulative_shared_measured": 0.25,
        "drift/cumulative_equiv_logodds_step": 2.0,
    }
    assert drift_summary([{"step": 1}]) == {}


def test_param_drift_is_refused_on_several_processes(tmp_path):
    cfg = tiny_config(tmp_path, "log.param_drift=true")
    check_drift_settings(cfg, 1)
    with pytest.raises(ValueError, match="log.param_drift = true needs one process"):
        check_drift_settings(cfg, 2)
    check_drift_settings(tiny_config(tmp_path), 4)  # off: nothing to refuse
