"""One forward step over several sessions of one model and KVCache, run as one batch (the
server's engine step, goinfer/server/scheduler.py; the batch-invariance tests)."""

from __future__ import annotations

import numpy as np

from goinfer.recurrent import SeqRecurrent
from goinfer.session import Session

__all__ = ["forward_sessions", "decode_batch"]


def forward_sessions(items) -> list[np.ndarray]:
    """One forward step over several sessions of one model and KVCache, run as one batch.

    items: (session, tokens) or (session, tokens, "all") per session; each session appends its
    tokens (a prefill chunk, one token to decode, or a token and its draft to verify).  Returns
    per session the logits of its last token, (vocab,), or with "all" of every token, (T,
    vocab).  Each session's logits and KV are bit-identical to running it alone (in either
    numerics mode: a row's kernel depends on its position only).
    Blocks are reserved first: on CacheFullError earlier sessions may keep spare blocks, but no
    token is appended anywhere."""
    if not items:
        return []
    items = [(it[0], [int(t) for t in it[1]], it[2] if len(it) > 2 else "last") for it in items]
    cache, model = items[0][0].cache, items[0][0].model
    if any(s.cache is not cache or s.model is not model for s, _, _ in items):
        raise ValueError("forward_sessions needs sessions of one model sharing one KVCache")
    if len({id(s) for s, _, _ in items}) != len(items):
        raise ValueError("a session appears twice in the batch")
    for s, toks, want in items:
        if not toks:
            raise ValueError("every session in a batch needs at least one token")
        if want not in ("last", "all"):
            raise ValueError(f"want must be 'last' or 'all', got {want!r}")
        s.table.reserve(len(toks))
    seqs, snaps = [], []
    for s, toks, want in items:
        s.table.trim_window(s.n_tokens)  # the window KV behind its next position goes
        seq = (s.block_table, toks, s.n_tokens, want)
        if s.track is not None:
            due = s.track.due_snapshots(len(toks))
            rec = SeqRecurrent.with_snapshots(s.track.state, [n - 1 - s.n_tokens for n in due])
            seq += (rec,)
            snaps.append((due, rec))
        else:
            snaps.append(None)
        seqs.append(seq)
    logits = model.forward_batch(cache, seqs)
    for (s, toks, _), sn in zip(items, snaps):
        s.table.commit(toks)
        if sn is not None and sn[0]:
            s.track.keep_snapshots(dict(zip(sn[0], sn[1].snapshots())))
    return [lg if want == "all" else lg[-1] for lg, (_, _, want) in zip(logits, items)]


def decode_batch(sessions: list[Session], tokens: list[int]) -> list[np.ndarray]:
    """One decode step for several sessions of one model and KVCache, run as one batch.
    Each session's logits are bit-identical to its own decode(token)."""
    if len(sessions) != len(tokens):
        raise ValueError("decode_batch needs one token per session")
    return forward_sessions([(s, [t]) for s, t in zip(sessions, tokens)])
