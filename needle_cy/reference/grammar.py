"""Pure-Python twin of ``needle_cy.grammar._runtime``: the grammar runtime's executable spec.

A state is a set of *threads* (parallel alternatives of anyOf/oneOf); a thread
is a stack of frames plus an ``aux`` word stack (seen-key bitsets, key and item
hashes) and the text of the number being read.  Every function here has a
Cython counterpart of the same name and meaning; tests feed both the same bytes.
The codes and capacities come from ``needle_cy.grammar.limits``; number texts and
number liveness (``parse_dec``, ``number_check``, ``number_live``) from
``needle_cy.grammar.numbers``, which the compiler uses too -- both leaf modules, so
this twin never imports the compiler.

Frame = [kind, node, phase, count, dfa, aux, x, y, h, k]
"""
from __future__ import annotations

import numpy as np

from ..errors import GrammarStateError
from ..grammar.limits import (
    A_ITEM, A_NEXT, A_START, ANY_NODE, C_AFTER, C_ARGS, C_CLOSE, C_FIRST, C_HEAD, C_MID, C_NAME, C_NEXT,
    C_OPEN, CALL_HEAD, CALL_MID, F_ARRAY, F_CALLS, F_KEY, F_LITERAL, F_NUMBER, F_OBJECT, F_ONEOF, F_STRING,
    F_MARK, F_VALUE, MAX_AUX, MAX_DEPTH, MAX_EVENTS, MAX_SLOTS, N_DOT, N_EXP, N_EXPDIG, N_EXPSIGN, N_FRAC, N_INT,
    N_MINUS, N_START, N_ZERO, NEVER_NODE, NODE_CHOICE, NUM_BUF, O_AFTER, O_COLON, O_NEXT, O_START, O_VALUE,
    T_ARR, T_FALSE, T_INT, T_NULL, T_NUM, T_OBJ, T_STR, T_TRUE, start_bit,
)
# number texts and number liveness are shared with the compiler (which asks whether a node's
# number constraints leave any number): one copy, in the grammar package's leaf module
from ..grammar.numbers import number_check, number_live, number_too_large, parse_dec  # noqa: F401  (twins of the C ones)

M64 = 0xFFFFFFFFFFFFFFFF
EOF = 256

LITERALS = (b"true", b"false", b"null")

FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
TAG_STR, TAG_NUM, TAG_ARR, TAG_OBJ = 0x51, 0x52, 0x53, 0x54
HASH_TRUE, HASH_FALSE, HASH_NULL = 0x1111, 0x2222, 0x3333


def fmix(k):
    k &= M64
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & M64
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & M64
    k ^= k >> 33
    return k


def fnv(h, b):
    return ((h ^ b) * FNV_PRIME) & M64


def seq_combine(h, x):
    return fmix((h * 31 + x + 0x9E3779B97F4A7C15) & M64)


def member_hash(kh, vh):
    return fmix((kh * 0x9E3779B97F4A7C15 ^ vh) & M64)


def utf8_bytes(cp):
    return chr(cp).encode("utf-8", "surrogatepass")


def number_hash(text):
    neg, digits, exp = parse_dec(text)
    h = FNV_OFFSET
    for b in (b"-" if neg else b"+") + digits.encode() + b"e" + str(exp).encode():
        h = fnv(h, b)
    return fmix(h ^ TAG_NUM)


class Thread:
    __slots__ = ("frames", "aux", "num", "last_hash", "events")

    def __init__(self):
        self.frames = []
        self.aux = []
        self.num = bytearray()
        self.last_hash = 0
        self.events = []

    def clone(self):
        t = Thread()
        t.frames = [list(f) for f in self.frames]
        t.aux = list(self.aux)
        t.num = bytearray(self.num)
        t.last_hash = self.last_hash
        t.events = list(self.events)
        return t

    def key(self):
        return (tuple(tuple(f) for f in self.frames), tuple(self.aux), bytes(self.num))


def new_frame(kind, node, phase=0):
    return [kind, node, phase, 0, -1, 0, 0, 0, 0, 0]


class ReferenceState:
    """Grammar state: feed bytes; clone; ask whether a complete value was read."""

    def __init__(self, program, _empty=False):
        self.p = program
        self.pos = 0
        self.threads = []
        if _empty:
            return
        th = Thread()
        if program.tools_mode:
            th.frames.append(new_frame(F_CALLS, ANY_NODE, C_OPEN))
        else:
            th.frames.append(new_frame(F_VALUE, program.root))
        self.threads = [th]

    def clone(self):
        s = ReferenceState(self.p, _empty=True)
        s.pos = self.pos
        s.threads = [t.clone() for t in self.threads]
        return s

    @property
    def alive(self):
        return bool(self.threads)

    def feed(self, data):
        if isinstance(data, str):
            data = data.encode("utf-8")
        for b in data:
            if not self.feed_byte(b):
                return False
        return True

    def feed_byte(self, b):
        out = []
        slots = [len(self.threads)]   # threads in use within this byte (forks add)
        for th in self.threads:
            th.events = []
        for th in self.threads:
            step(self.p, th, b, self.pos, out, slots)
        if slots[0] > MAX_SLOTS:
            out = []
        out = resolve_oneof(out)
        # dedupe identical threads
        seen = set()
        uniq = []
        for th in out:
            k = th.key()
            if k not in seen:
                seen.add(k)
                uniq.append(th)
        self.threads = uniq
        self.pos += 1
        return bool(uniq)

    def is_complete(self):
        if not self.threads:
            return False
        c = self.clone()
        if not c.feed_byte(EOF):
            return False
        return any(not th.frames for th in c.threads)

    def in_string(self):
        """True when every thread is inside a free-text string value: not a key, and not an
        enum/pattern/format string (those are bounded by their automaton)."""
        if not self.threads:
            return False
        for th in self.threads:
            if not th.frames or th.frames[-1][0] != F_STRING:
                return False
            if self.p.str_dfa[th.frames[-1][1]] >= 0:
                return False
        return True

    def string_start(self):
        th = self.threads[0]
        return th.frames[-1][5] if th.frames and th.frames[-1][0] == F_STRING else -1


def resolve_oneof(threads):
    """Kill threads in which two alternatives of one oneOf completed the same value."""
    groups = {}
    for i, th in enumerate(threads):
        for ev in th.events:
            node, alt, start, depth = ev
            key = (node, start, depth, th.key())
            groups.setdefault(key, set()).add(alt)
    if not groups:
        return threads
    bad = {k for k, alts in groups.items() if len(alts) > 1}
    if not bad:
        return threads
    out = []
    for th in threads:
        if any((ev[0], ev[2], ev[3], th.key()) in bad for ev in th.events):
            continue
        out.append(th)
    return out


def item_node(p, node, index):
    if index < p.arr_prefix_n[node]:
        return p.prefix_pool[p.arr_prefix_off[node] + index]
    return p.arr_items[node]


def step(p, th, b, pos, out, slots):
    """Feed byte b to one thread; surviving threads (maybe several) go to out."""
    fr = th.frames
    while True:
        if not fr:
            if b == EOF:
                out.append(th)
            return
        top = fr[-1]
        kind = top[0]
        if kind == F_VALUE:
            node = top[1]
            if p.kind[node] == NODE_CHOICE:
                fr.pop()
                bit = start_bit(b) if b != EOF else 0
                alts = [i for i in range(p.alt_n[node]) if p.starts[p.alt_pool[p.alt_off[node] + i]] & bit]
                if not alts:
                    return
                # the thread takes the first alternative; each other one is a new thread
                base = th.clone() if len(alts) > 1 else None
                for j, i in enumerate(alts):
                    if j == 0:
                        t = th
                    else:
                        slots[0] += 1
                        if slots[0] > MAX_SLOTS:
                            return
                        t = base.clone()
                    if not push_alt(p, t, node, i, pos):
                        continue
                    step(p, t, b, pos, out, slots)
                return
            if not start_value(p, th, top, node, b, pos):
                return
            if top[0] == F_NUMBER:
                if not number_byte(p, th, top, b):
                    return
            out.append(th)
            return
        if kind == F_STRING or kind == F_KEY:
            if string_byte(p, th, top, b):
                out.append(th)
            return
        if kind == F_NUMBER:
            if b != EOF and is_number_byte(b):
                if number_byte(p, th, top, b):
                    out.append(th)
                return
            # delimiter: the number ends here; the byte is retried in the parent
            h = number_end(p, th, top)
            if h is None:
                return
            fr.pop()
            if not complete_value(p, th, h):
                return
            continue
        if kind == F_LITERAL:
            lit = LITERALS[top[6]]
            if b != EOF and b == lit[top[3]]:
                top[3] += 1
                if top[3] == len(lit):
                    fr.pop()
                    h = (HASH_TRUE, HASH_FALSE, HASH_NULL)[top[6]]
                    if not complete_value(p, th, h):
                        return
                out.append(th)
            return
        if kind == F_ARRAY:
            node = top[1]
            ph = top[2]
            if ph == A_START or ph == A_NEXT:
                if ph == A_START and b == ord("]"):
                    if p.arr_min[node] > 0 or p.arr_cmin[node] > 0:
                        return
                    fr.pop()
                    if complete_value(p, th, fmix(top[8] ^ TAG_ARR)):
                        out.append(th)
                    return
                if len(fr) >= MAX_DEPTH or p.arr_max[node] == 0:
                    return
                top[2] = A_ITEM
                fr.append(new_frame(F_VALUE, item_node(p, node, top[3])))
                continue
            # A_ITEM: after an item
            if b == ord(","):
                mx = p.arr_max[node]
                if (mx >= 0 and top[3] >= mx) or item_node(p, node, top[3]) == NEVER_NODE:
                    return
                top[2] = A_NEXT
                out.append(th)
                return
            if b == ord("]"):
                if top[3] < p.arr_min[node] or top[7] < p.arr_cmin[node]:
                    return
                fr.pop()
                del th.aux[top[5]:]
                if complete_value(p, th, fmix(top[8] ^ TAG_ARR)):
                    out.append(th)
                return
            return
        if kind == F_OBJECT:
            if object_byte(p, th, top, b):
                out.append(th)
            return
        if kind == F_CALLS:
            r = calls_byte(p, th, top, b)
            if r == 2:
                continue
            if r:
                out.append(th)
            return
        raise AssertionError(kind)


def push_alt(p, t, node, i, pos):
    if p.oneof[node]:
        if len(t.frames) >= MAX_DEPTH:
            return False
        mk = new_frame(F_ONEOF, node)
        mk[6] = i
        mk[5] = pos
        t.frames.append(mk)
    if p.alt_mark[node] == i:
        # this alternative's value counts for the enclosing array's contains
        if len(t.frames) >= MAX_DEPTH:
            return False
        t.frames.append(new_frame(F_MARK, node))
    if len(t.frames) >= MAX_DEPTH:
        return False
    t.frames.append(new_frame(F_VALUE, p.alt_pool[p.alt_off[node] + i]))
    return True


def start_value(p, th, top, node, b, pos):
    """Turn a VALUE frame into the frame its first byte starts (top is replaced in place)."""
    types = p.types[node]
    if b == ord('"'):
        if not types & T_STR:
            return False
        top[:] = new_frame(F_STRING, node)
        top[4] = p.str_dfa[node] if p.str_dfa[node] >= 0 else -1
        top[5] = pos
        top[8] = FNV_OFFSET
        return True
    if b == ord("-") or ord("0") <= b <= ord("9"):
        if not types & (T_INT | T_NUM):
            return False
        top[:] = new_frame(F_NUMBER, node, N_START)
        top[4] = p.num_dfa[node]
        th.num = bytearray()
        return True
    if b == ord("t") or b == ord("f") or b == ord("n"):
        bit = {ord("t"): T_TRUE, ord("f"): T_FALSE, ord("n"): T_NULL}[b]
        if not types & bit:
            return False
        top[:] = new_frame(F_LITERAL, node)
        top[6] = {ord("t"): 0, ord("f"): 1, ord("n"): 2}[b]
        top[3] = 1
        return True
    if b == ord("["):
        if not types & T_ARR:
            return False
        top[:] = new_frame(F_ARRAY, node, A_START)
        top[5] = len(th.aux)
        return True
    if b == ord("{"):
        if not types & T_OBJ:
            return False
        nw = p.obj_nwords[node]
        if len(th.aux) + nw > MAX_AUX:
            return False
        top[:] = new_frame(F_OBJECT, node, O_START)
        top[5] = len(th.aux)
        th.aux.extend([0] * nw)
        return True
    return False


def complete_value(p, th, h):
    """A value just ended (its frame is popped): pop oneOf and contains markers, tell the
    container."""
    fr = th.frames
    marked = False
    while fr and (fr[-1][0] == F_ONEOF or fr[-1][0] == F_MARK):
        mk = fr.pop()
        if mk[0] == F_MARK:
            marked = True
            continue
        if len(th.events) >= MAX_EVENTS:
            return False
        th.events.append((mk[1], mk[6], mk[5], len(fr)))
    th.last_hash = h
    if not fr:
        return True
    parent = fr[-1]
    kind = parent[0]
    if kind == F_ARRAY:
        node = parent[1]
        if marked:
            # the count of items matching contains (frame field y), saturated where more
            # changes nothing, so that threads of equal counts merge
            hi = p.arr_cmax[node]
            if hi >= 0 and parent[7] >= hi:
                return False
            if parent[7] < (hi + 1 if hi >= 0 else p.arr_cmin[node]):
                parent[7] += 1
        if p.arr_unique[node]:
            if h in th.aux[parent[5]:]:
                return False
            if len(th.aux) >= MAX_AUX:
                return False
            th.aux.append(h)
        parent[3] += 1
        parent[8] = seq_combine(parent[8], h)
        return True
    if kind == F_OBJECT:
        parent[3] += 1
        parent[2] = O_AFTER
        parent[8] = (parent[8] + member_hash(parent[9], h)) & M64
        return True
    if kind == F_CALLS:
        parent[2] = C_CLOSE
        return True
    raise AssertionError(kind)


# ---------------------------------------------------------------- strings

def is_number_byte(b):
    return (ord("0") <= b <= ord("9")) or b in (ord("-"), ord("+"), ord("."), ord("e"), ord("E"))


def dfa_step(p, state, b):
    if state < 0:
        return state
    return p.trans_py[state * 256 + b]


def key_live(p, th, obj, state):
    """A key DFA state is live when it can still reach an unused declared or another valid key."""
    if state < 0:
        return False
    if p.other[state]:
        return True
    off = p.reach_off[state]
    nw = p.obj_nwords[obj[1]]
    base = obj[5]
    for w in range(nw):
        if p.words[off + w] & ~th.aux[base + w]:
            return True
    return False


def emit_byte(p, th, top, b):
    """One decoded byte of string content: DFA step and hash."""
    if top[4] >= 0:
        st = p.trans_py[top[4] * 256 + b]
        if st < 0:
            return False
        if top[0] == F_KEY and not key_live(p, th, th.frames[-2], st):
            return False
        top[4] = st
    elif top[0] == F_KEY:
        return False
    top[8] = fnv(top[8], b)
    return True


def count_cp(p, top):
    top[3] += 1
    if top[0] == F_STRING:
        mx = p.str_max[top[1]]
        if mx >= 0 and top[3] > mx:
            return False
    return True


def emit_cp(p, th, top, cp):
    if not count_cp(p, top):
        return False
    for b in utf8_bytes(cp):
        if not emit_byte(p, th, top, b):
            return False
    return True


def seq_live(p, th, top, a, b):
    """Some byte string in the product of ranges a[i]..b[i] steps the string's DFA from its
    current state through live states only (keys: live with the object's seen properties)."""
    states = {top[4]}
    key = top[0] == F_KEY
    for lo, hi in zip(a, b):
        nxt = set()
        for s in states:
            base = s * 256
            for c in range(lo, hi + 1):
                t = p.trans_py[base + c]
                if t >= 0 and t not in nxt and (not key or key_live(p, th, th.frames[-2], t)):
                    nxt.add(t)
        if not nxt:
            return False
        states = nxt
    return True


def cp_range_live(p, th, top, lo, hi):
    """Some scalar value in [lo, hi] (surrogates excluded) can be emitted from here."""
    if lo > hi:
        return False
    if lo <= 0xDFFF and hi >= 0xD800:
        return cp_range_live(p, th, top, lo, 0xD7FF) or cp_range_live(p, th, top, 0xE000, hi)
    if top[4] < 0:
        return top[0] != F_KEY
    for bound in (0x7F, 0x7FF, 0xFFFF):
        if lo <= bound < hi:
            return cp_range_live(p, th, top, lo, bound) or cp_range_live(p, th, top, bound + 1, hi)
    ea = utf8_bytes(lo)
    n = len(ea)
    for i in range(1, n):
        m = (1 << (6 * i)) - 1
        if (lo & ~m) != (hi & ~m):
            if lo & m:
                return cp_range_live(p, th, top, lo, lo | m) or cp_range_live(p, th, top, (lo | m) + 1, hi)
            if (hi & m) != m:
                return cp_range_live(p, th, top, lo, (hi & ~m) - 1) or cp_range_live(p, th, top, hi & ~m, hi)
    return seq_live(p, th, top, ea, utf8_bytes(hi))


def hex_prefix_live(p, th, top, x, v):
    """After the hex digits read so far (x: the state having just read one; v: their value),
    some completion of the \\u escape (with a low surrogate where needed) is emittable."""
    k = x - 10 if x <= 14 else x - 21
    shift = 4 * (4 - k)
    lo = v << shift
    hi = lo + (1 << shift) - 1
    if x <= 14:
        if cp_range_live(p, th, top, lo, hi):
            return True
        hl, hh = max(lo, 0xD800), min(hi, 0xDBFF)
        if hl > hh:
            return False
        return cp_range_live(p, th, top, 0x10000 + ((hl - 0xD800) << 10), 0x10000 + ((hh - 0xD800) << 10) + 0x3FF)
    ll, lh = max(lo, 0xDC00), min(hi, 0xDFFF)
    if ll > lh:
        return False
    base = 0x10000 + ((top[9] - 0xD800) << 10)
    return cp_range_live(p, th, top, base + ll - 0xDC00, base + lh - 0xDC00)


ESCAPES = {ord('"'): 0x22, ord("\\"): 0x5C, ord("/"): 0x2F, ord("b"): 8, ord("f"): 12, ord("n"): 10,
           ord("r"): 13, ord("t"): 9}
# x (escape/UTF-8 state): 0 clean; 1..3 continuation bytes left; 10 after '\'; 11..14 \u hex
# digits read so far 0..3; 20 expecting '\' of a low surrogate; 21 expecting 'u'; 22..25 low hex
# y: for UTF-8, the allowed range code of the next continuation byte; for \u, the accumulator
CONT_RANGES = ((0x80, 0xBF), (0xA0, 0xBF), (0x80, 0x9F), (0x90, 0xBF), (0x80, 0x8F))


def hexval(b):
    if ord("0") <= b <= ord("9"):
        return b - 48
    if ord("a") <= b <= ord("f"):
        return b - 87
    if ord("A") <= b <= ord("F"):
        return b - 55
    return -1


def string_byte(p, th, top, b):
    if b == EOF:
        return False
    x = top[6]
    if x == 0:
        if b == ord('"'):
            return string_end(p, th, top)
        if b == ord("\\"):
            if top[0] == F_STRING:
                mx = p.str_max[top[1]]
                if mx >= 0 and top[3] >= mx:
                    return False
            if top[4] >= 0 and not cp_range_live(p, th, top, 0, 0x10FFFF):
                return False
            top[6] = 10
            return True
        if b < 0x20:
            return False
        if b < 0x80:
            return count_cp(p, top) and emit_byte(p, th, top, b)
        if 0xC2 <= b <= 0xDF:
            n, r = 1, 0
        elif b == 0xE0:
            n, r = 2, 1
        elif 0xE1 <= b <= 0xEC or b in (0xEE, 0xEF):
            n, r = 2, 0
        elif b == 0xED:
            n, r = 2, 2
        elif b == 0xF0:
            n, r = 3, 3
        elif 0xF1 <= b <= 0xF3:
            n, r = 3, 0
        elif b == 0xF4:
            n, r = 3, 4
        else:
            return False
        if not count_cp(p, top) or not emit_byte(p, th, top, b):
            return False
        top[6] = n
        top[7] = r
        return True
    if 1 <= x <= 3:
        lo, hi = CONT_RANGES[top[7]]
        if not lo <= b <= hi:
            return False
        if not emit_byte(p, th, top, b):
            return False
        top[6] = x - 1
        top[7] = 0
        return True
    if x == 10:
        if b == ord("u"):
            top[6] = 11
            top[7] = 0
            return True
        if b in ESCAPES:
            top[6] = 0
            return emit_cp(p, th, top, ESCAPES[b])
        return False
    if 11 <= x <= 14 or 22 <= x <= 25:
        v = hexval(b)
        if v < 0:
            return False
        top[7] = top[7] * 16 + v
        if not hex_prefix_live(p, th, top, x, top[7]):
            return False
        if x != 14 and x != 25:
            top[6] = x + 1
            return True
        cp = top[7]
        if x == 14:
            if 0xDC00 <= cp <= 0xDFFF:
                return False
            if 0xD800 <= cp <= 0xDBFF:
                top[9] = cp
                top[6] = 20
                return True
            top[6] = 0
            return emit_cp(p, th, top, cp)
        # low surrogate
        if not 0xDC00 <= cp <= 0xDFFF:
            return False
        full = 0x10000 + ((top[9] - 0xD800) << 10) + (cp - 0xDC00)
        top[6] = 0
        return emit_cp(p, th, top, full)
    if x == 20:
        if b != ord("\\"):
            return False
        top[6] = 21
        return True
    if x == 21:
        if b != ord("u"):
            return False
        top[6] = 22
        top[7] = 0
        return True
    return False


def string_end(p, th, top):
    node = top[1]
    if top[0] == F_STRING:
        if top[3] < p.str_min[node]:
            return False
        if top[4] >= 0 and p.accept[top[4]] < 0:
            return False
        th.frames.pop()
        return complete_value(p, th, fmix(top[8] ^ TAG_STR))
    # key
    obj = th.frames[-2]
    st = top[4]
    if st < 0:
        return False
    cls = p.accept[st]
    if cls < 0:
        return False
    kh = fmix(top[8] ^ TAG_STR)
    prop = p.cls_prop[cls]
    base = obj[5]
    if prop >= 0:
        w = base + prop // 64
        bit = 1 << (prop % 64)
        if th.aux[w] & bit:
            return False
        th.aux[w] |= bit
    else:
        nw = p.obj_nwords[obj[1]]
        if kh in th.aux[base + nw:]:
            return False
        if len(th.aux) >= MAX_AUX:
            return False
        th.aux.append(kh)
    th.frames.pop()
    obj[2] = O_COLON
    obj[6] = p.cls_node[cls]
    obj[9] = kh
    return True


# ---------------------------------------------------------------- numbers

def number_byte(p, th, top, b):
    ph = top[2]
    integer_only = not (p.types[top[1]] & T_NUM)
    d = ord("0") <= b <= ord("9")
    if ph == N_START:
        if b == ord("-"):
            nph = N_MINUS
        elif b == ord("0"):
            nph = N_ZERO
        elif d:
            nph = N_INT
        else:
            return False
    elif ph == N_MINUS:
        if b == ord("0"):
            nph = N_ZERO
        elif d:
            nph = N_INT
        else:
            return False
    elif ph == N_ZERO or ph == N_INT:
        if ph == N_INT and d:
            nph = N_INT
        elif b == ord(".") and not integer_only:
            nph = N_DOT
        elif b in (ord("e"), ord("E")) and not integer_only:
            nph = N_EXP
        else:
            return False
    elif ph == N_DOT or ph == N_FRAC:
        if d:
            nph = N_FRAC
        elif ph == N_FRAC and b in (ord("e"), ord("E")):
            nph = N_EXP
        else:
            return False
    elif ph == N_EXP:
        if b in (ord("+"), ord("-")):
            nph = N_EXPSIGN
        elif d:
            nph = N_EXPDIG
        else:
            return False
    elif ph == N_EXPSIGN or ph == N_EXPDIG:
        if d:
            nph = N_EXPDIG
        else:
            return False
    else:
        return False
    if len(th.num) >= NUM_BUF:
        return False
    if top[4] >= 0:
        st = p.trans_py[top[4] * 256 + b]
        if st < 0:
            return False
        top[4] = st
    th.num.append(b)
    top[2] = nph
    if nph == N_EXPDIG and number_too_large(bytes(th.num)):
        return False
    if top[4] < 0:   # (an enum's automaton already bounds its numbers)
        node = top[1]
        check = p.num_checks[p.num_check[node]] if p.num_check[node] >= 0 else None
        if not number_live(check, bytes(th.num), nph, integer_only):
            return False
    return True


def number_end(p, th, top):
    """Hash of the finished number, or None when it is incomplete or out of constraints."""
    if top[2] not in (N_ZERO, N_INT, N_FRAC, N_EXPDIG):
        return None
    if top[4] >= 0 and p.accept[top[4]] < 0:
        return None
    text = th.num.decode()
    node = top[1]
    if p.num_check[node] >= 0 and not number_check(p.num_checks[p.num_check[node]], text):
        return None
    return number_hash(text)


# ---------------------------------------------------------------- objects

def object_byte(p, th, top, b):
    node = top[1]
    ph = top[2]
    fr = th.frames
    if ph == O_START or ph == O_NEXT:
        if b == ord('"'):
            mx = p.obj_max[node]
            if mx >= 0 and top[3] >= mx:
                return False
            st = p.obj_key_dfa[node]
            if not key_live(p, th, top, st):
                return False
            if len(fr) >= MAX_DEPTH:
                return False
            k = new_frame(F_KEY, node)
            k[4] = st
            k[8] = FNV_OFFSET
            fr.append(k)
            return True
        if ph == O_START and b == ord("}"):
            return object_close(p, th, top)
        return False
    if ph == O_COLON:
        if b != ord(":"):
            return False
        if len(fr) >= MAX_DEPTH:
            return False
        top[2] = O_VALUE
        fr.append(new_frame(F_VALUE, top[6]))
        return True
    if ph == O_AFTER:
        if b == ord(","):
            mx = p.obj_max[node]
            if mx >= 0 and top[3] >= mx:
                return False
            if not key_live(p, th, top, p.obj_key_dfa[node]):
                return False
            top[2] = O_NEXT
            return True
        if b == ord("}"):
            return object_close(p, th, top)
        return False
    return False


def object_close(p, th, top):
    node = top[1]
    if top[3] < p.obj_min[node]:
        return False
    base = top[5]
    roff = p.obj_req_off[node]
    nw = p.obj_nwords[node]
    for w in range(nw):
        if p.words[roff + w] & ~th.aux[base + w]:
            return False
    for d in range(p.obj_dep_n[node]):
        prop = p.dep_pool[2 * (p.obj_dep_off[node] + d)]
        doff = p.dep_pool[2 * (p.obj_dep_off[node] + d) + 1]
        if (th.aux[base + prop // 64] >> (prop % 64)) & 1:
            for w in range(nw):
                if p.words[doff + w] & ~th.aux[base + w]:
                    return False
    th.frames.pop()
    del th.aux[base:]
    return complete_value(p, th, fmix(top[8] ^ TAG_OBJ))


# ---------------------------------------------------------------- tool calls

def calls_byte(p, th, top, b):
    """The outer call list.  Returns 1 (consumed), 0 (dead) or 2 (retry after push)."""
    ph = top[2]
    if b == EOF:
        return 0
    if ph == C_OPEN:
        if b != ord("["):
            return 0
        top[2] = C_FIRST
        return 1
    if ph == C_FIRST or ph == C_NEXT:
        if ph == C_FIRST and b == ord("]"):
            th.frames.pop()
            return 1
        if b != ord("{") or top[3] >= p.max_calls or not tools_left(p, top):
            return 0
        top[2] = C_HEAD
        top[6] = 1
        return 1
    if ph == C_HEAD:
        if b != CALL_HEAD[top[6]]:
            return 0
        top[6] += 1
        if top[6] == len(CALL_HEAD):
            top[2] = C_NAME
            top[4] = p.tool_dfa
        return 1
    if ph == C_NAME:
        if b == ord('"'):
            lab = p.accept[top[4]]
            if lab < 0 or (top[8] >> lab) & 1:
                return 0
            top[8] |= 1 << lab
            top[7] = lab
            top[2] = C_MID
            top[6] = 1
            return 1
        st = p.trans_py[top[4] * 256 + b]
        if st < 0 or not (p.words[p.reach_off[st]] & ~top[8]):
            return 0
        top[4] = st
        return 1
    if ph == C_MID:
        if b != CALL_MID[top[6]]:
            return 0
        top[6] += 1
        if top[6] == len(CALL_MID):
            if len(th.frames) >= MAX_DEPTH:
                return 0
            top[2] = C_ARGS
            th.frames.append(new_frame(F_VALUE, p.tool_nodes[top[7]]))
        return 1
    if ph == C_CLOSE:
        if b != ord("}"):
            return 0
        top[3] += 1
        top[2] = C_AFTER
        return 1
    if ph == C_AFTER:
        if b == ord("]"):
            th.frames.pop()
            return 1
        if b == ord(",") and top[3] < p.max_calls and tools_left(p, top):
            top[2] = C_NEXT
            return 1
        return 0
    return 0


def tools_left(p, top):
    return bool(p.words[p.reach_off[p.tool_dfa]] & ~top[8])


# ---------------------------------------------------------------- whole tokens

class ReferenceGrammar:
    """Token-level helpers by brute force (every piece fed through a clone)."""

    def __init__(self, program):
        self.program = program

    def start(self):
        return ReferenceState(self.program)

    def _own(self, state, what):
        if not isinstance(state, ReferenceState):
            raise GrammarStateError(f"{what}: expected a State started by this grammar, "
                                    f"found {type(state).__name__}")
        if state.p is not self.program:
            raise GrammarStateError(f"{what}: the state was started by another grammar; "
                                    "a state belongs to the grammar whose start() made it")

    def allowed_tokens(self, state, piece_table):
        self._own(state, "allowed_tokens")
        mask = np.zeros(len(piece_table), dtype=np.bool_)
        for i, piece in enumerate(piece_table):
            if not piece:
                continue
            s = state.clone()
            mask[i] = s.feed(piece)
        return mask

    def best_allowed(self, state, logits, piece_table, close_string=False):
        self._own(state, "best_allowed")
        order = np.argsort(-np.asarray(logits, dtype=np.float64), kind="stable")
        for i in order:
            i = int(i)
            if i >= len(piece_table):
                continue
            piece = piece_table[i]
            if not piece:
                continue
            s = state.clone()
            if not s.feed(piece):
                continue
            if close_string and not closes_string(state, s):
                continue
            return i, s
        return -1, state


def closes_string(before, after):
    """Whether feeding moved out of the string value the state was in."""
    start = before.string_start()
    if start < 0:
        return False
    for th in after.threads:
        if th.frames and th.frames[-1][0] == F_STRING and th.frames[-1][5] == start:
            return False
    return True
