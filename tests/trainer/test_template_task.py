"""The sum_template task (issue 58): answers that restate the problem before the result, so whole groups share tokens;
its eval split fixed by data.eval_seed; the learning tax at the template's teacher-forced positions (eval/template_kl,
Prop. 3.1) beside the prompt-position proxy (eval/tax_kl); the greedy low-noise evaluation (eval.greedy)."""

from __future__ import annotations

import json
import math
import random
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_run import FORMAT_REWARD_SETS, TEMPLATE_TASK_SETS

from dfpo.trainer.config import apply_overrides, config_from_dict, load_config
from dfpo.trainer.rewards.compute import correctness_fn
from dfpo.trainer.run.layout import RunDir
from dfpo.trainer.stages import tax
from dfpo.trainer.tasks import (
    answer_template,
    in_template,
    load_splits,
    sft_target,
    sum_example,
    sum_template_example,
    surface_form_shares,
    template_answer,
    template_share,
)

pytestmark = pytest.mark.usefixtures("one_thread")

# -- the task --------------------------------------------------------------------------------------------------------


def test_the_prompt_asks_for_the_equation_and_the_target_restates_it():
    ex = sum_template_example((12, 7, 30))
    assert ex.prompt == "What is 12 + 7 + 30? First write the sum as an equation, then the result."
    assert ex.answer == "49"
    assert answer_template(ex) == "12 + 7 + 30 = "
    assert template_answer(ex) == "12 + 7 + 30 = 49"
    assert sft_target("sum_template")(ex, random.Random(0)) == "12 + 7 + 30 = 49"
    assert sft_target("sum")(sum_example((12, 7, 30)), random.Random(0)) == "49"  # the sum task's target is unchanged


def test_the_reward_scores_the_result_after_the_template():
    score = correctness_fn("auto", "sum_template")
    ex = sum_template_example((1, 2, 3))
    assert score(ex.prompt, "1 + 2 + 3 = 6", ex) == 1.0
    assert score(ex.prompt, "1 + 2 + 3 = 7", ex) == 0.0
    assert score(ex.prompt, "1 + 2 + 3", ex) == 0.0  # the restated problem alone ends in 3, not 6


@pytest.mark.parametrize(
    "completion, restates",
    [
        ("1 + 2 + 3 = 6", True),
        ("  1+2+3=7 and more", True),  # right or wrong, spacing free
        ("1 + 2 + 3 = -1", True),
        ("6", False),
        ("3 + 2 + 1 = 6", False),  # the operands in another order
        ("The sum is 1 + 2 + 3 = 6", False),
        ("1 + 2 + 34 = 37", False),
        ("11 + 2 + 3 = 16", False),
        ("1 + 2 + 3 =", False),  # no result
    ],
)
def test_in_template(completion, restates):
    assert in_template(completion, sum_template_example((1, 2, 3))) is restates


def test_forms_of_a_step_add_the_template_share_for_the_template_task_only():
    exs = [sum_template_example((1, 2, 3))] * 4
    texts = ["1 + 2 + 3 = 6", "1 + 2 + 3 = 5", "6", "hello"]
    forms = surface_form_shares("sum_template", texts, exs)
    assert forms["forms/template"] == 0.5
    assert forms["forms/equation"] == 0.25 and forms["forms/number"] == 0.25 and forms["forms/wrong"] == 0.5
    assert "forms/template" not in surface_form_shares("sum", texts, [sum_example((1, 2, 3))] * 4)
    assert template_share("sum", texts, exs) is None and template_share("sum_template", [], []) is None


def _data(*sets):
    return config_from_dict(apply_overrides({}, ["data.task=sum_template", "data.operands=3", "data.max_operand=9", *sets])).data


def test_three_operands_give_1000_problems_and_train_never_holds_an_eval_problem():
    train, evals = load_splits(_data("data.eval_size=128", "data.train_size=20000"), seed=0)
    assert len(evals) == len({tuple(e.meta["operands"]) for e in evals}) == 128
    assert not {tuple(e.meta["operands"]) for e in train} & {tuple(e.meta["operands"]) for e in evals}
    assert len({tuple(e.meta["operands"]) for e in train}) == 1000 - 128  # 20000 draws cover the rest
    with pytest.raises(ValueError, match="data.eval_size=1000 must be below the 1000 distinct problems"):
        load_splits(_data("data.eval_size=1000"), seed=0)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
def test_a_fixed_eval_seed_holds_out_the_same_problems_whatever_the_run_seed(a, b):
    """With data.eval_seed set, runs of every seed hold out one set of problems, and none of them is a train problem
    of any seed (what lets a warm-up from its own seed serve every cell)."""
    data = _data("data.eval_size=32", "data.train_size=200", "data.eval_seed=5")
    train_a, evals_a = load_splits(data, a)
    train_b, evals_b = load_splits(data, b)
    assert [e.prompt for e in evals_a] == [e.prompt for e in evals_b]
    assert not {e.prompt for e in train_b} & {e.prompt for e in evals_a}


def test_without_an_eval_seed_the_held_out_problems_follow_the_run_seed_as_before():
    data = _data("data.eval_size=32")
    assert [e.prompt for e in load_splits(data, 0)[1]] != [e.prompt for e in load_splits(data, 1)[1]]


def test_the_shipped_config_reads_and_holds_out_128_problems():
    cfg = load_config("configs/smollm2-template.toml")
    assert cfg.data.task == "sum_template" and cfg.data.eval_size == 128 and cfg.data.eval_seed >= 0 and cfg.eval.greedy
    assert (cfg.warmup.steps, cfg.warmup.batch_size, cfg.warmup.lr) == (20, 8, 2e-5)
    assert cfg.optim.epochs * cfg.rollout.prompts_per_step / cfg.optim.minibatch_groups == 4  # the pilot's K


# -- the template's teacher-forced positions -------------------------------------------------------------------------


class _OffsetTokenizer:
    """A tokenizer that joins a space to the digit after it, as some BPE vocabularies do: "1 + 2 = 3" ->
    "1", " +", " 2", " =", " 3"."""

    def __call__(self, text, add_special_tokens=False, return_offsets_mapping=False):
        import re

        spans = [m.span() for m in re.finditer(r" ?\S", text)]
        return SimpleNamespace(input_ids=[ord(text[e - 1]) for _, e in spans], offset_mapping=spans)


def test_the_template_tokens_are_the_answer_tokens_that_end_within_the_template():
    """With a tokenizer that joins the space before the result to the result's first digit, the template's trailing
    space belongs to the result: it is not a template position."""
    assert tax.template_ids(_OffsetTokenizer(), ["1 + 2 = "], ["1 + 2 = 3"]) == [[ord("1"), ord("+"), ord("2"), ord("=")]]
    from dfpo.trainer.policy import build_char_tokenizer

    tok = build_char_tokenizer()
    ids = tax.template_ids(tok, ["1 + 2 = "], ["1 + 2 = 3"])
    assert tok.decode(ids[0]) == "1 + 2 = "  # one character a token: every character of the template


def test_template_positions_are_the_ones_that_predict_the_template_tokens():
    where = tax.template_positions([[5, 6, 7], [8, 9]], [[1, 2], [3, 4, 4]])
    assert where.sequences == [[5, 6, 7, 1, 2], [8, 9, 3, 4, 4]]
    assert where.spans == [(2, 4), (1, 4)]  # position P - 1 predicts the template's first token
    assert tax.prompt_positions([[5, 6, 7]]).spans == [(0, 2)]


def test_the_batched_log_probs_at_the_positions_equal_one_sequence_at_a_time():
    """position_logp (right padding, several sequences a forward) against the slow reference: each sequence alone,
    its positions' log-softmax read off."""
    from dfpo.trainer.config import ModelConfig
    from dfpo.trainer.policy import build_char_tokenizer, build_tiny_model

    tok = build_char_tokenizer()
    model = build_tiny_model(ModelConfig(tiny_hidden=32, tiny_layers=1, tiny_heads=2, tiny_intermediate=64), tok, seed=0)
    prompts = [tok(p, add_special_tokens=False).input_ids for p in ("What is 1 + 2?", "2+2?", "What is 10 + 20 + 3?")]
    templates = tax.template_ids(tok, ["1 + 2 = ", "2 + 2 = ", "10 + 20 + 3 = "], ["1 + 2 = 3", "2 + 2 = 4", "10 + 20 + 3 = 33"])
    where = tax.template_positions(prompts, templates)
    fast = torch.cat(list(tax.position_logp(model, where, torch.device("cpu"), batch_prompts=2)))
    slow = []
    with torch.no_grad():
        for seq, (start, stop) in zip(where.sequences, where.spans):
            logits = model(input_ids=torch.tensor([seq])).logits[0]  # (L, V)
            slow.append(torch.log_softmax(logits.float(), -1)[start:stop])
    torch.testing.assert_close(fast, torch.cat(slow), rtol=1e-5, atol=1e-5)
    assert fast.shape[0] == sum(len(t) for t in templates)


def test_an_older_reference_file_without_the_template_says_so_in_one_sentence(tmp_path):
    ref = tax.TaxReference(torch.tensor([[3, 1]]), torch.tensor([[-0.1, -2.5]]), torch.tensor([-3.0]), "x")
    path = tmp_path / tax.TAX_REFERENCE
    tax.save_reference(ref, path)
    assert "holds no reference at the template's positions" in tax.load_reference(path, tax.TEMPLATE_PREFIX)
    tax.save_reference(ref, path, template=tax.TaxReference(ref.top_ids, ref.top_logp - 1, ref.rest_logp, "y"))
    back = tax.load_reference(path, tax.TEMPLATE_PREFIX)
    assert back.prompts_sha256 == "y" and torch.equal(back.top_logp, ref.top_logp - 1)
    assert tax.load_reference(path).prompts_sha256 == "x"


# -- a tiny run ------------------------------------------------------------------------------------------------------

SETS = [
    *TEMPLATE_TASK_SETS,
    "rollout.prompts_per_step=2",
    "rollout.group_size=4",
    "rollout.max_new_tokens=6",
    *FORMAT_REWARD_SETS,
    "optim.lr=1e-2",
    "optim.warmup_ratio=0",
    "optim.min_lr_ratio=1",
    "optim.minibatch_groups=1",
    "train.save_every=1",
    "eval.k=2",
    "log.tensorboard=false",
    "log.progress=false",
    "threads=1",
]


def _run(tmp_path, name: str, *extra: str) -> list[dict]:
    from dfpo.trainer.train import Trainer

    run = tmp_path / name
    cfg = config_from_dict(apply_overrides({}, [*SETS, f'run_dir="{run}"', *extra]))
    Trainer(cfg, quiet=True).run()
    return [json.loads(line) for line in (run / RunDir.EVALS).read_text().splitlines()]


def test_a_template_run_logs_both_taxes_the_template_share_and_the_greedy_eval_at_the_ends_only(tmp_path):
    """eval/template_kl and eval/tax_kl are 0 at step 0 (the same forward pass) and finite later, the template KL
    grows once trained; eval/template is a share; eval.greedy adds eval/greedy_acc and eval/greedy_template at step 0
    and at the last step, not at the evaluation between."""
    rows = _run(tmp_path, "run", "train.steps=4", "eval.every=2", "eval.greedy=true")
    assert [r["step"] for r in rows] == [0, 2, 4]
    first, middle, last = rows
    assert first["eval/tax_kl"] == 0.0 and first["eval/template_kl"] == 0.0
    assert last["eval/template_kl"] > 0 and math.isfinite(last["eval/tax_kl"])
    for r in rows:
        assert 0.0 <= r["eval/template"] <= 1.0
    for r in (first, last):
        assert 0.0 <= r["eval/greedy_acc"] <= 1.0 and 0.0 <= r["eval/greedy_template"] <= 1.0
    assert "eval/greedy_acc" not in middle


def test_the_greedy_eval_changes_nothing_the_training_draws(tmp_path):
    """Greedy decoding draws no random numbers: the training metrics of a run are the same with eval.greedy on or off."""

    def metrics(run):
        return [
            {k: v for k, v in json.loads(line).items() if not k.startswith("time/")}
            for line in (run / RunDir.METRICS).read_text().splitlines()
        ]

    _run(tmp_path, "on", "train.steps=2", "eval.every=1", "eval.greedy=true")
    _run(tmp_path, "off", "train.steps=2", "eval.every=1")
    assert metrics(tmp_path / "on") == metrics(tmp_path / "off")


def test_the_greedy_accuracy_is_the_accuracy_of_the_models_own_greedy_decode(tmp_path):
    """At step 0 eval/greedy_acc equals the share correct of transformers' generate(do_sample=False) on the eval
    prompts of the same model (the tiny preset's warm start, task add, where some answers are right)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dfpo.trainer.tasks import last_int_correct

    sets = [s for s in SETS if not s.startswith(("data.task", "data.operands", "rollout.max_new_tokens", "model.sft_steps"))]
    run = tmp_path / "add"
    cfg = config_from_dict(
        apply_overrides(
            {},
            [*sets, "data.task=add", "model.sft_steps=80", "model.sft_batch_size=16", "model.sft_lr=1e-2", "data.eval_size=16", "rollout.max_new_tokens=3", "eval.greedy=true",
             "train.steps=1", "eval.every=1", f'run_dir="{run}"'],
        )
    )  # fmt: skip
    from dfpo.trainer.train import Trainer

    Trainer(cfg, quiet=True).run()
    got = json.loads((run / RunDir.EVALS).read_text().splitlines()[0])["eval/greedy_acc"]
    model, tok = AutoModelForCausalLM.from_pretrained(run / "init_model"), AutoTokenizer.from_pretrained(run / "init_model")
    _, evals = load_splits(cfg.data, cfg.seed)
    right = 0
    for ex in evals:
        ids = torch.tensor([tok(ex.prompt, add_special_tokens=False).input_ids])
        out = model.generate(ids, max_new_tokens=3, do_sample=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        right += last_int_correct(tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True), ex.answer)
    assert got == right / len(evals) and right > 0, (got, right)


def test_a_resumed_template_run_measures_against_the_same_pi_init_and_an_older_file_leaves_only_the_template_kl_out(tmp_path, capsys):
    from dfpo.cli import main

    rows = _run(tmp_path, "whole", "train.steps=2", "eval.every=1")
    _run(tmp_path, "parts", "train.steps=1", "eval.every=1")
    assert main(["train", "--quiet", "--resume", str(tmp_path / "parts"), "--set", "train.steps=2"]) == 0
    resumed = {r["step"]: r for r in map(json.loads, (tmp_path / "parts" / RunDir.EVALS).read_text().splitlines())}
    assert resumed[2]["eval/template_kl"] == pytest.approx(rows[2]["eval/template_kl"], rel=1e-6, abs=1e-12) and rows[2]["step"] == 2
    # a reference file of a run from before eval/template_kl: the proxy goes on, the template KL is left out, once said
    path = tmp_path / "parts" / tax.TAX_REFERENCE
    data = torch.load(path, weights_only=True)
    torch.save({k: v for k, v in data.items() if not k.startswith(tax.TEMPLATE_PREFIX)}, path)
    capsys.readouterr()
    assert main(["train", "--quiet", "--resume", str(tmp_path / "parts"), "--set", "train.steps=3"]) == 0
    last = json.loads((tmp_path / "parts" / RunDir.EVALS).read_text().splitlines()[-1])
    assert "eval/tax_kl" in last and "eval/template_kl" not in last
    said = [line for line in capsys.readouterr().err.splitlines() if "template_kl" in line]
    assert said == [
        f"dfpo: warning: eval/template_kl is not logged: {path} holds no reference at the template's positions (written before eval/template_kl was logged)"
    ]
