"""dfpo's objectives inside TRL's GRPOTrainer: whole groups in every loss call (checked), the loss equal to
dfpo.policy_loss on the same batch, a short training run on CPU with dfpo's metrics in TRL's logs."""

from __future__ import annotations

import warnings

import pytest
import torch

pytest.importorskip("trl")

from dfpo import policy_loss, resolve_objective  # noqa: E402
from dfpo.integrations.trl import GROUP_KEY, DFPOGRPOTrainer, check_group_prompts, check_whole_groups, shuffle_groups  # noqa: E402
from dfpo.trainer.config import ModelConfig  # noqa: E402
from dfpo.trainer.forward import completion_logprobs  # noqa: E402
from dfpo.trainer.minibatches import micro_batch  # noqa: E402
from dfpo.trainer.policy import build_char_tokenizer, build_tiny_model  # noqa: E402
from dfpo.trainer.sampler import build_batch  # noqa: E402
from dfpo.trainer.stages.update import accumulate_gradients  # noqa: E402

G = 4


def test_group_shuffle_keeps_each_prompts_completions_together():
    """Rows of group g are rows g*G .. g*G+G-1 before the shuffle; after it they stay consecutive and labelled."""
    batch = {"x": torch.arange(12) * 10, "names": [f"r{i}" for i in range(12)], "scalar": torch.tensor(3)}
    out = shuffle_groups(batch, G, torch.Generator().manual_seed(1))
    gid = out[GROUP_KEY]
    assert (out["x"] // 10 // G == gid).all() and out["scalar"] == 3
    for g in range(3):
        rows = (gid == g).nonzero().flatten()
        assert rows.tolist() == list(range(int(rows[0]), int(rows[0]) + G))
    check_whole_groups(gid[:8], G)
    with pytest.raises(ValueError, match="part of a group"):
        check_whole_groups(gid[2:10], G)
    with pytest.raises(ValueError, match="does not hold whole groups"):
        shuffle_groups({"x": torch.arange(10)}, G)
    assert (shuffle_groups(batch, G, first_group=6)[GROUP_KEY] >= 6).all()  # a later process's ids


def test_a_generation_batch_whose_blocks_mix_prompts_is_refused():
    """Blocks of G consecutive rows must each be one prompt's completions (left-padded prompt ids and mask)."""
    ids = torch.tensor([[0, 5, 6]] * G + [[7, 8, 9]] * G)  # (8, 3)
    mask = (ids > 0).long()
    check_group_prompts(ids, mask, G)
    with pytest.raises(ValueError, match="rows 0..3 of this process's generation batch are not one prompt's"):
        check_group_prompts(ids.roll(2, dims=0), mask.roll(2, dims=0), G)
    with pytest.raises(ValueError, match="does not hold whole groups"):
        check_group_prompts(ids[:6], mask[:6], G)


def _trainer(tmp_path, objective="dfpo_min", per_device=8, steps=2, evaluate=False, reward_funcs=None, **extra):
    from datasets import Dataset
    from trl import GRPOConfig

    tok = build_char_tokenizer()
    model = build_tiny_model(ModelConfig(tiny_hidden=32, tiny_layers=1, tiny_heads=2, tiny_intermediate=64), tok, seed=0)
    data = Dataset.from_dict({"prompt": [f"{i}+{i + 1}=" for i in range(16)], "answer": [str(2 * i + 1) for i in range(16)]})

    def reward(completions, answer, **kwargs):
        return [float(sum(map(ord, c)) % 3) + float(c.startswith(a)) for c, a in zip(completions, answer)]  # varies within a group

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        settings = dict(
            output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], save_strategy="no", logging_steps=1,
            per_device_train_batch_size=per_device, num_generations=G, steps_per_generation=2, max_completion_length=4,
            max_steps=steps, learning_rate=1e-3, seed=0, disable_tqdm=True,
        )  # fmt: skip
        args = GRPOConfig(**{**settings, **extra})  # extra may replace a default (save_strategy for the resume tests)
    return DFPOGRPOTrainer(
        model=model, reward_funcs=reward_funcs or reward, args=args, train_dataset=data, eval_dataset=data if evaluate else None,
        processing_class=tok, objective=objective,
    )  # fmt: skip


def test_a_slice_that_cannot_hold_whole_groups_is_refused(tmp_path):
    with pytest.raises(ValueError, match="per_device_train_batch_size=6 must be a multiple of num_generations=4"):
        _trainer(tmp_path, per_device=6)


def test_the_loss_is_dfpo_policy_loss_on_the_same_batch(tmp_path):
    """TRL's inputs layout (left-padded prompts, right-padded completions) through _compute_loss equals
    dfpo.policy_loss on dfpo's own log-probs of the same rows, divided by the accumulation steps."""
    trainer = _trainer(tmp_path, objective="dfpo_min:eps_low=0.2:eps_high=0.2")
    tok = trainer.processing_class
    prompts = [tok(p, add_special_tokens=False).input_ids for p in ("3+4=", "10+20=")]
    completions = [[5, 6], [7], [8, 9, 10], [5], [6, 6], [7, 8], [9], [10, 11, 12]]
    batch = build_batch(prompts, completions, G, pad_id=tok.pad_token_id, eos_ids=set(), max_new_tokens=4)
    P = batch.prompt_width
    g = torch.Generator().manual_seed(0)
    old = torch.where(batch.mask, -2.0 + 0.3 * torch.randn(batch.mask.shape, generator=g), 0.0)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, 1.0, -1.0, -1.0])
    inputs = {
        "prompt_ids": batch.input_ids[:, :P], "prompt_mask": batch.attention_mask[:, :P],
        "completion_ids": batch.completion_ids, "completion_mask": batch.mask.long(),
        "advantages": adv, "old_per_token_logps": old, GROUP_KEY: batch.group_ids,
    }  # fmt: skip
    trainer.model.train()
    got = trainer._compute_loss(trainer.model, inputs)
    logp = completion_logprobs(trainer.model, batch, "cpu").logp
    expected, _ = policy_loss(
        resolve_objective("dfpo_min", eps_low=0.2, eps_high=0.2),
        logp=logp,
        old_logp=old,
        advantages=adv,
        mask=batch.mask,
        group_ids=batch.group_ids,
    )
    torch.testing.assert_close(got, expected / trainer.args.gradient_accumulation_steps, rtol=1e-5, atol=1e-6)


def _grads(model) -> list[torch.Tensor]:
    """The accumulated gradient of every parameter, then zeroed."""
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("objective", ["dfpo_min:eps_low=0.2:eps_high=0.2", "gspo", "grpo", "topr", "gspo_noclip:cancel=shared_whole"])
def test_the_loss_and_gradient_equal_dfpos_own_trainer_on_the_same_rows(tmp_path, objective):
    """The same model, objective, old log-probs and advantages: the subclass's loss and gradient on TRL's layout
    of a batch (groups in a shuffled order, as _prepare_inputs hands them over) equal those of dfpo's own
    trainer step (accumulate_gradients on one micro-batch of the rows, weighted 1 / accumulation steps)."""
    trainer = _trainer(tmp_path, objective=objective, gradient_accumulation_steps=2)
    tok, model = trainer.processing_class, trainer.model
    prompts = [tok(p, add_special_tokens=False).input_ids for p in ("3+4=", "10+20=")]
    completions = [[5, 6], [7], [8, 9, 10], [5], [6, 6], [7, 8], [9], [10, 11, 12]]
    batch = build_batch(prompts, completions, G, pad_id=tok.pad_token_id, eos_ids=set(), max_new_tokens=4)
    P = batch.prompt_width
    g = torch.Generator().manual_seed(0)
    old = torch.where(batch.mask, -2.0 + 0.3 * torch.randn(batch.mask.shape, generator=g), 0.0)  # (B, T)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, 1.0, -1.0, -1.0])  # (B,)
    rows = {
        "prompt_ids": batch.input_ids[:, :P], "prompt_mask": batch.attention_mask[:, :P],
        "completion_ids": batch.completion_ids, "completion_mask": batch.mask.long(),
        "advantages": adv, "old_per_token_logps": old,
    }  # fmt: skip
    inputs = shuffle_groups(rows, G, torch.Generator().manual_seed(1))
    assert inputs[GROUP_KEY].tolist() == [1] * G + [0] * G  # the second prompt's group first
    model.train()
    model.zero_grad(set_to_none=True)
    loss = trainer._compute_loss(model, inputs)
    loss.backward()
    got = _grads(model)

    weight = 1.0 / trainer.args.gradient_accumulation_steps
    spec = trainer.dfpo_spec
    micro = micro_batch(batch, torch.arange(len(adv)), old, None, adv, weight)
    metrics, finite = accumulate_gradients(model, [micro], spec, torch.device("cpu"))
    assert finite
    expected = _grads(model)
    # the metric is the loss of the rows (a weighted mean over micro-batches); TRL's loss is divided by the accumulation steps
    torch.testing.assert_close(loss.detach(), torch.tensor(metrics["loss/policy"] * weight), rtol=0, atol=1e-6)
    for a, b in zip(got, expected):
        # float32 sums in another order: each entry to 1e-5 of itself or 1e-6 of the tensor's largest entry (an entry
        # near 0 in a tensor of gradients of order 1e-2 differed by 2e-9, 3e-5 of itself)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6 * float(b.abs().max()))


@pytest.mark.parametrize("objective", ["dfpo_min", "gspo", "grpo"])
def test_training_keeps_groups_whole_and_logs_dfpo_metrics(tmp_path, objective):
    """Two optimiser steps on CPU: every loss call saw whole groups of num_generations rows (recorded, not
    assumed), the parameters moved, and dfpo's metrics reached TRL's log history."""
    trainer = _trainer(tmp_path, objective=objective)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.dfpo_groups_seen and all(counts == [G] * len(counts) for counts in trainer.dfpo_groups_seen)
    assert sum(len(c) for c in trainer.dfpo_groups_seen) == 2 * 8 // G  # 2 steps x 8 rows, 4 per group
    moved = sum(float((p.detach() - before[n]).abs().sum()) for n, p in trainer.model.named_parameters())
    assert moved > 0
    logged = {k for row in trainer.state.log_history for k in row}
    assert {"dfpo/weights/asym", "dfpo/clip/frac_high", "dfpo/loss/policy"} <= logged


def test_evaluation_keeps_whole_groups_of_num_generations_eval(tmp_path):
    """Evaluation groups have num_generations_eval rows (2 here, 4 in training): each eval loss call holds whole
    groups of 2, one prompt each, and dfpo's metrics reach the eval log."""
    trainer = _trainer(tmp_path, evaluate=True, eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=4, num_generations_eval=2)
    metrics = trainer.evaluate()
    assert trainer.dfpo_groups_seen and all(counts == [2, 2] for counts in trainer.dfpo_groups_seen)
    assert "eval_dfpo/weights/asym" in metrics


@pytest.mark.parametrize("objective", ["grpo:beta=0.04", "online_ipo"])
def test_an_objective_that_reads_the_reference_needs_trls_reference_log_probs(tmp_path, objective):
    with pytest.raises(ValueError, match="reads the reference log-probs .* set GRPOConfig\\(beta=...\\) > 0"):
        _trainer(tmp_path, objective=objective)


def test_the_example_script_runs_and_prints_dfpo_metrics():
    """examples/trl_dfpo.py, as the README shows it, end to end (tiny offline model, CPU)."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "examples" / "trl_dfpo.py"
    out = subprocess.run([sys.executable, str(script), "--steps", "2"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "dfpo/weights/asym" in out.stdout


def test_dfpo_metrics_reach_trls_log_by_their_declared_reduction(tmp_path):
    """TRL averages every metric over its logging window; dfpo's keys are combined first, so the logged ratio/max is
    the window's maximum, a minimum its minimum, and a mean the mean."""
    trainer = _trainer(tmp_path)
    trainer.model.train()
    window = trainer._metrics["train"]
    window["dfpo/ratio/max"] += [1.5, 3.0, 2.0]
    window["dfpo/rollout/seq_ratio_min"] += [0.9, 0.4]
    window["dfpo/loss/policy"] += [1.0, 2.0]
    logged = {}
    trainer.callback_handler.on_log = lambda args, state, control, logs: logged.update(logs) or control
    trainer.log({})
    assert logged["dfpo/ratio/max"] == 3.0
    assert logged["dfpo/rollout/seq_ratio_min"] == 0.4
    assert logged["dfpo/loss/policy"] == 1.5


def _correction_inputs(trainer):
    tok = trainer.processing_class
    prompts = [tok(p, add_special_tokens=False).input_ids for p in ("3+4=", "10+20=")]
    completions = [[5, 6], [7], [8, 9, 10], [5], [6, 6], [7, 8], [9], [10, 11, 12]]
    batch = build_batch(prompts, completions, G, pad_id=tok.pad_token_id, eos_ids=set(), max_new_tokens=4)
    P = batch.prompt_width
    g = torch.Generator().manual_seed(3)
    old = torch.where(batch.mask, -2.0 + 0.3 * torch.randn(batch.mask.shape, generator=g), 0.0)
    sampling = torch.where(batch.mask, old + 0.8 * torch.randn(batch.mask.shape, generator=g), 0.0)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, 1.0, -1.0, -1.0])
    inputs = {
        "prompt_ids": batch.input_ids[:, :P], "prompt_mask": batch.attention_mask[:, :P],
        "completion_ids": batch.completion_ids, "completion_mask": batch.mask.long(),
        "advantages": adv, "old_per_token_logps": old, GROUP_KEY: batch.group_ids,
        "sampling_per_token_logps": sampling, "importance_sampling_ratio": torch.ones(8, 1),  # its presence is TRL's switch
    }  # fmt: skip
    return batch, inputs


@pytest.mark.parametrize("mode", ["token_mask", "sequence_truncate"])
def test_trls_own_vllm_correction_becomes_dfpos_correction_of_the_same_mode(tmp_path, mode):
    """TRL puts importance_sampling_ratio in the inputs when its vLLM IS correction is on; an objective without its own
    correction then gets TRL's as dfpo's rollout_correction of the same mode, on TRL's sampling log-probs."""
    trainer = _trainer(tmp_path, objective="grpo")
    trainer.args.vllm_importance_sampling_mode, trainer.args.vllm_importance_sampling_clip_max = mode, 3.0
    trainer.args.vllm_importance_sampling_clip_min = 0.5
    batch, inputs = _correction_inputs(trainer)
    trainer.model.train()
    got = trainer._compute_loss(trainer.model, inputs)
    logp = completion_logprobs(trainer.model, batch, "cpu").logp
    kw = dict(
        logp=logp, old_logp=inputs["old_per_token_logps"], advantages=inputs["advantages"], mask=batch.mask, group_ids=batch.group_ids
    )
    expected, _ = policy_loss(
        "grpo",
        **kw,
        rollout_logp=inputs["sampling_per_token_logps"],
        rollout_correction=mode,
        rollout_cap=3.0,
        rollout_low=0.5,
        rollout_floor=0.5,
    )
    plain, _ = policy_loss("grpo", **kw)
    torch.testing.assert_close(got, expected / trainer.args.gradient_accumulation_steps, rtol=1e-5, atol=1e-6)
    assert abs(float(expected.detach()) - float(plain.detach())) > 1e-4  # the correction bites


def test_an_objectives_own_correction_needs_vllms_untruncated_log_probs(tmp_path):
    with pytest.raises(ValueError, match="rollout_correction='token_truncate'.*only with GRPOConfig\\(use_vllm=True\\)"):
        _trainer(tmp_path, objective="grpo:rollout_correction=token_truncate")
    trainer = _trainer(tmp_path, objective="grpo")
    trainer.dfpo_spec = resolve_objective("grpo", rollout_rejection="seq_mean_k1")
    trainer.args.use_vllm, trainer.args.top_p = True, 0.9
    with pytest.raises(ValueError, match="rollout_rejection='seq_mean_k1'.*truncated distribution.*TRL issue 6789"):
        trainer._check_rollout_inputs()


def test_gdpo_needs_trls_normalize_then_sum_and_remax_is_refused(tmp_path):
    """issue 30: TRL computes the advantages, so adv_scale='gdpo' needs TRL's GDPO aggregation, and ReMax (a greedy
    completion per prompt, which TRL does not generate) and OTB (one advantage per token) are refused before training."""
    with pytest.raises(
        ValueError, match=r"adv_scale='gdpo', which TRL computes as GRPOConfig\(multi_objective_aggregation='normalize_then_sum'\)"
    ):
        _trainer(tmp_path, objective="grpo:adv_scale=gdpo")
    _trainer(tmp_path, objective="grpo:adv_scale=gdpo", multi_objective_aggregation="normalize_then_sum")
    with pytest.raises(ValueError, match=r"adv_scale='remax'.*TRL's GRPOTrainer does not generate"):
        _trainer(tmp_path, objective="grpo:adv_scale=remax")
    with pytest.raises(ValueError, match=r"adv_scale='otb', one advantage per token, which neither TRL computes"):
        _trainer(tmp_path, objective="grpo:adv_scale=otb")


def test_gdpo_equals_trls_own_normalize_then_sum(tmp_path):
    """Cross-check against TRL 1.16's own code: the advantages its _generate_and_score_completions computes under
    multi_objective_aggregation='normalize_then_sum' from its rewards_per_func (two reward functions, weights 1 and 0.5)
    equal dfpo's group_advantages(scale='gdpo') of the same matrix, for every generation batch of a short run."""
    from dfpo import group_advantages

    def correct(completions, answer, **kwargs):
        return [float(c.startswith(a)) + float(sum(map(ord, c)) % 2) for c, a in zip(completions, answer)]

    def form(completions, **kwargs):
        return [float(c[:1].isdigit()) + 0.5 * float(len(c) > 2) for c in completions]

    trainer = _trainer(
        tmp_path, objective="grpo:adv_scale=gdpo", reward_funcs=[correct, form], multi_objective_aggregation="normalize_then_sum",
        reward_weights=[1.0, 0.5],
    )  # fmt: skip
    seen, real_rewards, real_score = [], trainer._calculate_rewards, trainer._generate_and_score_completions

    def rewards_spy(*a, **kw):
        seen.append({"rewards": real_rewards(*a, **kw)})
        return seen[-1]["rewards"]

    def score_spy(*a, **kw):
        out = real_score(*a, **kw)
        seen[-1]["advantages"] = out["advantages"].detach().clone()
        return out

    trainer._calculate_rewards, trainer._generate_and_score_completions = rewards_spy, score_spy
    trainer.train()
    assert seen
    for batch in seen:
        r = batch["rewards"].double()  # (B, 2) TRL's rewards_per_func
        ids = torch.arange(r.shape[0]) // G
        ours = group_advantages(r, ids, scale="gdpo", reward_weights=torch.tensor([1.0, 0.5], dtype=torch.float64))
        torch.testing.assert_close(ours, batch["advantages"].double(), rtol=1e-5, atol=1e-6)
    assert any(float(batch["advantages"].abs().max()) > 0.1 for batch in seen)  # a comparison of signal, not of zeros
