"""Value grounding: string arguments are written from what was said.

The grammar makes a call *valid*; it cannot make it *true*.  A small model that has
picked the right tool still tends to invent a free string (``"query": "Cairo"`` for
"play Fleetwood Mac") or pick a neighbouring enum member (``"garage"`` for "hallway
light off").  Grounding is a decoder policy on top of the grammar, applied inside the
call block only:

* a **free string** value (``type: string`` with no ``enum``, ``const``, ``pattern`` or
  ``format``) must be a span of the *sources*: the user's messages of the conversation
  and the tool results being answered, compared as the exact bytes of their JSON
  encoding (so a copied quote is ``\\"``, as the grammar writes it);
* an **enum string** value must be one of the members the sources *mention* (the
  member's text, case-insensitive, starting at a word start: "Saturday" mentions
  ``sat``), when they mention any; an array of such members that requires unique items
  is not extended once the mentioned members are used up.

It never decides alone: at each step the model's best token that the grammar allows
*and* grounding accepts is taken; when no such token exists (the value the person said
is not a string the schema accepts, a ``maxLength`` cut, an escape the model writes
differently), the step falls back to the grammar alone.  So grounding cannot create a
dead end, and a turn decoded with it is still exactly as schema-valid.

``ValueGrounder`` follows the bytes of the call array with a small JSON path scanner
(which call, which tool, which property, which array item) and resolves the schema of
each value from the tools' grammar schemas.  ``mask`` proposes the tokens that can
continue the string being written (a dictionary lookup per source position, no scan of
the vocabulary); ``accepts`` is the exact check of one token's bytes, escapes and all.
"""
from __future__ import annotations

import json
import re

__all__ = ["ValueGrounder", "GroundingIndex", "value_rule", "mentioned_members"]

_WS = b" \t\r\n"
_MAX_PIECE = 32            # longest continuation looked up per source position


def _json_bytes(text: str) -> bytes:
    """The bytes a JSON string literal holds for ``text`` (without the quotes)."""
    return json.dumps(text, ensure_ascii=False)[1:-1].encode("utf-8")


def _is_word_byte(b) -> bool:
    # ASCII letters and digits, apostrophes and hyphens inside words ("I'll",
    # "washing-up"), and every byte of a multi-byte UTF-8 character.
    return b >= 0x80 or 0x30 <= b <= 0x39 or 0x41 <= b <= 0x5A or 0x61 <= b <= 0x7A \
        or b in (0x27, 0x2D)


def _word_starts(src: bytes):
    """Positions in ``src`` where a copied span may begin: the first byte of a word."""
    return [i for i in range(len(src))
            if _is_word_byte(src[i]) and (i == 0 or not _is_word_byte(src[i - 1]))]


def _ends_word(src: bytes, end: int) -> bool:
    """A copied span may end before ``end``: after a word's last byte (or a closing
    bracket or percent sign), never after sentence punctuation or a space."""
    if end <= 0:
        return False
    last = src[end - 1]
    if not (_is_word_byte(last) or last in (0x29, 0x5D, 0x25)):
        return False
    return end == len(src) or not _is_word_byte(src[end]) or not _is_word_byte(last)


def mentioned_members(members, sources_lower: str):
    """The enum members whose text starts at a word start somewhere in the sources."""
    found = []
    for m in members:
        key = m.lower().strip()
        if key and re.search(r"(?<![0-9a-z])" + re.escape(key), sources_lower):
            found.append(m)
    return found


def value_rule(schema, sources_lower: str):
    """('copy',) | ('enum', members, unique) | None for a string value under ``schema``."""
    if not isinstance(schema, dict):
        return None
    if "enum" in schema:
        members = schema["enum"]
        if not isinstance(members, list) or not members or not all(isinstance(m, str) for m in members):
            return None
        said = mentioned_members(members, sources_lower)
        return ("enum", [_json_bytes(m) for m in said]) if said else None
    if any(k in schema for k in ("const", "format", "anyOf", "oneOf", "allOf", "not")):
        return None
    t = schema.get("type")
    if t == "string" or (isinstance(t, list) and "string" in t):
        return ("copy",)
    return None


class GroundingIndex:
    """The piece table arranged for continuation lookups (built once per vocabulary).

    ``plain[b]``: tokens whose bytes are exactly ``b`` and hold no quote or backslash;
    ``closing[b]``: tokens whose bytes are ``b`` (no quote or backslash) then a quote,
    then anything (the grammar and ``accepts`` judge the tail)."""

    def __init__(self, piece_table):
        plain, closing = {}, {}
        for tid, piece in enumerate(piece_table):
            if not piece:
                continue
            q = piece.find(b'"')
            head = piece if q < 0 else piece[:q]
            if b"\\" in head:
                continue
            (plain if q < 0 else closing).setdefault(head, []).append(tid)
        self.plain, self.closing = plain, closing
        self.size = len(piece_table)


class _Frame:
    __slots__ = ("kind", "schema", "key", "tool", "used")

    def __init__(self, kind, schema):
        self.kind = kind        # "calls" | "call" | "object" | "array"
        self.schema = schema    # the container's schema (None: not grounded below)
        self.key = None         # object: the key whose value comes next
        self.tool = None        # call: the tool name once written
        self.used = []          # array: the enum members already written (uniqueItems)

    def clone(self):
        f = _Frame(self.kind, self.schema)
        f.key, f.tool, f.used = self.key, self.tool, list(self.used)
        return f


class ValueGrounder:
    """Follows one call block's bytes and judges tokens against the grounding rules."""

    def __init__(self, tools, sources, index: GroundingIndex):
        # tools: {name: parameters schema (refs inlined)}; sources: texts said so far.
        self.tools = tools
        self.index = index
        self.sources = [_json_bytes(s) for s in sources if s]
        self._starts = [frozenset(_word_starts(src)) for src in self.sources]
        self.sources_lower = "\n".join(s.lower() for s in sources if s)
        self._rules = {}
        self.reset()

    # ----------------------------------------------------------------- state
    def reset(self):
        self.stack = []
        self.mode = "value"      # value | key | colon | after
        self.in_str = False
        self.str_key = False
        self.buf = b""
        self.esc = 0             # 0, 1 after a backslash, 2..5 inside \\uXXXX
        self.rule = None         # the rule of the string value being written

    def clone(self):
        g = ValueGrounder.__new__(ValueGrounder)
        g.tools, g.index, g.sources, g.sources_lower, g._rules, g._starts = (
            self.tools, self.index, self.sources, self.sources_lower, self._rules, self._starts)
        g.stack = [f.clone() for f in self.stack]
        g.mode, g.in_str, g.str_key, g.buf, g.esc, g.rule = (
            self.mode, self.in_str, self.str_key, self.buf, self.esc, self.rule)
        return g

    def _rule(self, schema):
        key = id(schema)
        hit = self._rules.get(key)
        if hit is None or hit[0] is not schema:
            hit = (schema, value_rule(schema, self.sources_lower))
            self._rules[key] = hit
        return hit[1]

    def _child(self):
        """(kind of a container opened here, its schema) for the value that comes next."""
        if not self.stack:
            return "calls", None
        top = self.stack[-1]
        if top.kind == "calls":
            return "call", None
        if top.kind == "call":
            if top.key == "arguments" and top.tool in self.tools:
                return "object", self.tools[top.tool]
            return "object", None
        schema = top.schema
        if not isinstance(schema, dict):
            return "object", None
        if top.kind == "object":
            props = schema.get("properties")
            sub = props.get(top.key) if isinstance(props, dict) and top.key is not None else None
        else:
            sub = schema.get("items")
        return "object", sub if isinstance(sub, dict) else None

    def _available(self, rule):
        """The enum members still open to the value being written."""
        members = rule[1]
        top = self.stack[-1] if self.stack else None
        if top is not None and top.kind == "array" and isinstance(top.schema, dict) \
                and top.schema.get("uniqueItems") is True:
            return [m for m in members if m not in top.used]
        return members

    # ------------------------------------------------------------- feeding
    def feed(self, data: bytes, stop_early=False) -> bool:
        """Advance over ``data``; False when a byte breaks a grounding rule.  The state
        follows every byte either way (a fallback token is tracked like any other), unless
        ``stop_early`` (used on throw-away clones) ends the walk at the first break."""
        ok = True
        for b in data:
            if not ok and stop_early:
                return False
            if self.in_str:
                ok = self._string_byte(b) and ok
                continue
            c = bytes((b,))
            if c in (b" ", b"\t", b"\r", b"\n"):
                continue
            if c == b'"':
                self.in_str, self.buf, self.esc = True, b"", 0
                self.str_key = self.mode == "key"
                self.rule = None
                if not self.str_key:
                    kind, schema = self._child()
                    self.rule = self._rule(schema) if kind == "object" and schema is not None else None
                    if self.rule is not None and self.rule[0] == "enum" and not self._available(self.rule):
                        ok = False
                continue
            if c in (b"[", b"{"):
                kind, schema = self._child()
                if c == b"[":
                    kind = "calls" if not self.stack else "array"
                elif kind != "call":
                    kind = "object"
                self.stack.append(_Frame(kind, schema))
                self.mode = "value" if c == b"[" else "key"
                continue
            if c in (b"]", b"}"):
                if self.stack:
                    self.stack.pop()
                self.mode = "after"
                continue
            if c == b":":
                self.mode = "value"
                continue
            if c == b",":
                top = self.stack[-1] if self.stack else None
                if top is not None and top.kind in ("array", "calls"):
                    self.mode = "value"
                    if top.kind == "array":
                        kind, schema = self._child()
                        rule = self._rule(schema) if schema is not None else None
                        if rule is not None and rule[0] == "enum" and not self._available(rule):
                            ok = False          # the mentioned members are used up
                else:
                    self.mode = "key"
                continue
            self.mode = "after"                   # inside a number or literal
        return ok

    def _string_byte(self, b) -> bool:
        if self.esc:
            self.buf += bytes((b,))
            if self.esc == 1:
                self.esc = 2 if b == 0x75 else 0          # \u then four hex digits
            else:
                self.esc = 0 if self.esc == 5 else self.esc + 1
            return self._value_ok(final=False)
        if b == 0x5C:                                       # backslash
            self.esc = 1
            self.buf += b"\\"
            return True                                     # judged with the next byte
        if b == 0x22:                                       # closing quote
            self.in_str = False
            ok = self._value_ok(final=True)
            self._close_string()
            return ok
        self.buf += bytes((b,))
        return self._value_ok(final=False)

    def _value_ok(self, final) -> bool:
        rule = self.rule
        if rule is None or self.str_key:
            return True
        if rule[0] == "copy":
            if final and not self.buf:
                return False         # an empty copy says nothing; only the fallback writes ""
            return any(True for _ in self._copy_ends(final))
        avail = self._available(rule)
        if final:
            return self.buf in avail
        return any(m.startswith(self.buf) for m in avail)

    def _copy_ends(self, final):
        """(source, end) of each place the value written so far is copied from: spans
        begin at a word start and, when ``final``, end at a word end."""
        buf, n = self.buf, len(self.buf)
        for src, starts in zip(self.sources, self._starts):
            if not buf:
                for p in starts:
                    yield src, p
                continue
            p = src.find(buf)            # C-speed search; long tool results stay cheap
            while p >= 0:
                if p in starts and (not final or _ends_word(src, p + n)):
                    yield src, p + n
                p = src.find(buf, p + 1)

    def _close_string(self):
        top = self.stack[-1] if self.stack else None
        if self.str_key:
            if top is not None:
                try:
                    top.key = json.loads(b'"' + self.buf + b'"')
                except ValueError:
                    top.key = None
            self.mode = "colon"
        else:
            if top is not None and top.kind == "call" and top.key == "name":
                try:
                    top.tool = json.loads(b'"' + self.buf + b'"')
                except ValueError:
                    top.tool = None
            if top is not None and top.kind == "array" and self.rule is not None and self.rule[0] == "enum":
                top.used.append(self.buf)
            self.mode = "after"
        self.rule = None

    # ------------------------------------------------------------- judging
    def accepts(self, piece: bytes) -> bool:
        return self.clone().feed(piece, stop_early=True)

    @property
    def constrained(self) -> bool:
        """True inside a grounded string value (where ``mask`` has an opinion)."""
        return self.in_str and not self.str_key and self.rule is not None

    def candidates(self):
        """Token ids that may continue the grounded string being written, or None when
        no proposal is made here (not in a grounded string, or mid-escape)."""
        if not self.constrained or self.esc:
            return None
        plain, closing = self.index.plain, self.index.closing
        buf = self.buf
        out = set()
        if self.rule[0] == "copy":
            for src, end in self._copy_ends(False):
                if buf and _ends_word(src, end):
                    out.update(closing.get(b"", ()))
                for k in range(1, min(_MAX_PIECE, len(src) - end) + 1):
                    chunk = src[end:end + k]
                    out.update(plain.get(chunk, ()))
                    if _ends_word(src, end + k):
                        out.update(closing.get(chunk, ()))
        else:
            for m in self._available(self.rule):
                if not m.startswith(buf):
                    continue
                rest = m[len(buf):]
                out.update(closing.get(rest, ()))
                for k in range(1, len(rest) + 1):
                    out.update(plain.get(rest[:k], ()))
        return out
