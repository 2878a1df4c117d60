"""The tool-name prior at decode: a prior over the catalogue's tools (the retrieval
ranker's, ``needle_cy.retrieval.name_prior``) multiplies the model's choice of the tool
name it writes, in the call block and where a ``<think>`` note line begins a name.

``run_turn`` (``needle_cy.generate``) asks it for the biased logits of each constrained
step and, in the notes, for the token to write; the grammar still chooses only among the
tokens it allows, so no name outside the catalogue can come out.
"""
from __future__ import annotations

import json
import math

import numpy as np

from .grounding import GroundingIndex

__all__ = ["NamePrior"]


class NamePrior:
    """A prior over the tools, applied to the tokens that write a call's tool name.

    ``prior``: ``{tool name: prior probability}`` (only the ratios matter), the prior of
    every call, or a list of ``(tool name or None, {tool name: probability})`` rows
    (``needle_cy.retrieval.name_prior``): each call takes the first row whose tool no
    earlier call of the turn named (a row with None is never used up), so the calls of
    a multi-intent request follow its clauses in order.  ``strength``: the weight α of
    the prior's log.

    At each step of the call block, every token that writes name bytes gets α · log(mass
    of the names consistent with the name so far plus the token / mass of the names
    consistent with the name so far) added to its logit; a token that closes the name
    counts that one name's mass.  Along any tokenization of a name these terms add up to
    α · log(prior of the name), so the call's name is the model's choice times the
    prior^α (a product of experts), and nothing else changes: the grammar still picks
    among the tokens it allows, from the shifted logits, so no name outside it is ever
    written.

    The names are matched as the grammar writes them: the bytes of the JSON string
    without its quotes, inside the fixed head ``{"name":"`` of each call.  A tool that
    an earlier call of the turn named is out of the masses, as the grammar allows each
    tool once per turn.  ``feed`` follows the call block's bytes, ``reset`` restarts it
    (a new turn, or a rewind after a grammar dead end).

    The ``<think>`` notes the project's models write first name each call's tool at the
    start of a line (``set_light: room = "kitchen" …``, ``needle_cy.grounding.NoteGrounder``)
    and the call copies that name, so the tool is chosen there: a prior applied to the
    call alone would only overrule the notes, leaving the arguments noted for the other
    tool.  So in the notes too, where the model's own next token writes (more of) a tool
    name at a line's start, the token is the best of the tokens that do so by the same
    shifted logits (``note_token``; ``notes=False`` leaves the notes alone).  Only then:
    whether a line names a tool at all stays the model's choice, and a model that writes
    no such notes is left alone in its reasoning.  ``index``: the piece table's
    ``GroundingIndex`` (built on first use when None), where the candidate pieces are
    looked up."""

    _HEAD = b'{"name":"'
    _SPACE = b" \t\r"

    def __init__(self, prior, strength, index=None, notes=True):
        if isinstance(strength, bool) or not isinstance(strength, (int, float)) \
                or not 0 < strength < math.inf:
            raise ValueError(f"name prior strength must be a finite number > 0, got {strength!r}")
        self.strength = float(strength)
        rows = [(None, prior)] if isinstance(prior, dict) else list(prior)
        if not rows:
            raise ValueError("name prior: no rows")
        self.rows = []
        for pick, weights in rows:
            row = {}
            for name, weight in dict(weights).items():
                if isinstance(weight, bool) or not isinstance(weight, (int, float)) \
                        or not 0 <= weight < math.inf:
                    raise ValueError(f"name prior weight of {name!r} must be a finite number >= 0, "
                                     f"got {weight!r}")
                row[_name_bytes(name)] = float(weight)
            self.rows.append((None if pick is None else _name_bytes(pick), row))
        self.names = frozenset(n for _, row in self.rows for n in row)
        self.index = index                # a GroundingIndex of the piece table (built when None)
        self.notes = bool(notes)
        self.note_line = None
        self.steered = False              # the prior turned the name of the note line
        self.noted = frozenset()          # the tools the notes' lines named so far
        self.reset()

    def reset(self):
        # phase: open (before "["), next (a call or "]" may come), head (inside the head),
        # name (its bytes so far in `name`), args (the rest of a call; `depth` counts its
        # open brackets), after (a call closed: "," or "]"), done
        self.state = ("open", 0, b"", frozenset(), 0, False, False)

    def _row(self, used):
        """The prior of the next call, after calls (or note lines) naming ``used``."""
        return next((row for pick, row in self.rows if pick is None or pick not in used),
                    self.rows[-1][1])

    def _mass(self, prefix, used, final=False, exclude=True):
        return sum(w for n, w in self._row(used).items()
                   if not (exclude and n in used) and (n == prefix if final else n.startswith(prefix)))

    def _walk(self, state, piece):
        """(state after ``piece``, the log prior ratio of the name bytes it writes)."""
        phase, head, name, used, depth, in_str, esc = state
        ratio, before = 0.0, None
        for b in piece:
            if phase == "name":
                if before is None:
                    before = self._mass(name, used)
                if b == 0x22:
                    ratio += _log(self._mass(name, used, final=True)) - _log(before)
                    before = None
                    phase, used, depth = "args", used | {name}, 1
                else:
                    name += bytes((b,))
            elif phase == "args":
                if in_str:
                    if esc:
                        esc = False
                    elif b == 0x5C:
                        esc = True
                    elif b == 0x22:
                        in_str = False
                elif b == 0x22:
                    in_str = True
                elif b in (0x7B, 0x5B):
                    depth += 1
                elif b in (0x7D, 0x5D):
                    depth -= 1
                    if depth == 0:
                        phase = "after"
            elif phase == "head":
                head += 1
                if head == len(self._HEAD):
                    phase, name = "name", b""
            elif phase == "open":
                phase = "next" if b == 0x5B else "done"
            elif phase in ("next", "after"):
                if b == 0x7B and phase == "next":
                    phase, head = "head", 1
                elif b == 0x2C and phase == "after":
                    phase = "next"
                else:
                    phase = "done"
        if before is not None:
            ratio += _log(self._mass(name, used)) - _log(before)
        return (phase, head, name, used, depth, in_str, esc), ratio

    def feed(self, piece: bytes) -> None:
        self.state = self._walk(self.state, piece)[0]

    # ------------------------------------------------------------------ the notes
    def start_notes(self):
        """The ``<think>`` text begins: its first line may name a tool."""
        self.note_line, self.steered = b"", False

    def feed_note(self, piece: bytes) -> None:
        """Follow the note text: ``note_line`` is the current line while it can still be
        the start of a tool name, else None (until the next newline)."""
        for b in piece:
            if b == 0x0A:
                self.note_line, self.steered = b"", False
            elif self.note_line is not None:
                name = self.note_line.lstrip(self._SPACE)
                if b == 0x3A and name in self.names:
                    self.noted = self.noted | {name}
                    self.note_line, self.steered = None, False
                    continue
                line = self.note_line + bytes((b,))
                name = line.lstrip(self._SPACE)
                self.note_line = line if not name or any(n.startswith(name) for n in self.names) \
                    else None

    def _note_walk(self, piece):
        """The log prior ratio of ``piece`` written at the note line's start of a tool
        name, or None when it writes no name bytes or leaves every name."""
        name = self.note_line.lstrip(self._SPACE)
        noted = self.noted
        before = _log(self._mass(name, noted, exclude=False))
        grew = False
        for b in piece:
            if b in self._SPACE and not name:
                continue
            if b == 0x3A:                                    # ":" ends the name
                if name not in self.names:
                    return None
                return _log(self._mass(name, noted, final=True, exclude=False)) - before
            name += bytes((b,))
            grew = True
            if not any(n.startswith(name) for n in self.names):
                return None
        return _log(self._mass(name, noted, exclude=False)) - before if grew else None

    def _note_candidates(self, piece_table):
        """Token ids that may write more of a tool name from the note line so far."""
        name = self.note_line.lstrip(self._SPACE)
        plain = self._index(piece_table).plain
        out = set()
        for n in self.names:
            if not n.startswith(name):
                continue
            rest = n[len(name):]
            for i in range(1, len(rest) + 1):
                out.update(plain.get(rest[:i], ()))
                if not name:
                    out.update(plain.get(b" " + rest[:i], ()))
            for tail in (b":", b": "):
                out.update(plain.get(rest + tail, ()))
        return out

    def note_token(self, token, logits, piece_table):
        """The token to write in the notes where the model's choice is ``token``."""
        if self.note_line is None or not self.notes:
            return token
        if self._note_walk(piece_table[token] or b"") is None and not self.steered:
            return token                  # the model writes no tool name here
        best, best_score = None, None
        row = np.asarray(logits, dtype=np.float32)
        for cand in self._note_candidates(piece_table) | {token}:
            if cand >= len(row):
                continue
            ratio = self._note_walk(piece_table[cand] or b"")
            if ratio is None:
                continue
            score = float(row[cand]) + self.strength * ratio
            if best_score is None or score > best_score or (score == best_score and cand < best):
                best, best_score = cand, score
        if best is None:                  # no piece continues a name: the model's own text
            return token
        # A line whose name the prior turned keeps to the names until it ends: the model,
        # writing the name it had in mind, would otherwise leave a broken one ("set_t:")
        self.steered = self.steered or best != token
        return best

    def _index(self, piece_table):
        if self.index is None:
            self.index = GroundingIndex(piece_table)
        return self.index

    def _call_candidates(self, piece_table):
        """The tokens that may write name bytes from the call block's position: in the
        name, the pieces that continue or close a name still open (``GroundingIndex``
        lookups); before it, the few pieces that reach from the head into a name."""
        phase, head, name, used = self.state[:4]
        if phase == "name":
            index, out = self._index(piece_table), set()
            for n in self.names:
                if n in used or not n.startswith(name):
                    continue
                rest = n[len(name):]
                for i in range(1, len(rest) + 1):
                    out.update(index.plain.get(rest[:i], ()))
                out.update(index.closing.get(rest, ()))
            return out
        return _head_openers(piece_table)[head if phase == "head" else 0]

    def biased(self, logits, piece_table):
        """``logits`` with the prior's term added to each token that writes name bytes here
        (a copy), or ``logits`` itself when none does.  Which of them the grammar allows
        is the grammar's business: it picks from these logits as from the model's."""
        if self.state[0] in ("args", "done"):
            return logits
        out = None
        for token in self._call_candidates(piece_table):
            if token >= len(logits):
                continue
            ratio = self._walk(self.state, piece_table[token] or b"")[1]
            if ratio:
                if out is None:
                    out = np.array(logits, dtype=np.float32, copy=True)
                out[token] += self.strength * ratio
        return logits if out is None else out


_OPENERS = {}       # id(piece table) -> (piece table, openers): built once per vocabulary


def _head_openers(piece_table):
    """Per position h of the call head ``{"name":"`` (1-8, inside it): the tokens whose
    bytes finish the head from there and go on into the name; at 0 (before a call: after
    ``[`` or ``,``), the tokens that hold the whole head and go on."""
    hit = _OPENERS.get(id(piece_table))
    if hit is not None and hit[0] is piece_table:
        return hit[1]
    head = NamePrior._HEAD
    openers = [set() for _ in range(len(head))]
    for token, piece in enumerate(piece_table):
        if not piece or b'"' not in piece:      # every opener ends the head with its quote
            continue
        at = piece.find(head)
        if 0 <= at and at + len(head) < len(piece):
            openers[0].add(token)
        for h in range(1, len(head)):
            if len(piece) > len(head) - h and piece.startswith(head[h:]):
                openers[h].add(token)
    if len(_OPENERS) >= 8:
        _OPENERS.clear()
    _OPENERS[id(piece_table)] = (piece_table, openers)
    return openers


def _name_bytes(name):
    """A tool name as the grammar writes it: its JSON string's bytes without the quotes."""
    return json.dumps(str(name), ensure_ascii=False)[1:-1].encode("utf-8")


def _log(mass):
    # a name the grammar still allows always has mass; the floor keeps a zero weight finite
    return math.log(max(mass, 1e-300))
