"""Times of day and durations as people say them, read as clock values and seconds.

"7am", "5:15 pm", "quarter to eight in the morning", "half past six", "noon", "19:30",
"eight o'clock tonight": ``said_times(text)`` gives every (hour, minute) the text can
mean.  A time said without a part of the day ("at 6:30", "quarter to eight") can mean
either half of it, so both readings are given and the model chooses between them;
grounding (``needle_cy.grounding``) only keeps it from writing a time nobody said
("01:45" for "quarter to eight in the morning").

The reading is deliberately narrow: a bare number counts as an hour only after "at",
"until", "till" or "by" and not before a unit ("at 80 percent"; "a table for 7" is people),
so a level, a count or a duration is never taken for a time.

``said_durations(text)`` reads the lengths of time said, in seconds: "an hour and a
half" (5400), "three quarters of an hour", "2 hours and 15 minutes" (one duration, not
two), "a 25 minute timer", "half an hour"; grounding narrows a minutes argument to them.
"""
from __future__ import annotations

import re

__all__ = ["said_times", "said_time_spans", "time_renderings", "said_durations", "WORD_NUMBERS",
           "SMALL_NUMBERS", "TENS"]

# Number words, shared with grounding's reading of said numbers.
SMALL_NUMBERS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
                 "fourteen fifteen sixteen seventeen eighteen nineteen").split()
TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()
WORD_NUMBERS = {**{w: i for i, w in enumerate(SMALL_NUMBERS)},
                **{w: 10 * i for i, w in enumerate(TENS, start=2)}}
_HOURS = {w: WORD_NUMBERS[w] for w in SMALL_NUMBERS[1:13]}
_HOUR = r"(?P<hour>1[0-2]|0?[1-9]|" + "|".join(sorted(_HOURS, key=len, reverse=True)) + r")"
_OFFSETS = {"five": 5, "ten": 10, "quarter": 15, "a quarter": 15, "twenty": 20,
            "twenty-five": 25, "twenty five": 25, "half": 30}
_OFFSET = (r"(?P<offset>" + "|".join(sorted(map(re.escape, _OFFSETS), key=len, reverse=True))
           + r"|[1-9]|[1-5][0-9])(?: minutes?)?")
_SPOKEN_MINUTES = {"fifteen": 15, "thirty": 30, "forty-five": 45, "forty five": 45}
_PART = (r"(?P<part>a\.?m\b\.?|p\.?m\b\.?|in the morning|this morning|"
         r"in the afternoon|this afternoon|in the evening|this evening|tonight|at night|"
         r"morning|afternoon|evening|night)")
_AFTER = re.compile(r"\s*(?:(?:tomorrow|today)\s+)?" + _PART)
_BEFORE = re.compile(r"(?P<part>morning|afternoon|evening|tonight|night)\s+(?:at|for|by)\s+$")
_B = r"(?<![0-9a-z:.\-])"           # a time starts a word (not "10:30" inside "210:30")
_E = r"(?![0-9a-z:\-])"
_UNITS = (r"\s*(?:%|percent|per cent|minutes?|mins?|hours?|hrs?|seconds?|secs?|degrees?|"
          r"points?|times|days?|weeks?|people|of\b|and a half)")

_FORMS = [
    # "19:30", "6:30", "5:15 pm"
    ("clock", re.compile(_B + r"(?P<h>[01]?[0-9]|2[0-3]):(?P<m>[0-5][0-9])" + _E)),
    # "quarter to eight", "ten past 6", "half past seven"
    ("relative", re.compile(_B + _OFFSET + r" (?P<dir>past|after|to|before) " + _HOUR + _E)),
    # "eight o'clock", "11 o'clock"
    ("hour", re.compile(_B + _HOUR + r" ?o'?clock" + _E)),
    # "six thirty", "seven forty-five"
    ("spoken", re.compile(_B + r"(?P<hour>" + "|".join(_HOURS) + r") (?P<sm>"
                          + "|".join(_SPOKEN_MINUTES) + r")" + _E)),
    # "7am", "eleven at night": a bare hour needs its part of the day right after it
    ("hour_part", re.compile(_B + _HOUR + r" ?(?=a\.?m\b|p\.?m\b|in the (?:morning|"
                             r"afternoon|evening)\b|this (?:morning|afternoon|evening)\b|"
                             r"at night\b|tonight\b)")),
    # "at 7", "until eight": a bare hour after a time preposition, not before a unit
    # ("for 7" is left out: "a table for 7" counts people)
    ("hour_at", re.compile(r"\b(?:at|until|till|by) " + _HOUR + _E + r"(?!" + _UNITS + r")")),
]
_NAMED = [(re.compile(_B + r"(?:noon|midday)" + _E), (12, 0)),
          (re.compile(_B + r"midnight" + _E), (0, 0))]


def _hour_value(text):
    return _HOURS[text] if text in _HOURS else int(text)


def _part_of_day(lower, start, end):
    """('am' | 'pm' | 'night' | None, end): the part of the day said right after the
    time ("7:45 in the morning", "at 8 tomorrow evening", then ``end`` moves past it) or
    right before it ("tonight at 9")."""
    m = _AFTER.match(lower, end)
    part = m.group("part") if m else None
    if m is not None:
        end = m.end()
    if part is None:
        m = _BEFORE.search(lower, max(0, start - 24), start)
        part = m.group("part") if m else None
    if part is None:
        return None, end
    if part.startswith("a") and part[1:2] in (".", "m") or "morning" in part:
        return "am", end
    if part.startswith("p") and part[1:2] in (".", "m"):
        return "pm", end
    return ("night" if "night" in part else "pm"), end


def _readings(hour12, part):
    """24-hour hours a 1..12 hour can mean with this part of the day."""
    if part == "am":
        return [hour12 % 12]
    if part == "pm":
        return [hour12 % 12 + 12]
    if part == "night":            # "eleven at night" is 23:00; "two at night" 02:00
        return [hour12 % 12 + 12] if hour12 >= 6 and hour12 != 12 else [hour12 % 12]
    return [hour12 % 12, hour12 % 12 + 12]


def _time_mentions(lower):
    """(start, end, readings) of each time said in ``lower`` (lowercased), in the order of
    the forms above; a span read once is not read again ("8 o'clock" is not also "at 8")."""
    taken = []
    for kind, rx in _FORMS:
        for m in rx.finditer(lower):
            if any(a < m.end() and m.start() < b for a, b in taken):
                continue
            taken.append((m.start(), m.end()))
            # "at 9" is read from its hour, so "tonight at 9" finds its part of the day
            begin = m.start("hour") if kind == "hour_at" else m.start()
            part, end = _part_of_day(lower, begin, m.end())
            if kind == "clock":
                h, minute = int(m.group("h")), int(m.group("m"))
                explicit = h == 0 or h > 12 or m.group("h").startswith("0")
                yield begin, end, [(h24, minute) for h24 in ([h] if explicit else _readings(h, part))]
                continue
            hour12 = _hour_value(m.group("hour"))
            if kind == "relative":
                offset = _OFFSETS.get(m.group("offset"))
                offset = int(m.group("offset")) if offset is None else offset
                if m.group("dir") in ("to", "before"):
                    offset = -offset
                totals = [(h24 * 60 + offset) % 1440 for h24 in _readings(hour12, part)]
                yield begin, end, [(t // 60, t % 60) for t in totals]
            else:
                minute = _SPOKEN_MINUTES[m.group("sm")] if kind == "spoken" else 0
                yield begin, end, [(h24, minute) for h24 in _readings(hour12, part)]
    for rx, reading in _NAMED:
        for m in rx.finditer(lower):
            yield m.start(), m.end(), [reading]


def said_times(text: str):
    """Every (hour, minute) of the 24-hour clock that ``text`` says, in order of mention,
    without repeats."""
    found = []
    for _, _, readings in _time_mentions(text.lower()):
        found.extend(r for r in readings if r not in found)
    return found


def said_time_spans(text: str):
    """The (start, end) offsets in ``text`` of the times it says, with the part of the
    day said after them ("5:15 pm" of "a 5:15 pm alarm called gym")."""
    return sorted((a, b) for a, b, _ in _time_mentions(text.lower()))


def time_renderings(times, pattern):
    """The strings of ``times`` ("07:45", else "7:45", else "07:45:00") that the JSON
    Schema ``pattern`` accepts; empty when the pattern is not a time's: it must refuse a
    plain word, so a loose pattern on a free text ("^.{1,40}$") is never narrowed to times."""
    try:
        rx = re.compile(pattern)
    except (re.error, TypeError):
        return []
    if rx.search("abc") or rx.search("Abc def"):
        return []
    out = []
    for h, m in times:
        for text in (f"{h:02d}:{m:02d}", f"{h}:{m:02d}", f"{h:02d}:{m:02d}:00"):
            if rx.search(text):
                out.append(text)
                break
    return out


_COUNT = (r"(?:\d+(?:\.\d+)?|(?:" + "|".join(TENS) + r")(?:[ -](?:" + "|".join(SMALL_NUMBERS[1:10])
          + r"))?|" + "|".join(sorted(SMALL_NUMBERS, key=len, reverse=True)) + r"|an?)")
_UNIT_SECONDS = {"h": 3600, "m": 60, "s": 1}
_UNIT = r"(?:(?P<{0}h>hours?|hrs?)|(?P<{0}m>minutes?|mins?)|(?P<{0}s>seconds?|secs?))"
_DURATION_FORMS = [
    # "2 hours and 15 minutes", "an hour fifteen minutes": one duration
    re.compile(_B + r"(?P<n1>" + _COUNT + r")[ -](?:hours?|hrs?),? (?:and )?(?P<n2>" + _COUNT
               + r")[ -](?:minutes?|mins?)" + _E),
    # "an hour and a half", "two hours and a half"
    re.compile(_B + r"(?P<n1>" + _COUNT + r")[ -]" + _UNIT.format("a") + r" and a half" + _E),
    # "one and a half hours"
    re.compile(_B + r"(?P<n1>" + _COUNT + r") and a half " + _UNIT.format("b") + _E),
    # "half an hour", "a quarter of an hour", "three quarters of an hour"
    re.compile(_B + r"(?P<frac>half an?|(?:a )?quarter of an?|three quarters of an?) hour" + _E),
    # "20 minutes", "a 25 minute timer", "two-hour"
    re.compile(_B + r"(?P<n1>" + _COUNT + r")[ -]" + _UNIT.format("c") + _E),
]
def _count(text):
    text = text.replace("-", " ")
    if text in ("a", "an"):
        return 1.0
    words = text.split()
    if words[0] in WORD_NUMBERS:
        return float(sum(WORD_NUMBERS[w] for w in words))     # "forty five" is 40 + 5
    return float(text)


def said_durations(text: str):
    """The lengths of time ``text`` says, in seconds, in order of mention, without repeats;
    a span read by one form is not read again by a later one."""
    lower = text.lower()
    found, taken = [], []
    for form in _DURATION_FORMS:
        for m in form.finditer(lower):
            if any(a < m.end() and m.start() < b for a, b in taken):
                continue
            taken.append((m.start(), m.end()))
            groups = {k: v for k, v in m.groupdict().items() if v is not None}
            if "frac" in groups:
                frac = groups["frac"]
                seconds = 1800 if frac.startswith("half") else 2700 if frac.startswith("three") else 900
            elif "n2" in groups:
                seconds = _count(groups["n1"]) * 3600 + _count(groups["n2"]) * 60
            else:
                unit = next(_UNIT_SECONDS[k[-1]] for k in groups if len(k) == 2 and k[-1] in "hms")
                half = 0.5 if " and a half" in m.group(0) else 0.0
                seconds = (_count(groups["n1"]) + half) * unit
            if seconds not in found:
                found.append(seconds)
    return found
