"""Constrained decoding: JSON schemas, Lark grammars and regexes enforced token by token.

The engine is llguidance (Rust; bitmask per step, no torch).  goinfer adds three things around
it: a tokenizer view built from goinfer's own GGUF tokenizer, the request shapes (OpenAI's
``response_format`` and goinfer's ``grammar``) compiled and cached once, and a per-generation
``Constraint`` whose next mask is computed in a worker thread while the forward pass runs.

Compile a request (GrammarError, with ``param``, on bad input; nothing is generated)::

    g = compile_request(model.tokenizer, response_format={"type": "json_object"})
    g = compile_request(model.tokenizer, response_format={"type": "json_schema",
                        "json_schema": {"name": "person", "schema": {...}, "strict": True}})
    g = compile_request(model.tokenizer, grammar='start: "yes" | "no"')   # Lark (llguidance's)
    g = compile_request(model.tokenizer, grammar={"regex": r"[0-9]{3}-[0-9]{4}"})

``Session.generate(..., response_format=..., grammar=...)`` does this itself; both arguments
accept an already compiled ``Grammar`` too.  The same source compiles once per tokenizer
(``TokenView.compile`` keeps an LRU of validated grammars; each generation deep-copies one).

Lazy grammars (for tool calls with ``tool_choice="auto"``): the output is free text until a
trigger appears, then the rest of the segment is forced.  ``tags_grammar`` writes the Lark::

    tag = Tag(trigger="<tool_call>", begin="\\n", schema=call_schema, end="\\n</tool_call>")
    lark = tags_grammar(model.tokenizer, [tag])                      # free text, 0..n calls
    lark = tags_grammar(model.tokenizer, [tag], max_count=1)         # at most one call
    lark = tags_grammar(model.tokenizer, [tag], lazy=False)          # >= 1 call, from token 1
    result = session.generate(ids, grammar=lark)

A trigger that is the text of a special (control) token of the vocabulary, such as Llama 3's
``<|python_tag|>`` or Mistral's ``[TOOL_CALLS]``, is matched as that token (free text never
contains special tokens); any other trigger is matched as text the moment it is written (an
llguidance lazy lexeme: ``TEXT "<tool_call>"`` ends at the first occurrence).  Several tags
may be given (one per tool, or one per opening marker); ``schema`` may be an ``anyOf``.

How a Constraint runs inside ``Generation`` (session.py)::

    c = grammar.start(n_logits)     # starts computing the first mask (during the prefill)
    mask = c.mask()                 # waits for it: bool (n_logits,), None at a dead end
    t = sampler.sample(logits, mask)
    if c.ends(t): stop              # a stop token while the grammar may end: complete
    state = c.advance(t)            # "more" | "end" (t taken, then stop) | "rejected"
    c.prefetch()                    # next mask, computed while the next forward pass runs

Tokenizer view: every token has the bytes goinfer decodes it to (``Tokenizer.token_bytes``,
byte-level BPE and SentencePiece alike, byte-fallback tokens as their byte); control, unknown
and unused tokens are special (llguidance's 0xFF marker before their text) so a grammar can
name them (``<|im_start|>`` or ``<[id]>``) and JSON or text never contains them.  llguidance's
EOS is the tokenizer's eos; when the mask allows EOS (the grammar may end here) every stop
token of the tokenizer (eos, eot, end of turn) is allowed and ends the output.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from goinfer.errors import GrammarError
from goinfer.tokenizer import TOKEN_TYPE, Tokenizer

# Whitespace JSON may have between tokens (as llama.cpp's JSON grammars): one space, or one
# line break and an indent of up to 20 blanks.  Pretty-printed JSON is fine; a run of blank
# lines is not, so a small model cannot spend its budget on whitespace.
JSON_WHITESPACE = r"\x20|\x0D?\x0A[\x20\x09]{0,20}"
CACHE_SIZE = 256  # compiled grammars kept per tokenizer
MAX_ERROR_CHARS = 600
# Compute the next mask in a worker thread while the forward pass runs (False: compute it when
# it is needed; benchmarks/constrained.py measures both).
OVERLAP = os.environ.get("GOINFER_MASK_OVERLAP", "1") != "0"


def _llg():
    """llguidance, imported on first use: ``import goinfer`` does not load it."""
    import llguidance

    return llguidance


# ============================================================================ tokenizer view


class _Wrapper:
    """What llguidance's LLTokenizer reads from a Python tokenizer."""

    is_tokenizer_wrapper = True

    def __init__(self, tok: Tokenizer, tokens: list[bytes], special: list[int]):
        self._tok = weakref.proxy(tok)  # the tokenizer owns its view: no cycle through Rust
        self.eos_token_id = tok.eos_id
        self.bos_token_id = tok.bos_id
        self.tokens = tokens
        self.special_token_ids = special
        self.ll = None  # the LLTokenizer built from this wrapper (set once it exists)

    def __call__(self, text) -> list[int]:
        """Token ids of a piece of text in the middle of an output: no BOS, no special tokens
        parsed, no SentencePiece prefix space.  Text the vocabulary cannot spell (it would come
        out as <unk>) gives llguidance's greedy tokenization instead, so <unk> never stands
        for text."""
        raw = text if isinstance(text, bytes) else text.encode("utf-8")
        ids = self._tok.encode_fragment(raw.decode("utf-8", errors="replace"))
        if b"".join(self._tok.token_bytes(i) for i in ids) == raw or self.ll is None:
            return ids
        return self.ll.greedy_tokenize(raw.decode("utf-8", errors="replace"))


class TokenView:
    """llguidance's view of one goinfer tokenizer, and the compiled grammars for it."""

    def __init__(self, tok: Tokenizer):
        n = tok.vocab_size
        tokens, special = [], []
        for i in range(n):
            ty = tok.token_type(i)
            if ty in (TOKEN_TYPE.CONTROL, TOKEN_TYPE.UNKNOWN, TOKEN_TYPE.UNUSED):
                tokens.append(tok.id_to_token(i).encode("utf-8"))
                special.append(i)
            else:
                tokens.append(tok.token_bytes(i))
        self.vocab_size = n
        wrapper = _Wrapper(tok, tokens, special)
        self.ll = wrapper.ll = _llg().LLTokenizer(wrapper)
        wrapper.tokens = wrapper.special_token_ids = None  # copied into llguidance's trie
        self.eos = int(self.ll.eos_token)  # == tok.eos_id; one past the vocabulary if it has none
        self.n_bits = int(self.ll.vocab_size)
        self.stop_ids = np.array(sorted(tok.stop_ids), dtype=np.int64)
        self._special = {tok.id_to_token(i): i for i in special}
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, Grammar] = OrderedDict()
        self.n_compiled = 0  # grammars actually compiled (cache misses)

    def special_id(self, text: str) -> int | None:
        """The id of the special token whose text is ``text``, or None."""
        return self._special.get(text)

    def compile(self, source: str, kind: str, param: str) -> Grammar:
        """Validate and compile an llguidance grammar (cached) -> Grammar; GrammarError."""
        with self._lock:
            g = self._cache.get(source)
            if g is not None:
                self._cache.move_to_end(source)
                return g
        is_err, msgs = _llg().LLMatcher.validate_grammar_with_warnings(source, self.ll)
        if is_err:
            raise GrammarError(f"{_what(kind)} cannot be enforced: {_short(msgs[0])}", param)
        proto = _llg().LLMatcher(self.ll, source, log_level=0)
        if proto.is_error():
            raise GrammarError(
                f"{_what(kind)} cannot be enforced: {_short(proto.get_error())}", param
            )
        g = Grammar(kind=kind, source=source, param=param, view=self, _proto=proto)
        with self._lock:
            self.n_compiled += 1
            self._cache[source] = g
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return g

    def __repr__(self) -> str:
        return f"TokenView({self.vocab_size} tokens, eos={self.eos}, {len(self._cache)} grammars)"


_views_lock = threading.Lock()


def token_view(tokenizer) -> TokenView:
    """The TokenView of a goinfer Tokenizer (or of a TokenView: itself), built once and kept
    on the tokenizer (it lives as long as the model).  Building one takes ~0.1 s for a 49k
    vocabulary, ~1.5 s for Gemma's 262k."""
    if isinstance(tokenizer, TokenView):
        return tokenizer
    v = getattr(tokenizer, "_constrained_view", None)
    if v is None:
        with _views_lock:
            v = getattr(tokenizer, "_constrained_view", None)
            if v is None:
                v = TokenView(tokenizer)
                tokenizer._constrained_view = v
    return v


def _what(kind: str) -> str:
    return {
        "json_schema": "the JSON schema",
        "json_object": "json_object",
        "lark": "the grammar",
        "regex": "the regex",
    }.get(kind, kind)


def _short(msg: str) -> str:
    msg = str(msg).strip()
    return msg if len(msg) <= MAX_ERROR_CHARS else msg[:MAX_ERROR_CHARS] + " ..."


# ============================================================================ requests -> grammars


@dataclass(frozen=True, eq=False)
class Grammar:
    """A validated, compiled constraint for one tokenizer.  ``start()`` gives a Constraint."""

    kind: str  # "json_object" | "json_schema" | "lark" | "regex"
    source: str  # the llguidance grammar
    param: str  # the request field it came from
    view: TokenView
    _proto: object  # llguidance.LLMatcher in its initial state (deep-copied per generation)
    # where the grammar may end, the end of the output takes the probability of every token
    # the grammar forbids there (tool calls: a model that would go on with anything but
    # another call ends its reply; see Constraint.fold_end) ...
    end_takes_forbidden: bool = False
    # ... once calls_begun(tokens, text) of the output so far is true (None: from the start;
    # tool_choice "auto": from the call marker on, never in the free text before it)
    calls_begun: Callable[[list[int], str], bool] | None = None

    def start(self, n_logits: int | None = None) -> Constraint:
        return Constraint(self, n_logits)


# ============================================================================ numbers in schemas

# JSON schema cannot bound how many digits a number has and llguidance's number lexeme is
# unbounded, so a sampled number could take digit after digit until max_tokens (small models
# do: "population": 1111111...).  Every number and integer schema of a response_format schema
# or of a tool's arguments gets, where it has none of its own, the bounds +-(2**53 - 1) (the
# integers a double holds exactly, I-JSON's interoperable range: at most 16 digits) and, for
# numbers, multipleOf 1e-10 (at most 10 decimals).  llguidance writes bounded numbers without
# an exponent, so a number is at most 28 characters; a value beyond 2**53 - 1 in magnitude, or
# with more than 10 decimals, cannot be written (a schema's own bounds and step replace ours).
# The output is still validated against the schema as given.
MAX_SAFE_INT = 2**53 - 1
NUMBER_STEP = 1e-10
VALUE_KEYS = {"const", "enum", "default", "examples"}  # hold JSON values, not schemas
_NUMERIC = ("number", "integer")


def _bound_numbers(schema):
    """Copy of a schema with every number / integer schema bounded (above), and without
    ``propertyNames: {"type": "string"}`` (it says nothing: every key is a string; llguidance
    does not implement propertyNames, and Claude Code's AskUserQuestion tool has one)."""
    if isinstance(schema, list):
        return [_bound_numbers(x) for x in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {
        k: (copy.deepcopy(v) if k in VALUE_KEYS else _bound_numbers(v))
        for k, v in schema.items()
        if not (k == "propertyNames" and v == {"type": "string"})
    }
    ty = out.get("type")
    types = [ty] if isinstance(ty, str) else ty if isinstance(ty, list) else []
    if any(t in _NUMERIC for t in types if isinstance(t, str)):
        lo = [v for k in ("minimum", "exclusiveMinimum") if _is_num(v := out.get(k))]
        hi = [v for k in ("maximum", "exclusiveMaximum") if _is_num(v := out.get(k))]
        if not lo and not (hi and min(hi) <= -MAX_SAFE_INT):
            out["minimum"] = -MAX_SAFE_INT
        if not hi and not (lo and max(lo) >= MAX_SAFE_INT):
            out["maximum"] = MAX_SAFE_INT
        if "number" in types and "multipleOf" not in out:
            out["multipleOf"] = NUMBER_STEP
    return out


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def bound_numbers(schema):
    """The schema with its numbers bounded, or as it is when the bounded schema does not
    compile (a schema whose own bounds or multipleOf llguidance cannot combine with ours)."""
    b = _bound_numbers(schema)
    return b if b == schema or not schema_error(json.dumps(b, sort_keys=True)) else schema


# ============================================================================ closed objects

# By the letter of JSON Schema an object with "properties" and no "additionalProperties" admits
# any other key too, and llguidance enforces it so: a small model pads such an object with keys
# of its own until max_tokens ({"a": 2, "b": 3, "c": 4, "d": ...}).  OpenAI's structured
# outputs and llama.cpp's schema converter read it as closed, and so does goinfer: every object
# schema that declares properties (or patternProperties) and says nothing of
# additionalProperties / unevaluatedProperties gets "additionalProperties": false, nested ones
# too (properties, items, anyOf / oneOf / allOf branches, $defs ...).  An object is closed over
# every key it declares: its properties, the keys it requires, and the properties of its inline
# allOf branches (and, when it has properties of its own, of its anyOf / oneOf branches); those
# branches are not closed themselves, or their intersection would be empty (as llama.cpp merges
# allOf).  "additionalProperties": true or a schema keeps its meaning.
_OBJECT_SAYS = ("additionalProperties", "unevaluatedProperties")
_SCHEMA_KEYS = (
    "items",
    "additionalProperties",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
    "additionalItems",
    "prefixItems",
)  # hold a schema (or a list of schemas)
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_BRANCHES = ("allOf", "anyOf", "oneOf")


def _merged(schema: Mapping) -> list[Mapping]:
    """The inline branches whose properties `schema` is closed over (see above)."""
    keys = _BRANCHES if "properties" in schema else ("allOf",)
    return [
        b
        for k in keys
        if isinstance(schema.get(k), list)
        for b in schema[k]
        if isinstance(b, Mapping) and ("properties" in b or _merged(b))
    ]


def _declared(schema: Mapping) -> tuple[list[str], bool]:
    """(the property names schema and its merged branches declare, does any of them say what
    other keys may be)."""
    props = schema.get("properties")
    names = [n for n in props if isinstance(n, str)] if isinstance(props, Mapping) else []
    says = any(k in schema for k in _OBJECT_SAYS)
    for b in _merged(schema):
        more, s = _declared(b)
        names += more
        says = says or s
    return names, says


def _close(schema, closed: bool = True):
    """Copy of schema with its objects closed; closed=False: a merged branch, whose own keys
    its parent is closed over (its nested objects are closed all the same)."""
    if isinstance(schema, list):
        return [_close(x) for x in schema]
    if not isinstance(schema, Mapping):
        return schema
    merged = {id(b) for b in _merged(schema)}
    out = {}
    for k, v in schema.items():
        if k in _SCHEMA_MAPS and isinstance(v, Mapping):
            out[k] = {name: _close(s) for name, s in v.items()}
        elif k in _BRANCHES and isinstance(v, list):
            out[k] = [_close(b, id(b) not in merged) for b in v]
        elif k in _SCHEMA_KEYS:
            out[k] = _close(v)
        else:
            out[k] = copy.deepcopy(v)
    props = out.get("properties", {})
    if (
        not closed
        or not isinstance(props, Mapping)
        or not ("properties" in schema or "patternProperties" in schema or merged)
    ):
        return out  # (properties that are not an object: the schema's error is kept)
    names, says = _declared(schema)
    if says:
        return out
    props = dict(props)
    required = schema.get("required")
    for n in names + (list(required) if isinstance(required, list) else []):
        if isinstance(n, str) and n not in props:
            props[n] = {}  # declared by a branch, or required: any value (the branch holds it)
    out["properties"] = props
    out["additionalProperties"] = False
    return out


def close_objects(schema):
    """The schema with its objects closed (above), or as it is when the closed schema does not
    compile where the schema does (an allOf $ref branch, closed in $defs, that the object adds
    required keys to)."""
    c = _close(schema)
    if c == schema:
        return schema
    if schema_error(json.dumps(c, sort_keys=True)) and not schema_error(
        json.dumps(schema, sort_keys=True)
    ):
        return schema
    return c


def enforced_schema(schema):
    """A JSON schema as goinfer's grammars hold it: objects closed (close_objects), numbers
    bounded (bound_numbers)."""
    return bound_numbers(close_objects(schema))


@functools.lru_cache(maxsize=256)
def schema_error(schema_json: str) -> str:
    """'' if llguidance compiles the schema, else its message (first line)."""
    bad, msgs = _llg().LLMatcher.validate_grammar_with_warnings("start: %json " + schema_json)
    if not bad:
        return ""
    msg = msgs[0] if msgs else "the schema does not compile"
    msg = re.sub(r"^at \d+\(\d+\): ", "", msg.splitlines()[0])
    return msg.replace("failed to compile JSON schema: ", "")


def json_schema_source(schema) -> str:
    """llguidance grammar of a JSON schema (a dict, or True for any JSON value); its objects
    closed and its numbers bounded (enforced_schema)."""
    try:
        text = json.dumps(schema)
        if isinstance(schema, dict):
            text = json.dumps(enforced_schema(schema))
    except (TypeError, ValueError) as e:
        raise GrammarError(f"the JSON schema is not JSON: {e}", "response_format") from None
    try:
        return _llg().LLMatcher.grammar_from_json_schema(
            text, defaults={"whitespace_pattern": JSON_WHITESPACE}
        )
    except (ValueError, TypeError) as e:
        raise GrammarError(f"the JSON schema is invalid: {_short(e)}", "response_format") from None


def _response_format_schema(rf) -> tuple[str, object] | None:
    """(kind, schema) of an OpenAI response_format, None for text; GrammarError if malformed."""
    P = "response_format"
    if not isinstance(rf, dict):
        raise GrammarError("'response_format' must be an object with a 'type'", P)
    kind = rf.get("type")
    allowed = {"text": {"type"}, "json_object": {"type"}, "json_schema": {"type", "json_schema"}}
    if kind not in allowed:
        raise GrammarError(
            f"'response_format.type' must be one of {sorted(allowed)}, got {json.dumps(kind)[:40]}",
            P,
        )
    extra = set(rf) - allowed[kind]
    if extra:
        raise GrammarError(
            f"'response_format' of type {kind!r} has unknown fields {sorted(extra)}", P
        )
    if kind == "text":
        return None
    if kind == "json_object":
        return kind, {"type": "object"}
    js = rf.get("json_schema")
    if not isinstance(js, dict):
        raise GrammarError(
            "'response_format.json_schema' must be an object with 'name' and 'schema'", P
        )
    extra = set(js) - {"name", "schema", "strict", "description"}
    if extra:
        raise GrammarError(f"'response_format.json_schema' has unknown fields {sorted(extra)}", P)
    name = js.get("name")
    if name is not None and not isinstance(name, str):
        raise GrammarError("'response_format.json_schema.name' must be a string", P)
    strict = js.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise GrammarError("'response_format.json_schema.strict' must be a boolean", P)
    desc = js.get("description")
    if desc is not None and not isinstance(desc, str):
        raise GrammarError("'response_format.json_schema.description' must be a string", P)
    schema = js.get("schema", True)  # no schema: any JSON value
    if not isinstance(schema, (dict, bool)):
        raise GrammarError("'response_format.json_schema.schema' must be a JSON schema object", P)
    if schema is False:
        raise GrammarError("the JSON schema 'false' accepts nothing", P)
    # strict or not, the schema is enforced exactly (goinfer has no looser mode to offer)
    return "json_schema", schema


def request_source(response_format=None, grammar=None) -> tuple[str, str, str] | None:
    """(kind, param, llguidance grammar) of a request, or None when it is unconstrained."""
    rf = None if response_format is None else _response_format_schema(response_format)
    if grammar is not None and rf is not None:
        raise GrammarError("give 'response_format' or 'grammar', not both", "grammar")
    if rf is not None:
        kind, schema = rf
        return kind, "response_format", json_schema_source(schema)
    if grammar is None:
        return None
    if isinstance(grammar, str):
        kind, text = "lark", grammar
    elif (
        isinstance(grammar, dict) and len(grammar) == 1 and next(iter(grammar)) in ("regex", "lark")
    ):
        kind, text = next(iter(grammar.items()))
        if not isinstance(text, str):
            raise GrammarError(f"'grammar.{kind}' must be a string", "grammar")
    else:
        raise GrammarError(
            "'grammar' must be a Lark grammar string, {'lark': str} or {'regex': str}", "grammar"
        )
    if not text.strip():
        raise GrammarError(f"the {kind} is empty", "grammar")
    if kind == "regex":
        return kind, "grammar", _llg().LLMatcher.grammar_from_regex(text)
    return kind, "grammar", _llg().LLMatcher.grammar_from_lark(text)


def compile_request(tokenizer, response_format=None, grammar=None) -> Grammar | None:
    """The compiled constraint of a request (None: unconstrained).  Already compiled Grammar
    objects pass through.  GrammarError (``param`` = the offending field) on bad input."""
    for g in (response_format, grammar):
        if isinstance(g, Grammar):
            if (response_format is not None) and (grammar is not None):
                raise GrammarError("give 'response_format' or 'grammar', not both", "grammar")
            if g.view is not token_view(tokenizer):
                raise GrammarError("this grammar was compiled for another tokenizer", g.param)
            return g
    src = request_source(response_format, grammar)
    if src is None:
        return None
    kind, param, source = src
    return token_view(tokenizer).compile(source, kind, param)


# ============================================================================ lazy grammars


@dataclass(frozen=True)
class Tag:
    """A structured segment inside free text: ``trigger`` (text, or a special token's text),
    then the literal ``begin``, a JSON value matching ``schema`` (None: no value), and the
    literal ``end``."""

    trigger: str
    schema: dict | bool | None = None
    begin: str = ""
    end: str = ""


def tags_grammar(
    tokenizer,
    tags,
    *,
    lazy: bool = True,
    min_count: int | None = None,
    max_count: int | None = None,
    text: str = r"(.|\n)*",
) -> str:
    """A Lark grammar (llguidance's) for output made of tagged segments.

    lazy=True: free text (matching the regex ``text``) in which any tag may start; the grammar
    engages only from a trigger on (tool_choice="auto").  lazy=False: the output starts with
    a tag at once and is tags only, separated by optional whitespace (tool_choice="required").
    min_count / max_count bound the number of segments (defaults: 0 / 1 and unbounded)."""
    tags = list(tags)
    if not tags or not all(isinstance(t, Tag) for t in tags):
        raise GrammarError("tags_grammar needs one or more Tag objects", "tools")
    if "/" in text:
        raise GrammarError("the free-text regex must not contain '/'", "grammar")
    lo = (0 if lazy else 1) if min_count is None else int(min_count)
    if lo < 0 or (max_count is not None and max_count < max(lo, 1)):
        raise GrammarError(f"bad segment count bounds {min_count}..{max_count}", "tools")
    view = token_view(tokenizer)
    lines = [
        f"TEXT: /{text}/",
        "WS: /[ \\t\\r\\n]+/",
        "tag: " + " | ".join(f"tag_{i}" for i in range(len(tags))),
    ]
    for i, t in enumerate(tags):
        if not isinstance(t.trigger, str) or not t.trigger:
            raise GrammarError("a tag's trigger must be a non-empty string", "tools")
        body = " ".join(
            x
            for x in (
                _lit(t.begin),
                "" if t.schema is None else "%json " + json.dumps(t.schema),
                _lit(t.end),
            )
            if x
        )
        sid = view.special_id(t.trigger)
        if sid is not None:
            head = f"<[{sid}]>"
            lines.append(f"tag_{i}: {'TEXT ' if lazy else ''}{head} {body}".rstrip())
        elif lazy:
            lines.append(f"tag_{i}_trigger[lazy]: TEXT {_lit(t.trigger)}")
            lines.append(f"tag_{i}: tag_{i}_trigger {body}".rstrip())
        else:
            lines.append(f"tag_{i}: {_lit(t.trigger)} {body}".rstrip())
    if lazy:
        start = f"start: {_repeat('tag', lo, max_count)} TEXT"
    else:
        more = _repeat("(WS? tag)", lo - 1, None if max_count is None else max_count - 1)
        start = f"start: tag {more} WS?"
    return "\n".join([start] + lines) + "\n"


def _lit(s: str) -> str:
    return json.dumps(s) if s else ""


def _repeat(x: str, lo: int, hi: int | None) -> str:
    if hi is None:
        return f"{x}*" if lo == 0 else f"{x}{{{lo},}}"
    return f"{x}{{{lo},{hi}}}"


# ============================================================================ one generation

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _workers() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="goinfer-mask")
        return _pool


class Constraint:
    """One generation's grammar state (see the module docstring for the protocol)."""

    def __init__(self, grammar: Grammar, n_logits: int | None = None):
        self.grammar = grammar
        self.view = grammar.view
        self.n_logits = int(n_logits or grammar.view.vocab_size)
        self.matcher = grammar._proto.deep_copy()
        self.accepting = False  # the last mask allowed the output to end
        self.complete = False  # the output matched the grammar completely
        self.reason: str | None = None  # why the grammar ended the generation
        self.n_masks = 0
        self._stops = self.view.stop_ids[self.view.stop_ids < self.n_logits]
        self._stop_set = frozenset(int(t) for t in self._stops)
        self._pending = None
        self._begun = False  # calls_begun seen true (it stays so)
        self.prefetch()

    def prefetch(self) -> None:
        """Start computing the mask for the next token (in a worker thread when OVERLAP)."""
        self._pending = _workers().submit(self._compute) if OVERLAP else None

    def _compute(self):
        """-> (allowed (n_logits,) bool or None on an engine error, may the output end here)."""
        m = self.matcher
        bm = m.compute_bitmask()  # drops the GIL
        if m.is_error():
            return None, False
        bits = np.unpackbits(np.frombuffer(bm, dtype=np.uint8), bitorder="little")
        accept = bool(bits[self.view.eos])
        ok = np.zeros(self.n_logits, dtype=bool)
        k = min(self.n_logits, self.view.vocab_size)
        ok[:k] = bits[:k]
        if accept:
            ok[self._stops] = True
        return ok, accept

    def mask(self) -> np.ndarray | None:
        """The tokens allowed next, (n_logits,) bool; None at a dead end (``reason`` says)."""
        fut, self._pending = self._pending, None
        ok, self.accepting = fut.result() if fut is not None else self._compute()
        self.n_masks += 1
        if ok is None or not ok.any():
            self.reason = (
                "grammar dead end: no token of the vocabulary continues the output "
                f"({self._detail()})"
            )
            return None
        return ok

    def _detail(self) -> str:
        m = self.matcher
        err = m.get_error().strip().splitlines()
        return f"llguidance: {m.stop_reason()}" + (f": {_short(err[0])}" if err else "")

    def fold_end(
        self, logits: np.ndarray, mask: np.ndarray, tokens=(), text: str = ""
    ) -> tuple[np.ndarray, np.ndarray]:
        """(logits, mask) to sample from.  Where the output may end (``accepting``) under a
        grammar with ``end_takes_forbidden`` (and once ``calls_begun(tokens, text)`` of the
        output so far): the most likely stop token gets the log of the summed probability
        (at temperature 1) of the stop tokens and of every token the mask forbids, the other
        stop tokens are masked.  Tool calls: after a call the grammar allows another call or
        the end; a model that would go on with prose (which the grammar forbids) ends its
        reply instead of being pushed into a call it did not want.  Anywhere else (or
        without it): (logits, mask) unchanged."""
        stops = self._stops
        g = self.grammar
        if not (self.accepting and g.end_takes_forbidden and len(stops)):
            return logits, mask
        if not self._begun:
            self._begun = g.calls_begun is None or bool(g.calls_begun(tokens, text))
            if not self._begun:
                return logits, mask
        z = np.array(logits, dtype=np.float64)  # (n_logits,)
        best = int(stops[np.argmax(z[stops])])
        out = ~mask
        out[stops] = True
        zo = z[out]
        top = float(zo.max())
        z[best] = top + float(np.log(np.exp(zo - top).sum()))
        m = mask.copy()
        m[stops] = False
        m[best] = True
        return z, m

    def ends(self, token: int) -> bool:
        """Does ``token`` (just sampled under the last mask) end the output, complete?"""
        if self.accepting and int(token) in self._stop_set:
            self.complete, self.reason = True, "grammar complete"
            return True
        return False

    def advance(self, token: int) -> str:
        """Consume ``token`` -> "more" (go on), "end" (taken, and the generation ends here: the
        grammar is complete and allows nothing more, or failed; ``reason`` says which), or
        "rejected" (not taken: a dead end, the token must not be output)."""
        self.close()  # a mask still being computed reads the matcher: let it finish first
        m = self.matcher
        if not m.consume_token(int(token)):
            self.reason = (
                "grammar dead end: the sampled token does not continue the output "
                f"({self._detail()})"
            )
            return "rejected"
        if m.is_stopped():
            if m.is_accepting() and not m.is_error():
                self.complete, self.reason = True, "grammar complete"
            else:
                self.reason = f"grammar dead end: ({self._detail()})"
            return "end"
        return "more"

    def close(self) -> None:
        """Wait for a mask still being computed and drop it (the matcher must not change under
        it, and no work is left behind)."""
        fut, self._pending = self._pending, None
        if fut is not None:
            fut.result()
