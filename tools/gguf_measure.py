"""Measure GGUF conversion: summary, load time, relative RMS error per source type.

    PYTHONPATH=. python tools/gguf_measure.py MODEL.gguf

For each 2-D tensor, compares the native QWeight (goinfer._reference.dequantize) with the
float32 dequantization of the original blocks by gguf.quants.dequantize (the reference),
and reports per GGUF type: relative RMS error = sqrt(sum err^2 / sum ref^2) over all tensors
of that type, and the worst single tensor.
"""

import sys
import time
from collections import defaultdict

import numpy as np
from gguf.quants import dequantize as ref_dequantize

from goinfer._reference import dequantize
from goinfer.gguf import NATIVE_TARGET, GGUFFile


def main(path: str) -> None:
    t0 = time.perf_counter()
    g = GGUFFile(path)
    t_open = time.perf_counter() - t0
    weights = {}
    t0 = time.perf_counter()
    for n in g.tensor_names:
        tname, shape = g.tensor_info(n)
        if len(shape) == 2 and tname in NATIVE_TARGET:
            weights[n] = g.load_weight(n)
        else:
            g.load_f32(n)
    t_load = time.perf_counter() - t0
    print(
        f"{g}\nopen {t_open:.2f} s, load all tensors {t_load:.2f} s, total {t_open + t_load:.2f} s"
    )
    print(g.conversion_summary())
    err2 = defaultdict(float)
    ref2 = defaultdict(float)
    worst = defaultdict(float)
    for n, w in weights.items():
        t = g._tensors[n]
        ref = (
            ref_dequantize(np.asarray(t.data), t.tensor_type)
            .reshape(w.n_out, w.n_in)
            .astype(np.float64)
        )
        got = dequantize(w).astype(np.float64)
        e2 = float(((got - ref) ** 2).sum())
        r2 = float((ref**2).sum())
        err2[w.source_type] += e2
        ref2[w.source_type] += r2
        worst[w.source_type] = max(worst[w.source_type], (e2 / r2) ** 0.5 if r2 else 0.0)
    print(f"{'type':<6} {'-> kind':<8} {'rel RMS err (all)':>18} {'worst tensor':>13}")
    for st in sorted(err2):
        print(
            f"{st:<6} {'-> ' + NATIVE_TARGET[st][0]:<8} {(err2[st] / ref2[st]) ** 0.5:>18.3e} {worst[st]:>13.3e}"
        )


if __name__ == "__main__":
    main(sys.argv[1])
