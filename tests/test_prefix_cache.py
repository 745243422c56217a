"""Prefix reuse under random conversation trees: every result equals a cold recomputation bit
for bit (exact mode), generated tokens equal greedy decoding of Model.logits, the tokens
reused from the cache are the ones expected (while nothing was evicted), a full cache raises
CacheFullError without changing the session, evictions under a small budget included, and
no block leaks."""

from __future__ import annotations

import gc
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from goinfer import CacheFullError, ContextLengthError, KVCache
from goinfer.gguf import GGUFFile
from goinfer.model import Model


@pytest.fixture(scope="module")
def model(tiny):
    return Model(
        GGUFFile(tiny("qwen2", 11)[1]), threads=2, progress=False, exact=True, context_length=256
    )


def tokens(lo=1, hi=40):
    """Token lists of a length drawn evenly from lo..hi (not Hypothesis' short-list bias)."""
    return st.integers(lo, hi).flatmap(
        lambda n: st.lists(st.integers(0, 255), min_size=n, max_size=n)
    )


OPS = ["new", "chat", "append", "decode", "fork", "reset", "truncate"]


def branch(data, contexts, room, label):
    """A prompt branching off an earlier one (a shared prefix) plus new tokens, <= room long."""
    base = data.draw(st.sampled_from(contexts), label=f"{label} base")
    hi = min(len(base), room - 1)
    cut = data.draw(st.just(hi) | st.integers(0, hi), label=f"{label} cut")  # often all of it
    return base[:cut] + data.draw(tokens(1, min(40, room - cut)), label=f"{label} suffix")


@pytest.mark.parametrize("budget", ["tight", "ample"])
def test_random_conversation_trees(model, budget):
    """Random conversation trees (the property below) on a cache with room for the first
    prompt and 4..40 tokens more ("tight": evictions and a full cache are common), or with
    room for everything ("ample": nothing is evicted, so the tokens reused are known exactly),
    and what the examples covered."""
    seen = Counter()
    conversation_trees(model, seen, budget)
    if budget == "tight":
        assert seen["checked"] >= 0.5 * seen["steps"], seen
        assert seen["examples with evictions"] >= 1 and seen["examples with CacheFullError"] >= 1, (
            seen
        )
    else:
        assert seen["checked"] + seen["ContextLengthError"] == seen["steps"], seen  # never full
        assert seen["exact reuse checks"] >= seen["steps"] // 4, seen
        assert seen["reused >= 2 blocks"] >= 1, seen


def test_cache_full_during_a_reply_keeps_the_prompt(model):
    """A decode step of generate finds the cache full: the reply is lost with the
    CacheFullError and the session holds exactly its prompt (a prefix of what it was asked to
    hold, ready for a retry), with or without drafting; no block is leaked; once room is made
    the retry reuses the prompt and gives the reference reply.  (Found by
    test_random_conversation_trees[tight]: the session kept the prompt + a sampled token.)"""
    ids = [0] * 11
    for draft in (None, "prompt_lookup"):
        cache = KVCache(model, max_tokens=16, block_size=4)  # 4 blocks
        a, b = model.session(cache), model.session(cache)
        a.prefill([0] * 9)
        b.prefill([0])  # every block is held: a's 4th block (positions 12..15) cannot be had
        with pytest.raises(CacheFullError):
            a.generate(ids, max_tokens=3, draft=draft)  # decodes position 12
        assert a.tokens == ids
        assert cache.stats().blocks_used == len(a.block_table) + len(b.block_table) == 4
    b.reset()
    r = a.generate(ids, max_tokens=3)
    ref = model.session(KVCache(model, max_tokens=64)).generate(ids, max_tokens=3)
    assert r.tokens == ref.tokens and r.cached_tokens == len(ids) - 1


def lcp(a, b) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def reusable(histories, ids, limit, bs) -> int:
    """Tokens of ids[:limit] a cache that has evicted nothing can serve: the longest
    whole-block prefix shared with a history some session held (its full blocks were hashed)."""
    return max((min(lcp(h, ids), limit) // bs * bs for h in histories), default=0)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def conversation_trees(model, seen, budget, data):
    """Every step either computes logits that equal a cold recomputation (Model.logits of the
    whole history, bit for bit), or raises CacheFullError / ContextLengthError and leaves the
    session as it was (a whole-context call: holding a prefix of its prompt); generated
    tokens equal greedy decoding of Model.logits.  The first step always fits."""
    first = data.draw(tokens(8, 40), label="first prompt")
    tight = budget == "tight"
    # ample: blocks of 4 or 8, so that prompts share several whole blocks
    block_size = data.draw(st.sampled_from([4, 8, 16] if tight else [4, 8]), label="block_size")
    spare = data.draw(st.integers(4, 40), label="spare") if tight else 1000
    cache = KVCache(model, max_tokens=len(first) + spare, block_size=block_size)
    n_ctx = model.n_ctx
    sessions = []
    contexts = [[]]  # prompts seen so far: new prompts branch off them (shared prefixes)
    n_steps = data.draw(st.integers(4, 14), label="steps")
    checked = full = too_long = 0
    f = None
    histories = []  # every token history a session held at the end of a step
    for step in range(n_steps):
        histories.extend(x.tokens for x in sessions)
        op = "new" if step == 0 else data.draw(st.sampled_from(OPS), label="op")
        if op == "new" or not sessions:
            s = model.session(cache)
            sessions.append(s)
        else:
            s = data.draw(st.sampled_from(sessions), label="session")
        before = s.tokens
        ref_tokens = None  # chat: the generated tokens, checked against Model.logits
        st0 = cache.stats()
        exact_reuse = st0.evictions == 0  # else only lower bounds on what is reused
        try:
            if op == "new":
                ids = first if step == 0 else branch(data, contexts, n_ctx, "prompt")
                contexts.append(ids)
                got, want_ids = s.prefill(ids), ids
                if exact_reuse:  # whole cached blocks
                    hit = reusable(histories, ids, len(ids) - 1, block_size)
                    assert cache.stats().hit_tokens - st0.hit_tokens == hit
                    seen["exact reuse checks"] += 1
                    seen["reused >= 2 blocks"] += hit >= 2 * block_size
            elif op == "chat":  # whole-context call branching off an earlier prompt
                k = data.draw(st.integers(0, 3), label="max_tokens")
                ids = branch(data, contexts, n_ctx - k - 1, "chat")
                r = s.generate(ids, max_tokens=k)
                ids = ids + r.tokens  # (for the CacheFullError check, if decode(5) raises)
                prompt = ids[: len(ids) - len(r.tokens)]
                limit = len(prompt) - 1
                own = min(lcp(before, prompt), limit)  # its own history: always reused
                assert own <= r.cached_tokens <= limit
                if exact_reuse:
                    from_cache = reusable(histories, prompt, limit, block_size)
                    assert r.cached_tokens == max(own, from_cache)
                    seen["exact reuse checks"] += 1
                    seen["reused >= 2 blocks"] += from_cache >= 2 * block_size
                contexts.append(ids)
                # the session holds the prompt and the generated tokens, except the last one
                # when it stopped on length (that one is fed by the next call)
                held = len(ids) - (r.finish_reason == "length" and k > 0)
                assert s.tokens == ids[:held]
                ref_tokens, k_asked, p0 = r.tokens, k, limit
                got, want_ids = s.decode(5), ids[:held] + [5]
            elif op == "append":
                extra = data.draw(tokens(), label="extra")
                got, want_ids = s.prefill(extra), before + extra
                n0 = len(before)
                if exact_reuse and n0 % block_size == 0:  # whole cached blocks after its own
                    hit = reusable(histories, want_ids, len(want_ids) - 1, block_size) - n0
                    assert cache.stats().hit_tokens - st0.hit_tokens == max(0, hit)
                    seen["exact reuse checks"] += 1
                    seen["reused >= 2 blocks"] += hit >= 2 * block_size
            elif op == "decode":
                t = data.draw(st.integers(0, 255))
                got, want_ids = s.decode(t), before + [t]
            elif op == "fork":
                f = s.fork()
                sessions.append(f)
                t = data.draw(st.integers(0, 255))
                got, want_ids = f.decode(t), before + [t]
                assert s.tokens == before  # the original is untouched by the fork's write
                s = f
            else:
                n = 0 if op == "reset" else data.draw(st.integers(0, len(before)), label="keep")
                if op == "reset":
                    s.reset()
                else:
                    s.truncate(n)
                assert s.tokens == before[:n]
                before = before[:n]  # the decode below is what may fail
                t = data.draw(st.integers(0, 255))
                got, want_ids = s.decode(t), before + [t]
        except CacheFullError:
            # a whole-context call holds a prefix of its prompt (its own history cut to what it
            # shares with the prompt, or blocks from the cache; with the reply if decode(5)
            # raised): a retry resumes from there; every other call leaves the tokens exactly
            # as they were
            toks = s.tokens
            assert toks == ids[: len(toks)] if op == "chat" else toks == before, op
            full += 1
            max(sessions, key=lambda x: x.n_tokens).reset()  # the agent frees room
            continue
        except ContextLengthError:
            assert s.tokens == before, op
            too_long += 1
            continue
        assert s.tokens == want_ids
        ref = model.logits(want_ids)  # (len, vocab), computed from scratch in a private cache
        assert np.array_equal(got, ref[-1]), op
        if ref_tokens is not None:  # greedy: each token is the argmax given the ones before
            assert ref_tokens == [int(np.argmax(ref[p0 + j])) for j in range(len(ref_tokens))]
            if len(ref_tokens) < k_asked:  # stopped early: on a stop token
                assert int(np.argmax(ref[p0 + len(ref_tokens)])) in model.tokenizer.stop_ids
        checked += 1
    assert checked + full + too_long == n_steps and checked >= 1
    seen.update(
        {
            "steps": n_steps,
            "checked": checked,
            "ContextLengthError": too_long,
            "examples with evictions": cache.stats().evictions > 0,
            "examples with CacheFullError": full > 0,
        }
    )
    st_ = cache.stats()
    assert st_.blocks_used + st_.blocks_cached + st_.blocks_free == st_.blocks_total
    sessions.clear()
    s = f = None  # noqa: F841
    gc.collect()
    st_ = cache.stats()
    assert st_.blocks_used == 0, st_
    assert st_.blocks_free + st_.blocks_cached == st_.blocks_total


def test_whole_context_call_takes_a_longer_cached_prefix(model):
    """A session whose own history shares 20 tokens (not a block boundary) with the prompt
    takes the 32 tokens (2 blocks) another session left in the cache."""
    cache = KVCache(model, max_tokens=512, block_size=16)
    x = list(range(40, 90))
    model.session(cache).prefill(x[:40])  # blocks x[0:16], x[16:32] hashed
    c = model.session(cache)
    c.prefill(x[:20] + [1, 2, 3])
    r = c.generate(x[:45], max_tokens=0)
    assert r.cached_tokens == 32
    assert np.array_equal(c.decode(7), model.logits(x[:45] + [7])[-1])


def test_cache_salt_isolates_tenants(model):
    cache = KVCache(model, max_tokens=512, block_size=8)
    ids = list(range(40))
    a = model.session(cache, cache_salt="tenant-a")
    a.prefill(ids)
    same = model.session(cache, cache_salt="tenant-a").generate(ids + [1], max_tokens=1)
    other = model.session(cache, cache_salt="tenant-b").generate(ids + [1], max_tokens=1)
    none = model.session(cache).generate(ids + [1], max_tokens=1)
    assert same.cached_tokens == 40 and other.cached_tokens == 0 and none.cached_tokens == 0


def test_stats_count_hits_and_misses(model):
    cache = KVCache(model, max_tokens=512, block_size=8)
    s = model.session(cache)
    s.generate(list(range(30)), max_tokens=1)
    st0 = cache.stats()
    assert st0.hit_tokens == 0 and st0.miss_tokens == 30
    s2 = model.session(cache)
    r = s2.generate(list(range(30)) + [7, 8], max_tokens=1)
    st1 = cache.stats()
    assert r.cached_tokens == 24  # three full blocks of 8
    assert st1.hit_tokens - st0.hit_tokens == 24 and st1.miss_tokens - st0.miss_tokens == 8


def test_exact_mode_never_reuses_fast_blocks(model, tiny):
    """A block is keyed by the kernel its rows used: a block tagged fast (rows at positions
    >= 512 in the default mode) is never found by an exact-mode model, and is found by a
    default-mode model of the same file at a position where it runs fast."""
    from goinfer.kv_cache import FAST, block_hash, root_hash

    fast_model = Model(
        GGUFFile(tiny("qwen2", 11)[1]), threads=1, progress=False, context_length=1024
    )
    cache = KVCache(model, max_tokens=1024, block_size=256)
    toks = list(range(256))
    chain = [root_hash(None)]
    for i in range(3):  # blocks 0, 1 (positions < 512): exact; block 2: fast
        mode = fast_model.mode_at(256 * (i + 1) - 1)
        b = cache.allocate()
        chain.append(block_hash(chain[-1], toks, mode))
        cache.commit(b, chain[-1], chain[-2], toks, mode)
        cache.release([b])
    assert mode == FAST
    assert model.session(cache)._extend_from_cache(toks * 3 + [1], 768) == 512
    assert fast_model.session(cache)._extend_from_cache(toks * 3 + [1], 768) == 768
