"""Requests and their answers for any tool definition: the schema-general generator.

Given a tool (name, description, JSON-Schema ``parameters``) this module writes what a
person would say to have it called, and the call that answers it, by reading the schema
alone: nothing here knows a particular tool.

* **The action** comes from the tool's name (split at ``_``, ``.`` and camelCase; Home
  Assistant's ``<domain>_<service>`` read as "<service> the <domain>") and from its
  description turned imperative ("Schedules the wallbox to …" → "schedule the wallbox
  to …"), with verb synonyms people use ("switch on" for turn on, "look up" for search).
* **Each argument** is drawn from its schema and said as people say it: enum members
  with spaces for underscores, numbers inside the bounds in digits or words with the
  description's unit, booleans as "with …" / "without …", times of day and dates in
  spoken forms where a pattern, format or description asks for them, pattern strings
  sampled from the pattern, and free strings from open word and name pools, copied
  verbatim.  Optional arguments appear only when said.
* **Answers** list the calls in the order said, arguments in schema order, each
  validated with ``jsonschema`` (``validate_call``) before it is written.
* **Refusals depend on the catalogue shown**: the request for a tool whose tool was
  removed, a required value missing, a value outside the range or enum, a negated or
  deferred request, chit-chat.
* **With ``rng.paraphrase``** (mix version 5) a request is said as people say it rather
  than in the tool's words: ``needle_cy.training.paraphrase`` has the tables and the
  reading of the action; ``ToolPlan.request`` returns a ``Clause`` that knows its form
  (command, question, noun phrase, need), and ``wrap`` / ``join_clauses`` build the
  request around it.

``needle_cy.training.mix`` draws the catalogues (corpus tools, the smart-home tools,
renamed tools) and packs several requests into one conversation.
"""
import functools
import json
import os
import random
import re
import string

from . import data as home
from . import paraphrase as para
from .corpus import name_words

# ------------------------------------------------------------------ words ---

# verbs a tool name may start with, and what people say instead
VERB_SYNONYMS = {
    "set": ["set", "change", "adjust", "put"], "get": ["get", "check", "show me", "tell me"],
    "fetch": ["fetch", "get", "show me"], "retrieve": ["retrieve", "get", "show me"],
    "check": ["check", "look at", "tell me"], "show": ["show", "show me", "display"],
    "list": ["list", "show me", "what are"], "find": ["find", "look for", "search for"],
    "search": ["search", "search for", "look up", "find"], "lookup": ["look up", "find"],
    "start": ["start", "begin", "kick off", "launch"], "stop": ["stop", "end", "halt"],
    "pause": ["pause", "hold"], "resume": ["resume", "continue", "restart"],
    "create": ["create", "make", "add", "set up"], "add": ["add", "put", "include"],
    "delete": ["delete", "remove", "erase"], "remove": ["remove", "delete", "take off"],
    "update": ["update", "change", "edit"], "send": ["send", "dispatch"],
    "book": ["book", "reserve"], "reserve": ["reserve", "book"], "cancel": ["cancel", "call off"],
    "schedule": ["schedule", "plan", "set up"], "open": ["open"], "close": ["close", "shut"],
    "turn": ["turn", "switch"], "enable": ["enable", "turn on", "activate", "switch on"],
    "disable": ["disable", "turn off", "deactivate", "switch off"],
    "activate": ["activate", "turn on", "enable"], "deactivate": ["deactivate", "turn off"],
    "play": ["play", "put on"], "record": ["record", "log"], "log": ["log", "record", "note"],
    "increase": ["increase", "raise", "turn up"], "decrease": ["decrease", "lower", "turn down"],
    "calculate": ["calculate", "compute", "work out", "figure out"], "compute": ["compute", "calculate"],
    "convert": ["convert", "change"], "translate": ["translate"], "order": ["order", "get me"],
    "request": ["request", "ask for"], "report": ["report", "flag"], "share": ["share", "send"],
    "locate": ["locate", "find"], "suggest": ["suggest", "recommend"], "run": ["run", "execute"],
    "reset": ["reset"], "toggle": ["toggle", "flip"], "lock": ["lock"], "unlock": ["unlock"],
    "arm": ["arm"], "disarm": ["disarm"], "select": ["select", "choose", "pick"],
    "generate": ["generate", "make", "create"], "analyze": ["analyze", "analyse", "examine"],
    "read": ["read", "show me"], "write": ["write"], "post": ["post", "publish"],
    "upload": ["upload"], "download": ["download"], "notify": ["notify", "alert"],
    "assign": ["assign"], "move": ["move"], "copy": ["copy"], "rename": ["rename"],
    "mark": ["mark", "flag"], "clear": ["clear", "empty"], "save": ["save", "store", "keep"],
    "load": ["load", "open"], "reload": ["reload", "refresh"], "refresh": ["refresh", "reload"],
    "sync": ["sync", "synchronise"], "predict": ["predict", "forecast", "estimate"],
    "estimate": ["estimate", "work out"], "measure": ["measure"], "scan": ["scan"],
    "query": ["query", "look up"], "edit": ["edit", "change"], "register": ["register", "sign up"],
    "subscribe": ["subscribe to"], "join": ["join"], "invite": ["invite"], "mute": ["mute"],
    "unmute": ["unmute"], "skip": ["skip"], "rate": ["rate"], "review": ["review"],
    "verify": ["verify", "confirm"], "validate": ["validate", "check"], "count": ["count"],
    "sort": ["sort"], "filter": ["filter"], "restart": ["restart", "reboot"],
    "reboot": ["reboot", "restart"], "press": ["press", "push"], "trigger": ["trigger", "fire"],
    "apply": ["apply"], "install": ["install"], "print": ["print"], "dim": ["dim"],
}
VERBS = set(VERB_SYNONYMS) | {"make", "do", "go", "give", "take", "tell", "find", "view", "use",
                              "watch", "listen", "buy", "sell", "pay", "transfer", "track",
                              "close", "plan", "note", "issue", "fill", "empty", "wake", "raise"}
# verbs a description may begin with (third person or imperative)
DESCRIPTION_VERBS = VERBS | set("""
heat cool warm chill provide perform allow adjust obtain compute determine identify display
return access schedule lock unlock set sets create request order book reserve report share
locate suggest convert scale check start stop send add remove delete update fetch retrieve
search find list show get open close turn enable disable activate deactivate play pause
resume record log calculate estimate predict measure scan query edit register subscribe join
invite mute unmute skip rate review verify validate count sort filter restart reboot press
trigger apply install print dim brighten increase decrease raise lower change modify manage
control configure monitor notify alert remind announce speak say read write post upload
download sync backup restore clean vacuum water feed move copy rename assign mark clear save
load reload refresh analyze analyse evaluate compare summarize summarise translate transcribe
generate make build compose draft submit approve reject cancel confirm track follow unfollow
like block unblock buy sell pay transfer withdraw deposit charge refund invest plan arrange
prepare cook bake brew boil preheat defrost thaw mix blend grind wash dry iron fold light
illuminate shade tint color colour set-up initiate launch execute run invoke call fire shut
reset toggle select choose pick fill empty drain pump spray mist sprinkle ventilate open
sound ring beep flash blink wake sleep snooze dismiss silence stream cast mirror project zoom
focus capture photograph film convert encode decode encrypt decrypt hash sign authenticate
""".split())
NAME_VERBS = DESCRIPTION_VERBS | {"solve", "sum", "multiply", "divide", "plot", "draw", "roll",
                               "flip", "spin", "reverse", "greet", "square", "sort", "shuffle",
                               "repeat", "merge", "split", "join", "parse", "format", "extract",
                               "replace", "substitute", "subtract", "encode", "decode", "count"}
DESCRIPTION_VERBS |= NAME_VERBS
# name prefixes that say nothing ("fn_greet", "api_get_user")
NAME_PREFIXES = {"fn", "func", "function", "api", "tool", "cmd", "do", "my"}
GETTERS = {"get", "fetch", "retrieve", "check", "show", "list", "find", "search", "lookup",
           "read", "query", "view", "track", "count", "calculate", "compute", "estimate",
           "predict", "measure"}
_DESC_LEADS = re.compile(r"^(this (tool|function|api|endpoint|service|method) (is used to |will |can |lets you |allows you to )?|"
                         r"(a |the )?(tool|function|api|method|service) (that|to|which|for) |"
                         r"use this (tool |function )?to |used to |allows (the user |you )?to |"
                         r"lets (the user |you )?|helps (you )?|service to |call this to )", re.I)
_DESC_CUT = re.compile(r"(\. |\.$|; | \(| - | — |, (given|based on|using|which|returning|"
                       r"and returns?|with (the|a|an) option|if |where |such as|e\.g)| given | based on |"
                       r" and returns? | returning )")
_IRREGULAR = {"does": "do", "goes": "go", "has": "have", "is": "be"}
_QUESTION_LEADS = ["what is ", "what's ", "tell me ", "how much is "]
QUESTION_FORMS = ["what's the {o}", "what is the {o}", "tell me the {o}", "show me the {o}",
                  "check the {o}", "get me the {o}", "how's the {o}", "{o}?", "I'd like to know the {o}",
                  "can you check the {o}"]
INDIRECT = ["I need to {c}", "I want to {c}", "let's {c}", "it would be great if you could {c}",
            "time to {c}", "I'd like to {c}", "help me {c}", "we should {c}", "{c}, if you can",
            "is it possible to {c}?", "I was hoping you could {c}"]
NEGATIONS = ["don't {c}", "do not {c}", "don't {c} yet", "please don't {c}", "no need to {c}",
             "hold off, don't {c} yet", "never mind, don't {c}", "I'll {c} myself later, don't do it now",
             "wait, do not {c}", "not now, don't {c}", "forget it, don't {c}",
             "don't {c} until I say so", "you don't need to {c}"]
QUESTIONS = [
    "what's the tallest building in the world", "who painted the Mona Lisa", "how do magnets work",
    "what's the boiling point of water", "how many legs does a spider have", "why is the sky blue",
    "what year did the Berlin Wall fall", "what rhymes with orange", "give me a fun fact",
    "what's the difference between a virus and a bacterium", "who invented the telephone",
    "how long is a marathon", "how do you say thank you in Japanese", "what's a haiku",
    "can you help me with my homework", "what's your favourite colour", "are you a robot",
    "I had a long day", "that's great, thank you", "ok, that's everything", "good night",
    "sorry, wrong button", "just testing", "what's the largest ocean", "who discovered penicillin",
    "how many planets are there", "what's the speed of light", "tell me something interesting",
]
PLACES = ["Paris", "Berlin", "Tokyo", "Lagos", "Lima", "Oslo", "Cairo", "Toronto", "Madrid",
          "Nairobi", "Sydney", "Mumbai", "Seoul", "Dublin", "Lisbon", "Prague", "Vienna",
          "Chicago", "Denver", "Boston", "Austin", "Glasgow", "Leeds", "Bristol", "Cardiff",
          "Kyoto", "Hanoi", "Quito", "Accra", "Tunis", "Athens", "Krakow", "Porto", "Zurich",
          "San Diego", "New York", "Buenos Aires", "Cape Town", "Hong Kong", "Mexico City",
          "Rio de Janeiro", "Kuala Lumpur", "Las Vegas", "St Albans", "Milton Keynes"]
ENTITY_DOMAINS = ["light", "switch", "sensor", "climate", "media_player", "camera", "cover",
                  "fan", "lock", "vacuum", "binary_sensor", "input_boolean", "scene", "script"]
COMPANIES = ["Acme", "Globex", "Initech", "Umbrella", "Stark Industries", "Wayne Enterprises",
             "Hooli", "Vandelay", "Soylent", "Tyrell", "Cyberdyne", "Wonka", "Aperture"]
_PERSON = {"name", "contact", "recipient", "person", "user", "username", "friend", "attendee",
           "assignee", "author", "owner", "player", "customer", "guest", "patient", "employee",
           "sender", "receiver", "participant", "member", "who", "artist", "singer", "host",
           "manager", "driver", "student", "teacher", "doctor", "client", "caller", "invitee"}
_PLACE = {"city", "location", "place", "address", "origin", "venue", "country", "region",
          "town", "state", "area", "zone", "where", "site", "street", "neighborhood", "station"}
_MESSAGE = {"message", "text", "body", "content", "note", "comment", "reason", "caption",
            "memo", "details", "reply", "prompt", "question", "statement", "sentence",
            "feedback", "summary", "instructions", "input", "speech", "announcement"}
_TITLE = {"title", "subject", "topic", "event", "task", "item", "product", "query", "keyword",
          "keywords", "search", "term", "phrase", "song", "movie", "book", "dish", "food",
          "brand", "model", "company", "team", "label", "tag", "category", "genre", "album",
          "playlist", "show", "game", "course", "project", "list", "folder", "file", "filename",
          "word", "language", "color", "colour", "style", "type", "mode", "channel", "group",
          "description", "activity", "service", "app", "application", "device", "entity", "scene"}
_CODE = {"id", "code", "sku", "isbn", "zip", "postcode", "serial", "pin", "account", "number",
         "ticker", "symbol", "version", "key", "token", "hash", "ref", "reference", "plate"}
UNITS = [(r"\bper ?cent\w*|%|\bpercentage\b", ["percent", "%", "per cent"]),
         (r"\bcelsius\b|°c\b", ["degrees", "degrees Celsius", "°C"]),
         (r"\bfahrenheit\b|°f\b", ["degrees", "degrees Fahrenheit", "°F"]),
         (r"\bdegrees?\b", ["degrees"]), (r"\bminutes?\b", ["minutes", "mins"]),
         (r"\bseconds?\b", ["seconds", "secs"]), (r"\bhours?\b", ["hours"]),
         (r"\bdays?\b", ["days"]), (r"\bweeks?\b", ["weeks"]), (r"\bkilomet\w+|\bkm\b", ["km", "kilometres"]),
         (r"\bmiles?\b", ["miles"]), (r"\bmet(er|re)s?\b", ["metres", "meters"]),
         (r"\bkilograms?\b|\bkg\b", ["kg", "kilos"]), (r"\bgrams?\b", ["grams", "g"]),
         (r"\bmillilit\w+|\bml\b", ["ml"]), (r"\blit(er|re)s?\b", ["litres", "liters"]),
         (r"\bdollars?\b|\busd\b", ["dollars"]), (r"\beuros?\b", ["euros"]),
         (r"\bpeople\b|\bpersons?\b|\bguests?\b", ["people"]), (r"\bservings?\b", ["servings"]),
         (r"\bmm\b|\bmillimet\w+", ["mm"]), (r"\bcm\b|\bcentimet\w+", ["cm"]),
         (r"\bwatts?\b", ["watts", "W"]), (r"\bkelvin\b", ["kelvin", "K"]),
         (r"\bbpm\b", ["bpm"]), (r"\bpixels?\b|\bpx\b", ["pixels"])]
_UNITS = [(re.compile(p, re.I), words) for p, words in UNITS]


def _pick(rng, seq):
    return seq[rng.randrange(len(seq))]


def _words_of(text):
    return [w for w in re.findall(r"[A-Za-z][A-Za-z']*", text.lower())]


def third_to_imperative(word):
    """'Schedules' -> 'schedule', 'Applies' -> 'apply', 'Watches' -> 'watch'."""
    w = word.lower()
    if w in _IRREGULAR:
        return _IRREGULAR[w]
    if w.endswith("ies") and len(w) > 4:
        return w[:-3] + "y"
    if re.search(r"(ches|shes|sses|xes|zes|oes)$", w):
        return w[:-2]
    if w.endswith("s") and not w.endswith(("ss", "us", "is")) and len(w) > 3:
        return w[:-1]
    return w


def description_action(description):
    """The description's first clause as an imperative, lower case, or None."""
    text = _DESC_LEADS.sub("", description.strip())
    text = _DESC_CUT.split(text, maxsplit=1)[0].strip().rstrip(".")
    words = text.split()
    if not words or len(words) > 14:
        return None
    words[0] = words[0].split("/")[0]
    first = third_to_imperative(words[0])
    if first not in DESCRIPTION_VERBS:
        return None
    if len(words) > 2 and words[1] in ("or", "and") and third_to_imperative(words[2]) in DESCRIPTION_VERBS:
        words[2] = third_to_imperative(words[2])        # "Heats or cools" -> "heat or cool"
    rest = " ".join(words[1:])
    rest = re.sub(r"\bthe user's\b|\buser's\b", "my", rest)
    rest = re.sub(r"\b(a|the) (specified|given|provided|particular|specific)\b", "the", rest)
    rest = re.sub(r"\b(specified|given|provided)\s", "", rest)
    phrase = (first + " " + rest).strip()
    if first == "return":               # "Returns the car's range" is a question
        phrase = "get " + rest
    return phrase if len(phrase) > 3 else None


class Param:
    """One property: how its value is drawn and said."""

    def __init__(self, key, schema, required):
        self.key, self.schema, self.required = key, schema, required
        self.description = str(schema.get("description", ""))
        self.words = name_words(key)
        self.kind = self._kind()
        self.unit = self._unit()

    def _kind(self):
        s = self.schema
        t = s.get("type")
        hint = set(self.words)
        desc = self.description.lower()
        if "const" in s:
            return "const"
        if "enum" in s and s["enum"] and all(isinstance(v, (str, int)) and not isinstance(v, bool)
                                             for v in s["enum"]):
            return "enum"
        if t == "boolean":
            return "boolean"
        if t in ("integer", "number"):
            return t
        if t == "array":
            items = s.get("items") if isinstance(s.get("items"), dict) else {}
            if items.get("enum") and all(isinstance(v, str) for v in items["enum"]):
                return "enum_array"
            if items.get("type") == "string" and not items.get("pattern") and not items.get("format"):
                return "string_array"
            return None
        if t != "string":
            return None
        pattern, fmt = s.get("pattern"), s.get("format")
        if fmt == "date" or (not pattern and re.search(r"yyyy-mm-dd(?![ t]?hh)", desc)):
            return "date"
        if pattern and re.search(r"\[0-5\]\[0-9\]", pattern) and ":" in pattern and \
                not re.search(r"\{4\}|\\d\{4\}|yyyy", pattern, re.I):      # a time of day, no date
            return "time"
        if not pattern and not fmt and re.search(r"\bhh:mm\b", desc) and "yyyy" not in desc:
            return "time"
        if fmt == "email" or "email" in hint:
            return "email" if not pattern else None
        if fmt in ("uri", "url") or hint & {"url", "link", "website", "uri"}:
            return "url" if not pattern else None
        if pattern:
            return "pattern" if sample_pattern(random.Random(0), pattern) is not None else None
        if fmt:
            return None
        if "entity" in hint or "entity id" in desc:
            return "entity"
        if hint & {"area", "room", "zone"}:
            return "room"
        if hint & {"time", "when"} and not hint & {"zone"}:
            return "clock_text"
        if "date" in hint:
            return "date_text"
        if hint & _PERSON:
            return "person"
        if hint & _PLACE:
            return "place"
        if hint & _MESSAGE:
            return "message"
        if hint & _CODE:
            return "code"
        return "text"

    def _unit(self):
        text = self.description + " " + " ".join(self.words)
        for pattern, words in _UNITS:
            if pattern.search(text):
                return words
        return None

    def mention(self, rng, renamed=False):
        """A phrase for the property: its name words, or its description's noun."""
        from_desc = None
        if self.description:
            d = re.sub(r"^(the|a|an)\s+", "", self.description.strip(), flags=re.I)
            d = re.split(r"[,.;:(]| to | of | for | in | that | which | e\.g| when | if | like ", d)[0]
            ws = d.split()
            if 0 < len(ws) <= 4:
                from_desc = " ".join(ws).lower()
        own = " ".join(self.words)
        if renamed or not own or (len(own) <= 2 and from_desc):
            return from_desc
        return from_desc if from_desc and rng.random() < 0.3 else own


def sample_pattern(rng, pattern, tries=8):
    """A string matching ``pattern`` (``re.search`` semantics, as JSON Schema), from a
    small regex sampler (literals, escapes, classes, groups, alternation, quantifiers),
    or None when the pattern is outside what it reads."""
    for _ in range(tries):
        try:
            out = _Sampler(pattern, rng).sample()
        except (ValueError, IndexError, RecursionError):
            return None
        if out is not None and re.search(pattern, out) and len(out) <= 40:
            return out
    return None


class _Sampler:
    """Reads a pattern once, drawing as it reads; a quantified atom is re-read per copy."""
    _CLASSES = {"d": "0123456789", "w": "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_",
                "s": " "}

    def __init__(self, pattern, rng):
        self.p, self.i, self.rng = pattern, 0, rng

    def sample(self):
        out = self._alt()
        if self.i != len(self.p):
            raise ValueError("unread pattern")
        return out

    def _alt(self):
        branches, cur = [], []
        while self.i < len(self.p) and self.p[self.i] != ")":
            if self.p[self.i] == "|":
                branches.append(cur)
                cur = []
                self.i += 1
                continue
            cur.append(self._piece())
        branches.append(cur)
        return "".join(_pick(self.rng, branches))

    def _piece(self):
        """An atom and its quantifier: the atom is read again for every further copy."""
        start = self.i
        first = self._atom()
        end = self.i
        if end >= len(self.p) or self.p[end] not in "*+?{":
            return first
        if self.p[end] == "{":
            close = self.p.index("}", end)
            spec = self.p[end + 1:close]
            lo, _, hi = spec.partition(",")
            lo = int(lo or 0)
            hi = (int(hi) if hi else lo + 3) if "," in spec else lo
            self.i = close + 1
        else:
            lo, hi = {"*": (0, 3), "+": (1, 4), "?": (0, 1)}[self.p[end]]
            self.i = end + 1
        if self.i < len(self.p) and self.p[self.i] in "?+":
            self.i += 1                 # lazy or possessive: the same language
        n = self.rng.randint(lo, min(hi, lo + 6))
        after, parts = self.i, [first] if n else []
        for _ in range(n - 1):
            self.i = start
            parts.append(self._atom())
        self.i = after
        return "".join(parts)

    def _atom(self):
        c = self.p[self.i]
        self.i += 1
        if c in "^$":
            return ""
        if c == "(":
            if self.p.startswith("?:", self.i):
                self.i += 2
            elif self.p.startswith("?", self.i):
                raise ValueError("look-around")
            inner = self._alt()
            if self.p[self.i] != ")":
                raise ValueError("group")
            self.i += 1
            return inner
        if c == "[":
            return self._class()
        if c == ".":
            return _pick(self.rng, "abcdefghijklmnopqrstuvwxyz0123456789")
        if c == "\\":
            e = self.p[self.i]
            self.i += 1
            if e in self._CLASSES:
                return _pick(self.rng, self._CLASSES[e])
            if e.isalnum():
                raise ValueError("escape")
            return e
        if c in "*+?{":
            raise ValueError("quantifier")
        return c

    def _class(self):
        if self.p[self.i] == "^":
            raise ValueError("negated class")
        chars = []
        while self.p[self.i] != "]":
            c = self.p[self.i]
            if c == "\\":
                e = self.p[self.i + 1]
                chars.extend(self._CLASSES.get(e, e))
                self.i += 2
                continue
            if self.p[self.i + 1] == "-" and self.p[self.i + 2] != "]":
                a, b = ord(c), ord(self.p[self.i + 2])
                if b < a or b - a > 200:
                    raise ValueError("range")
                chars.extend(chr(x) for x in range(a, b + 1))
                self.i += 3
                continue
            chars.append(c)
            self.i += 1
        self.i += 1
        return _pick(self.rng, chars)


# ---------------------------------------------------------------- values ---

def _open_word(rng):
    """A word of the open pool; three in ten are the tokenizer's own word pieces (a word
    that is one piece is written at a string's start as a piece the request never shows,
    so each must be learned)."""
    w = home._value_words()
    return rng.choice(w["vocab_words"] if rng.random() < 0.3 else w["words"])


def _person(rng):
    w = home._value_words()
    r = rng.random()
    if r < 0.45:
        return rng.choice(w["first_names"])
    if r < 0.85:
        return rng.choice(w["first_names"]) + " " + rng.choice(w["last_names"])
    return _pick(rng, ["mum", "dad", "grandma", "Mom", "the boss", "my sister", "Dr Patel", "Uncle Joe"])


def _words(rng, lo, hi, capital=0.0):
    out = []
    for _ in range(rng.randint(lo, hi)):
        word = _open_word(rng)
        out.append(word.capitalize() if rng.random() < capital else word)
    return " ".join(out)


# ------------------------------------------------------- phrase values ---
# With ``rng.phrase_values`` (mix version 4) a free string is, most of the time, a phrase
# of the kind its property names: a song title for ``song``, a shopping item for
# ``items``, a message for ``message``, drawn from hand-written pools
# (``value_phrases.json``).  Word-salad values ("ability Congress able") teach copying
# but give the copy no edges a reader can see: on held-out tools the model cut such
# values short or ran them into the next words in half of the calls it named right.
# People's values are phrases; a share stays open-pool words so copying any span is
# still learned.
PHRASES_PATH = os.path.join(os.path.dirname(__file__), "value_phrases.json")
# property-name word → pool; earlier entries win ("song_title" is a song, not a title)
POOL_OF_WORD = [
    ({"song", "songs", "track", "tracks", "tune"}, "song"), ({"album", "albums"}, "album"),
    ({"band", "artist", "artists", "musician", "group"}, "band"), ({"movie", "movies", "film", "films"}, "movie"),
    ({"show", "series", "episode", "podcast", "tv"}, "show"), ({"book", "books", "novel"}, "book"),
    ({"playlist"}, "playlist"), ({"game", "games"}, "game"),
    ({"dish", "recipe", "meal", "food", "cuisine"}, "dish"), ({"ingredient", "ingredients"}, "ingredient"),
    ({"grocery", "groceries", "item", "items", "shopping"}, "grocery"), ({"product", "products"}, "product"),
    ({"task", "tasks", "todo", "chore", "reminder"}, "task"),
    ({"event", "meeting", "appointment", "calendar"}, "event"),
    ({"subject"}, "subject"), ({"genre", "genres"}, "genre"),
    ({"tag", "tags", "label", "labels", "category", "categories"}, "tag"),
    ({"query", "search", "q", "phrase", "question"}, "query"),
    ({"topic", "topics", "keyword", "keywords", "term", "terms", "interest", "interests"}, "topic"),
    ({"file", "filename", "files", "document", "attachment", "path"}, "file"),
    ({"folder", "project", "directory", "workspace", "board", "notebook", "repo", "repository"}, "folder"),
    ({"team", "club"}, "team"),
    ({"company", "brand", "store", "shop", "restaurant", "merchant", "vendor", "business", "hotel",
      "organization", "organisation", "airline", "retailer"}, "business"),
    ({"address", "street"}, "address"), ({"city", "town", "destination", "origin"}, "city"),
    ({"message", "sms", "body", "text", "reply", "announcement"}, "message"),
    ({"note", "notes", "comment", "comments", "reason", "description", "details", "feedback", "memo",
      "instructions", "summary", "caption", "bio"}, "note"),
    ({"title", "headline", "heading"}, "title"),
    ({"language", "lang", "locale"}, "language"), ({"color", "colour"}, "color"),
    ({"device", "speaker", "phone", "printer"}, "device"),
    ({"username", "handle", "screen", "account"}, "username"),
    ({"amenity", "poi", "venue"}, "amenity"),
]
# pools for a free-text property whose name says no kind
GENERIC_POOLS = ("topic", "title", "query", "tag", "task", "business", "product", "event", "note")
# pools whose items a list holds ("a list of songs")
LIST_POOLS = {"song", "album", "movie", "show", "book", "game", "dish", "ingredient", "grocery",
              "product", "task", "genre", "tag", "topic", "file", "team", "city", "language", "color",
              "username", "amenity"}


@functools.lru_cache(maxsize=None)
def _phrases():
    with open(PHRASES_PATH, encoding="utf-8") as handle:
        return json.load(handle)


def pool_of(param):
    """The phrase pool a property's name words point to, else the first words of its
    description (a renamed property's key says nothing), or None."""
    described = set(re.findall(r"[a-z]+", param.description.lower())[:6])
    for words in (set(param.words), described):
        for keys, pool in POOL_OF_WORD:
            if words & keys:
                return pool
    return None


def _phrase_value(rng, kind, param):
    """A phrase-pool value for ``param`` (mix version 4), or None: the open-pool draw."""
    pool, r = pool_of(param), rng.random()
    if kind == "person":
        return rng.choice(_phrases()["username"]) if pool == "username" and r < 0.6 else None
    if kind == "place":
        if pool == "address" and r < 0.8:
            return rng.choice(_phrases()["address"])
        return rng.choice(_phrases()["city"]) if r < 0.6 else None
    if kind == "message":
        pool = pool if pool in ("message", "note", "subject", "title") else "message"
        if r < 0.75:
            return rng.choice(_phrases()[pool])
        return _pick(rng, home.MESSAGES) if r < 0.85 else None
    if kind != "text":
        return None
    if pool is not None and pool != "username":
        return rng.choice(_phrases()[pool]) if r < 0.85 else None
    if r < 0.6:
        return rng.choice(_phrases()[_pick(rng, GENERIC_POOLS)])
    return None


def _phrase_items(rng, param, n):
    """List items from the pool the property names (mix version 4), or None."""
    pool = pool_of(param)
    if pool not in LIST_POOLS or rng.random() >= 0.85:
        return None
    items = [v for v in (rng.choice(_phrases()[pool]) for _ in range(n))
             if " and " not in f" {v} " and "," not in v]
    return list(dict.fromkeys(items)) or None


def _free_string(rng, kind, param=None):
    """A free-string value of a kind (person, place, message, code, text), from open
    pools, so that only copying it from the request gets it right; with
    ``rng.phrase_values``, mostly a phrase of the kind the property names."""
    if param is not None and getattr(rng, "phrase_values", False):
        value = _phrase_value(rng, kind, param)
        if value is not None:
            lo, hi = param.schema.get("minLength", 0), param.schema.get("maxLength", 10 ** 6)
            if lo <= len(value) <= hi:
                return value
    if kind == "person":
        value = _person(rng)
        return value[3:] if value.startswith("my ") else value
    if kind == "place":
        return _pick(rng, PLACES) if rng.random() < 0.6 else _words(rng, 1, 2, capital=0.9)
    if kind == "room":
        return _pick(rng, home.ROOMS + home.NOT_ROOMS)
    if kind == "entity":
        return f"{_pick(rng, ENTITY_DOMAINS)}.{_pick(rng, home.ROOMS).replace(' ', '_')}" + \
            (f"_{_open_word(rng).lower()}" if rng.random() < 0.3 else "")
    if kind == "clock_text":
        return home._clock(rng)[1].strip()
    if kind == "date_text":
        return _date(rng)[1]
    if kind == "message":
        if rng.random() < 0.3:
            return _pick(rng, home.MESSAGES)
        return _words(rng, 2, 6)
    if kind == "code":
        r = rng.random()
        if r < 0.4:
            return str(rng.randint(10, 99999))
        if r < 0.7:
            return "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ") for _ in range(rng.randint(2, 4))) + \
                str(rng.randint(1, 9999))
        return _open_word(rng).lower() + "_" + str(rng.randint(1, 99))
    if kind == "email":
        w = home._value_words()
        return (f"{rng.choice(w['first_names']).lower()}.{rng.choice(w['last_names']).lower()}"
                f"@{_pick(rng, ['example.com', 'mail.com', 'work.org', 'uni.edu'])}")
    if kind == "url":
        return f"https://{_pick(rng, ['www.', ''])}{_open_word(rng).lower()}.{_pick(rng, ['com', 'org', 'io'])}" + \
            (f"/{_open_word(rng).lower()}" if rng.random() < 0.4 else "")
    r = rng.random()
    if r < 0.15:
        return _pick(rng, COMPANIES)
    return _words(rng, 1, 3, capital=0.35 if r < 0.6 else 0.0)


def _bounds(schema, integer):
    lo, hi = schema.get("minimum"), schema.get("maximum")
    if isinstance(schema.get("exclusiveMinimum"), (int, float)) and not isinstance(schema.get("exclusiveMinimum"), bool):
        lo = schema["exclusiveMinimum"] + (1 if integer else 0.5)
    if isinstance(schema.get("exclusiveMaximum"), (int, float)) and not isinstance(schema.get("exclusiveMaximum"), bool):
        hi = schema["exclusiveMaximum"] - (1 if integer else 0.5)
    return lo, hi


def _number(rng, param):
    """(value, said) inside the schema's bounds, in digits or words, with the unit."""
    s = param.schema
    integer = param.kind == "integer"
    lo, hi = _bounds(s, integer)
    hint = set(param.words)
    if lo is None and hi is None:
        if hint & {"year"}:
            lo, hi = 1990, 2030
        elif param.unit and param.unit[0] == "percent":
            lo, hi = 0, 100
        else:
            lo, hi = _pick(rng, [(1, 10), (1, 20), (1, 100), (1, 500), (10, 5000)])
    elif lo is None:
        lo = min(0, hi - 10)
    elif hi is None:
        hi = lo + _pick(rng, [10, 20, 100, 1000])
    if hi < lo:
        return None
    step = s.get("multipleOf")
    if step:
        first, last = int(-(-lo // step)), int(hi // step)
        if last < first:
            return None
        value = rng.randint(first, last) * step
        value = int(value) if float(value).is_integer() and (integer or rng.random() < 0.7) else round(value, 6)
    elif integer or rng.random() < 0.6:
        lo_i, hi_i = int(-(-lo // 1)), int(hi // 1)
        if hi_i < lo_i:
            return None
        hi_i = min(hi_i, max(lo_i, 0) + 100000)         # people do not say 2**63
        span = hi_i - lo_i
        if span > 30 and rng.random() < 0.5:            # round numbers, as people say them
            step = 5 if span < 200 else 10 ** max(1, len(str(span)) - 2)
            first = -(-lo_i // step)
            value = step * rng.randint(first, max(first, hi_i // step))
            value = value if lo_i <= value <= hi_i else rng.randint(lo_i, hi_i)
        else:
            value = rng.randint(lo_i, hi_i)
    else:
        value = round(rng.uniform(lo, min(hi, max(lo, 0) + 100000)), 1)
        if not lo <= value <= hi:
            value = lo
    if isinstance(value, float) and value.is_integer() and integer:
        value = int(value)
    return value, _say_number(rng, value, param.unit)


def _say_number(rng, value, unit):
    if isinstance(value, int) or float(value).is_integer():
        n = int(value)
        said = home.say_int(rng, n, 0.25) if 0 <= n <= 99 else str(n)
    else:
        said = f"{value:g}"
    if unit and rng.random() < 0.7:
        u = _pick(rng, unit)
        said = said + u if u in ("%", "°C", "°F") else f"{said} {u}"
    return said


_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
           "September", "October", "November", "December"]


def _date(rng):
    year, month, day = rng.randint(2024, 2030), rng.randint(1, 12), rng.randint(1, 28)
    value = f"{year:04d}-{month:02d}-{day:02d}"
    m = _MONTHS[month - 1]
    said = _pick(rng, [value, f"{m} {day}, {year}", f"{day} {m} {year}", f"{m} {day} {year}",
                       f"the {home.number_words(day) if day < 20 else day}{'st' if day in (1, 21) else 'nd' if day in (2, 22) else 'rd' if day in (3, 23) else 'th'} of {m} {year}"])
    return value, said


def draw_value(rng, param):
    """(value, said, note source) for ``param``, or None when none can be drawn.  The note
    source is the request's words when they differ from the JSON value."""
    kind, s = param.kind, param.schema
    if kind == "const":
        return s["const"], None, None
    if kind == "enum":
        value = _pick(rng, s["enum"])
        if isinstance(value, int):
            return value, _say_number(rng, value, param.unit), None
        said = value.replace("_", " ") if rng.random() < 0.8 else value
        if said.isupper() and len(said) > 3 and rng.random() < 0.5:
            said = said.lower()
        elif rng.random() < 0.3:
            said = said.lower()
        return value, said, said if said != value else None
    if kind == "boolean":
        return rng.random() < 0.7, None, None
    if kind in ("integer", "number"):
        drawn = _number(rng, param)
        if drawn is None:
            return None
        value, said = drawn
        return value, said, said if said != home.compact(value) else None
    if kind == "time":
        value, said = home._clock(rng)
        return value, said, said if said != value else None
    if kind == "date":
        value, said = _date(rng)
        return value, said, said if said != value else None
    if kind == "pattern":
        value = sample_pattern(rng, s["pattern"])
        return (value, value, None) if value is not None else None
    if kind in ("enum_array", "string_array"):
        n = rng.randint(1, min(3, len(s["items"]["enum"])) if kind == "enum_array" else 3)
        if kind == "enum_array":
            value = rng.sample(list(s["items"]["enum"]), n)
            saids = [v.replace("_", " ") for v in value]
        else:       # items that a list says apart: no "and" or comma inside one
            value = _phrase_items(rng, param, n) if getattr(rng, "phrase_values", False) else None
            if value is None:
                value = [v for v in (_words(rng, 1, 2, capital=0.3) for _ in range(n))
                         if " and " not in f" {v} " and "," not in v]
                value = list(dict.fromkeys(value)) or [_open_word(rng)]
            saids = list(value)
        said = saids[0] if len(saids) == 1 else ", ".join(saids[:-1]) + " and " + saids[-1]
        return value, said, said
    value = _free_string(rng, kind, param)
    lo, hi = s.get("minLength", 0), s.get("maxLength", 10 ** 6)
    if not lo <= len(value) <= hi:
        return None
    return value, value, None


# --------------------------------------------------------------- phrases ---

def _the(rng, obj):
    return obj if rng.random() < 0.25 or obj.startswith(("my ", "the ", "a ")) else "the " + obj


def action_phrases(tool, source=None, domain=None, renamed=False):
    """[(phrase, object words or None)] that ask for ``tool``: from its name (unless the
    name is a random identifier) and its description."""
    out = []
    words = name_words(tool["name"])
    while len(words) > 1 and words[0] in NAME_PREFIXES:
        words = words[1:]
    desc = description_action(tool.get("description") or "")
    if not renamed and words:
        dom = name_words(domain or "")
        if source == "home_assistant" and dom and words[:len(dom)] == dom and len(words) > len(dom):
            service, obj = words[len(dom):], " ".join(dom)
            if service[0] in NAME_VERBS:          # light_turn_on: "turn on the light"
                out.append((" ".join(service) + " {the} " + obj, obj))
        elif words[0] in NAME_VERBS:
            obj = " ".join(words[1:])
            out.append(("{verb}" + (" {the} " + obj if obj else ""), obj or None))
        elif not desc:
            obj = " ".join(w for w in words if not w.isdigit())
            out.append(("{get} {the} " + obj, obj))
    if desc:
        out.append((desc, None))
        verb, _, rest = desc.partition(" ")
        if verb in ("calculate", "compute", "get", "find", "retrieve", "determine", "obtain",
                    "check", "fetch") and rest.startswith(("the ", "a ", "an ")):
            out.append((_QUESTION_LEADS[len(out) % len(_QUESTION_LEADS)] + rest, None))
    return out


def _action_text(rng, template, tool_words):
    verb = tool_words[0] if tool_words else "get"
    syn = _pick(rng, VERB_SYNONYMS.get(verb, [verb]))
    text = template.replace("{verb}", syn).replace("{get}", _pick(rng, ["get", "check", "show me", "find"]))
    while "{the}" in text:
        text = text.replace("{the}", "the" if rng.random() < 0.75 else "", 1)
    return re.sub(r"\s+", " ", text).strip()


COPIED_KINDS = ("person", "place", "message", "text", "code", "email", "url", "pattern",
                "string_array", "room", "entity", "clock_text", "date_text")
QUOTABLE_KINDS = ("person", "place", "message", "text", "string_array", "code")
ARG_FORMS = {
    "enum": ["{s}", "to {s}", "{m} {s}", "with {m} {s}", "{s} {m}", "using {s}", "as {s}", "on {s}",
             "set to {s}", "in {s}"],
    "number": ["to {s}", "{m} {s}", "with {m} {s}", "{m} of {s}", "for {s}", "at {s}", "{s}", "{m} to {s}",
               "with {s}", "by {s}"],
    "time": ["at {s}", "for {s}", "{m} {s}", "at {s}", "from {s}"],
    "date": ["on {s}", "for {s}", "{m} {s}", "on {s}"],
    "person": ["for {s}", "to {s}", "with {s}", "{m} {s}", "{s}", "from {s}", "{m}: {s}"],
    "place": ["in {s}", "to {s}", "at {s}", "for {s}", "near {s}", "{m} {s}", "from {s}"],
    "message": ["saying {s}", "that says {s}", ": {s}", "with the {m} {s}", "{m}: {s}", "that {s}",
                "with {m} \"{s}\"", "reading {s}"],
    "text": ["{m} {s}", "with {m} {s}", "called {s}", "named {s}", "for {s}", "{s}", "{m}: {s}",
             "{m} set to {s}", "with the {m} {s}", "about {s}", "{m} \"{s}\""],
    "code": ["{m} {s}", "with {m} {s}", "{s}", "number {s}", "{m}: {s}", "for {s}"],
    "email": ["to {s}", "{m} {s}", "at {s}", "{s}", "for {s}"],
    "url": ["{s}", "at {s}", "{m} {s}", "from {s}", "for {s}"],
    "pattern": ["{m} {s}", "{s}", "for {s}", "with {m} {s}", "{m}: {s}", "number {s}"],
    "list": ["{s}", "with {s}", "for {s}", "{m} {s}", "including {s}"],
    "room": ["in the {s}", "in {s}", "for the {s}", "{m} {s}", "{s}"],
    "entity": ["{s}", "{m} {s}", "for {s}", "on {s}"],
}
_FORM_OF_KIND = {"clock_text": "time", "date_text": "date"}
_FORM_OF = {"integer": "number", "number": "number", "enum_array": "list", "string_array": "list"}


def arg_phrase(rng, param, value, said, renamed=False, named_only=False, mention=None):
    """The words that say one argument (``mention``: the property as said, else drawn)."""
    mention = mention or param.mention(rng, renamed) or "the " + " ".join(param.words or ["value"])
    if param.kind == "boolean":
        on = _pick(rng, ["with {m}", "and {m}", "{m} on", "enable {m}", "including {m}", "and turn on {m}"])
        off = _pick(rng, ["without {m}", "{m} off", "no {m}", "disable {m}", "and turn off {m}", "not {m}"])
        m = re.sub(r"^(is|enable|enabled|include|use|should|do|has|allow|with) ", "", mention)
        return (on if value else off).replace("{m}", m)
    kind = _FORM_OF_KIND.get(param.kind, param.kind)
    forms = ARG_FORMS.get(_FORM_OF.get(kind, kind), ARG_FORMS["text"])
    if said[:1] in "'\"":                # already quoted: no form that quotes again
        forms = [f for f in forms if '"' not in f]
    if not named_only:
        form = _pick(rng, forms)
    else:           # another argument of the same kind is said: say which is which
        form = _pick(rng, [f for f in forms if "{m}" in f] or ["{m} {s}"])
    return form.replace("{m}", mention).replace("{s}", said)


def _join_args(rng, phrases):
    if not phrases:
        return ""
    if len(phrases) == 1:
        return " " + phrases[0]
    sep = _pick(rng, [" ", " ", ", ", " and "])
    head = sep.join(phrases[:-1])
    last = _pick(rng, [" and ", " ", ", "]) if sep != " and " else " and "
    return " " + head + last + phrases[-1]


def random_identifier(rng, prefix=None):
    """'fn_q7x2', 'tool_ab31', 'p3k' …: a name that says nothing."""
    body = "".join(rng.choice(string.ascii_lowercase + string.digits) for _ in range(rng.randint(3, 5)))
    return (prefix or _pick(rng, ["fn_", "tool_", "f", "op_", "do_", "x", "api_", "t"])) + body


def rename(rng, tool):
    """A copy of ``tool`` with a random name and random property names (only properties
    that carry a description are renamed: the description must say what they are)."""
    params = tool.get("parameters") or {}
    props = params.get("properties") or {}
    mapping = {}
    for key, schema in props.items():
        if isinstance(schema, dict) and schema.get("description"):
            mapping[key] = random_identifier(rng, _pick(rng, ["p", "a", "arg_", "v", "k"]))
        else:
            mapping[key] = key
    new_params = dict(params)
    new_params["properties"] = {mapping[k]: v for k, v in props.items()}
    if "required" in params:
        new_params["required"] = [mapping.get(k, k) for k in params["required"]]
    return {"name": random_identifier(rng), "description": tool.get("description", ""),
            "parameters": new_params}


def validate_call(tool, arguments):
    """True when ``arguments`` meet ``tool``'s parameters (jsonschema, Draft 2020-12)."""
    import jsonschema

    try:
        jsonschema.Draft202012Validator(tool["parameters"]).validate(arguments)
    except jsonschema.ValidationError:
        return False
    return True


class ToolPlan:
    """A tool read for phrasing: its properties' kinds and the phrases that ask for it."""

    def __init__(self, tool, source=None, domain=None, renamed=False):
        self.tool, self.source, self.domain, self.renamed = tool, source, domain, renamed
        params = tool.get("parameters") or {}
        required = set(params.get("required") or [])
        self.params = [Param(k, v if isinstance(v, dict) else {}, k in required)
                       for k, v in (params.get("properties") or {}).items()]
        self.actions = action_phrases(tool, source, domain, renamed)
        self.tool_words = name_words(tool["name"])
        while len(self.tool_words) > 1 and self.tool_words[0] in NAME_PREFIXES:
            self.tool_words = self.tool_words[1:]
        self.ok = bool(self.actions) and all(p.kind is not None for p in self.params if p.required)

    @property
    def name(self):
        return self.tool["name"]

    def request(self, rng, optional_rate=0.35, leave_out=None, bad_value=False, form=None):
        """(clause, call, notes, copied strings) for one call, or None.  ``leave_out``: a
        required key not said (a refusal); ``bad_value``: one value said outside its
        range or enum (a refusal).  With ``rng.paraphrase`` (mix version 5) the clause is
        a ``Clause`` said as people say it (``paraphrase``), ``form`` "imperative" asking
        for a command (a negation wraps it)."""
        template, obj = _pick(rng, self.actions)
        v5 = getattr(rng, "paraphrase", False)
        if v5:
            act, implied, named = self._action5(rng)
            said_kinds = [_kind5(p) for p in self.params]
            spoken = []             # (param, phrase, unnamed, direct, said) in schema order
        args, phrases, notes, copied = {}, [], [], []
        said_kinds = said_kinds if v5 else [_FORM_OF.get(p.kind, p.kind) for p in self.params]
        mentions, said_numbers = set(), []
        bad_done = False
        for p in self.params:
            if p.key == leave_out or p.kind is None:
                continue
            if not p.required and (rng.random() > optional_rate or p.kind == "const"):
                continue
            if bad_value and not bad_done and p.kind in ("integer", "number", "enum"):
                said = _bad_value_said(rng, p)
                if said is not None:
                    if v5:
                        phrase, unnamed, _ = arg_phrase5(rng, p, None, said, self.renamed,
                                                         said_kinds.count(_kind5(p)) > 1, False, p.key == named)
                        spoken.append((p, phrase, unnamed, False, said))
                    phrases.append(phrase if v5 else arg_phrase(rng, p, None, said, self.renamed))
                    bad_done = True
                    continue
            drawn = draw_value(rng, p)
            if drawn is None:
                if p.required:
                    return None
                continue
            value, said, source = drawn
            args[p.key] = value
            if p.kind == "const":
                notes.append(f"{p.key} = {home.compact(value)}")
                continue
            kind = _FORM_OF.get(p.kind, p.kind)
            if kind == "number":
                said_numbers.append(said)
            if p.kind in QUOTABLE_KINDS and rng.random() < 0.2:     # 'hello', "Dune"
                q = _pick(rng, ["'", '"'])
                said = q + said + q
            if v5:
                phrase, unnamed, direct = arg_phrase5(rng, p, value, said, self.renamed,
                                                      said_kinds.count(_kind5(p)) > 1, p.key == implied,
                                                      p.key == named)
            else:
                phrase = arg_phrase(rng, p, value, said, self.renamed, named_only=said_kinds.count(kind) > 1)
                unnamed = False
            mention = p.mention(random.Random(0), self.renamed)
            if mention in mentions and not self.renamed and not unnamed:    # two properties described alike
                phrase = f"{' '.join(p.words)} {said}"
            mentions.add(mention)
            phrases.append(phrase)
            if v5:
                spoken.append((p, phrase, unnamed, direct, said))
            if p.kind in COPIED_KINDS:
                copied.append(said.strip("'\""))
            notes.append(f"{p.key} = {home.compact(value)}" + (f' from "{source}"' if source else ""))
        if bad_value and not bad_done:
            return None
        if not bad_value and leave_out is None and not validate_call(self.tool, args):
            return None
        order = [p.key for p in self.params]
        call = {"name": self.name, "arguments": {k: args[k] for k in order if k in args}}
        if v5:
            return self._clause5(rng, act, spoken, said_numbers, form), call, notes, copied
        if len(said_numbers) >= 2 and len(said_numbers) == len(phrases) and rng.random() < 0.35:
            # numbers said in the schema's order without names: "the sum of 2 and 3"
            joined = ", ".join(said_numbers[:-1]) + " and " + said_numbers[-1]
            phrases = [_pick(rng, ["of ", "for ", "", "with "]) + joined]
        elif len(phrases) > 1 and rng.random() < 0.5:
            order = list(range(len(phrases)))
            rng.shuffle(order)
            phrases = [phrases[i] for i in order]
        action = _action_text(rng, template, self.tool_words)
        r = rng.random()
        if obj and r < 0.12 and self.tool_words and self.tool_words[0] in GETTERS and not phrases:
            clause = _pick(rng, QUESTION_FORMS).replace("{o}", obj)
        elif obj and r < 0.2 and phrases and self.tool_words[:1] in (["set"], ["change"], ["adjust"], ["update"]):
            clause = obj + _join_args(rng, phrases)         # verbless: "charge limit to 80"
        else:
            clause = action + _join_args(rng, phrases)
        return clause, call, notes, copied

    # ------------------------------------------------------------ version 5 ---
    def _action5(self, rng):
        """(the action read apart, the key of the property whose value says the object,
        the key of the property the object names) for one request, from a phrase of the
        tool's (a question lead's excepted: the version's own question frames ask)."""

        texts = getattr(self, "_texts5", None)
        if texts is None:
            texts = []
            for template, _ in self.actions:
                if template.startswith(tuple(_QUESTION_LEADS)):
                    continue
                if template.startswith("{get}"):        # "get the trading get login status"
                    head, _, obj = template.partition(" {the} ")
                    template = head + " {the} " + " ".join(w for w in obj.split() if w not in NAME_VERBS)
                text = template.replace("{verb}", self.tool_words[0] if self.tool_words else "get")
                text = re.sub(r"\s+", " ", text.replace("{get}", "get").replace("{the}", "the")).strip()
                text = re.sub(r"\bthe (to|for|from|in|on|with|by|of)\b", r"\1", text)     # "add the to grocery list"
                texts.append((text, template.startswith(("{verb}", "{get}"))))
            self._texts5 = texts = texts or [("get the " + " ".join(self.tool_words or ["value"]), True)]
        text, from_name = _pick(rng, texts)
        act = para.Action(text, is_verb=lambda word: third_to_imperative(word) in DESCRIPTION_VERBS)
        act.from_name = from_name
        head = act.head()
        implied = named = None
        if head:
            for p in self.params:
                kind = _FORM_OF_KIND.get(p.kind, p.kind)
                if kind in ("person", "message"):      # "call the contact Logan" -> "call Logan"
                    nouns = para.KIND_NOUNS[kind] | para.said_words(p, self.renamed)
                elif kind in ("text", "string_array") and pool_of(p) in para.TITLE_POOLS:
                    nouns = para.POOL_NOUNS.get(pool_of(p), set())     # "play the song X" -> "play X"
                elif kind == "text" and pool_of(p) in (None, "query", "message", "note"):
                    nouns = para.TEXT_NOUNS                             # "translate the text X" -> "translate X"
                else:
                    continue
                if head in nouns:
                    implied = p.key
                    break
        if act.verb[0].lower() in para.SET_VERBS and act.object:
            said = {para.singular(w.lower()) for w in act.object}
            for p in self.params:       # "set the swing mode" names swing_mode: "… to auto"
                words = para.said_words(p, self.renamed)
                if words and words <= said and p.kind in ("enum", "integer", "number", "text"):
                    named = p.key
                    break
        return act, implied, named

    def _clause5(self, rng, act, spoken, said_numbers, form):
        """The clause of a version-5 request: the action said in people's words around the
        arguments' phrases, as a command, a question, a bare noun phrase or a need."""

        every = set().union(*(para.said_words(p, self.renamed) for p in self.params)) if self.params else set()
        # arguments a phrase of the action may point at, said by value ("to a contact" -> "to Jo")
        targets, said_as = {}, {}
        for p, _, _, direct, said in spoken:
            kind = _kind_seen(p, self.renamed)
            if direct or kind in ("boolean", "enum", "const", "code", "pattern", "email", "url", "entity"):
                continue
            if kind in ("integer", "number") and not (p.unit and said.endswith(tuple(p.unit))):
                continue        # "for a certain number of days" takes "16 days", not "16"
            pool = pool_of(p) or ""
            targets[p.key] = para.said_words(p, self.renamed) | para.KIND_NOUNS.get(kind, set()) | \
                para.POOL_NOUNS.get(pool, set()) | (para.KIND_NOUNS["place"] if pool in ("city", "address") else set())
            said_as[p.key] = said
        gerund = act.object[:1] and act.object[0].lower().endswith("ing")
        verb = para.pick_verb(rng, act, 0.0 if gerund else para.VERB_RATE)     # "start tracking", not "launch tracking"
        obj, kept, used = para.object_words(rng, act, targets, said_as, every)
        spoken = [s for s in spoken if s[0].key not in used]
        # arguments in the order people say them: the one that says the object first, then
        # things, people, amounts, places, dates, times, messages, switches
        ranked = sorted(spoken, key=lambda s: (not s[3], _RANK5.get(_FORM_OF_KIND.get(s[0].kind, s[0].kind), 1)))
        direct = [s[1] for s in ranked if s[3]]
        getter = act.verb[0].lower() in para.GETTER_VERBS
        context = None
        places = [s for s in ranked if s[2] and not s[3] and _kind_seen(s[0], self.renamed) == "place"]
        if getter and form is None and len(places) == 1 and not (set(places[0][0].words) & (_FROM | _TO)) \
                and rng.random() < 0.15:
            context = _pick(rng, para.PLACE_CONTEXTS).replace("{s}", places[0][4])
            ranked = [s for s in ranked if s is not places[0]]
        phrases = [s[1] for s in ranked if not s[3]]
        if len(said_numbers) >= 2 and len(said_numbers) == len(phrases) and not used and rng.random() < 0.35:
            joined = ", ".join(said_numbers[:-1]) + " and " + said_numbers[-1]
            phrases = [_pick(rng, ["of ", "for ", "with "]) + joined]
        elif len(phrases) > 1 and rng.random() < 0.3:
            rng.shuffle(phrases)
        if direct and rng.random() < 0.85:
            obj = []
        if obj and act.from_name and act.verb[0].lower() in ("find", "search") and not para.is_plural(obj) \
                and obj[0].lower() not in ("a", "an", "my") and rng.random() < 0.7:
            obj = obj[1:] if obj[0].lower() == "the" else obj        # "search the lawyer" -> "lawyers"
            obj = obj[:-1] + [para.plural(obj[-1])] if obj else obj
        if verb.split()[-1] in ("put", "stick", "pop", "throw"):     # "put milk on the list"
            kept = [("on" if lead == "to" else lead, words) for lead, words in kept]
        a = "".join(" " + d for d in direct) + para.tail_text(kept) + _join_args(rng, phrases)
        unnamed = all(s[2] for s in spoken)
        clause = self._frame5(rng, act, verb, obj, kept, a, unnamed, form)
        if context is None:
            return clause
        join = _pick(rng, para.CONTEXT_JOINS[clause.form])
        if join.endswith(". "):
            return _clause(context + join + clause[:1].upper() + clause[1:], "context")
        return _clause(context + join + clause, "context")

    def _frame5(self, rng, act, verb, obj, kept, a, unnamed, form):
        """A version-5 clause's frame: a command, a question, a bare noun phrase or a need."""

        getter = act.verb[0].lower() in para.GETTER_VERBS
        asks = act.verb[0].lower() in para.INFO_VERBS
        r = rng.random()
        if obj and obj[0].lower() in ("if", "whether", "how", "what", "when", "where", "who", "which"):
            getter = False          # "check if a password was leaked": only a command says it
        if getter and obj and form is None:
            # a noun said as a clause takes arguments said by their values alone ("how warm
            # is it in Dublin", not "how warm is it with unit celsius")
            whole = para.clause_for(obj, kept) if unnamed else None
            if whole and r < 0.3:
                statement, question = _pick(rng, whole)
                if rng.random() < 0.5:
                    return _clause(question + a + "?", "question")
                frame = _pick(rng, para.CLAUSE_FRAMES)
                return _clause(frame.replace("{w}", statement).replace("{a}", a),
                               "statement" if frame.startswith("I") else "imperative")
            content = [w for w in act.object if w.lower() not in ("a", "an", "the", "my") and w.lower() not in para.FILLERS]
            if r < 0.45 and asks and len(content) >= 2 and para.singular(content[-1].lower()) in para.FUTURE_HEADS:
                return _clause(_pick(rng, para.FUTURE_FRAMES).replace("{o}", "the " + " ".join(content[:-1]))
                               .replace("{a}", a), "question")
            if r < 0.45 and asks:
                plural = para.is_plural(obj)
                frames = para.PLURAL_QUESTION_FRAMES if plural else para.QUESTION_FRAMES
                if plural and act.verb[0].lower() not in para.WHAT_VERBS:
                    frames = frames[:2]
                text = _pick(rng, frames).replace("{o}", para.with_the(rng, obj)).replace("{b}", para.bare(obj))
                return _clause(text.replace("{a}", a), "question")
            if r < 0.62 and a:
                return _clause(para.bare(obj) + a, "noun")
            if r < 0.72:
                return _clause(_pick(rng, para.NEED_FRAMES).replace("{o}", " ".join(obj)).replace("{a}", a),
                               "statement")
        elif obj and a and form is None and act.verb[0].lower() in para.SET_VERBS and r < 0.2:
            return _clause(para.with_the(rng, obj) + a, "noun")     # "the heating to 21 degrees"
        text = verb + (" " + " ".join(obj) if obj else "") + a
        return _clause(text, "imperative")


class Clause(str):
    """A version-5 request clause and its form: "imperative", "question", "noun" (a bare
    noun phrase) or "statement" ("I need …"); the form says how it may be wrapped."""
    form = "imperative"


def _clause(text, form):
    c = Clause(re.sub(r"\s+", " ", text).strip())
    c.form = form
    return c


def wrap(rng, clause):
    """A request around a clause: a version-5 ``Clause`` by its form (a question is not
    "could you …"-wrapped), else ``data._wrap``'s politeness."""

    form = getattr(clause, "form", None)
    if form is None:
        return home._wrap(rng, clause)
    r = rng.random() if form == "imperative" else 1.0
    if r < 0.2 and not re.match(r"\S+ me\b", clause):     # not "I want to get me …"
        text = _pick(rng, INDIRECT).replace("{c}", clause)
    elif r < 0.7:
        text = home._wrap(rng, clause)
    else:
        t = _pick(rng, para.WRAPS[form])
        text = t.replace("{c}", clause).replace("{C}", clause[:1].upper() + clause[1:])
    # a clause ending in a question mark takes no stop after it ("… feeling?." -> "… feeling?")
    return text[:-1] if text[-2:] in ("?.", "?!") and not clause.endswith(text[-2:]) else text


def join_clauses(rng, clauses):
    """Version 5's multi-call request: clauses joined as people join them, a question
    ending its sentence."""
    query = clauses[0]
    for c in clauses[1:]:
        if query.endswith("?") or getattr(c, "form", None) == "context":
            j = _pick(rng, [" ", " Also, ", " And ", " Oh and "]) if query.endswith("?") else ". "
        elif getattr(c, "form", None) == "question":
            j = _pick(rng, [" and ", ", and ", ". Also, ", ". And "])
        else:
            j = _pick(rng, home.JOINERS)
        query += j + (c[:1].upper() + c[1:] if j in (" ", ". ", ". Then ", ". Also ") else c)
    forms = {getattr(c, "form", "imperative") for c in clauses}
    if rng.random() < 0.4:
        query = wrap(rng, _clause(query, "question" if "question" in forms else clauses[0].form))
    return query


# version 5: the kind a value shows, and the order arguments are said in
_DIRECT_KINDS = ("person", "place", "message", "text", "room", "string_array", "entity")
_RANK5 = {"person": 2, "number": 3, "integer": 3, "place": 4, "room": 4, "date": 5, "time": 6,
          "message": 7, "boolean": 8}
_FROM = {"from", "origin", "source", "start", "departure", "sender", "pickup", "depart", "starting",
         "begin", "since", "checkin"}
_TO = {"to", "destination", "target", "end", "arrival", "recipient", "dest", "receiver", "dropoff",
       "ending", "until", "checkout", "finish"}
_BY = {"artist", "author", "band", "singer", "creator", "composer", "director", "writer", "by"}
_WITH = {"attendee", "attendees", "guest", "guests", "invitee", "invitees", "participant", "participants",
         "with", "partner"}


def _kind5(p):
    """The kind two arguments are told apart by: numbers also by their unit."""
    kind = _FORM_OF.get(_FORM_OF_KIND.get(p.kind, p.kind), _FORM_OF_KIND.get(p.kind, p.kind))
    return (kind, tuple(p.unit) if kind == "number" and p.unit else None)


def arg_phrase5(rng, param, value, said, renamed, named_only, direct, named=False):
    """(words, said without the property's name, said as the object) for one argument
    of a version-5 request.  A value whose kind shows what it is (a place, a person, a
    date, a time, a number with its unit, a title) is said without the property's name
    most of the time; two of a kind keep their names unless a direction tells them apart
    ("from Leeds to York").  ``direct``: the value says the action's object ("play X");
    ``named``: the object names the property ("set the swing mode" … "to auto")."""

    if param.kind == "boolean":
        mention = param.mention(rng, renamed)
        vague = r"(?:true|false|whether|if|set|specify|specifies|indicates|flag|determines|option|boolean|" \
                r"enable|enables|disable|turn)\b"
        if not mention or re.match(vague, mention):     # "true to include details": the name says it
            said_by = re.match(vague + r"(?: or \w+)?(?: to| whether| if| the)?\s+([a-z]+(?: [a-z]+)?)",
                               param.description, re.I)
            mention = " ".join(param.words) if not renamed else said_by.group(1).lower() if said_by else mention
        phrase = arg_phrase(rng, param, value, said, renamed, named_only, mention=mention)
        return (phrase[4:] if phrase.startswith("and ") else phrase), False, False   # the join says "and"
    kind = _kind_seen(param, renamed)
    words = set(param.words) | (para.said_words(param, True) if renamed else set())
    way = "from" if words & _FROM else "to" if words & _TO else None
    quoted = said[:1] in ("'", '"')
    if named:
        return _pick(rng, ["to {s}", "to {s}", "at {s}"]).replace("{s}", said), True, False
    if direct and kind in _DIRECT_KINDS:
        if kind == "message" and not quoted and rng.random() < 0.5:
            q = _pick(rng, ["'", '"'])
            return q + said + q, True, True
        return (("the " + said) if kind == "room" and rng.random() < 0.6 else said), True, True
    forms, sure = None, None
    if kind == "place":
        forms = ["from {s}"] if way == "from" else ["to {s}"] if way == "to" else \
            ["at {s}", "to {s}"] if words & {"address", "street"} else ["in {s}", "in {s}", "for {s}", "around {s}"]
    elif kind == "room":
        forms = ["in the {s}", "in {s}", "for the {s}"]
    elif kind == "person":
        forms = ["from {s}"] if way == "from" else ["to {s}", "for {s}"] if way == "to" else \
            ["by {s}"] if words & _BY else ["with {s}"] if words & _WITH else ["for {s}", "with {s}", "to {s}"]
    elif kind == "date":
        forms = ["from {s}", "starting {s}"] if way == "from" else ["until {s}", "to {s}"] if way == "to" \
            else ["on {s}", "for {s}", "on {s}"]
    elif kind == "time":
        forms = ["from {s}"] if way == "from" else ["until {s}"] if way == "to" else ["at {s}"]
    elif param.kind in ("integer", "number") and value is not None:
        sure = 0.95             # a number said with its unit needs no name: "for 16 days"
        unit = said.rsplit(" ", 1)[-1] if " " in said else re.sub(r"^[\d.,-]+", "", said)
        for units, options in (para.UNIT_FORMS if param.unit else []):
            if unit in units or said.endswith(tuple(u for u in units if len(u) > 2)):
                forms = options
                break
        named_by = [w for w in param.words if w in para.UNIT_NAMES]
        if forms is None and named_by:      # "days": 9 -> "for 9 days"
            unit = named_by[0] if value != 1 else named_by[0][:-1]
            forms = ["for {s} " + unit, "{s} " + unit] + \
                (["over the next {s} " + unit] if value != 1 and unit in ("days", "hours", "weeks") else [])
        elif forms is None and not named_only and rng.random() < 0.4:
            forms, sure = ["for {s}", "{s}", "number {s}"], None    # the only number: "provider 10"
    elif way and kind in ("text", "enum"):        # "translate … to French"
        forms = ["from {s}"] if way == "from" else ["to {s}", "into {s}"]
    elif kind == "text":
        pool = pool_of(param)
        if pool in para.POOL_FORMS:
            forms = para.POOL_FORMS[pool]
        elif pool in para.NAMED_POOLS:
            forms = ["{s}", "called {s}"] + ([] if quoted else ["'{s}'", '"{s}"'])
        elif param.words[-1:] == ["name"] or words & {"title", "label", "nickname"}:
            forms = ["called {s}", "named {s}"] + ([] if quoted else ["'{s}'", '"{s}"'])
        elif not named_only and not quoted and rng.random() < 0.4:
            forms = ["'{s}'", '"{s}"', "for '{s}'"]         # a quoted value says it is the thing asked about
    elif kind in ("code", "pattern") and not named_only:
        forms = ["#{s}", "{s}", "number {s}"] if re.fullmatch(r"[A-Za-z0-9_-]+", said) else None
    rate = {"text": 0.75, "person": 0.75, "code": 0.5, "pattern": 0.5}.get(kind, 0.8)
    if param.kind in ("integer", "number") and value is not None and sure:
        rate = sure
    if forms and (not named_only or way) and rng.random() < rate:
        return _pick(rng, forms).replace("{s}", said), True, False
    mention = param.mention(rng, renamed) or " ".join(param.words or ["value"])
    if rng.random() < para.MENTION_RATE:
        mention = " ".join(para._replace_nouns(rng, mention.split(), 1.0))
    phrase = arg_phrase(rng, param, value, said, renamed, named_only, mention=mention)
    if "the the" not in said:
        phrase = phrase.replace("the the ", "the ")
    return phrase, False, False


def _kind_seen(param, renamed):
    """The kind a person sees in a property: its drawn kind, or for free text the kind
    its words name (a renamed "p56k3" described as "The city …" is a place)."""

    kind = _FORM_OF_KIND.get(param.kind, param.kind)
    if kind != "text":
        return kind
    words = para.said_words(param, renamed)
    for seen, names in (("person", _PERSON), ("place", _PLACE), ("message", _MESSAGE)):
        if words & names:
            return seen
    return kind


def _bad_value_said(rng, p):
    """Words for a value the schema forbids: outside the bounds, or not in the enum."""
    if p.kind == "enum":
        members = {str(v).lower() for v in p.schema["enum"]}
        for _ in range(5):
            word = _open_word(rng).lower()
            if word not in members and all(word not in m for m in members):
                return word
        return None
    lo, hi = _bounds(p.schema, p.kind == "integer")
    options = []
    if hi is not None:
        options.append(int(hi) + _pick(rng, [1, 5, 10, 50, 100]) if hi >= 10 else int(hi) + 1)
    if lo is not None and lo > -1000:
        below = int(lo) - _pick(rng, [1, 5, 10, 20])
        if below >= 0 or lo < 0:
            options.append(below)
    if not options:
        return None
    return _say_number(rng, _pick(rng, options), p.unit)
