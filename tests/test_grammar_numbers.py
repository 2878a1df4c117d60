"""Issue 5, numbers: a number byte is refused exactly when no completion remains.

After every byte the number prefix must be alive iff some completion (more bytes,
then a delimiter) is a JSON number that meets every constraint of the node
(minimum/maximum, exclusive forms, multipleOf; "type": "integer" admits no '.'/'e'
by design) and fits the number buffer (NUM_BUF bytes).  Both engines are compared
with an independent oracle that works on exact fractions, and complete numbers
with ``jsonschema`` on exact values.
"""
import itertools
import math
import random
from fractions import Fraction

import jsonschema
import pytest

from needle_cy.grammar import NUM_BUF, compile_schema

import os
BACKENDS = os.environ.get("NUM_BACKENDS", "cython,python").split(",")
MANT = "0123456789"


# ----------------------------------------------------------------------------- the oracle

def frac(text):
    return Fraction(text)  # Fraction parses JSON number text (with exponent) exactly


def value_ok(c, v):
    """Does the exact value v satisfy constraint dict c (lo, lo_x, hi, hi_x, mult as Fractions)?"""
    if c["lo"] is not None and (v < c["lo"] or (c["lo_x"] and v == c["lo"])):
        return False
    if c["hi"] is not None and (v > c["hi"] or (c["hi_x"] and v == c["hi"])):
        return False
    if c["mult"] is not None and (v / c["mult"]).denominator != 1:
        return False
    return True


def mirrored(c):
    """Constraints on -v for negative v."""
    return {"lo": None if c["hi"] is None else -c["hi"], "lo_x": c["hi_x"],
            "hi": None if c["lo"] is None else -c["lo"], "hi_x": c["lo_x"], "mult": c["mult"]}


def n_window(c, s):
    """For values N*10**s: (smallest N allowed by lo, largest by hi, step N must be a multiple of)."""
    scale = Fraction(10) ** s
    lo_n, hi_n = None, None
    if c["lo"] is not None:
        b = c["lo"] / scale
        lo_n = math.floor(b) + 1 if (c["lo_x"] and b.denominator == 1) else math.ceil(b)
    if c["hi"] is not None:
        b = c["hi"] / scale
        hi_n = math.ceil(b) - 1 if (c["hi_x"] and b.denominator == 1) else math.floor(b)
    step = 1 if c["mult"] is None else (scale / c["mult"]).denominator   # N*scale/mult integral
    return lo_n, hi_n, step


def some_n(win, lo_n, hi_n):
    """Is some integer N in [lo_n, hi_n] inside the window (see n_window)?"""
    wl, wh, step = win
    if wl is not None:
        lo_n = max(lo_n, wl)
    if wh is not None:
        hi_n = min(hi_n, wh)
    if lo_n > hi_n:
        return False
    return -(-lo_n // step) * step <= hi_n


K_DIGITS = 5      # appended mantissa digits tried by the oracle
E_RANGE = 14      # exponents tried: -E_RANGE .. E_RANGE


def oracle_live(c, text, integer):
    """Liveness by exhaustion of completion *shapes* over exact fractions.

    A completion appends i integer digits, optionally '.' and f fraction digits,
    optionally an exponent X: its values are N*10**s with N in an integer interval
    (a = i + f digits appended) and s = X - (fraction digits), so one exact interval
    test per (a, s) decides every shape with those two numbers.  For the pools below
    (bounds and multiples with at most 3 significant digits, magnitudes 10**-2..10**3)
    every live prefix of at most 7 bytes has a witness with at most 4 appended digits and
    |X| <= 12 (10**4 consecutive N hold a multiple of any mu <= 999 and pass any 3-digit
    bound), so K_DIGITS/E_RANGE make the search exhaustive; lengths stay far below NUM_BUF.
    """
    if not text:
        return True
    if text == "-":
        return any(oracle_live(c, text + d, integer) for d in MANT)
    neg = text.startswith("-")
    if neg:
        c = mirrored(c)
    body = text[1:] if neg else text
    if "e" in body:
        i = body.find("e")
        mant, ex = body[:i], body[i + 1:]
        m = frac(mant)
        sign_typed = ex[:1] in ("+", "-")
        digits = ex[1:] if sign_typed else ex
        xs = set()
        for extra in range(0, 4):   # values of the exponent after 0..3 more digits, clipped
            if not digits and not extra:
                continue
            g = int(digits) if digits else 0
            lo_x, hi_x = g * 10 ** extra, (g + 1) * 10 ** extra - 1
            # past |x| = 40 nothing changes for the pools below (beyond every bound, and a
            # multiple from then on or never), so larger exponents are represented by 41
            xs.update(range(min(lo_x, 41), min(hi_x, 41) + 1))
        signs = [-1 if ex[:1] == "-" else 1] if (sign_typed or digits) else [1, -1]
        return any(value_ok(c, m * Fraction(10) ** (sg * x)) for x in xs for sg in signs)
    if "." in body:
        ip, fp = body.split(".")
    else:
        ip, fp = body, None
    pairs = set()   # (a, s)
    exps = [0] if integer else range(-E_RANGE, E_RANGE + 1)
    f0 = len(fp) if fp else 0
    if fp is None:
        for i in range(K_DIGITS + 1 if ip != "0" else 1):
            for x in exps:
                pairs.add((i, x))
                if not integer:
                    for f in range(1, K_DIGITS + 1 - i):
                        pairs.add((i + f, x - f))
    else:
        for f in range(0 if fp else 1, K_DIGITS + 1):
            for x in exps:
                pairs.add((f, x - f0 - f))
    p = int(ip + (fp or ""))
    wins = {}
    for a, s in pairs:
        if s not in wins:
            wins[s] = n_window(c, s)
        if some_n(wins[s], p * 10 ** a, p * 10 ** a + 10 ** a - 1):
            return True
    return False


# ----------------------------------------------------------------------------- constraint pools

BOUND_POOL = ["-25", "-2.5", "-1", "-0.01", "0", "0.5", "1", "3", "7.25", "10", "20", "30", "100", "1000"]
MULT_POOL = [None, None, "0.5", "0.01", "3", "2", "0.25", "7", "1.5", "12"]


def random_constraints(rng, draft4=False):
    lo = rng.choice(BOUND_POOL + [None, None])
    hi = rng.choice(BOUND_POOL + [None, None])
    lo_x = rng.random() < 0.35
    hi_x = rng.random() < 0.35
    mult = rng.choice(MULT_POOL)
    return {"lo": lo, "hi": hi, "lo_x": lo_x, "hi_x": hi_x, "mult": mult, "integer": rng.random() < 0.3}


def num(t):
    f = Fraction(t)
    return int(f) if f.denominator == 1 else float(t)


def schema_of(k, draft4=False):
    s = {"type": "integer" if k["integer"] else "number"}
    for name, bx, key in (("lo", "lo_x", "minimum"), ("hi", "hi_x", "maximum")):
        if k[name] is None:
            continue
        if draft4:
            s[key] = num(k[name])
            if k[bx]:
                s["exclusiveM" + key[1:]] = True
        else:
            s[("exclusiveM" + key[1:]) if k[bx] else key] = num(k[name])
    if k["mult"] is not None:
        s["multipleOf"] = num(k["mult"])
    return s


def exact_of(k):
    return {"lo": None if k["lo"] is None else Fraction(k["lo"]), "lo_x": k["lo_x"],
            "hi": None if k["hi"] is None else Fraction(k["hi"]), "hi_x": k["hi_x"],
            "mult": None if k["mult"] is None else Fraction(k["mult"])}


def exact_schema(k):
    """The same constraints with Fraction values, for jsonschema's exact arithmetic."""
    s = {"type": "integer" if k["integer"] else "number"}
    e = exact_of(k)
    if e["lo"] is not None:
        s["exclusiveMinimum" if k["lo_x"] else "minimum"] = e["lo"]
    if e["hi"] is not None:
        s["exclusiveMaximum" if k["hi_x"] else "maximum"] = e["hi"]
    if e["mult"] is not None:
        s["multipleOf"] = e["mult"]
    return s


def schema_valid(k, text):
    v = Fraction(text)
    if v.denominator == 1:
        v = int(v)
    return jsonschema.Draft202012Validator(exact_schema(k)).is_valid(v)


def syntax_next(text, integer):
    """Bytes that keep `text` a JSON number prefix (the grammar's own syntax, integers without . e)."""
    out = []
    body = text[1:] if text.startswith("-") else text
    if not text:
        return list("-" + MANT)
    if text == "-":
        return list(MANT)
    if "e" in body:
        ex = body[body.index("e") + 1:]
        return list(MANT) + (["+", "-"] if not ex else [])
    if "." in body:
        return list(MANT) + (["e"] if not body.endswith(".") else [])
    if body != "0":
        out += list(MANT)
    if not integer:
        out += [".", "e"]
    return out


def complete(text):
    body = text[1:] if text.startswith("-") else text
    return bool(body) and body[-1].isdigit()


@pytest.mark.parametrize("seed", range(16))
def test_prefix_liveness_matches_oracle(seed):
    rng = random.Random(seed)
    grammars = []
    for _ in range(7):
        k = random_constraints(rng)
        schema = schema_of(k)
        grammars.append((k, schema, [compile_schema(schema, backend=b) for b in BACKENDS]))
    for k, schema, gs in grammars:
        c = exact_of(k)
        lives = {}

        def live(t):
            if t not in lives:
                lives[t] = oracle_live(c, t, k["integer"])
            return lives[t]

        for walk in range(14):
            text = ""
            states = [g.start() for g in gs]
            for depth in range(7):
                for b in syntax_next(text, k["integer"]):
                    t = text + b
                    want = live(t)
                    for s, name in zip(states, BACKENDS):
                        got = s.clone().feed(t[-1].encode())
                        assert got == want, (name, schema, t, got, want)
                    if want and complete(t):
                        v = schema_valid(k, t)
                        for s in states:
                            s2 = s.clone()
                            assert s2.feed(t[-1].encode()) and s2.is_complete() == v, (schema, t, v)
                nxt = [b for b in syntax_next(text, k["integer"]) if live(text + b)]
                if not nxt:
                    break
                b = rng.choice(nxt)
                text += b
                for s in states:
                    assert s.feed(b.encode())
