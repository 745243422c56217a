"""Model: load a GGUF, hold its weights and tokenizer, run the forward step over a batch."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from goinfer import hub, layout, memory
from goinfer._threads import resolve_threads
from goinfer.embeddings import pooling_of
from goinfer.errors import ContextLengthError, ModelFormatError
from goinfer.gguf import ConversionSummary, GGUFFile
from goinfer.graph import GraphRunner
from goinfer.graph import enabled_by_env as graph_enabled_by_env
from goinfer.graph import supported as graph_supported
from goinfer.kv_cache import DEFAULT_KV_DTYPE, EXACT, FAST, KVCache, check_kv_dtype
from goinfer.models import read_config
from goinfer.models.base import Batch, ModelConfig, Segment
from goinfer.recurrent import RecurrentState, SeqRecurrent
from goinfer.sampling import SamplingParams
from goinfer.tokenizer import Tokenizer, builtin_template, render_chat_template

FAST_FROM = 512  # default mode: rows at absolute positions >= this run the fast attention
PREFILL_CHUNK = 512  # rows per forward call during prefill (bounds scratch memory)


def _kernels(use_reference: bool):
    if use_reference:
        from goinfer import _reference

        return _reference
    from goinfer import _kernels

    return _kernels


@dataclass(frozen=True)
class LoadOptions:
    """How a model is loaded and run: Model.load's and Model's keyword arguments.

    threads: compute threads (None: OMP_NUM_THREADS, else the machine's physical cores).
    exact: float64 attention at every position (default: the fast float32 kernel for rows at
    positions >= 512, FAST_FROM); exact_prefill is its old name.
    context_length: the context to run with (None: the file's).
    progress: progress bars while pulling and loading.
    graph: replay decode steps as one C graph (None: on unless GOINFER_GRAPH=0; goinfer/graph.py).
    layout_cache: map the weights from their cached native layout (None: on unless
    GOINFER_LAYOUT_CACHE=0; the first load builds it, goinfer/layout.py).
    kv_dtype: storage type of its KV caches, "f16" (default), "f32" or "q8_0"."""

    threads: int | None = None
    exact: bool = False
    context_length: int | None = None
    progress: bool = True
    graph: bool | None = None
    layout_cache: bool | None = None
    kv_dtype: str = DEFAULT_KV_DTYPE
    exact_prefill: bool | None = None

    def with_(self, **overrides) -> LoadOptions:
        """These options with some fields replaced; TypeError naming an unknown one."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise TypeError(
                f"unknown model option(s) {', '.join(unknown)}; the options are "
                f"{', '.join(sorted(names))}"
            )
        return dataclasses.replace(self, **overrides)


class Model:
    """A loaded model.  ``Model.load("smollm2-135m")`` or ``Model.load("path/to/file.gguf")``."""

    def __init__(
        self,
        gguf: GGUFFile,
        options: LoadOptions | None = None,
        *,
        name: str | None = None,
        _reference_kernels: bool = False,
        **overrides,
    ):
        """A model from an open GGUF file; options (LoadOptions) and keyword overrides of its
        fields (threads=, exact=, ...) say how it is loaded and run; name: what it is called
        (default: the file's stem)."""
        t0 = time.perf_counter()
        opts = (options or LoadOptions()).with_(**overrides)
        self.options = opts
        family, config = read_config(gguf)  # UnsupportedArchitectureError if not supported
        self.config: ModelConfig = config
        arch = gguf.arch
        self.path = Path(gguf.path)
        self.name = name or self.path.stem
        self.source: hub.ModelSource | None = None  # set by load(): where the name led
        # what a request leaves out: the source's defaults (an Ollama model's params and
        # system layers), else greedy sampling, no stop strings, no system message
        self.defaults = hub.SourceDefaults()
        self.sampling_defaults = SamplingParams()
        self.fingerprint = gguf.fingerprint
        self.threads = resolve_threads(opts.threads)
        self.exact = bool(
            opts.exact if opts.exact_prefill is None else opts.exact or opts.exact_prefill
        )
        self.kv_dtype = opts.kv_dtype  # storage type of the KV caches made for this model
        self.kernels = _kernels(_reference_kernels)
        for _, hd in set(self.config.kv_geometry()):
            check_kv_dtype(opts.kv_dtype, hd)
        if opts.context_length is not None:
            if opts.context_length < 1:
                raise ValueError(f"context_length must be positive, got {opts.context_length}")
            self.config.context_length = int(opts.context_length)
        # the weights must fit in memory (mapped or not) before anything large is read
        memory.check_fits(gguf.native_bytes(), f"{self.name} (its weights in goinfer's layout)")
        self.chat_template = gguf.get("tokenizer.chat_template") or builtin_template(arch)
        self.pooling = pooling_of(gguf)  # an embedding model's pooling (None: not one)
        # the tokenizer (~1 s for a 128k-token vocabulary) is built while the weights map (the
        # kernel populates the mapping without the GIL) or convert
        with ThreadPoolExecutor(1, thread_name_prefix="goinfer-tokenizer") as pool:
            tokenizer = pool.submit(Tokenizer.from_metadata, gguf.metadata)
            weights, self.load_info = layout.load(
                gguf,
                family,
                self.config,
                enabled=opts.layout_cache,
                progress=opts.progress,
                name=self.name,
            )
            if weights is not None:  # mapped from the layout cache
                self.impl = family(gguf, self.config, self.kernels, self.threads, weights=weights)
                self.impl.row_tables = self.load_info.row_tables  # read from the file by row
                del weights
            else:  # converted from the GGUF into process memory
                bar = None
                if opts.progress:
                    from tqdm.auto import tqdm

                    bar = tqdm(
                        total=self.config.n_layers,
                        desc=f"loading {self.name}",
                        unit="layer",
                        leave=False,
                        disable=None,
                    )
                try:
                    self.impl = family(
                        gguf,
                        self.config,
                        self.kernels,
                        self.threads,
                        progress=bar.update if bar is not None else None,
                    )
                finally:
                    if bar is not None:
                        bar.close()
            self.tokenizer = tokenizer.result()
        memory.trim()  # what building the tokenizer freed goes back to the system
        self.conversions = (
            ConversionSummary.from_dicts(self.load_info.conversions)
            if self.load_info.source == "layout"
            else gguf.conversion_summary()
        )
        self.load_seconds = time.perf_counter() - t0
        self._lock = threading.RLock()
        self._cache: KVCache | None = None
        # decode steps replayed as one C graph (goinfer/graph.py); None: GOINFER_GRAPH (on)
        graph = graph_enabled_by_env() if opts.graph is None else opts.graph
        self.graph = (
            GraphRunner(self) if graph and graph_supported(self.impl, self.kernels) else None
        )

    @classmethod
    def load(
        cls,
        name_or_path: str | os.PathLike = hub.DEFAULT_MODEL,
        threads: int | None = None,
        exact: bool | None = None,
        *,
        options: LoadOptions | None = None,
        quant: str | None = None,
        **overrides,
    ) -> Model:
        """Load a model by name or path (goinfer/hub.py): a registered model (pulled on first
        use), a local .gguf file (a split one by its first part), a Hugging Face repo
        (``hf.co/ORG/REPO[:QUANT]`` or ``ORG/REPO``, fetched into the Hugging Face cache; quant
        picks its file, default Q4_K_M), or a model pulled with Ollama (``llama3.2``, ``qwen3:4b``).

        threads, exact and the other keywords (context_length, progress, graph, layout_cache,
        kv_dtype) are LoadOptions' fields, applied over options (default LoadOptions())."""
        given = {k: v for k, v in (("threads", threads), ("exact", exact)) if v is not None}
        opts = (options or LoadOptions()).with_(**given, **overrides)
        src = hub.locate(name_or_path, quant=quant, progress=opts.progress)
        with GGUFFile(src.path) as g:
            m = cls(g, opts, name=src.name)
        m.source = src
        m.defaults = src.defaults()
        try:
            m.sampling_defaults = SamplingParams(**m.defaults.sampling)
        except (TypeError, ValueError) as e:
            raise ModelFormatError(
                f"{src.name}: its parameters {m.defaults.sampling} are not usable: {e}"
            ) from None
        m.cache  # noqa: B018 - created now: its first blocks fault in while the caller gets ready (kv_cache.py)
        return m

    # ------------------------------------------------------------------ text

    def tokenize(
        self, text: str, add_special: bool = False, parse_special: bool = True
    ) -> list[int]:
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids, skip_special: bool = False) -> str:
        return self.tokenizer.decode(list(ids), skip_special=skip_special)

    def tokenize_chat(self, prompt: str) -> list[int]:
        """Token ids of a rendered chat prompt, with BOS first exactly once when the model wants
        one: a template that writes ``{{ bos_token }}`` keeps its own, a template that writes none
        (the built-in ones) gets one (as llama.cpp does: it strips a leading BOS the template
        wrote and lets the tokenizer add it)."""
        ids = self.tokenize(prompt, add_special=False, parse_special=True)
        bos = self.tokenizer.bos_id
        if self.tokenizer.add_bos and bos is not None and (not ids or ids[0] != bos):
            ids.insert(0, bos)
        return ids

    def apply_chat_template(self, messages, add_generation_prompt: bool = True, **kwargs) -> str:
        if not self.chat_template:
            from goinfer.errors import ChatTemplateError

            raise ChatTemplateError(
                f"{self.name} has no chat template and {self.config.arch!r} "
                "has no built-in one; use generate() with a raw prompt"
            )
        tok = self.tokenizer
        return render_chat_template(
            self.chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=tok.id_to_token(tok.bos_id) if tok.bos_id is not None else "",
            eos_token=tok.id_to_token(tok.eos_id) if tok.eos_id is not None else "",
            **kwargs,
        )

    # ------------------------------------------------------------------ cache and sessions

    @property
    def cache(self) -> KVCache:
        """The model's default KV cache, shared by sessions created without one."""
        with self._lock:
            if self._cache is None:
                self._cache = KVCache(self)
            return self._cache

    def session(self, cache: KVCache | None = None, *, cache_salt: str | None = None):
        """A new session on `cache` (default: the model's): a ChatSession (generate and chat)."""
        from goinfer.chat.session import ChatSession

        return ChatSession(self, cache if cache is not None else self.cache, cache_salt=cache_salt)

    @property
    def n_ctx(self) -> int:
        return self.config.context_length

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    # ------------------------------------------------------------------ numerics mode

    @property
    def exact_prefill(self) -> bool:
        """The old name of ``exact``."""
        return self.exact

    @exact_prefill.setter
    def exact_prefill(self, value: bool) -> None:
        self.exact = bool(value)

    @property
    def fast_from(self) -> int | None:
        """The first absolute position whose attention runs the fast kernel, or None (exact at
        every position: exact=True, or kernels without attention_fast).  Which kernel a row
        runs depends on its position and this mode only, never on how the tokens are batched."""
        if self.exact or not hasattr(self.kernels, "attention_fast"):
            return None
        return FAST_FROM

    def mode_at(self, pos: int) -> str:
        """The numerics mode of the KV at absolute position pos: "fast" if a row at or before
        pos ran the fast kernel (pos >= fast_from), else "exact" (the same bits in both
        modes).  The prefix cache keys a block by the mode of its last position."""
        ff = self.fast_from
        return FAST if ff is not None and pos >= ff else EXACT

    @property
    def numerics_mode(self) -> str:
        return EXACT if self.exact else FAST

    @property
    def hybrid(self) -> bool:
        """Does the model carry recurrent state (linear-attention layers, goinfer/recurrent.py)?"""
        return self.config.state_spec is not None

    def new_state(self) -> RecurrentState:
        """A hybrid model's recurrent state before the first token (zeros)."""
        spec = self.config.state_spec
        if spec is None:
            raise ValueError(f"{self.name} has no recurrent state")
        return RecurrentState.zeros(spec)

    # ------------------------------------------------------------------ forward

    def forward(
        self,
        cache: KVCache,
        block_table: np.ndarray,
        tokens,
        pos0: int,
        *,
        all_logits: bool = False,
        state: RecurrentState | None = None,
        snapshots: dict | None = None,
        hidden: bool = False,
        between_chunks: Callable[[int], None] | None = None,
    ) -> np.ndarray:
        """Run tokens at positions pos0.. of one sequence whose blocks are block_table.

        Returns logits of the last position (1, vocab), or of every position (T, vocab);
        hidden=True: the final-normed hidden states instead ((1, d_model) / (T, d_model)).
        Long inputs run in chunks of PREFILL_CHUNK rows (a row's bits do not depend on the cuts);
        between_chunks(c) is called before each chunk after the first, tokens[:c] computed (a
        session commits them and lets go of the window KV behind its next position).
        Hybrid models: ``state`` is the sequence's recurrent state after its first pos0 tokens,
        updated in place (None: a fresh one, only at pos0 = 0); ``snapshots`` {n: None} is
        filled with copies of the state after the first n tokens, pos0 < n <= pos0 + T."""
        tokens = np.asarray(tokens, dtype=np.int32)
        T = len(tokens)
        if T == 0:
            raise ValueError("forward needs at least one token")
        if self.hybrid and state is None:
            if pos0 != 0:
                raise ValueError(
                    f"{self.name} is a hybrid model: continuing a sequence at "
                    f"position {pos0} needs its recurrent state (state=)"
                )
            state = self.new_state()
        want_snaps = sorted(n for n in (snapshots or {}) if pos0 < n <= pos0 + T)
        out = []
        for c0 in range(0, T, PREFILL_CHUNK):
            c1 = min(T, c0 + PREFILL_CHUNK)
            if c0 and between_chunks is not None:
                between_chunks(c0)
            want = "all" if all_logits else ("last" if c1 == T else "none")
            seq: tuple = (block_table, tokens[c0:c1], pos0 + c0, want)
            ns = [n for n in want_snaps if pos0 + c0 < n <= pos0 + c1]
            rec = None
            if state is not None:
                rec = SeqRecurrent.with_snapshots(state, [n - 1 - pos0 - c0 for n in ns])
                seq = seq + (rec,)
            lg = self.forward_batch(cache, [seq], hidden=hidden)[0]
            if rec is not None and snapshots is not None:
                for n, snap in zip(ns, rec.snapshots()):
                    snapshots[n] = snap
            if lg is not None:
                out.append(lg)
        return out[0] if len(out) == 1 else np.concatenate(out, axis=0)

    def forward_batch(self, cache: KVCache, seqs, hidden: bool = False) -> list:
        """One forward step over several sequences sharing a KV cache (continuous batching).
        hidden=True: final-normed hidden states (T, d_model) where logits would be.

        seqs: (block_table, tokens, pos0, want[, rec]) per sequence, want in "all" | "last" |
        "none"; rec (recurrent.SeqRecurrent) is required by hybrid models.  Returns per
        sequence logits (T, vocab) / (1, vocab) / None.  Each sequence's rows give the same bits
        as running it alone (rows are independent in every matmul; attention reads only the
        sequence's own blocks, and its kernel is chosen by the row's position; the recurrence
        reads only the sequence's own state).  Sliding-window layers whose KV the cache trims
        write and read window slots (KVCache.window_table: the blocks written get one now)."""
        bs = cache.block_size
        toks: list[np.ndarray] = []  # per sequence (T_i,) int32, and so on
        poss: list[np.ndarray] = []
        slots: list[np.ndarray] = []
        wslots: list[np.ndarray] = []
        segs: list[Segment] = []
        rows: list[np.ndarray] = []
        where: list[tuple[int, int] | None] = []  # each sequence's rows of the logits
        r0 = 0
        for item in seqs:
            bt, tokens, pos0, want = item[:4]
            rec = item[4] if len(item) > 4 else None
            if self.hybrid and rec is None:
                raise ValueError(
                    f"{self.name} is a hybrid model: every sequence of a forward "
                    "batch needs its recurrent state"
                )
            tokens = np.asarray(tokens, dtype=np.int32)
            T = len(tokens)
            if T == 0:
                raise ValueError("every sequence in a batch needs at least one token")
            if pos0 + T > self.n_ctx:
                raise ContextLengthError(f"{pos0 + T} tokens exceed the context of {self.n_ctx}")
            if tokens.min() < 0 or tokens.max() >= self.vocab_size:
                raise ValueError(f"token id out of range 0..{self.vocab_size - 1}")
            bt = np.ascontiguousarray(bt, dtype=np.int32)
            if len(bt) * bs < pos0 + T:
                raise ValueError(f"block table of {len(bt)} blocks cannot hold {pos0 + T} tokens")
            pos = np.arange(pos0, pos0 + T, dtype=np.int32)
            toks.append(tokens)
            poss.append(pos)
            slots.append(bt[pos // bs].astype(np.int64) * bs + pos % bs)
            wbt = None
            if cache.window:
                wbt = cache.window_table(bt, pos0, T)
                wslots.append(wbt[pos // bs].astype(np.int64) * bs + pos % bs)
            segs.append(Segment(r0, r0 + T, bt, rec, wbt))
            n_rows = sum(len(r) for r in rows)
            if want == "all":
                rows.append(np.arange(r0, r0 + T, dtype=np.int64))
                where.append((n_rows, n_rows + T))
            elif want == "last":
                rows.append(np.array([r0 + T - 1], dtype=np.int64))
                where.append((n_rows, n_rows + 1))
            else:
                where.append(None)
            r0 += T
        batch = Batch(
            np.concatenate(toks),
            np.concatenate(poss),
            np.concatenate(slots),
            segs,
            np.concatenate(rows) if rows else np.zeros(0, np.int64),
            self.fast_from,
            hidden=hidden,
            wslots=np.concatenate(wslots) if cache.window else None,
        )
        with self._lock:
            logits = None
            if self.graph is not None and not hidden and GraphRunner.replayable(batch):
                logits = self.graph.decode(cache, batch)  # None: not replayed
            if logits is None:
                logits = self.impl.forward(batch, cache.k, cache.v)
        return [None if w is None else logits[w[0] : w[1]] for w in where]

    def logits(self, ids) -> np.ndarray:
        """Logits of every position of ids, (len(ids), vocab) float32, teacher-forced (the
        same bits as a session's prefill or decode steps of ids)."""
        return self._teacher_forced(ids, False)

    def hidden_states(self, ids) -> np.ndarray:
        """The final-normed hidden state of every position of ids, (len(ids), d_model) float32
        (what goinfer/embeddings.py pools)."""
        return self._teacher_forced(ids, True)

    def _teacher_forced(self, ids, hidden: bool) -> np.ndarray:
        ids = list(ids)
        if not ids:
            raise ValueError("logits() needs at least one token")
        if len(ids) > self.n_ctx:
            raise ContextLengthError(
                f"{len(ids)} tokens exceed the context length {self.n_ctx} of {self.name}"
            )
        bs = 16
        cache = KVCache(self, max_tokens=len(ids), block_size=bs)
        bt = np.array([cache.allocate() for _ in range(cache.n_blocks)], dtype=np.int32)
        return self.forward(cache, bt, ids, 0, all_logits=True, hidden=hidden)

    def __repr__(self) -> str:
        return f"Model({self.name!r}, {self.config.describe()}, threads={self.threads})"
