"""The HF sampling engine: rows leave the batch at EOS, and the log-probs it returns are pi_rollout's."""

import pytest
import torch

from dfpo.trainer.config import ModelConfig
from dfpo.trainer.forward import completion_logprobs
from dfpo.trainer.layout import RunDir
from dfpo.trainer.policy import build_char_tokenizer, build_tiny_model
from dfpo.trainer.rollout import HFGenerateEngine, SamplingParams, build_batch, sampler_logp
from dfpo.trainer.stage_old_logp import mismatch_metrics

pytestmark = pytest.mark.usefixtures("one_thread")


def _stopping_model():
    """A tiny model whose EOS logit is raised, so completions end at varying lengths."""
    tok = build_char_tokenizer()
    model = build_tiny_model(ModelConfig(tiny_hidden=32, tiny_layers=2, tiny_heads=2, tiny_intermediate=64), tok, seed=1)
    with torch.no_grad():
        ids = tok(["12+34=", "7+8="], padding=True, return_tensors="pt")
        h = model.model(**ids).last_hidden_state.mean((0, 1))
        model.lm_head.weight[tok.eos_token_id] += 2.5 * h / h.norm() ** 2
    return model, tok


def _prompts(tok):
    return [tok(text, add_special_tokens=False).input_ids for text in ("12+34=", "7+8=", "100+1=")]  # different lengths


def test_sampler_log_probs_are_the_policy_log_probs_of_the_tokens_it_sampled():
    """Float32 sampling at temperature 1 from the trainer's model: sampler log-probs and entropies equal a
    separate forward pass to float round-off, at varying lengths (finished rows left the KV cache)."""
    model, tok = _stopping_model()
    engine = HFGenerateEngine(model, tok.pad_token_id, {tok.eos_token_id})
    torch.manual_seed(0)
    samples = engine.sample(_prompts(tok), 6, SamplingParams(max_new_tokens=12))
    lengths = {len(t) for t in samples.tokens}
    assert len(lengths) > 2, lengths  # the compaction path is exercised
    batch = build_batch(_prompts(tok), samples.tokens, 6, pad_id=tok.pad_token_id, eos_ids={tok.eos_token_id}, max_new_tokens=12)
    logp, entropy = sampler_logp(samples, batch.mask.shape[1])
    with torch.no_grad():
        scores = completion_logprobs(model, batch, "cpu")
    torch.testing.assert_close(logp, scores.logp, rtol=0, atol=1e-5)
    torch.testing.assert_close(entropy, scores.entropy, rtol=0, atol=1e-5)
    m = mismatch_metrics(logp, scores.logp, batch.mask)
    assert m["rollout/logp_gap_max"] < 1e-5 and abs(m["rollout/k3_kl"]) < 1e-9


def test_every_completion_stops_at_its_first_eos_or_the_limit():
    model, tok = _stopping_model()
    engine = HFGenerateEngine(model, tok.pad_token_id, {tok.eos_token_id})
    torch.manual_seed(1)
    for tokens in engine.generate(_prompts(tok), 8, SamplingParams(max_new_tokens=10)):
        assert 1 <= len(tokens) <= 10
        assert tok.eos_token_id not in tokens[:-1]
        assert tokens[-1] == tok.eos_token_id or len(tokens) == 10


def test_top_k_one_is_greedy_with_log_prob_zero():
    """transformers' top-k warper with k = 1 leaves one token: the argmax of the policy, sampled with probability 1."""
    model, tok = _stopping_model()
    engine = HFGenerateEngine(model, tok.pad_token_id, {tok.eos_token_id})
    samples = engine.sample(_prompts(tok)[:1], 2, SamplingParams(max_new_tokens=5, top_k=1))
    assert samples.tokens[0] == samples.tokens[1]
    assert all(lp == 0.0 for lp in samples.logprobs[0])
    batch = build_batch(_prompts(tok)[:1], samples.tokens[:1], 1, pad_id=tok.pad_token_id, eos_ids={tok.eos_token_id}, max_new_tokens=5)
    from dfpo.trainer.rollout import completion_logits

    with torch.no_grad():
        greedy = completion_logits(model, batch, "cpu").argmax(-1)[0, : len(samples.tokens[0])]
    assert greedy.tolist() == samples.tokens[0]


def test_tempered_sampling_recomputes_old_log_probs_and_logs_the_gap(tmp_path):
    """At temperature 0.7 pi_rollout is not the policy: 'auto' recomputes pi_old and logs a clearly non-zero gap."""
    import json

    from test_llm_e2e import tiny_config

    from dfpo.trainer.train import Trainer

    trainer = Trainer(tiny_config(tmp_path, "train.steps=1", "eval.every=0", "rollout.temperature=0.7"), quiet=True)
    assert not trainer.old_logp_from_sampler()
    trainer.run()
    row = json.loads((tmp_path / "run" / RunDir.METRICS).read_text().splitlines()[0])
    assert row["rollout/logp_gap_max"] > 1e-3 and row["rollout/k3_kl"] >= 0


def test_a_rollout_correction_reaches_the_loss_with_the_sampler_log_probs(tmp_path):
    """objective.overrides.rollout_correction sets the objective's correction and the trainer passes the sampler's
    log-probs: at temperature 0.7 the truncated weights differ from 1 and respect the cap."""
    import json

    from test_llm_e2e import tiny_config

    from dfpo.trainer.train import Trainer

    cfg = tiny_config(
        tmp_path,
        "train.steps=1",
        "eval.every=0",
        "rollout.temperature=0.7",
        "objective.overrides.rollout_correction=token_truncate",
        "objective.overrides.rollout_cap=1.5",
    )
    trainer = Trainer(cfg, quiet=True)
    assert (trainer.spec.rollout_correction, trainer.spec.rollout_cap) == ("token_truncate", 1.5)
    trainer.run()
    row = json.loads((tmp_path / "run" / RunDir.METRICS).read_text().splitlines()[0])
    assert row["rollout/weight_mean"] != 1.0 and 0 < row["rollout/weight_mean"] <= 1.5
