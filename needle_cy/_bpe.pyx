# cython: language_level=3
"""Priority-queue BPE encoder (spec §6.2); its literal twin is ``needle_cy.reference.bpe``.

One encode call:
  1. copy the text into a UCS4 array, spaces → "▁", optional dummy "▁" in front;
  2. scan for USER_DEFINED markers (longest first, ties in id order); text between
     markers is a segment.  In text mode (``allowed`` given) only the allowed markers are
     matched, and no symbol may become a piece that text must not produce (a marker, a
     CONTROL or UNKNOWN piece, a ``<0xHH>`` piece): such a merge is never pushed and such
     a single character is a non-piece (byte fallback), so a marker's spelling stays
     ordinary pieces and ``decode`` gives back the text;
  3. BPE each segment: symbols are a doubly linked list over the segment's code points;
     every adjacent pair whose concatenation is a piece goes into a binary max-heap keyed
     by (score, -left position); the top pair is merged if it is still current (lazy
     invalidation: symbols are contiguous runs of the text, so an entry is current iff the
     pair at its left position still spans exactly its piece's length), then the two new
     neighbouring pairs are pushed.  O(n log n) per segment;
  4. map each final symbol to its id, or its UTF-8 bytes' ``<0xHH>`` ids (byte fallback),
     or unk.

Pair lookups use a hash table from (left key, right key) to the merged piece id,
built once per vocabulary.  A symbol's key is its piece id, or NOT_A_PIECE | code point
for a single character that is no piece (only single characters can be non-pieces:
every merge produces a piece).

Segment splitting: when no piece contains "▁" after its first character, no merge can
cross the boundary in front of a "▁", so each such chunk is merged on its own.  This
gives exactly the same result as one heap over the whole segment (merges in different
chunks never interact, and the heap order restricted to one chunk is unchanged) while
keeping the heap small.
"""
from libc.stdint cimport int32_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memset
from cpython.unicode cimport PyUnicode_GET_LENGTH

cdef extern from "Python.h":
    int PyUnicode_KIND(object o)
    void* PyUnicode_DATA(object o)
    uint32_t PyUnicode_READ(int kind, void* data, Py_ssize_t index) nogil

cdef uint32_t NOT_A_PIECE = 0x80000000u   # key flag: a single character that is no piece
cdef uint32_t DEAD = 0xFFFFFFFFu          # key of a symbol merged into its left neighbour
cdef uint32_t META_SPACE = 0x2581         # "▁"
cdef Py_ssize_t BMP = 0x10000             # code points below this use the direct table

cdef uint64_t EMPTY_KEY = 0xFFFFFFFFFFFFFFFFULL  # no (left, right) key can be all ones

cdef struct HashTable:     # open addressing, linear probing; keys and values apart so a probe
    uint64_t* keys         # walks 8-byte keys only
    int32_t* values
    uint64_t mask
    int shift              # Fibonacci hashing: slot = (key * golden) >> shift

cdef struct Symbol:
    uint32_t key           # piece id, NOT_A_PIECE | code point, or DEAD once merged away
    int32_t prev
    int32_t next

cdef struct Candidate:     # 12 bytes: the heap is the hot memory on long segments
    float score
    int32_t left           # original position of the left symbol
    int32_t merged         # the piece the pair forms; its length validates the entry

cdef struct Workspace:     # per-call scratch, grown on demand (encode is re-entrant)
    Symbol* symbols
    Candidate* heap
    Py_ssize_t capacity    # symbols; the heap holds 3× (n-1 initial pairs + 2 per merge)
    int32_t* out
    Py_ssize_t out_len
    Py_ssize_t out_cap
    bint failed
    bint text_only         # no symbol may become a piece of ``BPEEncoder.not_text``


cdef inline int32_t _lookup(const HashTable* table, uint64_t key) noexcept nogil:
    cdef uint64_t slot = (key * 0x9E3779B97F4A7C15ULL) >> table.shift
    cdef uint64_t found
    while True:
        found = table.keys[slot]
        if found == key:
            return table.values[slot]
        if found == EMPTY_KEY:
            return -1
        slot = (slot + 1) & table.mask


cdef inline bint _better(const Candidate* a, const Candidate* b) noexcept nogil:
    # Higher score first; equal scores → the leftmost pair (smaller original position).
    return a.score > b.score or (a.score == b.score and a.left < b.left)


cdef inline void _heap_push(Candidate* heap, Py_ssize_t* size, Candidate c) noexcept nogil:
    cdef Py_ssize_t i = size[0], parent
    size[0] += 1
    while i > 0:
        parent = (i - 1) >> 1
        if not _better(&c, &heap[parent]):
            break
        heap[i] = heap[parent]
        i = parent
    heap[i] = c


cdef inline Candidate _heap_pop(Candidate* heap, Py_ssize_t* size) noexcept nogil:
    cdef Candidate top = heap[0]
    cdef Py_ssize_t n = size[0] - 1, i = 0, child
    cdef Candidate last = heap[n]
    size[0] = n
    while True:
        child = 2 * i + 1
        if child >= n:
            break
        if child + 1 < n and _better(&heap[child + 1], &heap[child]):
            child += 1
        if not _better(&heap[child], &last):
            break
        heap[i] = heap[child]
        i = child
    if n > 0:
        heap[i] = last
    return top


cdef class BPEEncoder:
    """Encoder state for one vocabulary: pair table, character table, markers, byte ids."""

    cdef HashTable pairs            # (left key << 32 | right key) → merged piece id
    cdef HashTable astral_chars     # code points ≥ 0x10000 → piece id
    cdef int32_t* piece_len         # surface length in code points
    cdef int32_t* bmp_chars         # code point < 0x10000 → piece id or -1
    cdef float* scores
    cdef unsigned char* not_text    # per piece: 1 = text mode never produces it by a merge
    cdef int32_t byte_ids[256]
    cdef int32_t unk_id
    cdef bint byte_fallback
    cdef bint split_before_space
    cdef Py_ssize_t n_pieces
    # Markers in match order, code points concatenated.
    cdef int n_markers
    cdef uint32_t* marker_cps
    cdef Py_ssize_t* marker_start
    cdef Py_ssize_t* marker_len
    cdef int32_t* marker_id
    cdef unsigned char marker_first_ascii[128]
    cdef bint marker_nonascii_first

    def __cinit__(self):
        self.pairs.keys = NULL
        self.pairs.values = NULL
        self.astral_chars.keys = NULL
        self.astral_chars.values = NULL
        self.piece_len = NULL
        self.bmp_chars = NULL
        self.scores = NULL
        self.not_text = NULL
        self.marker_cps = NULL
        self.marker_start = NULL
        self.marker_len = NULL
        self.marker_id = NULL
        self.n_markers = 0

    def __init__(self, pieces, scores, types, int unk_id, bint byte_fallback, byte_ids):
        """``pieces``/``scores``/``types`` in id order (already validated by the record parser)."""
        cdef Py_ssize_t n = len(pieces), i, k
        if not (len(scores) == n and len(types) == n and len(byte_ids) == 256):
            raise ValueError("pieces, scores, types must have one entry per piece; byte_ids 256")
        if n >= <Py_ssize_t>NOT_A_PIECE:
            raise ValueError(f"{n} pieces exceed the encoder's id space")
        if not 0 <= unk_id < n:
            raise ValueError(f"unk_id {unk_id} out of range")
        self.n_pieces = n
        self.unk_id = unk_id
        self.byte_fallback = byte_fallback
        for i in range(256):
            self.byte_ids[i] = byte_ids[i]

        self.scores = <float*>malloc(max(n, 1) * sizeof(float))
        self.piece_len = <int32_t*>malloc(max(n, 1) * sizeof(int32_t))
        self.bmp_chars = <int32_t*>malloc(BMP * sizeof(int32_t))
        self.not_text = <unsigned char*>malloc(max(n, 1))
        if self.scores == NULL or self.piece_len == NULL or self.bmp_chars == NULL or self.not_text == NULL:
            raise MemoryError()
        for i in range(n):
            self.scores[i] = scores[i]
            self.piece_len[i] = len(pieces[i])
            # UNKNOWN 1, CONTROL 2, USER_DEFINED 3, BYTE 4: ids that stand for something other
            # than their surface, so text mode never forms them from the surface.
            self.not_text[i] = 1 if 1 <= types[i] <= 4 else 0
        for i in range(BMP):
            self.bmp_chars[i] = -1

        # Surface → id over all types; a duplicated surface keeps the highest id (§6.2 step 6).
        surface_id = {}
        for i in range(n):
            surface_id[pieces[i]] = i

        astral = {}
        self.split_before_space = True
        for surface, i in surface_id.items():
            if len(surface) == 1:
                if ord(surface) < BMP:
                    self.bmp_chars[ord(surface)] = i
                else:
                    astral[ord(surface)] = i
        for surface in pieces:
            if "\u2581" in surface[1:]:
                self.split_before_space = False

        def symbol_keys(part):
            # The keys a symbol with this surface can carry: its piece id, and for a single
            # character that is no piece, or one text mode keeps from becoming its piece,
            # NOT_A_PIECE | code point.
            piece_id = surface_id.get(part)
            keys = [] if piece_id is None else [piece_id]
            if len(part) == 1 and (piece_id is None or 1 <= types[piece_id] <= 4):
                keys.append(NOT_A_PIECE | ord(part))
            return keys

        pair_table = {}
        for surface, i in surface_id.items():
            for k in range(1, len(surface)):
                for left in symbol_keys(surface[:k]):
                    for right in symbol_keys(surface[k:]):
                        pair_table[(<uint64_t>left << 32) | <uint64_t>right] = i
        self._build_hash(pair_table, &self.pairs)
        self._build_hash(astral, &self.astral_chars)

        markers = sorted(((surface, i) for i, (surface, t) in enumerate(zip(pieces, types)) if t == 3),
                         key=lambda m: (-len(m[0]), m[1]))
        self.n_markers = len(markers)
        total = sum(len(m[0]) for m in markers)
        self.marker_cps = <uint32_t*>malloc(max(total, 1) * sizeof(uint32_t))
        self.marker_start = <Py_ssize_t*>malloc(max(self.n_markers, 1) * sizeof(Py_ssize_t))
        self.marker_len = <Py_ssize_t*>malloc(max(self.n_markers, 1) * sizeof(Py_ssize_t))
        self.marker_id = <int32_t*>malloc(max(self.n_markers, 1) * sizeof(int32_t))
        if not (self.marker_cps and self.marker_start and self.marker_len and self.marker_id):
            raise MemoryError()
        memset(self.marker_first_ascii, 0, 128)
        self.marker_nonascii_first = False
        k = 0
        for i, (surface, piece_id) in enumerate(markers):
            self.marker_start[i] = k
            self.marker_len[i] = len(surface)
            self.marker_id[i] = piece_id
            # Markers are matched in the escaped string (spaces already "▁"), so a stored
            # surface containing " " never fires, exactly as in the reference.
            for ch in surface:
                self.marker_cps[k] = ord(ch)
                k += 1
            first = ord(surface[0])
            if first < 128:
                self.marker_first_ascii[first] = 1
            else:
                self.marker_nonascii_first = True

    cdef int _build_hash(self, dict table, HashTable* out) except -1:
        cdef uint64_t cap = 16, slot, key
        cdef int bits = 4
        while cap < 2 * <uint64_t>len(table) + 16:
            cap <<= 1
            bits += 1
        out.keys = <uint64_t*>malloc(cap * sizeof(uint64_t))
        out.values = <int32_t*>malloc(cap * sizeof(int32_t))
        if out.keys == NULL or out.values == NULL:
            raise MemoryError()
        for slot in range(cap):
            out.keys[slot] = EMPTY_KEY
            out.values[slot] = -1
        out.mask = cap - 1
        out.shift = 64 - bits
        for py_key, value in table.items():
            key = <uint64_t>py_key
            slot = (key * 0x9E3779B97F4A7C15ULL) >> out.shift
            while out.keys[slot] != EMPTY_KEY:
                slot = (slot + 1) & out.mask
            out.keys[slot] = key
            out.values[slot] = value
        return 0

    def __dealloc__(self):
        free(self.pairs.keys)
        free(self.pairs.values)
        free(self.astral_chars.keys)
        free(self.astral_chars.values)
        free(self.piece_len)
        free(self.bmp_chars)
        free(self.scores)
        free(self.not_text)
        free(self.marker_cps)
        free(self.marker_start)
        free(self.marker_len)
        free(self.marker_id)

    @property
    def split_before_space(self):
        """True when segments are cut into independent chunks in front of every "▁"."""
        return self.split_before_space

    cdef inline uint32_t _char_key(self, uint32_t cp, bint text_only) noexcept nogil:
        cdef int32_t piece_id
        if cp < BMP:
            piece_id = self.bmp_chars[cp]
        else:
            piece_id = _lookup(&self.astral_chars, cp)
        if piece_id >= 0 and not (text_only and self.not_text[piece_id]):
            return <uint32_t>piece_id
        return NOT_A_PIECE | cp

    cdef inline bint _emit(self, Workspace* ws, int32_t piece_id) noexcept nogil:
        cdef Py_ssize_t cap
        cdef int32_t* grown
        if ws.out_len == ws.out_cap:
            cap = ws.out_cap * 2 + 64
            grown = <int32_t*>realloc(ws.out, cap * sizeof(int32_t))
            if grown == NULL:
                ws.failed = True
                return False
            ws.out = grown
            ws.out_cap = cap
        ws.out[ws.out_len] = piece_id
        ws.out_len += 1
        return True

    cdef inline void _emit_symbol(self, Workspace* ws, uint32_t key) noexcept nogil:
        cdef uint32_t cp
        cdef unsigned char utf8[4]
        cdef int n_bytes, b
        cdef int32_t byte_id
        if key < NOT_A_PIECE:
            self._emit(ws, <int32_t>key)
            return
        if not self.byte_fallback:
            self._emit(ws, self.unk_id)
            return
        cp = key & 0x1FFFFF
        if cp < 0x80:
            utf8[0] = cp
            n_bytes = 1
        elif cp < 0x800:
            utf8[0] = 0xC0 | (cp >> 6)
            utf8[1] = 0x80 | (cp & 0x3F)
            n_bytes = 2
        elif cp < 0x10000:
            utf8[0] = 0xE0 | (cp >> 12)
            utf8[1] = 0x80 | ((cp >> 6) & 0x3F)
            utf8[2] = 0x80 | (cp & 0x3F)
            n_bytes = 3
        else:
            utf8[0] = 0xF0 | (cp >> 18)
            utf8[1] = 0x80 | ((cp >> 12) & 0x3F)
            utf8[2] = 0x80 | ((cp >> 6) & 0x3F)
            utf8[3] = 0x80 | (cp & 0x3F)
            n_bytes = 4
        for b in range(n_bytes):
            byte_id = self.byte_ids[utf8[b]]
            # A missing <0xHH> piece: unk for that byte (spec §6.2 step 7, recommended).
            self._emit(ws, byte_id if byte_id >= 0 else self.unk_id)

    cdef inline void _push_pair(self, Workspace* ws, Py_ssize_t* heap_size,
                                int32_t left, int32_t right) noexcept nogil:
        cdef int32_t merged = _lookup(&self.pairs, (<uint64_t>ws.symbols[left].key << 32)
                                      | ws.symbols[right].key)
        cdef Candidate c
        if merged >= 0 and not (ws.text_only and self.not_text[merged]):
            c.score = self.scores[merged]
            c.left = left
            c.merged = merged
            _heap_push(ws.heap, heap_size, c)

    cdef bint _reserve(self, Workspace* ws, Py_ssize_t n) noexcept nogil:
        cdef Symbol* symbols
        cdef Candidate* heap
        if n <= ws.capacity:
            return True
        symbols = <Symbol*>realloc(ws.symbols, n * sizeof(Symbol))
        if symbols == NULL:
            return False
        ws.symbols = symbols
        heap = <Candidate*>realloc(ws.heap, 3 * n * sizeof(Candidate))
        if heap == NULL:
            return False
        ws.heap = heap
        ws.capacity = n
        return True

    cdef void _bpe_chunk(self, Workspace* ws, const uint32_t* cps, Py_ssize_t n) noexcept nogil:
        """Merge one chunk of ``n`` code points and emit its ids."""
        cdef Py_ssize_t i, heap_size = 0
        cdef int32_t left, right, after, end
        cdef Candidate c
        cdef Symbol* symbols
        if n == 1:  # the common one-character chunk needs no heap
            self._emit_symbol(ws, self._char_key(cps[0], ws.text_only))
            return
        if not self._reserve(ws, n):
            ws.failed = True
            return
        symbols = ws.symbols
        for i in range(n):
            symbols[i].key = self._char_key(cps[i], ws.text_only)
            symbols[i].prev = <int32_t>(i - 1)
            symbols[i].next = <int32_t>(i + 1) if i + 1 < n else -1
        for i in range(n - 1):
            self._push_pair(ws, &heap_size, <int32_t>i, <int32_t>(i + 1))
        while heap_size > 0:
            c = _heap_pop(ws.heap, &heap_size)
            left = c.left
            # Lazy invalidation.  Symbols are contiguous runs of the text, so the pair at
            # ``left`` still forms ``merged`` iff it spans exactly that piece's length (same
            # text → same concatenation).  Otherwise one side changed since the push.
            if symbols[left].key == DEAD:
                continue
            right = symbols[left].next
            if right < 0:
                continue
            end = symbols[right].next
            if end < 0:
                end = <int32_t>n
            if end - left != self.piece_len[c.merged]:
                continue
            after = symbols[right].next
            symbols[left].key = <uint32_t>c.merged
            symbols[left].next = after
            symbols[right].key = DEAD
            if after >= 0:
                symbols[after].prev = left
                self._push_pair(ws, &heap_size, left, after)
            if symbols[left].prev >= 0:
                self._push_pair(ws, &heap_size, symbols[left].prev, left)
        i = 0
        while i >= 0:
            self._emit_symbol(ws, symbols[i].key)
            i = symbols[i].next

    cdef void _bpe_segment(self, Workspace* ws, const uint32_t* cps, Py_ssize_t n) noexcept nogil:
        cdef Py_ssize_t start = 0, i
        if n == 0:
            return
        if not self.split_before_space:
            self._bpe_chunk(ws, cps, n)
            return
        for i in range(1, n):
            if cps[i] == META_SPACE:
                self._bpe_chunk(ws, cps + start, i - start)
                start = i
        self._bpe_chunk(ws, cps + start, n - start)

    cdef inline int _marker_at(self, const uint32_t* cps, Py_ssize_t pos, Py_ssize_t n,
                               const unsigned char* allow) noexcept nogil:
        """Index (match order) of the first marker matching at ``pos``, or -1; with
        ``allow`` (per marker in match order) only the allowed markers."""
        cdef uint32_t cp = cps[pos]
        cdef int m
        cdef Py_ssize_t j, length, start
        if cp < 128:
            if not self.marker_first_ascii[cp]:
                return -1
        elif not self.marker_nonascii_first:
            return -1
        for m in range(self.n_markers):
            if allow != NULL and not allow[m]:
                continue
            length = self.marker_len[m]
            if length > n - pos:
                continue
            start = self.marker_start[m]
            for j in range(length):
                if cps[pos + j] != self.marker_cps[start + j]:
                    break
            else:
                return m
        return -1

    def encode(self, str text, bint dummy_prefix, allowed=None):
        """Ids of ``text``; ``dummy_prefix`` = prepend "▁" (already combined with the vocabulary flag).

        ``allowed=None``: spec §6.2 as written (every marker matched, any piece may form).
        Otherwise text mode: ``allowed`` is a collection of marker ids that are matched;
        every other marker spelling, and the surface of any CONTROL, UNKNOWN or BYTE
        piece, is encoded as ordinary pieces or byte fallback."""
        cdef Py_ssize_t length = PyUnicode_GET_LENGTH(text)
        cdef Py_ssize_t n, i, offset, seg_start, pos
        cdef int kind
        cdef void* data
        cdef uint32_t cp
        cdef uint32_t* cps
        cdef int m
        cdef Workspace ws
        cdef Py_ssize_t bad = -1
        cdef unsigned char* allow = NULL
        cdef bint match_markers = self.n_markers > 0
        if length == 0:
            return []
        if length >= 0x7FFFFFF0:  # symbol links are int32
            raise ValueError(f"text of {length} characters is too long to encode (limit 2**31 - 16)")
        ws.text_only = allowed is not None
        if ws.text_only:
            match_markers = False
            if allowed and self.n_markers:
                allowed_ids = set(allowed)
                allow = <unsigned char*>malloc(self.n_markers)
                if allow == NULL:
                    raise MemoryError()
                for m in range(self.n_markers):
                    allow[m] = self.marker_id[m] in allowed_ids
                    if allow[m]:
                        match_markers = True
        offset = 1 if dummy_prefix else 0
        n = length + offset
        cps = <uint32_t*>malloc(n * sizeof(uint32_t))
        if cps == NULL:
            free(allow)
            raise MemoryError()
        kind = PyUnicode_KIND(text)
        data = PyUnicode_DATA(text)
        ws.symbols = NULL
        ws.heap = NULL
        ws.capacity = 0
        ws.out_cap = n + 16
        ws.out_len = 0
        ws.out = <int32_t*>malloc(ws.out_cap * sizeof(int32_t))
        ws.failed = ws.out == NULL
        try:
            if ws.failed:
                raise MemoryError()
            with nogil:
                if dummy_prefix:
                    cps[0] = META_SPACE
                for i in range(length):
                    cp = PyUnicode_READ(kind, data, i)
                    if cp == 0x20:
                        cp = META_SPACE
                    elif 0xD800 <= cp <= 0xDFFF:
                        bad = i
                        break
                    cps[i + offset] = cp
                if bad < 0:
                    seg_start = 0
                    pos = 0
                    while match_markers and pos < n:
                        m = self._marker_at(cps, pos, n, allow)
                        if m >= 0:
                            self._bpe_segment(&ws, cps + seg_start, pos - seg_start)
                            self._emit(&ws, self.marker_id[m])
                            pos += self.marker_len[m]
                            seg_start = pos
                        else:
                            pos += 1
                    self._bpe_segment(&ws, cps + seg_start, n - seg_start)
            if bad >= 0:
                raise ValueError(f"text contains a lone surrogate U+{ord(text[bad]):04X} at index {bad}")
            if ws.failed:
                raise MemoryError()
            return [ws.out[i] for i in range(ws.out_len)]
        finally:
            free(cps)
            free(allow)
            free(ws.symbols)
            free(ws.heap)
            free(ws.out)
