"""Tests that bite the head dtype (issue 57 item 11, mutation/realmodel.toml): the master weight's gradient is summed
over chunks in float32, the fused head's chunk size reads the matmul dtype, and the trainer's update takes
``optim.head_dtype`` from its config."""

from __future__ import annotations

import pytest
import torch
from tiny_run import FORMAT_REWARD_SETS, TINY_MODEL_SETS

from dfpo.core.fused import blocks
from dfpo.core.logprobs import token_logprobs
from dfpo.trainer.config import apply_overrides, config_from_dict
from dfpo.trainer.stages import update
from dfpo.trainer.train import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")

U = 2.0**-8
"""bf16's unit round-off."""


def test_the_weights_gradient_is_summed_over_chunks_in_float32_under_a_bf16_head():
    """256 positions in 64 chunks of 4, all of one target with positive hidden states: the target row's gradient is a
    sum of 64 positive bf16 products. Summed in float32 it lies within 2u of the float64 sum of those products
    (each rounds once); summed in bf16 each addition rounds again and the error grows with the chunks."""
    g = torch.Generator().manual_seed(0)
    N, H, V = 256, 8, 16
    hidden = (torch.rand(N, H, generator=g) + 0.5).requires_grad_()  # (N, H) positive
    weight = (0.1 * torch.randn(V, H, generator=g)).requires_grad_()  # (V, H) float32 master weight
    targets = torch.zeros(N, dtype=torch.long)  # (N,)
    logp, _ = token_logprobs(hidden, weight, targets, chunk_size=4, with_entropy=False, matmul_dtype=torch.bfloat16)
    logp.sum().backward()
    assert weight.grad.dtype == torch.float32
    with torch.no_grad():  # the same bf16 logits and (1 - p) per position, each chunk's product exact in float64
        z = (hidden.bfloat16() @ weight.bfloat16().T).float()  # (N, V)
        coef = (1 - torch.softmax(z, -1)[:, 0]).bfloat16().double()  # (N,) d logp / d z_target, in the matmul's dtype
        chunks = [(coef[s : s + 4, None] * hidden[s : s + 4].bfloat16().double()).sum(0) for s in range(0, N, 4)]  # (H,) each
        exact = torch.stack(chunks).sum(0)  # (H,)
    assert ((weight.grad[0].double() - exact).abs() <= 2 * U * exact.abs() + 1e-6).all()


def test_the_fused_heads_chunk_size_reads_the_matmul_dtype_not_the_weights():
    """Off the CPU (a meta tensor stands in), a float32 weight whose matmuls run in bf16 is half precision; a bf16
    weight whose matmuls run in float32 is not."""
    float32_weight = torch.empty(4, 2, device="meta")
    bf16_weight = torch.empty(4, 2, dtype=torch.bfloat16, device="meta")
    assert blocks._half_precision_off_cpu(float32_weight, torch.bfloat16)
    assert not blocks._half_precision_off_cpu(bf16_weight, torch.float32)
    assert not blocks._half_precision_off_cpu(float32_weight, None)


TINY = [
    *TINY_MODEL_SETS,
    "data.train_size=8",
    "data.eval_size=2",
    "rollout.prompts_per_step=2",
    "rollout.group_size=2",
    "rollout.max_new_tokens=2",
    *FORMAT_REWARD_SETS,
    "train.steps=1",
    "train.save_every=0",
    "threads=1",
    "eval.every=0",
    "log.tensorboard=false",
    "log.progress=false",
    "model.amp=bf16",
]


@pytest.mark.parametrize("head_dtype", ["autocast", "float32"])
def test_the_trainers_update_runs_its_head_in_the_configured_dtype(tmp_path, monkeypatch, head_dtype):
    """A tiny run under bf16 autocast on the CPU: every micro-batch of its update is scored with optim.head_dtype."""
    seen = []
    real = update.accumulate_gradients

    def spy(*args, **kwargs):
        seen.append(kwargs.get("head_dtype"))
        return real(*args, **kwargs)

    monkeypatch.setattr(update, "accumulate_gradients", spy)
    sets = [*TINY, f"optim.head_dtype={head_dtype}", f'run_dir="{tmp_path / "run"}"']
    trainer = Trainer(config_from_dict(apply_overrides({}, sets)), quiet=True)
    trainer.run()
    assert seen and set(seen) == {head_dtype}
    assert trainer.old_logp_stage.head_dtype == head_dtype
