"""The regex dialect (``pattern``, ``patternProperties``): a parser of the supported subset and
its compilation to a byte automaton over UTF-8, in one of two dialect modes.

The dialect is ECMA-262 with the ``u`` flag and Python ``re`` (what ``jsonschema`` runs)
together; ``regex_dfa`` explains the two modes, ``needle_cy.grammar``'s docstring lists the
subset."""
from __future__ import annotations

import re

from ..errors import GrammarLimitError, UnsupportedSchemaError
from .automata import NFA, nfa_to_dfa
from .charset import DOT_EITHER, DOT_RANGES, class_ranges, cs_complement, cs_norm

# ============================================================================
# regex subset parser -> AST
# AST: ("set", ranges) | ("cat", [..]) | ("alt", [..]) | ("rep", node, lo, hi|None)
#      | ("eps",) | ("bol",) | ("eol",)   (an anchor inside the pattern, see _anchored_nfa)


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
        self.inner_anchor = False   # a '^' or '$' inside the pattern (see _anchored_nfa)

    def error(self, what):
        raise _RegexUnsupported(f"{what} at offset {self.i} in pattern {self.s!r}")

    def peek(self):
        return self.s[self.i] if self.i < len(self.s) else None

    def parse_top(self):
        """Returns a list of (anchored_start, ast, anchored_end) top-level alternatives."""
        alts = []
        while True:
            inner = self._whole_group_branch()
            if inner is not None:
                # a branch that is one group, "(^a$)|...": the group's own alternatives are
                # top-level ones (grouping changes nothing), anchors at their ends included
                sub = _RegexParser(inner, self.mode)
                alts.extend(sub.parse_top())
                self.sensitive |= sub.sensitive
                self.dollar |= sub.dollar
                self.inner_anchor |= sub.inner_anchor
                if self.peek() == "|":
                    self.i += 1
                    continue
                return alts
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

    def _whole_group_branch(self):
        """The text inside a capturing or (?:...) group that makes up the whole top-level
        branch starting here (the group is followed by "|" or the end), else None."""
        s, i = self.s, self.i
        if i >= len(s) or s[i] != "(":
            return None
        body = i + 1
        if s.startswith("?:", body):
            body += 2
        elif s.startswith("?", body):
            return None           # look-around, flags, named groups: left to the parser
        depth, j, in_class = 0, i, False
        while j < len(s):
            c = s[j]
            if c == "\\":
                j += 2
                continue
            if in_class:
                if c == "]":
                    in_class = False
            elif c == "[":
                in_class = True
                if s.startswith("]", j + 1) or s.startswith("^]", j + 1):
                    return None
            elif c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        if j >= len(s) or (j + 1 < len(s) and s[j + 1] != "|"):
            return None
        if "^" not in s[body:j] and "$" not in s[body:j]:
            return None           # no anchor inside: the group parses as it is (a smaller automaton)
        self.i = j + 1
        return s[body:j]

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
                self.dollar = True   # Python's '$' also matches before a final newline
            if c in "^$":
                # an anchor inside the pattern ("($|/)", "(^|,)"): an assertion on the
                # position, kept in the automaton by _anchored_nfa; it cannot be repeated
                self.i += 1
                self.inner_anchor = True
                if self.peek() in ("*", "+", "?", "{"):
                    self.error(f"quantifier after {c!r}")
                items.append(("bol",) if c == "^" else ("eol",))
                continue
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
    if parser.inner_anchor:
        nfa.asserts = []
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
    if parser.inner_anchor:
        nfa, s, t = _anchored_nfa(nfa, s, t, python_dollar=(mode == "either"))
    return nfa_to_dfa(nfa, s, t), (2 if parser.sensitive else 1 if parser.dollar else 0)


# position monitor of _anchored_nfa: (at the start, end state); end state NONE: more text may
# follow, ENDED: none may, NL: exactly one "\n" must (Python's '$' before a final newline)
_NONE, _ENDED, _NL = 0, 1, 2


def _anchored_nfa(nfa, start, final, python_dollar):
    """The NFA whose anchors ('bol'/'eol' assertion edges, ``nfa.asserts``) hold: its states
    paired with a monitor of the position.  '^' passes only before the first byte; '$' passes
    anywhere and then no byte may follow (ECMA-262: the end of the input) -- or, for
    ``python_dollar`` (Python's reading, the "either" mode), no byte or exactly a final
    newline.  ECMA's matches are Python's too, so the "both" mode (ECMA's '$') accepts only
    what both engines match, and the two differ only on strings ending in a newline."""
    out = NFA()
    index = {}
    asserts = {}
    for a, b, kind in nfa.asserts:
        asserts.setdefault(a, []).append((b, kind))

    def state(q, at0, end):
        key = (q, at0, end)
        sid = index.get(key)
        if sid is None:
            sid = index[key] = out.new()
            todo.append(key)
        return sid

    todo = []
    s0 = state(start, True, _NONE)
    t_out = out.new()
    while todo:
        q, at0, end = key = todo.pop()
        sid = index[key]
        if q == final and end != _NL:
            out.eps[sid].append(t_out)
        for r in nfa.eps[q]:
            out.eps[sid].append(state(r, at0, end))
        for lo, hi, r in nfa.edges[q]:
            if end == _NONE:
                out.edges[sid].append((lo, hi, state(r, False, _NONE)))
            elif end == _NL and lo <= 10 <= hi:
                out.edges[sid].append((10, 10, state(r, False, _ENDED)))
        for r, kind in asserts.get(q, ()):
            if kind == "bol":
                if at0:
                    out.eps[sid].append(state(r, at0, end))
            elif end != _NONE:
                out.eps[sid].append(state(r, at0, end))
            else:
                out.eps[sid].append(state(r, at0, _ENDED))
                if python_dollar:
                    out.eps[sid].append(state(r, at0, _NL))
        if len(out.eps) > 400000:
            raise GrammarLimitError("pattern automaton too large")
    return out, s0, t_out

