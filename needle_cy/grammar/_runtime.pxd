# cython: language_level=3
"""C types of the grammar runtime: the compiled program, frames, threads, states.

A grammar *state* is a set of threads (parallel alternatives of anyOf/oneOf);
a thread is a fixed-capacity contiguous stack of ``Frame`` structs plus an
``aux`` word stack (seen-key bitsets, key and item hashes) and the text of the
number being read.  Everything is plain C data, so cloning a state is a few
``memcpy`` of the live parts.  The pure-Python twin is ``needle_cy.reference.grammar``.
"""
from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t

# capacities (needle_cy.grammar.limits holds the same numbers for Python; a test compares them)
cdef enum:
    MAX_DEPTH = 40
    MAX_AUX = 160
    MAX_SLOTS = 32
    NUM_BUF = 40
    MAX_EVENTS = 8


cdef struct Frame:
    int32_t kind        # F_VALUE, F_STRING, F_KEY, F_NUMBER, F_LITERAL, F_ARRAY, F_OBJECT, F_ONEOF, F_CALLS, F_MARK
    int32_t node        # compiled node
    int32_t phase       # per kind: container phase / number syntax phase
    int32_t count       # code points, items, properties, calls, literal position
    int32_t dfa         # DFA state (-1: none)
    int32_t aux         # container: base of its aux words; string: start position; oneOf: start
    int32_t x           # string escape/UTF-8 state; object: value node of the current key; ...
    int32_t y           # string: continuation range / \u accumulator; calls: tool label; array: contains count
    uint64_t h          # running hash (string bytes, array items, object members); calls: used tools
    uint64_t k          # object: hash of the current key; string: pending high surrogate


cdef struct Thread:
    int32_t depth
    int32_t aux_top
    int32_t num_len
    int32_t n_events
    uint64_t last_hash
    int32_t events[MAX_EVENTS * 4]   # (oneOf node, alternative, start position, depth)
    uint8_t num[NUM_BUF]
    Frame frames[MAX_DEPTH]
    uint64_t aux[MAX_AUX]


cdef struct StateData:
    int32_t n_threads
    int64_t pos
    Thread threads[MAX_SLOTS]


cdef struct Prog:
    const int32_t* kind
    const int32_t* types
    const int32_t* starts
    const int32_t* str_min
    const int32_t* str_max
    const int32_t* str_dfa
    const int32_t* num_dfa
    const int32_t* num_check
    const int32_t* int_flags
    const int64_t* int_lo
    const int64_t* int_hi
    const int32_t* arr_prefix_off
    const int32_t* arr_prefix_n
    const int32_t* arr_items
    const int32_t* arr_min
    const int32_t* arr_max
    const int32_t* arr_unique
    const int32_t* arr_cmin        # contains: matching items needed (0: none) ...
    const int32_t* arr_cmax        # ... and allowed (-1: any number)
    const int32_t* alt_mark        # choice: the alternative whose value counts for contains (-1 none)
    const int32_t* obj_key_dfa
    const int32_t* obj_nwords
    const int32_t* obj_req_off
    const int32_t* obj_min
    const int32_t* obj_max
    const int32_t* obj_dep_off     # dependencies of an object: dep_pool pairs (property, words offset)
    const int32_t* obj_dep_n
    const int32_t* dep_pool
    const int32_t* alt_off
    const int32_t* alt_n
    const int32_t* oneof
    const int32_t* prefix_pool
    const int32_t* alt_pool
    const uint64_t* words
    const int32_t* cls_prop
    const int32_t* cls_node
    # automata over byte classes (bytes no automaton of the program tells apart share a
    # class): next(st, b) = class_trans[st * n_classes + byte_class[b]]; use dfa_next()
    const int32_t* class_trans
    const uint8_t* byte_class
    int64_t n_classes
    const int32_t* accept
    const int32_t* reach_off
    const uint8_t* other
    # exact number checks: flags bit0 lo, bit1 lo exclusive, bit2 hi, bit3 hi exclusive, bit4 multipleOf
    const int32_t* nc_flags
    const int32_t* nc_lo        # per check: neg, exp, digit offset, digit count
    const int32_t* nc_hi
    const uint64_t* nc_mult
    const int32_t* nc_mult_exp
    const char* digit_pool
    const int32_t* tool_nodes
    int32_t tools_mode
    int32_t max_calls
    int32_t tool_dfa
    int32_t root


cdef bint feed_byte(const Prog* p, StateData* s, int b) noexcept nogil
cdef void copy_state(StateData* dst, const StateData* src) noexcept nogil
cdef bint state_complete(const Prog* p, const StateData* s, StateData* scratch) noexcept nogil
