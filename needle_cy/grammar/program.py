"""The compiled program: a table of nodes, pools and bitsets, and an arena of byte automata;
the runtime tables derived from it; and linking compiled programs into one (tool sets).

Both runtimes read a ``Program``: ``_runtime.CGrammar`` copies it into C arrays,
``needle_cy.reference.grammar`` reads its Python lists (``pylists``)."""
from __future__ import annotations

import numpy as np

from .automata import _col_weights, _compress
from .limits import NODE_CHOICE, NODE_VALUE, _type_starts


class Program:
    """The compiled grammar program (plain Python lists; numpy views made on demand)."""

    def __init__(self):
        # nodes
        self.kind = []
        self.types = []
        self.str_min = []
        self.str_max = []
        self.str_dfa = []
        self.num_dfa = []
        self.num_check = []
        self.int_lo = []
        self.int_hi = []
        self.int_flags = []   # 1: lo present, 2: hi present
        self.arr_prefix_off = []
        self.arr_prefix_n = []
        self.arr_items = []
        self.arr_min = []
        self.arr_max = []
        self.arr_unique = []
        self.arr_cmin = []      # contains: items that must match (0: no contains), and at most
        self.arr_cmax = []      # (-1: no bound); counted through the items' marking alternatives
        self.obj_key_dfa = []
        self.obj_nwords = []
        self.obj_req_off = []
        self.obj_min = []
        self.obj_max = []
        self.obj_other_ok = []  # 1 when keys outside the declared set can be valid
        self.obj_dep_off = []   # dependencies: pairs (property index, words offset of its required set)
        self.obj_dep_n = []
        self.alt_off = []
        self.alt_n = []
        self.oneof = []
        self.alt_mark = []      # choice node: the alternative whose value counts for contains (-1 none)
        # pools
        self.prefix_pool = []
        self.alt_pool = []
        self.dep_pool = []
        self.words = []        # uint64 words: required bitsets, reach bitsets
        # key classes (for key DFAs): class -> (prop index or -1, value node)
        self.cls_prop = []
        self.cls_node = []
        # DFA arena (the linkable form): per automaton a byte-class map (256 bytes in
        # dfa_classes) and a table [states, classes] of global target states (-1 none) in
        # dfa_trans; per state the offsets of its row and of its automaton's class map:
        #     next(st, b) = dfa_trans[dfa_row[st] + dfa_classes[dfa_cmap[st] + b]]
        # The runtimes read runtime_tables(): one class map for the whole program.
        self.dfa_trans = []    # list of int32 arrays while compiling, one array after finish()
        self.dfa_classes = []  # list of uint8[256] while compiling, one array after finish()
        self.dfa_row = []
        self.dfa_cmap = []
        self.n_trans = 0       # entries in dfa_trans
        self.n_classes = 0     # bytes in dfa_classes
        self.accept = []       # per state label: -1 reject, else >= 0 (key DFA: class id)
        self.label_is_class = []  # per state: 1 when its label is a key class id (relocated by link)
        self.reach_off = []    # per state: offset into words of reachable-prop bitset (-1 none)
        self.other = []        # per state: 1 if some non-declared valid key is reachable
        # number checks: list of dicts (lo, lo_excl, hi, hi_excl, mult) of normalised decimals
        self.num_checks = []
        # tool-call outer language
        self.tools_mode = 0
        self.max_calls = 0
        self.tool_dfa = -1
        self.tool_nodes = []
        self.tool_names = []
        self.root = 0
        self.n_props_words = 0
        self.starts = None

    def add_dfa(self, dfa, reach=None, other=None):
        """Append an automaton (byte-class compressed); returns the global id of its state 0.
        ``reach``/``other``: per state, for key automata (labels are then key class ids)."""
        base = len(self.accept)
        cmap, table = _compress(dfa)
        n, k = table.shape
        self.dfa_trans.append(np.where(table >= 0, table + base, -1).astype(np.int32).reshape(-1))
        self.dfa_classes.append(cmap)
        self.dfa_row.extend(range(self.n_trans, self.n_trans + n * k, k))
        self.dfa_cmap.extend([self.n_classes] * n)
        self.n_trans += n * k
        self.n_classes += 256
        self.accept.extend(dfa.accept.tolist())
        if reach is not None:
            off = len(self.words)
            nw = len(reach[0]) if n else 0
            for r in reach:
                self.words.extend(r)
            self.reach_off.extend(range(off, off + n * nw, nw))
            self.other.extend(other)
        else:
            self.reach_off.extend([-1] * n)
            self.other.extend([0] * n)
        self.label_is_class.extend([1 if reach is not None else 0] * n)
        return base

    @property
    def n_nodes(self):
        return len(self.kind)

    def finish(self):
        """Derived tables: first-byte classes per node (choices: union over alternatives)."""
        if isinstance(self.dfa_trans, list):
            self.dfa_trans = np.concatenate(self.dfa_trans) if self.dfa_trans else np.zeros(0, np.int32)
            self.dfa_classes = np.concatenate(self.dfa_classes) if self.dfa_classes else np.zeros(0, np.uint8)
        self._trans_py = None
        self._rt = self._bc = None
        if self.starts is not None:   # linked programs carry their fragments' starts
            return self
        n = len(self.kind)
        starts = [_type_starts(self.types[i]) if self.kind[i] == NODE_VALUE else 0 for i in range(n)]
        changed = any(k == NODE_CHOICE for k in self.kind)
        while changed:
            changed = False
            for i in range(n):
                if self.kind[i] == NODE_CHOICE:
                    s = 0
                    for j in range(self.alt_n[i]):
                        s |= starts[self.alt_pool[self.alt_off[i] + j]]
                    if s != starts[i]:
                        starts[i] = s
                        changed = True
        self.starts = starts
        return self

    def byte_classes(self):
        """(byte_class uint8[256], first byte of each class): see runtime_tables."""
        bc = getattr(self, "_bc", None)
        if bc is None:
            # a linked program refines its fragments' byte classes (fewer maps than automata)
            maps = getattr(self, "_fragment_classes", None)
            bc = self._bc = _program_classes(np.asarray(self.dfa_classes) if maps is None else maps)
        return bc

    def runtime_tables(self):
        """The transition table the runtimes read: one byte-class map for the whole program
        (the common refinement of its automata's maps, so usually a few dozen classes) and a
        state-major table, next(st, b) = class_trans[st * n_classes + byte_class[b]].
        Returns (byte_class uint8[256], class_trans int32[states * n_classes], n_classes)."""
        rt = getattr(self, "_rt", None)
        if rt is None:
            byte_class, first = self.byte_classes()
            table = _state_major(np.asarray(self.dfa_classes), np.asarray(self.dfa_row, dtype=np.int64),
                                 np.asarray(self.dfa_cmap, dtype=np.int64), np.asarray(self.dfa_trans), first)
            rt = self._rt = (byte_class, table, len(first))
        return rt

    @property
    def trans(self):
        """The transitions expanded to 256 per state (flat, global ids): what the runtime
        tables mean, one lookup per byte."""
        byte_class, class_trans, k = self.runtime_tables()
        n = len(self.accept)
        return class_trans.reshape(n, k)[:, byte_class].reshape(-1)

    @property
    def trans_py(self):
        """The expanded transition table as a Python list (for the pure-Python reference
        runtime, which thereby checks the compressed tables the C runtime reads)."""
        if getattr(self, "_trans_py", None) is None:
            self._trans_py = self.trans.tolist()
        return self._trans_py

    def pylists(self):
        """This program with plain Python lists/ints in every table (linked programs hold
        NumPy arrays; the reference runtime does bit arithmetic on Python ints)."""
        if isinstance(self.kind, list):
            return self
        q = getattr(self, "_pylists", None)
        if q is None:
            q = Program()
            for k, v in self.__dict__.items():
                if k.startswith("_"):
                    continue
                setattr(q, k, v.tolist() if isinstance(v, np.ndarray) and k not in ("dfa_trans", "dfa_classes")
                        else v)
            q.words = [int(w) for w in q.words]
            q._trans_py = None
            self._pylists = q
        return q


def _program_classes(classes):
    """The program-wide byte classes: bytes no automaton tells apart (columns of the stacked
    per-automaton class maps, grouped by hash and verified exactly).  Returns
    (byte_class uint8[256], first byte of each class int64[k])."""
    maps = classes.reshape(-1, 256)
    if len(maps) == 0:
        return np.zeros(256, np.uint8), np.zeros(1, np.int64)
    if len(maps) == 1:   # one automaton: its own (dense) classes
        m = maps[0]
        order = np.argsort(m, kind="stable")
        first = order[np.searchsorted(m[order], np.arange(int(m.max()) + 1))]
        return m.astype(np.uint8), first.astype(np.int64)
    if len(maps) <= 8:   # a few automata: exact mixed-radix keys (renumbered before 2**62)
        key = np.zeros(256, np.int64)
        bound = 1
        for m in maps:
            k = int(m.max()) + 1
            if bound * k >= 2 ** 62:
                _, key = np.unique(key, return_inverse=True)
                key = key.reshape(-1).astype(np.int64)
                bound = int(key.max()) + 1
            key = key * k + m
            bound *= k
        _, first, inv = np.unique(key, return_index=True, return_inverse=True)
        return inv.reshape(-1).astype(np.uint8), first.astype(np.int64)
    m64 = maps.astype(np.int64)
    with np.errstate(over="ignore"):
        h = _col_weights(len(maps)) @ (m64 + 1)
    _, first, inv = np.unique(h, return_index=True, return_inverse=True)
    inv = inv.reshape(-1)
    if not np.array_equal(m64[:, first][:, inv], m64):
        _, first, inv = np.unique(m64.T, axis=0, return_index=True, return_inverse=True)
        inv = inv.reshape(-1)
    return inv.astype(np.uint8), first.astype(np.int64)


def _state_major(classes, row, cmap, trans, first):
    """Per-automaton class tables -> the [states x program classes] table (see
    Program.runtime_tables; the C runtime builds the same table in C)."""
    if len(row) == 0:
        return np.zeros(0, np.int32)
    # state s, program class g: its automaton's class of g's first byte
    local = classes[cmap[:, None] + first[None, :]]
    return np.ascontiguousarray(trans[row[:, None] + local], dtype=np.int32).reshape(-1)


NODE_FIELDS = ("kind", "types", "str_min", "str_max", "str_dfa", "num_dfa", "num_check", "int_lo", "int_hi",
               "int_flags", "arr_prefix_off", "arr_prefix_n", "arr_items", "arr_min", "arr_max", "arr_unique",
               "arr_cmin", "arr_cmax", "alt_mark",
               "obj_key_dfa", "obj_nwords", "obj_req_off", "obj_min", "obj_max", "obj_other_ok", "obj_dep_off",
               "obj_dep_n", "alt_off",
               "alt_n", "oneof", "starts")


# linking: per fragment, tables stacked into a few int64 matrices, relocated row by row
_POOL_FIELDS = ("prefix_pool", "alt_pool", "cls_prop", "cls_node", "dep_pool")
_STATE_FIELDS = ("accept", "label_is_class", "reach_off", "other", "dfa_row", "dfa_cmap")
_SIZE_KEYS = ("nodes", "dfa", "words", "cls", "prefix", "alt", "checks", "deps", "trans", "classes")
# node fields -> what they point into (relocated by that table's base in each fragment)
_NODE_RELOC = {"arr_items": "node", "str_dfa": "dfa", "num_dfa": "dfa", "obj_key_dfa": "dfa",
               "num_check": "checks", "arr_prefix_off": "prefix", "alt_off": "alt",
               "obj_req_off": "words", "obj_dep_off": "deps"}


def _packed(f):
    """A fragment's tables as NumPy arrays, made once (linking then only adds offsets)."""
    pk = getattr(f, "_packed", None)
    if pk is None:
        n = len(f.kind)
        pk = {"nodes": np.array([getattr(f, name) for name in NODE_FIELDS], dtype=np.int64)
              .reshape(len(NODE_FIELDS), n),
              "states": np.array([getattr(f, name) for name in _STATE_FIELDS], dtype=np.int64)
              .reshape(len(_STATE_FIELDS), len(f.accept))}
        for name in _POOL_FIELDS:
            pk[name] = np.asarray(getattr(f, name), dtype=np.int64)
        pk["words"] = np.asarray(f.words, dtype=np.uint64)
        pk["dfa_trans"] = np.asarray(f.dfa_trans, dtype=np.int32)
        pk["dfa_classes"] = np.asarray(f.dfa_classes, dtype=np.uint8)
        pk["byte_class"] = f.byte_classes()[0]
        pk["sizes"] = (n, len(f.accept), len(f.words), len(f.cls_prop), len(f.prefix_pool), len(f.alt_pool),
                       len(f.num_checks), len(f.dep_pool) // 2, len(pk["dfa_trans"]), len(pk["dfa_classes"]))
        f._packed = pk
    return pk


def link_programs(frags):
    """Concatenate compiled programs into one; returns (program, root node of each fragment,
    first automaton state of each fragment).

    Each fragment's nodes 0 (ANY) and 1 (NEVER) map onto the shared ones of the first
    fragment; everything else is relocated by its fragment's bases - node ids, automaton
    states, word offsets, key classes, pools, checks - in a few whole-array operations.
    """
    pks = [_packed(f) for f in frags]
    sizes = np.array([pk["sizes"] for pk in pks], dtype=np.int64)      # [fragments, kinds]
    col = {k: i for i, k in enumerate(_SIZE_KEYS)}
    drop = np.where(sizes[:, 0] > 0, 2, 0)
    drop[0] = 0                               # the first fragment provides ANY and NEVER
    kept = sizes[:, 0] - drop
    base = np.cumsum(sizes, axis=0) - sizes   # [fragments, kinds]: where each fragment starts
    node_shift = (np.cumsum(kept) - kept) - drop   # id in fragment + shift = linked id
    bases = {k: base[:, i] for k, i in col.items()}
    bases["node"] = node_shift

    def per(what, count_kind):
        """Each element's fragment base for `what`, over a table sized by count_kind."""
        counts = kept if count_kind == "nodes" else sizes[:, col[count_kind]]
        return np.repeat(bases[what], counts)

    def node_ref(x, shift):
        return np.where(x >= 2, x + shift, x)

    nodes = np.concatenate([pk["nodes"][:, d:] for pk, d in zip(pks, drop.tolist())], axis=1)
    for name, what in _NODE_RELOC.items():
        i = NODE_FIELDS.index(name)
        rep = per(what, "nodes")
        if what == "node":
            nodes[i] = node_ref(nodes[i], rep)
        elif what in ("dfa", "checks"):      # -1 = none
            nodes[i] = np.where(nodes[i] >= 0, nodes[i] + rep, nodes[i])
        else:
            nodes[i] += rep

    def cat(name):
        return np.concatenate([pk[name] for pk in pks])

    p = Program()
    for i, name in enumerate(NODE_FIELDS):
        setattr(p, name, nodes[i])
    p.prefix_pool = node_ref(cat("prefix_pool"), per("node", "prefix"))
    p.alt_pool = node_ref(cat("alt_pool"), per("node", "alt"))
    p.cls_prop = cat("cls_prop")
    p.cls_node = node_ref(cat("cls_node"), per("node", "cls"))
    p.words = cat("words")
    dep = cat("dep_pool").reshape(-1, 2)
    dep[:, 1] += per("words", "deps")
    p.dep_pool = dep.reshape(-1)
    t = cat("dfa_trans")
    p.dfa_trans = np.where(t >= 0, t + per("dfa", "trans").astype(np.int32), -1).astype(np.int32)
    p.dfa_classes = cat("dfa_classes")
    st = np.concatenate([pk["states"] for pk in pks], axis=1)
    acc, is_cls, reach_off, other, row, cmap = st
    p.accept = np.where((is_cls != 0) & (acc >= 0), acc + per("cls", "dfa"), acc)
    p.label_is_class = is_cls
    p.reach_off = np.where(reach_off >= 0, reach_off + per("words", "dfa"), reach_off)
    p.other = other
    p.dfa_row = row + per("trans", "dfa")
    p.dfa_cmap = cmap + per("classes", "dfa")
    p.num_checks = [chk for f in frags for chk in f.num_checks]
    p._fragment_classes = np.concatenate([pk["byte_class"] for pk in pks])
    roots = [int(f.root + sh) if f.root >= 2 else int(f.root) for f, sh in zip(frags, node_shift.tolist())]
    return p, roots, bases["dfa"].tolist()

