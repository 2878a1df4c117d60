"""Character sets as sorted disjoint code point ranges, the two regex dialects' classes, and
the UTF-8 byte ranges of a code point range (what the byte automata are built from)."""
from __future__ import annotations

import re

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

