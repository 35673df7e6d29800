"""The update's fused LM head (``optim.fused_head``, default ``eager``) gives what log-probs first, then ``policy_loss``
(``off``) give: the same gradients, metrics, first-pass records and diagnostics, on a tiny model, for objectives of
every coupling unit."""

import pytest
import torch

from dfpo import resolve_objective
from dfpo.core.metrics import frequency_buckets
from dfpo.trainer import forward
from dfpo.trainer.config import ModelConfig, apply_overrides, config_from_dict
from dfpo.trainer.diagnostics import StepDiagnostics
from dfpo.trainer.minibatches import accumulation_weights, micro_batch
from dfpo.trainer.policy import build_char_tokenizer, build_tiny_model
from dfpo.trainer.sampler import build_batch
from dfpo.trainer.stages.old_logp import FirstPass
from dfpo.trainer.stages.update import accumulate_gradients

pytestmark = pytest.mark.usefixtures("one_thread")

OBJECTIVES = {
    "grpo": {},  # token units
    "gspo": {},  # rows
    "dfpo_min": {},  # groups
    "stapo": {"stapo_tau_p": 0.5},  # the batch
    "dapo": {"entropy_coef": 0.01},  # an entropy gradient
}


def _setup(seed: int = 0):
    tok = build_char_tokenizer()
    model = build_tiny_model(ModelConfig(tiny_hidden=32, tiny_layers=1, tiny_heads=2, tiny_intermediate=64), tok, seed=seed)
    rng = torch.Generator().manual_seed(seed)
    prompts = [tok(f"{i * 37}+{i}=", add_special_tokens=False).input_ids for i in range(3)]
    completions = [torch.randint(3, 13, (int(torch.randint(1, 7, (1,), generator=rng)),), generator=rng).tolist() for _ in range(12)]
    batch = build_batch(prompts, completions, 4, pad_id=tok.pad_token_id, eos_ids={tok.eos_token_id}, max_new_tokens=7)
    return model, batch


def _step(model, batch, spec, fused_head: str, *, first_step: bool):
    """Gradients, metrics, the first pass's record and the diagnostics of one optimiser step in two micro-batches."""
    B, T = batch.mask.shape
    old = None if first_step else -2.0 + 0.3 * torch.randn(B, T, generator=torch.Generator().manual_seed(1))
    adv = torch.randn(B, generator=torch.Generator().manual_seed(2))
    parts = [torch.arange(0, 8), torch.arange(8, 12)]
    weights = accumulation_weights([batch.mask[r] for r in parts], spec.aggregation)
    micros = [micro_batch(batch, r, old, None, adv, w) for r, w in zip(parts, weights)]
    first, diag = FirstPass.empty(batch.mask), StepDiagnostics()
    buckets = frequency_buckets(batch.completion_ids, batch.mask, [0.5, 0.8], 64)
    model.zero_grad(set_to_none=True)
    metrics, finite = accumulate_gradients(
        model, micros, spec, torch.device("cpu"), first_pass=first, diagnostics=diag, buckets=buckets, fused_head=fused_head
    )
    assert finite
    return [p.grad.clone() for p in model.parameters()], metrics, first, diag


@pytest.mark.parametrize("first_step", [False, True], ids=["old log-probs given", "first step"])
@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_the_fused_update_equals_log_probs_then_policy_loss(name, first_step):
    torch.manual_seed(0)
    model, batch = _setup()
    spec = resolve_objective(name, **OBJECTIVES[name])
    grads, metrics, first, diag = _step(model, batch, spec, "eager", first_step=first_step)
    grads_off, metrics_off, first_off, diag_off = _step(model, batch, spec, "off", first_step=first_step)
    for a, b in zip(grads, grads_off):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert metrics.pop("fused/two_pass") == 0.0 and metrics.pop("fused/row_scaled") == 0.0  # completions within a block
    assert set(metrics) == set(metrics_off)
    for key in metrics_off:
        assert metrics[key] == pytest.approx(metrics_off[key], rel=1e-5, abs=1e-6), key
    if first_step:
        torch.testing.assert_close(first.logp, first_off.logp, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(first.entropy, first_off.entropy, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(diag.energy, diag_off.energy, rtol=1e-5, atol=1e-7)
    assert diag.shared_num == pytest.approx(diag_off.shared_num, rel=1e-5, abs=1e-9)
    assert diag.shared_den == pytest.approx(diag_off.shared_den, rel=1e-5, abs=1e-9)


def test_a_head_that_is_not_plain_takes_the_log_probs_path(monkeypatch):
    """A model whose logits are not hidden @ W.T (plain_lm_head None) is scored through full logits, fused or not."""
    torch.manual_seed(0)
    model, batch = _setup()
    spec = resolve_objective("gspo")
    expected, *_ = _step(model, batch, spec, "off", first_step=False)
    monkeypatch.setattr(forward, "plain_lm_head", lambda model: None)
    got, metrics, *_ = _step(model, batch, spec, "eager", first_step=False)
    assert "fused/two_pass" not in metrics and "fused/row_scaled" not in metrics
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_the_setting_takes_eager_compile_or_off():
    assert config_from_dict({}).optim.fused_head == "eager"
    assert config_from_dict(apply_overrides({}, ["optim.fused_head=off"])).optim.fused_head == "off"
    with pytest.raises(ValueError, match="optim.fused_head"):
        config_from_dict(apply_overrides({}, ["optim.fused_head=fast"]))
