"""Tokenizers of real vocabularies against llama.cpp's own tokenizer tests: the vocab-only GGUFs
of llama.cpp's models/ directory (ggml-vocab-<name>.gguf) with their test inputs (.inp) and
the token ids llama.cpp's test-tokenizer-0 expects for them (.out; add_special=False,
parse_special=False), fetched with the converter (tests/fixtures/hfconvert.py).

qwen35: Qwen3.5's pre-tokenizer; llama-bpe: Llama 3's; gemma-4: the "gemma4" tokenizer model
(SentencePiece-style BPE with merges, newline runs, byte fallback)."""

from __future__ import annotations

import pytest

from fixtures import hfconvert, llama_cpp_vocab
from goinfer.gguf import GGUFFile
from goinfer.tokenizer import Tokenizer


def cases(name):
    path = hfconvert.converter_dir() / "models" / f"ggml-vocab-{name}.gguf"
    return path, llama_cpp_vocab.read_cases(f"{path}.inp", f"{path}.out")


@pytest.mark.parametrize("name", hfconvert.VOCABS)
def test_vocab_matches_llama_cpp(name):
    path, tests = cases(name)
    llama_cpp_vocab.check_cases(Tokenizer.from_metadata(GGUFFile(path).metadata), tests)


def test_gemma4_specifics():
    path, _ = cases("gemma-4")
    tok = Tokenizer.from_metadata(GGUFFile(path).metadata)
    assert tok.model == "gemma4" and tok.add_bos
    ids = tok.encode("Hi\n\n\nthere", add_special=True)
    assert ids[0] == tok.bos_id
    assert tok.token_to_id("\n\n\n") in ids  # a newline run that is a token is taken whole
    assert (
        tok.decode(tok.encode("a \u0000 \U0001f999 b")) == "a \u0000 \U0001f999 b"
    )  # byte fallback
