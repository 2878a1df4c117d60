"""The numbers the compiler, the C runtime (``_runtime.pxd``/``.pyx``) and the Python reference
runtime (``needle_cy.reference.grammar``) share: capacities, type bits, node kinds, first-byte
classes, frame kinds and phases.  This is the only Python copy; ``_runtime`` declares the same
values in C and ``tests/test_grammar_layout.py`` checks that the two agree.

A leaf module: it imports nothing from the package, so the reference can import it without
importing the compiler's import graph back into itself."""
from __future__ import annotations

# ----------------------------------------------------------------------------
# capacities (_runtime.pxd declares the same numbers in C)
MAX_DEPTH = 40          # frames per thread
MAX_AUX = 160           # uint64 words per thread (seen-key bitsets, hashes)
MAX_SLOTS = 32          # threads (parallel anyOf/oneOf alternatives) alive within one byte
NUM_BUF = 40            # bytes of one number's text
MAX_NUM_EXP = 10 ** 6   # orders of magnitude of bounds/multipleOf (number liveness saturates past them)
MAX_EVENTS = 8          # oneOf completions one thread may record within one byte
MAX_DFA_STATES = 20000  # per compiled DFA
MAX_TOOLS = 64
MAX_NODES = 2000        # compiled nodes per schema
COMPILE_BUDGET_S = 10.0 # wall-clock safety valve for pathological schemas

# type bits
T_NULL, T_TRUE, T_FALSE, T_INT, T_NUM, T_STR, T_ARR, T_OBJ = 1, 2, 4, 8, 16, 32, 64, 128
T_BOOL = T_TRUE | T_FALSE
T_ALL = 255
TYPE_BITS = {"null": T_NULL, "boolean": T_BOOL, "integer": T_INT, "number": T_INT | T_NUM,
             "string": T_STR, "array": T_ARR, "object": T_OBJ}

NODE_VALUE, NODE_CHOICE = 0, 1
# first-byte classes of a value (for skipping alternatives that cannot start with a byte)
S_STR, S_NUM, S_TRUE, S_FALSE, S_NULL, S_ARR, S_OBJ = 1, 2, 4, 8, 16, 32, 64


def start_bit(b):
    if b == 0x22:
        return S_STR
    if b == 0x2D or 0x30 <= b <= 0x39:
        return S_NUM
    return {0x74: S_TRUE, 0x66: S_FALSE, 0x6E: S_NULL, 0x5B: S_ARR, 0x7B: S_OBJ}.get(b, 0)


def _type_starts(types):
    s = 0
    if types & T_STR:
        s |= S_STR
    if types & (T_INT | T_NUM):
        s |= S_NUM
    if types & T_TRUE:
        s |= S_TRUE
    if types & T_FALSE:
        s |= S_FALSE
    if types & T_NULL:
        s |= S_NULL
    if types & T_ARR:
        s |= S_ARR
    if types & T_OBJ:
        s |= S_OBJ
    return s


# every program's first two nodes: the true schema and the false schema
ANY_NODE, NEVER_NODE = 0, 1

# counts (lengths, items, properties) are int32 at run time: a maximum above COUNT_CAP is read
# as COUNT_CAP (nothing longer can be read anyway) and a minimum above it makes the type
# impossible -- refusing, never accepting, what the schema forbids
COUNT_CAP = 2 ** 31 - 2


# ----------------------------------------------------------------------------
# runtime codes (the reference and the C runtime read programs with these)
# frame kinds
F_VALUE, F_STRING, F_KEY, F_NUMBER, F_LITERAL, F_ARRAY, F_OBJECT, F_ONEOF, F_CALLS, F_MARK = range(10)
# array phases
A_START, A_ITEM, A_NEXT = 0, 1, 2
# object phases
O_START, O_COLON, O_VALUE, O_AFTER, O_NEXT = 0, 1, 2, 3, 4
# tool-call phases
C_OPEN, C_FIRST, C_HEAD, C_NAME, C_MID, C_ARGS, C_CLOSE, C_AFTER, C_NEXT = range(9)
CALL_HEAD = b'{"name":"'
CALL_MID = b'","arguments":'
# number syntax phases; accepting: 2, 3, 5, 8
N_START, N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_EXP, N_EXPSIGN, N_EXPDIG = range(9)
