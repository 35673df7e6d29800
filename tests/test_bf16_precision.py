"""benchmarks/bf16_precision.py: its figures on hand-made tensors, its loss against the loss core's on the tiny offline
model, its whole run on that model (the JSON it writes), and its refusals as one line each."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from script_modules import load_script

from dfpo.core.loss import policy_loss
from dfpo.trainer.config import load_config
from dfpo.trainer.forward import completion_logprobs

sys.path.insert(0, str(Path(__file__).parent / "trainer"))
from tiny_run import FORMAT_REWARD_SETS, TINY_MODEL_SETS  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

bench = load_script("benchmarks/bf16_precision.py", "bf16_precision_bench")

TINY_SETS = [
    *TINY_MODEL_SETS,
    *FORMAT_REWARD_SETS,
    "data.train_size=50",
    "data.eval_size=4",
    "rollout.prompts_per_step=2",
    "rollout.group_size=4",
    "rollout.max_new_tokens=6",
    "optim.minibatch_groups=1",
]
"""The tiny offline model of the trainer's tests, 2 prompts x 4 completions, one group per micro-batch."""
BAND = {"eps_low": 3e-4, "eps_high": 4e-4}


# ------------------------------------------------------------------------------------------------------ the figures


def test_ratio_stats_reads_token_and_sequence_deviation_and_the_clip_band():
    mask = torch.tensor([[True, True, False], [True, True, True], [False, False, False]])  # (3, 3): the last row empty
    old = torch.full((3, 3), -1.0)
    new = old.clone()
    new[0, :2] += math.log(1 + 5e-4)  # row 0: s = 1 + 5e-4, above the band
    new[1, 0] += math.log(1 - 3e-4)  # row 1: one token at 1 - 3e-4, s = (1 - 3e-4)^(1/3), inside
    new[0, 2] = 5.0  # padding: never read
    r = bench.ratio_stats(new, old, mask, **BAND)
    assert r["sequences"] == 2 and r["seq_outside_band"] == 1 and r["seq_outside_band_share"] == 0.5
    assert r["token_max_abs_dev"] == pytest.approx(5e-4, rel=1e-3)
    assert r["seq_max_abs_dev"] == pytest.approx(5e-4, rel=1e-3)
    assert r["token_exactly_1_share"] == pytest.approx(2 / 5)  # row 1's last two tokens


@given(d=st.floats(-2e-3, 2e-3), length=st.integers(1, 6))
def test_a_constant_log_ratio_d_is_a_sequence_ratio_exp_d_outside_the_band_exactly_when_exp_d_is(d, length):
    """Invariant: shifting every real token's log-prob of a row by d gives it the sequence ratio exp(d), which counts as
    outside the clip band exactly when exp(d) lies outside [1 - eps_low, 1 + eps_high]."""
    mask = torch.zeros(1, 6, dtype=torch.bool)
    mask[0, :length] = True
    old = torch.linspace(-3.0, -0.5, 6, dtype=torch.float64)[None]  # (1, 6)
    r = bench.ratio_stats(old + d, old, mask, **BAND)
    s = math.exp(d)
    assert r["seq_max_abs_dev"] == pytest.approx(abs(s - 1), rel=1e-6, abs=1e-12)
    margin = 1e-9  # float rounding decides exactly at the edge
    if s < 1 - BAND["eps_low"] - margin or s > 1 + BAND["eps_high"] + margin:
        assert r["seq_outside_band"] == 1
    elif 1 - BAND["eps_low"] + margin < s < 1 + BAND["eps_high"] - margin:
        assert r["seq_outside_band"] == 0


def test_grad_agreement_cosine_and_relative_errors():
    ref = [torch.tensor([3.0, 0.0]), torch.tensor([[4.0]])]  # |g| = 5
    same = bench.grad_agreement(ref, ref)
    assert same["cosine"] == pytest.approx(1.0) and same["norm_rel_error"] == 0 and same["diff_rel_error"] == 0
    double = bench.grad_agreement([2 * g for g in ref], ref)
    assert double["cosine"] == pytest.approx(1.0) and double["norm_rel_error"] == pytest.approx(1.0)
    assert double["diff_rel_error"] == pytest.approx(1.0)
    ortho = bench.grad_agreement([torch.tensor([0.0, 5.0]), torch.tensor([[0.0]])], ref)
    assert ortho["cosine"] == pytest.approx(0.0) and ortho["norm_rel_error"] == pytest.approx(0.0)
    assert ortho["diff_rel_error"] == pytest.approx(math.sqrt(2))
    zero = bench.grad_agreement(ref, [torch.zeros(2), torch.zeros(1, 1)])
    assert zero["cosine"] is None and zero["norm_rel_error"] is None


def test_loss_error_is_relative_to_the_reference_and_to_the_mean_advantage():
    assert bench.loss_error(0.5, 0.4, 0.2) == pytest.approx(
        {"value": 0.5, "abs_error": 0.1, "rel_error": 0.25, "error_per_mean_abs_adv": 0.5}
    )
    zero = bench.loss_error(1e-8, 0.0, 0.0)
    assert zero["rel_error"] is None and zero["error_per_mean_abs_adv"] is None


def test_cpuinfo_model_and_bf16_flags():
    text = "processor\t: 0\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu avx512f avx512_bf16 sse\n\nprocessor\t: 1\nflags\t: fpu\n"
    assert bench.cpu_model(text) == "AMD EPYC 9R14"
    assert bench.bf16_flags(text) == ["avx512_bf16"]
    assert bench.bf16_flags("flags : fpu sse\n") == [] and bench.cpu_model("") == ""


def test_group_rows_cuts_whole_groups():
    ids = torch.tensor([0, 0, 1, 1, 2, 2])
    assert [r.tolist() for r in bench.group_rows(ids, 2)] == [[0, 1, 2, 3], [4, 5]]


# ------------------------------------------------------------------------------------------------------ the tiny model


@pytest.fixture(scope="module")
def fixed(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bf16")
    cfg = load_config(None, [*TINY_SETS, *bench.FIXED_SETS, f"run_dir={folder / 'run'}", "threads=1"])
    return bench.fixed_rollout(cfg, bench.check_labels(["gspo", "dfpo_min:stopgrad=score"]))


@pytest.mark.parametrize("label", ["gspo", "dfpo_min:stopgrad=score"])
@pytest.mark.parametrize("amp", [None, torch.bfloat16])
def test_the_accumulated_loss_is_the_loss_cores_loss_of_the_whole_batch(fixed, label, amp):
    """The micro-batches' losses with their accumulation weights equal one ``policy_loss`` call on the whole batch
    (float32 forward); under autocast the bf16 forward's loss stays within bf16's rounding of it."""
    old = bench.old_logprobs(fixed, None)  # (B, T)
    got = bench.scored(fixed, label, old, amp)
    b = fixed.batch
    with torch.no_grad():
        logp = completion_logprobs(fixed.model, b, "cpu", None, with_entropy=False).logp  # (B, T)
        want, _ = policy_loss(
            fixed.specs[label], logp=logp, old_logp=old, advantages=fixed.advantages[label], mask=b.mask, group_ids=b.group_ids
        )
    scale = float(fixed.advantages[label].abs().mean())
    tol = 1e-6 if amp is None else 2e-2
    assert abs(got.loss - float(want)) <= tol * max(scale, 1e-3), (got.loss, float(want))
    assert any(float(g.abs().sum()) > 0 for g in got.grads) or scale == 0
    assert all(p.grad is None for p in fixed.model.parameters())  # the gradients are read off, the model left clean


def test_a_run_on_the_tiny_model_writes_every_figure(tmp_path, capsys):
    out = tmp_path / "p.json"
    sets = [x for s in TINY_SETS for x in ("--set", s)]
    assert bench.main(["--config", "", "--out", str(out), *sets]) == 0
    printed = capsys.readouterr().out
    assert "seq outside band" in printed and "grad cosine" in printed and "|dL|/mean|A|" in printed
    r = json.loads(out.read_text())
    assert r["threads"] == 1 and r["torch"] == torch.__version__ and r["issue"] == 59
    assert set(r["ratio"]) == {"float32", "bf16", "mixed", "sampler_float32", "sampler_mixed"}
    assert r["work"]["prompts"] == 2 and r["work"]["group_size"] == 4 and r["ratio"]["float32"]["sequences"] == 8
    assert r["ratio"]["float32"]["token_max_abs_dev"] < 1e-5  # float32 against float32: round-off at most
    assert r["ratio"]["mixed"]["token_max_abs_dev"] > r["ratio"]["float32"]["token_max_abs_dev"]  # bf16 is read
    for label in ("gspo", "dfpo_min:stopgrad=score"):
        assert set(r["loss"][label]) == set(r["gradient"][label]) == {"float32", "bf16", "mixed"}
        assert r["gradient"][label]["float32"]["cosine"] == pytest.approx(1.0)
        for g in r["gradient"][label].values():
            assert g["cosine"] is None or -1 - 1e-9 <= g["cosine"] <= 1 + 1e-9
            assert all(v is None or math.isfinite(v) for v in g.values())
        assert "clip/frac_low" in r["loss"][label]["bf16"]["clip"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--objectives", "gspo,nonsense"], "'nonsense' is not an objective label"),
        (["--objectives", " , "], "--objectives is empty"),
        (["--threads", "0"], "--threads 0"),
    ],
)
def test_bad_arguments_are_one_line_before_any_model(args, says, capsys):
    assert bench.main([*args, "--out", ""]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1 and err.startswith("bf16_precision: ")


def test_an_out_path_that_is_a_folder_is_one_line(tmp_path, capsys):
    assert bench.main(["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"--out {tmp_path} is a folder" in err and len(err.splitlines()) == 1
