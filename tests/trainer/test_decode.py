"""The device-resident decode loop: the same samples whatever the cache, reads back every sync_every steps only,
per-row draws that are batched and reproducible, and a decode step that traces as one graph."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dfpo.trainer.config import ModelConfig, apply_overrides, config_from_dict
from dfpo.trainer.decode import DecodeOptions, graph_compile_options, inverse_cdf_draw, row_uniforms
from dfpo.trainer.decode_counts import DispatchCounter, count_host_reads
from dfpo.trainer.policy import build_char_tokenizer, build_tiny_model
from dfpo.trainer.sampler import HFGenerateEngine, SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")

UNREACHABLE_EOS = 10**6  # no row ever ends: every step of the loop runs


def _model(eos_boost: float = 2.5):
    """A tiny model whose EOS logit is raised, so completions end at varying lengths."""
    tok = build_char_tokenizer()
    model = build_tiny_model(ModelConfig(tiny_hidden=32, tiny_layers=2, tiny_heads=2, tiny_intermediate=64), tok, seed=1)
    with torch.no_grad():
        ids = tok(["12+34=", "7+8="], padding=True, return_tensors="pt")
        h = model.model(**ids).last_hidden_state.mean((0, 1))
        model.lm_head.weight[tok.eos_token_id] += eos_boost * h / h.norm() ** 2
    return model, tok


def _prompts(tok):
    return [tok(text, add_special_tokens=False).input_ids for text in ("12+34=", "7+8=", "100+1=")]  # different lengths


def _engine(model, tok, eos=None, **decode):
    return HFGenerateEngine(model, tok.pad_token_id, {tok.eos_token_id} if eos is None else eos, decode=DecodeOptions(**decode))


@pytest.mark.parametrize(
    "decode",
    [dict(kv_cache="static", sync_every=16), dict(kv_cache="static", sync_every=1), dict(kv_cache="dynamic", sync_every=5)],
)
def test_every_cache_and_read_interval_samples_the_same_completions(decode):
    """Masking ended rows in a static cache, or dropping them every k steps from a dynamic one, changes no token and no
    log-prob: the decode loop's choices are about cost only (reference: a dynamic cache that drops rows at once)."""
    model, tok = _model()
    params = SamplingParams(max_new_tokens=14)
    reference = _engine(model, tok, kv_cache="dynamic", sync_every=1).sample(_prompts(tok), 5, params, seeds=[3, 4, 5])
    assert len({len(t) for t in reference.tokens}) > 2  # rows end at different steps
    got = _engine(model, tok, **decode).sample(_prompts(tok), 5, params, seeds=[3, 4, 5])
    assert got.tokens == reference.tokens
    for name in ("logprobs", "entropies", "logprobs_untruncated"):
        for a, b in zip(getattr(got, name), getattr(reference, name)):
            torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=0, atol=1e-5)


def _reads(engine, tok, steps: int) -> int:
    with count_host_reads() as counts:
        engine.sample(_prompts(tok), 2, SamplingParams(max_new_tokens=steps), seeds=[1, 2, 3])
    return sum(counts.values())


def test_the_accelerator_loop_reads_back_once_every_sync_every_steps():
    """With a static cache and sync_every = 16, 32 more decode steps read back to the host exactly twice (the goal:
    no read in a decode step between syncs; the first run's reads, the prefill's and the final read of the
    buffers, are the same for every length)."""
    model, tok = _model()
    engine = _engine(model, tok, eos={UNREACHABLE_EOS}, kv_cache="static", sync_every=16)
    _reads(engine, tok, 65)  # the held cache, wide enough for both: each run below resets and reuses it
    assert _reads(engine, tok, 65) - _reads(engine, tok, 33) == 2


def test_the_cpu_loop_reads_at_most_two_values_a_step():
    """On a CPU (dynamic cache, sync_every = 1) a step reads back its count of rows still sampling, and transformers'
    mask code one more: at most two reads a step where the earlier loop made five and a Python pass over the rows."""
    model, tok = _model()
    engine = _engine(model, tok, eos={UNREACHABLE_EOS}, kv_cache="dynamic", sync_every=1)
    assert _reads(engine, tok, 33) - _reads(engine, tok, 1) <= 2 * 32


def test_the_sampler_dispatches_a_bounded_number_of_operations_per_step_outside_the_model():
    """Beyond the model's forward, one decode step dispatches a fixed number of operations, independent of the rows
    (no Python loop over rows): the same count at 3 x 2 rows and 3 x 6 rows."""
    model, tok = _model()
    engine = _engine(model, tok, eos={UNREACHABLE_EOS}, kv_cache="static", sync_every=16)

    def per_step(n):
        counts = {}
        for steps in (9, 17):
            counter = DispatchCounter().watch(model)
            with counter:
                engine.sample(_prompts(tok), n, SamplingParams(max_new_tokens=steps), seeds=[1, 2, 3])
            counter.remove_hooks()
            counts[steps] = sum(counter.other.values())
        return (counts[17] - counts[9]) / 8

    assert per_step(2) == per_step(6) < 80


def test_row_draws_depend_on_the_row_seed_alone():
    """A row's uniforms are a function of its seed: the same in any batch, different for another seed."""
    together = row_uniforms(3, 7, [11, 12, 13], "cpu")
    alone = row_uniforms(1, 7, [12], "cpu")
    torch.testing.assert_close(together[1:2], alone, rtol=0, atol=0)
    assert not torch.equal(together[0], together[1])
    assert together.dtype == torch.float64 and bool(((together >= 0) & (together < 1)).all())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 10), min_size=2, max_size=12).filter(lambda w: sum(w) > 1e-3))
def test_inverse_cdf_draws_each_token_with_its_probability(weights):
    """Over a fine grid of uniforms the share of each token drawn is its probability (to the grid's 1/M), and a token
    of zero mass is never drawn."""
    M = 4000
    probs = torch.tensor(weights, dtype=torch.float32)
    u = (torch.arange(M, dtype=torch.float64) + 0.5) / M
    drawn = inverse_cdf_draw(probs.expand(M, -1), u)
    share = torch.bincount(drawn, minlength=len(weights)).double() / M
    expected = probs.double() / probs.double().sum()
    assert bool(((share - expected).abs() <= 1.0 / M + 1e-6).all())
    assert bool((share[probs == 0] == 0).all())


def test_a_decode_graph_the_device_cannot_run_is_one_sentence_before_the_model_loads():
    for sets, why in (
        (["rollout.decode_graph=on", "rollout.kv_cache=dynamic"], "rollout.kv_cache = 'dynamic'"),
        (["rollout.decode_graph=on", "device=cpu"], "device = 'cpu'"),
    ):
        with pytest.raises(ValueError, match=f"rollout.decode_graph = 'on' .* but {why}; set rollout.decode_graph = 'auto' or 'off'"):
            config_from_dict(apply_overrides({}, sets))
    model, tok = _model()
    with pytest.raises(ValueError, match="but the rollout runs on cpu; set rollout.decode_graph = 'auto' or 'off'"):
        _engine(model, tok, decode_graph="on")


def test_the_auto_choices_are_the_cpu_ones_on_a_cpu_and_the_graph_ones_on_cuda():
    assert DecodeOptions().resolve(torch.device("cpu")) == type(DecodeOptions().resolve(torch.device("cpu")))(1, False, False)
    cuda = DecodeOptions().resolve(torch.device("cuda"))
    assert (cuda.sync_every, cuda.static_cache, cuda.graph) == (16, True, True)
    assert DecodeOptions(decode_graph="off").resolve(torch.device("cuda")).graph is False


def test_the_decode_step_traces_as_one_graph_and_is_not_recompiled_across_rollouts(monkeypatch):
    """What a CUDA graph needs, checked on the CPU: the decode step (the model's forward on a static cache, the warpers,
    the draw) traces with fullgraph=True (no graph break), a second rollout of the same shape reuses the compiled step
    (no recompilation), and the compiled step samples what the eager one does."""
    import torch._dynamo

    model, tok = _model()
    params = SamplingParams(max_new_tokens=10, temperature=0.9)
    eager = _engine(model, tok, kv_cache="static", sync_every=4).sample(_prompts(tok), 2, params, seeds=[1, 2, 3])
    compile_calls = []
    real_compile = torch.compile

    def eager_backend_compile(fn, **kwargs):  # reduce-overhead needs CUDA: trace with the eager backend instead
        compile_calls.append(kwargs)
        return real_compile(fn, backend="eager", fullgraph=True, dynamic=False)

    monkeypatch.setattr(torch, "compile", eager_backend_compile)
    engine = _engine(model, tok, kv_cache="static", sync_every=4)
    engine.resolved = type(engine.resolved)(sync_every=4, static_cache=True, graph=True)
    torch._dynamo.reset()
    first = engine.sample(_prompts(tok), 2, params, seeds=[1, 2, 3])
    with torch._dynamo.config.patch(error_on_recompile=True):
        second = engine.sample(_prompts(tok), 2, params, seeds=[1, 2, 3])
    assert compile_calls == [graph_compile_options(torch.device("cpu"))]  # once, for both rollouts
    assert first.tokens == second.tokens == eager.tokens
    torch.testing.assert_close(torch.tensor(sum(first.logprobs, [])), torch.tensor(sum(eager.logprobs, [])), rtol=0, atol=1e-5)


def test_a_decode_graph_that_fails_to_compile_is_one_warning_and_the_rollout_decodes_eagerly(monkeypatch):
    """If torch.compile raises (an op the compiler cannot take, a driver problem), the rollout is redone eagerly with the
    same uniforms, a one-line RuntimeWarning says so, and later rollouts do not try again."""
    model, tok = _model()
    params = SamplingParams(max_new_tokens=8)
    eager = _engine(model, tok, kv_cache="static", sync_every=4).sample(_prompts(tok), 2, params, seeds=[1, 2, 3])
    attempts = []

    def failing_compile(fn, **kwargs):
        def compiled(*args):
            attempts.append(1)
            raise RuntimeError("backend 'inductor' failed\nlong compiler log")

        return compiled

    monkeypatch.setattr(torch, "compile", failing_compile)
    engine = _engine(model, tok, kv_cache="static", sync_every=4)
    engine.resolved = type(engine.resolved)(sync_every=4, static_cache=True, graph=True)
    with pytest.warns(
        RuntimeWarning,
        match=r"^rollout.decode_graph: the decode step failed under torch.compile \(RuntimeError: backend 'inductor' failed\); this "
        r"rollout is decoded again eagerly on a fresh cache, and the next ones eagerly too \(the same samples, without the "
        r"compiled step\)",
    ):
        got = engine.sample(_prompts(tok), 2, params, seeds=[1, 2, 3])
    again = engine.sample(_prompts(tok), 2, params, seeds=[1, 2, 3])
    assert got.tokens == again.tokens == eager.tokens and len(attempts) == 1 and engine.resolved.graph is False


def _eager_compile(monkeypatch):
    """torch.compile traced whole with the eager backend (reduce-overhead needs CUDA); returns the list of calls."""
    calls = []
    real_compile = torch.compile

    def compile_eagerly(fn, **kwargs):
        calls.append(kwargs)
        return real_compile(fn, backend="eager", fullgraph=True, dynamic=False)

    monkeypatch.setattr(torch, "compile", compile_eagerly)
    return calls


def _graph_engine(model, tok, **decode):
    engine = _engine(model, tok, kv_cache="static", sync_every=4, **decode)
    engine.resolved = type(engine.resolved)(sync_every=4, static_cache=True, graph=True)
    return engine


def test_a_failed_compiled_step_names_the_root_error_and_is_retried_on_a_fresh_cache(monkeypatch):
    """The warning names the error torch.compile wrapped (the end of its chain of causes), and the eager retry runs on
    a new cache, not on the one the failed step had written into."""
    model, tok = _model()
    eager = _engine(model, tok, kv_cache="static", sync_every=4).sample(_prompts(tok), 2, SamplingParams(max_new_tokens=8), seeds=[1, 2, 3])
    engine = _graph_engine(model, tok)
    failed = []

    def failing_compile(fn, **kwargs):
        def compiled(*args):
            failed.append(engine._held[1])
            try:
                raise IndexError("index 9 is out of bounds for dimension 2 with size 8")
            except IndexError as inner:
                raise RuntimeError("backend='inductor' raised:\nsee the cause") from inner

        return compiled

    monkeypatch.setattr(torch, "compile", failing_compile)
    with pytest.warns(
        RuntimeWarning, match=r"failed under torch.compile \(IndexError: index 9 is out of bounds for dimension 2 with size 8\)"
    ):
        got = engine.sample(_prompts(tok), 2, SamplingParams(max_new_tokens=8), seeds=[1, 2, 3])
    assert got.tokens == eager.tokens and len(failed) == 1 and engine._held[1] is not failed[0]


def test_the_engine_holds_one_static_cache_and_reuses_it_for_narrower_rollouts_of_its_rows():
    """A rollout of other rows frees the held cache before allocating its own; one of the same rows that fits in the
    held width resets and reuses it."""
    import gc
    import weakref

    model, tok = _model()
    engine = _engine(model, tok, kv_cache="static", sync_every=16)
    engine.sample(_prompts(tok), 2, SamplingParams(max_new_tokens=60), seeds=[1, 2, 3])  # 6 rows, width 128
    first = weakref.ref(engine._held[1])
    engine.sample(_prompts(tok), 4, SamplingParams(max_new_tokens=10), seeds=[1, 2, 3])  # 12 rows: a new cache
    gc.collect()
    assert first() is None and engine._held[0] == (12, 64)
    held = engine._held[1]
    engine.sample(_prompts(tok), 4, SamplingParams(max_new_tokens=20), seeds=[1, 2, 3])  # 12 rows, fits in 64: reused
    assert engine._held[1] is held


def test_rollouts_of_different_lengths_on_one_cache_share_one_compiled_step(monkeypatch):
    """The compiled step is keyed by what it computes (sampling parameters, rows, cache width), not by max_new_tokens:
    a short and a long rollout on one cache compile once (benchmarks/decode_step.py's two rollouts did twice)."""
    import torch._dynamo

    calls = _eager_compile(monkeypatch)
    model, tok = _model()
    engine = _graph_engine(model, tok, eos={UNREACHABLE_EOS})
    torch._dynamo.reset()
    for steps in (10, 40, 10):  # widths 6 + 10 and 6 + 40, both within 64
        engine.sample(_prompts(tok), 2, SamplingParams(max_new_tokens=steps), seeds=[1, 2, 3])
    assert len(calls) == 1 and len(engine._graphs) == 1


def test_alternating_shapes_compile_each_anew_without_reaching_torch_compiles_recompile_limit(monkeypatch):
    """Train and eval rollouts of other rows alternate through a run; each new cache's step is compiled from its own
    copy of the step's code, so no code object collects guards for every shape (past the recompile limit torch.compile
    would decode eagerly without a word), the samples stay the eager ones, and a freed cache is not kept alive by the
    steps compiled on it."""
    import gc
    import weakref

    import torch._dynamo

    _eager_compile(monkeypatch)
    model, tok = _model()
    params = SamplingParams(max_new_tokens=6)
    eager = {n: _engine(model, tok, kv_cache="static", sync_every=4).sample(_prompts(tok), n, params, seeds=[1, 2, 3]) for n in (2, 3)}
    engine = _graph_engine(model, tok)
    torch._dynamo.reset()
    held = []
    with torch._dynamo.config.patch(error_on_recompile=True):
        for n in (2, 3, 2, 3, 2, 3):
            assert engine.sample(_prompts(tok), n, params, seeds=[1, 2, 3]).tokens == eager[n].tokens
            held.append(weakref.ref(engine._held[1]))
    gc.collect()
    assert engine.resolved.graph and [h() is not None for h in held] == [False] * 5 + [True]  # the compiled steps let go
