"""Hypothesis strategies for random JSON schemas that a generation can always complete within a
few hundred tokens (strings, arrays and objects are bounded; objects allow no extra keys, by
"additionalProperties": false or, closed=False, by goinfer reading an object that declares
properties as closed), and the validation-rate counter the constrained-decoding tests report."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import jsonschema
from hypothesis import strategies as st

KEYS = ["a", "b", "id", "name", "value", "tags", "x_1", "ok"]
PATTERNS = [r"^[a-z]{1,6}$", r"^[0-9]{3}-[0-9]{2}$", r"^(yes|no|maybe)$", r"^[A-Z][a-z]{0,4}$",
            r"^#[0-9a-f]{6}$"]


@st.composite
def _integer(draw, bounded):
    s = {"type": "integer"}
    maybe = st.integers(-1000, 1000) if bounded else st.none() | st.integers(-1000, 1000)
    lo, hi = draw(maybe), draw(maybe)
    if lo is not None and hi is not None and lo > hi:
        lo, hi = hi, lo
    if lo is not None:
        s["minimum"] = lo
    if hi is not None:
        s["maximum"] = hi
    return s


@st.composite
def _number(draw, bounded):
    lo = draw(st.integers(-100, 100))
    hi = lo + draw(st.integers(1, 200))
    s = {"type": "number", "minimum": lo, "maximum": hi}
    if draw(st.booleans()):
        s = {"type": "number", "exclusiveMinimum": lo, "maximum": hi}
    if bounded:  # a bounded number of digits: a random-weights model may never stop otherwise
        s["multipleOf"] = draw(st.sampled_from([0.5, 0.25]))  # exact in binary: jsonschema divides
    return s


@st.composite
def _string(draw):
    kind = draw(st.sampled_from(["len", "pattern", "enum"]))
    if kind == "pattern":
        return {"type": "string", "pattern": draw(st.sampled_from(PATTERNS))}
    if kind == "enum":
        words = draw(st.lists(st.sampled_from(["red", "green", "blue", "x", "long word", "é"]),
                              min_size=1, max_size=4, unique=True))
        return {"type": "string", "enum": words}
    lo = draw(st.integers(0, 3))
    return {"type": "string", "minLength": lo, "maxLength": lo + draw(st.integers(0, 8))}


def _leaf(bounded):
    return st.one_of(
        _integer(bounded), _number(bounded), _string(),
        st.just({"type": "boolean"}), st.just({"type": "null"}),
        st.lists(st.one_of(st.integers(-5, 5), st.sampled_from(["a", "b"]), st.booleans(),
                           st.none()), min_size=1, max_size=4, unique=True).map(
            lambda v: {"enum": v}),
        st.sampled_from([{"const": 42}, {"const": "fixed"}]),
        st.just({"type": ["integer", "null"], "minimum": 0, "maximum": 9}),
    )


def _containers(children, closed: bool = True):
    @st.composite
    def obj(draw):
        keys = draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=3, unique=True))
        props = {k: draw(children) for k in keys}
        req = [k for k in keys if draw(st.booleans())]
        s = {"type": "object", "properties": props}
        if closed:
            s["additionalProperties"] = False
        if req:
            s["required"] = req
        return s

    @st.composite
    def arr(draw):
        lo = draw(st.integers(0, 2))
        return {"type": "array", "items": draw(children), "minItems": lo,
                "maxItems": lo + draw(st.integers(0, 2))}

    return obj() | arr()


def schemas(max_leaves: int = 5, bounded: bool = False, closed: bool = True):
    """Random JSON schemas; the top level is an object (as response_format wants).  Strings,
    arrays and objects are always bounded; bounded=True also bounds every number's digits (both
    integer bounds, a multipleOf), so any output, even a random model's, ends within a few
    hundred tokens.  closed=False: no object says "additionalProperties"."""
    inner = st.recursive(_leaf(bounded), lambda c: _containers(c, closed), max_leaves=max_leaves)
    return _containers(inner, closed).filter(lambda s: s["type"] == "object")


def with_closed_objects(schema):
    """The schema with "additionalProperties": false added to every object schema that declares
    properties and says nothing of other keys (what JSON Schema would need to admit none)."""
    if isinstance(schema, list):
        return [with_closed_objects(x) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: (v if k in ("enum", "const") else with_closed_objects(v))
           for k, v in schema.items()}
    if "properties" in schema:
        out["properties"] = {k: with_closed_objects(v) for k, v in schema["properties"].items()}
        out.setdefault("additionalProperties", False)
    return out


@dataclass
class Rate:
    """How many constrained outputs completed, parsed and validated, per model."""

    runs: dict = field(default_factory=dict)  # model -> [generated, complete, valid]

    def check(self, name: str, result, schema) -> None:
        """Count result; assert a complete output parses and validates (an incomplete one must
        have finished by length)."""
        n = self.runs.setdefault(name, [0, 0, 0])
        n[0] += 1
        if result.finish_reason == "length":
            assert result.reason is None
            return
        assert result.finish_reason == "stop" and result.reason == "grammar complete", \
            (result.finish_reason, result.reason, result.text)
        n[1] += 1
        value = json.loads(result.text)
        jsonschema.validate(value, schema)
        n[2] += 1

    def lines(self) -> list[str]:
        out = []
        for name, (g, c, v) in sorted(self.runs.items()):
            out.append(f"constrained validation {name}: {v}/{g} outputs parsed and validated "
                       f"({c} complete, {g - c} cut by max_tokens); "
                       f"{v}/{c} of the complete ones = {100.0 * v / max(c, 1):.1f}%")
        return out
