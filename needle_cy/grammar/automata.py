"""Byte automata: NFA, DFA (stored over byte classes), subset construction, pruning,
minimisation, tries of literal strings, products, complements, intersections, and the
reachable-key sets of key automata."""
from __future__ import annotations

import numpy as np

from ..errors import GrammarLimitError
from .charset import utf8_sequences
from .limits import MAX_DFA_STATES


class NFA:
    def __init__(self):
        self.eps = []     # state -> list of states
        self.edges = []   # state -> list of (lo, hi, target)

    def new(self):
        self.eps.append([])
        self.edges.append([])
        return len(self.eps) - 1

    def add_set(self, s, ranges, t):
        for lo, hi in ranges:
            for seq in utf8_sequences(lo, hi):
                cur = s
                for k, (a, b) in enumerate(seq):
                    nxt = t if k == len(seq) - 1 else self.new()
                    self.edges[cur].append((a, b, nxt))
                    cur = nxt

    def build(self, ast, s, t):
        kind = ast[0]
        if kind == "set":
            self.add_set(s, ast[1], t)
        elif kind == "eps":
            self.eps[s].append(t)
        elif kind == "cat":
            cur = s
            for item in ast[1]:
                nxt = self.new()
                self.build(item, cur, nxt)
                cur = nxt
            self.eps[cur].append(t)
        elif kind == "alt":
            for item in ast[1]:
                self.build(item, s, t)
        elif kind == "rep":
            _, sub, lo, hi = ast
            if len(self.eps) > 200000:
                raise GrammarLimitError("pattern automaton too large")
            cur = s
            for _ in range(lo):
                nxt = self.new()
                self.build(sub, cur, nxt)
                cur = nxt
            if hi is None:
                loop = self.new()
                self.eps[cur].append(loop)
                body_end = self.new()
                self.build(sub, loop, body_end)
                self.eps[body_end].append(loop)
                self.eps[loop].append(t)
            else:
                self.eps[cur].append(t)
                for _ in range(hi - lo):
                    nxt = self.new()
                    self.build(sub, cur, nxt)
                    self.eps[nxt].append(t)
                    cur = nxt
        elif kind in ("bol", "eol"):   # an anchor: an assertion edge (regex._anchored_nfa)
            self.asserts.append((s, t, kind))
        elif kind == "bytes_any":  # any byte sequence (UTF-8 validity is the frame's job)
            loop = self.new()
            self.eps[s].append(loop)
            self.edges[loop].append((0, 255, loop))
            self.eps[loop].append(t)
        else:
            raise AssertionError(kind)

    def closure(self, states):
        stack = list(states)
        seen = set(states)
        while stack:
            x = stack.pop()
            for y in self.eps[x]:
                if y not in seen:
                    seen.add(y)
                    stack.append(y)
        return frozenset(seen)


class DFA:
    """A byte DFA: trans[state, byte] -> state or -1; accept[state] is a label (-1 = reject).

    Built either from a 256-wide ``trans`` table or from its byte-class form ``cls`` =
    (class map uint8[256], table int32[n, k]) with trans[s, b] == table[s, cmap[b]]; the
    other form is derived on first use (``_compress``, ``trans``).  Programs store the class
    form (Program.add_dfa); the runtime tables refine all of a program's class maps into
    one.  ``trim``: every state is reachable from 0 and can reach an accepting state
    (pruning is a no-op).  DFAs are never modified once built.
    """

    def __init__(self, trans, accept, trim=False, cls=None):
        self._trans = None if trans is None else np.asarray(trans, dtype=np.int32).reshape(-1, 256)
        self.accept = np.asarray(accept, dtype=np.int32).reshape(-1)
        self.trim = trim
        self._cls = cls

    @property
    def trans(self):
        if self._trans is None:
            cmap, table = self._cls
            self._trans = np.ascontiguousarray(table[:, cmap])
        return self._trans

    @property
    def n(self):
        return len(self.accept)

    def run(self, data, state=0):
        for b in data:
            if state < 0:
                return -1
            state = int(self.trans[state, b])
        return state

    def relabel(self, accept, trim=None):
        """Same transitions, new labels (the tables are shared)."""
        d = DFA(None, accept, self.trim if trim is None else trim, _compress(self))
        d._trans = self._trans
        return d


_COL_WEIGHTS = np.zeros(0, np.int64)


def _col_weights(n):
    """n fixed pseudo-random odd 64-bit weights for column hashes (splitmix64 of 1..n; not
    np.random, whose first use imports 20 ms of modules)."""
    global _COL_WEIGHTS
    if len(_COL_WEIGHTS) < n:
        m = max(n, 2 * len(_COL_WEIGHTS), 64)
        with np.errstate(over="ignore"):
            x = np.arange(1, m + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
            x ^= x >> np.uint64(30)
            x *= np.uint64(0xBF58476D1CE4E5B9)
            x ^= x >> np.uint64(27)
            x *= np.uint64(0x94D049BB133111EB)
            x ^= x >> np.uint64(31)
        _COL_WEIGHTS = (x >> np.uint64(2)).astype(np.int64) | 1
    return _COL_WEIGHTS[:n]


def _compress(d):
    """Byte classes of a DFA: (class map uint8[256], table int32[n, k]) with
    trans[s, b] == table[s, cmap[b]].  Columns are grouped by a random 64-bit hash and the
    grouping is then verified exactly (a collision falls back to an exact sort)."""
    if d._cls is not None:
        return d._cls
    tr = d.trans
    n = tr.shape[0]
    with np.errstate(over="ignore"):
        h = _col_weights(n) @ (tr.astype(np.int64) + 2)    # [256] column hashes (wrapping)
    _, first, inv = np.unique(h, return_index=True, return_inverse=True)
    inv = inv.reshape(-1)
    table = tr[:, first]
    if not np.array_equal(table[:, inv], tr):
        _, first, inv = np.unique(tr.T, axis=0, return_index=True, return_inverse=True)
        inv = inv.reshape(-1)
        table = tr[:, first]
    d._cls = (inv.astype(np.uint8), np.ascontiguousarray(table, dtype=np.int32))
    return d._cls


def _dead_dfa():
    return DFA(np.full((1, 256), -1, np.int32), [-1])


def _all_dfa():
    return DFA(np.zeros((1, 256), np.int32), [0], trim=True)


def nfa_to_dfa(nfa, start, final):
    """Subset construction over byte equivalence classes."""
    bounds = {0, 256}
    for edges in nfa.edges:
        for lo, hi, _ in edges:
            bounds.add(lo)
            bounds.add(hi + 1)
    bounds = sorted(bounds)
    reps = bounds[:-1]
    class_of = np.zeros(256, dtype=np.int64)
    for ci in range(len(reps)):
        class_of[bounds[ci]:bounds[ci + 1]] = ci
    start_set = nfa.closure([start])
    index = {start_set: 0}
    sets = [start_set]
    rows, accept = [], []
    i = 0
    while i < len(sets):
        cur = sets[i]
        i += 1
        crow = np.full(len(reps), -1, dtype=np.int32)
        targets = [set() for _ in reps]
        for x in cur:
            for lo, hi, t in nfa.edges[x]:
                for ci, r in enumerate(reps):
                    if lo <= r <= hi:
                        targets[ci].add(t)
        memo = {}
        for ci, tg in enumerate(targets):
            if not tg:
                continue
            key = frozenset(tg)
            if key not in memo:
                memo[key] = nfa.closure(tg)
            tset = memo[key]
            if tset not in index:
                if len(sets) >= MAX_DFA_STATES:
                    raise GrammarLimitError(f"automaton exceeds {MAX_DFA_STATES} states")
                index[tset] = len(sets)
                sets.append(tset)
            crow[ci] = index[tset]
        rows.append(crow)
        accept.append(0 if final in cur else -1)
    return prune_dfa(DFA(None, accept, cls=(class_of.astype(np.uint8), np.stack(rows))))


def _edges(d):
    """Distinct (source, target) state pairs, as two int64 arrays sorted by source (read from
    the byte-class table: k columns per state instead of 256)."""
    table = _compress(d)[1]
    n = d.n
    src, c = np.nonzero(table >= 0)
    dst = table[src, c]
    pairs = np.sort(src.astype(np.int64) * n + dst)
    # distinct pairs (np.unique would do, but its first call imports numpy.ma: 30 ms cold)
    pairs = pairs[np.concatenate(([True], pairs[1:] != pairs[:-1]))] if len(pairs) else pairs
    return pairs // n, pairs % n


def _successors(d):
    """Per state: sorted distinct successor states."""
    src, dst = _edges(d)
    succ = [[] for _ in range(d.n)]
    for s_, t_ in zip(src.tolist(), dst.tolist()):
        succ[s_].append(t_)
    return succ


def _live_states(d):
    """Boolean array: states from which an accepting state is reachable."""
    n = d.n
    src, dst = _edges(d)
    order = np.argsort(dst, kind="stable")
    src, dst = src[order], dst[order]
    starts = np.searchsorted(dst, np.arange(n + 1))
    live = d.accept >= 0
    stack = list(np.nonzero(live)[0])
    while stack:
        x = stack.pop()
        for y in src[starts[x]:starts[x + 1]]:
            if not live[y]:
                live[y] = True
                stack.append(int(y))
    return live


def _restrict(d, live):
    """Keep live states reachable from 0 (BFS order, 0 first); others become -1."""
    if not live[0]:
        return _dead_dfa()
    n = d.n
    if live.all() and n == 1:
        return d.relabel(d.accept, trim=True)
    succ = _successors(d)
    live_l = live.tolist()
    idx = np.full(n, -1, dtype=np.int64)
    seen = [False] * n
    seen[0] = True
    order = [0]
    k = 0
    while k < len(order):
        s = order[k]
        k += 1
        for t in succ[s]:
            if live_l[t] and not seen[t]:
                seen[t] = True
                order.append(t)
    idx[order] = np.arange(len(order))
    idx_ext = np.append(idx, -1)  # index -1 -> -1
    cmap, table = _compress(d)
    tr = table[order]
    tr = np.where(tr >= 0, idx_ext[tr], -1).astype(np.int32)
    return DFA(None, d.accept[order], trim=True, cls=(cmap, tr))


def prune_dfa(d):
    """Remove states from which no accepting state is reachable (no minimisation: subset
    construction of these small patterns is already near minimal, and Moore refinement
    costs more than it saves at compile time)."""
    if d.trim:
        return d
    return _restrict(d, _live_states(d))


def prune_dfa_keep(d):
    """Like prune_dfa without minimisation (labels are class ids)."""
    if d.trim:
        return d
    return _restrict(d, _live_states(d))


def minimize_dfa(d):
    """Moore partition refinement (distinct labels stay distinct)."""
    n = d.n
    _, cls = np.unique(d.accept, return_inverse=True)
    cls = cls.reshape(-1).astype(np.int64)
    k = cls.max() + 1 if n else 0
    while True:
        cls_ext = np.append(cls, -1)
        sig = np.concatenate([cls[:, None], cls_ext[d.trans]], axis=1)
        _, new = np.unique(sig, axis=0, return_inverse=True)
        new = new.reshape(-1)
        k2 = new.max() + 1
        cls = new.astype(np.int64)
        if k2 == k:
            break
        k = k2
    # representatives, class of state 0 first (BFS)
    rep = {}
    for s in range(n):
        rep.setdefault(int(cls[s]), s)
    cls_ext = np.append(cls, -1)
    succ = _successors(d)
    cls_l = cls.tolist()
    idx = {cls_l[0]: 0}
    order = [cls_l[0]]
    j = 0
    while j < len(order):
        c = order[j]
        j += 1
        for t in succ[rep[c]]:
            if cls_l[t] not in idx:
                idx[cls_l[t]] = len(order)
                order.append(cls_l[t])
    remap = np.full(k + 1, -1, dtype=np.int64)
    for c, i2 in idx.items():
        remap[c] = i2
    reps = [rep[c] for c in order]
    tr = d.trans[reps]
    tr = np.where(tr >= 0, remap[cls_ext[tr]], -1).astype(np.int32)
    return DFA(tr, d.accept[reps])


_LITERAL_DFAS = {}


def literal_dfa(strings, labels=None, other_label=None):
    """A trie DFA accepting exactly the given byte strings; accept label = labels[i] (default 0).

    other_label: when given, every string outside the trie reaches a sink state labelled so.
    Memoised per process by its arguments (enums and key sets recur across tools; DFAs are
    never modified once built).
    """
    key = (tuple(strings), None if labels is None else tuple(labels), other_label)
    hit = _LITERAL_DFAS.get(key)
    if hit is None:
        hit = _literal_dfa(strings, labels, other_label)
        if len(_LITERAL_DFAS) >= 4096:
            _LITERAL_DFAS.clear()
        _LITERAL_DFAS[key] = hit
    return hit


def _literal_dfa(strings, labels, other_label):
    # the trie in sorted order: each string shares its longest common prefix with the
    # previous one and adds one state per remaining byte (a stable sort keeps the last
    # label of a repeated string, as insertion order would)
    default = -1 if other_label is None else other_label
    order = sorted(range(len(strings)), key=strings.__getitem__)
    acc = [default]
    src, byt, dst = [], [], []
    path = [0]          # states along the previous string
    prev = b""
    n = 1
    for i in order:
        s = bytes(strings[i])
        m = min(len(s), len(prev))
        k = 0
        while k < m and s[k] == prev[k]:
            k += 1
        del path[k + 1:]
        extra = len(s) - k
        if extra:
            new = list(range(n, n + extra))
            src.append(path[k])
            src.extend(new[:-1])
            byt.extend(s[k:])
            dst.extend(new)
            path.extend(new)
            acc.extend([default] * extra)
            n += extra
        acc[path[len(s)]] = 0 if labels is None else labels[i]
        prev = s
    sink = -1
    if other_label is not None:
        sink = n
        acc.append(other_label)
    # byte classes: one per byte the strings use, one (class 0) for all the others
    used = sorted(set(byt))
    cmap = np.zeros(256, dtype=np.uint8)
    if len(used) == 256:
        cmap[:] = np.arange(256)
    else:
        cmap[used] = np.arange(1, len(used) + 1)
    table = np.full((n + (1 if sink >= 0 else 0), int(cmap.max()) + 1), sink, dtype=np.int32)
    if src:
        table[src, cmap[byt]] = dst
    # a trie: every state is reachable; every state reaches the end of some string, or the
    # accepting sink
    trim = (other_label is not None and other_label >= 0) or \
        (len(strings) > 0 and (labels is None or min(labels) >= 0))
    return DFA(None, acc, trim=trim, cls=(cmap, table))


def product_dfa(dfas, combine, complete=None):
    """Product of DFAs; accept label = combine(tuple of component labels) (-1 = reject).

    ``complete[i]`` True means component i is run with an explicit dead state so the
    product stays alive after it dies (its label is then -1).
    """
    k = len(dfas)
    complete = complete or [False] * k
    dead_row = np.full(256, -1, dtype=np.int32)
    start = tuple(0 for _ in dfas)
    index = {start: 0}
    states = [start]
    rows, accept = [], []
    i = 0
    while i < len(states):
        cur = states[i]
        i += 1
        comp = np.stack([d.trans[s] if s >= 0 else dead_row for d, s in zip(dfas, cur)])  # [k, 256]
        ok = np.ones(256, dtype=bool)
        for j in range(k):
            if not complete[j]:
                ok &= comp[j] >= 0
        row = np.full(256, -1, dtype=np.int32)
        cols = comp.T[ok]
        if len(cols):
            uniq, inv = np.unique(cols, axis=0, return_inverse=True)
            ids = []
            for u in uniq:
                key = tuple(int(x) for x in u)
                if key not in index:
                    if len(states) >= MAX_DFA_STATES:
                        raise GrammarLimitError(f"automaton product exceeds {MAX_DFA_STATES} states")
                    index[key] = len(states)
                    states.append(key)
                ids.append(index[key])
            row[ok] = np.asarray(ids, dtype=np.int32)[inv.reshape(-1)]
        rows.append(row)
        accept.append(combine(tuple(int(d.accept[s]) if s >= 0 else -1 for d, s in zip(dfas, cur))))
    return DFA(np.stack(rows), accept)


def complement_dfa(d):
    """The byte strings d rejects (UTF-8 validity is the string frame's job)."""
    n = d.n
    cmap, table = _compress(d)
    tr = np.where(table >= 0, table, n).astype(np.int32)
    tr = np.vstack([tr, np.full((1, tr.shape[1]), n, np.int32)])
    acc = np.append(np.where(d.accept >= 0, -1, 0), 0).astype(np.int32)
    return prune_dfa(DFA(None, acc, cls=(cmap, tr)))


def intersect_dfas(dfas):
    if len(dfas) == 1:
        return dfas[0]
    d = product_dfa(dfas, lambda labels: 0 if all(x >= 0 for x in labels) else -1)
    return prune_dfa(d)


def _reach_sets(d, cls_prop, nwords):
    """Per state: bitset of declared properties reachable, and whether another valid key is.
    (Memoised on the DFA object: the same key automaton recurs with the same classes.)"""
    key = (tuple(cls_prop), nwords)
    cache = d.__dict__.setdefault("_reach", {})
    if key not in cache:
        cache[key] = _reach_sets_uncached(d, cls_prop, nwords)
    return cache[key]


def _reach_sets_uncached(d, cls_prop, nwords):
    n = d.n
    src, dst = _edges(d)
    succ = [[] for _ in range(n)]
    for s_, t_ in zip(src.tolist(), dst.tolist()):
        succ[s_].append(t_)
    reach = [0] * n
    other = [0] * n
    for s_, a in enumerate(d.accept.tolist()):
        if a >= 0:
            if cls_prop[a] >= 0:
                reach[s_] |= 1 << cls_prop[a]
            else:
                other[s_] = 1
    # tries (and most key automata) only step forward or loop: one backward pass is exact
    forward = not len(src) or bool((dst >= src).all())
    changed = True
    while changed:
        changed = False
        for s_ in range(n - 1, -1, -1):
            r, o = reach[s_], other[s_]
            for t_ in succ[s_]:
                r |= reach[t_]
                o |= other[t_]
            if r != reach[s_] or o != other[s_]:
                reach[s_], other[s_] = r, o
                changed = True
        if forward:
            break
    if nwords == 1:
        words = [[r] for r in reach]
    else:
        words = [[(r >> (64 * w)) & 0xFFFFFFFFFFFFFFFF for w in range(nwords)] for r in reach]
    return words, other

