"""Number constraints as exact decimals, and number liveness.

The compiler normalises bounds and ``multipleOf`` to exact decimals (``norm_decimal``) and
asks ``number_live`` whether a node's constraints leave any number at all; the reference
runtime (``needle_cy.reference.grammar``) asks it after every byte of a number.  The C runtime
has its own ``number_live`` (``_runtime.pyx``, same name, same meaning), tested against this one.
"""
from __future__ import annotations

import math
import re
from fractions import Fraction

from ..errors import SchemaError
from .limits import (N_DOT, N_EXP, N_EXPDIG, N_EXPSIGN, N_FRAC, N_INT, N_MINUS, N_ZERO, NUM_BUF)

# ============================================================================
# exact decimals: value = (-1)**neg * int(digits) * 10**exp, digits without
# leading/trailing zeros ("" for zero, then neg is False and exp 0)


def norm_decimal(x):
    """Normalise a JSON number (text or Python number) to (neg, digits, exp)."""
    if isinstance(x, bool):
        raise SchemaError(f"expected a number, found {x!r}")
    if isinstance(x, int):
        text = str(x)
    elif isinstance(x, float):
        if not math.isfinite(x):
            raise SchemaError(f"non-finite number {x!r}")
        text = repr(x)
    else:
        text = x
    m = re.fullmatch(r"(-?)(\d+)(?:\.(\d+))?(?:[eE]([+-]?\d+))?", text)
    if not m:
        raise SchemaError(f"not a number: {text!r}")
    neg = m.group(1) == "-"
    ip, fp, ex = m.group(2), m.group(3) or "", int(m.group(4) or 0)
    digits = (ip + fp).lstrip("0")
    exp = ex - len(fp)
    if not digits:
        return (False, "", 0)
    stripped = digits.rstrip("0")
    exp += len(digits) - len(stripped)
    return (neg, stripped, exp)


def dec_to_fraction(d):
    neg, digits, exp = d
    v = Fraction(int(digits or "0")) * (Fraction(10) ** exp)
    return -v if neg else v


def dec_cmp(a, b):
    fa, fb = dec_to_fraction(a), dec_to_fraction(b)
    return (fa > fb) - (fa < fb)


def number_texts(v):
    """Texts accepted for an enum/const number: its repr, and N / N.0 for integral values
    (zero with either sign).  Other spellings of the value ("1.00", "1e0") are refused: a
    narrowing, exact only where no overlapping oneOf/not depends on it (see docs/grammar.md)."""
    out = set()
    if isinstance(v, int):
        out.add(str(v))
        out.add(str(v) + ".0")
    else:
        out.add(repr(v))
        if v.is_integer() and abs(v) < 1e16:
            out.add(str(int(v)))
            out.add(str(int(v)) + ".0")
    if v == 0:
        # JSON's -0 is the number 0 (fuzz finding, seed 7: oneOf [{enum: [0]}, true] took -0.0)
        out.update(("0", "0.0", "-0", "-0.0"))
    return sorted(out)


# ============================================================================
# number texts as the runtimes read them (the reference's and the C runtime's parse_dec agree)

def parse_dec(text):
    """Normalise number text like the C runtime: (neg, digits, exp), exponent clamped near 1e9."""
    s = text.encode() if isinstance(text, str) else bytes(text)
    i, n = 0, len(s)
    neg = False
    digits = bytearray()
    frac = 0
    in_frac = False
    if i < n and s[i] == 0x2D:
        neg = True
        i += 1
    while i < n:
        c = s[i]
        if c == 0x2E:
            in_frac = True
        elif c in (0x65, 0x45):
            i += 1
            break
        else:
            if in_frac:
                frac += 1
            if not (not digits and c == 0x30):
                digits.append(c)
        i += 1
    eneg = False
    e = 0
    if i < n and s[i] in (0x2B, 0x2D):
        eneg = s[i] == 0x2D
        i += 1
    while i < n:
        if e < 100000000:
            e = e * 10 + (s[i] - 0x30)
        i += 1
    if eneg:
        e = -e
    e -= frac
    while digits and digits[-1] == 0x30:
        digits.pop()
        e += 1
    if not digits:
        return (False, "", 0)
    return (neg, digits.decode(), e)


def number_too_large(text):
    """Is the magnitude of the number text 1e308 or more?  A double cannot hold it
    (DBL_MAX ≈ 1.8e308): JSON readers turn it into inf, which no JSON text can write
    back, so the grammar never writes one; zero with any exponent is not large.
    (Twin of the C runtime's ``number_too_large``.)"""
    neg, digits, exp = parse_dec(text)
    return bool(digits) and len(digits) - 1 + exp >= 308


def cmp_dec(a, b):
    """Compare normalised decimals without building huge powers."""
    an, ad, ae = a
    bn, bd, be = b
    if not ad and not bd:
        return 0
    if not ad:
        return 1 if bn else -1
    if not bd:
        return -1 if an else 1
    if an != bn:
        return -1 if an else 1
    oa, ob = len(ad) + ae, len(bd) + be
    if oa != ob:
        m = 1 if oa > ob else -1
    else:
        m = (ad > bd) - (ad < bd)  # no trailing zeros: lexicographic = numeric at equal order
    return -m if an else m


def number_check(check, text):
    """Exact bounds + multipleOf for a complete number text."""
    d = parse_dec(text)
    lo, hi, mult = check["lo"], check["hi"], check["mult"]
    if lo is not None:
        c = cmp_dec(d, lo[0])
        if c < 0 or (c == 0 and lo[1]):
            return False
    if hi is not None:
        c = cmp_dec(d, hi[0])
        if c > 0 or (c == 0 and hi[1]):
            return False
    if mult is not None and d[1]:
        m = int(mult[1])
        e = d[2] - mult[2]
        if e < 0:
            return False
        if (int(d[1]) % m) * pow(10, e, m) % m:
            return False
    return True


# ---------------------------------------------------------------- number liveness
#
# After every byte of a number the prefix is alive iff some completion (more bytes,
# then a delimiter) gives a number that passes ``number_check`` AND whose whole text
# fits the number buffer (NUM_BUF bytes).  Nonzero values are searched as
#     value = N * 10**q,  N in [plo*10**a, (phi+1)*10**a - 1]
# (a = mantissa digits still to append, plo..phi the leading digits: the prefix's own
# digits, or 1..9 when only zeros/a sign were typed), q = the exponent of N's last
# digit, which an exponent, a dot or leading fraction zeros move at a byte cost.
# The buckets [plo*10**k, (phi+1)*10**k) (k = a + q) are disjoint for different k,
# so along k at most two buckets hold a bound of the interval; the buckets between
# lie strictly inside it, and there feasibility only grows with k (v -> 10v keeps a
# multiple a multiple).  Each query therefore checks at most three exact candidates
# (``bucket_feasible``).  Exponent shifts saturate at +-QINF: the compiler refuses
# bounds and multipleOf beyond 10**+-MAX_NUM_EXP, so past QINF nothing changes.

QINF = 10 ** 15    # exponent shifts saturate here (far beyond any bound, see above)
KINF = 10 ** 16    # bucket order of an unbounded side


def nd(x):
    """Decimal digits of x >= 0 (1 for 0)."""
    return len(str(x))


def dec_order(d):
    """Order of a normalised positive decimal (digits, exp): it lies in [10**(o-1), 10**o)."""
    return len(d[0]) + d[1]


def cmp_pos(ad, ae, bd, be):
    """Compare positive decimals ad*10**ae and bd*10**be (digit strings without trailing zeros)."""
    return cmp_dec((False, ad, ae), (False, bd, be))


def magnitude_bounds(check, neg):
    """Bounds on |v| for the nonzero values of this sign: (L, Lx, H, Hx) or None when
    no nonzero value of that sign fits; L/H are (digits, exp) or None (unbounded)."""
    lo, hi = check["lo"], check["hi"]
    if not neg:
        low, high = lo, hi
    else:  # v = -|v| in [lo, hi]  <=>  |v| in [-hi, -lo]
        low = None if hi is None else ((not hi[0][0], hi[0][1], hi[0][2]), hi[1])
        high = None if lo is None else ((not lo[0][0], lo[0][1], lo[0][2]), lo[1])
    L = Lx = H = Hx = None
    if low is not None and low[0][1] and not low[0][0]:
        L, Lx = (low[0][1], low[0][2]), low[1]
    if high is not None:
        if high[0][0] or not high[0][1]:
            return None  # the upper bound is <= 0: no value of this sign is nonzero
        H, Hx = (high[0][1], high[0][2]), high[1]
    return (L, Lx, H, Hx)


def scaled_int(d, q, up, excl, cap):
    """ceil (up) or floor of d / 10**q, moved past d when excl and exact; None when > 10**cap."""
    digits, exp = d
    o = len(digits) + exp - q
    if o > cap:
        return None
    if o < 0:                       # 0 < d / 10**q < 1
        return 1 if up else 0
    s = exp - q
    if s >= 0:
        v = int(digits) * 10 ** s
        return v + 1 if (excl and up) else (v - 1 if excl else v)
    v = int(digits) // 10 ** (-s)   # digits has no trailing zero: d / 10**q is not an integer
    return v + 1 if up else v


def bucket_feasible(J, mult, plo, phi, a, q):
    """Is some N in [plo*10**a, (phi+1)*10**a - 1] with N*10**q inside J and a multiple of mult?"""
    L, Lx, H, Hx = J
    lo_n = plo * 10 ** a
    hi_n = (phi + 1) * 10 ** a - 1
    cap = len(str(hi_n)) + 1
    if L is not None:
        v = scaled_int(L, q, True, Lx, cap)
        if v is None:
            return False
        lo_n = max(lo_n, v)
    if H is not None:
        v = scaled_int(H, q, False, Hx, cap)
        if v is not None:
            hi_n = min(hi_n, v)
    if lo_n > hi_n:
        return False
    d = 1
    if mult is not None:
        mu, me = int(mult[1]), mult[2]
        if q >= me:
            # N * 10**(q-me) = 0 mod mu  <=>  N = 0 mod mu / gcd(mu, 10**(q-me)); mu < 2**63 holds
            # fewer than 64 factors 2 or 5, so q-me past 64 changes nothing
            d = mu // math.gcd(mu, 10 ** min(q - me, 64))
        else:
            t = me - q               # N must end in t zeros: divide them out
            if t > cap:
                return False
            lo_n = -(-lo_n // 10 ** t)
            hi_n = hi_n // 10 ** t
            d = mu
    first = -(-lo_n // d) * d
    return first <= hi_n


def bucket_orders(J, plo, phi):
    """(k_bot, k_top): the bucket orders k whose [plo*10**k, (phi+1)*10**k) meets J's hull."""
    L, Lx, H, Hx = J
    if H is None:
        k_top = KINF
    else:  # largest k with plo*10**k <= H
        pd = str(plo).rstrip("0")
        pe = len(str(plo)) - len(pd)
        k = dec_order(H) - len(str(plo))
        k_top = k if cmp_pos(pd, pe + k, *H) <= 0 else k - 1
    if L is None:
        k_bot = -KINF
    else:  # smallest k with (phi+1)*10**k > L
        cd = str(phi + 1).rstrip("0")
        ce = len(str(phi + 1)) - len(cd)
        k = dec_order(L) - len(str(phi + 1))
        k_bot = k if cmp_pos(cd, ce + k, *L) > 0 else k + 1
    return k_bot, k_top


def bucket_search(J, mult, plo, phi, k_lo, k_hi, a=None, q=None):
    """Is some bucket order k in [k_lo, k_hi] feasible, with a fixed (q = k - a) or q fixed (a = k - q)?"""
    k_bot, k_top = bucket_orders(J, plo, phi)
    u, v = max(k_lo, k_bot), min(k_hi, k_top)
    if u > v:
        return False
    cands = {u, v}
    w = min(v, k_top - 1)           # the largest bucket strictly inside J: the best interior one
    if w > max(u, k_bot):
        cands.add(w)
    for k in sorted(cands):
        if bucket_feasible(J, mult, plo, phi, k - q if a is None else a, k - a if a is not None else q):
            return True
    return False


def sat(x):
    return max(-QINF, min(QINF, x))


def exp_range(B):
    """Exponent values X writable in at most B bytes (0: no exponent)."""
    if B < 2:
        return (0, 0)
    return (sat(-(10 ** min(B - 2, 17) - 1)), sat(10 ** min(B - 1, 17) - 1))


def int_shifts(a, B):
    """q reachable in B bytes after `a` more integer digits: a dot, an exponent, or both."""
    lo_q = hi_q = 0
    if a >= 1 and B >= 1:
        lo_q = -a                                   # a dot inside the new digits
    xl, xh = exp_range(B)                           # exponent after the digits
    lo_q, hi_q = min(lo_q, xl), max(hi_q, xh)
    if a >= 1 and B >= 3:
        xl, xh = exp_range(B - 1)                   # a dot before the new digits, and an exponent
        lo_q, hi_q = min(lo_q, xl - a), max(hi_q, xh - a)
    return lo_q, hi_q


def zero_shifts(B):
    """q offsets reachable in B bytes by leading fraction zeros (each -1) and an exponent."""
    if B < 2:
        return (-B, 0)
    xl, xh = exp_range(B)
    return (min(-B, xl), xh)


def form_live(J, mult, plo, phi, R, a_min, shifts):
    """Some a in [a_min, R] and q in shifts(a, R - a) (an interval) with a feasible bucket?"""
    if R < a_min:
        return False
    for a in range(a_min, R + 1):
        lo_q, hi_q = shifts(a, R - a)
        if bucket_search(J, mult, plo, phi, sat(a + lo_q), sat(a + hi_q), a=a):
            return True
        # (after the cheap common case) any solution with a digits is one with R digits
        # too (append zeros, q - 1 each): none there, none at all
        if a == a_min and not bucket_search(J, mult, plo, phi, -KINF, KINF, a=R):
            return False
    return False


def exp_live(J, mult, md, me, phase, esign, g, R):
    """Exponent phases: the mantissa md*10**me is fixed, the exponent's start is typed."""
    L, Lx, H, Hx = J
    # y: the exponent of md's last digit; the feasible y form an interval
    if L is None:
        y_lo = -KINF
    else:
        y = dec_order(L) - len(md)
        c = cmp_pos(md, y, *L)
        y_lo = y if (c > 0 or (c == 0 and not Lx)) else y + 1
    if H is None:
        y_hi = KINF
    else:
        y = dec_order(H) - len(md)
        c = cmp_pos(md, y, *H)
        y_hi = y if (c < 0 or (c == 0 and not Hx)) else y - 1
    if mult is not None:
        mu, mexp = int(mult[1]), mult[2]
        r = int(md) % mu
        t = 0
        while r and t < 64:
            r = r * 10 % mu
            t += 1
        if r:
            return False
        y_lo = max(y_lo, mexp + t)     # md*10**y is a multiple from y = mexp + t on
    xl, xh = sat(y_lo - me), sat(y_hi - me)
    if xl > xh:
        return False
    if phase == N_EXP:
        if xl <= 0 <= xh:
            return R >= 1
        return R >= (nd(xl) if xl > 0 else 1 + nd(-xh))
    if esign < 0:
        xl, xh = -xh, -xl
    xl = max(xl, 0)
    if xl > xh:
        return False
    if phase == N_EXPSIGN:
        return R >= nd(xl)
    if g == 0:                      # only zeros typed: any value, one byte per digit
        return xl == 0 or R >= nd(xl)
    for t in range(R + 1):          # g followed by t more digits
        lo_x = sat(g * 10 ** min(t, 17))
        hi_x = sat((g + 1) * 10 ** min(t, 17) - 1)
        if lo_x > xh:
            return False
        if hi_x >= xl:
            return True
    return False


def number_live(check, text, phase, integer_only):
    """Can the number prefix `text` (syntax phase `phase`) still complete, within NUM_BUF
    bytes, into a number that passes the node's check (None: any number)?"""
    R = NUM_BUF - len(text)
    if R < (1 if phase in (N_MINUS, N_DOT, N_EXP, N_EXPSIGN) else 0):
        return False
    if check is None:
        return True
    if phase in (N_ZERO, N_INT, N_FRAC, N_EXPDIG) and number_check(check, text):
        return True                  # the common case: the prefix itself is a valid number
    neg = text[:1] == b"-"
    ei = -1
    for i, c in enumerate(text):
        if c in (0x65, 0x45):
            ei = i
            break
    mant = text if ei < 0 else text[:ei]
    digits = mant.lstrip(b"-").replace(b".", b"")
    nz = digits.lstrip(b"0")
    # the value 0 (needs a digit after "-", "." or "e")
    if not nz and R >= (1 if phase in (N_MINUS, N_DOT, N_EXP, N_EXPSIGN) else 0) \
            and number_check(check, "0"):
        return True
    J = magnitude_bounds(check, neg)
    if J is None:
        return False
    mult = check["mult"]
    if ei >= 0:
        if not nz:
            return False
        _, md, me = parse_dec(mant)
        rest = text[ei + 1:]
        esign = -1 if rest[:1] == b"-" else 1
        gd = rest.lstrip(b"+-")
        g = int(gd) if gd and len(gd.lstrip(b"0")) <= 15 else (QINF if gd else 0)
        return exp_live(J, mult, md, me, phase, esign, g, R)
    if phase == N_MINUS:        # a first digit 1-9 (then integer digits), or "0"
        if integer_only:
            return bucket_search(J, mult, 1, 9, 0, R - 1, q=0)
        return form_live(J, mult, 1, 9, R - 1, 0, int_shifts) or \
            form_live(J, mult, 1, 9, R - 3, 0, lambda a, B: tuple(-1 - a + s for s in zero_shifts(B)))
    if integer_only:
        if phase != N_INT:
            return False
        pv = int(nz)
        return bucket_search(J, mult, pv, pv, 0, R, q=0)
    if phase == N_INT:
        pv = int(nz)
        return form_live(J, mult, pv, pv, R, 0, int_shifts)
    f0 = len(mant) - mant.index(b".") - 1 if b"." in mant else 0
    if not nz:   # "0", "0.", "0.00": a dot (if none yet), leading zeros, a first digit 1-9
        dot = 1 if phase == N_ZERO else 0
        return form_live(J, mult, 1, 9, R - dot - 1, 0,
                         lambda a, B: tuple(-f0 - 1 - a + s for s in zero_shifts(B)))
    pv = int(nz)
    return form_live(J, mult, pv, pv, R, 1 if phase == N_DOT else 0,
                     lambda a, B: tuple(-f0 - a + s for s in exp_range(B)))

