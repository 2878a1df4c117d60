"""Value grounding: string arguments are written from what was said.

The grammar makes a call *valid*; it cannot make it *true*.  A small model that has
picked the right tool still tends to invent a free string (``"query": "Cairo"`` for
"play Fleetwood Mac") or pick a neighbouring enum member (``"garage"`` for "hallway
light off").  Grounding is a decoder policy on top of the grammar, applied inside the
call block (``ValueGrounder``) and to the quotes of the ``<think>`` notes before it
(``NoteGrounder``, at the end of this module):

* a **free string** value (``type: string`` with no ``enum``, ``const`` or ``format``)
  must be a span of the *sources*: the user's messages of the conversation and the tool
  results being answered, compared as the exact bytes of their JSON encoding (so a
  copied quote is ``\\"``, as the grammar writes it), from a word start to a word end
  that is not an article, possessive, preposition or conjunction waiting for its
  continuation ("I'm going to the", "called a"), neither beginning nor ending on a word
  that introduces a value ("play some jazz", "a timer called roast"), and overlapping
  no word of the call's tool name that the sources say only once (for "Play some
  blues", ``play_music``'s query is not "Play": the words that asked for the tool are
  the instruction, not the value it carries).  A copy is begun only where such an end
  can still be reached.  A copy does not cut through a name: it neither begins on a
  capitalized word right after another one nor ends on one right before another ("Play
  Fleetwood Mac" gives "Fleetwood Mac", never "Mac"; a sentence's first word and "I" are
  not name words), and holds some word that is not the request's filler (politeness,
  little words, the verbs that ask for a tool: "please", "can", "on", "Put": "Can you add
  garr to the list" has item "garr"; a note's from-quote may cite "on").  No
  copy begins or ends inside a number written with a colon,
  point or comma ("a 5" of "a 5:15 pm alarm").  A ``pattern`` string is grounded
  so only when some span of the sources is a value the pattern accepts (a PIN said as
  "1234");
* a **time of day** (a string whose ``pattern`` is a time's, e.g. ``HH:MM``, or with no
  pattern and a description that says "HH:MM") must be one
  of the times the sources say, read by ``needle_cy.spoken_time`` ("quarter to eight in
  the morning" is ``07:45``; without a part of the day ``07:45`` or ``19:45``, the
  model's choice), when they say any; the other string values of a call whose tool takes
  a time overlap none of those times' words (the label of "a 5:15 pm alarm called gym"
  is not "a 5:15");
* an **enum string** value must be one of the members the sources *mention* (the
  member's text, case-insensitive, starting at a word start: "Saturday" mentions
  ``sat``; "weekdays", "weekend", "every day" mention their days), when they mention
  any; an array of such members that requires unique items is not extended once the
  mentioned members are used up;
* an **optional number** (a property of ``type`` integer or number, without ``enum`` or
  ``const``, that the object does not require) is written only when the sources say
  some number, in digits or in words ("a dozen", "half", "full"): a small model fills
  ``"quantity": 3`` for "add butter to the list" though nothing was counted, while the
  tool has its own default.  The key is refused, and so is a comma whose only keys
  left are such refused ones.  When numbers were said, the value is one of them that
  fits the schema (``said_number_values``: digits, number words, and "full", "max",
  "halfway" for the schema's bounds), when one fits: "full brightness" is 100, not 50;
* a **length of time** (a number property named for its unit: "minutes", "seconds",
  "duration_hours", required or not) is one of the durations the sources say, read by
  ``needle_cy.spoken_time`` and converted to that unit, when they say any: "three
  quarters of an hour" is 45 minutes, "3 hours and forty-five minutes" 225.

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

import functools
import json
import re

from .spoken_time import (SMALL_NUMBERS, TENS, WORD_NUMBERS, said_durations, said_time_spans,
                          said_times, time_renderings)

__all__ = ["ValueGrounder", "NoteGrounder", "GroundingIndex", "value_rule", "mentioned_members",
           "says_number", "unsaid_number_keys", "optional_number_keys", "said_number_values",
           "said_duration_values"]

_WS = b" \t\r\n"
_NUMBER_CHARS = b"0123456789.eE+-"    # the bytes of a JSON number
_NUMBER_BYTES = frozenset(bytes((c,)) for c in _NUMBER_CHARS)
_MAX_PIECE = 32            # longest continuation looked up per source position
_MAX_PATTERN_SPAN = 64     # longest span tried against a pattern
_NOTE_TAIL = b" ;\t\r\n"   # what may follow a note's closing quote in the same token


def optional_number_keys(schema):
    """The optional number properties of an object ``schema``: of type integer or number,
    without ``enum`` or ``const``, not required."""
    props = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(props, dict):
        return []
    required = schema.get("required")
    required = set(required) if isinstance(required, list) else set()
    out = []
    for k, sub in props.items():
        if k in required or not isinstance(sub, dict) or "enum" in sub or "const" in sub:
            continue
        t = sub.get("type")
        types = t if isinstance(t, list) else [t]
        if types and all(x in ("integer", "number") for x in types):
            out.append(k)
    return out


def unsaid_number_keys(schema, number_said: bool):
    """The optional number properties of an object ``schema`` that may not be written
    when no number was said (``number_said`` False); empty otherwise."""
    if number_said:
        return frozenset()
    return frozenset(_json_bytes(k) for k in optional_number_keys(schema))


_WORD_NUMBERS = dict(WORD_NUMBERS, hundred=100, dozen=12, couple=2, pair=2, once=1, twice=2,
                     quarter=25)
_TENS_UNITS = re.compile(r"(?<![a-z])(" + "|".join(TENS) + r")[ -](" + "|".join(SMALL_NUMBERS[1:10])
                         + r")(?![a-z])")
_DIGITS = re.compile(r"(?<![0-9.])[0-9]+(?:\.[0-9]+)?")
# Words that name a bound of the schema: "full brightness" is its maximum, "halfway" the
# middle of its range.
_BOUND_WORDS = {"full": "max", "max": "max", "maximum": "max", "min": "min", "minimum": "min",
                "half": "mid", "halfway": "mid"}
# Words that say a number (besides digits): the number words and the bound words above,
# what the training data writes for counts, levels and durations ("a couple", "halfway",
# "full brightness", "quarter past").
_NUMBER_WORDS = re.compile(r"(?<![a-z])(" + "|".join(sorted({*_WORD_NUMBERS, *_BOUND_WORDS}))
                           + r")(?![a-z])")


def says_number(sources_lower: str) -> bool:
    """True when the (lowercased) sources say some number, in digits or in words."""
    return any(c.isdigit() for c in sources_lower) or _NUMBER_WORDS.search(sources_lower) is not None


def said_number_values(schema, sources_lower: str):
    """The JSON texts of the numbers the sources say that fit the number ``schema``: digits,
    number words ("twenty-five", "a dozen") and the words for its bounds ("full" is its
    ``maximum``, "halfway" the middle of ``minimum``..``maximum``); empty when none fits."""
    values = [float(m.group(0)) for m in _DIGITS.finditer(sources_lower)]
    values += [_WORD_NUMBERS[a] + _WORD_NUMBERS[b] for a, b in _TENS_UNITS.findall(sources_lower)]
    lo, hi = schema.get("minimum"), schema.get("maximum")
    bounds = {"min": lo, "max": hi,
              "mid": (lo + hi) / 2 if isinstance(lo, (int, float)) and isinstance(hi, (int, float)) else None}
    for w in re.findall(r"[a-z]+", sources_lower):
        if w in _WORD_NUMBERS:
            values.append(_WORD_NUMBERS[w])
        elif w in _BOUND_WORDS and bounds[_BOUND_WORDS[w]] is not None:
            values.append(bounds[_BOUND_WORDS[w]])
    return _fitting_literals(values, schema)


_DURATION_UNITS = ((re.compile(r"(?:^|_)(?:minutes?|mins?)(?:$|_)"), 60),
                   (re.compile(r"(?:^|_)(?:seconds?|secs?)(?:$|_)"), 1),
                   (re.compile(r"(?:^|_)(?:hours?|hrs?)(?:$|_)"), 3600))


def said_duration_values(key, schema, sources):
    """The JSON texts of the lengths of time the sources say (``said_durations``) in the
    unit of a number property named for one ("minutes", "duration_seconds", "hrs"), that
    fit its schema; empty for other properties or when none was said.  So "three quarters
    of an hour" is 45 minutes and "3 hours and forty-five minutes" 225, never the 15 or
    210 a small model's arithmetic writes."""
    if not isinstance(schema, dict) or "enum" in schema or "const" in schema \
            or schema.get("type") not in ("integer", "number"):
        return ()
    unit = next((u for rx, u in _DURATION_UNITS if rx.search(str(key).lower())), None)
    if unit is None:
        return ()
    return _fitting_literals([seconds / unit for text in sources for seconds in said_durations(text)],
                             schema)


def _fitting_literals(values, schema):
    """The JSON literals (b"90", b"16.5") of ``values`` within the number ``schema``'s
    bounds (and whole, for an integer), in order, without repeats."""
    lo, hi = schema.get("minimum"), schema.get("maximum")
    out = []
    for v in values:
        if (isinstance(lo, (int, float)) and v < lo) or (isinstance(hi, (int, float)) and v > hi) \
                or (schema.get("type") == "integer" and not float(v).is_integer()):
            continue
        literal = (str(int(v)) if float(v).is_integer() else repr(float(v))).encode()
        if literal not in out:
            out.append(literal)
    return tuple(out)


def _json_bytes(text: str) -> bytes:
    """The bytes a JSON string literal holds for ``text`` (without the quotes)."""
    return json.dumps(text, ensure_ascii=False)[1:-1].encode("utf-8")


def _is_word_byte(b) -> bool:
    # ASCII letters and digits, apostrophes and hyphens inside words ("I'll",
    # "washing-up"), and every byte of a multi-byte UTF-8 character.
    return b >= 0x80 or 0x30 <= b <= 0x39 or 0x41 <= b <= 0x5A or 0x61 <= b <= 0x7A \
        or b in (0x27, 0x2D)


def _joins_digits(src: bytes, i: int) -> bool:
    """True when ``src[i]`` is a colon, point or comma between two digits: "5:15", "2.5"
    and "1,000" are one word, so no copy begins or ends inside them ("a 5" for a label)."""
    return 0 < i < len(src) - 1 and src[i] in b":.," and 0x30 <= src[i - 1] <= 0x39 \
        and 0x30 <= src[i + 1] <= 0x39


def _word_starts(src: bytes):
    """Positions in ``src`` where a copied span may begin: the first byte of a word."""
    return [i for i in range(len(src))
            if _is_word_byte(src[i]) and (i == 0 or not _is_word_byte(src[i - 1]))
            and not (i > 1 and _joins_digits(src, i - 1))]


def _words(src: bytes):
    """(start, end) of each word of ``src``."""
    for p in _word_starts(src):
        q = p
        while q < len(src) and _is_word_byte(src[q]):
            q += 1
        yield p, q


def _value_starts(src: bytes) -> frozenset:
    """The word starts of ``src`` where a copied value may begin: not an introducer, and
    not a capitalized word right after another name word (``_in_name``)."""
    words = list(_words(src))
    return frozenset(p for i, (p, q) in enumerate(words) if src[p:q] not in _LEADING
                     and not (i > 0 and _in_name(src, p, q) and _in_name(src, *words[i - 1])
                              and src[words[i - 1][1]:p].strip() == b""))


_I_WORDS = frozenset((b"I", b"I'm", b"I'll", b"I've", b"I'd"))


def _in_name(src: bytes, start: int, end: int) -> bool:
    """True when the word ``src[start:end]`` may be part of a name: capitalized, not the
    pronoun "I", and not the first word of a sentence (or of a clause after a comma).
    A copied value does not cut through a run of such words: "Play Fleetwood Mac" gives
    "Fleetwood Mac", never "Mac" ("put on songs by Todd Willis" never "Todd")."""
    if not (0x41 <= src[start] <= 0x5A) or src[start:end] in _I_WORDS:
        return False
    i = start - 1
    while i >= 0 and src[i] in b" \t":
        i -= 1
    return i >= 0 and src[i] not in b'.!?:,;"(\r\n'


def _ends_word(src: bytes, end: int) -> bool:
    """A copied span may end before ``end``: after a word's last byte (or a closing
    bracket or percent sign), never after sentence punctuation or a space."""
    if end <= 0:
        return False
    last = src[end - 1]
    if not (_is_word_byte(last) or last in (0x29, 0x5D, 0x25)):
        return False
    if end < len(src) and _joins_digits(src, end):
        return False
    return end == len(src) or not _is_word_byte(src[end]) or not _is_word_byte(last)


# Words for groups of weekdays: a day enum ("mon".."sun" or "monday".."sunday") counts
# them as mentions of their days ("on weekdays" mentions mon to fri).
_DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_DAY_GROUPS = ((re.compile(r"(?<![a-z])(?:week ?days?|work ?days?|working days)(?![a-z])"), _DAYS[:5]),
               (re.compile(r"(?<![a-z])weekends?(?![a-z])"), _DAYS[5:]),
               (re.compile(r"(?<![a-z])(?:every ?day|daily)(?![a-z])"), _DAYS))


def mentioned_members(members, sources_lower: str):
    """The enum members whose text starts at a word start somewhere in the sources, and
    the days of a day enum that a group word says ("weekdays", "weekend", "every day")."""
    days = set()
    for rx, group in _DAY_GROUPS:
        if rx.search(sources_lower):
            days.update(group)
    found = []
    for m in members:
        key = m.lower().strip()
        if key and (re.search(r"(?<![0-9a-z])" + re.escape(key), sources_lower)
                    or (key[:3] in days and _is_day(key))):
            found.append(m)
    return found


def _is_day(key: str) -> bool:
    """True for a weekday's name or its three-letter abbreviation ("tue", "tuesday")."""
    return key[:3] in _DAYS and (len(key) == 3 or key.endswith("day"))


# Words a said value never ends with: articles, possessives and the prepositions and
# conjunctions that need something after them ("I'm going to the", "timer called a").
# A capital "A" may be a letter's name ("vitamin A"), so only the lowercase one counts.
# The words that introduce a value ("play some jazz", "a timer called roast", "a message
# saying hi") neither begin nor end one.
_INTRODUCERS = (b"some", b"called", b"named", b"labelled", b"labeled", b"titled", b"saying")
_LEADING = frozenset(w for base in _INTRODUCERS for w in (base, base.capitalize()))
_DANGLING = frozenset(w for base in (b"the", b"a", b"an", b"to", b"of", b"and", b"or", b"my",
                                     b"your", b"our", b"their", b"from", b"with", b"for", b"at")
                      + _INTRODUCERS
                      for w in (base, base.capitalize()) if w != b"A")


def _may_end(src: bytes, end: int) -> bool:
    """A copied span may end before ``end``: at a word end (``_ends_word``), not after a
    word that needs a continuation (``_DANGLING``)."""
    if not _ends_word(src, end):
        return False
    start = end
    while start > 0 and _is_word_byte(src[start - 1]):
        start -= 1
    if src[start:end] in _DANGLING:
        return False
    # not inside a name: a capitalized word does not end the copy before another one
    nxt = end
    while nxt < len(src) and src[nxt] == 0x20:
        nxt += 1
    if end < nxt < len(src) and 0x41 <= src[start] <= 0x5A and src[start:end] not in _I_WORDS:
        q = nxt
        while q < len(src) and _is_word_byte(src[q]):
            q += 1
        if _in_name(src, nxt, q):
            return False
    return True


def _instruction_words(tool, sources_lower: str):
    """The words of ``tool``'s name that the sources say exactly once ("add_to_shopping_list"
    and "Add butter to the shopping list": add, shopping, list; never the little words of
    ``_DANGLING``).  Said once, such a word is the request's instruction, the words that
    asked for the tool, not part of the value it carries; said twice ("add shopping bags to
    the shopping list") one of them may be the value, so it is not held back."""
    out = []
    for w in set(re.split(r"[^0-9a-z]+", (tool or "").lower())):
        if w and w.encode() not in _DANGLING and len(re.findall(
                r"(?<![0-9a-z'\-])" + re.escape(w) + r"(?![0-9a-z'\-])", sources_lower)) == 1:
            out.append(w.encode())
    return frozenset(out)


def _word_ranges(sources, words):
    """Per source, the (start, end) byte ranges of the words (lowercased) in ``words``."""
    return [[(p, q) for p, q in _words(src) if src[p:q].lower() in words] if words else []
            for src in sources]


def _held_ranges(cache, sources, tool, sources_lower, tools):
    """Per source, the word ranges no copied value of a ``tool`` call may overlap: the
    tool's instruction words (``_instruction_words``) and, when the tool takes a time of
    day (``_takes_time``), the times said ("a 5:15 pm alarm called gym": the label is not
    "a 5:15", those words are the time's).  Computed once per tool and kept in ``cache``
    (one grounder's sources)."""
    held = cache.get(tool)
    if held is None:
        held = _word_ranges(sources, _instruction_words(tool, sources_lower))
        if _takes_time(tools.get(tool) if tool else None):
            held = [ranges + said_time_spans(src.decode("latin-1"))   # one char per byte
                    for ranges, src in zip(held, sources)]
        cache[tool] = held
    return held


def _takes_time(schema) -> bool:
    """True when the object ``schema`` has a time-of-day string property (``_time_pattern``)."""
    props = schema.get("properties") if isinstance(schema, dict) else None
    return isinstance(props, dict) and any(_time_pattern(sub) is not None for sub in props.values())


def _pattern_spans_match(pattern, sources) -> bool:
    """True when some span of ``sources`` (word start to word end) is a value ``pattern``
    accepts (JSON Schema patterns are unanchored searches); an invalid pattern accepts
    nothing here (no grounding)."""
    try:
        rx = re.compile(pattern)
    except (re.error, TypeError):
        return False
    for text in sources:
        src = text.encode("utf-8")
        for a in _word_starts(src):
            for b in range(a + 1, min(len(src), a + _MAX_PATTERN_SPAN) + 1):
                if _ends_word(src, b) and rx.search(src[a:b].decode("utf-8", "replace")):
                    return True
    return False


def value_rule(schema, sources_lower: str, sources=()):
    """('copy',) | ('enum', members, unique) | None for a string value under ``schema``.

    ``sources``: the texts themselves, for a ``pattern`` (see the module docstring)."""
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
    if not (t == "string" or (isinstance(t, list) and "string" in t)):
        return None
    clock = _time_pattern(schema)
    if clock is not None:
        said = time_renderings([when for text in sources for when in said_times(text)], clock)
        if said:
            return ("enum", [_json_bytes(t) for t in dict.fromkeys(said)])
    if "pattern" in schema and not _pattern_spans_match(schema["pattern"], sources):
        return None
    return ("copy",)


# A string described as a 24-hour clock without a pattern ("description": "HH:MM") is
# read as one: the app says what it wants, only not in JSON Schema.
_DESCRIBED_CLOCK = re.compile(r"(?<![A-Za-z])HH:MM(?![A-Za-z])")
_CLOCK_PATTERN = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"


def _time_pattern(schema):
    """The pattern a time-of-day string under ``schema`` is written in: its own
    ``pattern`` when that is a time's (``time_renderings``), a 24-hour ``HH:MM`` when it
    has no pattern and its description says "HH:MM", else None."""
    if not isinstance(schema, dict):
        return None
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        return pattern if time_renderings([(7, 45)], pattern) else None
    description = schema.get("description")
    if pattern is None and isinstance(description, str) and _DESCRIBED_CLOCK.search(description):
        return _CLOCK_PATTERN
    return None


class GroundingIndex:
    """The piece table arranged for continuation lookups (built once per vocabulary).

    ``plain[b]``: tokens whose bytes are exactly ``b`` and hold no quote or backslash;
    ``closing[b]``: tokens whose bytes are ``b`` (no quote or backslash) then a quote,
    then anything (the grammar and ``accepts`` judge the tail); ``note_closing[b]``: those
    of them whose tail is only a note's punctuation (``NoteGrounder``); ``number_closing[b]``:
    tokens whose bytes are the number bytes ``b`` then something that ends a number;
    ``number_enders``: tokens that begin with a comma or a closing bracket (what follows a
    finished number in a call)."""

    def __init__(self, piece_table):
        plain, closing, note_closing, number_closing, enders = {}, {}, {}, {}, []
        for tid, piece in enumerate(piece_table):
            if not piece:
                continue
            if piece[:1] in (b",", b"}", b"]"):
                enders.append(tid)
            run = len(piece) - len(piece.lstrip(_NUMBER_CHARS))
            if 0 < run < len(piece):
                number_closing.setdefault(piece[:run], []).append(tid)
            q = piece.find(b'"')
            head = piece if q < 0 else piece[:q]
            if b"\\" in head:
                continue
            (plain if q < 0 else closing).setdefault(head, []).append(tid)
            if q >= 0 and not piece[q + 1:].strip(_NOTE_TAIL):
                note_closing.setdefault(head, []).append(tid)
        self.plain, self.closing, self.note_closing = plain, closing, note_closing
        self.number_closing, self.number_enders = number_closing, enders
        self.size = len(piece_table)


def _per_schema(cache, kind, schema, compute):
    """``compute(schema)`` for one grounder's sources, computed once per ``kind`` and schema
    object (keyed by identity; the schema is kept so a recycled id cannot alias)."""
    hit = cache.get((kind, id(schema)))
    if hit is None or hit[0] is not schema:
        hit = cache[(kind, id(schema))] = (schema, compute(schema))
    return hit[1]


def _cached_rule(cache, schema, sources_lower, texts):
    """``value_rule`` of ``schema`` for one grounder's sources, once per schema object."""
    return _per_schema(cache, "rule", schema, lambda s: value_rule(s, sources_lower, texts))


def _span_ends(sources, starts, buf, final, held=None, value=True):
    """(source, end) of each place ``buf`` is copied from: spans begin at a word start
    (``starts``: one set per source), when ``final`` end at a word end (``_may_end``),
    overlap none of the source's ``held`` word ranges (``_word_ranges``; None: none) and,
    for a ``value`` (not a note's from-quote, which may cite "on" or "up"), reach a word
    that is not filler (``_content_end``)."""
    n = len(buf)
    for i, (src, st) in enumerate(zip(sources, starts)):
        ranges = held[i] if held else ()
        if not buf:
            for p in st:
                if _can_end(src, p, p, ranges, value):
                    yield src, p
            continue
        p = src.find(buf)            # C-speed search; long tool results stay cheap
        while p >= 0:
            if p in st and (_may_end(src, p + n) and _clear(ranges, p, p + n)
                            and (not value or p + n >= _content_end(src, p)) if final
                            else _can_end(src, p, p + n, ranges, value)):
                yield src, p + n
            p = src.find(buf, p + 1)


def _clear(ranges, start, end) -> bool:
    """True when [start, end) overlaps none of ``ranges``."""
    return all(b <= start or a >= end for a, b in ranges)


# Words of the request around the value (politeness, little words, the verbs that ask
# for a tool), never a value alone ("Can you add garr to the list" has item "garr", not
# "Can"; "add cereal to the list please" not "please"; "Put some hvaac on the list" not
# "Put").
_FILLER = frozenset(b"please pls plz thanks thank you can could would will want need ahead ok okay "
                    b"quick quickly hey hi hello actually just needle like we i i'd me so also then "
                    b"right sure go let on in up off it to the a an of at for with my this that is "
                    b"be do and or but put add set start play turn make get stream queue send tell "
                    b"know".split())


@functools.lru_cache(maxsize=4096)
def _content_end(src: bytes, start: int) -> int:
    """The end of the first word at or after ``start`` that is not filler (``_FILLER``):
    a copied value begun at ``start`` must reach it; past the end when there is none."""
    q = start
    while q < len(src):
        while q < len(src) and not _is_word_byte(src[q]):
            q += 1
        p = q
        while q < len(src) and _is_word_byte(src[q]):
            q += 1
        if p < q and src[p:q].lower() not in _FILLER:
            return q
    return len(src) + 1


def _can_end(src, start, pos, ranges, value=True) -> bool:
    """True when a span of ``src`` begun at ``start`` and copied up to ``pos`` can still
    be completed: some end at or after ``pos`` where it may stop (``_may_end``) comes
    before any held word range.  (Without this look-ahead a copy could begin on "the" in
    "the shopping list" with "shopping" held, then find no way to close.)"""
    limit = len(src)
    for a, b in ranges:
        if a < max(pos, start + 1) and b > start:
            return False             # already inside a held word
        if a >= pos:
            limit = min(limit, a)
    first = max(pos, start + 1, _content_end(src, start) if value else 0)
    return any(_may_end(src, e) for e in range(first, limit + 1))


def _span_candidates(ends, buf, plain, closing, out):
    """Add to ``out`` the tokens that continue a copied span from each of ``ends`` (or
    close it with a quote where the span may end): ``plain`` and ``closing`` are a
    ``GroundingIndex``'s lookups."""
    for src, end in ends:
        if buf and _may_end(src, end):
            out.update(closing.get(b"", ()))
        for k in range(1, min(_MAX_PIECE, len(src) - end) + 1):
            chunk = src[end:end + k]
            out.update(plain.get(chunk, ()))
            if _may_end(src, end + k):
                out.update(closing.get(chunk, ()))


def _member_candidates(members, buf, plain, closing, out):
    """Add to ``out`` the tokens that continue ``buf`` towards one of ``members``."""
    for m in members:
        if not m.startswith(buf):
            continue
        rest = m[len(buf):]
        out.update(closing.get(rest, ()))
        for k in range(1, len(rest) + 1):
            out.update(plain.get(rest[:k], ()))


class _Frame:
    __slots__ = ("kind", "schema", "key", "tool", "used", "refused", "keys", "numbers")

    def __init__(self, kind, schema):
        self.kind = kind        # "calls" | "call" | "object" | "array"
        self.schema = schema    # the container's schema (None: not grounded below)
        self.key = None         # object: the key whose value comes next
        self.tool = None        # call: the tool name once written
        self.used = []          # array: the enum members already written (uniqueItems);
                                # object: the keys already written (JSON-encoded bytes)
        self.refused = frozenset()  # object: keys grounding refuses (unsaid_number_keys)
        self.numbers = {}       # object: optional number key -> the said values it may take
        self.keys = ()          # object with refused keys: all its property names, JSON-encoded

    def clone(self):
        f = _Frame(self.kind, self.schema)
        f.key, f.tool, f.used, f.refused, f.keys, f.numbers = (
            self.key, self.tool, list(self.used), self.refused, self.keys, self.numbers)
        return f


class ValueGrounder:
    """Follows one call block's bytes and judges tokens against the grounding rules."""

    def __init__(self, tools, sources, index: GroundingIndex):
        # tools: {name: parameters schema (refs inlined)}; sources: texts said so far.
        self.tools = tools
        self.index = index
        self.sources = [_json_bytes(s) for s in sources if s]
        self._starts = [_value_starts(src) for src in self.sources]
        self.texts = [s for s in sources if s]
        self.sources_lower = "\n".join(s.lower() for s in self.texts)
        self.number_said = says_number(self.sources_lower)
        self._rules = {}
        self._held = {}          # tool name -> its instruction words' ranges per source
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
        self.refused_key = False  # a key (or a comma before one) was refused
        self.number = None       # (bytes so far, values it may become) of a grounded number

    def clone(self):
        g = ValueGrounder.__new__(ValueGrounder)
        (g.tools, g.index, g.sources, g.texts, g.sources_lower, g._rules, g._starts,
         g.number_said, g._held) = (
            self.tools, self.index, self.sources, self.texts, self.sources_lower, self._rules,
            self._starts, self.number_said, self._held)
        g.stack = [f.clone() for f in self.stack]
        g.mode, g.in_str, g.str_key, g.buf, g.esc, g.rule = (
            self.mode, self.in_str, self.str_key, self.buf, self.esc, self.rule)
        g.refused_key = False
        g.number = self.number
        return g

    def _rule(self, schema):
        return _cached_rule(self._rules, schema, self.sources_lower, self.texts)

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
            if self.number is not None:
                written, values = self.number
                if c in _NUMBER_BYTES:
                    self.number = (written + c, values)
                    ok = any(v.startswith(written + c) for v in values) and ok
                    continue
                self.number = None              # the number ends here: it must be whole
                ok = written in values and ok
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
                frame = _Frame(kind, schema)
                if kind == "object":
                    frame.refused = unsaid_number_keys(schema, self.number_said)
                    if frame.refused:
                        frame.keys = tuple(_json_bytes(p) for p in schema["properties"])
                    frame.numbers = self._said_numbers(schema)
                self.stack.append(frame)
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
                    if top is not None and top.refused and not self._keys_left(top):
                        ok = False              # only refused keys could follow
                        self.refused_key = True
                continue
            if c in _NUMBER_BYTES:
                values = self._number_values_here()
                if values:
                    self.number = (c, values)
                    ok = any(v.startswith(c) for v in values) and ok
            self.mode = "after"                   # inside a number or literal
        return ok

    def _number_values_here(self):
        """The said values a number beginning here may take (None: not grounded)."""
        if self.mode != "value" or not self.stack:
            return None
        top = self.stack[-1]
        return top.numbers.get(top.key)

    def _number_candidates(self):
        written, values = self.number if self.number is not None else (b"", self._number_values_here())
        if not values:
            return None
        rests = [v[len(written):] for v in values if v.startswith(written)]
        if not rests:
            return None
        out = set(self.index.number_enders) if b"" in rests else set()
        plain, closing = self.index.plain, self.index.number_closing
        for r in rests:
            for i in range(1, len(r) + 1):
                out.update(plain.get(r[:i], ()))
            out.update(closing.get(r, ()))
        return out

    def _said_numbers(self, schema):
        """{key: said values} for the number properties of an object ``schema`` that are
        grounded: a length of time in a unit (``said_duration_values``), else an optional
        number (``optional_number_keys``, ``said_number_values``); once per schema."""
        return _per_schema(self._rules, "numbers", schema, self._compute_said_numbers)

    def _compute_said_numbers(self, schema):
        out = {}
        optional = optional_number_keys(schema)
        props = schema.get("properties") if isinstance(schema, dict) else None
        for key, sub in (props.items() if isinstance(props, dict) else ()):
            values = said_duration_values(key, sub, self.texts)
            if not values and key in optional:
                values = said_number_values(sub, self.sources_lower)
            if values:
                out[key] = values
        return out

    @staticmethod
    def _keys_left(frame) -> bool:
        """True when ``frame`` (an object) may still take a key grounding does not refuse."""
        if frame.schema.get("additionalProperties", True) is not False:
            return True
        return any(k not in frame.refused and k not in frame.used for k in frame.keys)

    def _key_ok(self, final) -> bool:
        """A key may not be (or become) one its object refuses."""
        top = self.stack[-1] if self.stack else None
        if top is None or not top.refused:
            return True
        buf = self.buf
        if final:
            return buf not in top.refused
        if not any(k.startswith(buf) for k in top.refused):
            return True
        return any(k.startswith(buf) for k in top.keys if k not in top.refused)

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
        if self.str_key:
            ok = self._key_ok(final)
            self.refused_key = self.refused_key or not ok
            return ok
        rule = self.rule
        if rule is None:
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
        tool = next((f.tool for f in reversed(self.stack) if f.kind == "call"), None)
        held = _held_ranges(self._held, self.sources, tool, self.sources_lower, self.tools)
        return _span_ends(self.sources, self._starts, self.buf, final, held)

    def _close_string(self):
        top = self.stack[-1] if self.stack else None
        if self.str_key:
            if top is not None:
                try:
                    top.key = json.loads(b'"' + self.buf + b'"')
                except ValueError:
                    top.key = None
                if top.kind == "object":
                    top.used.append(self.buf)
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

    def refuses_key(self, piece: bytes) -> bool:
        """True when ``piece`` is turned down for writing a key its object refuses."""
        g = self.clone()
        g.feed(piece, stop_early=True)
        return g.refused_key

    @property
    def constrained(self) -> bool:
        """True inside a grounded string value (where ``mask`` has an opinion)."""
        return self.in_str and not self.str_key and self.rule is not None

    def candidates(self):
        """Token ids that may continue the grounded string or number being written, or
        None when no proposal is made here (not in a grounded value, or mid-escape).  A
        finished number is followed by a token that begins with ``,``, ``}`` or ``]``."""
        if not self.in_str:
            return self._number_candidates()
        if not self.constrained or self.esc:
            return None
        buf = self.buf
        out = set()
        plain, closing = self.index.plain, self.index.closing
        if self.rule[0] == "copy":
            _span_candidates(self._copy_ends(False), buf, plain, closing, out)
        else:
            _member_candidates(self._available(self.rule), buf, plain, closing, out)
        return out


class NoteGrounder:
    """Grounds the quoted strings of the reasoning notes, the ``<think>`` text the
    project's training template writes before the calls::

        set_light: room = "kitchen" from "kitchen"; brightness = 30 from "30"
        play_music: query = "jazz" from "some jazz"

    (one line per call: the tool's name, a colon, then ``;``-separated notes).  A
    ``from "…"`` quote names words of the request, so it is a span of the sources (their
    own case or lower case: the template quotes request words mid-sentence); a
    ``key = "…"`` quote follows the call rule of that key's schema in the line's tool
    (``value_rule``: a free string copied, a mentioned enum member).  In the source-first
    order (data version 6: ``query from "some jazz" = "jazz"``) a copied value is a span
    of the ``from`` quote just written.  Everything else the
    model writes freely, and as in the call block the model's best grounded token is
    taken only when there is one, so a reasoning format this does not know (another
    model's) is never constrained.  Why: a small model that loses the thread mid-quote
    repeats a letter until the reasoning cap and then declines the turn; a span it must
    copy keeps the quote, and the call written after it, on what was said."""

    _TOOL = re.compile(rb"^\s*([A-Za-z_][A-Za-z0-9_.\-]*)\s*:$")
    _KEY = re.compile(rb"(?:^|\s)([A-Za-z_][A-Za-z0-9_]*)\s*=\s*$")
    _FROM = re.compile(rb"(?:^|\s)from\s*$")
    _KEY_AFTER_FROM = re.compile(rb'(?:^|\s)([A-Za-z_][A-Za-z0-9_]*)\s+from\s*"\s*=\s*$')

    def __init__(self, tools, sources, index: GroundingIndex):
        # tools: {name: parameters schema (refs inlined)}; sources: texts said so far.
        self.tools = tools
        self.index = index
        self.texts = [s for s in sources if s]
        raw = [s.encode("utf-8") for s in self.texts]
        lower = [s.lower().encode("utf-8") for s in self.texts]
        self.sources = raw + [lo for lo, r in zip(lower, raw) if lo != r]
        self._starts = [frozenset(_word_starts(src)) for src in self.sources]   # from-quotes
        self._value_starts = [_value_starts(src) for src in self.sources]      # key values
        self.sources_lower = "\n".join(s.lower() for s in self.texts)
        self._rules = {}
        self._held = {}          # tool name -> its instruction words' ranges per source
        self.reset()

    def reset(self):
        self.seg = b""           # the note so far (since a newline or ';'), outside quotes
        self.line = b""          # the line so far, until its tool is known
        self.tool = None         # the line's tool, once "name:" is written
        self.in_str = False
        self.buf = b""
        self.rule = None
        self.quoted = b""        # the note's last closed ``from`` quote (source-first order)

    def clone(self):
        g = NoteGrounder.__new__(NoteGrounder)
        g.tools, g.index, g.texts, g.sources, g._starts, g.sources_lower, g._rules = (
            self.tools, self.index, self.texts, self.sources, self._starts,
            self.sources_lower, self._rules)
        g._value_starts = self._value_starts
        g._held = self._held
        g.seg, g.line, g.tool, g.in_str, g.buf, g.rule, g.quoted = (
            self.seg, self.line, self.tool, self.in_str, self.buf, self.rule, self.quoted)
        return g

    def _rule_here(self):
        """The rule of a quote opened after the note text ``seg``."""
        if self._FROM.search(self.seg):
            return ("from",)         # a span of the sources, remembered when it closes
        after_from = self._KEY_AFTER_FROM.search(self.seg)
        m = after_from or self._KEY.search(self.seg)
        schema = self.tools.get(self.tool) if self.tool else None
        if m is None or not isinstance(schema, dict):
            return None
        props = schema.get("properties")
        sub = props.get(m.group(1).decode()) if isinstance(props, dict) else None
        if not isinstance(sub, dict):
            return None
        rule = _cached_rule(self._rules, sub, self.sources_lower, self.texts)
        if rule == ("copy",) and after_from and self.quoted:
            quoted = [self.quoted]
            return ("within", quoted, [_value_starts(self.quoted)],
                    _held_ranges({}, quoted, self.tool, self.sources_lower, self.tools))
        return rule

    def feed(self, data: bytes, stop_early=False) -> bool:
        """Advance over ``data``; False when a byte breaks a grounding rule (the state
        follows every byte either way, unless ``stop_early``)."""
        ok = True
        for b in data:
            if not ok and stop_early:
                return False
            if self.in_str:
                if b == 0x22:
                    self.in_str = False
                    ok = self._value_ok(final=True) and ok
                    if self.rule is not None and self.rule[0] == "from":
                        self.quoted = self.buf
                    self.rule = None
                    self.seg += b'"'
                else:
                    self.buf += bytes((b,))
                    ok = self._value_ok(final=False) and ok
                continue
            if b == 0x0A:
                self.seg, self.line, self.tool, self.quoted = b"", b"", None, b""
            elif b == 0x3B:
                self.seg, self.quoted = b"", b""
            elif b == 0x22:
                self.in_str, self.buf, self.rule = True, b"", self._rule_here()
            else:
                c = bytes((b,))
                self.seg += c
                if self.tool is None:
                    self.line += c
                    if b == 0x3A:
                        m = self._TOOL.match(self.line)
                        self.tool = m.group(1).decode() if m else ""
        return ok

    def _spans(self):
        """(sources, word starts, held word ranges, is a value) a copied quote is a span of
        under the current rule."""
        if self.rule[0] == "within":
            return self.rule[1:] + (True,)
        if self.rule[0] == "copy":        # a key's value: not the tool's instruction words
            return (self.sources, self._value_starts,
                    _held_ranges(self._held, self.sources, self.tool, self.sources_lower, self.tools),
                    True)
        return self.sources, self._starts, None, False

    def _value_ok(self, final) -> bool:
        rule = self.rule
        if rule is None:
            return True
        if rule[0] in ("copy", "from", "within"):
            if final and not self.buf:
                return False
            sources, starts, held, value = self._spans()
            return any(True for _ in _span_ends(sources, starts, self.buf, final, held, value))
        if final:
            return self.buf in rule[1]
        return any(m.startswith(self.buf) for m in rule[1])

    def accepts(self, piece: bytes) -> bool:
        if self.in_str and self.rule is not None:
            # A token that closes a grounded quote may carry only the note's own
            # punctuation after it (not '"}},' from the tools' JSON, which derails the notes).
            q = piece.find(b'"')
            if q >= 0 and piece[q + 1:].strip(_NOTE_TAIL):
                return False
        return self.clone().feed(piece, stop_early=True)

    def candidates(self):
        """Token ids that may continue the grounded quote being written, or None when no
        proposal is made here (outside a quote, or a quote no rule covers)."""
        if not self.in_str or self.rule is None:
            return None
        out = set()
        plain, closing = self.index.plain, self.index.note_closing
        if self.rule[0] in ("copy", "from", "within"):
            sources, starts, held, value = self._spans()
            _span_candidates(_span_ends(sources, starts, self.buf, False, held, value),
                             self.buf, plain, closing, out)
        else:
            _member_candidates(self.rule[1], self.buf, plain, closing, out)
        return out
