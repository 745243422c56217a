"""Free-form tools (the Responses API's ``custom`` tools): a call's input is text, not JSON
arguments, optionally held to a grammar (Lark, as llguidance reads it, or a regex).

Every call format goinfer knows writes JSON arguments, so a free-form tool is shown to the
model as a function of one string argument, ``input``; the call's input is that string.  A
regex grammar becomes the string's ``pattern``.  A Lark grammar rides in the input's schema
(``x-goinfer-lark``, which JSON schema engines ignore) and, in the formats whose call is a
JSON object (ToolFormat.body_rules: Hermes's, the generic one), holds the string itself: the
grammar is rewritten to match its texts as they appear inside a JSON string (``lark_in_json``:
each literal and each regex of the grammar matches the json.dumps escapes of what it matched),
so the call is held to the grammar and reads back as the text the grammar allows.  In the
other formats the input is any string.
"""

from __future__ import annotations

import ast
import functools
import json
import re
from collections.abc import Mapping

try:  # Python 3.11+
    import re._constants as _sc
    import re._parser as _sp
except ImportError:  # pragma: no cover - older Pythons
    import sre_constants as _sc  # type: ignore[no-redef]
    import sre_parse as _sp  # type: ignore[no-redef]

__all__ = [
    "INPUT_KEY",
    "LARK_KEY",
    "custom_tool_function",
    "lark_of",
    "lark_in_json",
    "call_rules",
    "lark_error",
]

INPUT_KEY = "input"
LARK_KEY = "x-goinfer-lark"


def custom_tool_function(description: str | None, fmt: dict) -> dict:
    """The function a free-form tool is shown as (a Chat tool's ``function`` object without
    its name): its description, and the grammar the input follows, if any."""
    text = description or ""
    prop: dict = {"type": "string"}
    if fmt.get("type") == "grammar":
        kind = "Lark grammar" if fmt["syntax"] == "lark" else "regular expression"
        note = f"The input is free-form text that follows this {kind}:\n{fmt['definition']}"
        text = f"{text}\n\n{note}" if text else note
        if fmt["syntax"] == "regex":  # the whole input (a JSON schema pattern is a search)
            prop["pattern"] = f"^(?:{fmt['definition']})$"
        else:
            prop[LARK_KEY] = fmt["definition"]
    else:
        note = "The input is free-form text."
        text = f"{text}\n\n{note}" if text else note
    return {
        "description": text,
        "parameters": {
            "type": "object",
            "properties": {INPUT_KEY: prop},
            "required": [INPUT_KEY],
            "additionalProperties": False,
        },
    }


def lark_of(tool) -> str | None:
    """The Lark grammar of a free-form tool's input (None: any other tool)."""
    props = tool.parameters.get("properties") if isinstance(tool.parameters, Mapping) else None
    prop = props.get(INPUT_KEY) if isinstance(props, Mapping) else None
    lark = prop.get(LARK_KEY) if isinstance(prop, Mapping) else None
    return lark if isinstance(lark, str) else None


def call_rules(tool, args_key: str, k: int) -> tuple[list[str], str]:
    """(rules, name of the rule) of one call to a free-form tool with a Lark grammar, written
    as a JSON call object ``{"name": NAME, ARGS_KEY: {"input": "..."}}`` laid out as json.dumps
    writes it, the input's text held to the grammar."""
    rules, start = lark_in_json(lark_of(tool), f"goinfer_ff{k}_")
    head = (
        f'{{"name": {json.dumps(tool.name, ensure_ascii=False)}, '
        f'{json.dumps(args_key)}: {{"{INPUT_KEY}": "'
    )
    name = f"goinfer_ff{k}_call"
    rules.insert(0, f"{name}: {_lark_str(head)} {start} {_lark_str(chr(34) + '}}')}")
    return rules, name


@functools.lru_cache(maxsize=64)
def lark_error(definition: str) -> str:
    """'' if the grammar can hold a free-form input, else why not."""
    import llguidance as llg

    try:
        rules, start = lark_in_json(definition, "g_")
    except ValueError as e:
        return str(e)
    for text in (definition, f'start: "\\"" {start} "\\""\n' + "\n".join(rules)):
        bad, msgs = llg.LLMatcher.validate_grammar_with_warnings(text)
        if bad:
            return (msgs[0] if msgs else "the grammar does not compile").splitlines()[0]
    return ""


# ============================================================================ Lark in JSON

_TOKEN = re.compile(
    r"""
    (?P<comment>//[^\n]*)
  | (?P<string>"(?:\\.|[^"\\\n])*"i?)
  | (?P<regex>/(?!/)(?:\\.|[^/\\\n])+/[a-z]*)
  | (?P<directive>%[a-z_]+)
  | (?P<name>[A-Za-z_][A-Za-z_0-9]*)
  | (?P<special><[^>\n]*>)
  | (?P<other>.|\n)
""",
    re.X,
)
# the terminals of Lark's "common" module a grammar may import, as regexes of their texts
COMMON = {
    "LF": r"\n",
    "CR": r"\r",
    "NEWLINE": r"(\r?\n)+",
    "WS_INLINE": r"[ \t]+",
    "WS": r"[ \t\f\r\n]+",
    "DIGIT": r"[0-9]",
    "HEXDIGIT": r"[a-fA-F0-9]",
    "INT": r"[0-9]+",
    "SIGNED_INT": r"[+-]?[0-9]+",
    "LETTER": r"[A-Za-z]",
    "LCASE_LETTER": r"[a-z]",
    "UCASE_LETTER": r"[A-Z]",
    "WORD": r"[A-Za-z]+",
    "CNAME": r"[_A-Za-z][_A-Za-z0-9]*",
}
_IMPORT = re.compile(r"%import\s+common(?:\.(\w+)(?:\s*->\s*(\w+))?|\s*\(([\w\s,]+)\))\s*$")


def lark_in_json(definition: str, prefix: str) -> tuple[list[str], str]:
    """A Lark grammar rewritten to match what it matches as the contents of a JSON string
    (json.dumps's escapes: \\" \\\\ \\n \\r \\t \\b \\f, \\u00XX for other control
    characters), its rule and terminal names prefixed (``prefix`` / its upper case) so it
    sits beside other rules -> (its lines, the name of its start rule).  ValueError for what
    cannot be rewritten (imports other than Lark's common terminals, %ignore, special tokens,
    case-insensitive literals, regex lookaround or backreferences)."""
    out: list[str] = []
    for line in definition.splitlines():
        s = line.strip()
        if s.startswith("%import"):
            m = _IMPORT.match(s)
            if not m:
                raise ValueError(f"only Lark's common terminals can be imported, got {s!r}")
            names = [m.group(1)] if m.group(1) else [n.strip() for n in m.group(3).split(",")]
            for n in filter(None, names):
                if n not in COMMON:
                    raise ValueError(f"common.{n} is not a terminal goinfer knows")
                alias = m.group(2) or n
                out.append(f"{_name(alias, prefix)}: /{_regex_in_json(COMMON[n], '')}/")
            continue
        if s.startswith("%"):
            raise ValueError(f"{s.split()[0]} is not supported in a free-form tool's grammar")
        out.append(_rewrite(line, prefix))
    return [x for x in out if x.strip()], _name("start", prefix)


def _name(n: str, prefix: str) -> str:
    return (
        (prefix.upper() + n)
        if n[:1].isupper() or n.startswith("_") and n[1:2].isupper()
        else prefix + n
    )


def _rewrite(line: str, prefix: str) -> str:
    out = []
    for m in _TOKEN.finditer(line):
        kind, tok = m.lastgroup, m.group()
        if kind == "comment":
            continue
        if kind == "string":
            if tok.endswith("i"):
                raise ValueError("case-insensitive literals are not supported")
            out.append(_lark_str(_json_text(ast.literal_eval(tok))))
        elif kind == "regex":
            body, flags = tok[1 : tok.rindex("/")], tok[tok.rindex("/") + 1 :]
            out.append(f"/{_regex_in_json(body.replace(chr(92) + '/', '/'), flags)}/")
        elif kind == "name":
            out.append(_name(tok, prefix))
        elif kind in ("directive", "special"):
            raise ValueError(f"{tok} is not supported in a free-form tool's grammar")
        else:
            out.append(tok)
    return "".join(out)


def _json_text(s: str) -> str:
    """s as it appears inside a JSON string (json.dumps)."""
    return json.dumps(s, ensure_ascii=False)[1:-1]


def _lark_str(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


# ============================================================================ regexes

_ESCAPED = frozenset('"\\') | frozenset(chr(i) for i in range(32))  # what json.dumps escapes
_META = frozenset("\\.+*?()|[]{}^$#&-~/")
_SPACE = " \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"  # \s, unescaped ones
_NOT_ESCAPED = r'"\\\x{0}-\x{1f}'  # in a class: what json.dumps escapes


def _rx_char(c: str) -> str:
    """One character as a regex (outside or inside a class)."""
    if c.isalnum() or (ord(c) > 127 and c.isprintable()):
        return c
    if c in _META or not c.isprintable() or c == " ":
        return f"\\x{{{ord(c):x}}}"
    return c


def _rx_text(s: str) -> str:
    return "".join(_rx_char(c) for c in s)


def _regex_in_json(pattern: str, flags: str) -> str:
    """A regex of texts -> the regex of those texts' JSON escapes."""
    if "i" in flags:
        raise ValueError("case-insensitive regexes are not supported")
    f = (
        (re.S if "s" in flags else 0)
        | (re.X if "x" in flags else 0)
        | (re.M if "m" in flags else 0)
    )
    try:
        parsed = _sp.parse(pattern, f)
    except re.error as e:
        raise ValueError(f"bad regex /{pattern}/: {e}") from None
    if parsed.state.flags & re.I:
        raise ValueError("case-insensitive regexes are not supported")
    return _seq(parsed, parsed.state.flags)


def _seq(items, flags: int) -> str:
    return "".join(_item(op, av, flags) for op, av in items)


def _item(op, av, flags: int) -> str:
    c = _sc
    if op is c.LITERAL:
        return _rx_text(_json_text(chr(av)))
    if op is c.NOT_LITERAL:
        return _class([(c.LITERAL, av)], True)
    if op is c.ANY:
        return (
            _class([], False, everything=True) if flags & re.S else _class([(c.LITERAL, 10)], True)
        )
    if op is c.IN:
        neg = bool(av) and av[0][0] is c.NEGATE
        return _class(av[1:] if neg else av, neg)
    if op is c.CATEGORY:
        return _class([(c.CATEGORY, av)], False)
    if op is c.BRANCH:
        return "(?:" + "|".join(_seq(b, flags) for b in av[1]) + ")"
    if op is c.SUBPATTERN:
        _, add, rm, p = av
        return "(?:" + _seq(p, (flags | add) & ~rm) + ")"
    if op in (c.MAX_REPEAT, c.MIN_REPEAT):
        lo, hi, p = av
        q = {(0, c.MAXREPEAT): "*", (1, c.MAXREPEAT): "+", (0, 1): "?"}.get((lo, hi))
        if q is None:
            q = f"{{{lo},}}" if hi is c.MAXREPEAT else f"{{{lo},{hi}}}"
        return "(?:" + _seq(p, flags) + ")" + q
    if op is c.AT and av in (c.AT_BEGINNING, c.AT_BEGINNING_STRING, c.AT_END, c.AT_END_STRING):
        return ""  # a terminal matches its whole text anyway
    raise ValueError(f"regex feature {op} is not supported in a free-form tool's grammar")


_CATS = {  # category -> (a char predicate, its regex when it holds no escaped character)
    "CATEGORY_DIGIT": (str.isdigit, r"\d"),
    "CATEGORY_NOT_DIGIT": (lambda ch: not ch.isdigit(), None),
    "CATEGORY_WORD": (lambda ch: ch.isalnum() or ch == "_", r"\w"),
    "CATEGORY_NOT_WORD": (lambda ch: not (ch.isalnum() or ch == "_"), None),
    "CATEGORY_SPACE": (str.isspace, _SPACE),
    "CATEGORY_NOT_SPACE": (lambda ch: not ch.isspace(), None),
}


def _class(items, negate: bool, everything: bool = False) -> str:
    """A character class -> (its characters json.dumps leaves as they are) | (the escapes of
    those it does not)."""
    c = _sc

    def holds(ch: str) -> bool:
        if everything:
            return True
        for op, av in items:
            if (
                (op is c.LITERAL and ord(ch) == av)
                or (op is c.RANGE and av[0] <= ord(ch) <= av[1])
                or (op is c.CATEGORY and _CATS[str(av)][0](ch))
            ):
                return not negate
        return negate

    alts = [_rx_text(_json_text(ch)) for ch in sorted(_ESCAPED) if holds(ch)]
    if everything:
        alts.insert(0, f"[^{_NOT_ESCAPED}]")
    elif negate:  # [^...]: none of its items, and none of the escaped characters
        alts.insert(0, "[^" + "".join(_class_items(items, keep_all=True)) + _NOT_ESCAPED + "]")
    else:
        plain = "".join(_class_items(items, keep_all=False))
        if plain:
            alts.insert(0, f"[{plain}]")
        for op, av in items:  # \D \W \S: all but some, the escaped characters apart
            if op is c.CATEGORY and _CATS[str(av)][1] is None:
                inner = {
                    "CATEGORY_NOT_DIGIT": r"\d",
                    "CATEGORY_NOT_WORD": r"\w",
                    "CATEGORY_NOT_SPACE": r"\s",
                }[str(av)]
                alts.insert(0, f"[^{inner}{_NOT_ESCAPED}]")
    if not alts:
        raise ValueError("an empty character class")
    return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"


def _class_items(items, keep_all: bool) -> list[str]:
    """A class's items as regex class syntax; keep_all=False leaves out the characters
    json.dumps escapes (ranges split around them) and the categories that hold some."""
    c = _sc
    out = []
    for op, av in items:
        if op is c.LITERAL:
            if keep_all or chr(av) not in _ESCAPED:
                out.append(_rx_char(chr(av)))
        elif op is c.RANGE:
            lo, hi = av
            if keep_all:
                out.append(f"{_rx_char(chr(lo))}-{_rx_char(chr(hi))}")
                continue
            start = lo
            for x in sorted(ord(ch) for ch in _ESCAPED if lo <= ord(ch) <= hi) + [hi + 1]:
                if start < x:  # start .. x - 1 holds no escaped character
                    a, b = chr(start), chr(x - 1)
                    out.append(_rx_char(a) if a == b else f"{_rx_char(a)}-{_rx_char(b)}")
                start = x + 1
        elif op is c.CATEGORY:
            rx = _CATS[str(av)][1]
            if keep_all:
                out.append(
                    {
                        "CATEGORY_DIGIT": r"\d",
                        "CATEGORY_NOT_DIGIT": r"\D",
                        "CATEGORY_WORD": r"\w",
                        "CATEGORY_NOT_WORD": r"\W",
                        "CATEGORY_SPACE": r"\s",
                        "CATEGORY_NOT_SPACE": r"\S",
                    }[str(av)]
                )
            elif rx is not None:
                out.append(rx)
        else:
            raise ValueError(f"regex class item {op} is not supported")
    return out
