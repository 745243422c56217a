"""The BPE merge tables goinfer builds from a vocabulary, on tiny random vocabularies whose tokens
hold the characters a text format of merges would trip on (spaces, newlines, carriage returns,
"#version"), checked against plain-Python references of llama.cpp's two algorithms:

* SentencePiece-style ("llama"): join the adjacent pair whose concatenation is a token with the
  best score, leftmost first; characters left without a token become <0xXX> byte tokens;
* merges ("gemma4"): join the adjacent pair with the lowest merge rank, leftmost first (a merge
  line is cut at the first space after its first character), on runs of newlines and runs of
  other characters, spaces written as "▁".
"""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from goinfer.errors import TokenizerError
from goinfer.tokenizer import TOKEN_TYPE, Tokenizer

# characters of the tokens and texts; "c" is never a token (byte fallback)
ALPHABET = ["a", "b", "\u2581", " ", "\n", "\r", "#", "\u00e9"]
TEXT_ALPHABET = [*ALPHABET, "c"]
BYTES = [f"<0x{b:02X}>" for b in range(256)]

_multi = st.lists(
    st.text(alphabet=ALPHABET, min_size=2, max_size=6) | st.just("#version"),
    unique=True,
    max_size=40,
)
_singles = st.lists(st.sampled_from(ALPHABET), unique=True, min_size=1)
_scores = st.integers(-6, 6)  # few values: ties are common


def _ids_of(syms: list[str], ids: dict[str, int]) -> list[int]:
    out: list[int] = []
    for s in syms:
        if s in ids:
            out.append(ids[s])
        else:  # byte fallback
            out.extend(ids[f"<0x{b:02X}>"] for b in s.encode("utf-8"))
    return out


def _ref_spm(text: str, ids: dict[str, int], score: dict[str, float]) -> list[int]:
    """llama.cpp's llm_tokenizer_spm, without the prefix space."""
    syms = list(text.replace(" ", "\u2581"))
    while True:
        best: tuple[float, int] | None = None
        for j in range(len(syms) - 1):
            t = syms[j] + syms[j + 1]
            if t in ids and (best is None or score[t] > best[0]):
                best = (score[t], j)
        if best is None:
            break
        j = best[1]
        syms[j : j + 2] = [syms[j] + syms[j + 1]]
    return _ids_of(syms, ids)


def _ref_merges(text: str, ids: dict[str, int], rank: dict[tuple[str, str], int]) -> list[int]:
    """llama.cpp's gemma4 tokenizer: newline runs, "▁" for spaces, merges by rank."""
    out: list[int] = []
    for word in re.findall(r"[^\n]+|\n+", text.replace(" ", "\u2581")):
        if word[0] == "\n" and word in ids:
            out.append(ids[word])
            continue
        syms = list(word)
        while True:
            cands = [
                (rank[(syms[j], syms[j + 1])], j)
                for j in range(len(syms) - 1)
                if (syms[j], syms[j + 1]) in rank
            ]
            if not cands:
                break
            _, j = min(cands)
            syms[j : j + 2] = [syms[j] + syms[j + 1]]
        out.extend(_ids_of(syms, ids))
    return out


def _words(singles: list[str], multi: list[str]) -> list[str]:
    """The tokens: `singles`, every character of the `multi` tokens, then those (goinfer's
    tables need the characters of a token to be tokens, as in real vocabularies; llama.cpp
    would also join two characters that are no tokens into one that is)."""
    chars = [c for w in multi for c in w]
    return list(dict.fromkeys(singles + chars + multi))


@st.composite
def spm_vocab(draw) -> tuple[list[str], list[float]]:
    words = _words(draw(_singles), draw(_multi))
    tokens = ["<unk>", *BYTES, *words]
    scores = [0.0] * (1 + len(BYTES)) + [float(draw(_scores)) for _ in words]
    return tokens, scores


def _spm(tokens: list[str], scores: list[float]) -> Tokenizer:
    types = [TOKEN_TYPE.UNKNOWN] + [TOKEN_TYPE.BYTE] * len(BYTES)
    types += [TOKEN_TYPE.NORMAL] * (len(tokens) - len(types))
    return Tokenizer(
        model="llama",
        tokens=tokens,
        scores=scores,
        token_types=types,
        unk_id=0,
        add_space_prefix=False,
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(vocab=spm_vocab(), text=st.text(alphabet=TEXT_ALPHABET, max_size=30))
@example(
    vocab=(
        ["<unk>", *BYTES, *"a \n\r\u2581b#versio", "a b", "\n\n", "a\r", "\r\n", "#version"],
        [0.0] * 257 + [0.0] * 13 + [-1.0, -1.0, -2.0, -3.0, -1.0],
    ),
    text="a b\n\n\r\na\r a\n",
)
def test_spm_matches_reference(vocab, text):
    tokens, scores = vocab
    ids = {t: i for i, t in enumerate(tokens)}
    score = dict(zip(tokens, scores, strict=True))
    assert _spm(tokens, scores).encode(text) == _ref_spm(text, ids, score)


@st.composite
def merges_vocab(draw) -> tuple[list[str], list[str]]:
    words = _words(draw(_singles), draw(_multi))
    tokens = [*BYTES, *words]
    # merge lines "a b": a has no space after its first character (the line is cut at the first
    # space after it), b anything; some name missing tokens, which are left out
    parts = st.sampled_from(words) | st.text(alphabet=ALPHABET, min_size=1, max_size=3)
    pairs = draw(
        st.lists(
            st.tuples(parts.filter(lambda a: " " not in a[1:]), parts), unique=True, max_size=60
        )
    )
    return tokens, [f"{a} {b}" for a, b in pairs]


def _gemma4(tokens: list[str], merges: list[str]) -> Tokenizer:
    types = [TOKEN_TYPE.BYTE] * len(BYTES) + [TOKEN_TYPE.NORMAL] * (len(tokens) - len(BYTES))
    return Tokenizer(model="gemma4", tokens=tokens, token_types=types, merges=merges)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(vocab=merges_vocab(), text=st.text(alphabet=TEXT_ALPHABET, max_size=30))
@example(
    vocab=(
        [*BYTES, *"ab \n\r#versio", " a", "a b", "  ", "a\n", "\n\r", "#version"],
        [" a b", "  ", "a \n", "  a", "\n \r", "# version", "a\n \r"],
    ),
    text="a ab\n\r a\n\r#",
)
def test_merges_match_reference(vocab, text):
    tokens, merges = vocab
    if not merges:
        return  # a vocabulary without merges is refused (tested below)
    ids = {t: i for i, t in enumerate(tokens)}
    rank: dict[tuple[str, str], int] = {}
    for m in merges:
        k = m.find(" ", 1)
        a, b = m[:k], m[k + 1 :]
        if a in ids and b in ids and a + b in ids:
            rank.setdefault((a, b), len(rank))
    assert _gemma4(tokens, merges).encode(text) == _ref_merges(text, ids, rank)


def test_byte_level_drops_merges_of_missing_tokens():
    tokens = ["a", "b", "c", "ab", "bc"]
    # "x c" names a missing token, "b c" makes "bc", "a bc" a missing "abc"
    tok = Tokenizer(model="gpt2", tokens=tokens, merges=["x c", "b c", "a b", "a bc"], pre="gpt2")
    assert tok.encode("abc") == [0, 4]  # b+c ranks before a+b
    assert tok.encode("ab") == [3]
    with pytest.raises(TokenizerError, match="malformed merge 'ab'"):
        Tokenizer(model="gpt2", tokens=tokens, merges=["a b", "ab"], pre="gpt2")
    with pytest.raises(TokenizerError, match="merges"):
        Tokenizer(model="gemma4", tokens=tokens, merges=[])


def test_duplicate_texts_keep_their_ids():
    # the model's vocabulary knows a duplicated text by its last id; the tokenizer knows both
    tokens = ["a", "b", "ab", "a"]
    tok = Tokenizer(model="gpt2", tokens=tokens, merges=["a b"], pre="gpt2")
    assert [tok.id_to_token(i) for i in range(4)] == tokens
    assert tok.token_to_id("a") == 3 and tok.token_bytes(0) == b"a"
    assert tok.encode("aab") == [3, 2]
    with pytest.raises(TokenizerError, match="not a token"):
        tok.token_to_id("c")
