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


def test_one_training_step_with_the_cuda_defaults_forced_on_the_cpu(tmp_path, monkeypatch):
    """DFPO_CUDA_DEFAULTS=1: a tiny run on the CPU takes what CUDA would (a static cache read back every 16 steps, the
    decode step compiled, bf16 autocast over float32 master weights, the bf16 head) and, with the sampler's log-probs
    as pi_old, trains one step and evaluates: parameters move, stay float32, and every logged figure is finite."""
    import json
    import math
    import warnings

    from tiny_run import FORMAT_REWARD_SETS, TINY_MODEL_SETS

    from dfpo.trainer.config import apply_overrides, config_from_dict
    from dfpo.trainer.run.layout import RunDir
    from dfpo.trainer.train import Trainer

    monkeypatch.setenv("DFPO_CUDA_DEFAULTS", "1")
    sets = [
        *TINY_MODEL_SETS, *FORMAT_REWARD_SETS, "data.train_size=20", "data.eval_size=2", "rollout.prompts_per_step=2",
        "rollout.group_size=4", "rollout.max_new_tokens=4", "rollout.old_logp=sampler", "optim.minibatch_groups=1",
        "optim.lr=1e-2", "train.steps=1", "train.save_every=0", "train.save_final=false", "eval.every=1", "eval.k=2",
        "threads=1", "log.tensorboard=false", "log.progress=false", "log.samples_every=0", "device=cpu",
        f'run_dir="{tmp_path / "run"}"',
    ]  # fmt: skip
    trainer = Trainer(config_from_dict(apply_overrides({}, sets)), quiet=True)
    engine = trainer.rollout_stage.engine
    assert (engine.resolved.sync_every, engine.resolved.static_cache, engine.resolved.graph) == (16, True, True)
    assert engine.amp_dtype is torch.bfloat16 and trainer.old_logp_from_sampler()
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no fallback from the compiled step
        trainer.run()
    assert engine.resolved.graph and engine.decode_copy_bytes > 0
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    assert any(not torch.equal(p.detach(), before[n]) for n, p in trainer.model.named_parameters())
    rows = [json.loads(line) for line in (tmp_path / "run" / RunDir.METRICS).read_text().splitlines()]
    assert rows and all(math.isfinite(v) for r in rows for v in r.values() if isinstance(v, float))


def test_the_static_cache_holds_keys_and_values_in_the_autocast_dtype():
    """One dtype for both, the autocast's: half the memory of float32 keys, and nothing for index_copy_ to refuse."""
    model = qwen3_tiny()
    eng = engine(model, kv_cache="static", sync_every=16)
    eng.sample(prompts(), 2, SamplingParams(max_new_tokens=6), seeds=[1, 2, 3])
    layers = eng._held[1].layers
    assert layers and {(layer.keys.dtype, layer.values.dtype) for layer in layers} == {(torch.bfloat16, torch.bfloat16)}
    plain = engine(model, amp=None, kv_cache="static", sync_every=16)
    plain.sample(prompts(), 2, SamplingParams(max_new_tokens=6), seeds=[1, 2, 3])
    assert {layer.keys.dtype for layer in plain._held[1].layers} == {torch.float32}  # without autocast: as they come


@pytest.mark.parametrize("kv_cache", ["dynamic", "static"])
def test_decoding_from_the_bf16_copy_samples_what_autocast_over_the_float32_weights_does_bit_for_bit(monkeypatch, kv_cache):
    """The decoding copy holds the linear weights as autocast would cast them (round to nearest bf16) and shares every
    other tensor: the same tokens, log-probs and entropies as casting at every step."""
    import dfpo.trainer.policy as policy

    model = qwen3_tiny()
    params = SamplingParams(max_new_tokens=10, temperature=0.8)
    with_copy = engine(model, kv_cache=kv_cache, sync_every=4)
    got = with_copy.sample(prompts(), 3, params, seeds=[1, 2, 3])
    assert with_copy.decode_copy_bytes > 0
    monkeypatch.setattr(policy, "decode_copy", lambda model, dtype: None)
    cast_each_step = engine(model, kv_cache=kv_cache, sync_every=4)
    want = cast_each_step.sample(prompts(), 3, params, seeds=[1, 2, 3])
    assert cast_each_step.decode_copy_bytes == 0
    assert got.tokens == want.tokens and got.logprobs == want.logprobs and got.entropies == want.entropies


def test_the_decoding_copy_is_refreshed_every_rollout_and_holds_only_the_linear_weights():
    """After an update the next rollout samples from the new weights (as a fresh engine does); the copy holds each
    linear weight once in bf16 (the tied head too: the embedding stays the policy's float32 tensor)."""
    model = qwen3_tiny()
    eng = engine(model, kv_cache="static", sync_every=16)
    params = SamplingParams(max_new_tokens=8)
    eng.sample(prompts(), 2, params, seeds=[4, 5, 6])
    linear = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert eng.decode_copy_bytes == 2 * sum(m.weight.numel() for m in linear)
    twin = eng._copy.model
    assert twin.model.embed_tokens.weight is model.model.embed_tokens.weight  # shared, float32
    assert twin.lm_head.weight.dtype == torch.bfloat16 and model.lm_head.weight.dtype == torch.float32
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    after = eng.sample(prompts(), 2, params, seeds=[4, 5, 6])
    fresh = engine(model, kv_cache="static", sync_every=16).sample(prompts(), 2, params, seeds=[4, 5, 6])
    assert after.tokens == fresh.tokens and after.logprobs == fresh.logprobs


def test_the_fallback_warning_under_bf16_does_not_promise_the_same_log_probs(monkeypatch):
    model = qwen3_tiny()

    def failing_compile(fn, **kwargs):
        def compiled(*args):
            raise RuntimeError("no compiler")

        return compiled

    monkeypatch.setattr(torch, "compile", failing_compile)
    eng = engine(model, kv_cache="static", sync_every=4)
    eng.resolved = type(eng.resolved)(sync_every=4, static_cache=True, graph=True)
    with pytest.warns(RuntimeWarning, match=r"\(in bfloat16 the eager step's log-probs differ from the compiled step's by round-off"):
        eng.sample(prompts(), 2, SamplingParams(max_new_tokens=6), seeds=[1, 2, 3])


def test_dfpo_cuda_defaults_gives_a_cpu_the_cuda_choices_and_a_bad_value_is_one_sentence(monkeypatch):
    from dfpo.trainer.decode import cuda_defaults_forced, graph_compile_options
    from dfpo.trainer.policy import resolve_amp

    cpu = torch.device("cpu")
    monkeypatch.setenv("DFPO_CUDA_DEFAULTS", "1")
    resolved = DecodeOptions().resolve(cpu)
    assert (resolved.sync_every, resolved.static_cache, resolved.graph) == (16, True, True)
    assert resolve_amp("auto", cpu) is torch.bfloat16 and resolve_amp("none", cpu) is None
    assert graph_compile_options(cpu) == dict(backend="aot_eager", fullgraph=True, dynamic=False)
    assert graph_compile_options(torch.device("cuda")) == dict(mode="reduce-overhead", dynamic=False)
    monkeypatch.setenv("DFPO_CUDA_DEFAULTS", "0")
    assert not cuda_defaults_forced() and DecodeOptions().resolve(cpu).static_cache is False and resolve_amp("auto", cpu) is None
    monkeypatch.setenv("DFPO_CUDA_DEFAULTS", "yes")
    with pytest.raises(ValueError, match=r"^DFPO_CUDA_DEFAULTS='yes': set it to 1 to give a CPU the CUDA defaults .*, or to 0 or nothing"):
        DecodeOptions().resolve(cpu)


def test_bf16_autocast_on_a_cpu_needs_bf16_in_hardware(monkeypatch):
    """model.amp = "bf16" runs on a CPU whose flags say it computes bf16 (avx512_bf16, amx_bf16) and is refused in
    one sentence elsewhere; fp16 still needs CUDA."""
    import dfpo.trainer.policy as policy

    cpu = torch.device("cpu")
    monkeypatch.delenv("DFPO_CUDA_DEFAULTS", raising=False)
    assert policy.cpu_bf16_flags("processor\t: 0\nflags\t\t: fpu sse2 avx512f avx512_bf16 amx_tile\n") == ["avx512_bf16"]
    assert policy.cpu_bf16_flags("flags : fpu sse2 avx2\nflags : amx_bf16\n") == ["amx_bf16"]
    assert policy.cpu_bf16_flags("flags : fpu sse2 avx2 avx512f\n") == []
    monkeypatch.setattr(policy, "cpu_bf16_flags", lambda: ["amx_bf16"])
    assert policy.resolve_amp("bf16", cpu) is torch.bfloat16 and policy.resolve_amp("auto", cpu) is None
    monkeypatch.setattr(policy, "cpu_bf16_flags", lambda: [])
    with pytest.raises(
        ValueError,
        match=r'^model.amp = "bf16" on a CPU needs bf16 in hardware \(avx512_bf16 or amx_bf16 .*\), which this CPU lacks; use "auto" or "none" here, or a CUDA device$',
    ):
        policy.resolve_amp("bf16", cpu)
    with pytest.raises(ValueError, match=r'^model.amp = "fp16" needs a CUDA device; use "auto", "none" or "bf16" on cpu$'):
        policy.resolve_amp("fp16", cpu)


@pytest.mark.parametrize("amp", [torch.bfloat16, None], ids=["bf16 autocast", "float32"])
def test_the_compiled_step_of_a_model_with_gradient_checkpointing_does_not_fall_back(monkeypatch, amp):
    """Gradient checkpointing makes transformers hook the input embeddings to require grad, a requires_grad_ that
    torch.compile cannot trace: the compiled step fell back to eager in every vs_trl protocol trial. The decoding copy
    carries no such hook, and the policy keeps its own (training needs it)."""
    import warnings

    import torch._dynamo

    from dfpo.trainer.policy import enable_checkpointing

    monkeypatch.setenv("DFPO_CUDA_DEFAULTS", "1")
    model = qwen3_tiny()
    enable_checkpointing(model)
    hooks = len(model.model.embed_tokens._forward_hooks)
    assert hooks >= 1
    eng = engine(model, amp=amp)
    assert eng.resolved.graph
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        got = eng.sample(prompts(), 2, SamplingParams(max_new_tokens=20), seeds=[1, 2, 3])
    assert eng.resolved.graph and len(got.tokens) == 6
    assert len(model.model.embed_tokens._forward_hooks) == hooks and not eng.decoding_module.model.embed_tokens._forward_hooks
