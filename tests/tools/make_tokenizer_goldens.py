"""Write tests/data/tokenizer_goldens.json.gz: llama.cpp's token ids for the tokenizer corpus.

Run with a Python that has llama-cpp-python and gguf (not needed by CI, which only reads the
file this writes):

    /tmp/peers-venv/bin/python tests/tools/make_tokenizer_goldens.py \
        [--smollm2 PATH.gguf] [--gemma3 PATH.gguf]

For every document of tests/data/tokenizer_corpus.txt and both values of parse_special it stores
``llm.tokenize(doc.encode(), add_bos=False, special=parse_special)`` for SmolLM2 (byte-level BPE,
pre "smollm") and Gemma 3 (SentencePiece).  It also re-labels SmolLM2's vocabulary with other
byte-level pre-tokenizer names (llama-bpe, qwen2, gpt-2, tekken, default) in vocab-only GGUF
copies, so the word-splitting regexes of those families are checked against llama.cpp too.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "data")
CORPUS = os.path.join(DATA, "tokenizer_corpus.txt")
OUT = os.path.join(DATA, "tokenizer_goldens.json.gz")
CHAT_OUT = os.path.join(DATA, "gemma_chat_goldens.json")
SMOLLM2_VOCAB_OUT = os.path.join(DATA, "smollm2_tokenizer_metadata.json.gz")
DOC_SEPARATOR = "\n\u241e\u241e\u241e goinfer-doc \u241e\u241e\u241e\n"
PRE_VARIANTS = ["llama-bpe", "qwen2", "gpt-2", "tekken", "default"]


def load_docs() -> list[str]:
    with open(CORPUS, encoding="utf-8", newline="") as f:
        return f.read().split(DOC_SEPARATOR)


def vocab_only_copy(src: str, dst: str, pre: str) -> None:
    """A GGUF with src's metadata (tokenizer.ggml.pre replaced) and no tensors."""
    import gguf

    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(dst, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = pre if name == "tokenizer.ggml.pre" else field.contents()
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, vtype, sub_type=sub)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_json_gz(path: str, obj) -> None:
    payload = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    with (
        open(path, "wb") as raw,
        gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0) as f,
    ):
        f.write(payload)  # mtime=0: the same content gives the same bytes


def tokenizer_metadata(path: str) -> dict:
    """The tokenizer.* keys of a GGUF (plus general.architecture), JSON-ready."""
    import gguf

    reader = gguf.GGUFReader(path)
    md = {}
    for name, field in reader.fields.items():
        if name.startswith("tokenizer.") or name == "general.architecture":
            v = field.contents()
            md[name] = v.tolist() if hasattr(v, "tolist") else v
    return md


def tokenize_all(path: str, docs: list[str], modes=(False, True)) -> dict[str, list[list[int]]]:
    from llama_cpp import Llama

    llm = Llama(model_path=path, vocab_only=True, verbose=False)
    out = {}
    for special in modes:
        out[f"parse_special_{str(special).lower()}"] = [
            llm.tokenize(d.encode("utf-8"), add_bos=False, special=special) for d in docs
        ]
    return out


# Conversations rendered by llama.cpp's built-in "gemma" chat template (no Jinja involved).
GEMMA_CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [
        {"role": "system", "content": "  Be brief.\n"},
        {"role": "user", "content": " Hello \n\n"},
        {"role": "assistant", "content": "Hi there!  "},
        {"role": "user", "content": "Bye"},
    ],
    [
        {"role": "system", "content": "A"},
        {"role": "system", "content": " B "},
        {"role": "assistant", "content": "x"},
        {"role": "user", "content": "y"},
        {"role": "assistant", "content": "z"},
    ],
    [
        {"role": "user", "content": "\u00a0nbsp\u3000 \t"},
        {"role": "tool", "content": '{"ok": true}'},
    ],
    [{"role": "system", "content": "only a system message"}],
    [
        {"role": "user", "content": "Translate: 日本語 😀"},
        {"role": "assistant", "content": "\n\nJapanese language\n"},
        {"role": "system", "content": "late system"},
        {"role": "user", "content": "thanks"},
    ],
    [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}],
]


def gemma_chat_goldens() -> list[dict]:
    import ctypes

    import llama_cpp

    out = []
    for conv in GEMMA_CONVERSATIONS:
        for add_ass in (True, False):
            arr = (llama_cpp.llama_chat_message * len(conv))()
            keep = []
            for i, m in enumerate(conv):
                role, content = m["role"].encode(), m["content"].encode()
                keep += [role, content]
                arr[i].role, arr[i].content = role, content
            buf = ctypes.create_string_buffer(1 << 16)
            n = llama_cpp.llama_chat_apply_template(
                b"gemma", arr, len(conv), add_ass, buf, len(buf)
            )
            out.append(
                {
                    "messages": conv,
                    "add_generation_prompt": add_ass,
                    "rendered": buf.raw[:n].decode(),
                }
            )
    return out


def main() -> int:
    import llama_cpp

    ap = argparse.ArgumentParser()
    ap.add_argument("--smollm2", default="/tmp/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--gemma3", default="/tmp/models/gemma3/gemma-3-270m-q4_k_m.gguf")
    args = ap.parse_args()

    docs = load_docs()
    with open(CORPUS, "rb") as f:
        corpus_sha = hashlib.sha256(f.read()).hexdigest()
    result = {
        "llama_cpp_python_version": llama_cpp.__version__,
        "corpus_sha256": corpus_sha,
        "n_docs": len(docs),
        "call": "Llama(path, vocab_only=True).tokenize(doc.encode(), add_bos=False, special=parse_special)",
        "models": {},
    }
    result["models"]["smollm2"] = {
        "file": os.path.basename(args.smollm2),
        **tokenize_all(args.smollm2, docs),
    }
    result["models"]["gemma3"] = {
        "file": os.path.basename(args.gemma3),
        **tokenize_all(args.gemma3, docs),
    }
    with tempfile.TemporaryDirectory() as tmp:
        for pre in PRE_VARIANTS:
            dst = os.path.join(tmp, f"smollm2-{pre}.gguf")
            vocab_only_copy(args.smollm2, dst, pre)
            result["models"][f"smollm2-pre-{pre}"] = {
                "file": os.path.basename(args.smollm2),
                "pre": pre,
                **tokenize_all(dst, docs, modes=(True,)),
            }
    write_json_gz(OUT, result)
    # SmolLM2's tokenizer (Apache-2.0) ships with the tests, so CI checks the goldens without the model.
    write_json_gz(
        SMOLLM2_VOCAB_OUT,
        {"source": os.path.basename(args.smollm2), **tokenizer_metadata(args.smollm2)},
    )
    with open(CHAT_OUT, "w", encoding="utf-8") as f:
        json.dump(
            {
                "llama_cpp_python_version": llama_cpp.__version__,
                "template": "gemma",
                "cases": gemma_chat_goldens(),
            },
            f,
            ensure_ascii=False,
            indent=1,
        )
    print(
        f"wrote {OUT} ({os.path.getsize(OUT)} bytes), llama-cpp-python {llama_cpp.__version__}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
