"""JSON Schema -> compiled grammar program, and the public grammar API.

A schema compiles into a flat *program*: a table of nodes (one per distinct
conjunction of subschemas), byte-level DFAs (patterns, formats, enums, property
names, tool names) and exact decimal constraints.  The runtime (``_grammar`` in
Cython, ``reference.grammar`` in pure Python, same semantics) walks the program
byte by byte with a stack of frames.

What is enforced, exactly (never accepting what the schema forbids):

* ``type`` (single or list), ``enum``, ``const``, boolean schemas.
* strings: ``minLength``/``maxLength`` in code points; ``pattern`` (ECMA-262
  search semantics, subset below); ``format`` email, uuid, date, time,
  date-time, ipv4, uri (rules in ``FORMAT_REGEX``: date, uuid and ipv4 are exact,
  the others narrowed -- see ``EXACT_FORMATS``); JSON escapes incl.
  ``\\uXXXX`` surrogate pairs (lone surrogates refused); UTF-8 validated byte by
  byte; control characters refused.
* numbers: JSON number syntax, ``minimum``/``maximum``/``exclusive*`` (draft-4
  boolean and numeric forms), ``multipleOf`` -- compared as exact decimals.
  ``integer`` accepts integer *syntax* only (``1.0`` is refused: exact, not
  complete), with or without ``enum``/``const``.
* arrays: ``items`` (schema or draft-4 list), ``prefixItems``,
  ``additionalItems``, ``minItems``/``maxItems``, ``uniqueItems`` (a duplicate
  item is refused at the byte that completes it; equality is JSON equality,
  computed with a 64-bit canonical hash -- a hash collision can only refuse a
  valid array, never accept an invalid one).
* objects: ``properties``, ``required``, ``additionalProperties``,
  ``patternProperties``, ``propertyNames`` (pattern/enum/const/format),
  ``minProperties``/``maxProperties``; keys in any order, duplicate keys refused.
* ``$ref`` (local: ``#``, ``#/$defs/..``, ``#/definitions/..``, any JSON pointer,
  ``$id``-less anchors are not supported), recursion bounded by the frame stack.
* ``allOf`` (merged statically), ``anyOf`` (parallel threads), ``oneOf``
  (parallel threads; when two alternatives both complete the same value, it is
  refused, though a value can then be refused only at its last byte).  This is
  exact only when each alternative is: an alternative containing a narrowed
  format or a dialect-sensitive pattern (below) is allowed only when no other
  alternative shares a JSON type with it, else ``UnsupportedSchemaError``.
* ``not``: rewritten into positive keywords (De Morgan over keywords; type,
  enum/const, pattern and the exact formats (complemented automata; a narrowed
  format under ``not`` or ``if`` is refused), required, properties,
  bounds, length/count limits, nested not/anyOf/allOf/$ref); any other ``not`` is
  exact when the value set is a finite ``enum``/``const`` (filtered statically),
  else ``UnsupportedSchemaError``.
* ``if``/``then``/``else`` = (if and then) or (not-if and else), with the same
  negation; ``dependencies``/``dependentRequired`` (property lists, checked when
  the object closes) and schema dependencies/``dependentSchemas`` (= property
  absent, or the schema).

Not supported (``UnsupportedSchemaError`` naming keyword and pointer):
``contains``, ``unevaluated*``, dynamic refs, remote refs, ``$id``-based
resources that contain ``$ref``s, ``not`` over ``multipleOf``/``items``/... and
the standard formats not listed above.  Capacities (frames per thread, aux
words, threads, number length) refuse -- never accept -- what does not fit.

Liveness: acceptance is exact, and violations are refused at the earliest
byte.  A number prefix stays alive exactly while some completion (more bytes, then
a delimiter) meets its bounds and ``multipleOf`` within the NUM_BUF-byte number
buffer -- exponents included (``40`` is alive under ``maximum: 30`` as ``40e-1``;
``3e5`` is not); a number that needs more than NUM_BUF bytes is refused.  Bounds
and ``multipleOf`` beyond 10**+-MAX_NUM_EXP raise ``GrammarLimitError``.

Regex dialect: ECMA-262 with the ``u`` flag (code points) and Python ``re``
(what ``jsonschema`` runs) together.  Where they read a construct differently --
``.`` (ECMA excludes \\r, U+2028, U+2029), ``\\d \\w \\s`` and their complements
(Python's are Unicode), ``$`` (Python also matches before a final newline) -- a
pattern that must hold accepts only what both engines match, and a complemented
one (``not``) refuses what either engine matches; a ``patternProperties`` key the
engines disagree on is refused.  Python's Unicode ``\\d``/``\\w`` are widened in
the complemented direction (to every code point from their first non-ASCII
member), which only refuses more.  ``{,n}`` and a class starting with ``]`` (the
engines disagree) are refused.

Compiler keywords (``__ptr``, ``__not_pattern``, ``__not_strings``,
``__not_format``) exist only in the compiler's own synthetic schemas: in a user
schema they are unknown keywords, i.e. annotations.  Count bounds (lengths,
items, properties) are int32 at run time: a maximum above 2**31-2 is read as
2**31-2, a minimum above it makes the type impossible.  A malformed keyword value
(``"required": [1]``, ``"prefixItems": 5``, ``"$schema": 5``...) is a ``SchemaError``
naming keyword and pointer.

Regex subset (``pattern``, ``patternProperties``): literals, ``.``, classes
``[...]``/``[^...]`` with ranges, ``\\d \\w \\s \\D \\W \\S`` (the intersection of
the ECMA-262 and Python meanings, so both engines agree with what we accept),
escapes ``\\n \\t \\r \\f \\v \\0 \\xHH \\uHHHH``, groups ``(..)``, ``(?:..)``,
named groups, alternation, quantifiers ``* + ? {n} {n,} {n,m}`` (lazy forms
too), ``^`` only at the start and ``$`` only at the end of the pattern or of a
top-level alternative.  Anything else (look-around, back-references, ``\\b``,
``\\p{..}``, inline flags) raises ``UnsupportedSchemaError``.
"""
from __future__ import annotations

import json
import math
import re
import time
import unicodedata

import numpy as np
from fractions import Fraction
from urllib.parse import unquote

from ..errors import GrammarLimitError, SchemaError, UnsupportedSchemaError

# ----------------------------------------------------------------------------
# capacities (shared with the runtimes; the .pxd repeats them)
MAX_DEPTH = 40          # frames per thread
MAX_AUX = 160           # uint64 words per thread (seen-key bitsets, hashes)
MAX_SLOTS = 32          # threads (parallel anyOf/oneOf alternatives) alive within one byte
NUM_BUF = 40            # bytes of one number's text
MAX_NUM_EXP = 10 ** 6   # orders of magnitude of bounds/multipleOf (number liveness saturates past them)
MAX_EVENTS = 8          # oneOf completions one thread may record within one byte
MAX_DFA_STATES = 20000  # per compiled DFA
MAX_TOOLS = 64
MAX_NODES = 2000        # compiled nodes per schema
COMPILE_BUDGET_S = 10.0 # wall-clock safety valve for pathological schemas

# type bits
T_NULL, T_TRUE, T_FALSE, T_INT, T_NUM, T_STR, T_ARR, T_OBJ = 1, 2, 4, 8, 16, 32, 64, 128
T_BOOL = T_TRUE | T_FALSE
T_ALL = 255
TYPE_BITS = {"null": T_NULL, "boolean": T_BOOL, "integer": T_INT, "number": T_INT | T_NUM,
             "string": T_STR, "array": T_ARR, "object": T_OBJ}

NODE_VALUE, NODE_CHOICE = 0, 1
# first-byte classes of a value (for skipping alternatives that cannot start with a byte)
S_STR, S_NUM, S_TRUE, S_FALSE, S_NULL, S_ARR, S_OBJ = 1, 2, 4, 8, 16, 32, 64


def start_bit(b):
    if b == 0x22:
        return S_STR
    if b == 0x2D or 0x30 <= b <= 0x39:
        return S_NUM
    return {0x74: S_TRUE, 0x66: S_FALSE, 0x6E: S_NULL, 0x5B: S_ARR, 0x7B: S_OBJ}.get(b, 0)


def _type_starts(types):
    s = 0
    if types & T_STR:
        s |= S_STR
    if types & (T_INT | T_NUM):
        s |= S_NUM
    if types & T_TRUE:
        s |= S_TRUE
    if types & T_FALSE:
        s |= S_FALSE
    if types & T_NULL:
        s |= S_NULL
    if types & T_ARR:
        s |= S_ARR
    if types & T_OBJ:
        s |= S_OBJ
    return s
ANY_NODE, NEVER_NODE = 0, 1

# keywords
ANNOTATIONS = {
    "title", "description", "examples", "example", "default", "$comment", "$schema", "$id", "id",
    "readOnly", "writeOnly", "deprecated", "$anchor", "$vocabulary", "contentMediaType",
    "contentEncoding", "contentSchema", "definitions", "$defs", "markdownDescription",
}
# INTERNAL keywords are made by the compiler (`not`, `if`, dependencies) in its synthetic
# schemas only; in a user schema they are unknown keywords -- annotations, stripped by
# Compiler.get -- so a user schema can never reach them.
INTERNAL = frozenset({"__ptr", "__not_pattern", "__not_strings", "__not_format"})
SUPPORTED = {
    "type", "enum", "const", "minLength", "maxLength", "pattern", "format", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "items", "prefixItems", "additionalItems",
    "minItems", "maxItems", "uniqueItems", "properties", "required", "additionalProperties",
    "patternProperties", "propertyNames", "minProperties", "maxProperties", "$ref", "allOf",
    "dependencies", "dependentRequired", "dependentSchemas", "if", "then", "else",
    "anyOf", "oneOf", "not",
} | INTERNAL
# counts (lengths, items, properties) are int32 at run time: a maximum above COUNT_CAP is read
# as COUNT_CAP (nothing longer can be read anyway) and a minimum above it makes the type
# impossible -- refusing, never accepting, what the schema forbids
COUNT_CAP = 2 ** 31 - 2
KNOWN_UNSUPPORTED = {
    "contains",
    "minContains", "maxContains", "unevaluatedProperties", "unevaluatedItems", "$dynamicRef",
    "$recursiveRef", "$dynamicAnchor", "$recursiveAnchor", "disallow", "extends", "divisibleBy",
}
ENFORCED_FORMATS = {"email", "uuid", "date", "time", "date-time", "ipv4", "uri"}
# Formats whose automaton is exactly the format (``FORMAT_REGEX`` documents each rule): their
# complement is exact too.  The others are narrowed -- they refuse some valid values (leap
# seconds, more than 9 fraction digits, quoted or IP-literal emails, and a uri rule that is
# only character-level) -- so a `not`, an `if` or an overlapping `oneOf` over them is refused:
# a narrowed complement would accept values the format allows.
EXACT_FORMATS = {"date", "uuid", "ipv4"}
NARROWED_FORMATS = ENFORCED_FORMATS - EXACT_FORMATS
UNENFORCED_STANDARD_FORMATS = {
    "ipv6", "hostname", "idn-hostname", "idn-email", "iri", "iri-reference", "uri-reference",
    "uri-template", "json-pointer", "relative-json-pointer", "regex", "duration",
}

# ============================================================================
# exact decimals: value = (-1)**neg * int(digits) * 10**exp, digits without
# leading/trailing zeros ("" for zero, then neg is False and exp 0)


def norm_decimal(x):
    """Normalise a JSON number (text or Python number) to (neg, digits, exp)."""
    if isinstance(x, bool):
        raise SchemaError(f"expected a number, found {x!r}")
    if isinstance(x, int):
        text = str(x)
    elif isinstance(x, float):
        if not math.isfinite(x):
            raise SchemaError(f"non-finite number {x!r}")
        text = repr(x)
    else:
        text = x
    m = re.fullmatch(r"(-?)(\d+)(?:\.(\d+))?(?:[eE]([+-]?\d+))?", text)
    if not m:
        raise SchemaError(f"not a number: {text!r}")
    neg = m.group(1) == "-"
    ip, fp, ex = m.group(2), m.group(3) or "", int(m.group(4) or 0)
    digits = (ip + fp).lstrip("0")
    exp = ex - len(fp)
    if not digits:
        return (False, "", 0)
    stripped = digits.rstrip("0")
    exp += len(digits) - len(stripped)
    return (neg, stripped, exp)


def dec_to_fraction(d):
    neg, digits, exp = d
    v = Fraction(int(digits or "0")) * (Fraction(10) ** exp)
    return -v if neg else v


def dec_cmp(a, b):
    fa, fb = dec_to_fraction(a), dec_to_fraction(b)
    return (fa > fb) - (fa < fb)


# ============================================================================
# character sets (sorted disjoint inclusive code point ranges, no surrogates)

MAX_CP = 0x10FFFF


def cs_norm(ranges):
    out = []
    for lo, hi in sorted(ranges):
        if lo > hi:
            continue
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    # drop surrogates
    res = []
    for lo, hi in out:
        if hi < 0xD800 or lo > 0xDFFF:
            res.append((lo, hi))
        else:
            if lo < 0xD800:
                res.append((lo, 0xD7FF))
            if hi > 0xDFFF:
                res.append((0xE000, hi))
    return res


def cs_complement(ranges):
    res, prev = [], 0
    for lo, hi in cs_norm(ranges):
        if lo > prev:
            res.append((prev, lo - 1))
        prev = hi + 1
    if prev <= MAX_CP:
        res.append((prev, MAX_CP))
    return cs_norm(res)


_ALL_CHARS = None


def cs_from_re(cls):
    """Ranges of the code points Python's re matches with a class such as r"\\d"."""
    global _ALL_CHARS
    if _ALL_CHARS is None:
        _ALL_CHARS = "".join(map(chr, range(0xD800))) + "".join(map(chr, range(0xE000, MAX_CP + 1)))
    res = []
    for m in re.finditer(cls + "+", _ALL_CHARS):
        lo, hi = m.start(), m.end() - 1
        # positions past the surrogate gap are shifted by 0x800
        lo = lo if lo < 0xD800 else lo + 0x800
        hi = hi if hi < 0xD800 else hi + 0x800
        res.append((lo, hi))
    return res


_CLASS_CACHE = {}
_PY_CLASSES = {}
_WIDE_FROM = {"d": 0x0660, "w": 0x00AA}   # first non-ASCII code point of Python's \d / \w


def _py_class(letter):
    if letter not in _PY_CLASSES:
        _PY_CLASSES[letter] = cs_norm(cs_from_re("\\" + letter))
    return _PY_CLASSES[letter]

ECMA_SPACE = [(9, 13), (32, 32), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A), (0x2028, 0x2029),
              (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF)]


def class_ranges(letter, mode="both"):
    """\\d \\w \\s and complements in one of the two dialect modes (see ``regex_dfa``):
    "both" = the code points both ECMA-262 and Python ``re`` match (the intersection),
    "either" = the code points at least one of them matches (the union)."""
    key = (letter, mode)
    if key in _CLASS_CACHE:
        return _CLASS_CACHE[key]
    ecma = {"d": [(48, 57)], "w": [(48, 57), (65, 90), (95, 95), (97, 122)], "s": ECMA_SPACE}
    low = letter.lower()
    if low not in ecma:
        raise KeyError(letter)
    ec = cs_norm(ecma[low])
    if letter in "dw" and mode == "both":
        # Python's \d and \w contain ECMA's ASCII ones: the intersection is ECMA's
        _CLASS_CACHE[key] = ec
        return ec
    if low in _WIDE_FROM:
        inter = ec   # Python's \d and \w contain ECMA's ASCII ones
        # Python's Unicode \d and \w have tens to hundreds of ranges (slow automata): their
        # union with ECMA's is widened to "ECMA's ASCII set, or any code point from the first
        # non-ASCII member on" -- a superset, so the complements taken from it (\D, \W,
        # [^\d], `not`) stay on the refusing side
        union = cs_norm(ec + [(_WIDE_FROM[low], MAX_CP)])
    else:
        py = _py_class(low)
        inter = cs_norm([(max(lo, a), min(hi, b)) for lo, hi in ec for a, b in py if max(lo, a) <= min(hi, b)])
        union = cs_norm(ec + py)
    if letter == low:
        r = inter if mode == "both" else union
    else:  # \D \W \S: not a digit (word, space) for both engines / for either engine
        r = cs_complement(union) if mode == "both" else cs_complement(inter)
    r = cs_norm(r)
    _CLASS_CACHE[key] = r
    return r


DOT_RANGES = cs_complement([(10, 10), (13, 13), (0x2028, 0x2029)])   # ECMA-262 '.': both engines
DOT_EITHER = cs_complement([(10, 10)])                                 # Python '.': either engine


# ============================================================================
# regex subset parser -> AST
# AST: ("set", ranges) | ("cat", [..]) | ("alt", [..]) | ("rep", node, lo, hi|None)
#      | ("eps",)


class _RegexUnsupported(Exception):
    pass


class _RegexParser:
    """Parses a pattern in one dialect mode ("both" or "either", see ``regex_dfa``);
    ``sensitive`` is set when a construct the two engines read differently was met
    (``.``, ``\\d \\w \\s`` and their complements); ``dollar`` when a ``$`` was met
    (Python also matches it before a final newline: the engines then disagree only on
    strings that end in a newline, see ``Compiler.check_oneof``)."""

    def __init__(self, text, mode="both"):
        self.s = text
        self.i = 0
        self.mode = mode
        self.sensitive = False
        self.dollar = False

    def error(self, what):
        raise _RegexUnsupported(f"{what} at offset {self.i} in pattern {self.s!r}")

    def peek(self):
        return self.s[self.i] if self.i < len(self.s) else None

    def parse_top(self):
        """Returns a list of (anchored_start, ast, anchored_end) top-level alternatives."""
        alts = []
        while True:
            start = False
            if self.peek() == "^":
                self.i += 1
                start = True
            items = self.parse_seq(top=True)
            end = False
            if self.peek() == "$":
                self.i += 1
                end = True
                self.dollar = True   # Python's '$' also matches before a final newline
            alts.append((start, ("cat", items), end))
            if self.peek() == "|":
                self.i += 1
                continue
            if self.peek() is None:
                return alts
            self.error(f"unexpected {self.peek()!r}")

    def parse_alt(self):
        alts = [("cat", self.parse_seq())]
        while self.peek() == "|":
            self.i += 1
            alts.append(("cat", self.parse_seq()))
        return alts[0] if len(alts) == 1 else ("alt", alts)

    def parse_seq(self, top=False):
        items = []
        while True:
            c = self.peek()
            if c is None or c == "|" or c == ")":
                return items
            if c == "$":
                if top and (self.i + 1 == len(self.s) or self.s[self.i + 1] == "|"):
                    return items
                self.error("'$' not at the end")
            if c == "^":
                self.error("'^' not at the start")
            atom = self.parse_atom()
            atom = self.parse_quant(atom)
            items.append(atom)

    def parse_quant(self, atom):
        while True:
            c = self.peek()
            if c in ("*", "+", "?"):
                self.i += 1
                lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
            elif c == "{":
                m = re.match(r"\{(\d+)(,(\d*))?\}", self.s[self.i:])
                if not m:
                    if re.match(r"\{,\d*\}", self.s[self.i:]):
                        # Python reads {,n} as {0,n}, ECMA-262 as the literal text
                        self.error("'{,n}' repetition (the engines disagree)")
                    return atom  # a literal '{' (ECMA annex B); handled by caller next round
                self.i += m.end()
                lo = int(m.group(1))
                hi = lo if m.group(2) is None else (int(m.group(3)) if m.group(3) else None)
                if hi is not None and hi < lo:
                    self.error("bad repetition bounds")
                if lo > 1000 or (hi or 0) > 1000:
                    raise GrammarLimitError(f"repetition count over 1000 in pattern {self.s!r}")
            else:
                return atom
            if self.peek() == "?":
                self.i += 1  # lazy: same language
            if self.peek() == "+":
                self.error("possessive quantifier")
            atom = ("rep", atom, lo, hi)

    def parse_atom(self):
        c = self.peek()
        if c == "(":
            self.i += 1
            if self.s.startswith("?:", self.i):
                self.i += 2
            elif self.s.startswith("?<", self.i) and not self.s.startswith("?<=", self.i) \
                    and not self.s.startswith("?<!", self.i):
                j = self.s.find(">", self.i)
                if j < 0:
                    self.error("bad group name")
                self.i = j + 1
            elif self.s.startswith("?P<", self.i):
                j = self.s.find(">", self.i)
                self.i = j + 1
            elif self.peek() == "?":
                self.error("look-around or inline flag group")
            node = self.parse_alt()
            if self.peek() != ")":
                self.error("missing ')'")
            self.i += 1
            return node
        if c == "[":
            return ("set", self.parse_class())
        if c == ".":
            self.i += 1
            self.sensitive = True
            return ("set", DOT_RANGES if self.mode == "both" else DOT_EITHER)
        if c == "\\":
            return ("set", self.parse_escape(in_class=False, mode=self.mode))
        if c in "*+?":
            self.error("nothing to repeat")
        if c == "{":
            m = re.match(r"\{(\d+)(,(\d*))?\}", self.s[self.i:])
            if m:
                self.error("nothing to repeat")
        self.i += 1
        return ("set", [(ord(c), ord(c))])

    def parse_escape(self, in_class, mode):
        self.i += 1
        c = self.peek()
        if c is None:
            self.error("trailing backslash")
        self.i += 1
        if c in "dwsDWS":
            self.sensitive = True
            return class_ranges(c, mode)
        simple = {"n": 10, "t": 9, "r": 13, "f": 12, "v": 11}
        if c in simple:
            return [(simple[c], simple[c])]
        if c == "0" and not (self.peek() or "").isdigit():
            return [(0, 0)]
        if c == "x":
            h = self.s[self.i:self.i + 2]
            if not re.fullmatch(r"[0-9a-fA-F]{2}", h):
                self.error("bad \\x escape")
            self.i += 2
            return [(int(h, 16), int(h, 16))]
        if c == "u":
            h = self.s[self.i:self.i + 4]
            if not re.fullmatch(r"[0-9a-fA-F]{4}", h):
                self.error("bad \\u escape")
            self.i += 4
            cp = int(h, 16)
            if 0xD800 <= cp <= 0xDFFF:
                self.error("surrogate escape")
            return [(cp, cp)]
        if c == "b" and in_class:
            return [(8, 8)]
        if c.isalnum():
            self.error(f"unsupported escape \\{c}")
        return [(ord(c), ord(c))]

    def parse_class(self):
        self.i += 1
        neg = False
        if self.peek() == "^":
            neg = True
            self.i += 1
        # the members of a negated class are read in the other mode: a code point is outside
        # [^\d] for both engines when it is a digit for either of them
        mode = self.mode if not neg else ("either" if self.mode == "both" else "both")
        ranges = []
        first = True
        while True:
            c = self.peek()
            if c is None:
                self.error("missing ']'")
            if c == "]" and first:
                # ECMA-262: [] matches nothing and [^] anything; Python: a literal ']'
                self.error("']' first in a class (the engines disagree)")
            if c == "]" and not first:
                self.i += 1
                break
            if c == "[" and self.s.startswith("[:", self.i):
                self.error("POSIX class")
            first = False
            if c == "\\":
                lo_set = self.parse_escape(in_class=True, mode=mode)
            else:
                self.i += 1
                lo_set = [(ord(c), ord(c))]
            if self.peek() == "-" and self.i + 1 < len(self.s) and self.s[self.i + 1] != "]":
                if len(lo_set) != 1 or lo_set[0][0] != lo_set[0][1]:
                    self.error("range from a class escape")
                self.i += 1
                c2 = self.peek()
                if c2 == "\\":
                    hi_set = self.parse_escape(in_class=True, mode=mode)
                else:
                    self.i += 1
                    hi_set = [(ord(c2), ord(c2))]
                if len(hi_set) != 1 or hi_set[0][0] != hi_set[0][1]:
                    self.error("range to a class escape")
                if hi_set[0][0] < lo_set[0][0]:
                    self.error("reversed range")
                ranges.append((lo_set[0][0], hi_set[0][0]))
            else:
                ranges.extend(lo_set)
        ranges = cs_norm(ranges)
        return cs_complement(ranges) if neg else ranges


# ============================================================================
# NFA over bytes, then DFA

def _utf8_enc(cp):
    return list(chr(cp).encode("utf-8"))


def utf8_sequences(lo, hi):
    """Split a code point range into lists of byte ranges, one list per UTF-8 shape."""
    out = []
    for a, b in ((0, 0x7F), (0x80, 0x7FF), (0x800, 0xFFFF), (0x10000, 0x10FFFF)):
        l, h = max(lo, a), min(hi, b)
        if l <= h:
            _utf8_split(l, h, out)
    return out


def _utf8_split(lo, hi, out):
    if lo > hi:
        return
    if lo <= 0xDFFF and hi >= 0xD800:
        _utf8_split(lo, 0xD7FF, out)
        _utf8_split(0xE000, hi, out)
        return
    n = len(_utf8_enc(lo))
    for i in range(1, n):
        m = (1 << (6 * i)) - 1
        if (lo & ~m) != (hi & ~m):
            if (lo & m) != 0:
                _utf8_split(lo, lo | m, out)
                _utf8_split((lo | m) + 1, hi, out)
                return
            if (hi & m) != m:
                _utf8_split(lo, (hi & ~m) - 1, out)
                _utf8_split(hi & ~m, hi, out)
                return
    a, b = _utf8_enc(lo), _utf8_enc(hi)
    out.append(list(zip(a, b)))


class NFA:
    def __init__(self):
        self.eps = []     # state -> list of states
        self.edges = []   # state -> list of (lo, hi, target)

    def new(self):
        self.eps.append([])
        self.edges.append([])
        return len(self.eps) - 1

    def add_set(self, s, ranges, t):
        for lo, hi in ranges:
            for seq in utf8_sequences(lo, hi):
                cur = s
                for k, (a, b) in enumerate(seq):
                    nxt = t if k == len(seq) - 1 else self.new()
                    self.edges[cur].append((a, b, nxt))
                    cur = nxt

    def build(self, ast, s, t):
        kind = ast[0]
        if kind == "set":
            self.add_set(s, ast[1], t)
        elif kind == "eps":
            self.eps[s].append(t)
        elif kind == "cat":
            cur = s
            for item in ast[1]:
                nxt = self.new()
                self.build(item, cur, nxt)
                cur = nxt
            self.eps[cur].append(t)
        elif kind == "alt":
            for item in ast[1]:
                self.build(item, s, t)
        elif kind == "rep":
            _, sub, lo, hi = ast
            if len(self.eps) > 200000:
                raise GrammarLimitError("pattern automaton too large")
            cur = s
            for _ in range(lo):
                nxt = self.new()
                self.build(sub, cur, nxt)
                cur = nxt
            if hi is None:
                loop = self.new()
                self.eps[cur].append(loop)
                body_end = self.new()
                self.build(sub, loop, body_end)
                self.eps[body_end].append(loop)
                self.eps[loop].append(t)
            else:
                self.eps[cur].append(t)
                for _ in range(hi - lo):
                    nxt = self.new()
                    self.build(sub, cur, nxt)
                    self.eps[nxt].append(t)
                    cur = nxt
        elif kind == "bytes_any":  # any byte sequence (UTF-8 validity is the frame's job)
            loop = self.new()
            self.eps[s].append(loop)
            self.edges[loop].append((0, 255, loop))
            self.eps[loop].append(t)
        else:
            raise AssertionError(kind)

    def closure(self, states):
        stack = list(states)
        seen = set(states)
        while stack:
            x = stack.pop()
            for y in self.eps[x]:
                if y not in seen:
                    seen.add(y)
                    stack.append(y)
        return frozenset(seen)


class DFA:
    """A byte DFA: trans[state, byte] -> state or -1; accept[state] is a label (-1 = reject).

    Built either from a 256-wide ``trans`` table or from its byte-class form ``cls`` =
    (class map uint8[256], table int32[n, k]) with trans[s, b] == table[s, cmap[b]]; the
    other form is derived on first use (``_compress``, ``trans``).  Programs store the class
    form (Program.add_dfa); the runtime tables refine all of a program's class maps into
    one.  ``trim``: every state is reachable from 0 and can reach an accepting state
    (pruning is a no-op).  DFAs are never modified once built.
    """

    def __init__(self, trans, accept, trim=False, cls=None):
        self._trans = None if trans is None else np.asarray(trans, dtype=np.int32).reshape(-1, 256)
        self.accept = np.asarray(accept, dtype=np.int32).reshape(-1)
        self.trim = trim
        self._cls = cls

    @property
    def trans(self):
        if self._trans is None:
            cmap, table = self._cls
            self._trans = np.ascontiguousarray(table[:, cmap])
        return self._trans

    @property
    def n(self):
        return len(self.accept)

    def run(self, data, state=0):
        for b in data:
            if state < 0:
                return -1
            state = int(self.trans[state, b])
        return state

    def relabel(self, accept, trim=None):
        """Same transitions, new labels (the tables are shared)."""
        d = DFA(None, accept, self.trim if trim is None else trim, _compress(self))
        d._trans = self._trans
        return d


_COL_WEIGHTS = np.zeros(0, np.int64)


def _col_weights(n):
    """n fixed pseudo-random odd 64-bit weights for column hashes (splitmix64 of 1..n; not
    np.random, whose first use imports 20 ms of modules)."""
    global _COL_WEIGHTS
    if len(_COL_WEIGHTS) < n:
        m = max(n, 2 * len(_COL_WEIGHTS), 64)
        with np.errstate(over="ignore"):
            x = np.arange(1, m + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
            x ^= x >> np.uint64(30)
            x *= np.uint64(0xBF58476D1CE4E5B9)
            x ^= x >> np.uint64(27)
            x *= np.uint64(0x94D049BB133111EB)
            x ^= x >> np.uint64(31)
        _COL_WEIGHTS = (x >> np.uint64(2)).astype(np.int64) | 1
    return _COL_WEIGHTS[:n]


def _compress(d):
    """Byte classes of a DFA: (class map uint8[256], table int32[n, k]) with
    trans[s, b] == table[s, cmap[b]].  Columns are grouped by a random 64-bit hash and the
    grouping is then verified exactly (a collision falls back to an exact sort)."""
    if d._cls is not None:
        return d._cls
    tr = d.trans
    n = tr.shape[0]
    with np.errstate(over="ignore"):
        h = _col_weights(n) @ (tr.astype(np.int64) + 2)    # [256] column hashes (wrapping)
    _, first, inv = np.unique(h, return_index=True, return_inverse=True)
    inv = inv.reshape(-1)
    table = tr[:, first]
    if not np.array_equal(table[:, inv], tr):
        _, first, inv = np.unique(tr.T, axis=0, return_index=True, return_inverse=True)
        inv = inv.reshape(-1)
        table = tr[:, first]
    d._cls = (inv.astype(np.uint8), np.ascontiguousarray(table, dtype=np.int32))
    return d._cls


def _program_classes(classes):
    """The program-wide byte classes: bytes no automaton tells apart (columns of the stacked
    per-automaton class maps, grouped by hash and verified exactly).  Returns
    (byte_class uint8[256], first byte of each class int64[k])."""
    maps = classes.reshape(-1, 256)
    if len(maps) == 0:
        return np.zeros(256, np.uint8), np.zeros(1, np.int64)
    if len(maps) == 1:   # one automaton: its own (dense) classes
        m = maps[0]
        order = np.argsort(m, kind="stable")
        first = order[np.searchsorted(m[order], np.arange(int(m.max()) + 1))]
        return m.astype(np.uint8), first.astype(np.int64)
    if len(maps) <= 8:   # a few automata: exact mixed-radix keys (renumbered before 2**62)
        key = np.zeros(256, np.int64)
        bound = 1
        for m in maps:
            k = int(m.max()) + 1
            if bound * k >= 2 ** 62:
                _, key = np.unique(key, return_inverse=True)
                key = key.reshape(-1).astype(np.int64)
                bound = int(key.max()) + 1
            key = key * k + m
            bound *= k
        _, first, inv = np.unique(key, return_index=True, return_inverse=True)
        return inv.reshape(-1).astype(np.uint8), first.astype(np.int64)
    m64 = maps.astype(np.int64)
    with np.errstate(over="ignore"):
        h = _col_weights(len(maps)) @ (m64 + 1)
    _, first, inv = np.unique(h, return_index=True, return_inverse=True)
    inv = inv.reshape(-1)
    if not np.array_equal(m64[:, first][:, inv], m64):
        _, first, inv = np.unique(m64.T, axis=0, return_index=True, return_inverse=True)
        inv = inv.reshape(-1)
    return inv.astype(np.uint8), first.astype(np.int64)


def _state_major(classes, row, cmap, trans, first):
    """Per-automaton class tables -> the [states x program classes] table (see
    Program.runtime_tables; the C runtime builds the same table in C)."""
    if len(row) == 0:
        return np.zeros(0, np.int32)
    # state s, program class g: its automaton's class of g's first byte
    local = classes[cmap[:, None] + first[None, :]]
    return np.ascontiguousarray(trans[row[:, None] + local], dtype=np.int32).reshape(-1)


def _dead_dfa():
    return DFA(np.full((1, 256), -1, np.int32), [-1])


def _all_dfa():
    return DFA(np.zeros((1, 256), np.int32), [0], trim=True)


def nfa_to_dfa(nfa, start, final):
    """Subset construction over byte equivalence classes."""
    bounds = {0, 256}
    for edges in nfa.edges:
        for lo, hi, _ in edges:
            bounds.add(lo)
            bounds.add(hi + 1)
    bounds = sorted(bounds)
    reps = bounds[:-1]
    class_of = np.zeros(256, dtype=np.int64)
    for ci in range(len(reps)):
        class_of[bounds[ci]:bounds[ci + 1]] = ci
    start_set = nfa.closure([start])
    index = {start_set: 0}
    sets = [start_set]
    rows, accept = [], []
    i = 0
    while i < len(sets):
        cur = sets[i]
        i += 1
        crow = np.full(len(reps), -1, dtype=np.int32)
        targets = [set() for _ in reps]
        for x in cur:
            for lo, hi, t in nfa.edges[x]:
                for ci, r in enumerate(reps):
                    if lo <= r <= hi:
                        targets[ci].add(t)
        memo = {}
        for ci, tg in enumerate(targets):
            if not tg:
                continue
            key = frozenset(tg)
            if key not in memo:
                memo[key] = nfa.closure(tg)
            tset = memo[key]
            if tset not in index:
                if len(sets) >= MAX_DFA_STATES:
                    raise GrammarLimitError(f"automaton exceeds {MAX_DFA_STATES} states")
                index[tset] = len(sets)
                sets.append(tset)
            crow[ci] = index[tset]
        rows.append(crow)
        accept.append(0 if final in cur else -1)
    return prune_dfa(DFA(None, accept, cls=(class_of.astype(np.uint8), np.stack(rows))))


def _edges(d):
    """Distinct (source, target) state pairs, as two int64 arrays sorted by source (read from
    the byte-class table: k columns per state instead of 256)."""
    table = _compress(d)[1]
    n = d.n
    src, c = np.nonzero(table >= 0)
    dst = table[src, c]
    pairs = np.sort(src.astype(np.int64) * n + dst)
    # distinct pairs (np.unique would do, but its first call imports numpy.ma: 30 ms cold)
    pairs = pairs[np.concatenate(([True], pairs[1:] != pairs[:-1]))] if len(pairs) else pairs
    return pairs // n, pairs % n


def _successors(d):
    """Per state: sorted distinct successor states."""
    src, dst = _edges(d)
    succ = [[] for _ in range(d.n)]
    for s_, t_ in zip(src.tolist(), dst.tolist()):
        succ[s_].append(t_)
    return succ


def _live_states(d):
    """Boolean array: states from which an accepting state is reachable."""
    n = d.n
    src, dst = _edges(d)
    order = np.argsort(dst, kind="stable")
    src, dst = src[order], dst[order]
    starts = np.searchsorted(dst, np.arange(n + 1))
    live = d.accept >= 0
    stack = list(np.nonzero(live)[0])
    while stack:
        x = stack.pop()
        for y in src[starts[x]:starts[x + 1]]:
            if not live[y]:
                live[y] = True
                stack.append(int(y))
    return live


def _restrict(d, live):
    """Keep live states reachable from 0 (BFS order, 0 first); others become -1."""
    if not live[0]:
        return _dead_dfa()
    n = d.n
    if live.all() and n == 1:
        return d.relabel(d.accept, trim=True)
    succ = _successors(d)
    live_l = live.tolist()
    idx = np.full(n, -1, dtype=np.int64)
    seen = [False] * n
    seen[0] = True
    order = [0]
    k = 0
    while k < len(order):
        s = order[k]
        k += 1
        for t in succ[s]:
            if live_l[t] and not seen[t]:
                seen[t] = True
                order.append(t)
    idx[order] = np.arange(len(order))
    idx_ext = np.append(idx, -1)  # index -1 -> -1
    cmap, table = _compress(d)
    tr = table[order]
    tr = np.where(tr >= 0, idx_ext[tr], -1).astype(np.int32)
    return DFA(None, d.accept[order], trim=True, cls=(cmap, tr))


def prune_dfa(d):
    """Remove states from which no accepting state is reachable (no minimisation: subset
    construction of these small patterns is already near minimal, and Moore refinement
    costs more than it saves at compile time)."""
    if d.trim:
        return d
    return _restrict(d, _live_states(d))


def _has_ref(node):
    if isinstance(node, dict):
        return "$ref" in node or any(_has_ref(v) for k, v in node.items() if k not in ("enum", "const"))
    if isinstance(node, list):
        return any(_has_ref(v) for v in node)
    return False


def prune_dfa_keep(d):
    """Like prune_dfa without minimisation (labels are class ids)."""
    if d.trim:
        return d
    return _restrict(d, _live_states(d))


def minimize_dfa(d):
    """Moore partition refinement (distinct labels stay distinct)."""
    n = d.n
    _, cls = np.unique(d.accept, return_inverse=True)
    cls = cls.reshape(-1).astype(np.int64)
    k = cls.max() + 1 if n else 0
    while True:
        cls_ext = np.append(cls, -1)
        sig = np.concatenate([cls[:, None], cls_ext[d.trans]], axis=1)
        _, new = np.unique(sig, axis=0, return_inverse=True)
        new = new.reshape(-1)
        k2 = new.max() + 1
        cls = new.astype(np.int64)
        if k2 == k:
            break
        k = k2
    # representatives, class of state 0 first (BFS)
    rep = {}
    for s in range(n):
        rep.setdefault(int(cls[s]), s)
    cls_ext = np.append(cls, -1)
    succ = _successors(d)
    cls_l = cls.tolist()
    idx = {cls_l[0]: 0}
    order = [cls_l[0]]
    j = 0
    while j < len(order):
        c = order[j]
        j += 1
        for t in succ[rep[c]]:
            if cls_l[t] not in idx:
                idx[cls_l[t]] = len(order)
                order.append(cls_l[t])
    remap = np.full(k + 1, -1, dtype=np.int64)
    for c, i2 in idx.items():
        remap[c] = i2
    reps = [rep[c] for c in order]
    tr = d.trans[reps]
    tr = np.where(tr >= 0, remap[cls_ext[tr]], -1).astype(np.int32)
    return DFA(tr, d.accept[reps])


def regex_dfa(pattern, pointer="#", mode="both"):
    """Compile a pattern (search semantics) to a byte DFA over UTF-8.

    The dialect is the common ground of ECMA-262 with the ``u`` flag (code points) and
    Python ``re`` (what ``jsonschema`` runs).  Where the two read a construct differently
    (``.``, ``\\d \\w \\s`` and complements, ``$`` before a final newline), ``mode="both"``
    accepts only what both engines match -- used for a pattern that must hold -- and
    ``mode="either"`` what at least one matches -- used for a pattern whose complement is
    taken (``not``), so the complement holds under both engines too."""
    return _regex(pattern, pointer, mode)[0]


def regex_sensitive(pattern, pointer="#"):
    """Whether the two engines read some construct of the pattern differently: 0 no,
    1 only ``$`` (they disagree only on strings ending in a newline: 'both' mode refuses
    what only Python matches, 'either' mode is Python's reading exactly), 2 otherwise."""
    return _regex(pattern, pointer, "both")[1]


def _regex(pattern, pointer, mode):
    parser = _RegexParser(pattern, mode)
    try:
        alts = parser.parse_top()
    except _RegexUnsupported as exc:
        raise UnsupportedSchemaError(f"unsupported regex: {exc} (at {pointer})",
                                     keyword="pattern", pointer=pointer) from None
    except RecursionError:
        raise GrammarLimitError(f"pattern nesting too deep at {pointer}") from None
    nfa = NFA()
    s, t = nfa.new(), nfa.new()
    for anchored_start, ast, anchored_end in alts:
        items = []
        if not anchored_start:
            items.append(("bytes_any",))
        items.append(ast)
        if not anchored_end:
            items.append(("bytes_any",))
        elif mode == "either":
            items.append(("rep", ("set", [(10, 10)]), 0, 1))   # Python: '$' before a final \n
        nfa.build(("cat", items), s, t)
    return nfa_to_dfa(nfa, s, t), (2 if parser.sensitive else 1 if parser.dollar else 0)


_LITERAL_DFAS = {}
_NL_END_DFA = None   # the strings that do not end in a newline


def literal_dfa(strings, labels=None, other_label=None):
    """A trie DFA accepting exactly the given byte strings; accept label = labels[i] (default 0).

    other_label: when given, every string outside the trie reaches a sink state labelled so.
    Memoised per process by its arguments (enums and key sets recur across tools; DFAs are
    never modified once built).
    """
    key = (tuple(strings), None if labels is None else tuple(labels), other_label)
    hit = _LITERAL_DFAS.get(key)
    if hit is None:
        hit = _literal_dfa(strings, labels, other_label)
        if len(_LITERAL_DFAS) >= 4096:
            _LITERAL_DFAS.clear()
        _LITERAL_DFAS[key] = hit
    return hit


def _literal_dfa(strings, labels, other_label):
    # the trie in sorted order: each string shares its longest common prefix with the
    # previous one and adds one state per remaining byte (a stable sort keeps the last
    # label of a repeated string, as insertion order would)
    default = -1 if other_label is None else other_label
    order = sorted(range(len(strings)), key=strings.__getitem__)
    acc = [default]
    src, byt, dst = [], [], []
    path = [0]          # states along the previous string
    prev = b""
    n = 1
    for i in order:
        s = bytes(strings[i])
        m = min(len(s), len(prev))
        k = 0
        while k < m and s[k] == prev[k]:
            k += 1
        del path[k + 1:]
        extra = len(s) - k
        if extra:
            new = list(range(n, n + extra))
            src.append(path[k])
            src.extend(new[:-1])
            byt.extend(s[k:])
            dst.extend(new)
            path.extend(new)
            acc.extend([default] * extra)
            n += extra
        acc[path[len(s)]] = 0 if labels is None else labels[i]
        prev = s
    sink = -1
    if other_label is not None:
        sink = n
        acc.append(other_label)
    # byte classes: one per byte the strings use, one (class 0) for all the others
    used = sorted(set(byt))
    cmap = np.zeros(256, dtype=np.uint8)
    if len(used) == 256:
        cmap[:] = np.arange(256)
    else:
        cmap[used] = np.arange(1, len(used) + 1)
    table = np.full((n + (1 if sink >= 0 else 0), int(cmap.max()) + 1), sink, dtype=np.int32)
    if src:
        table[src, cmap[byt]] = dst
    # a trie: every state is reachable; every state reaches the end of some string, or the
    # accepting sink
    trim = (other_label is not None and other_label >= 0) or \
        (len(strings) > 0 and (labels is None or min(labels) >= 0))
    return DFA(None, acc, trim=trim, cls=(cmap, table))


def product_dfa(dfas, combine, complete=None):
    """Product of DFAs; accept label = combine(tuple of component labels) (-1 = reject).

    ``complete[i]`` True means component i is run with an explicit dead state so the
    product stays alive after it dies (its label is then -1).
    """
    k = len(dfas)
    complete = complete or [False] * k
    dead_row = np.full(256, -1, dtype=np.int32)
    start = tuple(0 for _ in dfas)
    index = {start: 0}
    states = [start]
    rows, accept = [], []
    i = 0
    while i < len(states):
        cur = states[i]
        i += 1
        comp = np.stack([d.trans[s] if s >= 0 else dead_row for d, s in zip(dfas, cur)])  # [k, 256]
        ok = np.ones(256, dtype=bool)
        for j in range(k):
            if not complete[j]:
                ok &= comp[j] >= 0
        row = np.full(256, -1, dtype=np.int32)
        cols = comp.T[ok]
        if len(cols):
            uniq, inv = np.unique(cols, axis=0, return_inverse=True)
            ids = []
            for u in uniq:
                key = tuple(int(x) for x in u)
                if key not in index:
                    if len(states) >= MAX_DFA_STATES:
                        raise GrammarLimitError(f"automaton product exceeds {MAX_DFA_STATES} states")
                    index[key] = len(states)
                    states.append(key)
                ids.append(index[key])
            row[ok] = np.asarray(ids, dtype=np.int32)[inv.reshape(-1)]
        rows.append(row)
        accept.append(combine(tuple(int(d.accept[s]) if s >= 0 else -1 for d, s in zip(dfas, cur))))
    return DFA(np.stack(rows), accept)


def complement_dfa(d):
    """The byte strings d rejects (UTF-8 validity is the string frame's job)."""
    n = d.n
    cmap, table = _compress(d)
    tr = np.where(table >= 0, table, n).astype(np.int32)
    tr = np.vstack([tr, np.full((1, tr.shape[1]), n, np.int32)])
    acc = np.append(np.where(d.accept >= 0, -1, 0), 0).astype(np.int32)
    return prune_dfa(DFA(None, acc, cls=(cmap, tr)))


def intersect_dfas(dfas):
    if len(dfas) == 1:
        return dfas[0]
    d = product_dfa(dfas, lambda labels: 0 if all(x >= 0 for x in labels) else -1)
    return prune_dfa(d)


# ----------------------------------------------------------------------------
# formats as regexes (exact rules, documented)
_YEAR = r"(?:[1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])"       # 0001-9999
_LEAP2 = r"(?:[02468][48]|[13579][26]|[2468]0)"                       # 04..96 by 4, not 00
_LEAP_YEAR = r"(?:[0-9]{2}" + _LEAP2 + "|" + _LEAP2 + "00)"            # Gregorian leap years
_DATE = (r"(?:" + _YEAR + r"-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
         r"|02-(?:0[1-9]|1[0-9]|2[0-8]))|" + _LEAP_YEAR + "-02-29)")
_TIME = (r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,9})?"
         r"(?:[zZ]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])")
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
FORMAT_REGEX = {
    # RFC 3339 full-date, proleptic Gregorian, years 0001-9999 (as Python's date): month
    # lengths and leap years (29 February of 2024 and 2000, not of 1900) -- exact.
    "date": "^" + _DATE + "$",
    # RFC 3339 full-time with a mandatory offset; no leap second, at most 9 fraction digits
    # (narrowed).
    "time": "^" + _TIME + "$",
    "date-time": "^" + _DATE + "[tT]" + _TIME + "$",
    # dotted quad, no leading zeros -- exact
    "ipv4": "^" + _OCTET + r"(?:\." + _OCTET + "){3}$",
    # 8-4-4-4-12 hex digits -- exact
    "uuid": r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
    # local@domain: ASCII atext dot-atoms, domain labels of letters/digits/hyphens (not at ends);
    # no quoted local part, no IP literal (narrowed)
    "email": r"^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*"
             r"@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*$",
    # absolute URI: scheme ":" then RFC 3986 characters (unreserved, reserved, %HH); a
    # character-level rule, not the RFC's grammar
    "uri": r"^[A-Za-z][A-Za-z0-9+.-]*:(?:[A-Za-z0-9\-._~!$&'()*+,;=:@/?#\[\]]|%[0-9A-Fa-f]{2})*$",
}


# ============================================================================
# JSON helpers

def compact(value):
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def json_equal(a, b):
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return type(a) == type(b) and a == b


def number_texts(v):
    """Texts accepted for an enum/const number: its repr, and N / N.0 for integral values."""
    out = set()
    if isinstance(v, int):
        out.add(str(v))
        out.add(str(v) + ".0")
    else:
        out.add(repr(v))
        if v.is_integer() and abs(v) < 1e16:
            out.add(str(int(v)))
            out.add(str(int(v)) + ".0")
    if "-0" in out:
        out.discard("-0")
    return sorted(out)


# ============================================================================
# schema compiler

class _Part:
    """One member of a conjunction: the schema at a JSON pointer minus some keywords."""
    __slots__ = ("ptr", "excl")

    def __init__(self, ptr, excl=frozenset()):
        self.ptr = ptr
        self.excl = excl

    def key(self):
        return (self.ptr, self.excl)


def _escape_ptr(k):
    return k.replace("~", "~0").replace("/", "~1")


class Program:
    """The compiled grammar program (plain Python lists; numpy views made on demand)."""

    def __init__(self):
        # nodes
        self.kind = []
        self.types = []
        self.str_min = []
        self.str_max = []
        self.str_dfa = []
        self.num_dfa = []
        self.num_check = []
        self.int_lo = []
        self.int_hi = []
        self.int_flags = []   # 1: lo present, 2: hi present
        self.arr_prefix_off = []
        self.arr_prefix_n = []
        self.arr_items = []
        self.arr_min = []
        self.arr_max = []
        self.arr_unique = []
        self.obj_key_dfa = []
        self.obj_nwords = []
        self.obj_req_off = []
        self.obj_min = []
        self.obj_max = []
        self.obj_other_ok = []  # 1 when keys outside the declared set can be valid
        self.obj_dep_off = []   # dependencies: pairs (property index, words offset of its required set)
        self.obj_dep_n = []
        self.alt_off = []
        self.alt_n = []
        self.oneof = []
        # pools
        self.prefix_pool = []
        self.alt_pool = []
        self.dep_pool = []
        self.words = []        # uint64 words: required bitsets, reach bitsets
        # key classes (for key DFAs): class -> (prop index or -1, value node)
        self.cls_prop = []
        self.cls_node = []
        # DFA arena (the linkable form): per automaton a byte-class map (256 bytes in
        # dfa_classes) and a table [states, classes] of global target states (-1 none) in
        # dfa_trans; per state the offsets of its row and of its automaton's class map:
        #     next(st, b) = dfa_trans[dfa_row[st] + dfa_classes[dfa_cmap[st] + b]]
        # The runtimes read runtime_tables(): one class map for the whole program.
        self.dfa_trans = []    # list of int32 arrays while compiling, one array after finish()
        self.dfa_classes = []  # list of uint8[256] while compiling, one array after finish()
        self.dfa_row = []
        self.dfa_cmap = []
        self.n_trans = 0       # entries in dfa_trans
        self.n_classes = 0     # bytes in dfa_classes
        self.accept = []       # per state label: -1 reject, else >= 0 (key DFA: class id)
        self.label_is_class = []  # per state: 1 when its label is a key class id (relocated by link)
        self.reach_off = []    # per state: offset into words of reachable-prop bitset (-1 none)
        self.other = []        # per state: 1 if some non-declared valid key is reachable
        # number checks: list of dicts (lo, lo_excl, hi, hi_excl, mult) of normalised decimals
        self.num_checks = []
        # tool-call outer language
        self.tools_mode = 0
        self.max_calls = 0
        self.tool_dfa = -1
        self.tool_nodes = []
        self.tool_names = []
        self.root = 0
        self.n_props_words = 0
        self.starts = None

    def add_dfa(self, dfa, reach=None, other=None):
        """Append an automaton (byte-class compressed); returns the global id of its state 0.
        ``reach``/``other``: per state, for key automata (labels are then key class ids)."""
        base = len(self.accept)
        cmap, table = _compress(dfa)
        n, k = table.shape
        self.dfa_trans.append(np.where(table >= 0, table + base, -1).astype(np.int32).reshape(-1))
        self.dfa_classes.append(cmap)
        self.dfa_row.extend(range(self.n_trans, self.n_trans + n * k, k))
        self.dfa_cmap.extend([self.n_classes] * n)
        self.n_trans += n * k
        self.n_classes += 256
        self.accept.extend(dfa.accept.tolist())
        if reach is not None:
            off = len(self.words)
            nw = len(reach[0]) if n else 0
            for r in reach:
                self.words.extend(r)
            self.reach_off.extend(range(off, off + n * nw, nw))
            self.other.extend(other)
        else:
            self.reach_off.extend([-1] * n)
            self.other.extend([0] * n)
        self.label_is_class.extend([1 if reach is not None else 0] * n)
        return base

    @property
    def n_nodes(self):
        return len(self.kind)

    def finish(self):
        """Derived tables: first-byte classes per node (choices: union over alternatives)."""
        if isinstance(self.dfa_trans, list):
            self.dfa_trans = np.concatenate(self.dfa_trans) if self.dfa_trans else np.zeros(0, np.int32)
            self.dfa_classes = np.concatenate(self.dfa_classes) if self.dfa_classes else np.zeros(0, np.uint8)
        self._trans_py = None
        self._rt = self._bc = None
        if self.starts is not None:   # linked programs carry their fragments' starts
            return self
        n = len(self.kind)
        starts = [_type_starts(self.types[i]) if self.kind[i] == NODE_VALUE else 0 for i in range(n)]
        changed = any(k == NODE_CHOICE for k in self.kind)
        while changed:
            changed = False
            for i in range(n):
                if self.kind[i] == NODE_CHOICE:
                    s = 0
                    for j in range(self.alt_n[i]):
                        s |= starts[self.alt_pool[self.alt_off[i] + j]]
                    if s != starts[i]:
                        starts[i] = s
                        changed = True
        self.starts = starts
        return self

    def byte_classes(self):
        """(byte_class uint8[256], first byte of each class): see runtime_tables."""
        bc = getattr(self, "_bc", None)
        if bc is None:
            # a linked program refines its fragments' byte classes (fewer maps than automata)
            maps = getattr(self, "_fragment_classes", None)
            bc = self._bc = _program_classes(np.asarray(self.dfa_classes) if maps is None else maps)
        return bc

    def runtime_tables(self):
        """The transition table the runtimes read: one byte-class map for the whole program
        (the common refinement of its automata's maps, so usually a few dozen classes) and a
        state-major table, next(st, b) = class_trans[st * n_classes + byte_class[b]].
        Returns (byte_class uint8[256], class_trans int32[states * n_classes], n_classes)."""
        rt = getattr(self, "_rt", None)
        if rt is None:
            byte_class, first = self.byte_classes()
            table = _state_major(np.asarray(self.dfa_classes), np.asarray(self.dfa_row, dtype=np.int64),
                                 np.asarray(self.dfa_cmap, dtype=np.int64), np.asarray(self.dfa_trans), first)
            rt = self._rt = (byte_class, table, len(first))
        return rt

    @property
    def trans(self):
        """The transitions expanded to 256 per state (flat, global ids): what the runtime
        tables mean, one lookup per byte."""
        byte_class, class_trans, k = self.runtime_tables()
        n = len(self.accept)
        return class_trans.reshape(n, k)[:, byte_class].reshape(-1)

    @property
    def trans_py(self):
        """The expanded transition table as a Python list (for the pure-Python reference
        runtime, which thereby checks the compressed tables the C runtime reads)."""
        if getattr(self, "_trans_py", None) is None:
            self._trans_py = self.trans.tolist()
        return self._trans_py

    def pylists(self):
        """This program with plain Python lists/ints in every table (linked programs hold
        NumPy arrays; the reference runtime does bit arithmetic on Python ints)."""
        if isinstance(self.kind, list):
            return self
        q = getattr(self, "_pylists", None)
        if q is None:
            q = Program()
            for k, v in self.__dict__.items():
                if k.startswith("_"):
                    continue
                setattr(q, k, v.tolist() if isinstance(v, np.ndarray) and k not in ("dfa_trans", "dfa_classes")
                        else v)
            q.words = [int(w) for w in q.words]
            q._trans_py = None
            self._pylists = q
        return q


def _schema_at(doc, ptr):
    if ptr == "#" or ptr == "":
        return doc
    if not ptr.startswith("#/"):
        raise UnsupportedSchemaError(f"non-local $ref {ptr!r}", keyword="$ref", pointer=ptr)
    cur = doc
    for raw in ptr[2:].split("/"):
        tok = raw.replace("~1", "/").replace("~0", "~") if "~" in raw else raw
        if "%" in tok:
            tok = unquote(tok)
        if isinstance(cur, dict) and tok in cur:
            cur = cur[tok]
        elif isinstance(cur, list) and tok.isdigit() and int(tok) < len(cur):
            cur = cur[int(tok)]
        else:
            raise SchemaError(f"$ref target {ptr!r} does not exist")
    return cur


class Compiler:
    def __init__(self, doc, synthetic=None):
        self.doc = doc
        self.p = Program()
        self.memo = {}
        self.synthetic = {}   # pointer "~synN" -> schema dict
        self.draft = self._draft(doc)
        self.neg_errors = {}
        self.approx = set()      # nodes that refuse some value their schema allows (see check_oneof)
        self.approx_nl = set()   # nodes that refuse such values only for a string value ending in "\n"
        self.str_dfa_obj = {}    # node -> the automaton of its str_dfa (check_oneof narrows it)
        self.nl_stripped = set()
        self.kids = {}           # node -> nodes it contains (items, property values, alternatives)
        self.oneof_ptr = {}      # oneOf choice node -> its pointer
        self._checked = set()    # ids of schema dicts whose keyword values were checked
        self.t0 = time.monotonic()
        self.depth = 0
        self.memo[()] = ANY_NODE
        start = Compiler._start_program
        if start is None:
            self._new_node_raw(types=T_ALL)          # ANY_NODE
            self._new_node_raw(types=0)              # NEVER_NODE
            self._fill_object(ANY_NODE, [])
            Compiler._start_program = {k: list(v) if isinstance(v, list) else v
                                       for k, v in self.p.__dict__.items() if isinstance(v, (list, int))}
        else:
            # every program starts with the same ANY and NEVER nodes (ANY's key automaton
            # included): copy them instead of compiling them again
            for k, v in start.items():
                setattr(self.p, k, list(v) if isinstance(v, list) else v)

    _start_program = None

    @staticmethod
    def _draft(doc):
        s = doc.get("$schema", "") if isinstance(doc, dict) else ""
        if not isinstance(s, str):
            raise SchemaError(f"$schema at # must be a string (a URI), found {type(s).__name__} {s!r}")
        for d in ("draft-03", "draft-04", "draft-06", "draft-07"):
            if d in s:
                return int(d[-1])
        if "2019-09" in s:
            return 2019
        return 2020

    # -- schema access
    def get(self, ptr):
        if ptr.startswith("~syn"):
            head, _, rest = ptr.partition("/")
            base = self.synthetic[head]
            if not rest:
                return base
            cur = base
            for raw in rest.split("/"):
                tok = raw.replace("~1", "/").replace("~0", "~")
                cur = cur[int(tok)] if isinstance(cur, list) else cur[tok]
            return cur
        sch = _schema_at(self.doc, ptr)
        if type(sch) is dict and not INTERNAL.isdisjoint(sch):
            sch = {k: v for k, v in sch.items() if k not in INTERNAL}
        return sch

    def synth(self, schema):
        name = f"~syn{len(self.synthetic)}"
        self.synthetic[name] = schema
        return name

    def _new_node_raw(self, **kw):
        p = self.p
        nid = len(p.kind)
        if nid % 64 == 0 and time.monotonic() - self.t0 > COMPILE_BUDGET_S:
            raise GrammarLimitError(f"schema compilation exceeded {COMPILE_BUDGET_S:.0f} s")
        if nid >= MAX_NODES:
            # anyOf/oneOf distributed over other conjuncts can multiply: refuse, loudly
            raise GrammarLimitError(f"schema expands to more than {MAX_NODES} grammar nodes")
        p.kind.append(kw.get("kind", NODE_VALUE))
        p.types.append(kw.get("types", T_ALL))
        p.str_min.append(0)
        p.str_max.append(-1)
        p.str_dfa.append(-1)
        p.num_dfa.append(-1)
        p.num_check.append(-1)
        p.int_lo.append(0)
        p.int_hi.append(0)
        p.int_flags.append(0)
        p.arr_prefix_off.append(0)
        p.arr_prefix_n.append(0)
        p.arr_items.append(ANY_NODE)
        p.arr_min.append(0)
        p.arr_max.append(-1)
        p.arr_unique.append(0)
        p.obj_key_dfa.append(-1)
        p.obj_nwords.append(0)
        p.obj_req_off.append(0)
        p.obj_min.append(0)
        p.obj_max.append(-1)
        p.obj_other_ok.append(1)
        p.obj_dep_off.append(0)
        p.obj_dep_n.append(0)
        p.alt_off.append(0)
        p.alt_n.append(0)
        p.oneof.append(0)
        return nid

    # -- conjunction expansion
    def expand(self, parts):
        """Flatten $ref and allOf; returns list of (_Part, dict) or None when false."""
        out = []
        seen = set()
        stack = list(parts)
        while stack:
            part = stack.pop()
            if part.key() in seen:
                continue
            seen.add(part.key())
            sch = self.get(part.ptr)
            if sch is True or sch == {}:
                continue
            if sch is False:
                return None
            if not isinstance(sch, dict):
                raise SchemaError(f"schema at {part.ptr} is not an object or boolean")
            self.check_keywords(sch, part.ptr)
            excl = set(part.excl)
            if "$ref" in sch and "$ref" not in excl:
                ref = sch["$ref"]
                if not isinstance(ref, str):
                    raise SchemaError(f"$ref at {part.ptr} is not a string")
                target = self.resolve_ref(ref, part.ptr)
                stack.append(_Part(target))
                excl.add("$ref")
                if self.draft <= 7:
                    # draft <= 7: siblings of $ref are ignored
                    continue
            if "__ptr" in sch and "__ptr" not in excl:
                stack.append(_Part(sch["__ptr"]))
                excl.add("__ptr")
            if "not" in sch and "not" not in excl:
                try:
                    neg = self.negate(f"{part.ptr}/not", 0)
                except UnsupportedSchemaError as exc:
                    neg = None   # left to fill(): exact by filtering a finite enum, or this error
                    self.neg_errors[part.ptr] = exc
                if neg is not None:
                    stack.append(_Part(self.synth(neg)))
                    excl.add("not")
            for dk in ("dependencies", "dependentSchemas"):
                if dk in sch and dk + ":schemas" not in excl and isinstance(sch[dk], dict):
                    # a schema dependency: the property is absent, or the schema holds
                    for name, dv in sch[dk].items():
                        if isinstance(dv, list) or (isinstance(dv, dict) and set(dv) - ANNOTATIONS <= {"required"}):
                            continue  # property dependencies: checked by the object frame
                        dp = f"{part.ptr}/{dk}/{_escape_ptr(name)}"
                        stack.append(_Part(self.synth({"anyOf": [{"properties": {name: False}}, {"__ptr": dp}]})))
                    excl.add(dk + ":schemas")
            if "if" in sch and "if" not in excl:
                # (if and then) or (not if and else), with `not if` rewritten exactly
                ip = f"{part.ptr}/if"
                neg_if = self.negate(ip, 0)
                then = {"__ptr": f"{part.ptr}/then"} if "then" in sch else True
                els = {"__ptr": f"{part.ptr}/else"} if "else" in sch else True
                stack.append(_Part(self.synth({"anyOf": [{"allOf": [{"__ptr": ip}, then]},
                                                         {"allOf": [neg_if, els]}]})))
                excl.update(("if", "then", "else"))
            if "allOf" in sch and "allOf" not in excl:
                subs = sch["allOf"]
                if not isinstance(subs, list):
                    raise SchemaError(f"allOf at {part.ptr} is not a list")
                for i in range(len(subs)):
                    stack.append(_Part(f"{part.ptr}/allOf/{i}"))
                excl.add("allOf")
            out.append((_Part(part.ptr, frozenset(excl)), sch))
        return out

    # -- negation (`not`), rewritten exactly into positive keywords (De Morgan per keyword)
    ALL_TYPES = ("null", "boolean", "object", "array", "number", "string")

    def negate(self, ptr, depth):
        """A schema accepting exactly the instances the schema at ptr rejects."""
        if depth > 20:
            raise UnsupportedSchemaError(f"'not' nested too deep at {ptr}", keyword="not", pointer=ptr)
        sch = self.get(ptr)
        if sch is True:
            return False
        if sch is False:
            return True
        if not isinstance(sch, dict):
            raise SchemaError(f"schema at {ptr} is not an object or boolean")
        self.check_keywords(sch, ptr)
        keys = [k for k in sch if k not in ANNOTATIONS and not k.startswith("x-")]
        if "$ref" in keys and self.draft <= 7:
            return self.negate(self.resolve_ref(sch["$ref"], ptr), depth + 1)
        alts = []
        done = set()
        for k in keys:
            if k in done:
                continue
            done.add(k)
            v = sch[k]
            if k not in SUPPORTED and k not in ("__ptr",):
                continue  # unknown keyword: an annotation, always satisfied
            alts.append(self._negate_keyword(ptr, sch, k, v, depth, done))
        alts = [a for a in alts if a is not False]
        if not alts:
            return False
        if any(a is True for a in alts):
            return True
        return alts[0] if len(alts) == 1 else {"anyOf": alts}

    def _others(self, *types):
        rest = [t for t in self.ALL_TYPES if t not in types]
        return {"type": rest} if rest else False

    def _negate_keyword(self, ptr, sch, k, v, depth, done):
        """Negation of one keyword.  A keyword that constrains one type only (pattern, minimum,
        required...) is satisfied by every other type, so its negation keeps that type only."""
        kp = f"{ptr}/{_escape_ptr(k)}"

        def unsupported():
            raise UnsupportedSchemaError(f"'not' over {k!r} is not supported (at {kp})", keyword="not", pointer=kp)

        def either(*alts):
            alts = [a for a in alts if a is not False]
            if not alts:
                return False
            return alts[0] if len(alts) == 1 else {"anyOf": list(alts)}

        if k == "$ref":
            return self.negate(self.resolve_ref(v, ptr), depth + 1)
        if k == "__ptr":
            return self.negate(v, depth + 1)
        if k == "not":
            return {"__ptr": kp}
        if k == "anyOf" and isinstance(v, list):
            return {"allOf": [self.negate(f"{kp}/{i}", depth + 1) for i in range(len(v))]}
        if k == "allOf" and isinstance(v, list):
            return {"anyOf": [self.negate(f"{kp}/{i}", depth + 1) for i in range(len(v))]} if v else False
        if k == "type":
            tl = v if isinstance(v, list) else [v]
            if "integer" in tl and "number" not in tl:
                unsupported()
            return self._others(*[("number" if t == "integer" else t) for t in tl])
        if k in ("enum", "const"):
            vals = v if k == "enum" else [v]
            if any(isinstance(x, (list, dict)) for x in vals):
                unsupported()
            nums = [x for x in vals if isinstance(x, (int, float)) and not isinstance(x, bool)]
            strs = [x for x in vals if isinstance(x, str)]
            lits = [x for x in (True, False, None) if not any(json_equal(x, y) for y in vals)]

            def other_than(n):
                if self.draft <= 4:
                    return {"anyOf": [{"type": "number", "maximum": n, "exclusiveMaximum": True},
                                      {"type": "number", "minimum": n, "exclusiveMinimum": True}]}
                return {"anyOf": [{"type": "number", "exclusiveMaximum": n},
                                  {"type": "number", "exclusiveMinimum": n}]}
            return either(self._others("boolean", "null", "string", "number"),
                          {"enum": lits} if lits else False,
                          {"type": "string", "__not_strings": strs} if strs else {"type": "string"},
                          {"allOf": [other_than(n) for n in nums]} if nums else {"type": "number"})
        if k == "pattern":
            if not isinstance(v, str):
                raise SchemaError(f"pattern at {ptr} is not a string")
            return {"type": "string", "__not_pattern": v}   # non-strings satisfy `pattern`
        if k == "format":
            if v in NARROWED_FORMATS:
                raise UnsupportedSchemaError(
                    f"'not' over format {v!r} (at {kp}): the grammar's {v} refuses some valid "
                    f"values, so its complement would accept them; negation is exact only for "
                    f"formats {sorted(EXACT_FORMATS)}", keyword="not", pointer=kp)
            if v in EXACT_FORMATS:
                return {"type": "string", "__not_format": v}
            if v in UNENFORCED_STANDARD_FORMATS:
                unsupported()
            return False
        if k == "required":
            if not v:
                return False
            return either(*[{"type": "object", "properties": {name: False}} for name in v])
        if k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            if isinstance(v, bool):
                return False  # draft-4 flag: negated together with its bound
            is_min = k in ("minimum", "exclusiveMinimum")
            excl = k.startswith("exclusive") or sch.get("exclusiveMinimum" if is_min else "exclusiveMaximum") is True
            # not (x >= m) is x < m; not (x > m) is x <= m
            bound = ("exclusiveMaximum" if not excl else "maximum") if is_min else \
                    ("exclusiveMinimum" if not excl else "minimum")
            neg = {"type": "number", bound: v}
            if self.draft <= 4 and bound.startswith("exclusive"):
                neg = {"type": "number", bound.replace("exclusiveM", "m"): v, bound: True}
            return neg
        counts = {"minLength": ("string", "maxLength"), "maxLength": ("string", "minLength"),
                  "minItems": ("array", "maxItems"), "maxItems": ("array", "minItems"),
                  "minProperties": ("object", "maxProperties"), "maxProperties": ("object", "minProperties")}
        if k in counts:
            t, other = counts[k]
            n = _nonneg_int(v, ptr, k)
            if k.startswith("min"):
                return {"type": t, other: n - 1} if n > 0 else False
            return {"type": t, other: n + 1}
        if k == "uniqueItems" and v is False:
            return False
        if k == "properties" and isinstance(v, dict):
            # violated iff some declared property is present with a value its schema rejects
            return either(*[{"type": "object", "required": [name],
                             "properties": {name: self.negate(f"{kp}/{_escape_ptr(name)}", depth + 1)}}
                            for name in v])
        unsupported()

    def resolve_ref(self, ref, where):
        if ref == "#":
            return "#"
        if ref.startswith("#/"):
            # validate it exists
            try:
                _schema_at(self.doc, ref)
            except SchemaError:
                raise SchemaError(f"$ref {ref!r} at {where} does not resolve") from None
            return ref
        if ref.startswith("#"):
            # plain-name anchor: search $anchor / id fragments
            name = ref[1:]
            found = self._find_anchor(self.doc, "#", name)
            if found is None:
                raise UnsupportedSchemaError(f"$ref {ref!r} (anchor) at {where}", keyword="$ref", pointer=where)
            return found
        raise UnsupportedSchemaError(f"remote $ref {ref!r} at {where}", keyword="$ref", pointer=where)

    def _find_anchor(self, node, ptr, name):
        if isinstance(node, dict):
            if node.get("$anchor") == name or node.get("$id") == "#" + name or node.get("id") == "#" + name:
                return ptr
            for k, v in node.items():
                if k in ("enum", "const", "default", "examples"):
                    continue
                r = self._find_anchor(v, f"{ptr}/{_escape_ptr(k)}", name)
                if r:
                    return r
        elif isinstance(node, list):
            for i, v in enumerate(node):
                r = self._find_anchor(v, f"{ptr}/{i}", name)
                if r:
                    return r
        return None

    def check_keywords(self, sch, ptr):
        if id(sch) not in self._checked:
            _check_values(sch, ptr, self.draft)
            self._checked.add(id(sch))
        for k in sch:
            if k in KNOWN_UNSUPPORTED:
                if k in ("then", "else") and "if" not in sch:
                    continue  # without "if" they do nothing
                raise UnsupportedSchemaError(f"keyword {k!r} is not supported (at {ptr})", keyword=k,
                                             pointer=f"{ptr}/{_escape_ptr(k)}")
        # an embedded resource id changes how $refs inside it resolve: refused only when some
        # $ref lives under it (otherwise it changes nothing)
        for idk in ("id", "$id"):
            if idk == "id" and self.draft > 4:
                continue
            v = sch.get(idk)
            if isinstance(v, str) and ptr != "#" and not v.startswith("#") and _has_ref(sch):
                raise UnsupportedSchemaError(f"embedded schema resource {idk} {v!r} with $refs at {ptr}",
                                             keyword=idk, pointer=ptr)

    # -- node construction
    def node(self, parts):
        key = tuple(sorted(p.key() for p in parts))
        if key in self.memo:
            return self.memo[key]
        self.depth += 1
        if self.depth > 400:
            raise GrammarLimitError("schema nesting too deep to compile")
        try:
            flat = self.expand(parts)
            if flat is None:
                self.memo[key] = NEVER_NODE
                return NEVER_NODE
            fkey = tuple(sorted(p.key() for p, _ in flat))
            if fkey in self.memo:
                self.memo[key] = self.memo[fkey]
                return self.memo[fkey]
            nid = self._new_node_raw()
            self.memo[key] = nid
            self.memo[fkey] = nid
            self.fill(nid, flat)
            if self.p.types[nid] == 0:
                # no value can start: the false schema, so that an object refuses the key
                # (and anyOf the alternative) instead of stranding after it
                self.memo[key] = self.memo[fkey] = NEVER_NODE
                return NEVER_NODE
            return nid
        finally:
            self.depth -= 1

    def fill(self, nid, flat):
        p = self.p
        # 1. choices: pick the first anyOf/oneOf and distribute the rest
        for part, sch in flat:
            for kw in ("anyOf", "oneOf"):
                if kw in sch and kw not in part.excl:
                    alts = sch[kw]
                    if not isinstance(alts, list) or not alts:
                        raise SchemaError(f"{kw} at {part.ptr} must be a non-empty list")
                    rest = [q for q, _ in flat if q is not part]
                    reduced = _Part(part.ptr, part.excl | {kw})
                    if len(alts) > 64:
                        raise GrammarLimitError(f"{kw} with {len(alts)} alternatives at {part.ptr}")
                    alt_nodes = []
                    for i in range(len(alts)):
                        alt_nodes.append(self.node(rest + [reduced, _Part(f"{part.ptr}/{kw}/{i}")]))
                    if kw == "anyOf":
                        alt_nodes = [a for a in alt_nodes if a != NEVER_NODE]
                        if not alt_nodes:
                            self._make_never(nid)
                            return
                        if len(set(alt_nodes)) == 1:
                            self._copy_node(nid, alt_nodes[0])
                            return
                        alt_nodes = list(dict.fromkeys(alt_nodes))
                    else:
                        # identical alternatives can never be "exactly one" together
                        counts = {}
                        for a in alt_nodes:
                            counts[a] = counts.get(a, 0) + 1
                        alt_nodes = [a for a in alt_nodes if a != NEVER_NODE and counts[a] == 1]
                        if not alt_nodes:
                            self._make_never(nid)
                            return
                        if len(alt_nodes) == 1:
                            self._copy_node(nid, alt_nodes[0])
                            return
                    p.kind[nid] = NODE_CHOICE
                    p.alt_off[nid] = len(p.alt_pool)
                    p.alt_n[nid] = len(alt_nodes)
                    p.alt_pool.extend(alt_nodes)
                    p.oneof[nid] = 1 if kw == "oneOf" else 0
                    self.kids[nid] = list(alt_nodes)
                    if kw == "oneOf":
                        self.oneof_ptr[nid] = f"{part.ptr}/oneOf"
                    return
        # 2. a plain value node: merge keywords
        types = T_ALL
        enum_vals = None
        for part, sch in flat:
            ex = part.excl
            if "type" in sch and "type" not in ex:
                t = sch["type"]
                tl = t if isinstance(t, list) else [t]
                m = 0
                for x in tl:
                    if x == "any" and self.draft <= 3:
                        m |= T_ALL
                        continue
                    if not isinstance(x, str) or x not in TYPE_BITS:
                        if isinstance(x, dict):
                            raise UnsupportedSchemaError(f"schema inside type at {part.ptr}", keyword="type",
                                                         pointer=part.ptr + "/type")
                        raise SchemaError(f"unknown type {x!r} at {part.ptr}")
                    m |= TYPE_BITS[x]
                types &= m
            for kw in ("enum", "const"):
                if kw in sch and kw not in ex:
                    vals = sch[kw] if kw == "enum" else [sch[kw]]
                    if not isinstance(vals, list):
                        raise SchemaError(f"enum at {part.ptr} is not a list")
                    if enum_vals is None:
                        enum_vals = list(vals)
                    else:
                        enum_vals = [v for v in enum_vals if any(json_equal(v, w) for w in vals)]
        nots = [(part, sch["not"]) for part, sch in flat if "not" in sch and "not" not in part.excl]
        if enum_vals is not None:
            # drop values of the wrong type; then filter by every other keyword by
            # compiling the conjunction without enum/const and running each value
            enum_vals = [v for v in enum_vals if _value_type_bit(v) & types]
            rest_parts = [_Part(q.ptr, q.excl | {"enum", "const", "not"}) for q, _ in flat]
            trivial = all(set(sch) - q.excl - ANNOTATIONS <= {"type", "enum", "const", "not"}
                          for q, sch in flat)
            kept = []
            for v in enum_vals:
                if not trivial and not self._value_ok(v, rest_parts):
                    continue
                # dropped when the `not` schema holds -- or may hold: its program is approximate
                if any(self._value_ok(v, [_Part(f"{q.ptr}/not")], unsure=True) for q, _ in nots):
                    continue
                kept.append(v)
            # "type": "integer" takes integer syntax only, with or without an enum (1.0 is not
            # an integer in draft 4 and is refused by plain "integer" in every draft)
            self._make_enum(nid, kept, int_only=not types & T_NUM)
            return
        if nots:
            # `not` without a finite value set: a few exact static forms
            for part, sub in nots:
                if sub is True or sub == {}:
                    self._make_never(nid)
                    return
                if sub is False:
                    continue
                if isinstance(sub, dict) and set(sub) - ANNOTATIONS <= {"type"} and "type" in sub:
                    t = sub["type"]
                    tl = t if isinstance(t, list) else [t]
                    m = 0
                    for x in tl:
                        m |= TYPE_BITS.get(x, 0)
                    if m & T_INT and not m & T_NUM:
                        # not integer: numbers stay allowed (only non-integer syntax is impossible to
                        # separate from integers statically) -> refuse
                        raise UnsupportedSchemaError(f"'not' over integer at {part.ptr}", keyword="not",
                                                     pointer=part.ptr + "/not")
                    types &= ~m
                    continue
                if isinstance(sub, dict) and set(sub) - ANNOTATIONS <= {"required"} and \
                        isinstance(sub.get("required"), list) and len(sub["required"]) == 0:
                    # not {required: []} = not (object => true) = non-objects only... objects always
                    # satisfy it, so objects are excluded
                    types &= ~T_OBJ
                    continue
                if part.ptr in self.neg_errors:
                    raise self.neg_errors[part.ptr]
                raise UnsupportedSchemaError(f"'not' is only supported with enum/const or a type (at {part.ptr})",
                                             keyword="not", pointer=part.ptr + "/not")
        p.types[nid] = types
        if types & T_STR:
            self._fill_string(nid, flat)
        if types & T_INT:
            self._fill_number(nid, flat, types)
        if types & T_ARR:
            self._fill_array(nid, flat)
        if types & T_OBJ:
            self._fill_object(nid, flat)

    def reaches_approx(self, seed=None):
        """Nodes containing (through items, property values, alternatives) an approximate
        node: one that refuses some value its schema allows (a narrowed format, a pattern the
        two regex engines read differently); ``seed``: from those nodes instead."""
        parents = {}
        for n, ks in self.kids.items():
            for c in ks:
                parents.setdefault(c, []).append(n)
        out = set(self.approx | self.approx_nl) if seed is None else set(seed)
        todo = list(out)
        while todo:
            for q in parents.get(todo.pop(), ()):
                if q not in out:
                    out.add(q)
                    todo.append(q)
        return out

    def _descendants(self, roots):
        out = set(roots)
        todo = list(out)
        while todo:
            for c in self.kids.get(todo.pop(), ()):
                if c not in out:
                    out.add(c)
                    todo.append(c)
        return out

    def _strip_nl(self, nid):
        """The node refuses every string value ending in a newline (marked ``approx_nl``)."""
        p = self.p
        self.nl_stripped.add(nid)
        if p.kind[nid] != NODE_VALUE or not p.types[nid] & T_STR:
            return
        global _NL_END_DFA
        if _NL_END_DFA is None:
            _NL_END_DFA = complement_dfa(regex_dfa("\\n$"))
        if p.str_dfa[nid] < 0:
            d = _NL_END_DFA
        else:
            d = intersect_dfas([self.str_dfa_obj[nid], _NL_END_DFA])
        p.str_dfa[nid] = p.add_dfa(d)
        self.str_dfa_obj[nid] = d
        self.approx_nl.add(nid)

    def _types_of(self, nid, seen=()):
        p = self.p
        if p.kind[nid] != NODE_CHOICE:
            return p.types[nid]
        if nid in seen:
            return T_ALL
        t = 0
        for a in p.alt_pool[p.alt_off[nid]: p.alt_off[nid] + p.alt_n[nid]]:
            t |= self._types_of(a, seen + (nid,))
        return t

    def check_oneof(self):
        """oneOf is exact only when each alternative is: "exactly one" refuses a value two
        alternatives both accept, so an alternative that wrongly refuses a value would let the
        value through another one.  Approximate alternatives are allowed when no two
        alternatives share a JSON type (then at most one can ever match).  When the only
        approximations an alternative reaches refuse a value for a string value ending in a
        newline (a ``$`` pattern, or such a refusal made here), every node of every
        alternative refuses string values ending in a newline: a value accepted through one
        alternative then contains no such string, so no other alternative can match it under
        Python's reading either.  Otherwise the schema is refused."""
        if not self.oneof_ptr:
            return
        p = self.p
        while True:
            hot = hot_nl = None
            strip = set()
            for nid, ptr in self.oneof_ptr.items():
                if p.kind[nid] != NODE_CHOICE or not p.oneof[nid]:
                    continue
                alts = p.alt_pool[p.alt_off[nid]: p.alt_off[nid] + p.alt_n[nid]]
                if hot is None:
                    hot = self.reaches_approx(self.approx)
                    hot_nl = self.reaches_approx(self.approx_nl)
                if not any(a in hot or a in hot_nl for a in alts):
                    continue
                types = [self._types_of(a) for a in alts]
                need = False
                for i in range(len(alts)):
                    for j in range(i + 1, len(alts)):
                        if not types[i] & types[j]:
                            continue
                        if alts[i] in hot or alts[j] in hot:
                            raise UnsupportedSchemaError(
                                f"oneOf at {ptr}: an alternative uses a narrowed format or a pattern the "
                                "regex engines read differently, and another alternative can match a "
                                "value of the same type; 'exactly one' cannot be enforced exactly",
                                keyword="oneOf", pointer=ptr)
                        if alts[i] in hot_nl or alts[j] in hot_nl:
                            need = True
                if need:
                    strip |= self._descendants(alts)
            strip -= self.nl_stripped
            if not strip:
                return
            for n in sorted(strip):
                self._strip_nl(n)

    def _make_never(self, nid):
        self.p.kind[nid] = NODE_VALUE
        self.p.types[nid] = 0

    def _copy_node(self, nid, src):
        p = self.p
        self.kids[nid] = [src]
        if src in self.oneof_ptr:
            self.oneof_ptr[nid] = self.oneof_ptr[src]
        for name in ("kind", "types", "str_min", "str_max", "str_dfa", "num_dfa", "num_check", "int_lo",
                     "int_hi", "int_flags", "arr_prefix_off", "arr_prefix_n", "arr_items", "arr_min",
                     "arr_max", "arr_unique", "obj_key_dfa", "obj_nwords", "obj_req_off", "obj_min",
                     "obj_max", "obj_other_ok", "obj_dep_off", "obj_dep_n", "alt_off", "alt_n", "oneof"):
            arr = getattr(p, name)
            arr[nid] = arr[src]
        if src in self.str_dfa_obj:
            self.str_dfa_obj[nid] = self.str_dfa_obj[src]
        if src >= len(p.kind) or p.kind[src] is None:
            raise AssertionError

    def _value_ok(self, value, parts, unsure=False):
        """Whether a concrete JSON value satisfies a conjunction (compiled + run on the reference).
        The program may refuse values the conjunction allows (see ``approx``): a refusal then
        answers ``unsure``."""
        from ..reference.grammar import ReferenceState
        sub = Compiler(self.doc)
        sub.synthetic = dict(self.synthetic)
        sub.draft = self.draft
        root = sub.node(parts)
        sub.check_oneof()
        if unsure and root in sub.reaches_approx():
            return True
        sub.p.root = root
        st = ReferenceState(sub.p.finish())
        try:
            data = compact(value).encode("utf-8")
        except ValueError:
            return False
        return st.feed(data) and st.is_complete()

    def _make_enum(self, nid, values, int_only=False):
        """A node accepting exactly the given values (numbers in integer syntax only when
        ``int_only``)."""
        p = self.p
        strs = [v for v in values if isinstance(v, str)]
        nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        comps = [v for v in values if isinstance(v, (list, dict))]
        types = 0
        for v in values:
            if v is None:
                types |= T_NULL
            elif v is True:
                types |= T_TRUE
            elif v is False:
                types |= T_FALSE
        if strs:
            types |= T_STR
            d = literal_dfa(sorted({s.encode("utf-8") for s in strs}))
            p.str_dfa[nid] = p.add_dfa(d)
            self.str_dfa_obj[nid] = d
        if nums:
            texts = sorted({t.encode() for v in nums for t in number_texts(v)})
            if int_only:
                texts = [t for t in texts if t.lstrip(b"-").isdigit()]
            if texts:
                types |= T_INT if int_only else T_INT | T_NUM
                p.num_dfa[nid] = p.add_dfa(literal_dfa(texts))
        if not comps:
            p.types[nid] = types
            return
        # composite values: a choice of the scalar part and one exact schema per value
        alts = []
        if types:
            scalar = self._new_node_raw()
            for name in ("types", "str_dfa", "num_dfa"):
                getattr(p, name)[scalar] = getattr(p, name)[nid]
            if nid in self.str_dfa_obj:
                self.str_dfa_obj[scalar] = self.str_dfa_obj[nid]
            p.types[scalar] = types
            alts.append(scalar)
        uniq = []
        for v in comps:
            if not any(json_equal(v, w) for w in uniq):
                uniq.append(v)
        for v in uniq:
            alts.append(self.node([_Part(self.synth(_const_schema(v)))]))
        if len(alts) == 1:
            self._copy_node(nid, alts[0])
            return
        p.kind[nid] = NODE_CHOICE
        p.alt_off[nid] = len(p.alt_pool)
        p.alt_n[nid] = len(alts)
        p.alt_pool.extend(alts)
        p.oneof[nid] = 0
        self.kids[nid] = list(alts)

    def _fill_string(self, nid, flat):
        p = self.p
        dfas = []
        for part, sch in flat:
            ex = part.excl
            if "minLength" in sch and "minLength" not in ex:
                p.str_min[nid] = max(p.str_min[nid], _nonneg_int(sch["minLength"], part.ptr, "minLength"))
            if "maxLength" in sch and "maxLength" not in ex:
                v = min(_nonneg_int(sch["maxLength"], part.ptr, "maxLength"), COUNT_CAP)
                p.str_max[nid] = v if p.str_max[nid] < 0 else min(p.str_max[nid], v)
            if "pattern" in sch and "pattern" not in ex:
                pat = sch["pattern"]
                if not isinstance(pat, str):
                    raise SchemaError(f"pattern at {part.ptr} is not a string")
                dfas.append(self._pattern(pat, part.ptr + "/pattern", nid=nid, value=True))
            if "__not_pattern" in sch:
                # the complement of what either engine matches: refused by both
                dfas.append(complement_dfa(self._pattern(sch["__not_pattern"], part.ptr + "/not/pattern",
                                                         mode="either", nid=nid)))
            if "__not_format" in sch:
                dfas.append(complement_dfa(self._format(sch["__not_format"], part.ptr + "/not/format")))
            if "__not_strings" in sch:
                dfas.append(complement_dfa(literal_dfa(sorted({x.encode("utf-8") for x in sch["__not_strings"]}))))
            if "format" in sch and "format" not in ex:
                f = sch["format"]
                if f in ENFORCED_FORMATS:
                    dfas.append(self._format(f, part.ptr + "/format"))
                    if f in NARROWED_FORMATS:
                        self.approx.add(nid)
                elif f in UNENFORCED_STANDARD_FORMATS:
                    raise UnsupportedSchemaError(f"format {f!r} is not enforced (at {part.ptr})",
                                                 keyword="format", pointer=part.ptr + "/format")
                # other (non-standard) formats are annotations
        if p.str_min[nid] > COUNT_CAP:
            p.str_min[nid] = 0
            p.types[nid] &= ~T_STR
        if dfas:
            d = intersect_dfas(dfas)
            p.str_dfa[nid] = p.add_dfa(d)
            self.str_dfa_obj[nid] = d

    _pattern_cache = {}

    def _pattern(self, pat, ptr, mode="both", nid=None, value=False):
        """The DFA of a user pattern in a dialect mode (see ``regex_dfa``), memoised per
        process (patterns recur).  When the engines read the pattern differently the node
        ``nid`` is marked approximate (it may refuse a value one engine allows).  A pattern
        whose only difference is ``$`` is exact in "either" mode (Python's reading: ECMA's
        matches are a subset), and in "both" mode, for a string ``value``, refuses only
        strings ending in a newline that Python matches (``approx_nl``)."""
        key = (pat, mode)
        hit = Compiler._pattern_cache.get(key)
        if hit is None:
            hit = _regex(pat, ptr, mode)
            if len(Compiler._pattern_cache) >= 1024:
                Compiler._pattern_cache.clear()
            Compiler._pattern_cache[key] = hit
        if hit[1] and nid is not None:
            if hit[1] == 2:
                self.approx.add(nid)
            elif mode == "both":
                (self.approx_nl if value else self.approx).add(nid)
        return hit[0]

    def _format(self, name, ptr):
        """The DFA of a built-in format (``FORMAT_REGEX``: ASCII rules, read as written)."""
        return self._pattern(FORMAT_REGEX[name], ptr)

    def _fill_number(self, nid, flat, types):
        p = self.p
        lo = hi = None   # (dec, exclusive)
        mults = []
        for part, sch in flat:
            ex = part.excl
            for kw in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"):
                if kw not in sch or kw in ex:
                    continue
                v = sch[kw]
                if kw in ("exclusiveMinimum", "exclusiveMaximum") and isinstance(v, bool):
                    continue  # draft-4 form: handled with minimum/maximum
                if not isinstance(v, (int, float)) or isinstance(v, bool):
                    raise SchemaError(f"{kw} at {part.ptr} is not a number")
                d = norm_decimal(v)
                if d[1] and abs(d[2]) + len(d[1]) > MAX_NUM_EXP:
                    raise GrammarLimitError(f"{kw} at {part.ptr} is beyond 10**+-{MAX_NUM_EXP}")
                if kw == "multipleOf":
                    if dec_to_fraction(d) <= 0:
                        raise SchemaError(f"multipleOf at {part.ptr} must be > 0")
                    if len(d[1]) > 18:
                        raise GrammarLimitError(f"multipleOf with more than 18 digits at {part.ptr}")
                    mults.append(d)
                    continue
                is_min = kw in ("minimum", "exclusiveMinimum")
                excl = kw.startswith("exclusive") or (
                    sch.get("exclusiveMinimum" if is_min else "exclusiveMaximum") is True)
                if is_min:
                    if lo is None or dec_cmp(d, lo[0]) > 0 or (dec_cmp(d, lo[0]) == 0 and excl):
                        lo = (d, excl)
                else:
                    if hi is None or dec_cmp(d, hi[0]) < 0 or (dec_cmp(d, hi[0]) == 0 and excl):
                        hi = (d, excl)
        mult = None
        if mults:
            fr = [dec_to_fraction(m) for m in mults]
            # lcm of rationals: lcm(numerators) / gcd(denominators)
            num = 1
            den = 0
            for f in fr:
                num = num * f.numerator // math.gcd(num, f.numerator)
                den = math.gcd(den, f.denominator)
            mval = Fraction(num, den)
            # back to a decimal (den divides a power of 10 since all were decimals)
            e = 0
            while (mval * 10 ** e).denominator != 1:
                e += 1
            mult = norm_decimal(str(int(mval * 10 ** e)) + ("e-%d" % e if e else ""))
            if len(mult[1]) > 18:
                raise GrammarLimitError("multipleOf combination with more than 18 digits")
        if lo is None and hi is None and mult is None:
            return
        if lo is not None and hi is not None:
            c = dec_cmp(lo[0], hi[0])
            if c > 0 or (c == 0 and (lo[1] or hi[1])):
                p.types[nid] &= ~(T_INT | T_NUM)
                return
        p.num_check[nid] = len(p.num_checks)
        p.num_checks.append({"lo": lo, "hi": hi, "mult": mult})
        # constraints no number meets (an integer between 0.5 and 0.7, no multiple inside
        # the range): the numeric types are dropped, so the value cannot start
        from ..reference.grammar import N_INT, N_MINUS, N_ZERO, number_live
        only_int = not (p.types[nid] & T_NUM)
        firsts = [(b"-", N_MINUS), (b"0", N_ZERO)] + [(bytes([c]), N_INT) for c in b"123456789"]
        if not any(number_live(p.num_checks[-1], text, ph, only_int) for text, ph in firsts):
            p.types[nid] &= ~(T_INT | T_NUM)
        # integer early bounds (inclusive, int64 range)
        flags = 0
        if lo is not None:
            f = dec_to_fraction(lo[0])
            v = math.floor(f) + 1 if (lo[1] and f == math.floor(f)) else math.ceil(f)
            if -2 ** 62 < v < 2 ** 62:
                p.int_lo[nid] = int(v)
                flags |= 1
        if hi is not None:
            f = dec_to_fraction(hi[0])
            v = math.ceil(f) - 1 if (hi[1] and f == math.ceil(f)) else math.floor(f)
            if -2 ** 62 < v < 2 ** 62:
                p.int_hi[nid] = int(v)
                flags |= 2
        p.int_flags[nid] = flags

    def _fill_array(self, nid, flat):
        p = self.p
        for part, sch in flat:
            ex = part.excl
            if "minItems" in sch and "minItems" not in ex:
                p.arr_min[nid] = max(p.arr_min[nid], _nonneg_int(sch["minItems"], part.ptr, "minItems"))
            if "maxItems" in sch and "maxItems" not in ex:
                v = min(_nonneg_int(sch["maxItems"], part.ptr, "maxItems"), COUNT_CAP)
                p.arr_max[nid] = v if p.arr_max[nid] < 0 else min(p.arr_max[nid], v)
            if sch.get("uniqueItems") is True and "uniqueItems" not in ex:
                p.arr_unique[nid] = 1
        # rebuild precisely per source
        sources = []
        for part, sch in flat:
            ex = part.excl
            tl, tail = None, None
            if "prefixItems" in sch and "prefixItems" not in ex and self.draft >= 2020:
                tl = (f"{part.ptr}/prefixItems", len(sch["prefixItems"]))
                if "items" in sch and "items" not in ex:
                    tail = f"{part.ptr}/items"
            elif "items" in sch and "items" not in ex:
                if isinstance(sch["items"], list):
                    tl = (f"{part.ptr}/items", len(sch["items"]))
                    if "additionalItems" in sch and "additionalItems" not in ex:
                        tail = f"{part.ptr}/additionalItems"
                else:
                    tail = f"{part.ptr}/items"
            sources.append((tl, tail))
        n_prefix = max([tl[1] for tl, _ in sources if tl is not None], default=0)
        node_ids = []
        for i in range(n_prefix + 1):
            conj = []
            for tl, tail in sources:
                if tl is not None and i < tl[1]:
                    conj.append(_Part(f"{tl[0]}/{i}"))
                elif tail is not None:
                    conj.append(_Part(tail))
            node_ids.append(self.node(conj) if conj else ANY_NODE)
        self.kids.setdefault(nid, []).extend(node_ids)
        p.arr_prefix_off[nid] = len(p.prefix_pool)
        p.arr_prefix_n[nid] = n_prefix
        p.prefix_pool.extend(node_ids[:n_prefix])
        p.arr_items[nid] = node_ids[n_prefix]
        # tighten maxItems when the items after the prefix are impossible
        if node_ids[n_prefix] == NEVER_NODE:
            mx = n_prefix
            for i in range(n_prefix):
                if node_ids[i] == NEVER_NODE:
                    mx = i
                    break
            p.arr_max[nid] = mx if p.arr_max[nid] < 0 else min(p.arr_max[nid], mx)
        if (p.arr_max[nid] >= 0 and p.arr_min[nid] > p.arr_max[nid]) or p.arr_min[nid] > COUNT_CAP:
            p.arr_min[nid] = min(p.arr_min[nid], COUNT_CAP)
            p.types[nid] &= ~T_ARR

    def _fill_object(self, nid, flat):
        p = self.p
        props = {}         # name -> list of parts
        patterns = []      # (regex, part pointer)
        required = set()
        additional_sources = []   # per source: (declared names set, pattern list, additional ptr or None)
        deps = []                 # (property, [properties it requires])
        name_dfas = []
        for part, sch in flat:
            ex = part.excl
            names = set()
            pats = []
            if "properties" in sch and "properties" not in ex:
                pr = sch["properties"]
                if not isinstance(pr, dict):
                    raise SchemaError(f"properties at {part.ptr} is not an object")
                for k in pr:
                    props.setdefault(k, [])
                    names.add(k)
            if "patternProperties" in sch and "patternProperties" not in ex:
                for k in sch["patternProperties"]:
                    pats.append((k, f"{part.ptr}/patternProperties/{_escape_ptr(k)}"))
            if "required" in sch and "required" not in ex:
                req = sch["required"]
                if isinstance(req, list):
                    required.update(req)
                elif isinstance(req, bool) and self.draft <= 3:
                    pass
                else:
                    raise SchemaError(f"required at {part.ptr} is not a list")
            if "minProperties" in sch and "minProperties" not in ex:
                p.obj_min[nid] = max(p.obj_min[nid], _nonneg_int(sch["minProperties"], part.ptr, "minProperties"))
            if "maxProperties" in sch and "maxProperties" not in ex:
                v = min(_nonneg_int(sch["maxProperties"], part.ptr, "maxProperties"), COUNT_CAP)
                p.obj_max[nid] = v if p.obj_max[nid] < 0 else min(p.obj_max[nid], v)
            addl = None
            if "additionalProperties" in sch and "additionalProperties" not in ex:
                addl = f"{part.ptr}/additionalProperties"
            additional_sources.append((part, names, pats, addl))
            for dk in ("dependencies", "dependentRequired"):
                if dk in sch and dk not in ex:
                    for name, dv in sch[dk].items():
                        if isinstance(dv, dict) and set(dv) - ANNOTATIONS <= {"required"}:
                            dv = dv.get("required", [])
                        if not isinstance(dv, list):
                            continue  # schema dependencies were rewritten in expand()
                        deps.append((name, list(dv)))
            if "propertyNames" in sch and "propertyNames" not in ex:
                name_dfas.append(self._names_dfa(f"{part.ptr}/propertyNames", nid))
            patterns.extend(pats)
        for k in required:
            props.setdefault(k, [])
        for k, ks in deps:
            props.setdefault(k, [])
            for k2 in ks:
                props.setdefault(k2, [])
        names = sorted(props)
        if len(names) > 64 * 8:
            raise GrammarLimitError(f"object with {len(names)} declared properties")

        def value_parts(key_name, matched_patterns):
            """Conjunction for a key: per source its property, matching patterns, else additional."""
            conj = []
            for part, src_names, pats, addl in additional_sources:
                hit = False
                if key_name is not None and key_name in src_names:
                    conj.append(_Part(f"{part.ptr}/properties/{_escape_ptr(key_name)}"))
                    hit = True
                for (rx, pptr) in pats:
                    if rx in matched_patterns:
                        conj.append(_Part(pptr))
                        hit = True
                if not hit and addl is not None:
                    conj.append(_Part(addl))
            return conj

        pattern_list = sorted(set(rx for rx, _ in patterns))
        pattern_dfas = [self._pattern(rx, "patternProperties", nid=nid) for rx in pattern_list]
        # a pattern the engines read differently also runs in "either" mode: a key one engine
        # matches and the other does not is refused (its value schema would be ambiguous)
        either_dfas = [(j, self._pattern(rx, "patternProperties", mode="either"))
                       for j, rx in enumerate(pattern_list) if regex_sensitive(rx)]

        def hits(d, name):
            st = d.run(name.encode("utf-8"))
            return st >= 0 and d.accept[st] >= 0

        def matched(name):
            out = set()
            for rx, d in zip(pattern_list, pattern_dfas):
                if hits(d, name):
                    out.add(rx)
            for j, d in either_dfas:
                if hits(d, name) and pattern_list[j] not in out:
                    return None
            return frozenset(out)

        # key classes: declared names first
        classes = {}     # (prop index or -1, frozenset patterns) -> class id
        cls_prop, cls_node = [], []

        def class_id(pidx, pats):
            key = (pidx, pats)
            if key not in classes:
                name = names[pidx] if pidx >= 0 else None
                node = NEVER_NODE if pats is None else self.node(value_parts(name, pats))
                classes[key] = len(cls_prop)
                cls_prop.append(pidx)
                cls_node.append(node)
            return classes[key]

        name_labels = []
        for i, k in enumerate(names):
            name_labels.append(class_id(i, matched(k)))
        if not pattern_dfas and not name_dfas:
            key_dfa = literal_dfa([k.encode("utf-8") for k in names], labels=name_labels,
                                  other_label=class_id(-1, frozenset()))
            return self._finish_object(nid, key_dfa, names, cls_prop, cls_node, required, name_labels, deps)
        # product DFA: names trie x patterns x propertyNames
        trie = literal_dfa([k.encode("utf-8") for k in names], labels=list(range(len(names)))) \
            if names else _dead_dfa()
        comps = [trie] + pattern_dfas + [d for _, d in either_dfas] + name_dfas
        n_pat = len(pattern_dfas)
        n_either = len(either_dfas)
        complete = [True] * (1 + n_pat + n_either) + [False] * len(name_dfas)

        def combine(labels):
            for j in range(1 + n_pat + n_either, len(labels)):
                if labels[j] < 0:
                    return -1
            if labels[0] >= 0:
                return name_labels[labels[0]]
            for (j, _), lab in zip(either_dfas, labels[1 + n_pat:1 + n_pat + n_either]):
                if lab >= 0 and labels[1 + j] < 0:
                    return -1    # one engine matches the key, the other does not: refused
            pats = frozenset(rx for rx, lab in zip(pattern_list, labels[1:1 + n_pat]) if lab >= 0)
            return class_id(-1, pats)

        key_dfa = product_dfa(comps, combine, complete)
        return self._finish_object(nid, key_dfa, names, cls_prop, cls_node, required, name_labels, deps)

    def _finish_object(self, nid, key_dfa, names, cls_prop, cls_node, required, name_labels, deps=()):
        p = self.p
        # classes whose value schema is impossible are not valid keys
        acc_in = key_dfa.accept.tolist()
        acc = [a if (a >= 0 and cls_node[a] != NEVER_NODE) else -1 for a in acc_in]
        key_dfa = prune_dfa_keep(key_dfa if acc == acc_in else key_dfa.relabel(acc, trim=False))
        nwords = max(1, (len(names) + 63) // 64)
        reach, other = _reach_sets(key_dfa, cls_prop, nwords)
        cls_base = len(p.cls_prop)
        self.kids.setdefault(nid, []).extend(cls_node)
        p.cls_prop.extend(cls_prop)
        p.cls_node.extend(cls_node)
        if cls_base:
            key_dfa = key_dfa.relabel([a + cls_base if a >= 0 else -1 for a in key_dfa.accept.tolist()])
        p.obj_key_dfa[nid] = p.add_dfa(key_dfa, reach, other)
        p.obj_nwords[nid] = nwords
        req_words = [0] * nwords
        for k in required:
            i = names.index(k)
            if cls_node[name_labels[i]] == NEVER_NODE:
                p.types[nid] &= ~T_OBJ  # a required property can never be valid
            req_words[i // 64] |= 1 << (i % 64)
        p.obj_req_off[nid] = len(p.words)
        p.words.extend(req_words)
        p.obj_dep_off[nid] = len(p.dep_pool) // 2
        p.obj_dep_n[nid] = len(deps)
        for k, ks in deps:
            w = [0] * nwords
            for k2 in ks:
                i = names.index(k2)
                w[i // 64] |= 1 << (i % 64)
            p.dep_pool.extend([names.index(k), len(p.words)])
            p.words.extend(w)
        p.obj_other_ok[nid] = 1 if any(other) else 0
        if (p.obj_max[nid] >= 0 and p.obj_min[nid] > p.obj_max[nid]) or p.obj_min[nid] > COUNT_CAP:
            p.obj_min[nid] = min(p.obj_min[nid], COUNT_CAP)
            p.types[nid] &= ~T_OBJ
        if p.obj_max[nid] >= 0 and len(required) > p.obj_max[nid]:
            p.types[nid] &= ~T_OBJ

    def _names_dfa(self, ptr, nid):
        """propertyNames: a string-only schema made of pattern/enum/const/format/type/maxLength-free parts."""
        sch = self.get(ptr)
        if sch is True or sch == {}:
            return _all_dfa()
        if sch is False:
            return _dead_dfa()
        flat = self.expand([_Part(ptr)])
        if flat is None:
            return _dead_dfa()
        dfas = []
        for part, s in flat:
            for k in s:
                if k in ANNOTATIONS or k in part.excl:
                    continue
                if k == "type":
                    if s[k] != "string" and "string" not in (s[k] if isinstance(s[k], list) else []):
                        return _dead_dfa()
                elif k == "pattern":
                    dfas.append(self._pattern(s[k], f"{part.ptr}/pattern", nid=nid))
                elif k in ("enum", "const"):
                    vals = s[k] if k == "enum" else [s[k]]
                    dfas.append(literal_dfa(sorted({v.encode("utf-8") for v in vals if isinstance(v, str)}))
                                if any(isinstance(v, str) for v in vals) else _dead_dfa())
                elif k == "format":
                    if s[k] in ENFORCED_FORMATS:
                        dfas.append(self._format(s[k], f"{part.ptr}/format"))
                        if s[k] in NARROWED_FORMATS:
                            self.approx.add(nid)
                    elif s[k] in UNENFORCED_STANDARD_FORMATS:
                        raise UnsupportedSchemaError(f"format {s[k]!r} in propertyNames", keyword="format",
                                                     pointer=f"{part.ptr}/format")
                elif k == "maxLength" or k == "minLength":
                    n = _nonneg_int(s[k], part.ptr, k)
                    if n > 1000:
                        raise GrammarLimitError(f"{k} {n} inside propertyNames at {part.ptr}: the key "
                                                "automaton counts at most 1000 code points")
                    any_cp = ("set", cs_norm([(0, MAX_CP)]))
                    ast = ("rep", any_cp, n, None) if k == "minLength" else ("rep", any_cp, 0, n)
                    nfa = NFA()
                    a, b = nfa.new(), nfa.new()
                    nfa.build(ast, a, b)
                    dfas.append(nfa_to_dfa(nfa, a, b))
                elif k in SUPPORTED:
                    raise UnsupportedSchemaError(f"keyword {k!r} inside propertyNames", keyword=k,
                                                 pointer=f"{part.ptr}/{k}")
        if not dfas:
            return _all_dfa()
        return intersect_dfas(dfas)


def _reach_sets(d, cls_prop, nwords):
    """Per state: bitset of declared properties reachable, and whether another valid key is.
    (Memoised on the DFA object: the same key automaton recurs with the same classes.)"""
    key = (tuple(cls_prop), nwords)
    cache = d.__dict__.setdefault("_reach", {})
    if key not in cache:
        cache[key] = _reach_sets_uncached(d, cls_prop, nwords)
    return cache[key]


def _reach_sets_uncached(d, cls_prop, nwords):
    n = d.n
    src, dst = _edges(d)
    succ = [[] for _ in range(n)]
    for s_, t_ in zip(src.tolist(), dst.tolist()):
        succ[s_].append(t_)
    reach = [0] * n
    other = [0] * n
    for s_, a in enumerate(d.accept.tolist()):
        if a >= 0:
            if cls_prop[a] >= 0:
                reach[s_] |= 1 << cls_prop[a]
            else:
                other[s_] = 1
    # tries (and most key automata) only step forward or loop: one backward pass is exact
    forward = not len(src) or bool((dst >= src).all())
    changed = True
    while changed:
        changed = False
        for s_ in range(n - 1, -1, -1):
            r, o = reach[s_], other[s_]
            for t_ in succ[s_]:
                r |= reach[t_]
                o |= other[t_]
            if r != reach[s_] or o != other[s_]:
                reach[s_], other[s_] = r, o
                changed = True
        if forward:
            break
    if nwords == 1:
        words = [[r] for r in reach]
    else:
        words = [[(r >> (64 * w)) & 0xFFFFFFFFFFFFFFFF for w in range(nwords)] for r in reach]
    return words, other


def _const_schema(v):
    if isinstance(v, dict):
        return {"type": "object", "properties": {k: _const_schema(x) for k, x in v.items()},
                "required": list(v), "additionalProperties": False}
    if isinstance(v, list):
        return {"type": "array", "prefixItems": [_const_schema(x) for x in v], "items": False,
                "minItems": len(v)}
    return {"const": v}


def _value_type_bit(v):
    if v is None:
        return T_NULL
    if v is True:
        return T_TRUE
    if v is False:
        return T_FALSE
    if isinstance(v, int):
        return T_INT
    if isinstance(v, float):
        return T_INT if v.is_integer() else T_NUM
    if isinstance(v, str):
        return T_STR
    if isinstance(v, list):
        return T_ARR
    if isinstance(v, dict):
        return T_OBJ
    return 0


def _is_schema(v):
    return isinstance(v, (dict, bool))


def _check_values(sch, ptr, draft):
    """The shape of each keyword's value (a malformed value is a SchemaError naming the keyword,
    the pointer, what was expected and what was found -- never a bare Python exception)."""
    def bad(k, expected, v):
        raise SchemaError(f"{k} at {ptr} must be {expected}, found {type(v).__name__} {_short(v)}")

    def names(k, v):
        if not isinstance(v, list):
            bad(k, "a list of property names", v)
        for i, x in enumerate(v):
            if not isinstance(x, str):
                raise SchemaError(f"{k} at {ptr}: entry {i} must be a property name (string), "
                                  f"found {type(x).__name__} {_short(x)}")

    for k, v in sch.items():
        if k == "required":
            if isinstance(v, bool) and draft <= 3:
                continue
            names(k, v)
        elif k == "dependentRequired":
            if not isinstance(v, dict):
                bad(k, "an object of property-name lists", v)
            for name, dv in v.items():
                names(f"{k}/{name}", dv)
        elif k == "dependencies":
            if not isinstance(v, dict):
                bad(k, "an object", v)
            for name, dv in v.items():
                if isinstance(dv, list):
                    names(f"{k}/{name}", dv)
                elif not _is_schema(dv):
                    bad(f"{k}/{name}", "a list of property names or a schema", dv)
        elif k in ("dependentSchemas", "properties", "patternProperties", "$defs", "definitions"):
            if not isinstance(v, dict):
                bad(k, "an object", v)
        elif k == "prefixItems" or k in ("allOf", "anyOf", "oneOf", "enum"):
            if not isinstance(v, list):
                bad(k, "a list", v)
        elif k == "items":
            if not (_is_schema(v) or isinstance(v, list)):
                bad(k, "a schema or a list of schemas", v)
        elif k in ("additionalItems", "additionalProperties", "propertyNames", "not", "if", "then",
                   "else", "contains"):
            if not _is_schema(v):
                bad(k, "a schema (an object or a boolean)", v)
        elif k in ("pattern", "format", "$ref"):
            if not isinstance(v, str):
                bad(k, "a string", v)
        elif k == "type":
            for x in (v if isinstance(v, list) else [v]):
                if not isinstance(x, (str, dict)):
                    bad(k, "a type name or a list of type names", v)


def _short(v):
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _nonneg_int(v, ptr, kw):
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise SchemaError(f"{kw} at {ptr} must be a non-negative integer, found {v!r}")
    return v


# ============================================================================
# public API

def compile_program(schema):
    if not isinstance(schema, (dict, bool)):
        raise SchemaError(f"a schema must be an object or a boolean, found {type(schema).__name__}")
    c = Compiler(schema)
    try:
        root = c.node([_Part("#")])
    except RecursionError:
        raise GrammarLimitError("schema nesting too deep to compile") from None
    c.check_oneof()
    c.p.root = root
    return c.p.finish()


_NAME_RE = re.compile(r"[A-Za-z0-9_.\-:]+")


NODE_FIELDS = ("kind", "types", "str_min", "str_max", "str_dfa", "num_dfa", "num_check", "int_lo", "int_hi",
               "int_flags", "arr_prefix_off", "arr_prefix_n", "arr_items", "arr_min", "arr_max", "arr_unique",
               "obj_key_dfa", "obj_nwords", "obj_req_off", "obj_min", "obj_max", "obj_other_ok", "obj_dep_off",
               "obj_dep_n", "alt_off",
               "alt_n", "oneof", "starts")

_FRAGMENTS = {}


def _canonical(params):
    return json.dumps(params, sort_keys=True, separators=(",", ":"))


def _fragment(params):
    """The compiled program of one tool's parameters (cached by canonical JSON)."""
    key = _canonical(params)
    hit = _FRAGMENTS.get(key)
    if hit is None:
        hit = compile_program(params)
        if len(_FRAGMENTS) > 512:
            _FRAGMENTS.clear()
        _FRAGMENTS[key] = hit
    return hit


# linking: per fragment, tables stacked into a few int64 matrices, relocated row by row
_POOL_FIELDS = ("prefix_pool", "alt_pool", "cls_prop", "cls_node", "dep_pool")
_STATE_FIELDS = ("accept", "label_is_class", "reach_off", "other", "dfa_row", "dfa_cmap")
_SIZE_KEYS = ("nodes", "dfa", "words", "cls", "prefix", "alt", "checks", "deps", "trans", "classes")
# node fields -> what they point into (relocated by that table's base in each fragment)
_NODE_RELOC = {"arr_items": "node", "str_dfa": "dfa", "num_dfa": "dfa", "obj_key_dfa": "dfa",
               "num_check": "checks", "arr_prefix_off": "prefix", "alt_off": "alt",
               "obj_req_off": "words", "obj_dep_off": "deps"}


def _packed(f):
    """A fragment's tables as NumPy arrays, made once (linking then only adds offsets)."""
    pk = getattr(f, "_packed", None)
    if pk is None:
        n = len(f.kind)
        pk = {"nodes": np.array([getattr(f, name) for name in NODE_FIELDS], dtype=np.int64)
              .reshape(len(NODE_FIELDS), n),
              "states": np.array([getattr(f, name) for name in _STATE_FIELDS], dtype=np.int64)
              .reshape(len(_STATE_FIELDS), len(f.accept))}
        for name in _POOL_FIELDS:
            pk[name] = np.asarray(getattr(f, name), dtype=np.int64)
        pk["words"] = np.asarray(f.words, dtype=np.uint64)
        pk["dfa_trans"] = np.asarray(f.dfa_trans, dtype=np.int32)
        pk["dfa_classes"] = np.asarray(f.dfa_classes, dtype=np.uint8)
        pk["byte_class"] = f.byte_classes()[0]
        pk["sizes"] = (n, len(f.accept), len(f.words), len(f.cls_prop), len(f.prefix_pool), len(f.alt_pool),
                       len(f.num_checks), len(f.dep_pool) // 2, len(pk["dfa_trans"]), len(pk["dfa_classes"]))
        f._packed = pk
    return pk


def link_programs(frags):
    """Concatenate compiled programs into one; returns (program, root node of each fragment,
    first automaton state of each fragment).

    Each fragment's nodes 0 (ANY) and 1 (NEVER) map onto the shared ones of the first
    fragment; everything else is relocated by its fragment's bases - node ids, automaton
    states, word offsets, key classes, pools, checks - in a few whole-array operations.
    """
    pks = [_packed(f) for f in frags]
    sizes = np.array([pk["sizes"] for pk in pks], dtype=np.int64)      # [fragments, kinds]
    col = {k: i for i, k in enumerate(_SIZE_KEYS)}
    drop = np.where(sizes[:, 0] > 0, 2, 0)
    drop[0] = 0                               # the first fragment provides ANY and NEVER
    kept = sizes[:, 0] - drop
    base = np.cumsum(sizes, axis=0) - sizes   # [fragments, kinds]: where each fragment starts
    node_shift = (np.cumsum(kept) - kept) - drop   # id in fragment + shift = linked id
    bases = {k: base[:, i] for k, i in col.items()}
    bases["node"] = node_shift

    def per(what, count_kind):
        """Each element's fragment base for `what`, over a table sized by count_kind."""
        counts = kept if count_kind == "nodes" else sizes[:, col[count_kind]]
        return np.repeat(bases[what], counts)

    def node_ref(x, shift):
        return np.where(x >= 2, x + shift, x)

    nodes = np.concatenate([pk["nodes"][:, d:] for pk, d in zip(pks, drop.tolist())], axis=1)
    for name, what in _NODE_RELOC.items():
        i = NODE_FIELDS.index(name)
        rep = per(what, "nodes")
        if what == "node":
            nodes[i] = node_ref(nodes[i], rep)
        elif what in ("dfa", "checks"):      # -1 = none
            nodes[i] = np.where(nodes[i] >= 0, nodes[i] + rep, nodes[i])
        else:
            nodes[i] += rep

    def cat(name):
        return np.concatenate([pk[name] for pk in pks])

    p = Program()
    for i, name in enumerate(NODE_FIELDS):
        setattr(p, name, nodes[i])
    p.prefix_pool = node_ref(cat("prefix_pool"), per("node", "prefix"))
    p.alt_pool = node_ref(cat("alt_pool"), per("node", "alt"))
    p.cls_prop = cat("cls_prop")
    p.cls_node = node_ref(cat("cls_node"), per("node", "cls"))
    p.words = cat("words")
    dep = cat("dep_pool").reshape(-1, 2)
    dep[:, 1] += per("words", "deps")
    p.dep_pool = dep.reshape(-1)
    t = cat("dfa_trans")
    p.dfa_trans = np.where(t >= 0, t + per("dfa", "trans").astype(np.int32), -1).astype(np.int32)
    p.dfa_classes = cat("dfa_classes")
    st = np.concatenate([pk["states"] for pk in pks], axis=1)
    acc, is_cls, reach_off, other, row, cmap = st
    p.accept = np.where((is_cls != 0) & (acc >= 0), acc + per("cls", "dfa"), acc)
    p.label_is_class = is_cls
    p.reach_off = np.where(reach_off >= 0, reach_off + per("words", "dfa"), reach_off)
    p.other = other
    p.dfa_row = row + per("trans", "dfa")
    p.dfa_cmap = cmap + per("classes", "dfa")
    p.num_checks = [chk for f in frags for chk in f.num_checks]
    p._fragment_classes = np.concatenate([pk["byte_class"] for pk in pks])
    roots = [int(f.root + sh) if f.root >= 2 else int(f.root) for f, sh in zip(frags, node_shift.tolist())]
    return p, roots, bases["dfa"].tolist()


def compile_tools_program(tools, max_calls=4):
    if not isinstance(tools, (list, tuple)):
        raise SchemaError("tools must be a list of {name, description, parameters}")
    if len(tools) > MAX_TOOLS:
        raise GrammarLimitError(f"{len(tools)} tools; at most {MAX_TOOLS} per grammar")
    if not isinstance(max_calls, int) or isinstance(max_calls, bool) or max_calls < 0:
        raise SchemaError(f"max_calls must be a non-negative integer, found {max_calls!r}")
    names = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or "name" not in t:
            raise SchemaError(f"tool #{i} has no name")
        n = t["name"]
        if not isinstance(n, str) or not _NAME_RE.fullmatch(n):
            raise SchemaError(f"tool #{i} name {n!r}: expected letters, digits, '_', '.', '-', ':'")
        if n in names:
            raise SchemaError(f"tool name {n!r} appears twice")
        names.append(n)
    frags = [_fragment(_params_of(t)) for t in tools] or [_fragment(True)]
    # tools are numbered in name order (labels of the name automaton, bits of the used-tools
    # set), so a reordered set reuses the same name automaton; it rides along as a last,
    # node-less fragment
    order = sorted(range(len(names)), key=names.__getitem__)
    names = [names[i] for i in order]
    tail = _tool_names_program(names, [frags[i].root for i in order])
    p, nodes, dfa_bases = link_programs(frags + [tail])
    p.tools_mode = 1
    p.max_calls = max_calls
    p.tool_names = names
    p.tool_nodes = np.asarray([nodes[i] for i in order], dtype=np.int64)
    p.tool_dfa = dfa_bases[-1]
    p.root = ANY_NODE
    return p.finish()


def _params_of(tool):
    params = tool.get("parameters")
    return {"type": "object"} if params is None else params


_TOOL_NAME_PROGRAMS = {}


def _tool_names_program(names, roots):
    """A node-less program holding the automaton of the tool names (label = tool index;
    reach sets over tools).  Tools whose parameters can never be valid cannot be named."""
    key = (tuple(names), tuple(r == NEVER_NODE for r in roots[:len(names)]))
    hit = _TOOL_NAME_PROGRAMS.get(key)
    if hit is not None:
        return hit
    q = Program()
    if names:
        trie = literal_dfa([n.encode() for n in names], labels=list(range(len(names))))
        if any(key[1]):
            acc = [a if (a >= 0 and not key[1][a]) else -1 for a in trie.accept.tolist()]
            trie = prune_dfa_keep(trie.relabel(acc, trim=False))
        reach, other = _reach_sets(trie, list(range(len(names))), 1)
        q.add_dfa(trie, reach, other)
    else:
        q.add_dfa(_dead_dfa(), [[0]], [0])
    q.label_is_class = [0] * len(q.accept)   # labels are tool indices, not key classes
    q.finish()
    if len(_TOOL_NAME_PROGRAMS) >= 256:
        _TOOL_NAME_PROGRAMS.clear()
    _TOOL_NAME_PROGRAMS[key] = q
    return q


def _runtime_module():
    try:
        from . import _runtime
        return _runtime
    except ImportError:  # pragma: no cover - the extension is part of the build
        return None


class Grammar:
    """A compiled grammar: ``start()`` a state, then feed bytes or whole token pieces."""

    def __init__(self, program, backend="cython"):
        self.program = program
        mod = _runtime_module() if backend == "cython" else None
        if mod is not None:
            self._impl = mod.CGrammar(program)
        else:
            from ..reference.grammar import ReferenceGrammar
            self._impl = ReferenceGrammar(program.pylists())
        self.backend = "cython" if mod is not None else "python"

    def start(self):
        return self._impl.start()

    def accepts(self, data):
        if isinstance(data, str):
            data = data.encode("utf-8")
        st = self.start()
        return st.feed(data) and st.is_complete()

    def allowed_tokens(self, state, piece_table):
        return self._impl.allowed_tokens(state, piece_table)

    def best_allowed(self, state, logits, piece_table, close_string=False):
        return self._impl.best_allowed(state, logits, piece_table, close_string)


def compile_schema(schema, backend="cython"):
    """Compile a JSON Schema (dict or bool) into a Grammar over its compact JSON values."""
    return Grammar(compile_program(schema), backend)


_TOOL_SETS = {}


def clear_caches():
    """Forget every memoised compile result (tool sets, per-tool fragments, tool-name,
    literal and pattern automata): the next compile starts cold.  For tests and benchmarks;
    results are identical either way."""
    for cache in (_TOOL_SETS, _FRAGMENTS, _TOOL_NAME_PROGRAMS, _LITERAL_DFAS, Compiler._pattern_cache):
        cache.clear()
    Compiler._start_program = None


def compile_tools(tools, max_calls=4, backend="cython"):
    """Grammar of a call list: ``[{"name":..,"arguments":..},...]`` or ``[]``.

    A grammar is immutable (states are separate objects), so the grammar of a tool set
    seen before is returned from a small cache; new sets link cached per-tool fragments.
    """
    # the grammar depends on the names and parameters only (descriptions are free to vary);
    # keys are canonical JSON, so a dict mutated after a compile is a new key
    try:
        key = (_canonical([[t["name"], _params_of(t)] for t in tools]), max_calls, backend)
    except (TypeError, ValueError, KeyError, AttributeError):
        key = None
    if key is not None and key in _TOOL_SETS:
        return _TOOL_SETS[key]
    g = Grammar(compile_tools_program(tools, max_calls), backend)
    if key is not None:
        if len(_TOOL_SETS) >= 64:
            _TOOL_SETS.pop(next(iter(_TOOL_SETS)))
        _TOOL_SETS[key] = g
    return g
