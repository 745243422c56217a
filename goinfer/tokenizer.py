"""Tokenizer built from GGUF metadata, matching llama.cpp's token ids.

Three tokenizer families are supported, as named by ``tokenizer.ggml.model``:

* ``gpt2``  -- byte-level BPE (SmolLM2, Llama 3, Qwen2, Mistral tekken ...).  The merges
  come from ``tokenizer.ggml.merges``; the pre-tokenizer (how text is cut into words before
  merging) is chosen by ``tokenizer.ggml.pre``.
* ``llama`` -- SentencePiece-style BPE (Gemma, Llama 2 ...).  There are no merges in the
  file, only per-token scores: llama.cpp repeatedly joins the adjacent pair whose
  concatenation is a token with the highest score.  We express that as an ordinary BPE merge
  table (every split of every token into two tokens, ranked by the token's score), so the
  `tokenizers` library does the actual merging.
* ``gemma4`` -- SentencePiece-style BPE with merges (Gemma 4): spaces become ``▁``, the text is
  cut only at runs of newlines (a run that is itself a token is that token), the merges run
  over raw UTF-8 characters, and characters left without a token fall back to ``<0xXX>`` byte
  tokens; BOS is always added (llama.cpp's reading of these files).

Special tokens (control, user-defined) are cut out of the text first, exactly the way llama.cpp
does it (longest token text first, leftmost occurrence first); only the plain-text pieces between
them go through the BPE model.
"""

from __future__ import annotations

import codecs
import re
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, overload

import numpy as np
from tokenizers import Regex
from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import models as _models
from tokenizers import pre_tokenizers as _pre

from .errors import TokenizerError

__all__ = ["TOKEN_TYPE", "StreamDecoder", "Tokenizer"]

# --------------------------------------------------------------------------------------------
# Token types, as stored in tokenizer.ggml.token_type
# --------------------------------------------------------------------------------------------


class TOKEN_TYPE:
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


# Token texts that end a turn or a generation in the chat formats we know of: generation stops on
# them (when the vocabulary has them).
_END_OF_TURN_TEXTS = frozenset(
    {
        "<|endoftext|>",
        "<|im_end|>",
        "<|eot_id|>",
        "<|eom_id|>",
        "<|end|>",
        "<|end_of_text|>",
        "<end_of_turn>",
        "<end_of_utterance>",
        "<EOT>",
        "_<EOT>",
        "[EOT]",
        "[EOS]",
        "<|return|>",
        "<|call|>",
        "<turn|>",
        "<\uff5cend\u2581of\u2581sentence\uff5c>",
    }
)

# Tokens llama.cpp treats as control tokens whatever the file says, so that they are not matched
# in text when parse_special=False.  "</s>" is among them (Gemma 3 stores it as a user-defined
# HTML tag); it is left out of the stop tokens, since Gemma writes it as part of HTML.
_FORCED_CONTROL_TEXTS = _END_OF_TURN_TEXTS | {
    "</s>",
    "<eos>",
    "<|tool_response>",
    "<|flush|>",
    "<|calls|>",
}

_SPACE_MARK = "\u2581"  # '▁', SentencePiece's visible space
_NEWLINE_RUNS = re.compile(r"[^\n]+|\n+")  # gemma4's word split

# --------------------------------------------------------------------------------------------
# Pre-tokenizer regexes for byte-level BPE, by tokenizer.ggml.pre
# --------------------------------------------------------------------------------------------
# Each entry is a list of regexes applied one after the other; every match (and every gap
# between matches) becomes its own piece, and the next regex only refines those pieces.

_RE_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_RE_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_RE_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen3.5: letters and combining marks (\p{M}) form words together
_RE_QWEN35 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# o200k (gpt-oss; llama.cpp's "gpt-4o"): case-aware words with optional contractions, 1-3 digits
_RE_O200K = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_RE_TEKKEN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# name -> (regexes, ignore_merges, default add_bos)
_BPE_PRE: dict[str, tuple[list[str], bool, bool]] = {
    # digits one by one, then the GPT-2 word regex
    "smollm": ([r"\p{N}", _RE_GPT2], False, False),
    "starcoder": ([r"\p{N}", _RE_GPT2], False, False),
    "gpt-2": ([_RE_GPT2], False, False),
    "gpt2": ([_RE_GPT2], False, False),
    # llama.cpp's fallback for a BPE vocab named "default"
    "default": (
        [r"[\p{P}\$\+<=>\^~\|]+", _RE_GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
        False,
        False,
    ),
    "llama-bpe": ([_RE_LLAMA3], True, True),
    "llama3": ([_RE_LLAMA3], True, True),
    "llama-v3": ([_RE_LLAMA3], True, True),
    "qwen2": ([_RE_QWEN2], False, False),
    "deepseek-r1-qwen": ([_RE_QWEN2], False, False),
    "qwen35": ([_RE_QWEN35], False, False),
    "tekken": ([_RE_TEKKEN], True, True),
    "gpt-4o": ([_RE_O200K], False, False),
}

# --------------------------------------------------------------------------------------------
# GPT-2 byte <-> printable character table
# --------------------------------------------------------------------------------------------


def _byte_level_table() -> dict[int, str]:
    """Byte value -> the printable character byte-level BPE vocabularies use for it.

    Printable Latin-1 bytes stand for themselves; every other byte is given a character from
    U+0100 upwards, in byte order.
    """
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(0x100 + extra)
            extra += 1
    return table


_BYTE_TO_CHAR = _byte_level_table()
_CHAR_TO_BYTE = {c: b for b, c in _BYTE_TO_CHAR.items()}


def _byte_level_decode(text: str) -> bytes:
    out = bytearray()
    for ch in text:
        b = _CHAR_TO_BYTE.get(ch)
        if b is None:  # not a byte-level character: keep its UTF-8
            out += ch.encode("utf-8")
        else:
            out.append(b)
    return bytes(out)


def _parse_byte_token(text: str) -> int | None:
    """'<0x41>' -> 0x41, anything else -> None."""
    if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
        try:
            return int(text[3:5], 16)
        except ValueError:
            return None
    return None


# --------------------------------------------------------------------------------------------
# Metadata helpers
# --------------------------------------------------------------------------------------------


def _md_get(md: Mapping[str, Any], key: str, default: Any = None) -> Any:
    v = md.get(key, default)
    return default if v is None else v


def _md_int(md: Mapping[str, Any], key: str) -> int | None:
    v = md.get(key)
    if v is None:
        return None
    try:
        return int(v)
    except (TypeError, ValueError) as e:
        raise TokenizerError(f"{key} is not an integer: {v!r}") from e


def _as_list(v: Any, key: str) -> list:
    if v is None:
        return []
    if isinstance(v, (str, bytes)):
        raise TokenizerError(f"{key} should be an array, got a string")
    try:
        return list(v.tolist() if hasattr(v, "tolist") else v)
    except TypeError as e:
        raise TokenizerError(f"{key} should be an array, got {type(v).__name__}") from e


# --------------------------------------------------------------------------------------------
# Merge tables, made pair by pair
# --------------------------------------------------------------------------------------------


class _Pairs(Sequence[tuple[str, str]]):
    """A BPE merge table for ``tokenizers.models.BPE(merges=...)``, each pair cut out of a string
    only when it is read: pair j is ``(s[:k], s[k + gap:])`` with ``s = texts[index[j]]`` and
    ``k = cut[j]`` (gap 1 skips the space of an "a b" merge line).

    BPE copies the pairs into its own table in one pass over the sequence, so the half a million
    (str, str) tuples of a 262k-token vocabulary never exist at once in Python (they took ~100
    MB there, and Python's allocator kept the pages); here a pair costs 8 bytes until it is read.
    """

    def __init__(self, texts: Sequence[str], index: array, cut: array, gap: int) -> None:
        self._texts = texts
        self._index = index
        self._cut = cut
        self._gap = gap

    def __len__(self) -> int:
        return len(self._index)

    @overload
    def __getitem__(self, j: int) -> tuple[str, str]: ...
    @overload
    def __getitem__(self, j: slice) -> list[tuple[str, str]]: ...
    def __getitem__(self, j: int | slice) -> tuple[str, str] | list[tuple[str, str]]:
        if isinstance(j, slice):
            return [self[k] for k in range(*j.indices(len(self)))]
        s = self._texts[self._index[j]]
        k = self._cut[j]
        return s[:k], s[k + self._gap :]

    def __iter__(self) -> Iterator[tuple[str, str]]:
        texts, gap = self._texts, self._gap
        for i, k in zip(self._index, self._cut):
            s = texts[i]
            yield s[:k], s[k + gap :]


def _merge_pairs(merges: Sequence[str], vocab: Mapping[str, int] | None, start: int) -> _Pairs:
    """The merges "a b", cut at the first space at or after `start`, in file order: all of them
    (vocab None), or those whose a, b and ab are all in `vocab`.  TokenizerError for a line
    without such a space."""
    texts = [str(m) for m in merges]
    index, cut = array("i"), array("i")
    for j, m in enumerate(texts):
        k = m.find(" ", start)
        if k < 0:
            raise TokenizerError(f"malformed merge {m!r} in tokenizer.ggml.merges")
        if vocab is not None:
            a, b = m[:k], m[k + 1 :]
            if not (a in vocab and b in vocab and (a + b) in vocab):
                continue
        index.append(j)
        cut.append(k)
    return _Pairs(texts, index, cut, 1)


def _spm_pairs(tokens: Sequence[str], vocab: Mapping[str, int], scores: np.ndarray) -> _Pairs:
    """llama.cpp's SentencePiece merging as a BPE merge table: every way to split each token into
    two tokens, ranked by the token's score (best first, ties by id)."""
    order = np.argsort(-scores, kind="stable")
    index, cut = array("i"), array("i")
    for i in order.tolist():
        t = tokens[i]
        if vocab.get(t) != i:
            continue  # a duplicate text: the later id owns it
        for k in range(1, len(t)):
            if t[:k] in vocab and t[k:] in vocab:
                index.append(i)
                cut.append(k)
    return _Pairs(tokens, index, cut, 0)


# --------------------------------------------------------------------------------------------
# The tokenizer
# --------------------------------------------------------------------------------------------


class Tokenizer:
    """Text <-> token ids for one model, as llama.cpp tokenizes it."""

    def __init__(
        self,
        *,
        model: str,
        tokens: Sequence[str],
        token_types: Sequence[int] | None = None,
        scores: Sequence[float] | None = None,
        merges: Sequence[str] | None = None,
        pre: str = "default",
        bos_id: int | None = None,
        eos_id: int | None = None,
        eot_id: int | None = None,
        eom_id: int | None = None,
        unk_id: int | None = None,
        add_bos: bool | None = None,
        add_eos: bool = False,
        add_space_prefix: bool | None = None,
    ) -> None:
        tokens = [str(t) for t in tokens]
        n = len(tokens)
        if n == 0:
            raise TokenizerError("the vocabulary is empty (tokenizer.ggml.tokens)")
        types = [TOKEN_TYPE.NORMAL] * n if token_types is None else [int(t) for t in token_types]
        if len(types) != n:
            raise TokenizerError(
                f"tokenizer.ggml.token_type has {len(types)} entries for {n} tokens"
            )

        # Some names are control tokens whatever the file says (llama.cpp does this too).
        for i, t in enumerate(tokens):
            if t in _FORCED_CONTROL_TEXTS and types[i] in (
                TOKEN_TYPE.NORMAL,
                TOKEN_TYPE.USER_DEFINED,
            ):
                types[i] = TOKEN_TYPE.CONTROL

        self._model_name = model
        self._pre = pre
        self._n = n
        self._types = types
        ids: dict[str, int] = {t: i for i, t in enumerate(tokens)}  # last duplicate wins
        vocab = ids  # the BPE models' vocabulary too
        # Token texts are looked up in the BPE model afterwards (it holds them anyway; a Python
        # list and dict of them took ~40 MB for Gemma's 262k tokens), but for the ids of a
        # duplicated text, which the model knows by its last id only.
        self._dup_texts = {i: t for i, t in enumerate(tokens) if ids[t] != i}

        for name, v in (
            ("bos", bos_id),
            ("eos", eos_id),
            ("eot", eot_id),
            ("eom", eom_id),
            ("unk", unk_id),
        ):
            if v is not None and not 0 <= v < n:
                raise TokenizerError(f"{name} token id {v} is outside the vocabulary (0..{n - 1})")
        self._bos = bos_id
        self._eos = eos_id
        self._eot = eot_id
        self._eom = eom_id
        self._unk = unk_id

        if model == "gpt2":
            regexes, ignore_merges, default_bos = self._bpe_pre(pre)
            self._spm = False
            self._add_space_prefix = (
                bool(add_space_prefix) if add_space_prefix is not None else False
            )
            self._hf = self._build_byte_level(vocab, merges, regexes, ignore_merges)
        elif model == "gemma4":
            default_bos = True
            add_bos = True  # llama.cpp forces it for these vocabularies
            self._spm = True  # decoding: "▁" is a space, <0xXX> a byte
            self._add_space_prefix = False
            self._hf = self._build_gemma4(vocab, merges)
        elif model == "llama":
            default_bos = True
            self._spm = True
            self._add_space_prefix = True if add_space_prefix is None else bool(add_space_prefix)
            if scores is None:
                raise TokenizerError(
                    "a 'llama' (SentencePiece) vocabulary needs tokenizer.ggml.scores"
                )
            try:
                score_arr = np.asarray(scores, dtype=np.float64)  # (n,)
            except (TypeError, ValueError) as e:
                raise TokenizerError(f"tokenizer.ggml.scores are not numbers: {e}") from None
            if score_arr.shape != (n,):
                raise TokenizerError(
                    f"tokenizer.ggml.scores has {score_arr.size} entries for {n} tokens"
                )
            self._hf = self._build_spm(tokens, vocab, score_arr, unk_id)
        else:
            raise TokenizerError(f"unsupported tokenizer model {model!r} (tokenizer.ggml.model)")

        self._add_bos = default_bos if add_bos is None else bool(add_bos)
        self._add_eos = bool(add_eos)
        stops = {i for i in (eos_id, eot_id, eom_id) if i is not None} | {
            ids[t] for t in _END_OF_TURN_TEXTS if t in ids
        }
        if "<|return|>" in ids and "<|call|>" in ids and "<|end|>" in ids:
            # harmony (gpt-oss): <|end|> closes one message of a reply (the analysis before the
            # final answer), <|return|> and <|call|> end the reply (llama.cpp does the same)
            stops.discard(ids["<|end|>"])
        self._stop_ids = frozenset(stops)

        # Tokens cut out of the text before BPE: longest text first (llama.cpp's order).
        special = [
            i
            for i, ty in enumerate(types)
            if ty in (TOKEN_TYPE.CONTROL, TOKEN_TYPE.USER_DEFINED, TOKEN_TYPE.UNKNOWN) and tokens[i]
        ]
        special.sort(key=lambda i: -len(tokens[i].encode("utf-8")))
        self._special_all = [(tokens[i], i) for i in special]
        self._special_user = [
            (t, i) for t, i in self._special_all if types[i] == TOKEN_TYPE.USER_DEFINED
        ]

        self._bytes_cache: dict[int, bytes] = {}

    # ---- construction ------------------------------------------------------------------

    @classmethod
    def from_metadata(cls, md: Mapping[str, Any]) -> Tokenizer:
        """Build from a GGUF metadata dict (``tokenizer.ggml.*`` keys)."""
        model = md.get("tokenizer.ggml.model")
        if model is None:
            raise TokenizerError("the GGUF has no tokenizer (tokenizer.ggml.model is missing)")
        tokens = _as_list(md.get("tokenizer.ggml.tokens"), "tokenizer.ggml.tokens")
        types = md.get("tokenizer.ggml.token_type")
        scores = md.get("tokenizer.ggml.scores")
        merges = md.get("tokenizer.ggml.merges")
        add_bos = md.get("tokenizer.ggml.add_bos_token")
        add_eos = md.get("tokenizer.ggml.add_eos_token")
        asp = md.get("tokenizer.ggml.add_space_prefix")
        return cls(
            model=str(model),
            tokens=tokens,
            token_types=None if types is None else _as_list(types, "tokenizer.ggml.token_type"),
            scores=None
            if scores is None
            else scores  # kept as an array: a float object per token is 24 bytes
            if isinstance(scores, np.ndarray)
            else _as_list(scores, "tokenizer.ggml.scores"),
            merges=None if merges is None else _as_list(merges, "tokenizer.ggml.merges"),
            pre=str(_md_get(md, "tokenizer.ggml.pre", "default")),
            bos_id=_md_int(md, "tokenizer.ggml.bos_token_id"),
            eos_id=_md_int(md, "tokenizer.ggml.eos_token_id"),
            eot_id=_md_int(md, "tokenizer.ggml.eot_token_id"),
            eom_id=_md_int(md, "tokenizer.ggml.eom_token_id"),
            unk_id=_md_int(md, "tokenizer.ggml.unknown_token_id"),
            add_bos=None if add_bos is None else bool(add_bos),
            add_eos=False if add_eos is None else bool(add_eos),
            add_space_prefix=None if asp is None else bool(asp),
        )

    @staticmethod
    def _bpe_pre(pre: str) -> tuple[list[str], bool, bool]:
        try:
            return _BPE_PRE[pre]
        except KeyError:
            known = ", ".join(sorted(_BPE_PRE))
            raise TokenizerError(
                f"unknown pre-tokenizer {pre!r} (tokenizer.ggml.pre); goinfer knows: {known}"
            ) from None

    @staticmethod
    def _build_byte_level(
        vocab: dict[str, int],
        merges: Sequence[str] | None,
        regexes: list[str],
        ignore_merges: bool,
    ) -> _HFTokenizer:
        if not merges:
            raise TokenizerError("a 'gpt2' (byte-level BPE) vocabulary needs tokenizer.ggml.merges")
        # "a b": cut at the first space; BPE checks the tokens exist (fast, as files have them)
        pairs = _merge_pairs(merges, None, 0)
        try:
            bpe = _models.BPE(vocab=vocab, merges=pairs, ignore_merges=ignore_merges)
        except Exception:  # a merge naming a missing token: keep only the others
            bpe = None
        try:
            if bpe is None:
                pairs = _merge_pairs(merges, vocab, 0)
                bpe = _models.BPE(vocab=vocab, merges=pairs, ignore_merges=ignore_merges)
            del pairs
            hf = _HFTokenizer(bpe)
            steps = [_pre.Split(Regex(r), behavior="isolated") for r in regexes]
            steps.append(_pre.ByteLevel(add_prefix_space=False, use_regex=False))
            hf.pre_tokenizer = _pre.Sequence(steps)
        except Exception as e:  # tokenizers raises plain Exceptions on bad input
            raise TokenizerError(f"cannot build the BPE tokenizer: {e}") from e
        return hf

    @staticmethod
    def _build_gemma4(vocab: dict[str, int], merges: Sequence[str] | None) -> _HFTokenizer:
        if not merges:
            raise TokenizerError("a 'gemma4' vocabulary needs tokenizer.ggml.merges")
        # llama.cpp cuts a merge at the first space after its first character
        pairs = _merge_pairs(merges, vocab, 1)
        try:
            return _HFTokenizer(_models.BPE(vocab=vocab, merges=pairs, byte_fallback=True))
        except Exception as e:
            raise TokenizerError(f"cannot build the gemma4 tokenizer: {e}") from e

    @staticmethod
    def _build_spm(
        tokens: list[str], vocab: dict[str, int], scores: np.ndarray, unk_id: int | None
    ) -> _HFTokenizer:
        # llama.cpp joins any adjacent pair whose concatenation is a token, best score first.
        pairs = _spm_pairs(tokens, vocab, scores)
        unk = tokens[unk_id] if unk_id is not None else None
        try:
            bpe = _models.BPE(vocab=vocab, merges=pairs, byte_fallback=True, unk_token=unk)
            hf = _HFTokenizer(bpe)
        except Exception as e:
            raise TokenizerError(f"cannot build the SentencePiece tokenizer: {e}") from e
        return hf

    # ---- properties ----------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self._n

    @property
    def bos_id(self) -> int | None:
        return self._bos

    @property
    def eos_id(self) -> int | None:
        return self._eos

    @property
    def eot_id(self) -> int | None:
        return self._eot

    @property
    def add_bos(self) -> bool:
        return self._add_bos

    @property
    def add_eos(self) -> bool:
        return self._add_eos

    @property
    def model(self) -> str:
        return self._model_name

    @property
    def stop_ids(self) -> frozenset[int]:
        """Token ids that end generation: eos, eot, eom and end-of-turn tokens."""
        return self._stop_ids

    def token_type(self, token_id: int) -> int:
        self._check_id(token_id)
        return self._types[token_id]

    def is_control(self, token_id: int) -> bool:
        return self.token_type(token_id) in (TOKEN_TYPE.CONTROL, TOKEN_TYPE.UNKNOWN)

    def id_to_token(self, token_id: int) -> str:
        self._check_id(token_id)
        return self._text(int(token_id))

    def _text(self, i: int) -> str:
        t = self._dup_texts.get(i)
        if t is None:
            t = self._hf.id_to_token(i)
            assert t is not None  # every text is in the model's vocabulary
        return t

    def token_to_id(self, token: str) -> int:
        i = self._hf.token_to_id(token) if isinstance(token, str) else None
        if i is None:
            raise TokenizerError(f"{token!r} is not a token of this vocabulary")
        return i

    def _check_id(self, token_id: int) -> None:
        if not isinstance(token_id, int) or isinstance(token_id, bool):
            try:
                token_id = int(token_id)  # numpy integers
            except (TypeError, ValueError):
                raise TokenizerError(f"token id must be an integer, got {token_id!r}") from None
        if not 0 <= token_id < self._n:
            raise TokenizerError(
                f"token id {token_id} is outside the vocabulary (0..{self._n - 1})"
            )

    # ---- encoding ------------------------------------------------------------------------

    def encode(self, text: str, add_special: bool = False, parse_special: bool = True) -> list[int]:
        """Token ids for `text`.

        add_special: put BOS first (and EOS last) when the model asks for them.
        parse_special: control tokens written in the text (``<|im_start|>``) become those
        tokens; when False they are tokenized as plain text.  User-defined tokens are always
        matched, as in llama.cpp.
        """
        if not isinstance(text, str):
            raise TokenizerError(f"encode() takes a str, got {type(text).__name__}")
        out: list[int] = []
        if add_special and self._add_bos:
            if self._bos is None:
                raise TokenizerError(
                    "the vocabulary asks for a BOS token but has no tokenizer.ggml.bos_token_id"
                )
            out.append(self._bos)
        if text:
            pieces = self._partition(text, parse_special)
            if self._model_name == "gemma4":
                out.extend(self._encode_gemma4(pieces))
            elif self._spm:
                out.extend(self._encode_spm(pieces))
            else:
                out.extend(self._encode_bpe(pieces))
        if add_special and self._add_eos:
            if self._eos is None:
                raise TokenizerError(
                    "the vocabulary asks for an EOS token but has no tokenizer.ggml.eos_token_id"
                )
            out.append(self._eos)
        return out

    def encode_fragment(self, text: str) -> list[int]:
        """Token ids of text that continues a sequence (a piece of generated output): no BOS or
        EOS, control tokens not parsed, no SentencePiece prefix space."""
        if not isinstance(text, str):
            raise TokenizerError(f"encode_fragment() takes a str, got {type(text).__name__}")
        if not text:
            return []
        pieces = self._partition(text, False)
        if self._model_name == "gemma4":
            return self._encode_gemma4(pieces)
        return (
            self._encode_spm(pieces, prefix_space=False) if self._spm else self._encode_bpe(pieces)
        )

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Cut special tokens out of `text`: a list of plain-text pieces and token ids."""
        specials = self._special_all if parse_special else self._special_user
        if len(text) > 4096 and len(specials) > 64:
            # Long text, many special tokens (Gemma has 6k): skip those whose first four
            # characters never occur in the text before searching for them.
            grams = {text[i : i + 4] for i in range(len(text) - 3)}
            specials = [(t, i) for t, i in specials if len(t) < 4 or t[:4] in grams]
        pieces: list[str | int] = [text]
        for tok_text, tok_id in specials:
            if tok_text not in text:
                continue
            new: list[str | int] = []
            for p in pieces:
                if isinstance(p, int) or tok_text not in p:
                    new.append(p)
                    continue
                parts = p.split(tok_text)
                for k, part in enumerate(parts):
                    if k:
                        new.append(tok_id)
                    if part:
                        new.append(part)
            pieces = new
        return pieces

    def _encode_bpe(self, pieces: list[str | int]) -> list[int]:
        texts = [p for p in pieces if isinstance(p, str)]
        encs = iter(self._hf.encode_batch(texts, add_special_tokens=False)) if texts else iter(())
        out: list[int] = []
        for p in pieces:
            if isinstance(p, int):
                out.append(p)
            else:
                out.extend(next(encs).ids)
        return out

    def _encode_spm(self, pieces: list[str | int], prefix_space: bool = True) -> list[int]:
        texts = []
        prev_special = True
        for p in pieces:
            if isinstance(p, int):
                prev_special = True
                continue
            if self._add_space_prefix and prefix_space and prev_special:
                p = " " + p
            texts.append(p.replace(" ", _SPACE_MARK))
            prev_special = False
        encs = iter(self._hf.encode_batch(texts, add_special_tokens=False)) if texts else iter(())
        out: list[int] = []
        for p in pieces:
            if isinstance(p, int):
                out.append(p)
            else:
                out.extend(next(encs).ids)
        return out

    def _encode_gemma4(self, pieces: list[str | int]) -> list[int]:
        # words: runs of newlines and runs of anything else, spaces as "▁"; a newline run that
        # is a token is taken whole, every other word goes through the BPE merges
        items: list[int | str] = []
        for p in pieces:
            if isinstance(p, int):
                items.append(p)
                continue
            for m in _NEWLINE_RUNS.finditer(p.replace(" ", _SPACE_MARK)):
                w = m.group()
                tid = self._hf.token_to_id(w) if w[0] == "\n" else None
                items.append(tid if tid is not None else w)
        texts = [w for w in items if isinstance(w, str)]
        encs = iter(self._hf.encode_batch(texts, add_special_tokens=False)) if texts else iter(())
        out: list[int] = []
        for w in items:
            if isinstance(w, int):
                out.append(w)
            else:
                out.extend(next(encs).ids)
        return out

    # ---- decoding ------------------------------------------------------------------------

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes token `token_id` stands for (control tokens: their text)."""
        self._check_id(token_id)
        token_id = int(token_id)
        b = self._bytes_cache.get(token_id)
        if b is None:
            b = self._compute_bytes(token_id)
            self._bytes_cache[token_id] = b
        return b

    def _compute_bytes(self, i: int) -> bytes:
        text = self._text(i)
        ty = self._types[i]
        if ty in (TOKEN_TYPE.CONTROL, TOKEN_TYPE.UNKNOWN, TOKEN_TYPE.USER_DEFINED):
            return text.encode("utf-8")
        if ty == TOKEN_TYPE.UNUSED:
            return b""
        if self._spm:
            if ty == TOKEN_TYPE.BYTE:
                v = _parse_byte_token(text)
                return bytes([v]) if v is not None else text.encode("utf-8")
            return text.replace(_SPACE_MARK, " ").encode("utf-8")
        if ty == TOKEN_TYPE.BYTE:
            v = _parse_byte_token(text)
            if v is not None:
                return bytes([v])
        return _byte_level_decode(text)

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text of `ids`.  skip_special drops control tokens (BOS, EOS, <|im_end|> ...)."""
        parts = []
        first = True
        for i in ids:
            b = self.token_bytes(i)
            if skip_special and self._types[int(i)] in (TOKEN_TYPE.CONTROL, TOKEN_TYPE.UNKNOWN):
                continue
            if first:
                b = self._strip_prefix_space(b)
                first = False
            parts.append(b)
        return b"".join(parts).decode("utf-8", errors="replace")

    def _strip_prefix_space(self, b: bytes) -> bytes:
        # encode() put a space before the text (add_space_prefix): take it off again.
        if self._add_space_prefix and b.startswith(b" "):
            return b[1:]
        return b

    def __repr__(self) -> str:
        return f"Tokenizer(model={self._model_name!r}, pre={self._pre!r}, vocab_size={self.vocab_size})"


# --------------------------------------------------------------------------------------------
# Streaming detokenizer
# --------------------------------------------------------------------------------------------


class StreamDecoder:
    """Turns generated token ids into text as they arrive, never splitting a UTF-8 character.

    ``push(id)`` returns the text that became complete; ``flush()`` returns what is left
    (an unfinished character comes out as U+FFFD).  The pieces joined equal
    ``tokenizer.decode(ids, skip_special)``.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False) -> None:
        self._tok = tokenizer
        self._skip = skip_special
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._first = True

    def push(self, token_id: int) -> str:
        tok = self._tok
        b = tok.token_bytes(token_id)
        if self._skip and tok.is_control(token_id):
            return ""
        if self._first:
            b = tok._strip_prefix_space(b)
            self._first = False
        return self._dec.decode(b)

    def flush(self) -> str:
        out = self._dec.decode(b"", final=True)
        self._dec.reset()
        return out


# Chat templates live in their own module; re-exported here for convenience.
from .chat_template import builtin_template, render_chat_template  # noqa: E402

__all__ += ["builtin_template", "render_chat_template"]
