"""The GPU path on the CPU: the CUDA defaults (a static KV cache, bf16 autocast over float32 master weights, the
sampler's log-probs, the bf16 head, the decode step through torch.compile) with the GPU image's versions.

CI runs this file in the device-versions environment (scripts/device_env.sh: torch 2.11, transformers 5.17) as well
as in the main one. Under bf16 autocast a Qwen3 layer's keys come out in float32 (RoPE's cos/sin and the k-norm are
float32) and its values in bf16; transformers 5.17 allocates a static cache's keys and values both in the keys'
dtype, and its prefill's index_copy_ then raised "self and source expected to have the same dtype"."""

import pytest
import torch

from dfpo.trainer.decode import DecodeOptions
from dfpo.trainer.sampler import HFGenerateEngine, SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")

QWEN3_TINY = dict(
    vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=8, max_position_embeddings=512, tie_word_embeddings=True,
)  # fmt: skip
"""A Qwen3 model (q/k norms, grouped keys and values) small enough for a test."""
EOS = 95


def qwen3_tiny(seed: int = 0):
    """A random-init Qwen3ForCausalLM of ``QWEN3_TINY`` in float32 (the trainer's master weights), its EOS logit
    raised so completions end at varying lengths."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(Qwen3Config(**QWEN3_TINY, pad_token_id=0, eos_token_id=EOS, bos_token_id=EOS)).float().eval()
    with torch.no_grad():
        h = model.model(input_ids=torch.tensor([[5, 6, 7, 8]])).last_hidden_state.mean((0, 1))  # (H,)
        model.lm_head.weight[EOS] += 3.0 * h / h.norm() ** 2  # tied: the embedding's row too, harmless here
    return model


def prompts() -> list[list[int]]:
    return [[5, 6, 7], [8, 9, 10, 11, 12], [13, 14]]  # different lengths: left padding


def engine(model, amp=torch.bfloat16, **decode) -> HFGenerateEngine:
    return HFGenerateEngine(model, 0, {EOS}, amp_dtype=amp, decode=DecodeOptions(**decode))


def test_a_static_cache_rollout_under_bf16_autocast_over_float32_weights_samples():
    """The CUDA default on the CPU: a static cache under bf16 autocast with float32 weights samples every row, with
    finite log-probs and entropies (transformers 5.17 raised at the prefill)."""
    model = qwen3_tiny()
    got = engine(model, kv_cache="static", sync_every=16).sample(prompts(), 4, SamplingParams(max_new_tokens=12), seeds=[1, 2, 3])
    assert len(got.tokens) == 12 and all(got.tokens)
    for row in got.logprobs + got.entropies:
        assert all(torch.isfinite(torch.tensor(row)))


def test_the_compiled_static_step_under_bf16_autocast_samples_without_falling_back(monkeypatch):
    """The decode step through torch.compile (traced whole, with the eager backend: reduce-overhead needs CUDA) on a
    static cache under bf16 autocast: no fallback warning, and every row sampled."""
    import warnings

    import torch._dynamo

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real_compile(fn, backend="eager", fullgraph=True, dynamic=False))
    model = qwen3_tiny()
    eng = engine(model, kv_cache="static", sync_every=4)
    eng.resolved = type(eng.resolved)(sync_every=4, static_cache=True, graph=True)
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        got = eng.sample(prompts(), 2, SamplingParams(max_new_tokens=8), seeds=[1, 2, 3])
    assert len(got.tokens) == 6 and all(got.tokens) and eng.resolved.graph
