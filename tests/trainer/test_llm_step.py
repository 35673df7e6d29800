"""The training step's throughput changes, each checked against the plain computation it replaces:
chunked log-probs from hidden states == full logits; trimmed micro-batches == padded ones; token-budget
micro-batches keep groups whole and accumulate to the whole mini-batch gradient; the first optimiser
step's own log-probs == a separate old-log-prob forward."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dfpo import resolve_objective
from dfpo.trainer.config import ModelConfig
from dfpo.trainer.forward import completion_logprobs, plain_lm_head
from dfpo.trainer.minibatches import MicroBatch, accumulation_weights, micro_batch, split_groups_by_tokens
from dfpo.trainer.policy import build_char_tokenizer, build_tiny_model
from dfpo.trainer.run.layout import RunDir
from dfpo.trainer.sampler import build_batch, completion_logits, token_logp
from dfpo.trainer.stages.old_logp import FirstPass, batch_logp
from dfpo.trainer.stages.update import accumulate_gradients

pytestmark = pytest.mark.usefixtures("one_thread")


def _tiny(seed=0):
    tok = build_char_tokenizer()
    model = build_tiny_model(ModelConfig(tiny_hidden=32, tiny_layers=1, tiny_heads=2, tiny_intermediate=64), tok, seed=seed)
    return model, tok


def _batch(tok, n_groups=3, g=4, seed=0, max_len=7):
    """Prompts of different lengths (left padding) and completions of different lengths (right padding)."""
    rng = torch.Generator().manual_seed(seed)
    prompts = [tok(f"{i * 37}+{i}=", add_special_tokens=False).input_ids for i in range(n_groups)]
    completions = [
        torch.randint(3, 13, (int(torch.randint(1, max_len, (1,), generator=rng)),), generator=rng).tolist() for _ in range(n_groups * g)
    ]
    return build_batch(prompts, completions, g, pad_id=tok.pad_token_id, eos_ids={tok.eos_token_id}, max_new_tokens=max_len)


def _naive_logp(model, batch):
    return torch.where(batch.mask, token_logp(completion_logits(model, batch, "cpu"), batch.completion_ids), 0.0)  # (B, T)


def test_chunked_logprobs_equal_full_logits_in_value_and_gradient():
    """Hidden states -> chunked LM head (prompt and padded positions never scored) == full (B, T, V) logits."""
    torch.manual_seed(0)
    model, tok = _tiny()
    batch = _batch(tok)
    assert plain_lm_head(model) is not None
    w = torch.randn(batch.mask.shape)
    scores = completion_logprobs(model, batch, "cpu", with_entropy=True, chunk_size=5)
    (scores.logp * w).sum().backward()
    chunked = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    naive = _naive_logp(model, batch)
    (naive * w).sum().backward()
    torch.testing.assert_close(scores.logp, naive.detach(), rtol=1e-5, atol=1e-6)
    for n, p in model.named_parameters():
        torch.testing.assert_close(chunked[n], p.grad, rtol=1e-4, atol=1e-6)
    logits = completion_logits(model, batch, "cpu").detach().float()
    p_all = torch.softmax(logits, -1)
    entropy = torch.where(batch.mask, -(p_all * p_all.clamp(min=1e-30).log()).sum(-1), 0.0)
    torch.testing.assert_close(scores.entropy.detach(), entropy, rtol=1e-4, atol=1e-5)


def test_a_head_that_is_not_plain_falls_back_to_full_logits():
    """A logit soft-cap (or a biased head) is not hidden @ W.T: such a model takes the full-logits path, with the same values."""
    model, tok = _tiny()
    batch = _batch(tok)
    model.config.final_logit_softcapping = 30.0
    assert plain_lm_head(model) is None
    torch.testing.assert_close(completion_logprobs(model, batch, "cpu").logp.detach(), _naive_logp(model, batch).detach())


def test_trimming_padding_leaves_every_log_prob_unchanged():
    """A micro-batch cut to its longest prompt and completion scores every real token as the padded batch does."""
    torch.manual_seed(0)
    model, tok = _tiny()
    batch = _batch(tok, n_groups=4, g=2)
    rows = torch.tensor([1, 2, 5])
    part, width = batch.rows(rows).trimmed()
    assert width < batch.mask.shape[1] or part.input_ids.shape[1] < batch.input_ids.shape[1]
    with torch.no_grad():
        full = _naive_logp(model, batch)[rows]
        trimmed = _naive_logp(model, part)
    torch.testing.assert_close(trimmed, full[:, :width])
    assert not full[:, width:].any()


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 6), min_size=1, max_size=6), budget=st.integers(1, 80), seed=st.integers(0, 100))
def test_token_budget_micro_batches_keep_groups_whole_and_fit_the_budget(sizes, budget, seed):
    """Every group lands whole in one micro-batch; a micro-batch of several groups fits rows x longest row <= budget."""
    g = 3
    group_ids = torch.arange(len(sizes)).repeat_interleave(g)
    tokens = torch.tensor([s for s in sizes for _ in range(g)]) + torch.randint(
        0, 3, (len(sizes) * g,), generator=torch.Generator().manual_seed(seed)
    )
    rows = torch.randperm(len(group_ids), generator=torch.Generator().manual_seed(seed))
    micros = split_groups_by_tokens(rows, group_ids, tokens, budget)
    assert sorted(torch.cat(micros).tolist()) == sorted(rows.tolist())
    for m in micros:
        for gid in group_ids[m].unique():
            assert int((group_ids[m] == gid).sum()) == g
        if len(group_ids[m].unique()) > 1:
            assert len(m) * int(tokens[m].max()) <= budget


@pytest.mark.parametrize("objective", ["grpo", "dapo", "gspo", "dfpo_min"])
def test_trimmed_token_budget_micro_batches_accumulate_to_the_whole_batch_gradient(objective):
    torch.manual_seed(0)
    model, tok = _tiny()
    batch = _batch(tok, n_groups=4, g=3)
    B, T = batch.mask.shape
    old = -2.0 + 0.3 * torch.randn(B, T)
    adv = torch.randn(B)
    spec = resolve_objective(objective, eps_low=0.05, eps_high=0.05)
    rows = torch.arange(B)

    def grads(micro_rows):
        model.zero_grad(set_to_none=True)
        weights = accumulation_weights([batch.mask[r] for r in micro_rows], spec.aggregation)
        micros = [micro_batch(batch, r, old, None, adv, w) for r, w in zip(micro_rows, weights)]
        assert accumulate_gradients(model, micros, spec, torch.device("cpu"))[1]
        return [p.grad.clone() for p in model.parameters()]

    whole = grads([rows])
    split = split_groups_by_tokens(rows, batch.group_ids, batch.attention_mask.sum(-1), budget=40)
    assert len(split) > 1
    for a, b in zip(whole, grads(split)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("objective", ["grpo", "gspo", "dfpo_min", "stapo"])
def test_first_step_takes_its_own_log_probs_as_old_and_records_them(objective):
    """On the first optimiser step the policy has not moved: old = this forward's log-probs (detached)
    gives the gradient a separate no-grad old-log-prob forward gives, and records the same values."""
    torch.manual_seed(0)
    model, tok = _tiny()
    batch = _batch(tok, n_groups=2, g=4)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, 1.0, -1.0, -1.0])
    spec = resolve_objective(objective, stapo_tau_p=0.5)
    rows = torch.arange(8)
    old, entropy = batch_logp(model, batch, "cpu", 8)

    model.zero_grad(set_to_none=True)
    accumulate_gradients(model, [micro_batch(batch, rows, old, None, adv, 1.0)], spec, torch.device("cpu"))
    separate = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    first = FirstPass.empty(batch.mask)
    accumulate_gradients(model, [micro_batch(batch, rows, None, None, adv, 1.0)], spec, torch.device("cpu"), first_pass=first)
    for a, b in zip(separate, [p.grad for p in model.parameters()]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert bool(first.done.all())
    torch.testing.assert_close(first.logp, old, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(first.entropy, entropy, rtol=1e-5, atol=1e-6)


def test_a_training_step_recomputes_old_log_probs_only_for_rows_after_the_first_step(tmp_path, monkeypatch):
    """rollout.old_logp = 'recompute': with K = 1 (one mini-batch, one epoch) no separate old-log-prob pass
    runs, with K = 2 it runs for the second mini-batch's rows only; 'sampler' (what 'auto' picks for float32
    sampling at temperature 1) never runs it."""
    from test_llm_e2e import tiny_config

    from dfpo.trainer import train as train_mod
    from dfpo.trainer.stages import old_logp as stage_old_logp

    calls = []
    real = stage_old_logp.batch_logp

    def counting(model, batch, *args, **kwargs):
        calls.append(batch.mask.shape[0])
        return real(model, batch, *args, **kwargs)

    monkeypatch.setattr(stage_old_logp, "batch_logp", counting)
    for source, minibatch_groups, expected in (("recompute", 4, []), ("recompute", 2, [2 * 4]), ("auto", 2, [])):  # 4 prompts x G = 4
        calls.clear()
        cfg = tiny_config(
            tmp_path / f"{source}{minibatch_groups}",
            "train.steps=1",
            "eval.every=0",
            "rollout.prompts_per_step=4",
            "rollout.group_size=4",
            f"optim.minibatch_groups={minibatch_groups}",
            f"rollout.old_logp={source}",
        )
        trainer = train_mod.Trainer(cfg, quiet=True)
        assert trainer.old_logp_from_sampler() == (source == "auto")
        trainer.run()
        assert calls == expected, (source, minibatch_groups, calls)


def test_micro_batch_without_old_log_probs_is_the_first_step_only():
    """A MicroBatch with old_logp None means 'this forward's own log-probs'; later steps always carry them."""
    mb = MicroBatch(batch=None, old_logp=None, ref_logp=None, advantages=torch.zeros(1), weight=1.0)
    assert mb.old_logp is None and mb.rows is None


def test_dynamic_sampling_keeps_only_groups_with_reward_variance(tmp_path, monkeypatch):
    """DAPO's dynamic sampling: no trained group has all-equal rewards, the batch is filled to prompts_per_step
    groups when extra draws allow it, and the dropped groups and extra draws are logged."""
    import json

    from test_llm_e2e import tiny_config

    from dfpo.trainer import train as train_mod
    from dfpo.trainer.stages import advantages as stage_advantages

    seen = []  # per step: the reward range of every group it trains on
    real = stage_advantages.group_advantages

    def spy(rewards, group_ids, **kw):
        seen.append([float(rewards[group_ids == g].max() - rewards[group_ids == g].min()) for g in group_ids.unique()])
        return real(rewards, group_ids, **kw)

    monkeypatch.setattr(stage_advantages, "group_advantages", spy)
    cfg = tiny_config(
        tmp_path,
        "train.steps=2",
        "eval.every=0",
        "rollout.prompts_per_step=4",
        "rollout.group_size=4",
        "rollout.max_new_tokens=4",
        "rollout.dynamic_sampling=true",
        "rollout.max_extra_batches=6",
        "reward.kind=user",
        'reward.user_fn="reward_fixtures:half_informative_reward"',  # light to import in a reward worker
        "reward.format_weight=0.0",
    )
    train_mod.Trainer(cfg, quiet=True).run()
    rows = [json.loads(line) for line in (tmp_path / "run" / RunDir.METRICS).read_text().splitlines()]
    assert len(seen) == 2 and min(min(step) for step in seen) > 0  # every trained group has reward variance
    for step, row in zip(seen, rows):
        assert 0 <= row["rollout/extra_batches"] <= 6
        assert len(step) == 4 or row["rollout/extra_batches"] == 6  # full, unless the extra draws ran out
    assert sum(r["rollout/dropped_groups"] for r in rows) > 0


def test_length_weighted_advantages_get_each_completions_length(tmp_path, monkeypatch):
    """adv_scale=opo: the advantage stage passes every completion's token count (before overlong masking) and the step
    trains on the result."""
    from test_llm_e2e import tiny_config

    from dfpo.trainer import train as train_mod
    from dfpo.trainer.stages import advantages as stage_advantages

    seen = []
    real = stage_advantages.group_advantages

    def spy(rewards, group_ids, **kw):
        seen.append((kw["scale"], kw["lengths"].clone()))
        return real(rewards, group_ids, **kw)

    monkeypatch.setattr(stage_advantages, "group_advantages", spy)
    cfg = tiny_config(tmp_path, "train.steps=1", "eval.every=0", "objective.overrides.adv_scale=opo", "rollout.mask_truncated=true")
    train_mod.Trainer(cfg, quiet=True).run()
    ((scale, lengths),) = seen
    assert scale == "opo" and int(lengths.min()) >= 1 and lengths.dtype == torch.long
