"""The HF sampling engine: rows leave the batch at EOS, and the log-probs it returns are pi_rollout's."""

import math

import pytest
import torch

from dfpo.trainer.config import ModelConfig
from dfpo.trainer.forward import completion_logprobs
from dfpo.trainer.policy import build_char_tokenizer, build_tiny_model
from dfpo.trainer.run.layout import RunDir
from dfpo.trainer.sampler import HFGenerateEngine, SamplingParams, build_batch, log_kept_mass, sampler_logp
from dfpo.trainer.stages.old_logp import mismatch_metrics

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
    from dfpo.trainer.sampler import completion_logits

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


class _FixedLogits(torch.nn.Module):
    """A "model" over a six-token vocabulary whose next-token logits are the same at every position."""

    def __init__(self, logits: list[float]):
        from transformers import LlamaConfig

        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # the engine reads the device off a parameter
        self.logits = torch.tensor(logits)
        self.config = LlamaConfig(vocab_size=len(logits), hidden_size=8, num_hidden_layers=1, num_attention_heads=1, intermediate_size=8)

    def forward(self, input_ids, **_):
        from types import SimpleNamespace

        return SimpleNamespace(logits=self.logits.expand(input_ids.shape[0], input_ids.shape[1], -1).clone())


def test_truncated_sampling_returns_both_log_probs_computed_by_hand():
    """Temperature 0.8, top-k 4, top-p 0.9 over six logits: by hand, the tempered probabilities q, the four largest kept,
    then the smallest prefix of their renormalised mass reaching 0.9; each sampled token's log-prob is log q_y minus the
    log of the kept mass (sampled) and log q_y (untruncated), and the engine samples only kept tokens."""
    logits, T = [2.0, 1.0, 0.5, 0.0, -1.0, -3.0], 0.8
    z = [math.exp(x / T) for x in logits]
    q = [v / sum(z) for v in z]  # tempered, whole vocabulary
    top4 = sorted(range(6), key=lambda k: -q[k])[:4]
    mass4 = sum(q[k] for k in top4)
    kept, cum = [], 0.0
    for k in top4:  # descending: keep a token while the mass before it is under top_p
        if cum < 0.9:
            kept.append(k)
        cum += q[k] / mass4
    kept_mass = sum(q[k] for k in kept)
    assert kept == [0, 1, 2] and kept_mass < 1  # the case is a real truncation
    engine = HFGenerateEngine(_FixedLogits(logits), pad_id=0, eos_ids={99})
    torch.manual_seed(0)
    samples = engine.sample([[1, 2], [3]], 20, SamplingParams(max_new_tokens=3, temperature=T, top_k=4, top_p=0.9))
    seen = set()
    for tokens, sampled, untruncated in zip(samples.tokens, samples.logprobs, samples.logprobs_untruncated):
        for y, lp, lf in zip(tokens, sampled, untruncated):
            seen.add(y)
            assert lp == pytest.approx(math.log(q[y] / kept_mass), abs=1e-6)
            assert lf == pytest.approx(math.log(q[y]), abs=1e-6)
    assert seen == set(kept)
    mask = torch.ones(40, 3, dtype=torch.bool)
    assert log_kept_mass(samples, 3, mask) == pytest.approx(math.log(kept_mass), abs=1e-6)
    logp, _ = sampler_logp(samples, 3)  # what the trainer passes to a rollout correction: the untruncated one
    torch.testing.assert_close(logp, torch.tensor(samples.logprobs_untruncated))


def test_without_truncation_both_log_probs_are_the_same_numbers():
    engine = HFGenerateEngine(_FixedLogits([1.0, 0.0, -1.0, 0.5, 0.2, -2.0]), pad_id=0, eos_ids={99})
    samples = engine.sample([[1]], 8, SamplingParams(max_new_tokens=3, temperature=0.7))
    assert samples.logprobs_untruncated == samples.logprobs


def test_a_correction_under_vllm_with_truncation_is_refused_up_front(tmp_path):
    from test_llm_e2e import tiny_config

    with pytest.raises(ValueError, match="rollout_correction='token_mask'.*rollout.engine = 'hf'"):
        tiny_config(tmp_path, "rollout.engine=vllm", "rollout.top_p=0.9", "objective.overrides.rollout_correction=token_mask")
    tiny_config(tmp_path, "rollout.engine=vllm", "rollout.top_p=0.9")  # no correction: nothing to refuse


def test_truncated_rollouts_log_the_kept_mass_and_correct_with_the_untruncated_log_probs(tmp_path):
    """Float32 sampling from the trainer's model at top-k 3: the untruncated sampler log-probs are pi_old's to round-off,
    so a token_mask correction with a tight band [0.999, 1.001] keeps every token, where the sampled log-probs (rho = the
    kept mass, logged below 0) would have masked most."""
    import json

    from test_llm_e2e import tiny_config

    from dfpo.trainer.train import Trainer

    cfg = tiny_config(
        tmp_path,
        "train.steps=1",
        "eval.every=0",
        "rollout.top_k=3",
        "objective.overrides.rollout_correction=token_mask",
        "objective.overrides.rollout_low=0.999",
        "objective.overrides.rollout_cap=1.001",
    )
    Trainer(cfg, quiet=True).run()
    row = json.loads((tmp_path / "run" / RunDir.METRICS).read_text().splitlines()[0])
    assert row["rollout/log_kept_mass"] < -0.01
    assert row["rollout/weight_zero_frac"] == 0.0


def test_a_rollout_rejection_reaches_the_loss_and_is_logged(tmp_path):
    """objective.overrides.rollout_rejection: at temperature 0.7 a token k1 band of [0.9, 1.1] rejects some tokens,
    and the step logs the share."""
    import json

    from test_llm_e2e import tiny_config

    from dfpo.trainer.train import Trainer

    cfg = tiny_config(
        tmp_path,
        "train.steps=1",
        "eval.every=0",
        "rollout.temperature=0.7",
        "objective.overrides.rollout_rejection=token_k1",
        "objective.overrides.rollout_rs_low=0.9",
        "objective.overrides.rollout_rs_high=1.1",
    )
    Trainer(cfg, quiet=True).run()
    row = json.loads((tmp_path / "run" / RunDir.METRICS).read_text().splitlines()[0])
    assert 0 < row["rollout/rejected_frac"] < 1 and 0 < row["rollout/rejected_seq_frac"] <= 1


def _sample_with_warnings_as_errors(model, tok) -> list[list[int]]:
    """A short rollout in which any FutureWarning or DeprecationWarning (transformers' deprecated keywords) raises."""
    import warnings

    engine = HFGenerateEngine(model, tok.pad_token_id, {tok.eos_token_id})
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        torch.manual_seed(2)
        return engine.generate(_prompts(tok), 2, SamplingParams(max_new_tokens=4))


def test_sampling_passes_no_keyword_the_installed_transformers_deprecates():
    """transformers 5.24 to 5.39 warn on `past_key_values` ("Use `cache` instead") and 5.40 removes it: a rollout of
    the installed version raises on any such warning, so the next rename fails here before it reaches a run."""
    model, tok = _stopping_model()
    assert all(1 <= len(t) <= 4 for t in _sample_with_warnings_as_errors(model, tok))


def test_a_lora_model_is_sampled_with_its_base_models_cache_keyword():
    """peft's forward takes the cache through **kwargs: the keyword is the base model's, and no warning is raised."""
    from peft import LoraConfig, get_peft_model

    from dfpo.trainer.sampler import cache_keyword

    model, tok = _stopping_model()
    lora = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    assert cache_keyword(lora) == cache_keyword(model)
    assert all(1 <= len(t) <= 4 for t in _sample_with_warnings_as_errors(lora, tok))


def test_the_cache_keyword_is_the_one_the_forward_names():
    """`cache` where forward names it (transformers >= 5.24), else `past_key_values` (4.56 to 5.23)."""
    from dfpo.trainer.sampler import cache_keyword

    class New(torch.nn.Module):
        def forward(self, input_ids=None, cache=None, use_cache=None, **kwargs): ...

    class Old(torch.nn.Module):
        def forward(self, input_ids=None, past_key_values=None, use_cache=None, **kwargs): ...

    class Wrapper(torch.nn.Module):  # a peft model: forward(**kwargs), the base model underneath
        def __init__(self, base):
            super().__init__()
            self.base = base

        def get_base_model(self):
            return self.base

        def forward(self, *args, **kwargs): ...

    assert [cache_keyword(m) for m in (New(), Old(), Wrapper(New()), Wrapper(Old()))] == ["cache", "past_key_values"] * 2
