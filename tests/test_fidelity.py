"""goinfer.fidelity (perplexity, compare) and their CLI commands, on a tiny random model."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from goinfer import cli, fidelity
from goinfer._kernels import attention_counters, reset_attention_counters
from goinfer.gguf import GGUFFile
from goinfer.model import Model

TEXT = "The quick brown fox jumps over the lazy dog. " * 40 + "def f(x):\n    return x * 2\n" * 30


@pytest.fixture(scope="module")
def path(tiny):
    return tiny("llama", 21, max_position_embeddings=2048)[1]


@pytest.fixture(scope="module")
def model(path):
    return Model(GGUFFile(path), threads=1, progress=False)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(2, 3000), ctx=st.integers(2, 700), data=st.data())
def test_windows_score_every_token_once(n, ctx, data):
    stride = data.draw(st.integers(1, ctx))
    wins = fidelity.windows(n, ctx, stride)
    scored = np.zeros(n, int)
    for b, e, s in wins:
        assert 0 <= b < s <= e <= n and e - b <= ctx
        scored[s:e] += 1
    assert scored[0] == 0 and scored.max() <= 1
    if stride < ctx:  # overlapping windows: every token after the first, exactly once
        assert (scored[1:] == 1).all()
    else:  # disjoint windows: all but each window's first token
        assert set(np.flatnonzero(scored == 0)) == set(range(0, n, ctx))


def test_windows_errors():
    for args in ((10, 1, 1), (10, 8, 0), (10, 8, 9), (1, 8, 4)):
        with pytest.raises(ValueError):
            fidelity.windows(*args)


def _ppl_reference(model, ids, ctx, stride):
    """the definition, the obvious way: Model.logits of each window (one prefill call)"""
    total, n = 0.0, 0
    for b, e, s in fidelity.windows(len(ids), ctx, stride):
        lg = model.logits(ids[b:e]).astype(np.float64)  # (e - b, vocab)
        for t in range(s, e):
            row = lg[t - 1 - b]
            total += float(np.log(np.exp(row - row.max()).sum()) + row.max() - row[ids[t]])
            n += 1
    return math.exp(total / n), n


@pytest.mark.parametrize("ctx, stride", [(64, 48), (100, 100), (600, 200)])
def test_perplexity_matches_definition(model, ctx, stride):
    ids = fidelity.read_ids(model, _write(TEXT))[:700]
    r = fidelity.perplexity(model, ids, ctx, stride, progress=False)
    ref, n = _ppl_reference(model, ids.tolist(), ctx, stride)
    assert r.n_scored == n == len(ids) - 1 - (len(ids) - 1) // ctx * (stride == ctx)
    assert abs(r.perplexity - ref) <= 1e-9 * ref
    assert r.tokens_per_second > 0 and r.n_windows == len(fidelity.windows(len(ids), ctx, stride))


def test_perplexity_fast_windows_run_fast(model):
    """rows at window positions >= 512 run the fast kernel, unless the model is exact"""
    ids = fidelity.read_ids(model, _write(TEXT))[:800]
    reset_attention_counters()
    fast = fidelity.perplexity(model, ids, 600, 300, progress=False)
    assert attention_counters()["fast_calls"] > 0
    exact_model = Model(GGUFFile(model.path), threads=2, exact=True, progress=False)
    reset_attention_counters()
    exact = fidelity.perplexity(exact_model, ids, 600, 300, progress=False)
    assert attention_counters()["fast_calls"] == 0
    assert fast.perplexity != exact.perplexity
    assert abs(math.log(fast.perplexity / exact.perplexity)) < 1e-3


def _compare_reference(ma, mb, ids, ctx, stride):
    """compare's numbers by their definitions, from Model.logits of each window."""
    rows_a, rows_b, tgt, pos = [], [], [], []
    for b, e, s in fidelity.windows(len(ids), ctx, stride):
        la, lb = ma.logits(ids[b:e]), mb.logits(ids[b:e])  # (e - b, vocab)
        rows_a.append(la[s - 1 - b : e - 1 - b])
        rows_b.append(lb[s - 1 - b : e - 1 - b])
        tgt.extend(ids[s:e])
        pos.extend(range(s - 1, e - 1))
    x, y = np.concatenate(rows_a).astype(np.float64), np.concatenate(rows_b).astype(np.float64)
    cos = (x * y).sum(1) / np.linalg.norm(x, axis=1) / np.linalg.norm(y, axis=1)
    rows = np.arange(len(tgt))

    def nll(z):
        m = z.max(1)
        return np.log(np.exp(z - m[:, None]).sum(1)) + m - z[rows, tgt]

    return dict(
        n_scored=len(tgt),
        top1_agreement=float((x.argmax(1) == y.argmax(1)).mean()),
        cosine_mean=float(cos.mean()),
        cosine_min=float(cos.min()),
        worst_position=pos[int(cos.argmin())],
        nll_a=float(nll(x).mean()),
        nll_b=float(nll(y).mean()),
    )


def test_compare_matches_definition_fast_vs_exact(path):
    ids = fidelity.read_ids(Model(GGUFFile(path), progress=False), _write(TEXT))[:800]
    a = Model(GGUFFile(path), threads=2, progress=False)
    b = Model(GGUFFile(path), threads=1, exact=True, progress=False)
    r = fidelity.compare(b, a, ids, 600, 300, progress=False)
    want = _compare_reference(b, a, ids.tolist(), 600, 300)
    assert (r.n_scored, r.worst_position) == (want["n_scored"], want["worst_position"])
    assert r.n_scored == len(ids) - 1 and r.top1_agreement == want["top1_agreement"]
    for k in ("cosine_mean", "cosine_min", "nll_a", "nll_b"):
        assert abs(getattr(r, k) - want[k]) <= 1e-12 * max(1.0, abs(want[k])), k
    assert abs(r.nll_diff_mean - (want["nll_b"] - want["nll_a"])) <= 1e-12
    assert r.cosine_min < 1.0  # the fast windows differ
    assert r.cosine_min > 0.9999 and r.top1_agreement >= 0.99 and abs(r.nll_diff_mean) < 1e-3
    assert (
        abs(r.nll_a - math.log(fidelity.perplexity(b, ids, 600, 300, progress=False).perplexity))
        < 1e-9
    )


def test_parse_settings():
    assert fidelity.parse_settings("exact=true, threads=2") == {"exact": True, "threads": 2}
    assert fidelity.parse_settings("exact_prefill=true") == {"exact": True}  # the old name
    assert fidelity.parse_settings("model=a.gguf,exact-prefill=0") == {
        "model": "a.gguf",
        "exact": False,
    }
    for bad in ("speed=3", "exact=maybe", "threads=x", "model"):
        with pytest.raises(ValueError):
            fidelity.parse_settings(bad)


def test_load_pair_shares_weights(path):
    a, b = fidelity.load_pair(str(path), {"exact": True}, {}, progress=False)
    assert a.impl is b.impl and a.exact and not b.exact


def test_cli(path, tmp_path, capsys):
    f = _write(TEXT)
    out = tmp_path / "p.json"
    assert (
        cli.main(
            [
                "perplexity",
                str(path),
                f,
                "--ctx",
                "128",
                "--json",
                str(out),
                "--max-tokens",
                "300",
                "--skip-tokens",
                "7",
                "--threads",
                "1",
            ]
        )
        == 0
    )
    assert "perplexity" in capsys.readouterr().out
    d = json.loads(out.read_text())
    assert d["ctx"] == 128 and d["stride"] == 64 and d["perplexity"] > 1 and d["n_tokens"] == 300
    m = Model(GGUFFile(path), threads=1, progress=False)
    ids = fidelity.read_ids(m, f, 300, 7)
    assert ids.tolist() == fidelity.read_ids(m, f)[7:307].tolist()
    ref = fidelity.perplexity(m, ids, 128, progress=False)
    assert d["perplexity"] == ref.perplexity
    assert (
        cli.main(
            [
                "compare",
                str(path),
                "--a",
                "exact=true,threads=1",
                "--b",
                "exact_prefill=false,threads=1",
                f,
                "--ctx",
                "128",
                "--max-tokens",
                "300",
            ]
        )
        == 0
    )
    assert "top-1 agreement 1.0000" in capsys.readouterr().out
    assert cli.main(["compare", str(path), "--a", "nope=1", "--b", "", f]) == 2
    assert cli.main(["perplexity", str(path), f, "--ctx", "5000"]) == 2  # > context: typed error


_files: dict = {}


def _write(text):
    import tempfile

    if text not in _files:
        fd = tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8")
        fd.write(text)
        fd.close()
        _files[text] = fd.name
    return _files[text]
