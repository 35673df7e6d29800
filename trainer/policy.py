"""Policy loading: the offline ``tiny`` preset, local/hub transformers models, LoRA, reference.

The tiny preset (no network, no downloaded weights):
1. a character-level tokenizer built with ``tokenizers`` (WordLevel over printable ASCII,
   each character one token, special tokens <pad> <eos> <unk>), wrapped in
   ``PreTrainedTokenizerFast``;
2. a small ``Qwen2Config`` model initialised from scratch with the run's seed;
3. a short supervised warm-start on the task's train split (prompt -> the task's ``sft_target``<eos>), so
   that group-relative RL starts with some reward signal.
The result is saved under ``RUN_DIR/init_model`` (``run.folder.write_init_model``: with a record of its files, a
full disk one message) so resume and the reference model reload it. It is read back as data only: safetensors
weights, never a pickled ``pytorch_model.bin``, and no code of its own whatever ``model.trust_remote_code`` says.

``load_policy`` gives the trainer a ``Model``: the policy (LoRA-wrapped when asked), its tokenizer, the frozen
reference model a KL term reads, and the token ids that end a completion.
"""

from __future__ import annotations

import random
import string
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from .decode import cuda_defaults_forced
from .packaged_model import resolve_model_name
from .run import logs
from .run.folder import write_init_model
from .run.layout import RunDir
from .tasks import hub_reachable, sft_target

SPECIAL_TOKENS = ("<pad>", "<eos>", "<unk>")
CHARS = string.digits + string.ascii_letters + string.punctuation + " \n"


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError('device = "cuda" but no CUDA device is available; use device = "auto" or "cpu"')
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """Parameter dtype. 'auto' keeps float32 master weights: bf16 parameters would round away
    updates of the size RL fine-tuning makes (lr ~1e-6), so speed comes from autocast instead."""
    if name == "auto":
        return torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def resolve_amp(name: str, device: torch.device) -> torch.dtype | None:
    """Autocast dtype of forward passes (None = no autocast). "bf16" runs on CUDA and on a CPU with bf16 in hardware
    (``cpu_bf16_flags``); "auto" is bf16 on CUDA, and on a CPU given the CUDA defaults (``DFPO_CUDA_DEFAULTS=1``, which
    also allows "bf16" on any CPU), else none."""
    forced = device.type == "cpu" and cuda_defaults_forced()
    if name == "auto":
        return torch.bfloat16 if (device.type == "cuda" and torch.cuda.is_bf16_supported()) or forced else None
    if name == "bf16" and device.type == "cpu" and not forced and not cpu_bf16_flags():
        raise ValueError(
            'model.amp = "bf16" on a CPU needs bf16 in hardware (avx512_bf16 or amx_bf16 among /proc/cpuinfo\'s flags), '
            'which this CPU lacks; use "auto" or "none" here, or a CUDA device'
        )
    if name == "fp16" and device.type != "cuda":
        raise ValueError(f'model.amp = "fp16" needs a CUDA device; use "auto", "none" or "bf16" on {device.type}')
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "none": None}[name]


def cpu_bf16_flags(cpuinfo: str | None = None) -> list[str]:
    """The flags of /proc/cpuinfo (or of ``cpuinfo``'s text) that say the CPU computes bf16 in hardware: avx512_bf16,
    amx_bf16 ([] where neither, or where the file cannot be read)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return []
    flags = {word for line in cpuinfo.splitlines() if line.startswith("flags") for word in line.split(":", 1)[-1].split()}
    return [f for f in ("avx512_bf16", "amx_bf16") if f in flags]


def build_char_tokenizer():
    """Character-level tokenizer: one token per printable ASCII character."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(list(SPECIAL_TOKENS) + list(CHARS))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


TINY_CONTEXT = 256
"""Positions of the tiny preset's model (its max_position_embeddings)."""


def tokenizer_and_context(mcfg) -> tuple[object, int | None]:
    """The policy's tokenizer (pad token checked) and context length, without loading any weights: what the checks
    of prompt and completion lengths need before the model loads or warms up. Context None: the model's config
    does not say."""
    if mcfg.name == "tiny":
        return build_char_tokenizer(), TINY_CONTEXT
    from transformers import AutoConfig

    name = resolve_model_name(mcfg.name)  # a GGUF file or a packaged model: its converted folder
    tok, kwargs = _pretrained_source(name, mcfg.trust_remote_code)
    check_pad_token(tok, mcfg.pad_token)
    config = AutoConfig.from_pretrained(name, trust_remote_code=mcfg.trust_remote_code, **kwargs)
    return tok, getattr(config, "max_position_embeddings", None)


def check_completion_fits(max_new_tokens: int, context: int | None) -> None:
    """ValueError unless a completion of ``max_new_tokens`` leaves room for a prompt in the model's context."""
    if context is not None and max_new_tokens >= context:
        raise ValueError(
            f"rollout.max_new_tokens={max_new_tokens} leaves no room for a prompt in the model's context of {context} tokens "
            f"(max_position_embeddings); set it below {context}"
        )


def build_tiny_model(mcfg, tokenizer, seed: int, max_positions: int = TINY_CONTEXT):
    """A small Qwen2 causal LM initialised from scratch (deterministic given ``seed``)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    heads = mcfg.tiny_heads
    if mcfg.tiny_hidden % heads:
        raise ValueError(f"model.tiny_hidden={mcfg.tiny_hidden} must be divisible by model.tiny_heads={heads}")
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=mcfg.tiny_hidden,
        intermediate_size=mcfg.tiny_intermediate,
        num_hidden_layers=mcfg.tiny_layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        max_position_embeddings=max_positions,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    return model.float()


def sft_warm_start(
    model,
    tokenizer,
    examples,
    *,
    target_fn,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    device,
    on_step: Callable[[int, float], None] | None = None,
    encode_prompt: Callable[[object], list[int]] | None = None,
) -> list[float]:
    """Supervised steps on prompt -> target<eos> (loss on target tokens only). Returns the losses.

    ``target_fn(example, rng) -> str`` gives the supervised target (the answer, or one of the
    equivalent surface forms for the equiv task). ``on_step(steps_done, loss)`` after each step (progress lines).
    ``encode_prompt(example) -> ids``: the prompt as the policy reads it (a chat model's template; ``warmup``); the
    raw prompt's tokens when None (the tiny preset).
    """
    if steps <= 0:
        return []
    rng = random.Random(seed + 77)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    eos = tokenizer.eos_token_id
    losses = []
    model.train()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 78)
        for _ in range(steps):
            batch = [examples[rng.randrange(len(examples))] for _ in range(batch_size)]
            seqs = []
            for ex in batch:
                p = tokenizer(ex.prompt, add_special_tokens=False).input_ids if encode_prompt is None else list(encode_prompt(ex))
                c = tokenizer(target_fn(ex, rng), add_special_tokens=False).input_ids + [eos]
                seqs.append((p, c))
            width = max(len(p) + len(c) for p, c in seqs)
            ids = torch.full((batch_size, width), tokenizer.pad_token_id, dtype=torch.long)  # (B, L)
            att = torch.zeros(batch_size, width, dtype=torch.long)  # (B, L)
            labels = torch.full((batch_size, width), -100, dtype=torch.long)  # (B, L)
            for i, (p, c) in enumerate(seqs):
                s = p + c
                ids[i, : len(s)] = torch.tensor(s)
                att[i, : len(s)] = 1
                labels[i, len(p) : len(s)] = torch.tensor(c)
            out = model(input_ids=ids.to(device), attention_mask=att.to(device), labels=labels.to(device))
            out.loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(out.loss.detach()))
            if on_step is not None:
                on_step(len(losses), losses[-1])
    return losses


def check_pad_token(tokenizer, pad_token: str) -> None:
    """Give the tokenizer a pad token as configured, or fail saying what to set."""
    if tokenizer.pad_token is not None and not pad_token:
        return
    if not pad_token:
        raise ValueError(
            'the tokenizer has no pad token; set model.pad_token = "eos" to reuse its EOS token '
            "(safe here: the trainer masks by length, not by token id) or name a token string"
        )
    if pad_token == "eos":
        if tokenizer.eos_token is None:
            raise ValueError('model.pad_token = "eos" but the tokenizer has no EOS token either; name a token string')
        tokenizer.pad_token = tokenizer.eos_token
    else:
        tokenizer.pad_token = pad_token


def _pretrained_source(name: str, trust_remote_code: bool):
    """(tokenizer, from_pretrained kwargs) for a local directory, the local HF cache, or the hub."""
    from transformers import AutoTokenizer

    if Path(name).is_dir():
        return AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code), {}
    try:  # a hub name already in the local cache works offline
        return AutoTokenizer.from_pretrained(name, local_files_only=True, trust_remote_code=trust_remote_code), {"local_files_only": True}
    except Exception:
        pass
    if not hub_reachable():
        raise ValueError(
            f"model.name {name!r} is not a local directory nor in the local Hugging Face cache, and the hub is "
            "not reachable. Download the model on a machine with network (huggingface-cli download NAME --local-dir DIR) "
            'and set model.name = "DIR", or use model.name = "tiny" (offline preset).'
        )
    return AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code), {}


def check_model_available(name: str) -> None:
    """Cheap check, before any data or weights load, that ``model.name`` can be loaded."""
    name = resolve_model_name(name)
    if name == "tiny" or Path(name).is_dir():
        return
    try:
        from huggingface_hub import try_to_load_from_cache

        if isinstance(try_to_load_from_cache(name, "config.json"), str):
            return
    except Exception:
        pass
    if not hub_reachable():
        raise ValueError(
            f"model.name {name!r} is not a local directory nor in the local Hugging Face cache, and the hub is "
            'not reachable. Download it where there is network and set model.name = "DIR", or use model.name = "tiny".'
        )


def load_pretrained_policy(path_or_name: str, mcfg, device, dtype, *, from_run_folder: bool = False):
    """Model and tokenizer from a path or hub name; the tokenizer (and its pad token) is checked
    before the weights load. ``from_run_folder``: the tiny preset's RUN_DIR/init_model, read as data only
    (safetensors weights, no remote code)."""
    from transformers import AutoModelForCausalLM

    trust = mcfg.trust_remote_code and not from_run_folder
    path_or_name = resolve_model_name(path_or_name)
    tok, kwargs = _pretrained_source(path_or_name, trust)
    if from_run_folder:
        kwargs["use_safetensors"] = True
    check_pad_token(tok, mcfg.pad_token)
    model = AutoModelForCausalLM.from_pretrained(path_or_name, dtype=dtype, trust_remote_code=trust, **kwargs)
    return model.to(device), tok


def enable_checkpointing(model) -> None:
    """Recompute each layer's activations in backward (non-reentrant): transformers 5's
    ``activation_checkpointing_enable``, or 4.x's ``gradient_checkpointing_enable`` (5.x deprecates that name)."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


@dataclass
class DecodeCopy:
    """The policy's matmul weights in the autocast dtype, for decoding (``decode_copy``): the rollout's step reads them
    as they are instead of casting each float32 master weight at every step (a compiled step does not keep autocast's
    casts between steps). ``model`` is a module like the policy whose ``nn.Linear`` weights and biases are ``dtype``
    copies; every other parameter and buffer (embeddings, norms, RoPE's frequencies) is the policy's own tensor.
    Under autocast it computes what the policy does (autocast casts a linear layer's float32 operands to ``dtype`` by
    the same rounding), so its samples and log-probs are the policy's."""

    model: torch.nn.Module
    pairs: list[tuple[torch.Tensor, torch.Tensor]]
    """(copy, master) of every copied tensor: ``refresh`` writes the master weights into the copies."""

    def refresh(self) -> None:
        """The policy's current weights into the copies: once a rollout, before its first step."""
        with torch.no_grad():
            for copy, master in self.pairs:
                copy.copy_(master)

    @property
    def bytes(self) -> int:
        return sum(c.numel() * c.element_size() for c, _ in self.pairs)


def decode_copy(model: torch.nn.Module, dtype: torch.dtype | None) -> DecodeCopy | None:
    """A ``DecodeCopy`` of ``model`` in ``dtype`` (None, or no linear weight wider than ``dtype``: every tensor shared,
    nothing copied). The copy carries none of the hooks that make the input embeddings require grad (transformers adds
    them with gradient checkpointing): decoding computes no gradient, and torch.compile cannot trace their
    ``requires_grad_``, so a compiled step on the policy itself fell back to eager. None where no copy can be made:
    parameters sharded across processes (FSDP's DTensors, which every process must gather together)."""
    import copy

    params = list(model.parameters())
    if any(type(p).__name__ == "DTensor" for p in params):
        return None
    shared = {id(t): t for t in [*params, *model.buffers()]}  # deepcopy's memo: these stay the policy's own tensors
    twin = copy.deepcopy(model, memo=shared)
    grad_hooks = {h.id for m in model.modules() for h in getattr(m, "_require_grads_hooks", None) or []}
    pairs = []
    for (_, mine), (_, master) in zip(twin.named_modules(), model.named_modules()):
        for hook in grad_hooks:
            mine._forward_hooks.pop(hook, None)
        if dtype is None or not isinstance(mine, torch.nn.Linear):
            continue
        for name in ("weight", "bias"):
            source = getattr(master, name)
            if source is not None and source.is_floating_point() and source.element_size() > dtype.itemsize:
                setattr(mine, name, torch.nn.Parameter(source.detach().to(dtype), requires_grad=False))
                pairs.append((getattr(mine, name), source))
    return DecodeCopy(twin.eval(), pairs)


def wrap_lora(model, mcfg):
    """peft LoRA adapters on ``model`` when model.lora_r > 0 (only adapters train)."""
    if mcfg.lora_r <= 0:
        return model
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise ValueError("model.lora_r > 0 needs the peft package: pip install peft") from None
    targets = mcfg.lora_target_modules
    targets = targets if targets == "all-linear" else [t.strip() for t in targets.split(",") if t.strip()]
    lcfg = LoraConfig(
        r=mcfg.lora_r, lora_alpha=mcfg.lora_alpha, lora_dropout=mcfg.lora_dropout, target_modules=targets, task_type="CAUSAL_LM"
    )
    return get_peft_model(model, lcfg)


def generation_eos_ids(model) -> list[int]:
    """The EOS ids of the model's generation config (none when it has no config or no EOS there)."""
    gc = getattr(model, "generation_config", None)
    eos = getattr(gc, "eos_token_id", None) if gc is not None else None
    if eos is None:
        return []
    return list(eos) if isinstance(eos, (list, tuple)) else [eos]


@dataclass
class Model:
    """The policy and what goes with it."""

    model: torch.nn.Module
    """The policy being trained (a peft model with LoRA adapters when model.lora_r > 0)."""
    tok: object
    """Its tokenizer (pad token set)."""
    ref: torch.nn.Module | None
    """The frozen reference model of a KL term (None: no KL term, or LoRA, whose base model is the reference)."""
    eos_ids: set[int]
    """Token ids that end a completion: the tokenizer's EOS and the generation config's."""

    @property
    def vocab_size(self) -> int:
        """The rows of the model's output (the ids it can sample): at least the tokenizer's size, more for a checkpoint
        whose embedding is padded (Qwen3: 151,936 rows, 151,669 tokens)."""
        return int(self.model.config.vocab_size)


def warm_start_tiny(mcfg, task: str, examples, *, seed: int, device, init_dir: Path, say: Callable[[str], None]) -> None:
    """The tiny preset from scratch (``warm_started_tiny``), model and tokenizer saved to ``init_dir``."""
    model, tok = warm_started_tiny(mcfg, task, examples, seed=seed, device=device, say=say)

    def save(folder: Path) -> None:
        model.save_pretrained(folder)
        tok.save_pretrained(folder)

    write_init_model(init_dir, save)


def warm_started_tiny(mcfg, task: str, examples, *, seed: int, device, say: Callable[[str], None]):
    """(model, tokenizer) of the tiny preset from scratch: char tokenizer, Qwen2 initialised with ``seed``,
    ``mcfg.sft_steps`` supervised steps on the task's ``sft_target``."""
    tok = build_char_tokenizer()
    model = build_tiny_model(mcfg, tok, seed).to(device)
    t0, lines = time.time(), logs.Every(logs.PROGRESS_EVERY_S)

    def progress(done: int, loss: float) -> None:  # a long warm-up is not silent (the last step has its own line)
        if done < mcfg.sft_steps and lines.due():
            say(f"tiny preset: SFT step {done}/{mcfg.sft_steps}, loss {loss:.3f}, {time.time() - t0:.0f} s in the warm-up")

    losses = sft_warm_start(
        model,
        tok,
        examples,
        target_fn=sft_target(task),
        steps=mcfg.sft_steps,
        batch_size=mcfg.sft_batch_size,
        lr=mcfg.sft_lr,
        seed=seed,
        device=device,
        on_step=progress,
    )
    if losses:
        say(f"tiny preset: {mcfg.sft_steps} SFT steps in {time.time() - t0:.1f}s, loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    return model, tok


def load_policy(
    cfg,
    *,
    run_dir: Path,
    device,
    dtype: torch.dtype,
    resume: bool,
    with_ref: bool,
    train_examples,
    on_rank0: Callable,
    say: Callable[[str], None],
    warm: Path | None = None,
) -> Model:
    """The policy of ``cfg.model``: the tiny preset (warmed up and saved under RUN_DIR/init_model by rank 0 on a
    fresh run, reloaded from there by every rank) or a local/hub model; or ``warm``, the folder of a supervised
    warm-up of either (warmup.steps > 0: ``warmup.ensure_warm_model``, which the trainer calls first), read as data
    only; the reference model when ``with_ref`` and no LoRA; gradient checkpointing and LoRA adapters as configured;
    in train mode."""
    m = cfg.model
    init_dir = RunDir(run_dir).init_model
    if warm is not None:  # the same folder on every rank and in every run of the same warm-up
        source = str(warm)
    elif m.name == "tiny":
        if not resume:  # rank 0 warms up and saves; every rank loads the saved model below
            on_rank0(lambda: warm_start_tiny(m, cfg.data.task, train_examples, seed=cfg.seed, device=device, init_dir=init_dir, say=say))
        source = str(init_dir)
    else:
        source = m.name
    weights_dtype = dtype if m.name != "tiny" else torch.float32
    from_run_folder = m.name == "tiny" or warm is not None  # a folder dfpo wrote: safetensors, no remote code
    model, tok = load_pretrained_policy(source, m, device, weights_dtype, from_run_folder=from_run_folder)
    check_pad_token(tok, m.pad_token)
    ref = None
    if with_ref and m.lora_r <= 0:
        ref, _ = load_pretrained_policy(source, m, device, weights_dtype, from_run_folder=from_run_folder)
        ref.eval().requires_grad_(False)
    if m.gradient_checkpointing:
        enable_checkpointing(model)
    model = wrap_lora(model, m)
    model.train()
    eos_ids = {tok.eos_token_id} | set(generation_eos_ids(model))
    eos_ids.discard(None)
    return Model(model, tok, ref, eos_ids)
