"""RoPE cos / sin per batch (goinfer/models/base.py RopeCache): the rows of a batch's positions,
bit for bit the rows of a table of every position, and nothing kept that grows with the
positions used (no table up to the context)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from goinfer import _reference as R
from goinfer.models.base import Batch, RopeCache, Yarn


def table(n_rot, base, n_pos, freq_factors=None, scale=1.0, yarn=None):
    """cos, sin (n_pos, n_rot/2) float64 of every position: angle (pos / scale) * inv_freq_i
    (Yarn.inv_freq with YaRN, else base^(-2i/n_rot) / factor_i), times YaRN's mscale."""
    if yarn is None and scale == 1.0:
        return R.rope_tables(n_rot, base, n_pos, freq_factors)  # the NumPy reference
    i = np.arange(n_rot // 2, dtype=np.float64)
    inv = base ** (-2.0 * i / n_rot) if yarn is None else yarn.inv_freq(n_rot, base)
    if freq_factors is not None:
        inv = inv / np.asarray(freq_factors, dtype=np.float64)
    ang = (np.arange(n_pos, dtype=np.float64) / scale)[:, None] * inv[None, :]
    cos, sin = np.cos(ang), np.sin(ang)
    m = 1.0 if yarn is None else yarn.mscale
    return (cos * m, sin * m) if m != 1.0 else (cos, sin)


def same_bits(a, b) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.int64), b.view(np.int64))


def batch_at(positions) -> Batch:
    positions = np.asarray(positions, dtype=np.int32)  # (T,)
    T = len(positions)
    z = np.zeros(T, np.int64)
    return Batch(z.astype(np.int32), positions, z, [], z)


KINDS = ["plain", "freq_factors", "scale", "yarn", "yarn_untruncated"]


def rope_of(kind: str, n_rot: int, base: float) -> dict:
    half = n_rot // 2
    return {
        "plain": {},
        "freq_factors": {"freq_factors": np.linspace(1.0, 8.0, half).astype(np.float32)},
        "scale": {"scale": 8.0},
        "yarn": {"yarn": Yarn(32.0, 4096)},
        "yarn_untruncated": {"yarn": Yarn(32.0, 4096, attn_factor=1.3, truncate=False)},
    }[kind]


@settings(max_examples=60, deadline=None)
@given(
    kind=st.sampled_from(KINDS),
    n_rot=st.sampled_from([2, 8, 64, 128, 256]),
    base=st.sampled_from([10000.0, 500000.0, 1e6]),
    start=st.integers(0, 40000),
    T=st.integers(1, 600),
    shuffled=st.booleans(),
)
@example(kind="plain", n_rot=256, base=1e6, start=0, T=1, shuffled=False)  # the first position
@example(kind="plain", n_rot=256, base=10000.0, start=29999, T=1, shuffled=False)  # decode
@example(kind="yarn", n_rot=64, base=150000.0, start=511, T=513, shuffled=False)  # chunk edges
def test_rows_are_the_table_rows(kind, n_rot, base, start, T, shuffled):
    kw = rope_of(kind, n_rot, base)
    pos = np.arange(start, start + T, dtype=np.int32)  # (T,) a prefill chunk's positions
    if shuffled:  # a batch of several sequences: any positions, repeats too
        pos = np.random.default_rng(start).integers(0, start + T, T).astype(np.int32)
    rope = RopeCache(n_rot, base, start + T, **kw)
    cos, sin, rows = rope.rows(batch_at(pos))
    tc, ts = table(n_rot, base, int(pos.max()) + 1, **kw)  # (n_pos, n_rot/2)
    assert cos.shape == sin.shape == (T, n_rot // 2)
    assert np.array_equal(rows, np.arange(T)) and rows.dtype == np.int32
    assert same_bits(cos[rows], tc[pos]) and same_bits(sin[rows], ts[pos])


def test_rows_computed_once_per_batch_and_for_each_rope():
    local, glob = RopeCache(8, 10000.0, 100), RopeCache(8, 1e6, 100)
    b = batch_at([5, 6, 7])
    first = local.rows(b)
    assert local.rows(b) is first  # every layer with this RoPE reuses them
    assert not same_bits(glob.rows(b)[0], first[0])  # another base: its own rows
    assert set(b.rope) == {local, glob}


def test_replaced_yarn_or_factors_take_effect():
    """Tests and tools replace rope.yarn / freq_factors on a loaded model: the next batch's
    rows follow."""
    rope = RopeCache(64, 150000.0, 5000, yarn=Yarn(32.0, 4096))
    pos = np.arange(4000, 4010)
    before = rope.rows(batch_at(pos))[0]
    rope.yarn = Yarn(32.0, 4096, attn_factor=1.0, truncate=False)
    after = rope.rows(batch_at(pos))[0]
    assert same_bits(after, table(64, 150000.0, 4010, yarn=rope.yarn)[0][pos])
    assert not same_bits(after, before)
    rope.freq_factors = np.full(32, 2.0)
    again = rope.rows(batch_at(pos))[0]
    assert same_bits(again, table(64, 150000.0, 4010, np.full(32, 2.0), yarn=rope.yarn)[0][pos])


def test_nothing_kept_grows_with_the_positions():
    """A RopeCache keeps no table of every position up to the context: after rows at
    positions near 100k it holds only the (n_rot/2,) frequencies."""
    rope = RopeCache(256, 1e6, 131072)
    for p0 in (0, 50000, 130000):
        rope.rows(batch_at(np.arange(p0, p0 + 512)))
    held = [v for v in vars(rope).values() if isinstance(v, np.ndarray)]
    held += [a for v in vars(rope).values() if isinstance(v, tuple) for a in v]
    assert sum(a.nbytes for a in held if isinstance(a, np.ndarray)) <= 128 * 8


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_model_keeps_no_table_after_a_long_prefill(tiny, tmp_path, arch):
    """A model's RoPE holds nothing position-sized after a prefill of many chunks (each
    chunk's rows go with its batch; Gemma 3: a local and a global RoPE), and the logits are
    the teacher-forced ones."""
    from fixtures import tinygemma
    from fixtures.compare import load

    if arch == "gemma3":
        hf = tinygemma.hf_model(max_position_embeddings=4096)
        path = tinygemma.write_gguf(hf, tmp_path / "gemma3.gguf")
    else:
        path = tiny(arch, max_position_embeddings=4096)[1]
    m = load(path, 1)
    ids = [int(t) for t in np.random.default_rng(0).integers(3, m.vocab_size, 1100)]
    s = m.session()
    last = s.prefill(ids)
    ropes = {m.impl.layer_rope(li) for li in range(m.config.n_layers)} - {None}
    assert ropes
    for r in ropes:
        assert all(
            not isinstance(v, np.ndarray) or v.size <= m.config.n_rot for v in vars(r).values()
        )
    assert np.array_equal(last, m.logits(ids)[-1])
