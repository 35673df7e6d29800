"""eval/tax_kl (paper Prop. 3.1's learning tax): KL(pi_init || pi_now) at the eval prompts' own positions, its top-k
coarsening, and a tiny run: 0 at step 0, > 0 once trained, and a resumed run measuring against the same pi_init."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_run import FORMAT_REWARD_SETS, TINY_MODEL_SETS

from dfpo.trainer.run.layout import RunDir
from dfpo.trainer.stages import tax


def _full_kl(p_logp: torch.Tensor, q_logp: torch.Tensor) -> torch.Tensor:
    return (p_logp.exp() * (p_logp - q_logp)).sum(-1)


def _coarse(ref: torch.Tensor, now: torch.Tensor, k: int) -> torch.Tensor:
    top_logp, top_ids = ref.topk(k, dim=-1)
    return tax.coarse_kl(top_logp, tax.rest_logp(ref, top_ids), top_ids, now)


@settings(max_examples=80, deadline=None)
@given(st.integers(2, 12), st.integers(1, 12), st.integers(0, 2**31 - 1))
def test_the_coarsened_kl_is_the_full_kl_with_k_covering_the_vocabulary_and_at_most_it_otherwise(V, k, seed):
    """KL over pi_init's top-k tokens plus one bin for the rest: equal to the full KL when k >= V, never above it
    (the log-sum inequality), 0 between a distribution and itself."""
    gen = torch.Generator().manual_seed(seed)
    ref = torch.log_softmax(3 * torch.randn(5, V, generator=gen, dtype=torch.float64), -1)  # (5, V)
    now = torch.log_softmax(3 * torch.randn(5, V, generator=gen, dtype=torch.float64), -1)
    full = _full_kl(ref, now)
    coarse = _coarse(ref, now, min(k, V))
    if k >= V:
        torch.testing.assert_close(coarse, full, rtol=1e-9, atol=1e-12)
    assert bool((coarse <= full + 1e-12).all()) and bool((coarse >= -1e-12).all())
    assert bool((_coarse(ref, ref, min(k, V)) == 0).all())


def test_a_damaged_or_foreign_reference_is_one_sentence_not_a_crash(tmp_path):
    path = tmp_path / tax.TAX_REFERENCE
    assert "is missing" in tax.load_reference(path)
    path.write_bytes(b"not a torch file")
    assert "cannot be read as a tax reference" in tax.load_reference(path)
    torch.save(
        {"top_ids": torch.zeros(3, 2, dtype=torch.long), "top_logp": torch.zeros(3, 5), "rest_logp": torch.zeros(3), "prompts_sha256": "x"},
        path,
    )
    assert "inconsistent shapes" in tax.load_reference(path)


def test_the_reference_is_written_atomically_and_read_back_as_it_was(tmp_path):
    ref = tax.TaxReference(torch.tensor([[3, 1]]), torch.tensor([[-0.1, -2.5]]), torch.tensor([-3.0]), tax.prompts_digest([[1, 2]]))
    tax.save_reference(ref, tmp_path / tax.TAX_REFERENCE)
    assert [p.name for p in tmp_path.iterdir()] == [tax.TAX_REFERENCE]  # no temporary file left beside it
    back = tax.load_reference(tmp_path / tax.TAX_REFERENCE)
    assert back.prompts_sha256 == ref.prompts_sha256
    for name in ("top_ids", "top_logp", "rest_logp"):
        assert torch.equal(getattr(back, name), getattr(ref, name))


SETS = [
    *TINY_MODEL_SETS,
    "data.train_size=40",
    "data.eval_size=4",
    "rollout.prompts_per_step=2",
    "rollout.group_size=4",
    "rollout.max_new_tokens=3",
    *FORMAT_REWARD_SETS,
    "optim.lr=1e-2",
    "optim.warmup_ratio=0",
    "optim.min_lr_ratio=1",  # a constant learning rate: 2 steps resumed to 4 are the 4 steps of one run
    "optim.minibatch_groups=1",
    "train.save_every=1",
    "eval.every=1",
    "eval.k=1",
    "log.tensorboard=false",
    "log.progress=false",
    "threads=1",
]


def _train(args: list[str]) -> None:
    from dfpo.cli import main

    assert main(["train", "--quiet", *args]) == 0


def _start(tmp_path, run, steps: int) -> None:
    config = tmp_path / "c.toml"
    config.write_text("")
    sets = []
    for s in [*SETS, f"train.steps={steps}", f"run_dir={run}"]:
        sets += ["--set", s]
    _train(["--config", str(config), *sets])


def _tax(run) -> dict[int, float]:
    return {r["step"]: r.get("eval/tax_kl") for r in map(json.loads, (run / RunDir.EVALS).read_text().splitlines())}


def test_tax_kl_is_0_at_step_0_grows_with_training_and_a_resumed_run_continues_it(tmp_path):
    """On the tiny model (a vocabulary under TOP_K: the full KL): exactly 0 at step 0, > 0 after training, and a run
    stopped at step 2 and resumed to 4 logs what a run of 4 steps logs (the same pi_init, read from the run folder)."""
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    _start(tmp_path, whole, 4)
    _start(tmp_path, parts, 2)
    assert (parts / tax.TAX_REFERENCE).is_file()
    _train(["--resume", str(parts), "--set", "train.steps=4"])
    got, want = _tax(parts), _tax(whole)
    assert want[0] == 0.0 and all(v is not None and math.isfinite(v) for v in want.values())
    assert want[4] > 0
    assert sorted(want) == [0, 1, 2, 3, 4]
    for step in (3, 4):  # evaluated after the resume
        assert got[step] == pytest.approx(want[step], rel=1e-6, abs=1e-12)


def test_a_resumed_run_without_its_reference_leaves_tax_kl_out(tmp_path):
    """A run folder from before eval/tax_kl (no reference file): the resumed run's evals carry no tax_kl, and it runs."""
    run = tmp_path / "run"
    _start(tmp_path, run, 1)
    (run / tax.TAX_REFERENCE).unlink()
    _train(["--resume", str(run), "--set", "train.steps=2"])
    rows = _tax(run)
    assert rows[0] == 0.0 and rows[2] is None


# -- the trainer's side: either engine, and a missing reference said once --------------------------------------------


class _VLLMStandIn:
    """Stands in for ``VLLMEngine`` (vLLM is not installed here): started from the model folder, as vLLM is, it samples
    from its own copy of the weights (the HF engine on a model loaded from that folder) and holds no ``.model``, so
    the rollout stage cannot find the policy through it."""

    def __init__(self, folder, *, eos_ids, device, seed, max_model_len):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from dfpo.trainer.sampler import HFGenerateEngine

        self._hf = HFGenerateEngine(
            AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder).pad_token_id, eos_ids
        )

    def sample(self, prompt_ids, n, params, seeds=None):
        return self._hf.sample(prompt_ids, n, params)

    def generate(self, prompt_ids, n, params):
        return self.sample(prompt_ids, n, params).tokens

    def sync_weights(self, model) -> None:
        self._hf.model.load_state_dict(model.state_dict())


def test_with_the_vllm_engine_the_rollout_stage_scores_the_policy_and_logs_tax_kl(tmp_path, monkeypatch):
    """rollout.engine = 'vllm' (a stand-in with no .model): the trainer hands RolloutStage the policy itself, so the
    meter scores the trained model and eval/tax_kl is logged at every eval (0 at step 0)."""
    from dfpo.trainer import train as train_mod
    from dfpo.trainer.config import apply_overrides, config_from_dict

    monkeypatch.setattr(train_mod, "check_vllm_available", lambda device: None)
    monkeypatch.setattr(train_mod, "VLLMEngine", _VLLMStandIn)
    run = tmp_path / "run"
    cfg = config_from_dict(apply_overrides({}, [*SETS, "rollout.engine=vllm", "train.steps=1", f'run_dir="{run}"']))
    trainer = train_mod.Trainer(cfg, quiet=True)
    assert isinstance(trainer.rollout_stage.engine, _VLLMStandIn) and not hasattr(trainer.rollout_stage.engine, "model")
    assert trainer.rollout_stage.tax is not None and trainer.rollout_stage.tax.model is trainer.model
    trainer.run()
    got = _tax(run)
    assert sorted(got) == [0, 1] and got[0] == 0.0 and math.isfinite(got[1])


def test_a_resumed_run_without_its_reference_says_why_once_on_stderr(tmp_path, capsys):
    """The reason eval/tax_kl is left out is one ``dfpo: warning:`` line, printed once however many evals follow
    (with --quiet too)."""
    run = tmp_path / "run"
    _start(tmp_path, run, 1)
    (run / tax.TAX_REFERENCE).unlink()
    capsys.readouterr()
    _train(["--resume", str(run), "--set", "train.steps=3"])  # evals at steps 2 and 3
    warnings = [line for line in capsys.readouterr().err.splitlines() if "tax_kl" in line]
    assert warnings == [
        f"dfpo: warning: eval/tax_kl is not logged: {run / tax.TAX_REFERENCE} is missing (the run began before eval/tax_kl was logged, or the file was removed)"
    ]
    assert _tax(run)[3] is None


@pytest.mark.parametrize("silent, printed", [(False, True), (True, False)])
def test_the_missing_reference_warning_is_not_printed_with_silent(capsys, silent, printed):
    from types import SimpleNamespace

    from dfpo.trainer.train import Trainer

    meter = SimpleNamespace(unavailable="eval/tax_kl is not logged: x is missing")
    fake = SimpleNamespace(rollout_stage=SimpleNamespace(tax=meter), silent=silent, _tax_warned=False)
    Trainer._warn_tax_unavailable(fake)
    Trainer._warn_tax_unavailable(fake)
    err = capsys.readouterr().err
    assert err == ("dfpo: warning: eval/tax_kl is not logged: x is missing\n" if printed else "")
