"""Tests that bite the sampler around the decode loop (issue 57 item 11, mutation/rollout.toml): a rollout split into
chunks samples what one chunk does, a greedy rollout after a sampled one on a compiled step is greedy, and a short
rollout on a held wider static cache samples what it does on its own cache."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

from dfpo.trainer.config import ModelConfig
from dfpo.trainer.decode import DecodeOptions
from dfpo.trainer.policy import build_char_tokenizer, build_tiny_model
from dfpo.trainer.sampler import HFGenerateEngine, SamplingParams, greedy_params

pytestmark = pytest.mark.usefixtures("one_thread")

NEVER = 10**6
"""An EOS id no row ever samples: every row runs every step."""


def _model():
    tok = build_char_tokenizer()
    model = build_tiny_model(ModelConfig(tiny_hidden=32, tiny_layers=2, tiny_heads=2, tiny_intermediate=64), tok, seed=1)
    return model, tok


def _prompts(tok):
    return [tok(text, add_special_tokens=False).input_ids for text in ("12+34=", "7+8=", "100+1=")]


def _engine(model, tok, eos=None, batch_size=0, **decode):
    eos = {tok.eos_token_id} if eos is None else eos
    return HFGenerateEngine(model, tok.pad_token_id, eos, batch_size=batch_size, decode=DecodeOptions(**decode))


def _same(a, b):
    assert a.tokens == b.tokens
    for x, y in zip(a.logprobs, b.logprobs):
        torch.testing.assert_close(torch.tensor(x), torch.tensor(y), rtol=0, atol=1e-5)


def test_a_rollout_split_into_chunks_samples_what_one_chunk_does():
    """rollout.batch_size cuts the 12 rows into chunks of 5, 5 and 2: each row still draws from its own seed."""
    model, tok = _model()
    params = SamplingParams(max_new_tokens=8)
    whole = _engine(model, tok, kv_cache="dynamic", sync_every=1).sample(_prompts(tok), 4, params, seeds=[3, 4, 5])
    chunked = _engine(model, tok, batch_size=5, kv_cache="dynamic", sync_every=1).sample(_prompts(tok), 4, params, seeds=[3, 4, 5])
    assert len({tuple(t) for t in whole.tokens}) > 6  # rows differ: a seed reused would show
    _same(chunked, whole)


def test_a_greedy_rollout_after_a_sampled_one_on_the_compiled_step_is_greedy(monkeypatch):
    """The compiled step is keyed by what it computes: a greedy eval after a training rollout at the same temperature
    gets its own step, and picks what the eager greedy step picks."""
    model, tok = _model()
    greedy = greedy_params(8)
    eager = _engine(model, tok, eos={NEVER}, kv_cache="static", sync_every=4).sample(_prompts(tok), 1, greedy)
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real_compile(fn, backend="eager", fullgraph=True, dynamic=False))
    engine = _engine(model, tok, eos={NEVER}, kv_cache="static", sync_every=4)
    engine.resolved = type(engine.resolved)(sync_every=4, static_cache=True, graph=True)
    torch._dynamo.reset()
    engine.sample(_prompts(tok), 1, SamplingParams(max_new_tokens=8), seeds=[1, 2, 3])
    _same(engine.sample(_prompts(tok), 1, greedy), eager)


def test_a_short_rollout_on_the_held_wider_cache_samples_what_it_does_on_its_own():
    """After a 60-token rollout (a 128-column cache) the engine reuses that cache for a 10-token rollout of the same
    rows; its samples are those of a fresh engine, whose cache is 64 columns wide."""
    model, tok = _model()
    params = SamplingParams(max_new_tokens=10)
    engine = _engine(model, tok, eos={NEVER}, kv_cache="static", sync_every=4)
    engine.sample(_prompts(tok), 2, SamplingParams(max_new_tokens=60), seeds=[7, 8, 9])
    held = engine._held
    short = engine.sample(_prompts(tok), 2, params, seeds=[1, 2, 3])
    assert engine._held is held and held[0] == (6, 128)  # reused, not reallocated
    _same(short, _engine(model, tok, eos={NEVER}, kv_cache="static", sync_every=4).sample(_prompts(tok), 2, params, seeds=[1, 2, 3]))


def test_a_short_and_a_long_rollout_on_one_held_cache_compile_one_step(monkeypatch):
    """A 10-token rollout (its own width would be 64 columns) on the 128-column cache a 60-token rollout left is decoded
    by the step compiled for that cache: one compilation for both, whatever width each would have taken alone."""
    model, tok = _model()
    real_compile, calls = torch.compile, []

    def compile_eagerly(fn, **kwargs):
        calls.append(kwargs)
        return real_compile(fn, backend="eager", fullgraph=True, dynamic=False)

    monkeypatch.setattr(torch, "compile", compile_eagerly)
    engine = _engine(model, tok, eos={NEVER}, kv_cache="static", sync_every=4)
    engine.resolved = type(engine.resolved)(sync_every=4, static_cache=True, graph=True)
    torch._dynamo.reset()
    for steps in (60, 10):
        engine.sample(_prompts(tok), 2, SamplingParams(max_new_tokens=steps), seeds=[1, 2, 3])
    assert engine._held[0] == (6, 128) and len(calls) == 1 and len(engine._graphs) == 1
