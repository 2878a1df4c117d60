"""The negation gate: calls that do the opposite of what was asked are held back.

A small model maps "Cancel my 7am alarm" to ``set_alarm`` and "remove eggs from the
shopping list" to ``add_to_shopping_list``: the tool the words point at, doing the
opposite of what the person wants.  Grammar and grounding cannot see this (the call is
valid and its values were said), so after decoding each call is checked against the
clause of the request it came from (spec §8.2 ``validation.negation``):

* an **undo** word ("cancel", "remove", "delete", "undo", "unset", "dismiss", "erase")
  negates a call whose tool does not itself undo (no such word, nor "stop", "off",
  "clear", "disable", "reset", "end", in its name: "cancel the vacuum" may be
  ``stop_vacuum``);
* a **negated imperative** ("don't", "do not", "never", "no need to", "never mind")
  negates any call ("don't forget to …" asks for the thing, so it does not count).

A call's clause is the clause of the request (split like retrieval's multi-intent
clauses) that holds a word of the call's tool name or of its string values; a cue that
lies inside one of the call's own string values is what the person wants *said*
("tell the kids don't forget your keys"), not an instruction, unless the value is the
cue alone (a label "Cancel" is the model copying the instruction).
"""
from __future__ import annotations

import re

from .retrieval import request_clauses

__all__ = ["negated_calls"]

_UNDO = re.compile(r"\b(cancel(?:l?ed|l?ing)?|remove[sd]?|removing|delete[sd]?|deleting|undo|unset|"
                   r"dismiss|erase)\b")
_UNDOING_TOOL = {"cancel", "remove", "delete", "undo", "unset", "dismiss", "erase", "stop", "off",
                 "clear", "disable", "reset", "end", "unlock"}
_NEGATED = re.compile(r"\b(?:don'?t|do not|never|no need to|never mind)\b(?!\s+(?:let me\s+)?forget)")
_LITTLE = {"a", "an", "the", "to", "of", "and", "or", "in", "on", "for", "from", "with", "at", "my",
           "set", "get"}


def _string_values(value, out):
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, dict):
        for v in value.values():
            _string_values(v, out)
    elif isinstance(value, list):
        for v in value:
            _string_values(v, out)
    return out


def _words(text):
    return {w for w in re.split(r"[^0-9a-z']+", text.lower()) if w and w not in _LITTLE}


def _outside(cue, clause, values):
    """True when the cue match in ``clause`` is not inside one of ``values`` (a value that
    is nothing but the cue does not shelter it)."""
    for v in values:
        lv = v.lower()
        if lv.strip(" .!?") == cue.group(0):
            continue
        start = clause.find(lv)
        while start >= 0:
            if start <= cue.start() and cue.end() <= start + len(lv):
                return False
            start = clause.find(lv, start + 1)
    return True


def negated_calls(request: str, calls) -> list:
    """Indices of the ``calls`` (``{"name", "arguments"}`` dicts) that ``request`` negates."""
    if not request or not calls:
        return []
    request = request.replace("\u2019", "'")          # a typographic apostrophe
    clauses = [c.lower() for c in request_clauses(request)] or [request.lower()]
    out = []
    for i, call in enumerate(calls):
        name = str(call.get("name") or "")
        tool_words = {w for w in re.split(r"[^0-9a-z]+", name.lower()) if w}
        values = _string_values(call.get("arguments") or {}, [])
        evidence = (tool_words - _LITTLE).union(*(_words(v) for v in values))
        for clause in clauses:
            if not (_words(clause) & evidence):
                continue
            cues = list(_NEGATED.finditer(clause))
            if not (tool_words & _UNDOING_TOOL):
                cues += list(_UNDO.finditer(clause))
            if any(_outside(m, clause, values) for m in cues):
                out.append(i)
                break
    return out
