"""Embeddings: one vector per input, pooled from an embedding model's hidden states.

An embedding model in GGUF says how it pools in ``{arch}.pooling_type`` (llama.cpp's converter
writes it from a sentence-transformers Pooling module): 1 the mean over the tokens, 2 the first
(CLS) token, 3 the last token (Qwen3-Embedding); 0 (none), 4 (rank: a reranker) or no key: not
an embedding model.  The vector is that pooling of the final-normed hidden states
(``Model.hidden_states``, the last hidden state of transformers' base model), L2-normalised,
as sentence-transformers' Normalize module, the model cards (Qwen3-Embedding: "normalize
embeddings") and llama.cpp's server do.

    vecs = embed(model, [model.tokenize(text, add_special=True), ...])   # (N, d_model)

A text's tokens are the model's with its special tokens (add_special: BOS and, where the GGUF
asks for it, EOS: Qwen3-Embedding's tokenizer appends <|endoftext|>, the token it pools).
"""

from __future__ import annotations

import numpy as np

from goinfer.errors import RequestError

__all__ = ["POOLINGS", "pooling_of", "embed"]

POOLINGS = {1: "mean", 2: "cls", 3: "last"}  # llama.cpp's pooling types that embed


def pooling_of(gguf) -> str | None:
    """The pooling of an embedding model's GGUF ("mean", "cls", "last"), None otherwise."""
    v = gguf.get(f"{gguf.arch}.pooling_type")
    return POOLINGS.get(int(v)) if isinstance(v, (int, np.integer)) else None


def embed(model, inputs: list[list[int]]) -> np.ndarray:
    """The embeddings of token-id inputs, (len(inputs), d_model) float32, each of unit L2
    norm.  RequestError (param "model") if the model is not an embedding model, ("input") for
    an empty input; ContextLengthError for one longer than the context."""
    pooling = getattr(model, "pooling", None)
    if pooling is None:
        raise RequestError(
            f"{model.name} is not an embedding model (its GGUF has no mean, CLS "
            "or last-token pooling_type)",
            "model",
        )
    out = np.empty((len(inputs), model.config.d_model), np.float32)
    for i, ids in enumerate(inputs):
        if not ids:
            raise RequestError(f"input {i} is empty", "input")
        h = model.hidden_states(ids)  # (T, D)
        v = h.mean(axis=0) if pooling == "mean" else h[0] if pooling == "cls" else h[-1]
        out[i] = v / max(float(np.linalg.norm(v)), 1e-12)
    return out
