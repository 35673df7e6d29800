"""The exact-cancellation arm (issue 58): ``cancel="shared_whole"`` on every preset.

Invariant (Hypothesis): on any batch, for every preset, cancel=shared_whole gives the same loss and metrics bit for bit,
d loss / d log pi = 0 exactly at the positions whose prefix and token every completion of the group holds, and the
same gradient bit for bit at every other position.

Then: the whole-group positions are the brute-force definition (prefix or, with context ids, (context, token) at t);
the verdicts and ``--trace`` show it; the toy, the trainer's two loss paths (LM head fused and not) and the TRL / verl
adapters take it or refuse it in one sentence; ``weights/spread`` and ``shared/whole_group_positions`` measure what they
say; the setting is off by default.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dfpo.core.loss import OBJECTIVES, group_advantages, objective_from_label, policy_loss, resolve_objective
from dfpo.core.loss.cancel import whole_group_events, whole_group_shared
from dfpo.core.loss.cancellation import atlas, make_shared_prefix_group, shared_token_gradient
from dfpo.core.loss.trace import trace_lines, trace_objective

pytestmark = pytest.mark.usefixtures("one_thread")

ARM = "shared_whole"


def make_batch(seed: int, sizes: list[int], T: int, vocab: int, nonempty: bool) -> dict[str, torch.Tensor]:
    """Groups of ``sizes`` completions in a shuffled batch, a small vocabulary (partial events happen), each group's first
    k tokens copied from its first member (whole-group events), ragged lengths (an empty row unless ``nonempty``), every
    input ``policy_loss`` reads, float64."""
    g = torch.Generator().manual_seed(seed)
    B = sum(sizes)
    group_ids = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes)) * 5 + 2  # (B,) labels, not 0..n-1
    tokens = torch.randint(0, vocab, (B, T), generator=g)  # (B, T)
    start = 0
    for size in sizes:
        k = int(torch.randint(0, T + 1, (1,), generator=g))
        tokens[start : start + size, :k] = tokens[start, :k].clone()
        start += size
    lengths = torch.randint(0, T + 1, (B,), generator=g).clamp(min=int(nonempty))  # (B,)
    mask = torch.arange(T)[None, :] < lengths[:, None]  # (B, T)
    order = torch.randperm(B, generator=g)
    tokens, mask, group_ids = tokens[order], mask[order], group_ids[order]
    logp = -0.2 - torch.rand(B, T, generator=g, dtype=torch.float64)  # (B, T)
    old = logp - 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    rewards = torch.randint(0, 2, (B,), generator=g).double()
    adv = group_advantages(rewards + 0.1 * torch.arange(B), group_ids)  # (B,) no group without spread
    extra = dict(
        entropy=0.2 + torch.rand(B, T, generator=g, dtype=torch.float64),
        ref_logp=old - 0.1 * torch.rand(B, T, generator=g, dtype=torch.float64),
        rollout_logp=old + 0.05 * torch.randn(B, T, generator=g, dtype=torch.float64),
    )
    return dict(logp=logp, old_logp=old, advantages=adv, mask=mask, group_ids=group_ids, token_ids=tokens, **extra)


@st.composite
def batches(draw):
    """``make_batch`` of 1 to 3 groups of 1 to 4 completions, 1 to 6 positions, a vocabulary of 2 to 4."""
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    return make_batch(draw(st.integers(0, 2**16)), sizes, draw(st.integers(1, 6)), draw(st.integers(2, 4)), draw(st.booleans()))


FIXED = dict(seed=3, sizes=[4, 3, 1], T=5, vocab=2, nonempty=True)
"""A batch with whole-group and partial events, a group of one, every row non-empty."""


def brute_whole_group(tokens: torch.Tensor, mask: torch.Tensor, group_ids: torch.Tensor, contexts=None) -> torch.Tensor:
    """The definition, one position at a time: t is shared when the group has two or more members and each is real at t
    and holds the first member's token at t and context (without context ids: its tokens and realness at 0..t)."""
    B, T = tokens.shape
    out = torch.zeros(B, T, dtype=torch.bool)
    for i in range(B):
        members = [j for j in range(B) if group_ids[j] == group_ids[i]]
        if len(members) < 2:
            continue
        first = members[0]
        for t in range(T):
            span = range(t, t + 1) if contexts is not None else range(t + 1)
            same = all(
                bool(mask[j, u]) and tokens[j, u] == tokens[first, u] and (contexts is None or contexts[j, u] == contexts[first, u])
                for j in members
                for u in span
            )
            out[i, t] = same
    return out


def _loss(objective, batch, **overrides):
    logp = batch["logp"].clone().requires_grad_()
    loss, metrics = policy_loss(objective, **{**batch, "logp": logp}, **overrides)
    (grad,) = torch.autograd.grad(loss, logp, allow_unused=True)
    return loss.detach(), metrics, torch.zeros_like(logp) if grad is None else grad


@given(batch=batches())
@settings(max_examples=12, deadline=None)
def test_every_preset_loses_exactly_the_whole_group_gradient_and_nothing_else(batch):
    """The module's invariant, for every registered preset."""
    shared = brute_whole_group(batch["token_ids"], batch["mask"], batch["group_ids"])
    for name in OBJECTIVES:
        loss, metrics, grad = _loss(name, batch)
        loss_c, metrics_c, grad_c = _loss(f"{name}:cancel={ARM}", batch)
        assert torch.equal(loss_c, loss), name
        assert set(metrics_c) == set(metrics) | {"shared/whole_group_positions"}, name
        assert all(torch.equal(metrics_c[k], metrics[k]) for k in metrics), name
        assert not bool(grad_c[shared].any()), name  # every copy 0, so the net of eq 2 is 0
        assert torch.equal(grad_c[~shared], grad[~shared]), name


@given(batch=batches())
@settings(max_examples=40, deadline=None)
def test_the_whole_group_positions_and_their_count_are_the_definition(batch):
    """Prefix rule without context ids; (context, token) at t with them; one event per group and position."""
    tokens, mask, gid = batch["token_ids"], batch["mask"], batch["group_ids"]
    expected = brute_whole_group(tokens, mask, gid)
    assert torch.equal(whole_group_shared(tokens, mask, gid), expected)
    contexts = (tokens + torch.arange(tokens.shape[1])) % 3  # a context id per position, not the prefix
    assert torch.equal(whole_group_shared(tokens, mask, gid, contexts), brute_whole_group(tokens, mask, gid, contexts))
    events = sum(int(expected[gid == g][0].sum()) for g in gid.unique())
    assert float(whole_group_events(expected, gid)) == events
    _, metrics = policy_loss(f"grpo:cancel={ARM}", **batch)
    assert float(metrics["shared/whole_group_positions"]) == events


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_the_verdicts_say_cancels_in_every_cell(name):
    """``atlas`` (``dfpo objectives --atlas``'s cells) on a label: every aggregation, equal and unequal lengths, the shared
    ratio inside and outside the clip range: cancels, with a residual of exactly 0."""
    cells = atlas([f"{name}:cancel={ARM}"], groups=2)
    assert cells and all(cell.label == "cancels" and cell.residual == 0.0 for cell in cells)


def test_the_verdicts_still_see_the_residual_without_it():
    """The same cells without the setting: GSPO without clipping leaves a residual (the arm's counterfactual)."""
    group = make_shared_prefix_group(torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64), [5, 9, 12, 7], seed=1)
    assert float(shared_token_gradient("gspo_noclip", group).abs().max()) > 1e-4
    assert float(shared_token_gradient(f"gspo_noclip:cancel={ARM}", group).abs().max()) == 0.0
    assert float(shared_token_gradient("gspo_noclip", group, cancel=ARM).abs().max()) == 0.0


def test_the_trace_shows_the_arm():
    """``dfpo objectives 'gspo_noclip:cancel=shared_whole' --trace``'s core: the tokens, the stage, the mask, a zero column."""
    trace = trace_objective(f"gspo_noclip:cancel={ARM}")
    names = [s.function for s in trace.stages]
    assert names[:2] == ["cancel_step", "whole_group_shared"]
    assert trace.stages[1].values.startswith("(4, 3) [1 0 0 | 1 0 0 | 1 0 0 | 1 0 0]")
    assert not bool(trace.grad[:, 0].any()) and bool(trace.grad[:, 1:][trace.batch.mask[:, 1:]].any())
    text = "\n".join(trace_lines(trace))
    assert "token ids (4, 3) [5 7 2 | 5 3 . | 5 7 9 | 5 . .]" in text and "core/loss/cancel.py" in text
    plain = trace_objective("gspo_noclip")
    assert "cancel" in plain.idle and "token_ids" not in plain.batch.optional
    assert torch.equal(plain.loss, trace.loss) and torch.equal(plain.grad[:, 1:], trace.grad[:, 1:])


def test_it_is_off_by_default_and_token_ids_change_nothing_then():
    """Every preset keeps cancel='none'; passing token ids to it is a no-op, bit for bit."""
    batch = make_batch(**FIXED)
    for name, spec in OBJECTIVES.items():
        assert spec.cancel == "none" and not spec.needs_token_ids
        without = {k: v for k, v in batch.items() if k != "token_ids"}
        a, b = _loss(name, without), _loss(name, batch)
        assert torch.equal(a[0], b[0]) and torch.equal(a[2], b[2]) and a[1].keys() == b[1].keys()


def test_a_matched_control_and_bad_input_in_one_sentence():
    """The arm is the mechanism under comparison (gspo_noclip is its matched control); missing or bad ids are refused."""
    from dfpo.core.loss import unmatched_components

    spec = objective_from_label(f"gspo_noclip:cancel={ARM}")
    assert unmatched_components(spec, OBJECTIVES["gspo_noclip"]) == [] and spec.needs_token_ids
    batch = make_batch(**FIXED)
    without = {k: v for k, v in batch.items() if k != "token_ids"}
    with pytest.raises(ValueError, match=r"^token_ids is required for cancel='shared_whole', got token_ids=None$"):
        policy_loss(spec, **without)
    with pytest.raises(ValueError, match="token_ids must have shape"):
        policy_loss(spec, **{**batch, "token_ids": batch["token_ids"][:, :0]})
    with pytest.raises(ValueError, match="context_ids must be an integer tensor"):
        policy_loss(spec, **batch, context_ids=batch["token_ids"].double())
    with pytest.raises(ValueError, match="cancel must be one of"):
        resolve_objective("gspo_noclip", cancel="shared_partial")


def test_weights_spread_is_the_mean_in_group_range_of_the_sequence_weights():
    """gspo_noclip: the range of exp(mean log-ratio) per group, averaged; Min-Replace (eq 50) gives one weight per group."""
    batch = make_batch(**FIXED)
    mask, gid = batch["mask"], batch["group_ids"]
    lengths = mask.sum(-1)
    s = torch.exp(torch.where(mask, batch["logp"] - batch["old_logp"], 0.0).sum(-1) / lengths.clamp(min=1))  # (B,) eq 44
    spreads = [
        float(s[(gid == g) & (lengths > 0)].max() - s[(gid == g) & (lengths > 0)].min())
        for g in gid.unique()
        if bool(((gid == g) & (lengths > 0)).any())
    ]
    _, metrics = policy_loss("gspo_noclip", **batch)
    assert float(metrics["weights/spread"]) == pytest.approx(sum(spreads) / max(len(spreads), 1), rel=1e-12, abs=1e-15)
    _, metrics = policy_loss("dfpo_min:clip=none", **batch)
    assert float(metrics["weights/spread"]) == 0.0
    _, metrics = policy_loss("gspo_noclip", **{**batch, "old_logp": batch["logp"]})  # on-policy: every ratio 1
    assert float(metrics["weights/spread"]) == 0.0


def test_the_toy_cancels_its_whole_group_row_token_events():
    """The toy's context is the parameter row: loss_coefficients with tokens and rows zeroes the coefficient at the
    (row, token) events every member of a group holds and changes no other, and a toy run trains with the label."""
    from dfpo.core import metrics
    from dfpo.toy.policy import gather_tokens, init_params, log_policy, sample
    from dfpo.toy.tasks import family
    from dfpo.toy.train import ToyConfig, loss_coefficients, train_objective

    task = family(k=2, distractors=2, prompts=3)
    g = torch.Generator().manual_seed(0)
    theta_old = init_params(task, 2, noise=0.5, generator=g)
    logpi_old, logpi = (
        log_policy(theta_old, task.legal),
        log_policy(theta_old + 0.3 * torch.randn(theta_old.shape, generator=g), task.legal),
    )
    roll = sample(task, logpi_old, torch.arange(3), 6, g)
    z = torch.zeros(())
    old = torch.where(roll.mask, gather_tokens(logpi_old, roll.rows, roll.tokens), z)
    lp = torch.where(roll.mask, gather_tokens(logpi, roll.rows, roll.tokens), z)
    S, B, T = lp.shape
    gid = (torch.arange(S)[:, None] * 3 + roll.group).reshape(-1)
    adv = group_advantages(roll.reward.reshape(-1), gid).reshape(S, -1)
    shared = metrics.shared_mask((roll.rows * 100 + roll.tokens).reshape(S * B, T), roll.mask.reshape(S * B, T), gid, prefix=False)
    shared = shared.reshape(S, B, T)
    assert bool(shared.any())
    args = (lp, old, adv, roll.mask, roll.group, None, 3, task.max_len)
    base, _ = loss_coefficients(OBJECTIVES["gspo_noclip"], *args, tokens=roll.tokens, rows=roll.rows)
    arm, _ = loss_coefficients(objective_from_label(f"gspo_noclip:cancel={ARM}"), *args, tokens=roll.tokens, rows=roll.rows)
    assert not bool(arm[shared].any()) and bool(base[shared].any()) and torch.equal(arm[~shared], base[~shared])
    with pytest.raises(ValueError, match="token_ids is required"):
        loss_coefficients(objective_from_label(f"gspo_noclip:cancel={ARM}"), *args)
    run = train_objective(task, f"gspo_noclip:cancel={ARM}", ToyConfig(objectives=("gspo_noclip",), seeds=2, steps=3, lr=0.5))
    assert float(run["residual/shared_net"].abs().max()) == 0.0


@pytest.mark.parametrize("fused_head", ["off", "eager"])
def test_the_trainer_passes_the_completions_tokens_on_both_loss_paths(fused_head):
    """accumulate_gradients (the trainer's update) with gspo:cancel=shared_whole, LM head fused or not: the two shared
    positions of the group get d loss / d logp = 0 and are counted; without the setting they do not cancel."""
    from dfpo.trainer.config import ModelConfig
    from dfpo.trainer.diagnostics import StepDiagnostics
    from dfpo.trainer.minibatches import MicroBatch
    from dfpo.trainer.policy import build_char_tokenizer, build_tiny_model
    from dfpo.trainer.sampler import build_batch, completion_logits, token_logp
    from dfpo.trainer.stages.update import accumulate_gradients

    torch.manual_seed(0)
    tok = build_char_tokenizer()
    model = build_tiny_model(ModelConfig(tiny_hidden=32, tiny_layers=1, tiny_heads=2, tiny_intermediate=64), tok, seed=0)
    comps = [[10, 11, 12, 13], [10, 11, 14, 15], [10, 11, 12, 16], [10, 11, 17, 13]]  # the first 2 tokens shared
    batch = build_batch(
        [tok("3+4=", add_special_tokens=False).input_ids], comps, 4, pad_id=tok.pad_token_id, eos_ids={tok.eos_token_id}, max_new_tokens=4
    )
    with torch.no_grad():
        logp = token_logp(completion_logits(model, batch, "cpu"), batch.completion_ids)  # (4, 4)
    old = logp + torch.tensor([0.0, 0.1, -0.1, 0.05])[:, None] * batch.mask
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    for label, cancels in ((f"gspo_noclip:cancel={ARM}", True), ("gspo_noclip", False)):
        d = StepDiagnostics()
        model.zero_grad()
        record, finite = accumulate_gradients(
            model, [MicroBatch(batch, old, None, adv, 1.0)], resolve_objective(label), torch.device("cpu"),
            diagnostics=d, fused_head=fused_head,
        )  # fmt: skip
        assert finite and d.shared_positions == 2
        if cancels:
            assert d.shared_num == 0.0 and d.shared_den == 0.0 and record["shared/whole_group_positions"] == 2.0
        else:
            assert d.shared_num / d.shared_den > 1e-3 and "shared/whole_group_positions" not in record


def test_verl_refuses_it_up_front_in_one_sentence():
    """verl's policy loss gets no token ids (the TRL adapter passes completion_ids: tests/integrations/test_trl_integration.py)."""
    from dfpo.integrations import verl

    with pytest.raises(ValueError, match=r"reads the completions' token ids \(cancel='shared_whole'\), which verl does not pass"):
        verl.make_verl_policy_loss(objective_from_label(f"gspo_noclip:cancel={ARM}"))


@pytest.mark.parametrize("layout", [dict(chunk_size=1024), dict(chunk_size=3, max_logits_mib=0.0), dict(chunk_size=5, solve_once=True)])
def test_the_fused_lm_head_reads_its_targets_as_the_token_ids(layout):
    """fused_policy_loss with the arm equals policy_loss on naive_token_logprobs with token_ids = targets (loss, d hidden,
    d W), in one block, in two passes of small chunks and solved once."""
    from dfpo.core.fused import coupling_unit, fused_policy_loss
    from dfpo.core.logprobs import naive_token_logprobs

    g = torch.Generator().manual_seed(0)
    B, T, H, V = 8, 5, 8, 6
    h, w = torch.randn(B, T, H, generator=g), 0.7 * torch.randn(V, H, generator=g)
    y = torch.randint(0, V, (B, T), generator=g)
    y[:4, :2] = y[0, :2].clone()  # the first group shares its first two tokens
    mask = torch.arange(T)[None, :] < torch.tensor([5, 4, 5, 3, 2, 5, 4, 1])[:, None]
    gid, adv = torch.arange(B) // 4, torch.randn(B, generator=g)
    spec = objective_from_label(f"gspo_noclip:cancel={ARM}")
    assert coupling_unit(spec) == "group" and coupling_unit(OBJECTIVES["gspo_noclip"]) == "row"
    with torch.no_grad():
        old = naive_token_logprobs(h, w, y)[0] + 0.1 * torch.randn(B, T, generator=g)
    kw = dict(old_logp=old, advantages=adv, mask=mask, group_ids=gid)
    hr, wr = h.clone().requires_grad_(), w.clone().requires_grad_()
    ref, ref_metrics = policy_loss(spec, logp=naive_token_logprobs(hr, wr, y)[0], token_ids=y, **kw)
    ref_grads = torch.autograd.grad(ref, [hr, wr])
    hf, wf = h.clone().requires_grad_(), w.clone().requires_grad_()
    loss, metrics = fused_policy_loss(spec, hidden=hf, lm_head_weight=wf, targets=y, **kw, **layout)
    grads = torch.autograd.grad(loss, [hf, wf])
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=1e-7)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert float(metrics["shared/whole_group_positions"]) == float(ref_metrics["shared/whole_group_positions"]) == 2.0


def test_the_trainers_whole_group_coefficient_mass_is_0_under_the_arm_and_not_without_it():
    """diag/shared_coef_whole (what a run logs to show the arm acted; its residual there is 0/0) read off the same
    d loss / d log pi the trainer feeds its diagnostics: 0 exactly with cancel=shared_whole, positive without."""
    from dfpo.trainer.diagnostics import StepDiagnostics
    from dfpo.trainer.stages.metrics import diagnostic_metrics

    batch = make_batch(**FIXED)
    ones = torch.ones_like(batch["logp"])
    mass = {}
    for label in ("gspo_noclip", f"gspo_noclip:cancel={ARM}"):
        _, _, grad = _loss(label, batch)
        d = StepDiagnostics()
        d.add(grad, ones, ones, batch["token_ids"], batch["mask"], batch["group_ids"], None)
        mass[label] = diagnostic_metrics(d)["diag/shared_coef_whole"]
    assert mass[f"gspo_noclip:cancel={ARM}"] == 0.0 < mass["gspo_noclip"]
