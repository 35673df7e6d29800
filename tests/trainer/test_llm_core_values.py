"""The trainer's log-prob path and update order, checked by value: completion log-probs against a
plain forward, old log-probs taken before any update, a checkpoint write cut off half-way."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

import dfpo.trainer.stages.update as update_mod
import dfpo.trainer.train as train_mod
from dfpo.core.files import WriteFailed
from dfpo.trainer.config import ModelConfig
from dfpo.trainer.policy import build_char_tokenizer, build_tiny_model
from dfpo.trainer.run.checkpoint import load_checkpoint, save_checkpoint
from dfpo.trainer.run.layout import RunDir
from dfpo.trainer.sampler import build_batch, completion_logits, token_logp

sys.path.insert(0, str(Path(__file__).parent))
from test_llm_e2e import tiny_config  # noqa: E402


def test_completion_log_probs_equal_a_plain_forward_of_each_unpadded_sequence():
    """Prompts of different lengths are left-padded in the batch; each completion token's log-prob must
    equal log_softmax of the model run on that prompt + completion alone, at the right position."""
    torch.manual_seed(0)
    tok = build_char_tokenizer()
    model = build_tiny_model(ModelConfig(tiny_hidden=32, tiny_layers=2, tiny_heads=2, tiny_intermediate=64), tok, seed=0).eval()
    prompts = [tok("7+8=", add_special_tokens=False).input_ids, tok("1+1=", add_special_tokens=False).input_ids[:2]]  # lengths 4 and 2
    completions = [
        tok("15", add_special_tokens=False).input_ids,
        tok("2", add_special_tokens=False).input_ids,
        tok("3", add_special_tokens=False).input_ids,
        tok("11", add_special_tokens=False).input_ids,
    ]
    batch = build_batch(prompts, completions, 2, pad_id=tok.pad_token_id, eos_ids=set(), max_new_tokens=4)
    with torch.no_grad():
        got = token_logp(completion_logits(model, batch, "cpu"), batch.completion_ids)  # (B, T)
        for i, c in enumerate(completions):
            ids = torch.tensor([prompts[i // 2] + c])
            ref = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)  # (L, V)
            P = len(prompts[i // 2])
            expected = torch.stack([ref[P - 1 + t, tok_id] for t, tok_id in enumerate(c)])
            torch.testing.assert_close(got[i, : len(c)], expected, rtol=1e-5, atol=1e-5)


def test_old_log_probs_come_from_before_any_update_of_the_rollout_batch(tmp_path, monkeypatch):
    """K = 4 optimiser steps on one rollout batch: the first sees logp == old_logp exactly (ratio 1),
    later ones see the ratios the earlier updates produced (old log-probs were not recomputed). Read on the unfused
    path, where the update hands policy_loss the log-probs themselves; test_llm_fused_update shows the fused default
    takes the same optimiser steps."""
    gaps = []
    real = update_mod.policy_loss

    def spy(objective, *, logp, old_logp, mask, **kw):
        gaps.append(float(torch.where(mask, (logp - old_logp).abs(), 0.0).max()))
        return real(objective, logp=logp, old_logp=old_logp, mask=mask, **kw)

    monkeypatch.setattr(update_mod, "policy_loss", spy)
    for source, first_gap in (("recompute", 0.0), ("sampler", 1e-5)):
        gaps.clear()
        cfg = tiny_config(
            tmp_path / source, "train.steps=1", "optim.epochs=2", "optim.minibatch_groups=1", "rollout.prompts_per_step=2", "eval.every=0",
            f"rollout.old_logp={source}", "optim.fused_head=off",
        )  # fmt: skip
        train_mod.Trainer(cfg, quiet=True).run()
        assert len(gaps) == 4
        # first update: the policy has not moved yet (the sampler's KV-cache forward differs by float round-off only)
        assert gaps[0] <= first_gap, (source, gaps)
        assert max(gaps[1:]) > 1e-4  # later updates see ratios moved away from 1 (a group with equal rewards moves nothing)


def test_a_checkpoint_write_cut_off_half_way_leaves_the_previous_one_loadable(tmp_path, monkeypatch):
    save_checkpoint(tmp_path, {"step": 1, "model": {"w": torch.ones(3)}})
    real_save = torch.save

    def dies_half_way(obj, fh):
        fh.write(b"PK\x03\x04 partial")
        raise OSError("no space left on device")

    monkeypatch.setattr(torch, "save", dies_half_way)
    with pytest.raises(WriteFailed, match="no space left"):
        save_checkpoint(tmp_path, {"step": 2, "model": {"w": torch.zeros(3)}})
    monkeypatch.setattr(torch, "save", real_save)
    state = load_checkpoint(tmp_path)
    assert state["step"] == 1 and torch.equal(state["model"]["w"], torch.ones(3))
    assert json.loads((tmp_path / RunDir.CHECKPOINT_META).read_text())["step"] == 1
