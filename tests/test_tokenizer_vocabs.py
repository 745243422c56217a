"""Tokenizers of real vocabularies against llama.cpp's own tokenizer tests: the vocab-only GGUFs
of llama.cpp's models/ directory (ggml-vocab-<name>.gguf) with their test inputs (.inp) and
the token ids llama.cpp's test-tokenizer-0 expects for them (.out; add_special=False,
parse_special=False), fetched with the converter (tests/hfconvert.py).

qwen35: Qwen3.5's pre-tokenizer; llama-bpe: Llama 3's; gemma-4: the "gemma4" tokenizer model
(SentencePiece-style BPE with merges, newline runs, byte fallback)."""
from __future__ import annotations

import hfconvert
import pytest

from goinfer.gguf import GGUFFile
from goinfer.tokenizer import Tokenizer


def cases(name):
    d = hfconvert.converter_dir() / "models"
    inp = (d / f"ggml-vocab-{name}.gguf.inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    out = (d / f"ggml-vocab-{name}.gguf.out").read_text(encoding="utf-8").split("\n")
    n = min(len(inp), len(out))
    assert n >= 40
    return d / f"ggml-vocab-{name}.gguf", [(inp[i], [int(x) for x in out[i].split()]) for i in range(n)]


@pytest.mark.parametrize("name", hfconvert.VOCABS)
def test_vocab_matches_llama_cpp(name):
    path, tests = cases(name)
    g = GGUFFile(path)
    tok = Tokenizer.from_metadata(g.metadata)
    bad = [(text, tok.encode(text, add_special=False, parse_special=False), want)
           for text, want in tests if tok.encode(text, add_special=False, parse_special=False) != want]
    assert not bad, bad[:3]
    for text, want in tests:  # and back: decoding the ids gives the text
        assert tok.decode(want) == text, text


def test_gemma4_specifics():
    path, _ = cases("gemma-4")
    tok = Tokenizer.from_metadata(GGUFFile(path).metadata)
    assert tok.model == "gemma4" and tok.add_bos
    ids = tok.encode("Hi\n\n\nthere", add_special=True)
    assert ids[0] == tok.bos_id
    assert tok.token_to_id("\n\n\n") in ids  # a newline run that is a token is taken whole
    assert tok.decode(tok.encode("a \u0000 \U0001f999 b")) == "a \u0000 \U0001f999 b"  # byte fallback
