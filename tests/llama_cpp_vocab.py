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
    """(text, ids) pairs of a .gguf.inp / .gguf.out file pair."""
    texts = Path(inp).read_bytes().decode("utf-8").split(SEP)
    lines = Path(out).read_bytes().decode("utf-8").split("\n")
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
