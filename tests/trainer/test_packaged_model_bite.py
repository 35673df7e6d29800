"""Tests that bite the packaged-model cache (issue 57 item 11, mutation/realmodel.toml): the cache key follows the
file's bytes within one process, and the stop tokens always begin with the tokenizer's own EOS."""

from __future__ import annotations

import hashlib
import os

from dfpo.trainer import packaged_model as pm


def test_a_file_rewritten_in_place_with_the_same_size_gets_the_new_bytes_key(tmp_path):
    """The hash is memoised per (path, size, mtime): new bytes of the same length at a later mtime are hashed again."""
    path = tmp_path / "model.gguf"
    path.write_bytes(b"A" * 4096)
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    first = pm.file_sha256(path)
    path.write_bytes(b"B" * 4096)
    os.utime(path, ns=(2_000_000_000, 2_000_000_000))
    assert first == hashlib.sha256(b"A" * 4096).hexdigest()
    assert pm.file_sha256(path) == hashlib.sha256(b"B" * 4096).hexdigest()


class _Tokenizer:
    """The two things ``stop_token_ids`` reads of a tokenizer."""

    def __init__(self, vocab: dict[str, int], eos: int | None):
        self._vocab, self.eos_token_id = vocab, eos

    def get_vocab(self) -> dict[str, int]:
        return self._vocab


def test_the_stop_tokens_are_the_eos_then_each_stop_token_the_vocabulary_has_without_repeats():
    vocab = {"</s>": 2, "<|im_end|>": 7, "a": 9}
    assert pm.stop_token_ids(_Tokenizer(vocab, eos=2)) == [2, 7]  # an EOS outside STOP_TOKENS still stops
    assert pm.stop_token_ids(_Tokenizer({**vocab, "<|endoftext|>": 0}, eos=7)) == [7, 0]  # no repeat of <|im_end|>
    assert pm.stop_token_ids(_Tokenizer(vocab, eos=None)) == [7]
