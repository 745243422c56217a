"""Write tests/data/llama_cpp_vocab/: llama.cpp's own tokenizer test cases, with the parts of
their vocabularies those cases can reach.

llama.cpp tests its tokenizers with vocab-only GGUFs (models/ggml-vocab-NAME.gguf) and, for
each, a file of texts (.gguf.inp, separated by "\\n__ggml_vocab_test__\\n") and the token ids
llama.cpp gives them (.gguf.out, one line per text; add_special and parse_special off).  The
GGUFs are 0.7-8 MB each; the texts are ~2 KB.  This script copies the .inp/.out files as they
are and writes, per vocabulary, the tokenizer metadata with every normal token that cannot
occur in those texts replaced by a placeholder (ids unchanged):

* byte-level BPE (gpt2 model): a token can only come out of BPE on a piece of the text, and
  every piece is a substring of the text (in the byte-to-character mapping of byte-level BPE),
  whatever the pre-tokenizer regexes are.  Tokens that are not substrings of any text, and
  the merges that make them, can never be used on these texts: dropping them changes no
  result, for the right regexes or wrong ones (the tests rely on that: a swapped regex must
  still give llama.cpp's ids or not, as the full vocabulary would).
* SentencePiece (llama model): the same, on the text with spaces as U+2581 (and the leading
  one).
Non-normal tokens (control, user-defined, byte, unknown) are all kept.  The script checks
that goinfer's tokenizer gives the same ids with the reduced and the full vocabulary on every
text, for the real pre-tokenizer and for every other one goinfer knows, before writing.

Run (CI only reads what this writes), with the llama-cpp-python sdist unpacked:

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/sdist
    tar xzf /tmp/sdist/llama_cpp_python-0.3.36.tar.gz -C /tmp/sdist
    PYTHONPATH=. python tests/tools/make_llama_cpp_vocabs.py \\
        /tmp/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import shutil
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
from fixtures.llama_cpp_vocab import DIR as OUT  # noqa: E402
from fixtures.llama_cpp_vocab import NAMES, metadata, read_cases  # noqa: E402  (NAMES: the vocabularies

# whose tokenizer goinfer supports: byte-level BPE with a known pre-tokenizer, SentencePiece)
KEYS = [
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.eot_token_id",
    "tokenizer.ggml.eom_token_id",
    "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_eos_token",
    "tokenizer.ggml.add_space_prefix",
]


def searchable(md: dict, texts: list[str]) -> list[str]:
    """The texts as the BPE model sees them: byte-level characters, or SentencePiece spaces."""
    if md["tokenizer.ggml.model"] == "gpt2":
        from goinfer.tokenizer import _BYTE_TO_CHAR

        return ["".join(_BYTE_TO_CHAR[b] for b in t.encode("utf-8")) for t in texts]
    return [s.replace(" ", "\u2581") for t in texts for s in (t, " " + t)]


def reduce(md: dict, texts: list[str]) -> dict:
    """md's tokenizer with the normal tokens that occur in no text left out (see the doc)."""
    tokens = list(md["tokenizer.ggml.tokens"])
    types = np.asarray(md["tokenizer.ggml.token_type"]).tolist()
    hay = "\x00".join(searchable(md, texts))
    keep = [i for i, (t, ty) in enumerate(zip(tokens, types)) if ty != 1 or (t and t in hay)]
    kept = set(keep)
    out = {k: md[k] for k in KEYS if md.get(k) is not None}
    out = {k: (v.item() if hasattr(v, "item") else v) for k, v in out.items()}
    out["n_tokens"] = len(tokens)
    out["tokens"] = {str(i): tokens[i] for i in keep}
    out["token_type"] = {str(i): types[i] for i in keep if types[i] != 1}
    if md.get("tokenizer.ggml.scores") is not None:
        scores = np.asarray(md["tokenizer.ggml.scores"], np.float32).tolist()
        out["scores"] = {str(i): scores[i] for i in keep}
    if md.get("tokenizer.ggml.merges") is not None:
        names = {tokens[i] for i in kept}
        out["merges"] = [m for m in md["tokenizer.ggml.merges"] if m.replace(" ", "", 1) in names]
    return out


def check(name: str, full_md: dict, small_md: dict, cases) -> None:
    """Reduced == full on every text (and == llama.cpp's ids), for every pre-tokenizer."""
    from goinfer import tokenizer as T

    pres = [full_md.get("tokenizer.ggml.pre")]
    if full_md["tokenizer.ggml.model"] == "gpt2":
        pres += sorted(set(T._BPE_PRE) - set(pres))
    for pre in pres:
        full = T.Tokenizer.from_metadata({**full_md, "tokenizer.ggml.pre": pre})
        small = T.Tokenizer.from_metadata({**small_md, "tokenizer.ggml.pre": pre})
        for text, want in cases:
            got = small.encode(text, add_special=False, parse_special=False)
            assert got == full.encode(text, add_special=False, parse_special=False), (
                name,
                pre,
                text,
            )
            if pre == pres[0]:
                assert got == want, (name, text, got, want)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("llama_cpp", help="llama.cpp source tree (e.g. the sdist's vendor/llama.cpp)")
    args = ap.parse_args()
    from goinfer.gguf import GGUFFile

    models = os.path.join(args.llama_cpp, "models")
    os.makedirs(OUT, exist_ok=True)
    shutil.copy(os.path.join(args.llama_cpp, "LICENSE"), os.path.join(OUT, "LICENSE-llama.cpp"))
    for name in NAMES:
        src = os.path.join(models, f"ggml-vocab-{name}.gguf")
        with GGUFFile(src) as g:
            md = dict(g.metadata)
        cases = read_cases(src + ".inp", src + ".out")
        reduced = reduce(md, [t for t, _ in cases])
        check(name, md, metadata(reduced), cases)
        with open(src, "rb") as f:
            reduced["source"] = {
                "file": f"models/ggml-vocab-{name}.gguf",
                "sha256": hashlib.sha256(f.read()).hexdigest(),
                "from": "llama-cpp-python 0.3.36 sdist, vendor/llama.cpp",
            }
        for ext in (".inp", ".out"):
            shutil.copy(src + ext, os.path.join(OUT, f"ggml-vocab-{name}.gguf{ext}"))
        dst = os.path.join(OUT, f"{name}.vocab.json.gz")
        with gzip.GzipFile(dst, "wb", mtime=0) as f:
            f.write(json.dumps(reduced, ensure_ascii=False, sort_keys=True).encode("utf-8"))
        print(
            f"{name}: {len(cases)} cases, kept {len(reduced['tokens'])} of {reduced['n_tokens']} "
            f"tokens, {len(reduced.get('merges', []))} merges -> {os.path.getsize(dst)} bytes"
        )


if __name__ == "__main__":
    main()
