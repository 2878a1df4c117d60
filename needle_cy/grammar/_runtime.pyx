# cython: language_level=3
"""Grammar runtime in C: feed bytes to a state, clone it, and choose whole tokens.

The compiled program comes from ``needle_cy.grammar`` (``builder``/``tools``:
schema -> nodes, DFAs, exact decimals; ``program``: the tables read here).  This
module walks it byte by byte; its pure-Python twin ``needle_cy.reference.grammar``
has a function of the same name for each one here and is what tests compare against.

Token level: a vocabulary (the tokenizer's ``piece_table``) is turned once into
a byte trie (``PieceTable``).  ``allowed_tokens`` walks the trie from a state,
cloning the state at each branch so shared prefixes are fed once;
``best_allowed`` first tries the arg-max token alone (it is nearly always valid
when a trained model is decoding) and otherwise walks the trie keeping the
best-scoring valid token.  Inside an unconstrained string the tokens made only
of plain string characters are valid whatever the context, so they are taken
from a precomputed list and only the other tokens are walked.
"""
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t
from libc.string cimport memcmp, memcpy, memmove, memset

import numpy as np

from ..errors import GrammarStateError

cimport numpy as cnp

cnp.import_array()

cdef extern from "csrc/mulmod.h":
    unsigned long long ng_mulmod(unsigned long long a, unsigned long long b, unsigned long long m) nogil

# frame kinds and phases (needle_cy.grammar.limits holds the same numbers for Python; a test compares them)
cdef enum:
    F_VALUE = 0
    F_STRING = 1
    F_KEY = 2
    F_NUMBER = 3
    F_LITERAL = 4
    F_ARRAY = 5
    F_OBJECT = 6
    F_ONEOF = 7
    F_CALLS = 8
    F_MARK = 9

cdef enum:
    A_START = 0
    A_ITEM = 1
    A_NEXT = 2

cdef enum:
    O_START = 0
    O_COLON = 1
    O_VALUE = 2
    O_AFTER = 3
    O_NEXT = 4

cdef enum:
    C_OPEN = 0
    C_FIRST = 1
    C_HEAD = 2
    C_NAME = 3
    C_MID = 4
    C_ARGS = 5
    C_CLOSE = 6
    C_AFTER = 7
    C_NEXT = 8

cdef enum:
    N_START = 0
    N_MINUS = 1
    N_ZERO = 2
    N_INT = 3
    N_DOT = 4
    N_FRAC = 5
    N_EXP = 6
    N_EXPSIGN = 7
    N_EXPDIG = 8

cdef enum:
    T_NULL = 1
    T_TRUE = 2
    T_FALSE = 4
    T_INT = 8
    T_NUM = 16
    T_STR = 32
    T_ARR = 64
    T_OBJ = 128

cdef enum:
    NODE_CHOICE = 1
    NEVER_NODE = 1
    EOF_BYTE = 256

cdef uint64_t FNV_OFFSET = 0xCBF29CE484222325ULL
cdef uint64_t FNV_PRIME = 0x100000001B3ULL
cdef uint64_t TAG_STR = 0x51
cdef uint64_t TAG_NUM = 0x52
cdef uint64_t TAG_ARR = 0x53
cdef uint64_t TAG_OBJ = 0x54

cdef int MAX_PIECE = 500   # bytes of one piece in the trie; the walk's per-depth arrays hold 512
cdef const char* LIT_TRUE = b"true"
cdef const char* LIT_FALSE = b"false"
cdef const char* LIT_NULL = b"null"
cdef const char* CALL_HEAD = b'{"name":"'
cdef const char* CALL_MID = b'","arguments":'
cdef int CALL_HEAD_LEN = 9
cdef int CALL_MID_LEN = 14


# ----------------------------------------------------------------------------- hashing

cdef inline uint64_t fmix(uint64_t k) noexcept nogil:
    k ^= k >> 33
    k *= 0xFF51AFD7ED558CCDULL
    k ^= k >> 33
    k *= 0xC4CEB9FE1A85EC53ULL
    k ^= k >> 33
    return k


cdef inline uint64_t fnv(uint64_t h, int b) noexcept nogil:
    return (h ^ <uint64_t>b) * FNV_PRIME


cdef inline uint64_t seq_combine(uint64_t h, uint64_t x) noexcept nogil:
    return fmix(h * 31 + x + 0x9E3779B97F4A7C15ULL)


cdef inline uint64_t member_hash(uint64_t kh, uint64_t vh) noexcept nogil:
    return fmix((kh * 0x9E3779B97F4A7C15ULL) ^ vh)


# ----------------------------------------------------------------------------- helpers

cdef inline int start_bit(int b) noexcept nogil:
    if b == 0x22:
        return 1
    if b == 0x2D or (b >= 0x30 and b <= 0x39):
        return 2
    if b == 0x74:
        return 4
    if b == 0x66:
        return 8
    if b == 0x6E:
        return 16
    if b == 0x5B:
        return 32
    if b == 0x7B:
        return 64
    return 0


cdef inline void set_frame(Frame* f, int kind, int node, int phase) noexcept nogil:
    f.kind = kind
    f.node = node
    f.phase = phase
    f.count = 0
    f.dfa = -1
    f.aux = 0
    f.x = 0
    f.y = 0
    f.h = 0
    f.k = 0


cdef inline void copy_thread(Thread* dst, const Thread* src) noexcept nogil:
    dst.depth = src.depth
    dst.aux_top = src.aux_top
    dst.num_len = src.num_len
    dst.n_events = src.n_events
    dst.last_hash = src.last_hash
    if src.n_events:
        memcpy(dst.events, src.events, src.n_events * 4 * sizeof(int32_t))
    if src.num_len:
        memcpy(dst.num, src.num, src.num_len)
    memcpy(dst.frames, src.frames, src.depth * sizeof(Frame))
    if src.aux_top:
        memcpy(dst.aux, src.aux, src.aux_top * sizeof(uint64_t))


cdef void copy_state(StateData* dst, const StateData* src) noexcept nogil:
    cdef int i
    dst.n_threads = src.n_threads
    dst.pos = src.pos
    for i in range(src.n_threads):
        copy_thread(&dst.threads[i], &src.threads[i])


cdef inline bint same_thread(const Thread* a, const Thread* b) noexcept nogil:
    if a.depth != b.depth or a.aux_top != b.aux_top or a.num_len != b.num_len:
        return False
    if memcmp(a.frames, b.frames, a.depth * sizeof(Frame)) != 0:
        return False
    if a.aux_top and memcmp(a.aux, b.aux, a.aux_top * sizeof(uint64_t)) != 0:
        return False
    if a.num_len and memcmp(a.num, b.num, a.num_len) != 0:
        return False
    return True


cdef inline int item_node(const Prog* p, int node, int index) noexcept nogil:
    if index < p.arr_prefix_n[node]:
        return p.prefix_pool[p.arr_prefix_off[node] + index]
    return p.arr_items[node]


cdef inline bint key_live(const Prog* p, const Thread* th, const Frame* obj, int state) noexcept nogil:
    cdef int w, nw, off, base
    if state < 0:
        return False
    if p.other[state]:
        return True
    off = p.reach_off[state]
    nw = p.obj_nwords[obj.node]
    base = obj.aux
    for w in range(nw):
        if p.words[off + w] & ~th.aux[base + w]:
            return True
    return False


# ----------------------------------------------------------------------------- values

cdef bint complete_value(const Prog* p, Thread* th, uint64_t h) noexcept nogil:
    """A value just ended (its frame is popped): pop oneOf and contains markers, tell the
    container."""
    cdef Frame* mk
    cdef Frame* parent
    cdef int i, e, hi
    cdef bint marked = False
    while th.depth > 0 and (th.frames[th.depth - 1].kind == F_ONEOF or th.frames[th.depth - 1].kind == F_MARK):
        mk = &th.frames[th.depth - 1]
        th.depth -= 1
        if mk.kind == F_MARK:
            marked = True
            continue
        if th.n_events >= MAX_EVENTS:
            return False
        e = th.n_events * 4
        th.events[e] = mk.node
        th.events[e + 1] = mk.x
        th.events[e + 2] = mk.aux
        th.events[e + 3] = th.depth
        th.n_events += 1
    th.last_hash = h
    if th.depth == 0:
        return True
    parent = &th.frames[th.depth - 1]
    if parent.kind == F_ARRAY:
        if marked:
            # the count of items matching contains, saturated where more changes nothing
            # (threads of equal counts merge)
            hi = p.arr_cmax[parent.node]
            if hi >= 0 and parent.y >= hi:
                return False
            if parent.y < (hi + 1 if hi >= 0 else p.arr_cmin[parent.node]):
                parent.y += 1
        if p.arr_unique[parent.node]:
            for i in range(parent.aux, th.aux_top):
                if th.aux[i] == h:
                    return False
            if th.aux_top >= MAX_AUX:
                return False
            th.aux[th.aux_top] = h
            th.aux_top += 1
        parent.count += 1
        parent.h = seq_combine(parent.h, h)
        return True
    if parent.kind == F_OBJECT:
        parent.count += 1
        parent.phase = O_AFTER
        parent.h = parent.h + member_hash(parent.k, h)
        return True
    if parent.kind == F_CALLS:
        parent.phase = C_CLOSE
        return True
    return False


cdef bint start_value(const Prog* p, Thread* th, Frame* top, int node, int b, int64_t pos) noexcept nogil:
    cdef int types = p.types[node]
    cdef int nw
    if b == 0x22:
        if not types & T_STR:
            return False
        set_frame(top, F_STRING, node, 0)
        top.dfa = p.str_dfa[node]
        top.aux = <int32_t>pos
        top.h = FNV_OFFSET
        return True
    if b == 0x2D or (b >= 0x30 and b <= 0x39):
        if not types & (T_INT | T_NUM):
            return False
        set_frame(top, F_NUMBER, node, N_START)
        top.dfa = p.num_dfa[node]
        th.num_len = 0
        return True
    if b == 0x74 or b == 0x66 or b == 0x6E:
        if b == 0x74:
            if not types & T_TRUE:
                return False
            set_frame(top, F_LITERAL, node, 0)
            top.x = 0
        elif b == 0x66:
            if not types & T_FALSE:
                return False
            set_frame(top, F_LITERAL, node, 0)
            top.x = 1
        else:
            if not types & T_NULL:
                return False
            set_frame(top, F_LITERAL, node, 0)
            top.x = 2
        top.count = 1
        return True
    if b == 0x5B:
        if not types & T_ARR:
            return False
        set_frame(top, F_ARRAY, node, A_START)
        top.aux = th.aux_top
        return True
    if b == 0x7B:
        if not types & T_OBJ:
            return False
        nw = p.obj_nwords[node]
        if th.aux_top + nw > MAX_AUX:
            return False
        set_frame(top, F_OBJECT, node, O_START)
        top.aux = th.aux_top
        memset(&th.aux[th.aux_top], 0, nw * sizeof(uint64_t))
        th.aux_top += nw
        return True
    return False


# ----------------------------------------------------------------------------- strings

cdef inline int hexval(int b) noexcept nogil:
    if b >= 0x30 and b <= 0x39:
        return b - 48
    if b >= 0x61 and b <= 0x66:
        return b - 87
    if b >= 0x41 and b <= 0x46:
        return b - 55
    return -1


cdef inline int dfa_next(const Prog* p, int st, int b) noexcept nogil:
    """Automaton state after byte b from state st (>= 0), -1 when b is refused: row st of
    the [states x byte classes] table, at the column of b's class."""
    return p.class_trans[st * p.n_classes + p.byte_class[b]]


cdef inline bint emit_byte(const Prog* p, Thread* th, Frame* top, int b) noexcept nogil:
    """One decoded byte of string content: DFA step and hash."""
    cdef int st
    if top.dfa >= 0:
        st = dfa_next(p, top.dfa, b)
        if st < 0:
            return False
        if top.kind == F_KEY and not key_live(p, th, &th.frames[th.depth - 2], st):
            return False
        top.dfa = st
    elif top.kind == F_KEY:
        return False
    top.h = fnv(top.h, b)
    return True


cdef inline bint count_cp(const Prog* p, Frame* top) noexcept nogil:
    cdef int mx
    top.count += 1
    if top.kind == F_STRING:
        mx = p.str_max[top.node]
        if mx >= 0 and top.count > mx:
            return False
    return True


cdef bint emit_cp(const Prog* p, Thread* th, Frame* top, int cp) noexcept nogil:
    if not count_cp(p, top):
        return False
    if cp < 0x80:
        return emit_byte(p, th, top, cp)
    if cp < 0x800:
        return emit_byte(p, th, top, 0xC0 | (cp >> 6)) and emit_byte(p, th, top, 0x80 | (cp & 0x3F))
    if cp < 0x10000:
        return (emit_byte(p, th, top, 0xE0 | (cp >> 12)) and emit_byte(p, th, top, 0x80 | ((cp >> 6) & 0x3F))
                and emit_byte(p, th, top, 0x80 | (cp & 0x3F)))
    return (emit_byte(p, th, top, 0xF0 | (cp >> 18)) and emit_byte(p, th, top, 0x80 | ((cp >> 12) & 0x3F))
            and emit_byte(p, th, top, 0x80 | ((cp >> 6) & 0x3F)) and emit_byte(p, th, top, 0x80 | (cp & 0x3F)))


cdef inline int escape_cp(int b) noexcept nogil:
    if b == 0x22:
        return 0x22
    if b == 0x5C:
        return 0x5C
    if b == 0x2F:
        return 0x2F
    if b == 0x62:
        return 8
    if b == 0x66:
        return 12
    if b == 0x6E:
        return 10
    if b == 0x72:
        return 13
    if b == 0x74:
        return 9
    return -1


cdef bint seq_live(const Prog* p, Thread* th, Frame* top, int st, const int* a, const int* b, int n,
                   int pos) noexcept nogil:
    """Some byte string in the product of ranges a[i]..b[i] (from pos) steps the DFA from st
    through live states only (keys: live with the object's seen properties)."""
    cdef int c, t
    if pos == n:
        return True
    for c in range(a[pos], b[pos] + 1):
        t = dfa_next(p, st, c)
        if t < 0:
            continue
        if top.kind == F_KEY and not key_live(p, th, &th.frames[th.depth - 2], t):
            continue
        if seq_live(p, th, top, t, a, b, n, pos + 1):
            return True
    return False


cdef inline int utf8_encode(int cp, int* out) noexcept nogil:
    if cp < 0x80:
        out[0] = cp
        return 1
    if cp < 0x800:
        out[0] = 0xC0 | (cp >> 6)
        out[1] = 0x80 | (cp & 0x3F)
        return 2
    if cp < 0x10000:
        out[0] = 0xE0 | (cp >> 12)
        out[1] = 0x80 | ((cp >> 6) & 0x3F)
        out[2] = 0x80 | (cp & 0x3F)
        return 3
    out[0] = 0xF0 | (cp >> 18)
    out[1] = 0x80 | ((cp >> 12) & 0x3F)
    out[2] = 0x80 | ((cp >> 6) & 0x3F)
    out[3] = 0x80 | (cp & 0x3F)
    return 4


cdef bint cp_range_live(const Prog* p, Thread* th, Frame* top, int lo, int hi) noexcept nogil:
    """Some scalar value in [lo, hi] (surrogates excluded) can be emitted from here."""
    cdef int ea[4]
    cdef int eb[4]
    cdef int n, i, m
    if lo > hi:
        return False
    if lo <= 0xDFFF and hi >= 0xD800:
        return cp_range_live(p, th, top, lo, 0xD7FF) or cp_range_live(p, th, top, 0xE000, hi)
    if top.dfa < 0:
        return top.kind != F_KEY
    if lo <= 0x7F and 0x7F < hi:
        return cp_range_live(p, th, top, lo, 0x7F) or cp_range_live(p, th, top, 0x80, hi)
    if lo <= 0x7FF and 0x7FF < hi:
        return cp_range_live(p, th, top, lo, 0x7FF) or cp_range_live(p, th, top, 0x800, hi)
    if lo <= 0xFFFF and 0xFFFF < hi:
        return cp_range_live(p, th, top, lo, 0xFFFF) or cp_range_live(p, th, top, 0x10000, hi)
    n = utf8_encode(lo, ea)
    for i in range(1, n):
        m = (1 << (6 * i)) - 1
        if (lo & ~m) != (hi & ~m):
            if lo & m:
                return cp_range_live(p, th, top, lo, lo | m) or cp_range_live(p, th, top, (lo | m) + 1, hi)
            if (hi & m) != m:
                return cp_range_live(p, th, top, lo, (hi & ~m) - 1) or cp_range_live(p, th, top, hi & ~m, hi)
    utf8_encode(hi, eb)
    return seq_live(p, th, top, top.dfa, ea, eb, n, 0)


cdef bint hex_prefix_live(const Prog* p, Thread* th, Frame* top, int x, int v) noexcept nogil:
    """After the hex digits read so far (x: the state before this digit; v: their value), some
    completion of the \\u escape (with a low surrogate where needed) is emittable."""
    cdef int k, shift, lo, hi, hl, hh, base
    k = x - 10 if x <= 14 else x - 21
    shift = 4 * (4 - k)
    lo = v << shift
    hi = lo + (1 << shift) - 1
    if x <= 14:
        if cp_range_live(p, th, top, lo, hi):
            return True
        hl = lo if lo > 0xD800 else 0xD800
        hh = hi if hi < 0xDBFF else 0xDBFF
        if hl > hh:
            return False
        return cp_range_live(p, th, top, 0x10000 + ((hl - 0xD800) << 10), 0x10000 + ((hh - 0xD800) << 10) + 0x3FF)
    hl = lo if lo > 0xDC00 else 0xDC00
    hh = hi if hi < 0xDFFF else 0xDFFF
    if hl > hh:
        return False
    base = 0x10000 + ((<int>top.k - 0xD800) << 10)
    return cp_range_live(p, th, top, base + hl - 0xDC00, base + hh - 0xDC00)


cdef bint string_byte(const Prog* p, Thread* th, Frame* top, int b) noexcept nogil:
    # x: 0 clean; 1..3 continuation bytes left; 10 after '\'; 11..14 \u hex digits; 20 expecting
    # '\' of a low surrogate; 21 expecting 'u'; 22..25 low surrogate hex digits
    cdef int x = top.x
    cdef int n, r, v, cp, lo, hi, mx
    if b == EOF_BYTE:
        return False
    if x == 0:
        if b == 0x22:
            return string_end(p, th, top)
        if b == 0x5C:
            if top.kind == F_STRING:
                mx = p.str_max[top.node]
                if mx >= 0 and top.count >= mx:
                    return False
            if top.dfa >= 0 and not cp_range_live(p, th, top, 0, 0x10FFFF):
                return False
            top.x = 10
            return True
        if b < 0x20:
            return False
        if b < 0x80:
            return count_cp(p, top) and emit_byte(p, th, top, b)
        if b >= 0xC2 and b <= 0xDF:
            n = 1
            r = 0
        elif b == 0xE0:
            n = 2
            r = 1
        elif (b >= 0xE1 and b <= 0xEC) or b == 0xEE or b == 0xEF:
            n = 2
            r = 0
        elif b == 0xED:
            n = 2
            r = 2
        elif b == 0xF0:
            n = 3
            r = 3
        elif b >= 0xF1 and b <= 0xF3:
            n = 3
            r = 0
        elif b == 0xF4:
            n = 3
            r = 4
        else:
            return False
        if not count_cp(p, top) or not emit_byte(p, th, top, b):
            return False
        top.x = n
        top.y = r
        return True
    if x >= 1 and x <= 3:
        r = top.y
        lo = 0x80
        hi = 0xBF
        if r == 1:
            lo = 0xA0
        elif r == 2:
            hi = 0x9F
        elif r == 3:
            lo = 0x90
        elif r == 4:
            hi = 0x8F
        if b < lo or b > hi:
            return False
        if not emit_byte(p, th, top, b):
            return False
        top.x = x - 1
        top.y = 0
        return True
    if x == 10:
        if b == 0x75:
            top.x = 11
            top.y = 0
            return True
        cp = escape_cp(b)
        if cp < 0:
            return False
        top.x = 0
        return emit_cp(p, th, top, cp)
    if (x >= 11 and x <= 14) or (x >= 22 and x <= 25):
        v = hexval(b)
        if v < 0:
            return False
        top.y = top.y * 16 + v
        if not hex_prefix_live(p, th, top, x, top.y):
            return False
        if x != 14 and x != 25:
            top.x = x + 1
            return True
        cp = top.y
        if x == 14:
            if cp >= 0xDC00 and cp <= 0xDFFF:
                return False
            if cp >= 0xD800 and cp <= 0xDBFF:
                top.k = <uint64_t>cp
                top.x = 20
                return True
            top.x = 0
            return emit_cp(p, th, top, cp)
        if cp < 0xDC00 or cp > 0xDFFF:
            return False
        cp = 0x10000 + ((<int>top.k - 0xD800) << 10) + (cp - 0xDC00)
        top.x = 0
        return emit_cp(p, th, top, cp)
    if x == 20:
        if b != 0x5C:
            return False
        top.x = 21
        return True
    if x == 21:
        if b != 0x75:
            return False
        top.x = 22
        top.y = 0
        return True
    return False


cdef bint string_end(const Prog* p, Thread* th, Frame* top) noexcept nogil:
    cdef int node = top.node
    cdef Frame* obj
    cdef int st, cls, prop, base, nw, i, w
    cdef uint64_t kh, bit
    if top.kind == F_STRING:
        if top.count < p.str_min[node]:
            return False
        if top.dfa >= 0 and p.accept[top.dfa] < 0:
            return False
        th.depth -= 1
        return complete_value(p, th, fmix(top.h ^ TAG_STR))
    obj = &th.frames[th.depth - 2]
    st = top.dfa
    if st < 0:
        return False
    cls = p.accept[st]
    if cls < 0:
        return False
    kh = fmix(top.h ^ TAG_STR)
    prop = p.cls_prop[cls]
    base = obj.aux
    if prop >= 0:
        w = base + prop // 64
        bit = (<uint64_t>1) << (prop % 64)
        if th.aux[w] & bit:
            return False
        th.aux[w] |= bit
    else:
        nw = p.obj_nwords[obj.node]
        for i in range(base + nw, th.aux_top):
            if th.aux[i] == kh:
                return False
        if th.aux_top >= MAX_AUX:
            return False
        th.aux[th.aux_top] = kh
        th.aux_top += 1
    th.depth -= 1
    obj.phase = O_COLON
    obj.x = p.cls_node[cls]
    obj.k = kh
    return True


# ----------------------------------------------------------------------------- numbers

cdef inline bint is_number_byte(int b) noexcept nogil:
    return (b >= 0x30 and b <= 0x39) or b == 0x2D or b == 0x2B or b == 0x2E or b == 0x65 or b == 0x45


cdef bint number_byte(const Prog* p, Thread* th, Frame* top, int b) noexcept nogil:
    cdef int ph = top.phase
    cdef bint integer_only = not (p.types[top.node] & T_NUM)
    cdef bint d = b >= 0x30 and b <= 0x39
    cdef int nph, st
    if ph == N_START:
        if b == 0x2D:
            nph = N_MINUS
        elif b == 0x30:
            nph = N_ZERO
        elif d:
            nph = N_INT
        else:
            return False
    elif ph == N_MINUS:
        if b == 0x30:
            nph = N_ZERO
        elif d:
            nph = N_INT
        else:
            return False
    elif ph == N_ZERO or ph == N_INT:
        if ph == N_INT and d:
            nph = N_INT
        elif b == 0x2E and not integer_only:
            nph = N_DOT
        elif (b == 0x65 or b == 0x45) and not integer_only:
            nph = N_EXP
        else:
            return False
    elif ph == N_DOT or ph == N_FRAC:
        if d:
            nph = N_FRAC
        elif ph == N_FRAC and (b == 0x65 or b == 0x45):
            nph = N_EXP
        else:
            return False
    elif ph == N_EXP:
        if b == 0x2B or b == 0x2D:
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
    if th.num_len >= NUM_BUF:
        return False
    if top.dfa >= 0:
        st = dfa_next(p, top.dfa, b)
        if st < 0:
            return False
        top.dfa = st
    th.num[th.num_len] = <uint8_t>b
    th.num_len += 1
    top.phase = nph
    if nph == N_EXPDIG and number_too_large(th.num, th.num_len):
        return False
    # (an enum's automaton already bounds its numbers)
    if top.dfa < 0 and not number_live(p, p.num_check[top.node], th.num, th.num_len, nph, integer_only):
        return False
    return True


cdef struct Dec:
    bint neg
    int nd
    int64_t exp
    uint8_t digits[NUM_BUF]


cdef void parse_dec(const uint8_t* s, int n, Dec* out) noexcept nogil:
    """Normalise number text: value = (-1)**neg * digits * 10**exp, digits without 0s at the ends."""
    cdef int i = 0
    cdef int frac = 0
    cdef bint in_frac = False
    cdef int64_t e = 0
    cdef bint eneg = False
    cdef int c
    out.neg = False
    out.nd = 0
    if i < n and s[i] == 0x2D:
        out.neg = True
        i += 1
    while i < n:
        c = s[i]
        if c == 0x2E:
            in_frac = True
        elif c == 0x65 or c == 0x45:
            i += 1
            break
        else:
            if in_frac:
                frac += 1
            if not (out.nd == 0 and c == 0x30):
                out.digits[out.nd] = <uint8_t>c
                out.nd += 1
        i += 1
    if i < n and (s[i] == 0x2B or s[i] == 0x2D):
        eneg = s[i] == 0x2D
        i += 1
    while i < n:
        if e < 100000000:
            e = e * 10 + (s[i] - 0x30)
        i += 1
    if eneg:
        e = -e
    e -= frac
    while out.nd > 0 and out.digits[out.nd - 1] == 0x30:
        out.nd -= 1
        e += 1
    if out.nd == 0:
        out.neg = False
        e = 0
    out.exp = e


cdef bint number_too_large(const uint8_t* s, int n) noexcept nogil:
    """Is the magnitude of the number text s[:n] 1e308 or more?  A double cannot hold
    such a value (DBL_MAX ≈ 1.8e308): JSON readers turn it into inf, which no JSON text
    can write back, so the grammar never writes one (``1e400`` is refused at its last
    digit; zero with any exponent is not large).  Exponent digits only make it larger,
    so once true it stays true.  (Twin: ``numbers.number_too_large``.)"""
    cdef Dec v
    parse_dec(s, n, &v)
    return v.nd > 0 and v.nd - 1 + v.exp >= 308


cdef int cmp_mag(const uint8_t* ad, int an, int64_t ae, const char* bd, int bn, int64_t be) noexcept nogil:
    """Compare |a| and |b| (normalised digit strings); both may be zero (n == 0)."""
    cdef int64_t oa, ob
    cdef int i, m
    if an == 0 or bn == 0:
        return (an > 0) - (bn > 0)
    oa = an + ae
    ob = bn + be
    if oa != ob:
        return 1 if oa > ob else -1
    m = an if an < bn else bn
    for i in range(m):
        if ad[i] != <uint8_t>bd[i]:
            return 1 if ad[i] > <uint8_t>bd[i] else -1
    if an == bn:
        return 0
    return 1 if an > bn else -1


cdef int cmp_dec(const Dec* a, bint bneg, int64_t bexp, const char* bd, int bn) noexcept nogil:
    cdef int m
    if a.nd == 0 and bn == 0:
        return 0
    if a.nd == 0:
        return 1 if bneg else -1
    if bn == 0:
        return -1 if a.neg else 1
    if a.neg != bneg:
        return -1 if a.neg else 1
    m = cmp_mag(a.digits, a.nd, a.exp, bd, bn, bexp)
    return -m if a.neg else m


cdef bint number_check(const Prog* p, int check, const Dec* v) noexcept nogil:
    cdef int flags = p.nc_flags[check]
    cdef const int32_t* b
    cdef int c, i
    cdef uint64_t m, r
    cdef int64_t e, k
    if flags & 1:
        b = &p.nc_lo[check * 4]
        c = cmp_dec(v, b[0] != 0, b[1], &p.digit_pool[b[2]], b[3])
        if c < 0 or (c == 0 and (flags & 2)):
            return False
    if flags & 4:
        b = &p.nc_hi[check * 4]
        c = cmp_dec(v, b[0] != 0, b[1], &p.digit_pool[b[2]], b[3])
        if c > 0 or (c == 0 and (flags & 8)):
            return False
    if flags & 16:
        if v.nd == 0:
            return True
        m = p.nc_mult[check]
        e = v.exp - p.nc_mult_exp[check]
        if e < 0:
            return False   # digits has no trailing zero, so it cannot absorb 10**-e
        r = 0
        for i in range(v.nd):
            r = (r * 10 + (v.digits[i] - 0x30)) % m
        # r * 10**e mod m by squaring
        k = 10 % m
        while e > 0:
            if e & 1:
                r = ng_mulmod(r, k, m)
            k = ng_mulmod(k, k, m)
            e >>= 1
        if r != 0:
            return False
    return True


# ----------------------------------------------------------------------------- number liveness
#
# After every byte the number prefix is alive iff some completion (more bytes, then
# a delimiter) is a number that passes ``number_check`` and whose whole text fits the
# buffer (NUM_BUF bytes).  Nonzero values are searched as N * 10**q with
# N in [plo*10**a, (phi+1)*10**a - 1]: a = mantissa digits still to append, plo..phi the
# leading digits (the prefix's digits, or 1..9 when only a sign/zeros were typed), q moved
# by an exponent, a dot or leading fraction zeros at a byte cost.  Buckets
# [plo*10**k, (phi+1)*10**k) (k = a + q) are disjoint for different k, so at most two hold
# a bound; those between lie strictly inside the interval, where feasibility only grows
# with k (v -> 10v keeps a multiple a multiple): a query checks at most three exact
# candidates (``bucket_feasible``).  No bignums: integers are decimal digit arrays
# (``Big``), remainders use uint64 (mu < 10**18, so r*10 + 9 < 2**64).  Exponent shifts
# saturate at +-QINF: the compiler refuses bounds/multipleOf past 10**+-MAX_NUM_EXP, so
# beyond QINF nothing changes (and int64 sums of shifts and orders cannot overflow).
# The pure-Python twin (same names, Python integers) is the executable spec.

cdef enum:
    BIG_DIGITS = 96     # N has at most NUM_BUF digits; bounds are capped at its length + 1

cdef int64_t QINF = 1000000000000000       # 10**15
cdef int64_t KINF = 10000000000000000      # 10**16


cdef struct Big:                # a nonnegative integer: little-endian digits 0-9, n = 0 for zero
    int n
    uint8_t d[BIG_DIGITS]


cdef struct Bounds:             # |v| for the nonzero values of one sign
    bint has_lo
    bint lo_x
    const char* lo_d
    int lo_n
    int64_t lo_e
    bint has_hi
    bint hi_x
    const char* hi_d
    int hi_n
    int64_t hi_e
    bint has_mult
    uint64_t mu
    int64_t me


cdef struct Lead:               # the leading digits plo..phi of the buckets (ASCII)
    uint8_t lo[NUM_BUF]
    int lo_n
    uint8_t hi[NUM_BUF]
    int hi_n
    int lo_dn                   # plo without trailing zeros: lo[:lo_dn] * 10**(lo_n - lo_dn)
    uint8_t up[NUM_BUF + 1]     # phi + 1 without trailing zeros: up[:up_n] * 10**up_e
    int up_n
    int64_t up_e


cdef inline int64_t sat(int64_t x) noexcept nogil:
    return -QINF if x < -QINF else (QINF if x > QINF else x)


cdef inline int nd(int64_t x) noexcept nogil:
    """Decimal digits of x >= 0 (1 for 0)."""
    cdef int n = 1
    while x >= 10:
        x //= 10
        n += 1
    return n


cdef inline int64_t pow10_sat(int e) noexcept nogil:
    cdef int64_t v = 1
    cdef int i
    for i in range(e):
        if v > QINF:
            return QINF * 10
        v *= 10
    return v


cdef void lead_init(Lead* L, const uint8_t* lo, int lo_n, const uint8_t* hi, int hi_n) noexcept nogil:
    cdef int i, c
    memcpy(L.lo, lo, lo_n)
    L.lo_n = lo_n
    memcpy(L.hi, hi, hi_n)
    L.hi_n = hi_n
    L.lo_dn = lo_n
    while L.lo_dn > 1 and lo[L.lo_dn - 1] == 0x30:
        L.lo_dn -= 1
    # phi + 1
    c = 1
    for i in range(hi_n - 1, -1, -1):
        L.up[i + 1] = <uint8_t>(0x30 + (hi[i] - 0x30 + c) % 10)
        c = (hi[i] - 0x30 + c) // 10
    L.up[0] = <uint8_t>(0x31 if c else 0x30)
    if c:
        L.up_n = hi_n + 1
    else:
        memmove(L.up, L.up + 1, hi_n)
        L.up_n = hi_n
    L.up_e = 0
    while L.up_n > 1 and L.up[L.up_n - 1] == 0x30:
        L.up_n -= 1
        L.up_e += 1


cdef inline void big_zero(Big* b) noexcept nogil:
    b.n = 0


cdef void big_from_digits(Big* b, const uint8_t* s, int n, int zeros, int nines) noexcept nogil:
    """b = ASCII digits s[:n] followed by `zeros` 0s and then `nines` 9s (n + zeros + nines <= BIG_DIGITS)."""
    cdef int i, k = 0
    for i in range(nines):
        b.d[k] = 9
        k += 1
    for i in range(zeros):
        b.d[k] = 0
        k += 1
    for i in range(n - 1, -1, -1):
        b.d[k] = s[i] - 0x30
        k += 1
    b.n = k
    while b.n > 0 and b.d[b.n - 1] == 0:
        b.n -= 1


cdef int big_cmp(const Big* a, const Big* b) noexcept nogil:
    cdef int i
    if a.n != b.n:
        return 1 if a.n > b.n else -1
    for i in range(a.n - 1, -1, -1):
        if a.d[i] != b.d[i]:
            return 1 if a.d[i] > b.d[i] else -1
    return 0


cdef void big_add_small(Big* b, uint64_t x) noexcept nogil:
    cdef int i = 0
    cdef uint64_t t
    while x:
        t = (b.d[i] if i < b.n else 0) + x % 10
        x //= 10
        if t >= 10:
            t -= 10
            x += 1
        b.d[i] = <uint8_t>t
        i += 1
        if i > b.n:
            b.n = i


cdef void big_dec(Big* b) noexcept nogil:
    """b -= 1 for b >= 1."""
    cdef int i = 0
    while b.d[i] == 0:
        b.d[i] = 9
        i += 1
    b.d[i] -= 1
    while b.n > 0 and b.d[b.n - 1] == 0:
        b.n -= 1


cdef void big_shift_down(Big* b, int t, bint up) noexcept nogil:
    """b = ceil (up) or floor of b / 10**t."""
    cdef bint rest = False
    cdef int i
    if t >= b.n:
        rest = b.n > 0
        b.n = 0
    else:
        for i in range(t):
            if b.d[i]:
                rest = True
        memmove(b.d, b.d + t, b.n - t)
        b.n -= t
    if up and rest:
        big_add_small(b, 1)


cdef uint64_t big_mod(const Big* b, uint64_t m) noexcept nogil:
    cdef uint64_t r = 0
    cdef int i
    for i in range(b.n - 1, -1, -1):
        r = (r * 10 + b.d[i]) % m      # r < m < 10**18: no overflow
    return r


cdef int scaled_int(Big* out, const char* d, int n, int64_t e, int64_t q, bint up, bint excl,
                    int cap) noexcept nogil:
    """out = ceil (up) or floor of d*10**e / 10**q, moved past it when excl and exact.
    Returns 1 (out unset) when the value is at least 10**cap."""
    cdef int64_t o = n + e - q
    cdef int64_t s = e - q
    if o > cap:
        return 1
    if o <= 0:                       # 0 < value < 1
        big_zero(out)
        if up:
            big_add_small(out, 1)
        return 0
    if s >= 0:                       # s <= cap: an integer with s trailing zeros
        big_from_digits(out, <const uint8_t*>d, n, <int>s, 0)
        if excl:
            if up:
                big_add_small(out, 1)
            else:
                big_dec(out)
        return 0
    # digits carry no trailing zero: cutting any leaves a fraction
    big_from_digits(out, <const uint8_t*>d, <int>o, 0, 0)
    if up:
        big_add_small(out, 1)
    return 0


cdef bint bucket_feasible(const Bounds* J, const Lead* L, int64_t a, int64_t q) noexcept nogil:
    """Is some N in [plo*10**a, (phi+1)*10**a - 1] with N*10**q inside J and a multiple?"""
    cdef Big lo_n, hi_n, t
    cdef int cap
    cdef int64_t sh
    cdef uint64_t dv, r
    cdef int c2, c5
    if a < 0 or L.hi_n + a + 2 > BIG_DIGITS:
        return False
    big_from_digits(&lo_n, L.lo, L.lo_n, <int>a, 0)
    big_from_digits(&hi_n, L.hi, L.hi_n, 0, <int>a)
    cap = hi_n.n + 1
    if J.has_lo:
        if scaled_int(&t, J.lo_d, J.lo_n, J.lo_e, q, True, J.lo_x, cap):
            return False
        if big_cmp(&t, &lo_n) > 0:
            lo_n = t
    if J.has_hi:
        if not scaled_int(&t, J.hi_d, J.hi_n, J.hi_e, q, False, J.hi_x, cap):
            if big_cmp(&t, &hi_n) < 0:
                hi_n = t
    if big_cmp(&lo_n, &hi_n) > 0:
        return False
    dv = 1
    if J.has_mult:
        dv = J.mu
        if q >= J.me:
            # N*10**(q-me) = 0 mod mu <=> N = 0 mod mu/gcd(mu, 10**(q-me)); mu < 2**63 has
            # fewer than 64 factors 2 or 5, so shifts past 64 change nothing
            sh = q - J.me
            c2 = <int>(sh if sh < 64 else 64)
            c5 = c2
            while c2 and dv % 2 == 0:
                dv //= 2
                c2 -= 1
            while c5 and dv % 5 == 0:
                dv //= 5
                c5 -= 1
        else:
            sh = J.me - q             # N must end in sh zeros: divide them out
            if sh > cap:
                return False
            big_shift_down(&lo_n, <int>sh, True)
            big_shift_down(&hi_n, <int>sh, False)
    if dv > 1:
        r = big_mod(&lo_n, dv)
        if r:
            big_add_small(&lo_n, dv - r)
    return big_cmp(&lo_n, &hi_n) <= 0


cdef void bucket_orders(const Bounds* J, const Lead* L, int64_t* k_bot, int64_t* k_top) noexcept nogil:
    """The bucket orders k whose [plo*10**k, (phi+1)*10**k) meets J's hull."""
    cdef int64_t k
    if not J.has_hi:
        k_top[0] = KINF
    else:   # largest k with plo*10**k <= H
        k = J.hi_n + J.hi_e - L.lo_n
        k_top[0] = k if cmp_mag(L.lo, L.lo_dn, L.lo_n - L.lo_dn + k, J.hi_d, J.hi_n, J.hi_e) <= 0 else k - 1
    if not J.has_lo:
        k_bot[0] = -KINF
    else:   # smallest k with (phi+1)*10**k > L
        k = J.lo_n + J.lo_e - (L.up_n + L.up_e)
        k_bot[0] = k if cmp_mag(L.up, L.up_n, L.up_e + k, J.lo_d, J.lo_n, J.lo_e) > 0 else k + 1


cdef bint bucket_search(const Bounds* J, const Lead* L, int64_t k_lo, int64_t k_hi, bint fixed_a,
                        int64_t fixed) noexcept nogil:
    """Is some bucket order k in [k_lo, k_hi] feasible, with a fixed (q = k - a) or q fixed (a = k - q)?"""
    cdef int64_t k_bot, k_top, u, v, w, k
    cdef int64_t cands[3]
    cdef int nc, i
    bucket_orders(J, L, &k_bot, &k_top)
    u = k_lo if k_lo > k_bot else k_bot
    v = k_hi if k_hi < k_top else k_top
    if u > v:
        return False
    cands[0] = u
    nc = 1
    if v != u:
        cands[1] = v
        nc = 2
    w = v if v < k_top - 1 else k_top - 1   # the largest bucket strictly inside J: the best interior one
    if w > u and w > k_bot and w != v:
        cands[nc] = w
        nc += 1
    for i in range(nc):
        k = cands[i]
        if fixed_a:
            if bucket_feasible(J, L, fixed, k - fixed):
                return True
        elif bucket_feasible(J, L, k - fixed, fixed):
            return True
    return False


cdef inline void exp_range(int64_t B, int64_t* lo, int64_t* hi) noexcept nogil:
    """Exponent values writable in at most B bytes (0: no exponent)."""
    if B < 2:
        lo[0] = 0
        hi[0] = 0
        return
    lo[0] = sat(-(pow10_sat(<int>(B - 2 if B - 2 < 17 else 17)) - 1))
    hi[0] = sat(pow10_sat(<int>(B - 1 if B - 1 < 17 else 17)) - 1)


cdef enum:
    SH_INT = 0      # integer digits: a dot, an exponent, or both
    SH_FRAC = 1     # fraction digits after f0 others: an exponent
    SH_ZERO = 2     # only zeros so far: leading fraction zeros and an exponent


cdef void shifts(int kind, int64_t a, int64_t B, int64_t f0, int64_t* lo_q, int64_t* hi_q) noexcept nogil:
    """The interval of q reachable in B bytes after a more digits."""
    cdef int64_t xl, xh
    exp_range(B, &xl, &xh)
    if kind == SH_INT:
        lo_q[0] = -a if (a >= 1 and B >= 1) else 0
        hi_q[0] = 0
        if xl < lo_q[0]:
            lo_q[0] = xl
        if xh > hi_q[0]:
            hi_q[0] = xh
        if a >= 1 and B >= 3:
            exp_range(B - 1, &xl, &xh)
            if xl - a < lo_q[0]:
                lo_q[0] = xl - a
            if xh - a > hi_q[0]:
                hi_q[0] = xh - a
    elif kind == SH_FRAC:
        lo_q[0] = xl - f0 - a
        hi_q[0] = xh - f0 - a
    else:
        if B < 2:
            lo_q[0] = -B
            hi_q[0] = 0
        else:
            lo_q[0] = -B if -B < xl else xl
            hi_q[0] = xh
        lo_q[0] += -f0 - 1 - a
        hi_q[0] += -f0 - 1 - a


cdef bint form_live(const Bounds* J, const Lead* L, int64_t R, int64_t a_min, int kind,
                    int64_t f0) noexcept nogil:
    """Some a in [a_min, R] and q in shifts(a, R - a) with a feasible bucket?"""
    cdef int64_t a, lo_q, hi_q
    if R < a_min:
        return False
    for a in range(a_min, R + 1):
        shifts(kind, a, R - a, f0, &lo_q, &hi_q)
        if bucket_search(J, L, sat(a + lo_q), sat(a + hi_q), True, a):
            return True
        # (after the cheap common case) any solution with a digits is one with R digits
        # too (append zeros, q - 1 each): none there, none at all
        if a == a_min and not bucket_search(J, L, -KINF, KINF, True, R):
            return False
    return False


cdef bint exp_live(const Bounds* J, const Dec* m, int phase, int esign, int64_t g, int64_t R) noexcept nogil:
    """Exponent phases: the mantissa m is fixed (nonzero), the exponent's start is typed."""
    cdef int64_t y, y_lo, y_hi, xl, xh, t, lo_x, hi_x
    cdef uint64_t r
    cdef int c
    if not J.has_lo:
        y_lo = -KINF
    else:
        y = J.lo_n + J.lo_e - m.nd
        c = cmp_mag(m.digits, m.nd, y, J.lo_d, J.lo_n, J.lo_e)
        y_lo = y if (c > 0 or (c == 0 and not J.lo_x)) else y + 1
    if not J.has_hi:
        y_hi = KINF
    else:
        y = J.hi_n + J.hi_e - m.nd
        c = cmp_mag(m.digits, m.nd, y, J.hi_d, J.hi_n, J.hi_e)
        y_hi = y if (c < 0 or (c == 0 and not J.hi_x)) else y - 1
    if J.has_mult:
        r = 0
        for c in range(m.nd):
            r = (r * 10 + (m.digits[c] - 0x30)) % J.mu
        t = 0
        while r and t < 64:
            r = (r * 10) % J.mu
            t += 1
        if r:
            return False
        if J.me + t > y_lo:
            y_lo = J.me + t         # m*10**y is a multiple from y = me + t on
    xl = sat(y_lo - m.exp)
    xh = sat(y_hi - m.exp)
    if xl > xh:
        return False
    if phase == N_EXP:
        if xl <= 0 and 0 <= xh:
            return R >= 1
        return R >= (nd(xl) if xl > 0 else 1 + nd(-xh))
    if esign < 0:
        t = xl
        xl = -xh
        xh = -t
    if xl < 0:
        xl = 0
    if xl > xh:
        return False
    if phase == N_EXPSIGN:
        return R >= nd(xl)
    if g == 0:                      # only zeros typed: any value, one byte per digit
        return xl == 0 or R >= nd(xl)
    lo_x = g
    hi_x = g
    for t in range(R + 1):          # g followed by t more digits
        if lo_x > xh:
            return False
        if hi_x >= xl:
            return True
        lo_x = sat(lo_x * 10) if lo_x < QINF else QINF
        hi_x = sat(hi_x * 10 + 9) if hi_x < QINF else QINF
    return False


cdef bint magnitude_bounds(const Prog* p, int check, bint neg, Bounds* J) noexcept nogil:
    """Bounds on |v| for the nonzero values of this sign; False when none of that sign fits."""
    cdef int flags = p.nc_flags[check]
    cdef const int32_t* lo = &p.nc_lo[check * 4]
    cdef const int32_t* hi = &p.nc_hi[check * 4]
    cdef const int32_t* low
    cdef const int32_t* high
    cdef bint has_low, has_high, low_x, high_x, low_neg, high_neg
    if not neg:
        low, has_low, low_x, low_neg = lo, (flags & 1) != 0, (flags & 2) != 0, lo[0] != 0
        high, has_high, high_x, high_neg = hi, (flags & 4) != 0, (flags & 8) != 0, hi[0] != 0
    else:   # v = -|v| in [lo, hi]  <=>  |v| in [-hi, -lo]
        low, has_low, low_x, low_neg = hi, (flags & 4) != 0, (flags & 8) != 0, hi[0] == 0
        high, has_high, high_x, high_neg = lo, (flags & 1) != 0, (flags & 2) != 0, lo[0] == 0
    J.has_lo = has_low and low[3] > 0 and not low_neg
    if J.has_lo:
        J.lo_x = low_x
        J.lo_d = &p.digit_pool[low[2]]
        J.lo_n = low[3]
        J.lo_e = low[1]
    J.has_hi = has_high
    if has_high:
        if high_neg or high[3] == 0:
            return False        # the upper bound is <= 0: no value of this sign is nonzero
        J.hi_x = high_x
        J.hi_d = &p.digit_pool[high[2]]
        J.hi_n = high[3]
        J.hi_e = high[1]
    J.has_mult = (flags & 16) != 0
    if J.has_mult:
        J.mu = p.nc_mult[check]
        J.me = p.nc_mult_exp[check]
    return True


cdef bint number_live(const Prog* p, int check, const uint8_t* s, int n, int phase,
                      bint integer_only) noexcept nogil:
    """Can the number prefix s[:n] (syntax phase `phase`) still complete, within NUM_BUF
    bytes, into a number that passes the check (check < 0: any number)?"""
    cdef int64_t R = NUM_BUF - n
    cdef bint need = phase == N_MINUS or phase == N_DOT or phase == N_EXP or phase == N_EXPSIGN
    cdef bint neg, seen_dot
    cdef int ei, i, ms, nzs, nzn, f0, esign, c
    cdef int64_t g
    cdef Bounds J
    cdef Lead L
    cdef Dec d
    cdef uint8_t buf[NUM_BUF]
    cdef uint8_t one = 0x31
    cdef uint8_t nine = 0x39
    if R < need:
        return False
    if check < 0:
        return True
    if phase == N_ZERO or phase == N_INT or phase == N_FRAC or phase == N_EXPDIG:
        parse_dec(s, n, &d)          # the common case: the prefix itself is a valid number
        if number_check(p, check, &d):
            return True
    neg = n > 0 and s[0] == 0x2D
    ms = 1 if neg else 0
    ei = n
    for i in range(n):
        if s[i] == 0x65 or s[i] == 0x45:
            ei = i
            break
    # mantissa digits without the dot, then without leading zeros
    nzn = 0
    f0 = 0
    seen_dot = False
    for i in range(ms, ei):
        c = s[i]
        if c == 0x2E:
            seen_dot = True
        else:
            if seen_dot:
                f0 += 1
            if nzn > 0 or c != 0x30:
                buf[nzn] = <uint8_t>c
                nzn += 1
    # the value 0 (needs a digit after "-", "." or "e")
    if nzn == 0:
        d.neg = False
        d.nd = 0
        d.exp = 0
        if number_check(p, check, &d):
            return True
    if not magnitude_bounds(p, check, neg, &J):
        return False
    if ei < n:
        if nzn == 0:
            return False
        parse_dec(s, ei, &d)
        i = ei + 1
        esign = 1
        if i < n and (s[i] == 0x2B or s[i] == 0x2D):
            esign = -1 if s[i] == 0x2D else 1
            i += 1
        g = 0
        while i < n:               # saturates: past QINF every exponent acts alike
            g = g * 10 + (s[i] - 0x30)
            if g > QINF:
                g = QINF
            i += 1
        return exp_live(&J, &d, phase, esign, g, R)
    if phase == N_MINUS:           # a first digit 1-9 (then integer digits), or "0"
        lead_init(&L, &one, 1, &nine, 1)
        if integer_only:
            return bucket_search(&J, &L, 0, R - 1, False, 0)
        return form_live(&J, &L, R - 1, 0, SH_INT, 0) or form_live(&J, &L, R - 3, 0, SH_ZERO, 0)
    if integer_only:
        if phase != N_INT:
            return False
        lead_init(&L, buf, nzn, buf, nzn)
        return bucket_search(&J, &L, 0, R, False, 0)
    if phase == N_INT:
        lead_init(&L, buf, nzn, buf, nzn)
        return form_live(&J, &L, R, 0, SH_INT, 0)
    if nzn == 0:   # "0", "0.", "0.00": a dot (if none yet), leading zeros, a first digit 1-9
        lead_init(&L, &one, 1, &nine, 1)
        return form_live(&J, &L, R - (1 if phase == N_ZERO else 0) - 1, 0, SH_ZERO, f0)
    lead_init(&L, buf, nzn, buf, nzn)
    return form_live(&J, &L, R, 1 if phase == N_DOT else 0, SH_FRAC, f0)


cdef uint64_t number_hash(const Dec* d) noexcept nogil:
    cdef uint64_t h = FNV_OFFSET
    cdef int i, n
    cdef int64_t e = d.exp
    cdef uint8_t buf[24]
    h = fnv(h, 0x2D if d.neg else 0x2B)
    for i in range(d.nd):
        h = fnv(h, d.digits[i])
    h = fnv(h, 0x65)
    if e < 0:
        h = fnv(h, 0x2D)
        e = -e
    n = 0
    while True:
        buf[n] = <uint8_t>(0x30 + e % 10)
        n += 1
        e //= 10
        if e == 0:
            break
    for i in range(n - 1, -1, -1):
        h = fnv(h, buf[i])
    return fmix(h ^ TAG_NUM)


cdef bint number_end(const Prog* p, Thread* th, Frame* top, uint64_t* h) noexcept nogil:
    cdef Dec d
    cdef int ph = top.phase
    cdef int node = top.node
    if not (ph == N_ZERO or ph == N_INT or ph == N_FRAC or ph == N_EXPDIG):
        return False
    if top.dfa >= 0 and p.accept[top.dfa] < 0:
        return False
    parse_dec(th.num, th.num_len, &d)
    if p.num_check[node] >= 0 and not number_check(p, p.num_check[node], &d):
        return False
    h[0] = number_hash(&d)
    return True


# ----------------------------------------------------------------------------- objects

cdef bint object_close(const Prog* p, Thread* th, Frame* top) noexcept nogil:
    cdef int node = top.node
    cdef int base = top.aux
    cdef int roff = p.obj_req_off[node]
    cdef int w
    cdef uint64_t h
    cdef int nw = p.obj_nwords[node]
    cdef int d, prop, doff
    if top.count < p.obj_min[node]:
        return False
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
    h = fmix(top.h ^ TAG_OBJ)
    th.depth -= 1
    th.aux_top = base
    return complete_value(p, th, h)


cdef bint object_byte(const Prog* p, Thread* th, Frame* top, int b) noexcept nogil:
    cdef int node = top.node
    cdef int ph = top.phase
    cdef int mx, st
    cdef Frame* k
    if ph == O_START or ph == O_NEXT:
        if b == 0x22:
            mx = p.obj_max[node]
            if mx >= 0 and top.count >= mx:
                return False
            st = p.obj_key_dfa[node]
            if not key_live(p, th, top, st):
                return False
            if th.depth >= MAX_DEPTH:
                return False
            k = &th.frames[th.depth]
            th.depth += 1
            set_frame(k, F_KEY, node, 0)
            k.dfa = st
            k.h = FNV_OFFSET
            return True
        if ph == O_START and b == 0x7D:
            return object_close(p, th, top)
        return False
    if ph == O_COLON:
        if b != 0x3A:
            return False
        if th.depth >= MAX_DEPTH:
            return False
        top.phase = O_VALUE
        set_frame(&th.frames[th.depth], F_VALUE, top.x, 0)
        th.depth += 1
        return True
    if ph == O_AFTER:
        if b == 0x2C:
            mx = p.obj_max[node]
            if mx >= 0 and top.count >= mx:
                return False
            if not key_live(p, th, top, p.obj_key_dfa[node]):
                return False
            top.phase = O_NEXT
            return True
        if b == 0x7D:
            return object_close(p, th, top)
        return False
    return False


# ----------------------------------------------------------------------------- tool calls

cdef inline bint tools_left(const Prog* p, const Frame* top) noexcept nogil:
    return (p.words[p.reach_off[p.tool_dfa]] & ~top.h) != 0


cdef int calls_byte(const Prog* p, Thread* th, Frame* top, int b) noexcept nogil:
    """The outer call list: 1 consumed, 0 dead."""
    cdef int ph = top.phase
    cdef int lab, st
    if b == EOF_BYTE:
        return 0
    if ph == C_OPEN:
        if b != 0x5B:
            return 0
        top.phase = C_FIRST
        return 1
    if ph == C_FIRST or ph == C_NEXT:
        if ph == C_FIRST and b == 0x5D:
            th.depth -= 1
            return 1
        if b != 0x7B or top.count >= p.max_calls or not tools_left(p, top):
            return 0
        top.phase = C_HEAD
        top.x = 1
        return 1
    if ph == C_HEAD:
        if b != <uint8_t>CALL_HEAD[top.x]:
            return 0
        top.x += 1
        if top.x == CALL_HEAD_LEN:
            top.phase = C_NAME
            top.dfa = p.tool_dfa
        return 1
    if ph == C_NAME:
        if b == 0x22:
            lab = p.accept[top.dfa]
            if lab < 0 or (top.h >> lab) & 1:
                return 0
            top.h |= (<uint64_t>1) << lab
            top.y = lab
            top.phase = C_MID
            top.x = 1
            return 1
        st = dfa_next(p, top.dfa, b)
        if st < 0 or not (p.words[p.reach_off[st]] & ~top.h):
            return 0
        top.dfa = st
        return 1
    if ph == C_MID:
        if b != <uint8_t>CALL_MID[top.x]:
            return 0
        top.x += 1
        if top.x == CALL_MID_LEN:
            if th.depth >= MAX_DEPTH:
                return 0
            top.phase = C_ARGS
            set_frame(&th.frames[th.depth], F_VALUE, p.tool_nodes[top.y], 0)
            th.depth += 1
        return 1
    if ph == C_CLOSE:
        if b != 0x7D:
            return 0
        top.count += 1
        top.phase = C_AFTER
        return 1
    if ph == C_AFTER:
        if b == 0x5D:
            th.depth -= 1
            return 1
        if b == 0x2C and top.count < p.max_calls and tools_left(p, top):
            top.phase = C_NEXT
            return 1
        return 0
    return 0


# ----------------------------------------------------------------------------- one byte

cdef bint push_alt(const Prog* p, Thread* t, int node, int i, int64_t pos) noexcept nogil:
    cdef Frame* f
    if p.oneof[node]:
        if t.depth >= MAX_DEPTH:
            return False
        f = &t.frames[t.depth]
        set_frame(f, F_ONEOF, node, 0)
        f.x = i
        f.aux = <int32_t>pos
        t.depth += 1
    if p.alt_mark[node] == i:
        # this alternative's value counts for the enclosing array's contains
        if t.depth >= MAX_DEPTH:
            return False
        set_frame(&t.frames[t.depth], F_MARK, node, 0)
        t.depth += 1
    if t.depth >= MAX_DEPTH:
        return False
    set_frame(&t.frames[t.depth], F_VALUE, p.alt_pool[p.alt_off[node] + i], 0)
    t.depth += 1
    return True


cdef int step(const Prog* p, StateData* s, int ti, int b) noexcept nogil:
    """Feed byte b to thread ti.  1: alive, 0: dead, -1: out of thread slots."""
    cdef Thread* th = &s.threads[ti]
    cdef Frame* top
    cdef int kind, node, ph, bit, i, n, first, mx, r
    cdef Thread* t
    cdef uint64_t h
    cdef const char* lit
    cdef int lit_len
    while True:
        if th.depth == 0:
            return 1 if b == EOF_BYTE else 0
        top = &th.frames[th.depth - 1]
        kind = top.kind
        if kind == F_VALUE:
            node = top.node
            if p.kind[node] == NODE_CHOICE:
                th.depth -= 1
                bit = start_bit(b) if b != EOF_BYTE else 0
                n = p.alt_n[node]
                first = -1
                for i in range(n):
                    if not (p.starts[p.alt_pool[p.alt_off[node] + i]] & bit):
                        continue
                    if first < 0:
                        first = i
                        continue
                    # another alternative: a new thread in the next slot, stepped later
                    if s.n_threads >= MAX_SLOTS:
                        return -1
                    t = &s.threads[s.n_threads]
                    s.n_threads += 1
                    copy_thread(t, th)
                    if not push_alt(p, t, node, i, s.pos):
                        t.depth = -1   # dead on arrival: stepped as dead
                if first < 0:
                    return 0
                if not push_alt(p, th, node, first, s.pos):
                    return 0
                continue
            if not start_value(p, th, top, node, b, s.pos):
                return 0
            if top.kind == F_NUMBER:
                return 1 if number_byte(p, th, top, b) else 0
            return 1
        if kind == F_STRING or kind == F_KEY:
            return 1 if string_byte(p, th, top, b) else 0
        if kind == F_NUMBER:
            if b != EOF_BYTE and is_number_byte(b):
                return 1 if number_byte(p, th, top, b) else 0
            # delimiter: the number ends here and the byte is retried in the parent
            if not number_end(p, th, top, &h):
                return 0
            th.depth -= 1
            if not complete_value(p, th, h):
                return 0
            continue
        if kind == F_LITERAL:
            if top.x == 0:
                lit = LIT_TRUE
                lit_len = 4
                h = 0x1111
            elif top.x == 1:
                lit = LIT_FALSE
                lit_len = 5
                h = 0x2222
            else:
                lit = LIT_NULL
                lit_len = 4
                h = 0x3333
            if b == EOF_BYTE or b != <uint8_t>lit[top.count]:
                return 0
            top.count += 1
            if top.count == lit_len:
                th.depth -= 1
                if not complete_value(p, th, h):
                    return 0
            return 1
        if kind == F_ARRAY:
            node = top.node
            ph = top.phase
            if ph == A_START or ph == A_NEXT:
                if ph == A_START and b == 0x5D:
                    if p.arr_min[node] > 0 or p.arr_cmin[node] > 0:
                        return 0
                    th.depth -= 1
                    return 1 if complete_value(p, th, fmix(top.h ^ TAG_ARR)) else 0
                if th.depth >= MAX_DEPTH or p.arr_max[node] == 0:
                    return 0
                top.phase = A_ITEM
                set_frame(&th.frames[th.depth], F_VALUE, item_node(p, node, top.count), 0)
                th.depth += 1
                continue
            if b == 0x2C:
                mx = p.arr_max[node]
                if (mx >= 0 and top.count >= mx) or item_node(p, node, top.count) == NEVER_NODE:
                    return 0
                top.phase = A_NEXT
                return 1
            if b == 0x5D:
                if top.count < p.arr_min[node] or top.y < p.arr_cmin[node]:
                    return 0
                th.depth -= 1
                th.aux_top = top.aux
                return 1 if complete_value(p, th, fmix(top.h ^ TAG_ARR)) else 0
            return 0
        if kind == F_OBJECT:
            return 1 if object_byte(p, th, top, b) else 0
        if kind == F_CALLS:
            return calls_byte(p, th, top, b)
        return 0


cdef inline bint events_clash(const Thread* a, const Thread* b) noexcept nogil:
    """Both threads completed the same oneOf value with different alternatives."""
    cdef int i, j
    for i in range(a.n_events):
        for j in range(b.n_events):
            if (a.events[4 * i] == b.events[4 * j] and a.events[4 * i + 2] == b.events[4 * j + 2]
                    and a.events[4 * i + 3] == b.events[4 * j + 3]
                    and a.events[4 * i + 1] != b.events[4 * j + 1]):
                return True
    return False


cdef bint feed_byte(const Prog* p, StateData* s, int b) noexcept nogil:
    cdef int i, j, n, r, w
    cdef bint any_events = False
    cdef uint8_t alive[MAX_SLOTS]
    for i in range(s.n_threads):
        s.threads[i].n_events = 0
    i = 0
    while i < s.n_threads:
        if s.threads[i].depth < 0:
            alive[i] = 0
        else:
            r = step(p, s, i, b)
            if r < 0:
                s.n_threads = 0
                s.pos += 1
                return False
            alive[i] = <uint8_t>r
            if r and s.threads[i].n_events:
                any_events = True
        i += 1
    n = s.n_threads
    if any_events:
        for i in range(n):
            if not alive[i] or not s.threads[i].n_events:
                continue
            for j in range(i + 1, n):
                if alive[j] and s.threads[j].n_events and events_clash(&s.threads[i], &s.threads[j]) \
                        and same_thread(&s.threads[i], &s.threads[j]):
                    alive[i] = 2
                    alive[j] = 2
        for i in range(n):
            if alive[i] == 2:
                alive[i] = 0
    # compact and drop duplicates
    w = 0
    for i in range(n):
        if not alive[i]:
            continue
        for j in range(w):
            if same_thread(&s.threads[j], &s.threads[i]):
                break
        else:
            if w != i:
                copy_thread(&s.threads[w], &s.threads[i])
            w += 1
    s.n_threads = w
    s.pos += 1
    return w > 0


cdef bint state_complete(const Prog* p, const StateData* s, StateData* scratch) noexcept nogil:
    cdef int i
    if s.n_threads == 0:
        return False
    copy_state(scratch, s)
    if not feed_byte(p, scratch, EOF_BYTE):
        return False
    for i in range(scratch.n_threads):
        if scratch.threads[i].depth == 0:
            return True
    return False


# ============================================================================= Python surface

# A free list of state buffers: a StateData is ~100 KB (all thread slots), and decoding
# clones one per step, so reusing buffers avoids a large malloc/free per token.
cdef StateData* _free_states[64]
cdef int _n_free_states = 0


cdef StateData* alloc_state() except NULL:
    global _n_free_states
    cdef StateData* s
    if _n_free_states > 0:
        _n_free_states -= 1
        return _free_states[_n_free_states]
    s = <StateData*>PyMem_Malloc(sizeof(StateData))
    if s == NULL:
        raise MemoryError()
    return s


cdef void release_state(StateData* s) noexcept:
    global _n_free_states
    if s == NULL:
        return
    if _n_free_states < 64:
        _free_states[_n_free_states] = s
        _n_free_states += 1
    else:
        PyMem_Free(s)


cdef class CState:
    """A grammar state (see ``needle_cy.grammar``); clone() is a copy of the live C data."""
    cdef StateData* data
    cdef CGrammar g

    def __cinit__(self):
        self.data = alloc_state()
        self.data.n_threads = 0
        self.data.pos = 0

    def __dealloc__(self):
        release_state(self.data)
        self.data = NULL

    def clone(self):
        cdef CState c = CState.__new__(CState)
        c.g = self.g
        copy_state(c.data, self.data)
        return c

    def feed(self, data):
        """Feed bytes; False (and the state is dead) at the first byte no valid value allows."""
        cdef const uint8_t[:] view
        cdef Py_ssize_t i, n
        cdef bint ok = True
        if isinstance(data, str):
            data = data.encode("utf-8")
        if not isinstance(data, (bytes, bytearray)):
            raise TypeError(f"feed expects bytes, got {type(data).__name__}")
        if self.data.n_threads == 0 or self.g is None:
            return False
        view = data
        n = len(data)
        with nogil:
            for i in range(n):
                if not feed_byte(&self.g.prog, self.data, view[i]):
                    ok = False
                    break
        return ok

    def is_complete(self):
        if self.g is None or self.data.n_threads == 0:
            return False
        return state_complete(&self.g.prog, self.data, self.g.scratch)

    @property
    def alive(self):
        return self.data.n_threads > 0

    def in_string(self):
        """True when every thread is inside a free-text string value: not a key, and not an
        enum/pattern/format string (those are bounded by their automaton)."""
        cdef int i
        cdef Thread* th
        if self.data.n_threads == 0 or self.g is None:
            return False
        for i in range(self.data.n_threads):
            th = &self.data.threads[i]
            if th.depth == 0 or th.frames[th.depth - 1].kind != F_STRING:
                return False
            if self.g.prog.str_dfa[th.frames[th.depth - 1].node] >= 0:
                return False
        return True

    def string_start(self):
        cdef Thread* th
        if self.data.n_threads == 0:
            return -1
        th = &self.data.threads[0]
        if th.depth > 0 and th.frames[th.depth - 1].kind == F_STRING:
            return th.frames[th.depth - 1].aux
        return -1

    def n_threads(self):
        return self.data.n_threads


cdef class PieceTable:
    """A vocabulary prepared for the grammar: a byte trie of every usable piece.

    Built once per piece table (``Tokenizer.piece_table()``): entry i is bytes, or
    None for a token that is never allowed.  ``body`` lists the pieces made only of
    plain string characters (no quote, backslash or control byte; complete UTF-8),
    valid inside any unconstrained string; ``other_*`` is the trie of the rest.
    """
    cdef public object pieces
    cdef public int n_tokens
    cdef public int max_len
    # full trie
    cdef object _first_child, _n_children, _edge_byte, _edge_child, _tok_start, _tok_count, _toks
    # trie of the non-body pieces
    cdef object _o_first_child, _o_n_children, _o_edge_byte, _o_edge_child, _o_tok_start
    cdef object _o_tok_count, _o_toks
    cdef object _body, _body_cps
    cdef object _piece_bytes, _piece_off, _piece_len

    def __init__(self, piece_table):
        self.pieces = piece_table
        self.n_tokens = len(piece_table)
        body, body_cps, other = [], [], []
        offs, lens, blob = [], [], bytearray()
        maxlen = 0
        for i, piece in enumerate(piece_table):
            offs.append(len(blob))
            if piece is None or len(piece) == 0:
                lens.append(0)
                continue
            piece = bytes(piece)
            lens.append(len(piece))
            blob.extend(piece)
            maxlen = max(maxlen, len(piece))
            cps = _plain_string_cps(piece)
            if cps >= 0:
                body.append(i)
                body_cps.append(cps)
            else:
                other.append(i)
        # the trie walk keeps one state per byte of the path: pieces are bounded (longer ones
        # are never allowed, see _build_trie's caller)
        self.max_len = min(maxlen, MAX_PIECE)
        self._piece_bytes = np.frombuffer(bytes(blob) or b"\0", dtype=np.uint8).copy()
        self._piece_off = np.asarray(offs, dtype=np.int32)
        self._piece_len = np.asarray(lens, dtype=np.int32)
        self._body = np.asarray(body, dtype=np.int32)
        self._body_cps = np.asarray(body_cps, dtype=np.int32)
        usable = [i for i in range(len(piece_table)) if 0 < lens[i] <= MAX_PIECE]
        other = [i for i in other if lens[i] <= MAX_PIECE]
        full = _build_trie(piece_table, usable)
        (self._first_child, self._n_children, self._edge_byte, self._edge_child, self._tok_start,
         self._tok_count, self._toks) = full
        part = _build_trie(piece_table, other)
        (self._o_first_child, self._o_n_children, self._o_edge_byte, self._o_edge_child,
         self._o_tok_start, self._o_tok_count, self._o_toks) = part


def _plain_string_cps(bytes piece):
    """Code points when the piece is plain string content from a clean state, else -1."""
    for c in piece:
        if c == 0x22 or c == 0x5C or c < 0x20:
            return -1
    try:
        s = piece.decode("utf-8")
    except UnicodeDecodeError:
        return -1
    return len(s)


def _build_trie(pieces, ids):
    """Flat trie: node 0 is the root; children of a node are contiguous edges sorted by byte."""
    children = [dict()]
    toks = [[]]
    for i in ids:
        cur = 0
        for c in pieces[i]:
            nxt = children[cur].get(c)
            if nxt is None:
                nxt = len(children)
                children[cur][c] = nxt
                children.append(dict())
                toks.append([])
            cur = nxt
        toks[cur].append(i)
    n = len(children)
    first = np.zeros(n, dtype=np.int32)
    nch = np.zeros(n, dtype=np.int32)
    eb, ec = [], []
    for v in range(n):
        first[v] = len(eb)
        nch[v] = len(children[v])
        for c in sorted(children[v]):
            eb.append(c)
            ec.append(children[v][c])
    ts = np.zeros(n, dtype=np.int32)
    tc = np.zeros(n, dtype=np.int32)
    tl = []
    for v in range(n):
        ts[v] = len(tl)
        tc[v] = len(toks[v])
        tl.extend(toks[v])
    return (first, nch, np.asarray(eb or [0], dtype=np.int32), np.asarray(ec or [0], dtype=np.int32),
            ts, tc, np.asarray(tl or [0], dtype=np.int32))


cdef struct Trie:
    const int32_t* first_child
    const int32_t* n_children
    const int32_t* edge_byte
    const int32_t* edge_child
    const int32_t* tok_start
    const int32_t* tok_count
    const int32_t* toks


cdef Trie _trie_view(PieceTable pt, bint other):
    cdef Trie t
    cdef const int32_t[::1] a
    if other:
        arrs = (pt._o_first_child, pt._o_n_children, pt._o_edge_byte, pt._o_edge_child, pt._o_tok_start,
                pt._o_tok_count, pt._o_toks)
    else:
        arrs = (pt._first_child, pt._n_children, pt._edge_byte, pt._edge_child, pt._tok_start,
                pt._tok_count, pt._toks)
    a = arrs[0]
    t.first_child = &a[0]
    a = arrs[1]
    t.n_children = &a[0]
    a = arrs[2]
    t.edge_byte = &a[0]
    a = arrs[3]
    t.edge_child = &a[0]
    a = arrs[4]
    t.tok_start = &a[0]
    a = arrs[5]
    t.tok_count = &a[0]
    a = arrs[6]
    t.toks = &a[0]
    return t


cdef struct WalkOut:
    uint8_t* mask         # set mask[token] = 1 for each valid token (or NULL)
    const float* logits   # track the best valid token by logit (or NULL)
    int n_logits
    int best
    float best_logit


cdef void walk_trie(const Prog* p, const Trie* t, const StateData* start, StateData** bufs,
                    int max_depth, WalkOut* out) noexcept nogil:
    """Depth-first over the trie; bufs[d] holds the state after the first d bytes of the path."""
    cdef int node_at[512]
    cdef int next_edge[512]
    cdef int end_edge[512]
    cdef int d = 0
    cdef int e, child, k, tok
    cdef StateData* cur
    cdef StateData* nxt
    copy_state(bufs[0], start)
    node_at[0] = 0
    next_edge[0] = t.first_child[0]
    end_edge[0] = t.first_child[0] + t.n_children[0]
    while d >= 0:
        if next_edge[d] >= end_edge[d]:
            d -= 1
            continue
        e = next_edge[d]
        next_edge[d] += 1
        child = t.edge_child[e]
        cur = bufs[d]
        nxt = bufs[d + 1]
        copy_state(nxt, cur)
        if not feed_byte(p, nxt, t.edge_byte[e]):
            continue
        for k in range(t.tok_count[child]):
            tok = t.toks[t.tok_start[child] + k]
            if out.mask != NULL:
                out.mask[tok] = 1
            if out.logits != NULL and tok < out.n_logits:
                if out.best < 0 or out.logits[tok] > out.best_logit:
                    out.best = tok
                    out.best_logit = out.logits[tok]
        if t.n_children[child] > 0 and d + 1 < max_depth:
            d += 1
            node_at[d] = child
            next_edge[d] = t.first_child[child]
            end_edge[d] = t.first_child[child] + t.n_children[child]


cdef class CGrammar:
    """The compiled program as C arrays, plus token-level search."""
    cdef Prog prog
    cdef object _keep
    cdef object program
    cdef StateData* scratch
    cdef StateData** bufs
    cdef int n_bufs
    cdef object _tables
    cdef object _body_cache

    def __cinit__(self):
        self.scratch = NULL
        self.bufs = NULL
        self.n_bufs = 0

    def __init__(self, program):
        self.program = program
        self._keep = []
        self._tables = {}
        self._body_cache = {}
        P = program

        def i32(x):
            a = np.ascontiguousarray(np.asarray(x if len(x) else [0], dtype=np.int32))
            self._keep.append(a)
            return a

        def i64(x):
            a = np.ascontiguousarray(np.asarray(x if len(x) else [0], dtype=np.int64))
            self._keep.append(a)
            return a

        def u64(x):
            a = np.ascontiguousarray(np.asarray(x if len(x) else [0], dtype=np.uint64))
            self._keep.append(a)
            return a

        def u8(x):
            a = np.ascontiguousarray(np.asarray(x if len(x) else [0], dtype=np.uint8))
            self._keep.append(a)
            return a

        cdef const int32_t[::1] v32
        cdef const int64_t[::1] v64
        cdef const uint64_t[::1] vu64
        cdef const uint8_t[::1] vu8
        v32 = i32(P.kind); self.prog.kind = &v32[0]
        v32 = i32(P.types); self.prog.types = &v32[0]
        v32 = i32(P.starts); self.prog.starts = &v32[0]
        v32 = i32(P.str_min); self.prog.str_min = &v32[0]
        v32 = i32(P.str_max); self.prog.str_max = &v32[0]
        v32 = i32(P.str_dfa); self.prog.str_dfa = &v32[0]
        v32 = i32(P.num_dfa); self.prog.num_dfa = &v32[0]
        v32 = i32(P.num_check); self.prog.num_check = &v32[0]
        v32 = i32(P.int_flags); self.prog.int_flags = &v32[0]
        v64 = i64(P.int_lo); self.prog.int_lo = &v64[0]
        v64 = i64(P.int_hi); self.prog.int_hi = &v64[0]
        v32 = i32(P.arr_prefix_off); self.prog.arr_prefix_off = &v32[0]
        v32 = i32(P.arr_prefix_n); self.prog.arr_prefix_n = &v32[0]
        v32 = i32(P.arr_items); self.prog.arr_items = &v32[0]
        v32 = i32(P.arr_min); self.prog.arr_min = &v32[0]
        v32 = i32(P.arr_max); self.prog.arr_max = &v32[0]
        v32 = i32(P.arr_unique); self.prog.arr_unique = &v32[0]
        v32 = i32(P.arr_cmin); self.prog.arr_cmin = &v32[0]
        v32 = i32(P.arr_cmax); self.prog.arr_cmax = &v32[0]
        v32 = i32(P.alt_mark); self.prog.alt_mark = &v32[0]
        v32 = i32(P.obj_key_dfa); self.prog.obj_key_dfa = &v32[0]
        v32 = i32(P.obj_nwords); self.prog.obj_nwords = &v32[0]
        v32 = i32(P.obj_req_off); self.prog.obj_req_off = &v32[0]
        v32 = i32(P.obj_min); self.prog.obj_min = &v32[0]
        v32 = i32(P.obj_max); self.prog.obj_max = &v32[0]
        v32 = i32(P.obj_dep_off); self.prog.obj_dep_off = &v32[0]
        v32 = i32(P.obj_dep_n); self.prog.obj_dep_n = &v32[0]
        v32 = i32(P.dep_pool); self.prog.dep_pool = &v32[0]
        v32 = i32(P.alt_off); self.prog.alt_off = &v32[0]
        v32 = i32(P.alt_n); self.prog.alt_n = &v32[0]
        v32 = i32(P.oneof); self.prog.oneof = &v32[0]
        v32 = i32(P.prefix_pool); self.prog.prefix_pool = &v32[0]
        v32 = i32(P.alt_pool); self.prog.alt_pool = &v32[0]
        vu64 = u64(P.words); self.prog.words = &vu64[0]
        v32 = i32(P.cls_prop); self.prog.cls_prop = &v32[0]
        v32 = i32(P.cls_node); self.prog.cls_node = &v32[0]
        byte_class, first = P.byte_classes()
        class_trans = _class_trans(P, first)
        self._keep.append(class_trans)
        v32 = class_trans; self.prog.class_trans = &v32[0]
        vu8 = u8(byte_class); self.prog.byte_class = &vu8[0]
        self.prog.n_classes = len(first)
        v32 = i32(P.accept); self.prog.accept = &v32[0]
        v32 = i32(P.reach_off); self.prog.reach_off = &v32[0]
        vu8 = u8(P.other); self.prog.other = &vu8[0]
        # exact number checks
        flags, lo, hi, mult, mult_exp = [], [], [], [], []
        pool = bytearray()

        def put(d, out):
            neg, digits, exp = d
            out.extend([1 if neg else 0, exp, len(pool), len(digits)])
            pool.extend(digits.encode())

        for chk in P.num_checks:
            f = 0
            if chk["lo"] is not None:
                f |= 1 | (2 if chk["lo"][1] else 0)
                put(chk["lo"][0], lo)
            else:
                lo.extend([0, 0, 0, 0])
            if chk["hi"] is not None:
                f |= 4 | (8 if chk["hi"][1] else 0)
                put(chk["hi"][0], hi)
            else:
                hi.extend([0, 0, 0, 0])
            if chk["mult"] is not None:
                f |= 16
                mult.append(int(chk["mult"][1]))
                mult_exp.append(chk["mult"][2])
            else:
                mult.append(1)
                mult_exp.append(0)
            flags.append(f)
        v32 = i32(flags); self.prog.nc_flags = &v32[0]
        v32 = i32(lo); self.prog.nc_lo = &v32[0]
        v32 = i32(hi); self.prog.nc_hi = &v32[0]
        vu64 = u64(mult); self.prog.nc_mult = &vu64[0]
        v32 = i32(mult_exp); self.prog.nc_mult_exp = &v32[0]
        pool_arr = u8(list(pool))
        vu8 = pool_arr
        self.prog.digit_pool = <const char*>&vu8[0]
        v32 = i32(P.tool_nodes); self.prog.tool_nodes = &v32[0]
        self.prog.tools_mode = P.tools_mode
        self.prog.max_calls = P.max_calls
        self.prog.tool_dfa = P.tool_dfa
        self.prog.root = P.root
        self.scratch = <StateData*>PyMem_Malloc(sizeof(StateData))
        if self.scratch == NULL:
            raise MemoryError()

    def __dealloc__(self):
        cdef int i
        PyMem_Free(self.scratch)
        if self.bufs != NULL:
            for i in range(self.n_bufs):
                PyMem_Free(self.bufs[i])
            PyMem_Free(self.bufs)

    cdef void _ensure_bufs(self, int n) except *:
        cdef int i
        cdef StateData** nb
        if n <= self.n_bufs:
            return
        nb = <StateData**>PyMem_Malloc(n * sizeof(StateData*))
        if nb == NULL:
            raise MemoryError()
        for i in range(n):
            if i < self.n_bufs:
                nb[i] = self.bufs[i]
            else:
                nb[i] = <StateData*>PyMem_Malloc(sizeof(StateData))
                if nb[i] == NULL:
                    raise MemoryError()
        if self.bufs != NULL:
            PyMem_Free(self.bufs)
        self.bufs = nb
        self.n_bufs = n

    def start(self):
        cdef CState s = CState.__new__(CState)
        cdef Thread* th
        s.g = self
        s.data.n_threads = 1
        s.data.pos = 0
        th = &s.data.threads[0]
        th.depth = 1
        th.aux_top = 0
        th.num_len = 0
        th.n_events = 0
        th.last_hash = 0
        if self.prog.tools_mode:
            set_frame(&th.frames[0], F_CALLS, 0, C_OPEN)
        else:
            set_frame(&th.frames[0], F_VALUE, self.prog.root, 0)
        return s

    def piece_table(self, piece_table):
        """The prepared PieceTable for a vocabulary (cached by identity)."""
        if isinstance(piece_table, PieceTable):
            return piece_table
        key = id(piece_table)
        hit = self._tables.get(key)
        if hit is not None and hit.pieces is piece_table:
            return hit
        hit = _PIECE_TABLES.get(key)
        if hit is None or hit.pieces is not piece_table:
            hit = PieceTable(piece_table)
            if len(_PIECE_TABLES) > 8:
                _PIECE_TABLES.clear()
            _PIECE_TABLES[key] = hit
        self._tables[key] = hit
        return hit

    cdef object _string_body(self, CState state, PieceTable pt, int* remaining):
        """Plain-string pieces valid from this state, when it is context free: one thread in a
        string value in a clean state.  Unconstrained strings take the vocabulary's list;
        automaton strings (enum, pattern, format) a list per automaton state, made once.
        Returns (ids, code points) or None."""
        cdef StateData* s = state.data
        cdef Thread* th
        cdef Frame* top
        cdef int mx, st, i, j, k, tok, n
        cdef const int32_t[::1] body
        cdef const int32_t[::1] cps
        cdef const int32_t[::1] offs
        cdef const int32_t[::1] lens
        cdef const uint8_t[::1] blob
        cdef cnp.ndarray[cnp.int32_t, ndim=1] keep
        cdef int32_t[::1] fin
        if s.n_threads != 1:
            return None
        th = &s.threads[0]
        if th.depth == 0:
            return None
        top = &th.frames[th.depth - 1]
        if (top.kind != F_STRING and top.kind != F_KEY) or top.x != 0:
            return None
        if top.kind == F_STRING:
            mx = self.prog.str_max[top.node]
            remaining[0] = -1 if mx < 0 else mx - top.count
        else:
            remaining[0] = -1
        if top.dfa < 0:
            if top.kind == F_KEY:
                return None
            return pt._body, pt._body_cps, None
        key = (id(pt), top.dfa)
        hit = self._body_cache.get(key)
        if hit is not None:
            return hit
        body = pt._body
        offs = pt._piece_off
        lens = pt._piece_len
        blob = pt._piece_bytes
        n = len(pt._body)
        keep = np.zeros(n, dtype=np.int32)
        finals = np.zeros(n, dtype=np.int32)
        fin = finals
        k = 0
        with nogil:
            for i in range(n):
                tok = body[i]
                st = top.dfa
                for j in range(lens[tok]):
                    st = dfa_next(&self.prog, st, blob[offs[tok] + j])
                    if st < 0:
                        break
                if st >= 0:
                    keep[k] = i
                    fin[k] = st
                    k += 1
        idx = keep[:k]
        # keys: a key stays live along a path iff it is live at its end (reach sets only shrink),
        # so the end state decides, with the object's seen properties, at use time
        hit = (np.ascontiguousarray(pt._body[idx]), np.ascontiguousarray(pt._body_cps[idx]),
               np.ascontiguousarray(finals[:k]) if top.kind == F_KEY else None)
        if len(self._body_cache) > 4096:
            self._body_cache.clear()
        self._body_cache[key] = hit
        return hit

    cdef Trie _offer_string_body(self, CState state, PieceTable pt, WalkOut* out) except *:
        """Offer the precomputed plain-string pieces of the current string or key to `out`
        (set their mask bits, or keep the best logit) and return the trie still to walk:
        the pieces outside those lists, or the whole vocabulary outside strings."""
        cdef int remaining = -1
        cdef int i, tok
        cdef const int32_t[::1] body
        cdef const int32_t[::1] cps
        cdef const int32_t[::1] fin
        cdef Thread* th = NULL
        cdef Frame* obj = NULL
        cdef bint is_key
        sb = self._string_body(state, pt, &remaining)
        if sb is None:
            return _trie_view(pt, False)
        body = sb[0]
        cps = sb[1]
        is_key = sb[2] is not None
        if is_key:
            fin = sb[2]
            th = &state.data.threads[0]
            obj = &th.frames[th.depth - 2]
        for i in range(body.shape[0]):
            tok = body[i]
            if remaining >= 0 and cps[i] > remaining:
                continue
            if out.mask == NULL and (tok >= out.n_logits or
                                     (out.best >= 0 and out.logits[tok] <= out.best_logit)):
                continue
            if is_key and not key_live(&self.prog, th, obj, fin[i]):
                continue
            if out.mask != NULL:
                out.mask[tok] = 1
            else:
                out.best = tok
                out.best_logit = out.logits[tok]
        return _trie_view(pt, True)

    cdef _own(self, state, what):
        """The state as a CState of this grammar; GrammarStateError for any other object.
        (The runtime reads the program's tables at the node and DFA indexes a state holds:
        a state of another grammar would index outside them.)"""
        if not isinstance(state, CState):
            raise GrammarStateError(f"{what}: expected a State started by this grammar, "
                                    f"found {type(state).__name__}")
        if (<CState>state).g is not self:
            raise GrammarStateError(f"{what}: the state was started by another grammar; "
                                    "a state belongs to the grammar whose start() made it")
        return state

    def allowed_tokens(self, state_obj, piece_table):
        """np.bool_ mask over the vocabulary: pieces whose whole bytes the state accepts."""
        cdef CState state = self._own(state_obj, "allowed_tokens")
        cdef PieceTable pt = self.piece_table(piece_table)
        cdef cnp.ndarray[cnp.uint8_t, ndim=1] mask = np.zeros(pt.n_tokens, dtype=np.uint8)
        cdef WalkOut out
        cdef Trie t
        if state.data.n_threads == 0:
            return mask.view(np.bool_)
        self._ensure_bufs(pt.max_len + 2)
        out.mask = <uint8_t*>mask.data
        out.logits = NULL
        out.best = -1
        t = self._offer_string_body(state, pt, &out)
        # the GIL stays held: the walk uses this grammar's shared scratch states
        walk_trie(&self.prog, &t, state.data, self.bufs, pt.max_len + 1, &out)
        return mask.view(np.bool_)

    def best_allowed(self, state_obj, logits, piece_table, close_string=False):
        """(token, new state): the highest-logit token whose piece the state accepts; (-1, state) if none.

        close_string: only tokens that end the current string value (the agent's cap on
        free-string length).
        """
        cdef CState state = self._own(state_obj, "best_allowed")
        cdef PieceTable pt = self.piece_table(piece_table)
        cdef cnp.ndarray[cnp.float32_t, ndim=1] lg = np.ascontiguousarray(logits, dtype=np.float32).reshape(-1)
        cdef int n_logits = lg.shape[0]
        cdef int top_tok
        cdef CState c
        cdef WalkOut out
        cdef Trie t
        cdef const float* L = <const float*>lg.data
        if state.data.n_threads == 0:
            return -1, state
        if close_string:
            return self._best_closing(state, lg, pt)
        # fast path: the arg-max token alone
        top_tok = int(lg.argmax()) if n_logits else -1
        if 0 <= top_tok < pt.n_tokens:
            c = self._try_token(state, pt, top_tok)
            if c is not None:
                return top_tok, c
        self._ensure_bufs(pt.max_len + 2)
        out.mask = NULL
        out.logits = L
        out.n_logits = n_logits
        out.best = -1
        out.best_logit = 0
        t = self._offer_string_body(state, pt, &out)
        # the GIL stays held: the walk uses this grammar's shared scratch states
        walk_trie(&self.prog, &t, state.data, self.bufs, pt.max_len + 1, &out)
        if out.best < 0:
            return -1, state
        c = state.clone()
        if not c.feed(pt.pieces[out.best]):
            raise AssertionError("grammar: chosen token failed to feed (internal error)")
        return out.best, c

    cdef CState _try_token(self, CState state, PieceTable pt, int tok):
        """Clone the state and feed one piece (from the packed piece bytes); None if invalid."""
        cdef const int32_t[::1] offs = pt._piece_off
        cdef const int32_t[::1] lens = pt._piece_len
        cdef const uint8_t[::1] blob = pt._piece_bytes
        cdef int n = lens[tok]
        cdef int i
        cdef CState c
        cdef bint ok = True
        if n == 0:
            return None
        c = CState.__new__(CState)
        c.g = self
        copy_state(c.data, state.data)
        for i in range(n):
            if not feed_byte(&self.prog, c.data, blob[offs[tok] + i]):
                ok = False
                break
        return c if ok else None

    def _best_closing(self, CState state, lg, PieceTable pt):
        start = state.string_start()
        if start < 0:
            return -1, state
        mask = self.allowed_tokens(state, pt)
        ids = np.flatnonzero(mask[: len(lg)])
        if len(ids) == 0:
            return -1, state
        order = ids[np.argsort(-lg[ids], kind="stable")]
        for tok in order:
            piece = pt.pieces[int(tok)]
            if b'"' not in piece:
                continue
            c = state.clone()
            if c.feed(piece) and _left_string(c, start):
                return int(tok), c
        return -1, state


def _left_string(CState c, int start):
    cdef int i
    cdef Thread* th
    for i in range(c.data.n_threads):
        th = &c.data.threads[i]
        if th.depth > 0 and th.frames[th.depth - 1].kind == F_STRING and th.frames[th.depth - 1].aux == start:
            return False
    return True


def _class_trans(P, first):
    """The program's [states x program byte classes] table, from its per-automaton class
    tables: entry (s, g) = dfa_trans[dfa_row[s] + dfa_classes[dfa_cmap[s] + first[g]]]
    (the same table as Program.runtime_tables, built here in one C loop).  The offsets are
    checked first: the loop reads without bounds checks."""
    cdef const int32_t[::1] trans = np.ascontiguousarray(P.dfa_trans, dtype=np.int32)
    cdef const uint8_t[::1] classes = np.ascontiguousarray(P.dfa_classes, dtype=np.uint8)
    row_a = np.ascontiguousarray(P.dfa_row, dtype=np.int64)
    cmap_a = np.ascontiguousarray(P.dfa_cmap, dtype=np.int64)
    first_a = np.ascontiguousarray(first, dtype=np.int64)
    cdef Py_ssize_t n = len(row_a)
    cdef Py_ssize_t k = len(first_a)
    out_a = np.empty(max(n * k, 1), dtype=np.int32)
    if n == 0:
        out_a[0] = -1
        return out_a
    n_maps = len(classes) // 256
    if len(cmap_a) != n or n_maps == 0 or len(classes) != 256 * n_maps or \
            (cmap_a % 256 != 0).any() or cmap_a.min() < 0 or cmap_a.max() >= len(classes) or \
            first_a.min() < 0 or first_a.max() > 255:
        raise ValueError("grammar program: malformed automaton class maps")
    widest = np.asarray(classes).reshape(n_maps, 256).max(axis=1).astype(np.int64)
    if row_a.min() < 0 or (row_a + widest[cmap_a // 256]).max() >= len(trans):
        raise ValueError("grammar program: automaton rows out of range")
    cdef const int64_t[::1] row = row_a
    cdef const int64_t[::1] cmap = cmap_a
    cdef const int64_t[::1] fst = first_a
    cdef int32_t[::1] out = out_a
    cdef Py_ssize_t s, g
    cdef int64_t r, c
    cdef int32_t v
    cdef bint bad = False
    with nogil:
        for s in range(n):
            r = row[s]
            c = cmap[s]
            for g in range(k):
                v = trans[r + classes[c + fst[g]]]
                bad |= v < -1 or v >= n
                out[s * k + g] = v
    if bad:
        raise ValueError("grammar program: automaton transition to a missing state")
    return out_a


_PIECE_TABLES = {}


def _shared_constants():
    """The C values of the numbers ``needle_cy.grammar.limits`` holds for Python (the compiler
    and the reference): tests compare the two, so neither copy can drift."""
    return {
        "MAX_DEPTH": MAX_DEPTH, "MAX_AUX": MAX_AUX, "MAX_SLOTS": MAX_SLOTS, "NUM_BUF": NUM_BUF,
        "MAX_EVENTS": MAX_EVENTS,
        "F_VALUE": F_VALUE, "F_STRING": F_STRING, "F_KEY": F_KEY, "F_NUMBER": F_NUMBER,
        "F_LITERAL": F_LITERAL, "F_ARRAY": F_ARRAY, "F_OBJECT": F_OBJECT, "F_ONEOF": F_ONEOF,
        "F_CALLS": F_CALLS, "F_MARK": F_MARK,
        "A_START": A_START, "A_ITEM": A_ITEM, "A_NEXT": A_NEXT,
        "O_START": O_START, "O_COLON": O_COLON, "O_VALUE": O_VALUE, "O_AFTER": O_AFTER, "O_NEXT": O_NEXT,
        "C_OPEN": C_OPEN, "C_FIRST": C_FIRST, "C_HEAD": C_HEAD, "C_NAME": C_NAME, "C_MID": C_MID,
        "C_ARGS": C_ARGS, "C_CLOSE": C_CLOSE, "C_AFTER": C_AFTER, "C_NEXT": C_NEXT,
        "N_START": N_START, "N_MINUS": N_MINUS, "N_ZERO": N_ZERO, "N_INT": N_INT, "N_DOT": N_DOT,
        "N_FRAC": N_FRAC, "N_EXP": N_EXP, "N_EXPSIGN": N_EXPSIGN, "N_EXPDIG": N_EXPDIG,
        "T_NULL": T_NULL, "T_TRUE": T_TRUE, "T_FALSE": T_FALSE, "T_INT": T_INT, "T_NUM": T_NUM,
        "T_STR": T_STR, "T_ARR": T_ARR, "T_OBJ": T_OBJ,
        "NODE_CHOICE": NODE_CHOICE, "NEVER_NODE": NEVER_NODE,
        "CALL_HEAD": CALL_HEAD[:CALL_HEAD_LEN], "CALL_MID": CALL_MID[:CALL_MID_LEN],
        "S_BITS": [start_bit(b) for b in range(256)],
    }
