"""llama.cpp's tokenizer test cases (tests/data/llama_cpp_vocab, written by
tests/tools/make_llama_cpp_vocabs.py): texts, llama.cpp's token ids, and the part of each
vocabulary those texts can reach, as GGUF tokenizer metadata."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np

DIR = Path(__file__).parent / "data" / "llama_cpp_vocab"
SEP = "\n__ggml_vocab_test__\n"  # between the texts of a .inp file (llama.cpp's format)
NAMES = ["gpt-2", "llama-bpe", "qwen2", "starcoder", "llama-spm", "phi-3"]


def read_cases(inp, out) -> list[tuple[str, list[int]]]:
    """(text, ids) pairs of a .gguf.inp / .gguf.out file pair (llama.cpp's test-tokenizer-0
    format: add_special=False, parse_special=False)."""
    texts = Path(inp).read_bytes().decode("utf-8").split(SEP)
    lines = Path(out).read_bytes().decode("utf-8").split("\n")
    if len(lines) == len(texts) + 1 and lines[-1] == "":  # a final newline (gemma-4's)
        lines.pop()
    assert len(texts) == len(lines), (inp, len(texts), len(lines))
    return [(t, [int(x) for x in line.split()]) for t, line in zip(texts, lines)]


def metadata(reduced: dict) -> dict:
    """A reduced vocabulary as GGUF tokenizer metadata: the left-out tokens get placeholders
    (private-use characters, which no byte-level or SentencePiece text contains)."""
    n = reduced["n_tokens"]
    md = {k: v for k, v in reduced.items() if k.startswith("tokenizer.")}
    md["tokenizer.ggml.tokens"] = [reduced["tokens"].get(str(i), f"\ue000{i}") for i in range(n)]
    types = np.ones(n, np.int32)
    for i, ty in reduced["token_type"].items():
        types[int(i)] = ty
    md["tokenizer.ggml.token_type"] = types
    if "scores" in reduced:
        scores = np.zeros(n, np.float32)
        for i, s in reduced["scores"].items():
            scores[int(i)] = s
        md["tokenizer.ggml.scores"] = scores
    if "merges" in reduced:
        md["tokenizer.ggml.merges"] = reduced["merges"]
    return md


def load(name: str) -> tuple[dict, list[tuple[str, list[int]]]]:
    """(tokenizer metadata, [(text, llama.cpp's ids)]) of one vocabulary."""
    with gzip.open(DIR / f"{name}.vocab.json.gz", "rt", encoding="utf-8") as f:
        reduced = json.load(f)
    base = DIR / f"ggml-vocab-{name}.gguf"
    return metadata(reduced), read_cases(f"{base}.inp", f"{base}.out")


def first_difference(tok, got: list[int], want: list[int]) -> str:
    k = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    show = lambda ids: [tok.id_to_token(i) for i in ids[max(0, k - 3) : k + 4]]
    return f"first difference at token {k}: goinfer {show(got)} llama.cpp {show(want)}"


def check_cases(tok, cases) -> None:
    """tok encodes every text to llama.cpp's ids and decodes the ids back to the text."""
    assert len(cases) >= 40 and sum(len(ids) for _, ids in cases) >= 300
    bad = []
    for text, want in cases:
        got = tok.encode(text, add_special=False, parse_special=False)
        if got != want:
            bad.append(f"{text[:30]!r}: {first_difference(tok, got, want)}")
        assert tok.decode(want) == text, text
    assert not bad, f"{len(bad)} of {len(cases)} texts differ:\n" + "\n".join(bad[:5])
