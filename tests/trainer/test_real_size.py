"""The real-model path at real size, on CPU: a Qwen3-0.6B-shaped model (596M parameters, 151,936-row vocabulary,
bfloat16 checkpoint, byte-level BPE tokenizer with Qwen's chat template) trained by ``configs/qwen3-0.6b-gsm8k.toml``
for 2 steps with full fine-tuning and LoRA, each with and without gradient checkpointing, then resumed
(``scripts/real_size.py``). About 13 GiB of memory, 8 GB of disk and 9 minutes on an idle 2-core machine: slow, run in CI with ``-m slow``."""

from __future__ import annotations

from pathlib import Path

import pytest
from script_modules import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "real_size.py"


def _script():
    return load_script(SCRIPT)


@pytest.mark.slow
def test_a_qwen3_06b_shaped_run_trains_in_every_variant_and_resumes(tmp_path, capsys):
    """Every variant exits 0 with finite metrics, a gradient, the chat template in what the model read, a checkpoint;
    the end-of-turn token ends completions; the first variant resumes for a third step."""
    # each checkpoint is removed once checked: two full fine-tunes' (7.2 GB each) would not fit every CI disk
    assert _script().main(["--out", str(tmp_path / "rs"), "--steps", "2", "--discard-checkpoints"]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert out.count("| 0 |") == 4 and "resumed full-ckpt for step 3: exit 0" in out, out


def test_the_script_refuses_an_existing_run_folder_before_any_work(tmp_path, capsys):
    """Nothing is built or trained when a variant's folder is already there (the script never deletes)."""
    (tmp_path / "rs" / "lora").mkdir(parents=True)
    with pytest.raises(SystemExit):
        _script().main(["--out", str(tmp_path / "rs"), "--variants", "lora"])
    assert "run folders exist" in capsys.readouterr().err and not (tmp_path / "rs" / "model").exists()


def test_the_qwen3_chat_template_renders_as_qwen3s_for_a_user_turn():
    """The template the script gives its tokenizer writes a user turn, the assistant's generation prompt and, with
    enable_thinking=False, the empty think block, as Qwen3's own template does."""
    tok = _script().build_tokenizer(vocab_size=400)
    text = tok.apply_chat_template([{"role": "user", "content": "1+1?"}], add_generation_prompt=True, tokenize=False, enable_thinking=False)
    assert text == "<|im_start|>user\n1+1?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
