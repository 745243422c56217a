"""Upcycle a dense llama GGUF into a Mixture-of-Experts GGUF with identical experts.

Every layer's FFN (ffn_gate / ffn_up / ffn_down) becomes N_EXPERT identical experts, stacked
as llama.cpp stores Mixtral (ffn_gate_exps (E, F, D), ffn_up_exps (E, F, D), ffn_down_exps
(E, D, F)), behind a random float32 router ffn_gate_inp (E, D) with top-k routing; the file
keeps arch "llama" (goinfer runs a llama file with expert tensors as MoE).  The routing
weights of the llama/Mixtral scheme sum to 1 (softmax over the chosen k), and the experts are
the dense FFN, so the model computes what the dense one does, up to float32 rounding.

The experts' bytes are copied as stored (a Q4_1 FFN stays Q4_1, bit for bit).

    python tools/upcycle_moe.py SmolLM2-135M-Instruct.Q4_1.gguf out.gguf [--experts 4 --top-k 2]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import gguf
import numpy as np

_FFN = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down)\.weight$")


def stored(t) -> np.ndarray:
    """A reader tensor's data as GGUFWriter.add_tensor(raw_dtype=...) takes it: the values in
    NumPy shape for F32/F16, else the bytes, shaped (..., bytes per row)."""
    shape = tuple(int(x) for x in reversed(t.shape))  # NumPy order
    data = np.asarray(t.data)
    if t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
        return data.reshape(shape)
    return data.view(np.uint8).reshape(shape[:-1] + (-1,))


def upcycle(
    src: str | Path,
    dst: str | Path,
    n_expert: int = 4,
    top_k: int = 2,
    seed: int = 0,
    router_std: float = 1.0,
) -> Path:
    """Write dst: src with every dense FFN turned into n_expert copies behind a random router."""
    if not 1 <= top_k <= n_expert:
        raise ValueError(f"need 1 <= top_k <= n_expert, got top_k={top_k}, n_expert={n_expert}")
    r = gguf.GGUFReader(str(src))
    arch = r.fields["general.architecture"].contents()
    if arch != "llama":
        raise ValueError(
            f"{src}: architecture {arch!r}; only dense llama files can be upcycled here"
        )
    d_model = int(r.fields["llama.embedding_length"].contents())
    d_ff = int(r.fields["llama.feed_forward_length"].contents())
    w = gguf.GGUFWriter(str(dst), arch)
    skip = {
        "general.architecture",
        "llama.expert_count",
        "llama.expert_used_count",
        "llama.expert_feed_forward_length",
        "llama.expert_weights_norm",
        "general.name",
    }
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key in skip:
            continue
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, f.contents(), f.types[0], sub_type=f.types[-1])
        else:
            w.add_key_value(key, f.contents(), f.types[0])
    name = r.fields["general.name"].contents() if "general.name" in r.fields else Path(src).stem
    w.add_name(f"{name} upcycled: {n_expert} identical experts, top-{top_k}")
    w.add_expert_count(n_expert)
    w.add_expert_used_count(top_k)
    w.add_expert_feed_forward_length(d_ff)
    w.add_bool("llama.expert_weights_norm", True)
    rng = np.random.default_rng(seed)
    for t in r.tensors:
        raw = stored(t)
        m = _FFN.match(t.name)
        if m is None:
            w.add_tensor(t.name, raw, raw_dtype=t.tensor_type)
            continue
        blk, part = m.groups()
        stacked = np.ascontiguousarray(np.broadcast_to(raw, (n_expert,) + raw.shape))
        w.add_tensor(f"blk.{blk}.ffn_{part}_exps.weight", stacked, raw_dtype=t.tensor_type)
        if part == "gate":
            router = rng.standard_normal((n_expert, d_model)) * router_std / np.sqrt(d_model)
            w.add_tensor(f"blk.{blk}.ffn_gate_inp.weight", router.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(dst)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", help="dense llama GGUF (e.g. SmolLM2-135M-Instruct.Q4_1.gguf)")
    ap.add_argument("dst", help="output MoE GGUF")
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    out = upcycle(a.src, a.dst, a.experts, a.top_k, a.seed)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
