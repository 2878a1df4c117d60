"""Hand-written consumer catalogues and the requests people make of them (generator v2).

The schema-general generator (``tool_requests``) phrases any tool from its own words,
so its requests repeat the tool's name and description ("tell the modem to zero …").
People do not: they say "kill the telly", "it's stuffy in here", "living room tv volume
20", "is the back camera recording?".  This module holds small catalogues written the way
app developers write them (``catalogue_data``: 21 consumer domains, 4-6 tools each,
varied naming and schema styles) and, per tool, templates of what people say with the
exact call each one means.

Template mini-language (``catalogue_data`` writes them; ``Template`` reads them):

* a leading ``q:`` marks a question, ``s:`` a statement that asks indirectly ("it's
  stuffy in here"), ``v:`` a verbless request ("tv volume 20"); no mark is an imperative
  clause (only those are wrapped politely, joined into multi-call requests or negated);
* ``(a|b|c)`` picks one wording; ``[ … ]`` is a segment said or not: one holding an
  optional argument's slot is said in ``optional_rate`` of the draws (the argument is in
  the call only when said), one holding a required argument's slot is always said except
  when the request is drawn to leave that value out (a refusal);
* ``{key}`` is a slot for the argument ``key`` (``{key:variant}`` uses the tool's slot
  pool ``"key:variant"``), drawn from the tool's value pools: (said, value) pairs,
  numbers said in words or digits with units, durations ("half an hour" → 30 or 1800
  where the schema counts seconds), times of day, dates (relative to the conversation's
  date when its system line gives one: "tomorrow", "on Friday"), open pools that must be
  copied;
* a template given as ``(text, {key: value})`` adds implied arguments ("kill the telly"
  → ``{"state": "off"}``).

Every call is validated against its tool's schema (``tool_requests.validate_call``) and
its arguments are written in schema order.  ``Generator.conversation`` packs three to
six requests on one catalogue (a subset of it, plus distractor tools from catalogues of
other families and from the tool corpus), with tool results followed by ``[]``, chained
requests, masked names and catalogue-conditioned refusals.  About one catalogue in five
is held out (``HELDOUT``): never drawn for training, used by ``eval_cases``.
"""
import copy
import datetime
import json
import re

from . import data as home
from .corpus import name_words
from .tool_requests import NEGATIONS, QUESTIONS, _pick, rename, validate_call

REFUSAL_NOTE = "no tool covers this request"
MAX_TOOLS = home.MAX_RENDERED_TOOLS
# the share of requests drawn from a tool's "plain" templates (the tool's own words: "set
# the TV volume to 20"), the rest from its paraphrases ("make it 20 on the telly")
PLAIN_RATE = 0.65
_FORMS = {"q:": "question", "s:": "statement", "v:": "verbless"}
_ALT = re.compile(r"\(([^()]*\|[^()]*)\)")
_SEGMENT = re.compile(r"\[([^\[\]]*)\]")
_SLOT = re.compile(r"\{(\w+)(?::(\w+))?\}")
_WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
           "September", "October", "November", "December"]


class CatalogueError(ValueError):
    """A catalogue entry that the generator cannot read (names the tool and the fault)."""


# ------------------------------------------------------------------ values ---

def _ordinal(n):
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _say_number(rng, n, words_p=0.35):
    if isinstance(n, float) and not n.is_integer():
        return f"{n:g}"
    n = int(n)
    return home.number_words(n) if 0 <= n < 100 and rng.random() < words_p else str(n)


def _with_unit(rng, said, units):
    if not units:
        return said
    unit = _pick(rng, units)
    return said + unit


def _duration_minutes(rng, lo, hi):
    """(minutes, said) between lo and hi: "twenty minutes", "half an hour", "2 hours"."""
    for _ in range(20):
        r = rng.random()
        if r < 0.5:
            m = rng.choice([1, 2, 3, 5, 10, 15, 20, 25, 30, 40, 45, 50, 60, 90, rng.randint(lo, min(hi, 120))])
            unit = "minute" if m == 1 else _pick(rng, ["minutes", "minutes", "mins"])
            said = f"{_say_number(rng, m, 0.5)} {unit}"
        elif r < 0.65:
            h = rng.randint(1, 4)
            m = 60 * h
            said = "an hour" if h == 1 and rng.random() < 0.5 else f"{_say_number(rng, h, 0.6)} hour{'s' if h > 1 else ''}"
        elif r < 0.85:
            m, said = _pick(rng, [(30, "half an hour"), (15, "a quarter of an hour"), (90, "an hour and a half"),
                                  (45, "three quarters of an hour"), (150, "two and a half hours"),
                                  (90, "one and a half hours"), (75, "an hour and fifteen minutes"),
                                  (120, "a couple of hours"), (20, "twenty minutes"), (10, "ten minutes")])
        else:
            h, extra = rng.randint(1, 2), rng.choice([10, 15, 20, 30, 45])
            m = 60 * h + extra
            said = f"{_say_number(rng, h, 0.5)} hour{'s' if h > 1 else ''} and {_say_number(rng, extra, 0.5)} minutes"
        if lo <= m <= hi:
            return m, said
    return None


def _duration_seconds(rng, lo, hi):
    """(seconds, said): "ninety seconds", "a minute and a half", "twenty minutes" → 1200."""
    for _ in range(20):
        r = rng.random()
        if r < 0.3:
            s = rng.choice([10, 15, 20, 30, 45, 60, 90, rng.randint(5, 59)])
            said = f"{_say_number(rng, s, 0.5)} {_pick(rng, ['seconds', 'secs', 'seconds'])}"
        elif r < 0.45:
            s, said = _pick(rng, [(90, "a minute and a half"), (30, "half a minute"), (60, "a minute"),
                                  (60, "one minute"), (150, "two and a half minutes")])
        else:
            got = _duration_minutes(rng, max(1, lo // 60), max(1, hi // 60))
            if got is None:
                continue
            s, said = got[0] * 60, got[1]
        if lo <= s <= hi:
            return s, said
    return None


def _clock(rng):
    value, said = home._clock(rng)
    return value, said.strip()


def _iso(d):
    return d.isoformat()


def _date(rng, today, bare=False):
    """(YYYY-MM-DD, said): relative to ``today`` when the conversation has a date.  Said
    to follow a clause ("on Friday", "tomorrow", "on the 3rd of May"), or ``bare`` to
    follow a preposition ("to Friday", "by the 3rd of May")."""
    on = "" if bare else "on "
    if today is not None and rng.random() < 0.65:
        r = rng.random()
        if r < 0.25:
            return _iso(today + datetime.timedelta(days=1)), "tomorrow"
        if r < 0.3:
            return _iso(today), "today"
        if r < 0.38:
            return _iso(today + datetime.timedelta(days=2)), "the day after tomorrow"
        if r < 0.7:                 # a weekday: the next one after today
            d = today + datetime.timedelta(days=rng.randint(2, 6))
            lead = "" if bare else _pick(rng, ["on ", "this ", "", "on "])
            return _iso(d), lead + _WEEKDAYS[d.weekday()]
        d = today + datetime.timedelta(days=rng.randint(3, 60))   # a day of the month, no year
        m = _MONTHS[d.month - 1]
        said = _pick(rng, [f"the {_ordinal(d.day)} of {m}", f"{m} {_ordinal(d.day)}", f"{d.day} {m}", f"{m} {d.day}"])
        return _iso(d), on + said
    year = (today.year if today is not None else rng.randint(2025, 2030)) + rng.choice([0, 0, 1])
    d = datetime.date(year, rng.randint(1, 12), rng.randint(1, 28))
    m = _MONTHS[d.month - 1]
    said = _pick(rng, [_iso(d), f"{m} {d.day}, {year}", f"{d.day} {m} {year}",
                       f"the {_ordinal(d.day)} of {m} {year}", f"{m} {_ordinal(d.day)} {year}"])
    return _iso(d), on + said


def _open_value(rng, kind):
    """A value from the open pools (``value_words.json``): only copying gets it right."""
    w = home._value_words()
    if kind == "first":
        return rng.choice(w["first_names"])
    if kind == "person":
        if rng.random() < 0.5:
            return rng.choice(w["first_names"])
        return rng.choice(w["first_names"]) + " " + rng.choice(w["last_names"])
    if kind == "title":
        n = rng.choice([1, 2, 2, 3])
        return " ".join(_open_word(rng, w).capitalize() for _ in range(n))
    if kind == "email":
        return (f"{rng.choice(w['first_names']).lower()}.{rng.choice(w['last_names']).lower()}"
                f"@{_pick(rng, ['gmail.com', 'outlook.com', 'work.co.uk', 'example.org'])}")
    raise CatalogueError(f"open pool {kind!r} is unknown (person, first, title, email)")


_NOT_VALUES = {"none", "null", "true", "false", "nan"}


def _open_word(rng, w):
    """A word of the open pool that does not read as a JSON literal ("None", "True")."""
    while True:
        word = rng.choice(w["words"])
        if word.lower() not in _NOT_VALUES:
            return word


def _code(rng, digits):
    """(value, said) of a numeric code said with spaces or in groups: "4 8 1 2" → "4812"."""
    value = "".join(str(rng.randint(0, 9)) for _ in range(digits))
    r = rng.random()
    if r < 0.5:
        said = value
    elif r < 0.8:
        said = " ".join(value)
    else:
        said = value[:2] + " " + value[2:]
    return value, said


class Pools:
    """Resolves slot specs; ``shared`` are the named pools (``@NAME``)."""

    def __init__(self, shared):
        self.shared = shared

    def draw(self, rng, spec, today, where):
        """(value, said) or None when the spec cannot give one now (a relative date
        without a conversation date falls back to an absolute one)."""
        if isinstance(spec, str):
            if not spec.startswith("@") or spec[1:] not in self.shared:
                raise CatalogueError(f"{where}: slot pool {spec!r} is not a shared pool name")
            return self.draw(rng, self.shared[spec[1:]], today, where)
        if isinstance(spec, list):
            if not spec:
                raise CatalogueError(f"{where}: empty slot pool")
            entry = _pick(rng, spec)
            if isinstance(entry, tuple):
                return entry[1], entry[0]
            if isinstance(entry, str) and entry.startswith("@"):
                return self.draw(rng, entry, today, where)
            return entry, entry
        if not isinstance(spec, tuple) or not spec:
            raise CatalogueError(f"{where}: slot spec {spec!r} is not a pool, list or tuple")
        kind, args = spec[0], spec[1:]
        if kind == "any":
            return self.draw(rng, _pick(rng, list(args)), today, where)
        if kind == "int":
            lo, hi = args[0], args[1]
            units = args[2] if len(args) > 2 else None
            if hi - lo > 40 and rng.random() < 0.5:
                step = 5 if hi - lo <= 200 else 10 ** max(1, len(str(hi - lo)) - 2)
                n = step * rng.randint(-(-lo // step), hi // step)
                n = n if lo <= n <= hi else rng.randint(lo, hi)
            else:
                n = rng.randint(lo, hi)
            return n, _with_unit(rng, _say_number(rng, n), units)
        if kind == "num":
            lo, hi, step = args[0], args[1], args[2]
            units = args[3] if len(args) > 3 else None
            k = rng.randint(int(round(lo / step)), int(round(hi / step)))
            n = round(k * step, 6)
            n = int(n) if float(n).is_integer() else n
            return n, _with_unit(rng, _say_number(rng, n, 0.25), units)
        if kind == "minutes":
            return _duration_minutes(rng, args[0], args[1])
        if kind == "seconds":
            return _duration_seconds(rng, args[0], args[1])
        if kind == "clock":
            return _clock(rng)
        if kind == "date":
            return _date(rng, today, bare=bool(args) and args[0] == "bare")
        if kind == "open":
            v = _open_value(rng, args[0])
            return v, v
        if kind == "code":
            return _code(rng, args[0])
        if kind == "list":          # ("list", pool, lo, hi): 1-3 distinct members said with "and"
            pool, lo, hi = args
            n = rng.randint(lo, hi)
            values, saids = [], []
            for _ in range(n * 3):
                v, s = self.draw(rng, pool, today, where)
                if v not in values:
                    values.append(v)
                    saids.append(s)
                if len(values) == n:
                    break
            said = saids[0] if len(saids) == 1 else ", ".join(saids[:-1]) + " and " + saids[-1]
            return values, said
        if kind == "fixed":         # ("fixed", value, [sayings]): one value said many ways
            return args[0], _pick(rng, args[1])
        raise CatalogueError(f"{where}: slot kind {kind!r} is unknown")


# --------------------------------------------------------------- templates ---

class Template:
    """One request template of a tool (see the module docstring)."""

    def __init__(self, raw, where):
        fixed = {}
        if isinstance(raw, tuple):
            raw, fixed = raw
        if not isinstance(raw, str) or not isinstance(fixed, dict):
            raise CatalogueError(f"{where}: a template is a string or (string, dict), got {raw!r}")
        self.form = "imperative"
        for mark, form in _FORMS.items():
            if raw.startswith(mark):
                self.form, raw = form, raw[len(mark):].strip()
        self.text, self.fixed, self.where = raw, fixed, where
        self.keys = {m.group(1) for m in _SLOT.finditer(raw)}
        # keys a missing-value refusal may leave out: inside a segment
        self.droppable = {m.group(1) for seg in _SEGMENT.finditer(raw) for m in _SLOT.finditer(seg.group(1))}

    def expand(self, rng, optional_rate, required, leave_out=None, keep=None):
        """The text with wordings picked and segments kept or dropped (slots still
        unfilled)."""
        text = self.text
        while True:
            m = _ALT.search(text)
            if not m:
                break
            text = text[:m.start()] + _pick(rng, m.group(1).split("|")) + text[m.end():]

        def segment(m):
            keys = {s.group(1) for s in _SLOT.finditer(m.group(1))}
            if leave_out in keys:
                return ""
            if keys & required or keep in keys:
                return m.group(1)
            if keys:
                return m.group(1) if rng.random() < optional_rate else ""
            return m.group(1) if rng.random() < 0.5 else ""
        return _SEGMENT.sub(segment, text)


def _tidy(text):
    text = re.sub(r"\s+", " ", text).strip()
    text = re.sub(r"\s+([,.?!])", r"\1", text)
    text = re.sub(r",+", ",", text)
    text = re.sub(r"\b(the|a) (the|my) ", r"\2 ", text)          # "the the Lakers", "a my list"
    return text.strip(" ,")


class CatalogueTool:
    """A tool of a catalogue: its schema, templates, value pools and result payloads."""

    def __init__(self, entry, catalogue, pools):
        self.catalogue = catalogue
        self.tool = entry["tool"]
        self.name = self.tool["name"]
        where = f"catalogue {catalogue.id!r} tool {self.name!r}"
        params = self.tool.get("parameters") or {}
        self.props = params.get("properties") or {}
        self.required = set(params.get("required") or [])
        self.order = list(self.props)
        self.slots = entry.get("slots") or {}
        self.bad = entry.get("bad") or {}
        self.result = entry.get("result")
        self.covered_by = set(entry.get("covered_by") or [])
        self.distinct = [tuple(pair) for pair in entry.get("distinct") or []]   # keys whose values must differ
        self.pools = pools
        self.said = [Template(t, f"{where} template {i}") for i, t in enumerate(entry["say"])]
        self.plain = [Template(t, f"{where} plain template {i}") for i, t in enumerate(entry.get("plain") or [])]
        self.templates = self.said + self.plain
        for t in self.templates:
            unknown = (t.keys | set(t.fixed)) - set(self.props)
            if unknown:
                raise CatalogueError(f"{t.where}: {sorted(unknown)} are not parameters of the tool")
        self.where = where
        # a tool asked for mostly with questions reads something: "don't …" makes no refusal of it
        self.getter = 2 * sum(t.form == "question" for t in self.templates) >= len(self.templates)
        self.imperative = any(t.form == "imperative" for t in self.templates)
        # required keys some template can leave unsaid (a refusal: the value is missing)
        self.droppable_required = [k for k in self.order if k in self.required
                                   and any(k in t.droppable for t in self.templates)]

    # the pool a slot draws from: its own, else one read from the schema
    def _spec(self, key, variant):
        if variant:
            spec = self.slots.get(f"{key}:{variant}")
            if spec is None:
                raise CatalogueError(f"{self.where}: no slot pool {key}:{variant}")
            return spec
        if key in self.slots:
            return self.slots[key]
        s = self.props[key]
        if "enum" in s:
            return [(str(v).replace("_", " "), v) for v in s["enum"]]
        if s.get("type") == "integer" and "minimum" in s and "maximum" in s:
            return ("int", s["minimum"], s["maximum"])
        raise CatalogueError(f"{self.where}: parameter {key!r} has no slot pool")

    def _bad_said(self, rng, key):
        """Words for a value the schema refuses (outside the bounds or the enum)."""
        if key in self.bad:
            return _pick(rng, self.bad[key])
        s = self.props[key]
        if s.get("type") in ("integer", "number") and ("minimum" in s or "maximum" in s):
            options = []
            if "maximum" in s:
                hi = s["maximum"]
                options.append(int(hi) + _pick(rng, [1, 5, 10, 50] if hi >= 10 else [1, 2, 5]))
            if "minimum" in s and s["minimum"] > 0:
                options.append(int(s["minimum"]) - _pick(rng, [1, 1, 2, 5]) if s["minimum"] >= 2 else 0)
            options = [o for o in options if o >= 0]
            if not options:
                return None
            spec = self.slots.get(key)
            units = spec[3] if isinstance(spec, tuple) and spec[0] == "int" and len(spec) > 3 else None
            return _with_unit(rng, _say_number(rng, _pick(rng, options)), units)
        return None

    def bad_keys(self):
        return [k for k in self.order if k in self.bad or (
            self.props[k].get("type") in ("integer", "number") and ("maximum" in self.props[k]))]

    def draw(self, rng, today, optional_rate=0.4, leave_out=None, bad_key=None, forms=None, plain_rate=PLAIN_RATE):
        """(clause, form, call, notes, said strings) for one request, or None; a note
        is (key, " = value from \"said\"").
        ``leave_out``: a required key left unsaid (a refusal); ``bad_key``: its value said
        outside the schema (a refusal); ``forms``: the template forms allowed."""
        pool = self.templates
        if self.plain and leave_out is None and bad_key is None:
            pool = self.plain if rng.random() < plain_rate else self.said
        usable = [t for t in pool
                  if (forms is None or t.form in forms)
                  and (leave_out is None or leave_out in t.droppable)
                  and (bad_key is None or bad_key in t.keys)]
        if not usable:
            return None
        template = _pick(rng, usable)
        text = template.expand(rng, optional_rate, self.required, leave_out, keep=bad_key)
        args, said_of, notes, saids = dict(template.fixed), {}, [], []
        bad_done = False

        def fill(m):
            nonlocal bad_done
            key, variant = m.group(1), m.group(2)
            if key == bad_key:
                said = self._bad_said(rng, key)
                if said is None:
                    raise _NoDraw
                bad_done = True
                return said
            if key in said_of:
                return said_of[key]
            got = self.pools.draw(rng, self._spec(key, variant), today, self.where)
            if got is None:
                raise _NoDraw
            value, said = got
            args[key] = value
            said_of[key] = said
            return said
        try:
            text = _SLOT.sub(fill, text)
        except _NoDraw:
            return None
        if bad_key is not None and not bad_done:
            return None
        clause = _tidy(text)
        if any(a in args and b in args and args[a] == args[b] for a, b in self.distinct):
            return None
        if leave_out is not None:
            if leave_out in args or not (self.required - {leave_out}) <= set(args):
                return None
        elif bad_key is None:
            if not validate_call(self.tool, args):
                return None
        for key in self.order:
            if key not in args or leave_out is not None or bad_key is not None:
                continue
            value = args[key]
            said = said_of.get(key)
            note = f" = {home.compact(value)}"
            if said is not None and said != value and said != str(value):
                note += f' from "{said}"'
            notes.append((key, note))
            if said is not None:
                saids.append(said)
        call = {"name": self.name, "arguments": {k: args[k] for k in self.order if k in args}}
        return clause, template.form, call, notes, saids

    def result_for(self, rng, arguments):
        spec = self.result
        if isinstance(spec, list):
            spec = _pick(rng, spec)
        if spec is None:
            out = {"status": "ok"}
            out.update(arguments)
            return out
        return _resolve(rng, spec, arguments)


class _NoDraw(Exception):
    pass


def _resolve(rng, spec, arguments):
    """A result payload: ``"$key"`` is the call's argument (the field dropped when the
    call has none), ``"#int:lo:hi"``, ``"#num:lo:hi"``, ``"#pick:a|b"``, ``"#clock"``."""
    if isinstance(spec, dict):
        out = {}
        for k, v in spec.items():
            if isinstance(v, str) and v.startswith("$") and v[1:] not in arguments:
                continue
            out[k] = _resolve(rng, v, arguments)
        return out
    if isinstance(spec, list):
        return [_resolve(rng, v, arguments) for v in spec]
    if isinstance(spec, str):
        if spec.startswith("$"):
            return arguments[spec[1:]]
        if spec.startswith("#int:"):
            lo, hi = spec[5:].split(":")
            return rng.randint(int(lo), int(hi))
        if spec.startswith("#num:"):
            lo, hi = spec[5:].split(":")
            return round(rng.uniform(float(lo), float(hi)), 1)
        if spec.startswith("#pick:"):
            return _pick(rng, spec[6:].split("|"))
        if spec == "#clock":
            return f"{rng.randint(0, 23):02d}:{_pick(rng, [0, 15, 30, 45, 10, 50]):02d}"
    return spec


class Catalogue:
    def __init__(self, entry, pools):
        self.id = entry["id"]
        self.domain = entry["domain"]
        self.family = entry["family"]
        self.heldout = bool(entry.get("heldout"))
        self.avoid = re.compile(entry["avoid"], re.I)
        self.chat = list(entry.get("chat") or [])
        self.tools = [CatalogueTool(t, self, pools) for t in entry["tools"]]
        self.by_name = {t.name: t for t in self.tools}


_LOADED = None


def load():
    """All catalogues (train and held out), read once."""
    global _LOADED
    if _LOADED is None:
        from . import catalogue_data as d
        pools = Pools(d.POOLS)
        cats = [Catalogue(e, pools) for e in d.CATALOGUES]
        names = [t.name for c in cats for t in c.tools]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise CatalogueError(f"catalogue tool names must be unique across catalogues: {dup}")
        _LOADED = cats
    return _LOADED


def catalogues(split="train"):
    """The catalogues of ``split``: "train", "heldout" or "all"."""
    if split not in ("train", "heldout", "all"):
        raise ValueError(f"split must be 'train', 'heldout' or 'all', got {split!r}")
    return [c for c in load() if split == "all" or c.heldout == (split == "heldout")]


def tool_dicts(split="all"):
    """The tools of ``split``'s catalogues as {name, description, parameters} with their
    catalogue's domain (``corpus.held_out_domain`` reads it)."""
    return [dict(t.tool, domain=c.domain) for c in catalogues(split) for t in c.tools]


# ---------------------------------------------------------------- requests ---

CHAT = [
    "what's the tallest mountain in Africa", "who wrote Pride and Prejudice", "how are you doing today",
    "tell me a joke", "what's the capital of Australia", "thanks, that's all", "never mind",
    "how many continents are there", "what does 'ubiquitous' mean", "you're very helpful",
    "what's seven times eight", "who was the first person on the moon", "good morning",
    "that's brilliant, cheers", "sorry, I was talking to someone else", "hmm, let me think",
    "what's your favourite film", "how old is the universe", "are you listening",
    "ok, nothing else for now", "what's a group of crows called", "how do bees make honey",
    "is it pronounced gif or jif", "I'm so tired today", "what's the longest river in Europe",
]


def _wrap(rng, clause, form):
    if form == "imperative":
        return home._wrap(rng, clause)
    if form == "question":
        q = clause if clause.endswith("?") else clause + "?"
        return (_pick(rng, ["hey, ", "quick question, ", "", "", "", ""]) + q) if rng.random() < 0.3 else q
    if form == "verbless":
        return _pick(rng, ["{c}", "{c}", "{c}", "{c} please", "{c}, thanks", "{c}."]).replace("{c}", clause)
    return clause if rng.random() < 0.8 else _pick(rng, ["hmm, ", "ugh, ", "so ", "right, "]) + clause


def _keep_values(query, saids):
    """``query`` with a said value at its start written as said (a capital added by the
    sentence would change the string the call copies)."""
    for said in saids:
        if said[:1].islower() and query.startswith(said[:1].upper() + said[1:]):
            return said + query[len(said):]
    return query


def _system(rng, with_date):
    """The agent's facts line and the date it gives (None when it gives none)."""
    if not with_date:
        return "", None
    today = datetime.date(rng.randint(2025, 2030), rng.randint(1, 12), rng.randint(1, 28))
    line = f"date: {today.isoformat()} {_WEEKDAYS[today.weekday()][:3]} {rng.randint(6, 23):02d}:{rng.randint(0, 59):02d}"
    if rng.random() < 0.15:
        line += "; " + "; ".join(rng.sample(home.SYSTEM_FACTS, rng.randint(1, 2)))
    return line, today


def _renamed(rng, tool):
    """``tool_requests.rename``'s masked copy and the key mapping (old → new)."""
    new = rename(rng, tool)
    old_keys = list((tool.get("parameters") or {}).get("properties") or {})
    new_keys = list(new["parameters"]["properties"])
    return new, dict(zip(old_keys, new_keys))


def _rename_call(call, names, keys):
    name = call["name"]
    mapping = keys.get(name, {})
    return {"name": names.get(name, name),
            "arguments": {mapping.get(k, k): v for k, v in call["arguments"].items()}}


class Generator:
    """Catalogue conversations; all randomness from one seeded Random.

    ``distractors``: extra tool dicts (the tool corpus's training split, from ``mix``)
    that may be shown beside a catalogue when they do not touch its domain (the
    catalogue's ``avoid`` pattern)."""

    def __init__(self, seed=0, distractors=None, split="train", rename_share=0.25, think_rate=0.5,
                 typo_rate=0.04, result_share=0.45):
        self.rng = home._VersionedRandom(seed)
        self.rng.more_phrasings = True
        self.cats = catalogues(split)
        if not self.cats:
            raise ValueError(f"no catalogues in split {split!r}")
        self.distractors = list(distractors or [])
        self.rename_share, self.think_rate = rename_share, think_rate
        self.typo_rate, self.result_share = typo_rate, result_share

    # -------------------------------------------------------- catalogue shown ---
    def _shown(self, cat, with_distractors=True):
        """(catalogue tools shown, distractor tools shown) for one conversation."""
        rng = self.rng
        if with_distractors:
            k_total = _pick(rng, [3, 4, 4, 5, 5, 5])
            n_gold = min(len(cat.tools), k_total, max(2, k_total - _pick(rng, [0, 1, 1, 2, 2])))
        else:           # an evaluation case: three to five tools of the catalogue alone
            k_total = n_gold = rng.randint(3, min(MAX_TOOLS, len(cat.tools)))
        gold = rng.sample(cat.tools, n_gold)
        others = []
        if with_distractors:
            pool = [t for c in self.cats if c.family != cat.family for t in c.tools]
            names = {t.name for t in gold}
            for _ in range(k_total - n_gold):
                if self.distractors and rng.random() < 0.5:
                    for _ in range(6):
                        cand = _pick(rng, self.distractors)
                        text = cand["name"] + " " + cand.get("description", "")
                        if cand["name"] not in names and not cat.avoid.search(text):
                            others.append(cand)
                            names.add(cand["name"])
                            break
                elif pool:
                    cand = _pick(rng, pool)
                    if cand.name not in names and not cat.avoid.search(cand.name + " " + cand.tool["description"]):
                        others.append(cand)
                        names.add(cand.name)
        return gold, others

    # ------------------------------------------------------------- requests ---
    def _calls(self, today, tools, forms=None):
        """(query, form, calls, notes, saids) for calls on ``tools`` in order, or None."""
        rng = self.rng
        drawn = []
        for t in tools:
            got = None
            for _ in range(6):
                got = t.draw(rng, today, forms=forms)
                if got is not None:
                    break
            if got is None:
                return None
            drawn.append(got)
        if len(drawn) == 1:
            clause, form, call, notes, saids = drawn[0]
            return _wrap(rng, clause, form), form, [call], [notes], saids
        text = drawn[0][0]
        for d in drawn[1:]:
            j = _pick(rng, home.JOINERS + [", then ", ", after that ", " and after that "])
            text += j + (d[0][:1].upper() + d[0][1:] if j.startswith(". ") else d[0])
        if rng.random() < 0.4:
            text = home._wrap(rng, text)
        return text, "imperative", [d[2] for d in drawn], [d[3] for d in drawn], [s for d in drawn for s in d[4]]

    def _refusal(self, cat, shown_tools, shown_all, today):
        """(query, note, saids, kind) of a request the shown catalogue must not answer."""
        rng = self.rng
        names = {t["name"] if isinstance(t, dict) else t.name for t in shown_all}
        for _ in range(8):
            r = rng.random()
            if r < 0.2:
                pool = CHAT + QUESTIONS + cat.chat * 3
                text = _pick(rng, pool)
                if text in cat.chat or not any(c.avoid.search(text) for c in self._shown_cats(shown_tools)):
                    return text, REFUSAL_NOTE, [], "refuse"
            elif r < 0.4:       # a tool of this catalogue that is not shown: a near miss
                missing = [t for t in cat.tools if t.name not in names and not (t.covered_by & names)]
                if missing:
                    t = _pick(rng, missing)
                    got = t.draw(rng, today, optional_rate=0.3)
                    if got is not None:
                        return _wrap(rng, got[0], got[1]), REFUSAL_NOTE, got[4], "refuse_missing_tool"
            elif r < 0.62:      # a required value left unsaid
                askable = [t for t in shown_tools if t.droppable_required]
                if askable:
                    t = _pick(rng, askable)
                    keys = t.droppable_required
                    key = _pick(rng, keys)
                    got = t.draw(rng, today, optional_rate=0.2, leave_out=key)
                    if got is not None:
                        return _wrap(rng, got[0], got[1]), f"{t.name}: {key} is not given", got[4], "refuse_missing_value"
            elif r < 0.82:      # a value outside the range or the enum
                sayable = [t for t in shown_tools if t.bad_keys()]
                if sayable:
                    t = _pick(rng, sayable)
                    keys = t.bad_keys()
                    got = t.draw(rng, today, optional_rate=0.2, bad_key=_pick(rng, keys))
                    if got is not None:
                        return (_wrap(rng, got[0], got[1]), f"{t.name}: a value is outside what the tool accepts",
                                got[4], "refuse_bad_value")
            else:               # negated or deferred (of a tool that acts)
                actors = [t for t in shown_tools if not t.getter]
                if not actors:
                    continue
                t = _pick(rng, actors)
                got = t.draw(rng, today, forms=("imperative",))
                if got is not None:
                    return (_pick(rng, NEGATIONS).replace("{c}", got[0]), "the request says not to do it",
                            got[4], "refuse_negated")
        return _pick(rng, CHAT), REFUSAL_NOTE, [], "refuse"

    def _shown_cats(self, shown_tools):
        out = []
        for t in shown_tools:
            if t.catalogue not in out:
                out.append(t.catalogue)
        return out

    def _turn(self, cat, gold, others, today, first):
        """(query, calls, notes per call or the refusal's note, said values, kind)."""
        rng = self.rng
        catalogue_tools = gold + [t for t in others if isinstance(t, CatalogueTool)]
        chainable = [t for t in catalogue_tools if t.imperative]
        r = rng.random()
        if r < 0.58 or (first and r < 0.66):
            t = _pick(rng, gold) if rng.random() < 0.8 or len(catalogue_tools) == len(gold) else \
                _pick(rng, catalogue_tools)
            got = self._calls(today, [t])
            kind = "single"
        elif r < 0.76 and len(chainable) >= 2:
            k = min(len(chainable), _pick(rng, [2, 2, 2, 3]))
            got = self._calls(today, rng.sample(chainable, k), forms=("imperative",))
            kind = "multi"
        else:
            got = None
        if got is None:
            query, note, saids, kind = self._refusal(cat, catalogue_tools, gold + others, today)
            return query, [], note, saids, kind
        query, _, calls, notes, saids = got
        return query, calls, notes, saids, kind

    def conversation(self, cat=None, with_date=None):
        """One training conversation (``needle_cy.training.data``'s example shape)."""
        rng = self.rng
        cat = cat or _pick(rng, self.cats)
        system, today = _system(rng, rng.random() < 0.8 if with_date is None else with_date)
        gold, others = self._shown(cat)
        shown = gold + others
        rng.shuffle(shown)
        tool_of = {}
        tools, names, keys = [], {}, {}
        renamed = rng.random() < self.rename_share
        for t in shown:
            schema = t.tool if isinstance(t, CatalogueTool) else {
                "name": t["name"], "description": t["description"], "parameters": t["parameters"]}
            if renamed and rng.random() < 0.85:
                new, mapping = _renamed(rng, schema)
                names[schema["name"]], keys[schema["name"]] = new["name"], mapping
                schema = new
            tools.append(copy.deepcopy(schema))
            tool_of[schema["name"]] = t
        if len({t["name"] for t in tools}) != len(tools):
            return None
        by_name = {t["name"]: t for t in tools}
        turns = []
        for i in range(_pick(rng, [3, 3, 4, 4, 5, 6])):
            query, originals, notes, saids, kind = self._turn(cat, gold, others, today, first=(i == 0))
            answers = [_rename_call(c, names, keys) for c in originals]
            if answers:
                reasoning = home._reasoning(answers, [[keys.get(o["name"], {}).get(k, k) + rest for k, rest in n]
                                                      for o, n in zip(originals, notes)])
            else:
                reasoning = notes
            for call in answers:
                if not validate_call(by_name[call["name"]], call["arguments"]):
                    raise CatalogueError(f"generated call {call} does not validate")
            if self.typo_rate and rng.random() < 0.3:
                query = home._typos(rng, query, saids, self.typo_rate * 4)
            query = _keep_values(home._capitalise(rng, query), saids)
            turn = {"query": query, "answers": answers, "kind": kind,
                    "reasoning": reasoning if rng.random() < self.think_rate else ""}
            if answers and rng.random() < self.result_share:
                results = []
                for o, c in zip(originals, answers):
                    t = tool_of[c["name"]]
                    results.append({"name": c["name"], "result": t.result_for(rng, o["arguments"])})
                turn["results"] = json.dumps(results)
            turns.append(turn)
        ex = home.packed_example(turns, source="catalogue", catalogue=cat.id, system=system,
                                 tools=tools, renamed=renamed)
        ex["packed"] = len(turns)
        return ex

    def example(self):
        for _ in range(10):
            ex = self.conversation()
            if ex is not None:
                return ex
        raise RuntimeError("could not draw a catalogue conversation in 10 tries")

    # ------------------------------------------------------------ eval cases ---
    def case(self, cat, kind):
        """(tools, query, answers, kind, said values) of one single-turn case on ``cat``
        (its tools only, at most five): ``kind`` is "single", "multi" or "refuse"; the
        date is not known (the eval adds none)."""
        rng = self.rng
        gold, _ = self._shown(cat, with_distractors=False)
        if kind == "single":
            got = self._calls(None, [_pick(rng, gold)])
            sub = "single"
        elif kind == "multi":
            chainable = [t for t in gold if t.imperative]
            if len(chainable) < 2:
                return None
            got = self._calls(None, rng.sample(chainable, min(len(chainable), _pick(rng, [2, 2, 3]))),
                              forms=("imperative",))
            sub = "multi"
        else:
            query, _, saids, sub = self._refusal(cat, gold, gold, None)
            return [t.tool for t in gold], query, [], sub, saids
        if got is None:
            return None
        return [t.tool for t in gold], got[0], got[2], sub, got[4]


def generate(n, seed=0, **kwargs):
    gen = Generator(seed=seed, **kwargs)
    return [gen.example() for _ in range(n)]


def eval_cases(n, seed, split="heldout"):
    """``n`` single-turn cases in ``needle_cy.eval``'s format on the held-out catalogues
    (``split``), each with its own ``tools``, ``category`` (single/multi/refuse) and
    ``kind``: about 60 % single, 17 % multi, 23 % refuse."""
    gen = Generator(seed=seed, split=split, typo_rate=0.0)
    out, i = [], 0
    while len(out) < n:
        i += 1
        cat = _pick(gen.rng, gen.cats)
        r = gen.rng.random()
        category = "single" if r < 0.6 else "multi" if r < 0.77 else "refuse"
        got = gen.case(cat, category)
        if got is None:
            continue
        tools, query, answers, kind, saids = got
        query = _keep_values(home._capitalise(gen.rng, query), saids)
        out.append({"id": f"c{seed}-{i}", "category": category, "kind": kind, "catalogue": cat.id,
                    "tools": copy.deepcopy(tools), "query": query, "answers": answers})
    return out


# ------------------------------------------------------------ measurement ---

STOPWORDS = frozenset("""
a an the and or but if then else of to in on at by for with from into onto about as is are was
were be been being am do does did done doing have has had having i me my mine we us our you your
yours he him his she her it its they them their this that these those there here what which who
whom whose when where why how all any both each few more most other some such no nor not only own
same so than too very can could will would shall should may might must just also please ok okay
hey yes let lets i'm i'd i'll it's that's what's don't can't won't up down out off over again once
now get got set make want need like thanks thank you'd you're we're they're there's here's needle
one bit quick right actually really
""".split())


def _stem(w):
    """A light stemmer: plural 's', 'ies', 'ing' and 'ed' endings (both sides alike)."""
    if len(w) > 4 and w.endswith("ies"):
        return w[:-3] + "y"
    if len(w) > 6 and w.endswith("ing"):
        return w[:-3]
    if len(w) > 4 and w.endswith("ed"):
        return w[:-2]
    if len(w) > 3 and w.endswith("s") and not w.endswith("ss"):
        return w[:-1]
    return w


def content_words(text):
    """Lower-case content words of ``text`` (stop words and words under 3 letters out,
    a plural 's' stripped)."""
    return [_stem(w) for w in re.findall(r"[a-z]+", text.lower()) if w not in STOPWORDS and len(w) > 2]


def tool_text_words(tool):
    """The content words of a tool's text: name words, description, parameter names and
    descriptions, enum members."""
    parts = [" ".join(name_words(tool["name"])), tool.get("description", "")]
    for key, s in ((tool.get("parameters") or {}).get("properties") or {}).items():
        parts.append(" ".join(name_words(key)))
        if isinstance(s, dict):
            parts.append(str(s.get("description", "")))
            for v in s.get("enum") or (s.get("items") or {}).get("enum") or []:
                parts.append(str(v).replace("_", " "))
    return set(content_words(" ".join(parts)))


def overlap(cases):
    """Over the one-call cases: the share of request content words found in the gold
    tool's text (pooled over words, and the mean per request) and the share of requests
    that share no content word with it."""
    total = hit = none = n = 0
    per = []
    for c in cases:
        if len(c["answers"]) != 1:
            continue
        tool = next(t for t in c["tools"] if t["name"] == c["answers"][0]["name"])
        gold, words = tool_text_words(tool), content_words(c["query"])
        if not words:
            continue
        h = sum(w in gold for w in words)
        total, hit, n, none = total + len(words), hit + h, n + 1, none + (h == 0)
        per.append(h / len(words))
    if not n:
        return {"requests": 0, "pooled": 0.0, "mean": 0.0, "no_shared_word": 0.0}
    return {"requests": n, "pooled": hit / total, "mean": sum(per) / n, "no_shared_word": none / n}


def single_requests(n, seed, split="train"):
    """``n`` one-call requests on ``split``'s catalogues as eval-format cases (the
    overlap measure's sample)."""
    gen = Generator(seed=seed, split=split, typo_rate=0.0)
    out = []
    while len(out) < n:
        cat = _pick(gen.rng, gen.cats)
        got = gen.case(cat, "single")
        if got is not None:
            tools, query, answers, kind, _ = got
            out.append({"category": "single", "tools": tools, "query": query, "answers": answers})
    return out


def main(argv=None):
    import argparse

    parser = argparse.ArgumentParser(prog="python -m needle_cy.training.catalogues",
                                     description="Catalogue conversations, held-out cases, word overlap.")
    parser.add_argument("--out")
    parser.add_argument("-n", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-cases", action="store_true",
                        help="write needle_cy.eval cases on the held-out catalogues")
    parser.add_argument("--overlap", nargs="?", const="", metavar="CASES_JSONL",
                        help="print the word-overlap figures of a cases file, or of n generated "
                             "one-call requests on the training catalogues")
    args = parser.parse_args(argv)
    if args.overlap is not None:
        if args.overlap:
            with open(args.overlap, encoding="utf-8") as handle:
                cases = [json.loads(line) for line in handle if line.strip()]
        else:
            cases = single_requests(args.n, args.seed)
        print(json.dumps(overlap(cases)))
        return
    if not args.out:
        parser.error("--out is required")
    with open(args.out, "w", encoding="utf-8") as handle:
        if args.eval_cases:
            for case in eval_cases(args.n, args.seed):
                handle.write(json.dumps(case, ensure_ascii=False) + "\n")
        else:
            for ex in generate(args.n, seed=args.seed):
                handle.write(json.dumps(ex, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
