"""Render docs/benchmarks.md and its plots from the results in benchmarks/results/.

    python benchmarks/report.py              # writes docs/benchmarks.md and docs/img/bench-*.png
    python benchmarks/report.py --check      # exit 1 when docs/benchmarks.md is not what the
                                             # results render to (the test suite runs this check)
    python benchmarks/report.py --no-plots   # the markdown only (no matplotlib needed)

benchmarks/results/ holds one JSON per machine class and regime: a header (machine, goinfer's
kernel variant and AMX, the peer and how it was built, threads) and "runs", each a benchmark
script's --json output (peers, agent_loop, memory, limits, speculative) or a transcribed one
with its provenance ("transcribed": true: date, time, command, load average, notes; a field the
run log did not keep is null).  For each model file and column the latest run in the file's
order gives the cell.  "measurements" files hold other tables (numerics, fidelity, kernels) as
they were logged.  The plots need matplotlib (the bench / docs extra).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
DOC = ROOT / "docs" / "benchmarks.md"
IMG = ROOT / "docs" / "img"

# the sections of "Other measurements", in this order
SECTIONS = [
    "Fidelity of the weights",
    "Numerics: exact vs fast",
    "KV cache storage types",
    "Per-token fixed cost",
    "Where prefill time goes",
    "AMX prefill GEMM",
    "Q6_K in Q4_K_M files",
    "AVX2 prefill GEMM",
    "AVX-VNNI in the avx2 variant",
    "Decode GEMV of the 4-bit kinds",
    "GEMV streams",
    "GEMV warm",
    "Decode step profile",
    "Weight pages",
    "Prefill tiles per thread",
    "Attention kernels",
    "Mixture of Experts",
    "Constrained decoding",
    "OpenMP wait policy",
    "Sampling",
    "Release wheel: abi3",
]


def load_results(where: Path = RESULTS) -> list[dict]:
    docs = []
    for p in sorted(where.glob("*.json")):
        d = json.loads(p.read_text())
        d["_name"] = p.stem
        docs.append(d)
    return sorted(docs, key=lambda d: (d.get("order", 99), d["_name"]))


# ============================================================================ formatting


def num(v) -> str:
    """a rate or time as the log would write it: 372, 42.4, 7.3, 0.81"""
    if v is None:
        return "-"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.4g}" if abs(v) >= 100 else f"{v:.3g}"


def gb(v) -> str:
    return "-" if v is None else f"{v / 1e9:.2f}"


def ratio(v) -> str:
    return "-" if v is None else f"**{v:.2f}x**"


class Notes:
    """numbered provenance notes for one table: each run cited once"""

    def __init__(self):
        self.runs: list[dict] = []

    def mark(self, run: dict) -> str:
        for i, r in enumerate(self.runs):
            if r is run:
                return f"[{i + 1}]"
        self.runs.append(run)
        return f"[{len(self.runs)}]"

    def lines(self) -> list[str]:
        out = []
        for i, r in enumerate(self.runs):
            out.append(f"{i + 1}. {provenance(r)}")
        return out


def provenance(r: dict) -> str:
    p = r.get("provenance")
    if p is None:  # a script's own output
        g = r["regime"]
        p = {
            "date": g["date"],
            "time_utc": g.get("time_utc"),
            "command": g["command"],
            "load_avg": f"{g['load_avg_start'][0]:.1f}",
            "transcribed": False,
        }
    when = p["date"] + (f" {p['time_utc']} UTC" if p.get("time_utc") else "")
    load = f", load average {p['load_avg']}" if p.get("load_avg") else ""
    note = "; ".join(x for x in (p.get("note"), r.get("note")) if x)
    tail = " (transcribed from the run log)" if p.get("transcribed") else ""
    return f"{when}{load}: `{p['command']}`" + (f"; {note}" if note else "") + tail


def table(cols: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)] + [
        "| " + " | ".join(r) + " |" for r in rows
    ]


def model_label(m: dict) -> str:
    return f"{m['name']} {m['quantization']}"


# ============================================================================ goinfer against llama.cpp


def _goinfer_keys(row: dict) -> list[str]:
    return [k for k in row["tok_s"] if k.startswith("goinfer") and "(exact)" not in k]


def _cell(row: dict, notes: Notes, run: dict) -> str:
    """goinfer / llama.cpp's best = ratio, for each goinfer engine of the row"""
    best = row.get("best_peer")
    parts = []
    for k in _goinfer_keys(row):
        r = (row.get("ratio") or {}).get(k)
        if r is None and best:
            r = row["tok_s"][k] / row["tok_s"][best]
        tag = k[len("goinfer") :].strip()
        p = f"{num(row['tok_s'][k])} / {num(row['tok_s'][best]) if best else '-'} = {ratio(r)}"
        frac, bw = row.get("fraction_of_bandwidth"), run.get("bandwidth") or {}
        if frac and bw.get("sync") and k in frac:  # a sweep with its processes started together
            peer = f" / {100 * frac[best]:.0f}%" if best in frac else ""
            of = "~" if bw.get("per_run") else ""  # each run against the samples around it
            p += f", {100 * frac[k]:.0f}%{peer} of {of}{num(bw['GBs'])} GB/s"
            pages = (row.get("fraction_of_weight_pages") or {}).get(k)
            if pages:  # of the bandwidth of the memory its weights were mapped in
                p += f" ({100 * pages:.0f}% of its weight pages')"
        parts.append(f"{tag}: {p}" if tag else p)
    extra = f" ({row['note']})" if row.get("note") else ""
    return "; ".join(parts) + extra + " " + notes.mark(run)


def _latest(runs: list[dict], bench: str) -> dict:
    """{model file: {column: (row, run)}} from the latest run holding each cell"""
    cells: dict[str, dict] = {}
    for run in runs:
        if run.get("benchmark") != bench:
            continue
        f = run["model"]["file"]
        c = cells.setdefault(f, {"_model": run["model"]})
        for row in run.get("prefill", []):
            c[("prefill", row["prompt_tokens"])] = (row, run)
        for row in run.get("decode", []):
            n = row["prompt_tokens"]
            c[("decode", "short" if n <= 256 else "long")] = (row, run)
    return cells


PEER_COLS = [
    (("prefill", 512), "prefill 512"),
    (("prefill", 2048), "prefill 2048"),
    (("decode", "short"), "decode after 64"),
    (("decode", "long"), "decode after ~4k"),
]


def peers_section(d: dict, notes: Notes) -> list[str]:
    cells = _latest(d["runs"], "peers")
    if not cells:
        return []
    rows = []
    for f, c in cells.items():
        row = [f"{model_label(c['_model'])} (`{f}`)"]
        for key, _ in PEER_COLS:
            if key not in c:
                row.append("")
                continue
            r, run = c[key]
            s = _cell(r, notes, run)
            n = r["prompt_tokens"]
            if key == ("decode", "long") and n != 4096:
                s = f"after {n:,}: {s}"
            if key == ("decode", "short") and n != 64:
                s = f"after {n}: {s}"
            row.append(s)
        rows.append(row)
    return (
        [
            "goinfer's tok/s / llama.cpp's best engine's tok/s = **ratio** (above 1: goinfer "
            "is faster):",
            "",
        ]
        + table(["model (file)"] + [t for _, t in PEER_COLS], rows)
        + [""]
    )


def agent_section(d: dict, notes: Notes) -> list[str]:
    out = []
    for run in d["runs"]:
        if run.get("benchmark") != "agent_loop":
            continue
        eng = run["engines"]
        g, c = eng.get("goinfer (reuse)"), eng.get("goinfer (cold)")
        peers = [k for k in eng if k.startswith("llama.cpp")]
        rows = []
        for i in range(run["turns"]):
            gr = g[i] if g else {}
            best = min((eng[k][i]["ttft_s"] for k in peers), default=None)
            rt = run.get("ratio_per_turn")
            r = rt[i] if rt else (best / gr["ttft_s"] if best and gr.get("ttft_s") else None)
            ms = lambda s: "-" if s is None else f"{s * 1e3:,.0f}"  # noqa: E731
            rows.append(
                [
                    str(i + 1),
                    num(gr.get("prompt_tokens")) if gr.get("prompt_tokens") else "-",
                    f"{num(gr.get('cached_tokens')) if gr.get('cached_tokens') is not None else '-'}"
                    f" / {ms(gr.get('ttft_s'))}",
                    ms(c[i]["ttft_s"]) if c else "-",
                    ms(best),
                    ratio(r),
                ]
            )
        out += [
            f"Agent loop, {model_label(run['model'])}, {run['transcript']} transcript "
            f"{notes.mark(run)}: time to first token per turn (ms; llama.cpp's best of a live "
            f"`Llama` and one with `LlamaRAMCache`):",
            "",
        ]
        out += table(
            [
                "turn",
                "prompt tokens",
                "goinfer cached / TTFT",
                "goinfer cold TTFT",
                "llama.cpp TTFT",
                "llama.cpp / goinfer",
            ],
            rows,
        ) + [""]
        sl = run.get("save_load")
        if sl:
            out += [
                f"After the last turn goinfer's cache ({sl['blocks']} blocks) saved in "
                f"{sl['save_s'] * 1e3:.0f} ms and loaded in {sl['load_s'] * 1e3:.0f} ms; the last "
                f"prompt from the loaded cache: {sl['ttft_after_load_s'] * 1e3:.0f} ms to the first "
                f"token, against {sl['cold_prefill_s']:.1f} s for a cold prefill of it.",
                "",
            ]
    return out


def memory_section(d: dict, notes: Notes) -> list[str]:
    rows = []
    for run in d["runs"]:
        if run.get("benchmark") != "memory":
            continue
        med = run["median"]
        g = med.get("goinfer", {})
        peers = {k: v for k, v in med.items() if k.startswith("llama.cpp")}
        lowest = min(peers, key=lambda k: peers[k].get("peak_rss") or float("inf"), default=None)
        fastest = min(peers, key=lambda k: peers[k].get("load_s") or float("inf"), default=None)
        rat = run.get("ratio") or {}

        def values(key, peer):
            return g.get(key), (peers[peer].get(key) if peer else None)

        def pair(key, fmt, peer):
            a, b = values(key, peer)
            return "-" if a is None and b is None else f"{fmt(a)} / {fmt(b)}"

        def over(key, peer):  # goinfer's value over the peer's, when the run did not say
            a, b = values(key, peer)
            return a / b if a and b else None

        lr = rat.get("load_s") or over("load_s", fastest)
        pr = rat.get("peak_rss") or over("peak_rss", lowest)
        rows.append(
            [
                f"{model_label(run['model'])} {notes.mark(run)}",
                f"{run['prefill']:,} + {run['decode']}",
                pair("load_s", num, fastest) + (f" = {ratio(lr)}" if lr else ""),
                pair("rss_load", gb, fastest),
                pair("peak_rss", gb, lowest) + (f" = {ratio(pr)}" if pr else ""),
                pair("prefill_s", num, fastest),
            ]
        )
    if not rows:
        return []
    return (
        [
            "Load and memory (each engine in a fresh process; goinfer maps its layout cache, "
            "llama.cpp its GGUF; goinfer / llama.cpp, against llama.cpp's lowest peak):",
            "",
        ]
        + table(
            [
                "model",
                "prefill + decode tokens",
                "load s",
                "RSS after load GB",
                "peak RSS GB",
                "first prefill s",
            ],
            rows,
        )
        + [""]
    )


def limits_section(d: dict, notes: Notes) -> list[str]:
    out = []
    for run in d["runs"]:
        if run.get("benchmark") != "limits":
            continue
        parts = []
        bw = run.get("bandwidth")
        if bw:
            parts.append(
                f"read bandwidth {num(bw['one_core']['GBs'])} GB/s on one core, "
                f"{num(bw['threads']['GBs'])} GB/s on all threads"
            )
        for r in run["decode"]:
            b = r["bytes_per_token"]
            parts.append(
                f"decode after {r['context']:,}: {b['total'] / 1e6:.1f} MB/token x "
                f"{num(r['tok_s'])} tok/s = {num(r['GBs'])} GB/s, "
                f"**{100 * r['fraction_of_bandwidth']:.0f}%** of the bandwidth"
                + (  # swept just before and after the row
                    " measured around it ({} and {} GB/s)".format(
                        *(num(x) for x in r["bandwidth_around_GBs"])
                    )
                    if r.get("bandwidth_around_GBs")
                    else ""
                )
            )
        for r in run["prefill"]:
            share = (
                f", matmuls {100 * r['matmul_share']:.0f}% of the time"
                if r.get("matmul_share") is not None
                else ""
            )
            peak = r.get("peak_GOPs") or 0  # older runs stored the fraction, newer the two rates
            frac = r.get("fraction_of_peak", r["int8_GOPs"] / peak if peak else None)
            parts.append(
                f"prefill {r['tokens']:,}{share}: {num(r['int8_GOPs'])} int8 GOP/s"
                + (
                    f", **{100 * frac:.0f}%** of the {num(peak)} GOP/s "
                    + ("measured int8 peak" if r.get("peak_measured") else "nominal peak")
                    if frac is not None
                    else ""
                )
            )
        out.append(f"- {model_label(run['model'])} {notes.mark(run)}: " + "; ".join(parts) + ".")
    if out:
        out = ["How close to the machine's limits (`benchmarks/limits.py`):", ""] + out + [""]
    return out


def speculative_section(d: dict, notes: Notes) -> list[str]:
    out = []
    for run in d["runs"]:
        if run.get("benchmark") != "speculative":
            continue
        t0 = run["tasks"][0]
        cols = [
            "task",
            "goinfer",
            "goinfer + draft",
            "llama.cpp",
            "llama.cpp + PLD",
            "accepted / drafted",
            "speed-up goinfer",
            "speed-up llama.cpp",
        ]
        rows = []
        for t in run["tasks"]:
            acc = f"{t['accepted']} / {t['drafted']}" if "accepted" in t else "-"
            what = f" ({t['rename']}, {t['prompt_tokens']} tokens)" if "rename" in t else ""
            rows.append(
                [
                    t["task"] + what,
                    num(t.get("goinfer")),
                    num(t.get("goinfer + draft")),
                    num(t.get("llama.cpp")),
                    num(t.get("llama.cpp + PLD")),
                    acc,
                    ratio(t.get("speedup_goinfer")),
                    ratio(t.get("speedup_llama_cpp")),
                ]
            )
        keep = [i for i, c in enumerate(cols) if any(r[i] not in ("-", "") for r in rows)]
        out += [
            f"Speculative decoding on the copy-heavy task, {model_label(run['model'])} "
            f"{notes.mark(run)} (decode tok/s; greedy, {run['max_tokens']} tokens, "
            f"`draft_tokens={run['draft_tokens']}`): geometric mean speed-up with drafting "
            f"**{run['geomean_speedup_goinfer']:.2f}x**, identical text.",
            "",
        ]
        out += table([cols[i] for i in keep], [[r[i] for i in keep] for r in rows]) + [""]
        del t0
    return out


def machine_line(d: dict) -> str:
    m = d.get("machine") or {}
    isa = ", ".join(m.get("isa") or [])
    g = d.get("goinfer") or {}
    p = d.get("peer") or {}
    s = [
        f"Machine: {m.get('description', m.get('model_name'))}"
        + (f"; ISA: {isa}" if isa else "")
        + "."
    ]
    if g:
        how = f" ({g['selected_by']})" if g.get("selected_by") else ""
        # AVX-VNNI: the avx2 variant's int matmuls where the CPU has it (absent: runs from
        # before it existed, off)
        vnni = (
            f", AVX-VNNI {'on' if g.get('avxvnni') else 'off'}"
            if g["kernel_variant"] == "avx2"
            else ""
        )
        s.append(
            f"goinfer kernel variant `{g['kernel_variant']}`, AMX {'on' if g.get('amx') else 'off'}"
            f"{vnni}{how}, {d.get('threads')} threads."
        )
    if p:
        build = f", built with {p['build']}" if p.get("build") else ""
        info = f" (its system info: {p['system_info']})" if p.get("system_info") else ""
        s.append(f"Peer: {p['package']} {p['version']}{build}{info}.")
    return " ".join(s)


# ============================================================================ other measurements


def other_sections(docs: list[dict]) -> list[str]:
    by: dict[str, list[tuple[dict, dict]]] = {}
    for d in docs:
        for run in d["runs"]:
            if run.get("benchmark") == "table":
                by.setdefault(run["section"], []).append((d, run))
    unknown = set(by) - set(SECTIONS)
    if unknown:
        raise ValueError(f"sections not in report.SECTIONS: {sorted(unknown)}")
    out = ["## Other measurements", ""]
    for sec in SECTIONS:
        if sec not in by:
            continue
        out += [f"### {sec}", ""]
        for d, run in by[sec]:
            for t in run["tables"]:
                out += [f"{t['caption']} ({d['machine_class']}):", ""]
                out += table(t["columns"], t["rows"]) + [""]
            out += [f"Run: {provenance(run)}.", ""]
    return out


# ============================================================================ the document

INTRO = """\
# Benchmarks

What goinfer measures against llama.cpp (llama-cpp-python) on the same GGUF file, the same
threads and the same prompt ids, and how to measure it again.  Every figure below is rendered
from `benchmarks/results/*.json` by `benchmarks/report.py`; a test checks that this page is
what those files render to.  Each figure carries its regime: machine, goinfer's kernel variant,
the peer's version and build, model file, threads, lengths, date, command and load average.
Figures marked "transcribed from the run log" were read from an earlier log of the runs, which
kept medians only (no repeats); the fields it did not keep are null in the JSON.

## Running the benchmarks

Every script runs as `python benchmarks/NAME.py ...` (with goinfer importable: installed, or
`PYTHONPATH=.` in a built tree), prints a table, returns its results from `main()` and writes
them, with the regime, to `--json FILE`.  `--smoke` runs each on a tiny model in seconds (the
test suite does).  The llama.cpp sides need llama-cpp-python (`pip install '.[bench]'`);
without it they say the peer was skipped.  Model files: `goinfer pull smollm2-135m` /
`gemma3-270m`, or `benchmarks/shapes.py` for the shapes of larger models.

"""

METHOD = """\
## Method and caveats

- **Each engine alone.** `peers.py`, `agent_loop.py` and `speculative.py` run every engine in
  its own process, one at a time, alternating (goinfer, llama.cpp, goinfer, llama.cpp, ...) for
  the given repeats; medians over repeats.  With both engines in one process the figures move:
  goinfer's 1B-shape prefill at 512 tokens read 175 tok/s beside llama.cpp against 247 tok/s
  alone.  The transcribed agent-loop and speculative tables were taken with the engines in one
  process (their notes say so).  `memory.py` always ran each engine in a fresh process.
- **Shapes, not checkpoints.** The Llama, Qwen, Mistral, OLMoE and gpt-oss rows are
  `benchmarks/shapes.py` files: the exact tensor shapes, types and metadata of those models
  with random weights (speed and memory do not depend on the values).  `--pure` files hold one
  type for every matrix; Q4_K_M files come from llama.cpp's own quantizer.  SmolLM2 and Gemma 3
  rows are the real checkpoints.
- **Ratios.** goinfer's tok/s over llama.cpp's best engine of the row (flash attention on or
  off, whichever was faster, when both ran); ratios compare runs of one window only: these
  2-core VMs drift by 15-30% between runs minutes apart, more under load.
- **Prefill** is cold (a fresh KV cache: nothing reused); **decode** is greedy from a random
  prompt of the given length.  Prompts are seeded random ids of ordinary tokens.
- **Decode bytes** (`peers.py`): the file's tensor bytes a decode step reads (every tensor
  once, one embedding row unless the head is tied to it, the used share of MoE expert
  tensors) plus the f16 KV cache it attends (each layer's window at most); with
  `--bandwidth` / `--measure-bandwidth` each engine's achieved fraction of the streaming read
  bandwidth `limits.py` measures with the same threads (its processes started together at
  every rep; sampled before every round of runs and after the last, the median).  A decode
  cell then reads "goinfer / llama.cpp = ratio, goinfer's % / llama.cpp's % of that bandwidth".
  "of ~N GB/s" marks runs sampled before every engine's run and after the last: each run's
  fraction is of the mean of the two samples around it (a shared host's bandwidth moved by up
  to 2x within minutes), the cell's the median of its runs', N the median sample;
  runs whose sweep did not start its processes together show no fraction (their processes
  could read one after the other, overstating the bandwidth up to twofold).  "(N% of its
  weight pages')" is goinfer's fraction of the bandwidth of the very memory its weights were
  mapped in (its layout file's page-cache pages, swept the same way right after each run): in
  a virtual machine the same bytes stream up to 25% slower or faster depending on which
  physical pages hold them, which a fresh buffer does not show.
- **Prefill against the int8 peak** (`limits.py`, `kernels_matmul.py`): the "measured int8
  peak" is the variant's dot-product instruction alone (AVX-512 `vpdpbusd`, AVX2
  `vpmaddubsw`, 12 independent accumulators per thread) timed on the same threads at once, so
  it assumes no clock.  A "nominal peak" (older runs) was 256 (AVX-512) or 128 (AVX2) int8
  operations per cycle times the clock `/proc/cpuinfo` reports: on the Zen 4 guest that clock
  (2.60 GHz) was below the cores' real one, and a Zen 4 core issues one 512-bit `vpdpbusd`
  per cycle, not two: the probe measured 470 GOP/s per core on both variants (128 operations
  per cycle at about 3.66 GHz), so a nominal share there is 1.41x (AVX2) or 0.71x (AVX-512)
  the share of the measured peak.
- **llama.cpp builds.** Where llama.cpp's AMX path crashed (the Xeon VMs), the peer was built
  without AMX and is slower there than natively built llama.cpp is elsewhere; each table names
  its peer build.

"""


def scripts_table() -> list[str]:
    rows = []
    for p in sorted(HERE.glob("*.py")):
        if p.name in ("regime.py", "isolate.py", "report.py"):
            continue
        doc = ast.get_docstring(ast.parse(p.read_text())) or ""
        first = " ".join(doc.split("\n\n")[0].split())
        rows.append([f"`{p.name}`", first])
    return table(["script", "what it measures"], rows) + [""]


def render(docs: list[dict], plots: dict[str, list[str]] | None = None) -> str:
    out = INTRO.splitlines() + scripts_table() + METHOD.splitlines()
    out += ["## goinfer against llama.cpp", ""]
    for d in docs:
        if d["_name"].endswith("__measurements"):
            continue
        notes = Notes()
        body = (
            peers_section(d, notes)
            + agent_section(d, notes)
            + memory_section(d, notes)
            + limits_section(d, notes)
            + speculative_section(d, notes)
        )
        out += [f"### {d['machine_class']}: {d['regime']}", "", machine_line(d), ""]
        for png in (plots or {}).get(d["_name"], []):
            out += [f"![{Path(png).stem}](img/{Path(png).name})", ""]
        out += body + ["Runs:", ""] + notes.lines() + [""]
    out += other_sections(docs)
    return "\n".join(out).rstrip() + "\n"


def plot_names(docs: list[dict]) -> dict[str, list[str]]:
    """The PNG files each results file gets (its speed plot; its agent-loop plot when it has
    turn times of both engines)."""
    names = {}
    for d in docs:
        if d["_name"].endswith("__measurements"):
            continue
        n = []
        if _latest(d["runs"], "peers"):
            n.append(f"bench-{d['_name'].replace('__', '-')}.png")
        if any(r.get("benchmark") == "agent_loop" and len(r["engines"]) > 2 for r in d["runs"]):
            n.append(f"bench-{d['_name'].replace('__', '-')}-agent.png")
        names[d["_name"]] = n
    return names


# ============================================================================ plots


def draw(docs: list[dict], names: dict[str, list[str]], out: Path = IMG) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for d in docs:
        for name in names.get(d["_name"], []):
            if name.endswith("-agent.png"):
                fig = _agent_plot(plt, d)
            else:
                fig = _speed_plot(plt, d)
            p = out / name
            fig.savefig(p, dpi=72, metadata={"Software": None})
            plt.close(fig)
            _palette(p)
            written.append(p)
    return written


def _palette(p: Path) -> None:
    """Store the PNG with a 64-colour palette (a quarter of the bytes; the plots have few colours)."""
    from PIL import Image

    with Image.open(p) as im:
        small = im.convert("RGB").quantize(64)
    small.save(p, optimize=True)


def _speed_plot(plt, d):
    cells = _latest(d["runs"], "peers")
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4.2))
    cmap = plt.get_cmap("tab10")
    for i, (_f, c) in enumerate(cells.items()):
        color = cmap(i % 10)
        for ax, kind, xs in ((a, "prefill", (512, 2048)), (b, "decode", ("short", "long"))):
            pts_g, pts_p = [], []
            for x in xs:
                if (kind, x) not in c:
                    continue
                row, _ = c[(kind, x)]
                gk = _goinfer_keys(row)[0]
                pts_g.append((row["prompt_tokens"], row["tok_s"][gk]))
                if row.get("best_peer"):
                    pts_p.append((row["prompt_tokens"], row["tok_s"][row["best_peer"]]))
            label = model_label(c["_model"]).replace(" shape", "")
            if pts_g:
                ax.plot(*zip(*pts_g), "o-", color=color, label=label)
            if pts_p:
                ax.plot(*zip(*pts_p), "s--", color=color, alpha=0.7)
    from matplotlib.ticker import ScalarFormatter

    for ax, title, xl in ((a, "prefill", "prompt tokens"), (b, "decode", "context (tokens)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(ScalarFormatter())
            axis.set_minor_formatter(ScalarFormatter())
        ax.set_title(f"{title} tok/s: goinfer (solid) vs llama.cpp (dashed)", fontsize=9)
        ax.set_xlabel(xl, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(True, which="both", alpha=0.3)
    b.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.suptitle(f"{d['machine_class']}: {d['regime']}", fontsize=9)
    fig.tight_layout()
    return fig


def _agent_plot(plt, d):
    runs = [r for r in d["runs"] if r.get("benchmark") == "agent_loop" and len(r["engines"]) > 2]
    fig, axes = plt.subplots(1, len(runs), figsize=(5 * len(runs), 3.6), squeeze=False)
    for ax, run in zip(axes[0], runs):
        eng = run["engines"]
        x = [r["prompt_tokens"] for r in eng["goinfer (reuse)"]]
        peers = [k for k in eng if k.startswith("llama.cpp")]
        best = [min(eng[k][i]["ttft_s"] for k in peers) for i in range(len(x))]
        ax.plot(
            x, [r["ttft_s"] for r in eng["goinfer (reuse)"]], "o-", label="goinfer (prefix reuse)"
        )
        ax.plot(x, [r["ttft_s"] for r in eng["goinfer (cold)"]], "^:", label="goinfer (cold)")
        ax.plot(x, best, "s--", label="llama.cpp (best)")
        ax.set_title(f"{model_label(run['model'])}, {run['transcript']} transcript", fontsize=9)
        ax.set_xlabel("prompt tokens (one point per turn)", fontsize=8)
        ax.set_ylabel("time to first token, s", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--check", action="store_true", help="exit 1 if docs/benchmarks.md is out of date"
    )
    ap.add_argument("--no-plots", action="store_true", help="write the markdown only")
    args = ap.parse_args(argv)
    docs = load_results()
    names = plot_names(docs)
    text = render(docs, names)
    if args.check:
        missing = [n for ns in names.values() for n in ns if not (IMG / n).is_file()]
        if DOC.read_text() != text or missing:
            print(
                f"{DOC.name} is not what benchmarks/results renders to (or plots are missing: "
                f"{missing}); run python benchmarks/report.py",
                file=sys.stderr,
            )
            return 1
        return 0
    DOC.write_text(text)
    if not args.no_plots:
        for p in draw(docs, names):
            print(f"wrote {p.relative_to(ROOT)} ({p.stat().st_size // 1024} KB)")
    print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
