"""Sliding-window layers keep only their window of KV (goinfer/kv_cache.py, goinfer/blocks.py).

Sessions on a trimming KVCache run far past the window (8 tokens in every fixture, blocks of 4:
a query at a block boundary reads the 2 blocks before it) on tiny Gemma 3, Gemma 4, gpt-oss
and a Mistral file whose every layer slides, and are checked against transformers and bit for
bit against the untrimmed paths (Model.logits, which keeps every block's window KV).  After
every step each window slot that no block holds is filled with NaN: a read of KV that was let
go turns the logits to NaN.  Then prefix reuse: where a prompt resumes (kept points) and what
a resume elsewhere costs, agent turns, forks, continuous batching and graph replay, drafts,
truncation, save/load, the bytes held, and the server (batching, turns, preemption)."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from fixtures import hfconvert, tinygemma
from fixtures.compare import close, hf_logits, load
from goinfer import KVCache
from goinfer.batch import forward_sessions
from goinfer.blocks import BlockTable
from goinfer.errors import CacheFileError

WINDOW, BS = 8, 4
SPAN = 2  # blocks a query at a block boundary reads in a sliding layer: ceil((8 - 1) / 4)
EVERY = 8 * SPAN  # blocks between the points a session keeps as it computes (64 tokens)
GPT_OSS_DISTANCE = 7e-4  # test_gptoss.py: what llama.cpp reaches on the fixture


@pytest.fixture(scope="module")
def families(tmp_path_factory, tiny):
    """name -> (transformers model, goinfer Model, vocab size); built on first use."""
    made = {}

    def get(name):
        if name not in made:
            if name == "gemma3":  # 7 layers: 0-4 and 6 slide, 5 is global
                hf = tinygemma.hf_model(0)
                path = tinygemma.write_gguf(hf, tmp_path_factory.mktemp("g3") / "g.gguf")
            elif name == "gemma4":  # sliding and global layers of other geometries, shared KV
                hf, path = hfconvert.build("gemma4")
            elif name == "gpt-oss":  # layers 0 and 2 slide; sinks
                hf, path = hfconvert.build("gpt-oss", mxfp4=False)
            else:  # mistral: every layer slides
                hf, path = tiny("mistral", 3, sliding_window=WINDOW)
            made[name] = (hf, load(path), hf.config.vocab_size)
        return made[name]

    return get


def ids_(n, seed, vocab=320):
    return np.random.default_rng(seed).integers(0, vocab, n).tolist()


def poison_free_slots(cache: KVCache) -> None:
    """NaN into every window slot no block holds, in every sliding-window layer."""
    held = {cache.window_slot(b) for b in range(cache.n_blocks)}
    free = [s for s in range(cache.n_blocks) if s not in held]
    for li in cache.window_layers:
        cache.k[li][free] = np.nan
        cache.v[li][free] = np.nan


def trimmed(m, max_tokens=1024, **kw) -> KVCache:
    cache = KVCache(m, max_tokens=max_tokens, block_size=BS, **kw)
    assert cache.window == WINDOW and cache.window_span == SPAN
    return cache


def agree(name, ours, ref):
    close(ours, ref)
    if name == "gpt-oss":
        assert float(np.abs(ours - ref).max()) <= GPT_OSS_DISTANCE
    assert np.array_equal(ours.argmax(-1), ref.argmax(-1))


# ============================================================================ against transformers


@pytest.mark.parametrize("name", ["gemma3", "gemma4", "gpt-oss", "mistral"])
def test_long_session_matches_transformers(families, name, monkeypatch):
    """200 tokens (25 windows): prefill pieces (one of them in chunks of 8, trimmed between
    chunks) then decode steps, each row checked against transformers and bit for bit against
    Model.logits; the window KV held stays a few blocks whatever the length."""
    monkeypatch.setattr("goinfer.model.PREFILL_CHUNK", 8)
    hf, m, vocab = families(name)
    ids = ids_(200, 5, vocab)
    ref = m.logits(ids)  # every block keeps its window KV here
    agree(name, ref, hf_logits(hf, ids))
    cache = trimmed(m)
    s = m.session(cache)
    rows, at, replays = {}, 0, m.graph.replays
    for piece in (5, 7, 50, 3):  # 50: seven chunks
        rows[at + piece - 1] = s.prefill(ids[at : at + piece])
        at += piece
        poison_free_slots(cache)
    prompt_ends = {1, 3, 15, 16}  # block boundaries at or before the 4 prefills' ends
    for t in ids[at:]:
        rows[at] = s.decode(t)
        at += 1
        poison_free_slots(cache)
        # exactly these blocks keep their window KV: from the window of the block boundary
        # before the step's position (at - 1) on, and the 2 blocks before each point (every
        # 16 blocks, prompt ends)
        points = prompt_ends | set(range(EVERY, at // BS + 1, EVERY))
        keep = set(range(s.table.window_start((at - 1) // BS * BS), len(s.table.blocks)))
        for p in points:
            keep |= set(range(s.table.window_start(p * BS), p))
        has = {j for j, b in enumerate(s.table.blocks) if cache.window_slot(b) >= 0}
        assert has == keep, (at, sorted(has ^ keep))
    pos = sorted(rows)
    ours = np.stack([rows[p] for p in pos])
    assert np.array_equal(ours, ref[pos])
    agree(name, ours, hf_logits(hf, ids)[pos])
    assert m.graph is None or m.graph.replays > replays  # decode steps replayed trimmed
    st = cache.stats()
    assert st.window_points == 3 + 3  # at 64, 128, 192 and the prompt ends 4, 12, 60 (64)
    assert st.blocks_windowed < st.blocks_used / 3


def test_letting_go_one_block_early_is_caught(families, monkeypatch):
    """Trimming a block still in the window of the next position: the forward step refuses
    (never a result from KV that was let go)."""
    _, m, _ = families("gemma3")
    monkeypatch.setattr(
        BlockTable, "window_start", lambda self, n: max(0, n - WINDOW + 1) // BS + 1
    )
    s = m.session(trimmed(m))
    s.prefill(ids_(20, 1))
    with pytest.raises(RuntimeError, match="sliding-window KV of block .* was released"):
        for t in ids_(12, 2):
            s.decode(t)


# ============================================================================ prefix reuse


def test_resume_points_and_their_cost(families, monkeypatch):
    """A 200-token prompt prefilled in chunks of 16 keeps its window KV at every 64 tokens,
    at its end and where it is released.  A prompt diverging at 137 resumes at 128 (the point
    before) and recomputes from there, where the untrimmed cache resumes at 136; it keeps a
    point where it diverged, so the next prompt diverging there resumes at 136."""
    monkeypatch.setattr("goinfer.model.PREFILL_CHUNK", 16)
    _, m, vocab = families("gemma3")
    a = ids_(200, 3, vocab)
    full = KVCache(m, max_tokens=1024, block_size=BS, trim_windows=False)
    cache = trimmed(m)
    for c in (cache, full):
        s = m.session(c)
        s.prefill(a)
        s.reset()
    assert cache.stats().window_points == 4  # 64, 128, 192 and the end (200)
    for tail, want_trimmed in (
        (ids_(9, 4, vocab), 128),
        (ids_(9, 5, vocab), 136),
        (ids_(5, 6, vocab), 136),
    ):
        b = a[:137] + tail
        ref = m.logits(b)
        got = {}
        for c in (cache, full):
            s = m.session(c)
            r = s.generate(b, max_tokens=1)
            got[c] = r.cached_tokens
            poison_free_slots(cache)
            assert np.array_equal(s.decode(r.tokens[0]), m.logits(b + r.tokens)[-1])
            assert r.tokens == [int(ref[-1].argmax())]
            s.reset()
        assert got == {cache: want_trimmed, full: 136}
    # a prompt ending inside the last block of `a` resumes at its last block boundary
    s = m.session(cache)
    r = s.generate(a[:199] + ids_(3, 7, vocab), max_tokens=1)
    assert r.cached_tokens == 196


def test_agent_turns(families):
    """An agent resends its whole history each turn: on one session, and on a fresh session
    per turn (as the server does), the trimmed cache reuses what the untrimmed one does up to
    the last block boundary, and replies the same tokens."""
    _, m, vocab = families("gemma3")
    for per_turn in (False, True):
        caches = {
            "trim": trimmed(m),
            "full": KVCache(m, max_tokens=1024, block_size=BS, trim_windows=False),
        }
        history = {k: [] for k in caches}
        sessions = {k: m.session(c) for k, c in caches.items()}
        for turn in range(6):
            new = ids_(23 + 7 * turn, 20 + turn, vocab)
            out = {}
            for k, c in caches.items():
                if per_turn:
                    sessions[k] = m.session(c)
                prompt = history[k] + new
                r = sessions[k].generate(prompt, max_tokens=6)
                poison_free_slots(caches["trim"])
                out[k] = (r.tokens, r.cached_tokens)
                history[k] = prompt + r.tokens
                if per_turn:
                    sessions[k].reset()
            assert out["trim"][0] == out["full"][0]
            full_cached = out["full"][1]
            assert full_cached - full_cached % BS - BS <= out["trim"][1] <= full_cached
        assert history["trim"] == history["full"]
        ref = m.logits(history["trim"])
        assert [int(x) for x in ref[-7:-1].argmax(-1)] == history["trim"][-6:]


def test_truncate_into_a_trimmed_region_recomputes(families):
    _, m, vocab = families("gemma3")
    ids = ids_(150, 8, vocab)
    ref = m.logits(ids)
    s = m.session(trimmed(m))
    s.prefill(ids[:10])
    for t in ids[10:100]:
        s.decode(t)
    for n in (97, 90, 64, 41):  # within the window, past it, at a point, between points
        s.truncate(n)
        assert s.n_tokens == n and s.tokens == ids[:n]
        poison_free_slots(s.cache)
        assert np.array_equal(s.decode(ids[n]), ref[n])


def test_fork_batching_and_graph_replay(families):
    """Forks of a long session decode apart in one batch (graph-replayed steps) with the bits
    of each alone; each lets go of its own window KV, the shared blocks' stays while either
    needs it."""
    _, m, vocab = families("gemma4")
    ids = ids_(120, 9, vocab)
    alt = ids[:90] + ids_(30, 10, vocab)
    ref, ref_alt = m.logits(ids), m.logits(alt)
    cache = trimmed(m)
    a = m.session(cache)
    a.prefill(ids[:60])
    b = a.fork()
    c = m.session(cache)
    c.prefill(ids[:30])
    replays = m.graph.replays
    for p in range(60, 90):  # a and b decode the same tokens, c lags behind
        la, lb, lc = forward_sessions([(a, [ids[p]]), (b, [ids[p]]), (c, [ids[p - 30]])])
        poison_free_slots(cache)
        assert np.array_equal(la, ref[p]) and np.array_equal(lb, ref[p])
        assert np.array_equal(lc, ref[p - 30])
    for p in range(90, 120):  # now apart
        la, lb = forward_sessions([(a, [ids[p]]), (b, [alt[p]])])
        poison_free_slots(cache)
        assert np.array_equal(la, ref[p]) and np.array_equal(lb, ref_alt[p])
    assert m.graph.replays >= replays + 50


def test_drafts_on_a_trimmed_cache(families):
    """Prompt-lookup drafts (verified in one step, rolled back to the accepted tokens) give
    the tokens of plain greedy decoding on an untrimmed cache."""
    _, m, vocab = families("gemma3")
    pattern = ids_(11, 12, vocab)
    prompt = (pattern * 9)[:95]
    plain = m.session(KVCache(m, max_tokens=1024, block_size=BS, trim_windows=False))
    want = plain.generate(prompt, max_tokens=60).tokens
    s = m.session(trimmed(m))
    r = s.generate(prompt, max_tokens=60, draft="prompt_lookup", draft_tokens=6)
    assert r.tokens == want
    assert r.timings.draft_accepted > 0


# ============================================================================ save and load


def _header(path):
    raw = open(path, "rb").read()
    version, hlen = struct.unpack("<IQ", raw[10:22])
    return version, json.loads(raw[22 : 22 + hlen])


def test_save_and_load_keep_the_points(families, tmp_path, monkeypatch):
    """A trimmed cache saves blocks without the window KV they no longer have (version 3,
    smaller than the untrimmed cache's file), with its points; loaded back, a prompt resumes at
    the same points with the same bits.  A cache that keeps every window (trim_windows=False)
    loads only the blocks that still have theirs."""
    monkeypatch.setattr("goinfer.model.PREFILL_CHUNK", 16)
    _, m, vocab = families("gemma4")
    a = ids_(150, 13, vocab)
    cache, full = trimmed(m), KVCache(m, max_tokens=1024, block_size=BS, trim_windows=False)
    for c in (cache, full):
        s = m.session(c)
        s.prefill(a)
        s.reset()
    n = cache.save(tmp_path / "t.kv")
    assert n == full.save(tmp_path / "f.kv") == 150 // BS
    (vt, ht), (vf, hf) = _header(tmp_path / "t.kv"), _header(tmp_path / "f.kv")
    assert (vt, vf) == (3, 2) and ht["window_layers"] == list(cache.window_layers)
    assert sum(not b.get("window", True) for b in ht["blocks"]) > n // 2
    assert ht["payload_bytes"] < 0.7 * hf["payload_bytes"]
    assert len(ht["points"]) == cache.stats().window_points == 3  # 64, 128, the end (148)
    b = a[:131] + ids_(6, 14, vocab)
    loaded = KVCache.load(m, tmp_path / "t.kv")
    assert loaded.window and loaded.stats().window_points == 3
    s = m.session(loaded)
    r = s.generate(b, max_tokens=0)
    assert r.cached_tokens == 128
    poison_free_slots(loaded)
    assert np.array_equal(s.prefill([b[-1]]), m.logits(b + [b[-1]])[-1])
    keep_all = KVCache(m, max_tokens=1024, block_size=BS, trim_windows=False)
    got = keep_all.load(tmp_path / "t.kv")
    assert got == sum(b.get("window", True) for b in ht["blocks"]) < n
    with pytest.raises(CacheFileError, match="corrupt header"):
        bad = bytearray(open(tmp_path / "t.kv", "rb").read())
        bad[22 : 22 + 1] = b"["
        (tmp_path / "bad.kv").write_bytes(bytes(bad))
        KVCache.load(m, tmp_path / "bad.kv")


# ============================================================================ bytes held


def test_bytes_held(families):
    """stats().bytes_held counts every held block's other layers and the window KV kept;
    with trim_windows=False every block keeps it (the bytes of the whole model per token)."""
    _, m, vocab = families("gemma3")
    ids = ids_(300, 15, vocab)
    c = trimmed(m)
    s = m.session(c)
    s.prefill(ids[:4])
    for t in ids[4:]:
        s.decode(t)
    st = c.stats()
    n_win = len(c.window_layers)
    per_layer = st.bytes_per_block // c.n_layers  # (every cache layer has one geometry here)
    assert (
        st.bytes_held
        == (st.blocks_used * (c.n_layers - n_win) + st.blocks_windowed * n_win) * per_layer
    )
    assert st.blocks_windowed == sum(c.window_slot(b) >= 0 for b in s.table.blocks)
    f = KVCache(m, max_tokens=1024, block_size=BS, trim_windows=False)
    sfull = m.session(f)
    sfull.prefill(ids)
    sf = f.stats()
    assert sf.window == 0 and sf.bytes_held == sf.blocks_used * sf.bytes_per_block
    assert st.bytes_held < 0.35 * sf.bytes_held  # 1 of 7 layers global, windows kept: 4 points
    assert "6 layers keep a 8-token window" in repr(c)


# ============================================================================ the server


def _untrimmed_lone(m, prompt, **kw):
    """The reference: the request alone on a fresh cache that keeps every window."""
    s = m.session(KVCache(m, max_tokens=2048, block_size=BS, trim_windows=False))
    return s.generate(prompt, **kw)


def test_server_batches_and_turns(families):
    """Through the OpenAI-compatible server on a trimming cache: requests several windows long
    admitted together (decode steps and prompt chunks of 16 in one forward step, trimmed
    between steps) each equal the request alone on an untrimmed cache; then an agent's turns,
    each resending its history: the cached tokens reported are the untrimmed cache's (to the
    block boundary before), and each turn's reply is the cold run's."""
    from test_server import Server

    _, m, vocab = families("gemma3")
    shared = ids_(40, 30, vocab)
    prompts = [shared + ids_(20 + 17 * i, 31 + i, vocab) for i in range(5)]
    settings = [
        dict(temperature=0.0),
        dict(temperature=0.8, seed=3),
        dict(temperature=0.0),
        dict(temperature=1.0, top_p=0.9, seed=5),
        dict(temperature=0.0),
    ]
    cache = trimmed(m, max_tokens=2048)
    with Server(m, cache, max_batch=8, prefill_chunk=16) as s:

        def run(i):
            return s.client().completions.create(
                model="tiny",
                prompt=prompts[i],
                max_tokens=12 + 3 * i,
                extra_body={"return_tokens": True},
                **settings[i],
            )

        results = s.together(run, len(prompts), timeout=120)
        assert s.engine.peak_batch >= 3
        poison_free_slots(cache)
        history, turns = [], []
        for turn in range(4):
            prompt = history + ids_(30 + 11 * turn, 40 + turn, vocab)
            r = s.client().completions.create(
                model="tiny",
                prompt=prompt,
                max_tokens=8,
                temperature=0,
                extra_body={"return_tokens": True},
            )
            poison_free_slots(cache)
            turns.append(
                (prompt, r.model_dump()["tokens"], r.usage.prompt_tokens_details.cached_tokens)
            )
            history = prompt + r.model_dump()["tokens"]
        assert cache.stats().blocks_used == 0
        st = cache.stats()
        assert st.blocks_windowed < st.blocks_cached / 2  # the windows were trimmed
    for i, r in enumerate(results):
        ref = _untrimmed_lone(m, prompts[i], max_tokens=12 + 3 * i, **settings[i])
        assert r.model_dump()["tokens"] == ref.tokens
    full = KVCache(m, max_tokens=2048, block_size=BS, trim_windows=False)
    for turn, (prompt, tokens, cached) in enumerate(turns):
        assert tokens == _untrimmed_lone(m, prompt, max_tokens=8, temperature=0.0).tokens
        want = full.stats().hit_tokens
        s_full = m.session(full)
        assert s_full.generate(prompt, max_tokens=8, temperature=0.0).tokens == tokens
        want = full.stats().hit_tokens - want  # what the untrimmed cache reuses
        s_full.reset()
        assert want - want % BS - BS <= cached <= want
        if turn:
            assert cached >= len(turns[turn - 1][0]) - BS  # the previous prompt, at least


def test_server_preemption_on_a_trimmed_cache(families):
    """A trimming cache too small for every request: requests wait or are preempted and
    recomputed (resuming at a kept point, or from the start), each result equals the request
    alone."""
    from test_server import Server

    _, m, vocab = families("gpt-oss")
    cache = KVCache(m, max_tokens=160, block_size=BS)  # 40 blocks
    prompts = [ids_(20 + 9 * i, 50 + i, vocab) for i in range(4)]
    with Server(m, cache, max_batch=4) as s:

        def run(i):
            return s.client().completions.create(
                model="tiny",
                prompt=prompts[i],
                max_tokens=40,
                temperature=0.8,
                seed=i,
                extra_body={"return_tokens": True},
            )

        results = s.together(run, 4, timeout=120)
        assert s.engine.n_preempted > 0  # the path under test ran
        assert cache.stats().blocks_used == 0
    for i, r in enumerate(results):
        ref = _untrimmed_lone(m, prompts[i], max_tokens=40, temperature=0.8, seed=i)
        assert r.model_dump()["tokens"] == ref.tokens
