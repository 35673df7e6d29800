"""dfpo's objectives as verl policy losses: the adapter (no verl needed) and, in verl's own environment, the
losses found through verl's registry and verl's own losses against dfpo's (scripts/verl_check.py)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest
import torch

from dfpo import policy_loss
from dfpo.core.loss import OBJECTIVES, resolve_objective
from dfpo.integrations.verl import check_groups_stay_whole, loss_mode_name, make_verl_policy_loss, register_dfpo_losses

ROOT = Path(__file__).resolve().parents[2]


def _rows(B=8, T=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.arange(T)[None, :] < torch.randint(1, T + 1, (B,), generator=g)[:, None]).float()
    logp = (-0.5 - torch.rand(B, T, generator=g, dtype=torch.float64)).requires_grad_()
    old = logp.detach() + 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    return logp, old, adv, mask


@pytest.mark.parametrize("preset", ["dfpo_min", "gspo", "grpo", "gmpo", "topr", "kimi15", "dro", "vapo_nll"])
def test_the_adapter_is_policy_loss_with_consecutive_groups(preset):
    """verl's signature in, dfpo.policy_loss out, with rollout.n consecutive rows forming a group."""
    logp, old, adv, mask = _rows()
    fn = make_verl_policy_loss(OBJECTIVES[preset], group_size=4)
    with pytest.warns(UserWarning, match="loss_agg_mode='token-mean' is ignored"):
        got, metrics = fn(old, logp, adv[:, None] * mask, mask, "token-mean", None)
    expected, _ = policy_loss(
        preset, logp=logp, old_logp=old, advantages=adv, mask=mask.bool(), group_ids=torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    )
    assert float(got) == pytest.approx(float(expected), rel=1e-12)
    assert "actor/dfpo/weights/asym" in metrics
    assert loss_mode_name(preset) == (preset if preset.startswith("dfpo") else f"dfpo_{preset}")


def test_verls_per_token_advantages_reach_a_token_level_objective_as_they_are():
    """verl's optimal_token_baseline hands (B, T) advantages that vary along a completion: a token-level objective reads
    each token's own; a sequence-level one refuses them in one sentence instead of reading their mean."""
    logp, old, _, mask = _rows()
    adv = torch.randn(mask.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * mask  # (B, T)
    ids = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    fn = make_verl_policy_loss(resolve_objective("dapo", adv_scale="otb"), group_size=4)
    with pytest.warns(UserWarning, match="is ignored"):
        got, _ = fn(old, logp, adv, mask, "token-mean", None)
    expected, _ = policy_loss("dapo", logp=logp, old_logp=old, advantages=adv, mask=mask.bool(), group_ids=ids, adv_scale="otb")
    assert float(got) == float(expected)
    gspo = make_verl_policy_loss(OBJECTIVES["gspo"], group_size=4)
    with (
        pytest.warns(UserWarning),
        pytest.raises(ValueError, match=r"verl handed advantages that vary along a completion .*'gspo' needs one per completion"),
    ):
        gspo(old, logp, adv, mask, "token-mean", None)


def test_a_partial_group_and_group_splitting_settings_are_refused():
    logp, old, adv, mask = _rows(B=6)
    with pytest.raises(ValueError, match="6 rows holds part of a group"):
        make_verl_policy_loss(OBJECTIVES["dfpo_min"], 4)(old, logp, adv[:, None] * mask, mask, None)
    check_groups_stay_whole({"ppo_micro_batch_size_per_gpu": 8}, rollout_n=4, trainer={"balance_batch": False})
    for actor, trainer, match in (
        ({"ppo_micro_batch_size_per_gpu": 6}, None, "ppo_micro_batch_size_per_gpu=6 rows is not a multiple of rollout.n=4"),
        ({"use_dynamic_bsz": True}, None, "use_dynamic_bsz"),
        ({"shuffle": True}, None, "shuffle"),
        ({}, {"balance_batch": True}, "balance_batch"),
    ):
        with pytest.raises(ValueError, match=match):
            check_groups_stay_whole(actor, 4, trainer=trainer)


def test_the_group_size_comes_from_verls_actor_config_when_not_given():
    """Registered without a group size (as verl's plugin entry point does), each call reads rollout_n from the
    actor config verl passes: rollout_n = 4 gives groups of 4 rows, rollout_n = 2 groups of 2."""
    from types import SimpleNamespace

    logp, old, adv, mask = _rows()
    fn = make_verl_policy_loss(OBJECTIVES["dfpo_min"])
    for n in (4, 2):
        got, _ = fn(old, logp, adv[:, None] * mask, mask, None, SimpleNamespace(rollout_n=n))
        expected, _ = policy_loss("dfpo_min", logp=logp, old_logp=old, advantages=adv, mask=mask.bool(), group_ids=torch.arange(8) // n)
        assert float(got) == pytest.approx(float(expected), rel=1e-12)
    for config in (None, SimpleNamespace(rollout_n=0)):
        with pytest.raises(ValueError, match="rollout_n"):
            fn(old, logp, adv[:, None] * mask, mask, None, config)


def test_verl_loads_dfpo_as_a_plugin_entry_point():
    """pyproject declares dfpo.integrations.verl_plugin in verl's "verl.plugins" group (what verl imports itself)."""
    import tomllib

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["entry-points"]["verl.plugins"] == {"dfpo": "dfpo.integrations.verl_plugin"}


@pytest.mark.skipif(importlib.util.find_spec("verl") is not None, reason="verl is installed here")
def test_registering_without_verl_says_how_to_get_it():
    with pytest.raises(ImportError, match="needs verl in this environment"):
        register_dfpo_losses(4)


@pytest.mark.slow
def test_verls_registry_and_verls_own_losses_in_its_environment():
    """In verl's environment: `import verl` registers every dfpo preset (in a Ray worker too), each found through
    get_policy_loss_fn equals dfpo.policy_loss; verl's own losses equal dfpo's (loss and gradient, 1e-6); and
    examples/verl_dfpo_grpo.sh composes with verl's config and keeps groups whole."""
    python = os.environ.get("DFPO_VERL_PYTHON") or str(ROOT / ".venv-verl" / "bin" / "python")
    if not Path(python).exists():
        pytest.skip("no verl environment: build it with scripts/verl_env.sh (or set DFPO_VERL_PYTHON)")
    out = subprocess.run(
        [str(Path(python).absolute()), str(ROOT / "scripts" / "verl_check.py")], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0 and "verl check: ok" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]


def test_an_objective_reading_the_samplers_log_probs_is_refused_and_bypass_works():
    """verl passes a policy loss no sampler log-probs: an objective's own correction or rejection is refused at
    registration; in bypass mode (verl's: old_log_prob is the sampler's) it needs none and reaches the loss."""
    from dfpo import resolve_objective

    with pytest.raises(ValueError, match="rollout_rejection='token_k3'.*verl's algorithm.rollout_correction"):
        make_verl_policy_loss(resolve_objective("grpo", rollout_rejection="token_k3"), group_size=4)
    spec = resolve_objective("grpo", rollout_correction="sequence_truncate", rollout_bypass=True)
    logp, old, adv, mask = _rows(seed=2)
    got, metrics = make_verl_policy_loss(spec, group_size=4)(old, logp, adv[:, None] * mask, mask, None, None)
    expected, _ = policy_loss(spec, logp=logp, old_logp=old, advantages=adv, mask=mask.bool(), group_ids=torch.arange(8) // 4)
    assert float(got) == pytest.approx(float(expected), rel=1e-12) and "actor/dfpo/rollout/weight_mean" in metrics


def test_an_objective_reading_the_reference_is_refused_and_left_out_of_the_default_registration():
    """verl passes a policy loss no reference log-probs: online IPO is refused in one sentence, and the default
    registration (every preset) leaves it out rather than failing."""
    with pytest.raises(ValueError, match=r"objective 'online_ipo' reads the reference policy's log-probs \(ipo_beta=0.1"):
        make_verl_policy_loss(OBJECTIVES["online_ipo"], group_size=4)


def test_the_objectives_advantage_estimator_must_be_verls():
    """issue 30: verl computes the advantages a policy loss receives. GDPO, which verl lacks, is refused at registration;
    an objective with one of verl's estimators (ReMax here) needs algorithm.adv_estimator to name it."""
    from dfpo.integrations.verl import check_advantage_estimator

    with pytest.raises(
        ValueError, match=r"adv_scale='gdpo', which verl does not compute .*multi_objective_aggregation='normalize_then_sum'"
    ):
        make_verl_policy_loss(resolve_objective("grpo", adv_scale="gdpo"), group_size=4)
    otb = resolve_objective("grpo", adv_scale="otb")
    make_verl_policy_loss(otb, group_size=4)  # accepted: verl's optimal_token_baseline gives its (B, T) advantages
    check_advantage_estimator(otb, {"adv_estimator": "optimal_token_baseline"})
    remax = resolve_objective("grpo", adv_scale="remax")
    make_verl_policy_loss(remax, group_size=4)  # accepted: verl's remax estimator gives these advantages
    check_advantage_estimator(remax, {"adv_estimator": "remax"})
    with pytest.raises(ValueError, match=r"adv_scale='remax': set algorithm.adv_estimator='remax' \(got 'grpo'\)"):
        check_advantage_estimator(remax, {"adv_estimator": "grpo"})
    check_advantage_estimator(resolve_objective("grpo"), {"adv_estimator": "grpo"})  # dfpo's own estimators are not checked
