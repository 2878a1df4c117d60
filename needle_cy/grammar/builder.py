"""Program building: the nodes of a schema's conjunctions (types, strings, numbers, arrays,
objects, enums, choices), the exactness rules of ``oneOf``, and ``compile_program``.

``Compiler`` walks a schema through ``schema.SchemaResolver`` (pointer -> flat conjunction of
parts) and builds one node per distinct conjunction into a ``program.Program``."""
from __future__ import annotations

import math
import time
from fractions import Fraction

from ..errors import GrammarLimitError, SchemaError, UnsupportedSchemaError
from . import runtime
from .automata import (NFA, _all_dfa, _dead_dfa, _reach_sets, complement_dfa, intersect_dfas, literal_dfa,
                       nfa_to_dfa, product_dfa, prune_dfa_keep)
from .charset import MAX_CP, cs_norm
from .formats import (ENFORCED_FORMATS, FORMAT_MAX_LENGTH, NARROWED_FORMATS, UNENFORCED_STANDARD_FORMATS, draft_format,
                      format_defined, format_regex)
from .keywords import ANNOTATIONS, SUPPORTED, _nonneg_int
from .limits import (ANY_NODE, COMPILE_BUDGET_S, COUNT_CAP, MAX_NODES, MAX_NUM_EXP, NEVER_NODE, NODE_CHOICE,
                     NODE_VALUE, N_INT, N_MINUS, N_ZERO, T_ALL, T_ARR, T_FALSE, T_INT, T_NULL, T_NUM, T_OBJ,
                     T_STR, T_TRUE, TYPE_BITS)
from .numbers import dec_cmp, dec_to_fraction, norm_decimal, number_check, number_live, number_texts
from .program import Program
from .regex import _regex, regex_dfa, regex_sensitive
from .schema import SchemaResolver, _Part, _escape_ptr, _property_dependency, compact, json_equal

_NL_END_DFA = None   # the strings that do not end in a newline


class Compiler:
    """Builds the program of one schema document: one node per distinct conjunction of parts
    (``node``), filled keyword by keyword (``fill``); ``schema`` resolves pointers into
    conjunctions."""

    def __init__(self, doc):
        self.schema = SchemaResolver(doc)
        self.p = Program()
        self.memo = {}
        self._value_programs = {}   # conjunction key -> [compiler, root, approximate, runtime] (_value_ok)
        self.approx = set()      # nodes that refuse some value their schema allows (see check_oneof)
        self.approx_nl = set()   # nodes that refuse such values only for a string value ending in "\n"
        self.str_dfa_obj = {}    # node -> the automaton of its str_dfa (check_oneof narrows it)
        self.nl_stripped = set()
        self.kids = {}           # node -> nodes it contains (items, property values, alternatives)
        self.oneof_ptr = {}      # oneOf choice node -> its pointer
        self.oneof_alts = {}     # oneOf choice node -> the pointers of its alternatives (in order)
        self._pure_levels = {}   # oneOf choice node -> _pure_oneof_level's answer
        self._approx_void = set()    # nodes whose object type a required disputed key dropped
        self.approx_types = {}   # enum node -> type bits of values it dropped only because a
                                 # program judging them is approximate (see fill)
        self._disjoint_memo = {}  # (node, node, type bit) -> _disjoint's answer
        self.str_sup = {}        # approximate string node -> automata whose intersection holds every
                                 # string its schema allows (patterns read "either"), see _disjoint
        self.enum_nums = {}      # enum node -> the numbers it holds (exact, whatever their spelling)
        self.obj_keys = {}       # object node -> (key automaton labelled with global key classes,
                                 # its required names): for the disjointness of oneOf alternatives
        # an integer enum's number automaton (integer syntax only) -> the automaton of all its
        # texts ("1" and "1.0"): from draft 6 on 1.0 is an integer, see _exact_integers
        self._int_enum_full = {}
        self.t0 = time.monotonic()
        self.depth = 0
        # nodes being filled -> the value depth they describe (0 = the document, +1 per
        # array item / property value): an alternative that comes back to a node being
        # filled at the same depth is a cycle of $ref/anyOf that consumed nothing
        self._filling = {}
        self._value_depth = 0
        self.memo[()] = ANY_NODE
        start = Compiler._start_program
        if start is None:
            self._new_node_raw(types=T_ALL)          # ANY_NODE
            self._new_node_raw(types=0)              # NEVER_NODE
            self._fill_object(ANY_NODE, [])
            Compiler._start_program = {k: list(v) if isinstance(v, list) else v
                                       for k, v in self.p.__dict__.items() if isinstance(v, (list, int))}
        else:
            # every program starts with the same ANY and NEVER nodes (ANY's key automaton
            # included): copy them instead of compiling them again
            for k, v in start.items():
                setattr(self.p, k, list(v) if isinstance(v, list) else v)

    _start_program = None

    def _new_node_raw(self, **kw):
        p = self.p
        nid = len(p.kind)
        if nid % 64 == 0 and time.monotonic() - self.t0 > COMPILE_BUDGET_S:
            raise GrammarLimitError(f"schema compilation exceeded {COMPILE_BUDGET_S:.0f} s")
        if nid >= MAX_NODES:
            # anyOf/oneOf distributed over other conjuncts can multiply: refuse, loudly
            raise GrammarLimitError(f"schema expands to more than {MAX_NODES} grammar nodes")
        p.kind.append(kw.get("kind", NODE_VALUE))
        p.types.append(kw.get("types", T_ALL))
        p.str_min.append(0)
        p.str_max.append(-1)
        p.str_dfa.append(-1)
        p.num_dfa.append(-1)
        p.num_check.append(-1)
        p.int_lo.append(0)
        p.int_hi.append(0)
        p.int_flags.append(0)
        p.arr_prefix_off.append(0)
        p.arr_prefix_n.append(0)
        p.arr_items.append(ANY_NODE)
        p.arr_min.append(0)
        p.arr_max.append(-1)
        p.arr_unique.append(0)
        p.arr_cmin.append(0)
        p.arr_cmax.append(-1)
        p.obj_key_dfa.append(-1)
        p.obj_nwords.append(0)
        p.obj_req_off.append(0)
        p.obj_min.append(0)
        p.obj_max.append(-1)
        p.obj_other_ok.append(1)
        p.obj_dep_off.append(0)
        p.obj_dep_n.append(0)
        p.alt_off.append(0)
        p.alt_n.append(0)
        p.oneof.append(0)
        p.alt_mark.append(-1)
        return nid

    # -- node construction
    def node(self, parts):
        key = tuple(sorted(p.key() for p in parts))
        if key in self.memo:
            return self.memo[key]
        self.depth += 1
        if self.depth > 400:
            raise GrammarLimitError("schema nesting too deep to compile")
        try:
            flat = self.schema.expand(parts)
            if flat is None:
                self.memo[key] = NEVER_NODE
                return NEVER_NODE
            fkey = tuple(sorted(p.key() for p, _ in flat))
            if fkey in self.memo:
                self.memo[key] = self.memo[fkey]
                return self.memo[fkey]
            nid = self._new_node_raw()
            self.memo[key] = nid
            self.memo[fkey] = nid
            value_depth = self._value_depth
            self._filling[nid] = value_depth
            try:
                self.fill(nid, flat)
            finally:
                del self._filling[nid]
                self._value_depth = value_depth
            if self.p.types[nid] == 0 and nid not in self.approx_types:
                if nid in self._approx_void:
                    # nothing is left only because of an approximation (a required key the
                    # regex engines read differently): the false schema here would make a
                    # oneOf beside it, or an object holding it, refuse what the schema allows,
                    # and let the value through another alternative
                    raise UnsupportedSchemaError(
                        f"schema at {parts[-1].ptr} holds no value only under an approximation "
                        "(a required property name the regex engines read differently)",
                        keyword="required", pointer=parts[-1].ptr)
                # no value can start: the false schema, so that an object refuses the key
                # (and anyOf the alternative) instead of stranding after it
                self.memo[key] = self.memo[fkey] = NEVER_NODE
                return NEVER_NODE
            return nid
        finally:
            self.depth -= 1

    def fill(self, nid, flat):
        p = self.p
        # 1. choices: pick the first anyOf/oneOf and distribute the rest
        for part, sch in flat:
            for kw in ("anyOf", "oneOf"):
                if kw in sch and kw not in part.excl:
                    alts = sch[kw]
                    if not isinstance(alts, list) or not alts:
                        raise SchemaError(f"{kw} at {part.ptr} must be a non-empty list")
                    rest = [q for q, _ in flat if q is not part]
                    reduced = _Part(part.ptr, part.excl | {kw})
                    if len(alts) > 64:
                        raise GrammarLimitError(f"{kw} with {len(alts)} alternatives at {part.ptr}")
                    alt_nodes = []
                    alt_ptrs = {}
                    for i in range(len(alts)):
                        a = self.node(rest + [reduced, _Part(f"{part.ptr}/{kw}/{i}")])
                        if self._filling.get(a, -1) == self._value_depth:
                            # back to a node still being filled, with no value consumed
                            # (d = anyOf[d, ...]): the least fixed point, as a validator
                            # that terminates would read it -- this alternative holds nothing
                            a = NEVER_NODE
                        alt_nodes.append(a)
                        alt_ptrs.setdefault(a, f"{part.ptr}/{kw}/{i}")
                    # a node still being filled (legitimate recursion through an item or a
                    # property) cannot be copied yet: it stays a one-way choice
                    unfinished = any(a in self._filling for a in alt_nodes)
                    if kw == "anyOf":
                        alt_nodes = [a for a in alt_nodes if a != NEVER_NODE]
                        if not alt_nodes:
                            self._make_never(nid)
                            return
                        if len(set(alt_nodes)) == 1 and not unfinished:
                            self._copy_node(nid, alt_nodes[0])
                            return
                        alt_nodes = list(dict.fromkeys(alt_nodes))
                    else:
                        # a value that matches an alternative given twice matches twice: the
                        # oneOf is the others AND NOT that alternative.  Where it is {} (or
                        # anything) nothing remains; any other twin would need its complement
                        # (fuzz finding, seed 7: oneOf [{}, P, {}] accepted P's strings)
                        counts = {}
                        for a in alt_nodes:
                            counts[a] = counts.get(a, 0) + 1
                        twins = [a for a, c in counts.items() if c > 1 and a != NEVER_NODE]
                        # a twin that adds nothing to the other conjuncts ({}) holds every value
                        if twins and self.node(rest + [reduced]) in twins:
                            self._make_never(nid)
                            return
                        if twins:
                            raise UnsupportedSchemaError(
                                f"oneOf at {part.ptr} gives the same alternative twice: exactly one "
                                f"would need that alternative's complement", keyword="oneOf",
                                pointer=f"{part.ptr}/oneOf")
                        alt_nodes = [a for a in alt_nodes if a != NEVER_NODE]
                        if not alt_nodes:
                            self._make_never(nid)
                            return
                        if len(alt_nodes) == 1 and not unfinished:
                            self._copy_node(nid, alt_nodes[0])
                            return
                    p.kind[nid] = NODE_CHOICE
                    p.alt_off[nid] = len(p.alt_pool)
                    p.alt_n[nid] = len(alt_nodes)
                    p.alt_pool.extend(alt_nodes)
                    p.oneof[nid] = 1 if kw == "oneOf" else 0
                    self.kids[nid] = list(alt_nodes)
                    if kw == "oneOf":
                        self.oneof_ptr[nid] = f"{part.ptr}/oneOf"
                        self.oneof_alts[nid] = [alt_ptrs[a] for a in alt_nodes]
                    return
        # 2. a plain value node: merge keywords (its items and property values are one
        # value deeper)
        self._value_depth += 1
        types = T_ALL
        enum_vals = None
        for part, sch in flat:
            ex = part.excl
            if "type" in sch and "type" not in ex:
                t = sch["type"]
                tl = t if isinstance(t, list) else [t]
                m = 0
                for x in tl:
                    if x == "any" and self.schema.draft <= 3:
                        m |= T_ALL
                        continue
                    if not isinstance(x, str) or x not in TYPE_BITS:
                        if isinstance(x, dict):
                            raise UnsupportedSchemaError(f"schema inside type at {part.ptr}", keyword="type",
                                                         pointer=part.ptr + "/type")
                        raise SchemaError(f"unknown type {x!r} at {part.ptr}")
                    m |= TYPE_BITS[x]
                types &= m
            for kw in ("enum", "const"):
                if kw in sch and kw not in ex:
                    vals = sch[kw] if kw == "enum" else [sch[kw]]
                    if not isinstance(vals, list):
                        raise SchemaError(f"enum at {part.ptr} is not a list")
                    if enum_vals is None:
                        enum_vals = list(vals)
                    else:
                        enum_vals = [v for v in enum_vals if any(json_equal(v, w) for w in vals)]
        nots = [(part, sch["not"]) for part, sch in flat if "not" in sch and "not" not in part.excl]
        if enum_vals is not None:
            # drop values of the wrong type; then filter by every other keyword by
            # compiling the conjunction without enum/const and running each value
            enum_vals = [v for v in enum_vals if _value_type_bit(v) & types]
            rest_parts = [_Part(q.ptr, q.excl | {"enum", "const", "not"}) for q, _ in flat]
            trivial = all(set(sch) - q.excl - ANNOTATIONS <= {"type", "enum", "const", "not"}
                          for q, sch in flat)
            kept = []
            unsure = 0    # type bits of values dropped only because a judging program is approximate
            for v in enum_vals:
                if not trivial:
                    ok, certain = self._value_ok(v, rest_parts, verdict=True)
                    if not ok:
                        unsure |= 0 if certain else _value_type_bit(v)
                        continue
                # dropped when the `not` schema holds -- or may hold: its program is approximate
                held = [self._value_ok(v, [_Part(f"{q.ptr}/not")], unsure=True, verdict=True) for q, _ in nots]
                if any(ok for ok, _ in held):
                    unsure |= 0 if all(certain for ok, certain in held if ok) else _value_type_bit(v)
                    continue
                kept.append(v)
            if unsure:
                # the node refuses values its schema may allow (fuzz finding, seed 9020: an enum
                # string dropped by an approximate `not` vanished from a oneOf, whose other
                # alternative then took it alone): approximate for check_oneof, in those types
                self.approx.add(nid)
                self.approx_types[nid] = unsure
            # "type": "integer" takes integer syntax only, with or without an enum (1.0 is not
            # an integer in draft 4 and is refused by plain "integer" in every draft)
            self._make_enum(nid, kept, int_only=not types & T_NUM)
            return
        if nots:
            # `not` without a finite value set: a few exact static forms
            for part, sub in nots:
                if sub is True or sub == {}:
                    self._make_never(nid)
                    return
                if sub is False:
                    continue
                if isinstance(sub, dict) and set(sub) - ANNOTATIONS <= {"type"} and "type" in sub:
                    t = sub["type"]
                    tl = t if isinstance(t, list) else [t]
                    m = 0
                    for x in tl:
                        m |= TYPE_BITS.get(x, 0)
                    if m & T_INT and not m & T_NUM:
                        # not integer: numbers stay allowed (only non-integer syntax is impossible to
                        # separate from integers statically) -> refuse
                        raise UnsupportedSchemaError(f"'not' over integer at {part.ptr}", keyword="not",
                                                     pointer=part.ptr + "/not")
                    types &= ~m
                    continue
                if isinstance(sub, dict) and set(sub) - ANNOTATIONS <= {"required"} and \
                        isinstance(sub.get("required"), list) and len(sub["required"]) == 0:
                    # not {required: []} = not (object => true) = non-objects only... objects always
                    # satisfy it, so objects are excluded
                    types &= ~T_OBJ
                    continue
                if part.ptr in self.schema.neg_errors:
                    raise self.schema.neg_errors[part.ptr]
                raise UnsupportedSchemaError(f"'not' is only supported with enum/const or a type (at {part.ptr})",
                                             keyword="not", pointer=part.ptr + "/not")
        p.types[nid] = types
        if types & T_STR:
            self._fill_string(nid, flat)
        if types & T_INT:
            self._fill_number(nid, flat, types)
        if types & T_ARR:
            self._fill_array(nid, flat)
        if types & T_OBJ:
            self._fill_object(nid, flat)

    def reaches_approx(self, seed=None):
        """Nodes containing (through items, property values, alternatives) an approximate
        node: one that refuses some value its schema allows (a narrowed format, a pattern the
        two regex engines read differently); ``seed``: from those nodes instead."""
        parents = {}
        for n, ks in self.kids.items():
            for c in ks:
                parents.setdefault(c, []).append(n)
        out = set(self.approx | self.approx_nl) if seed is None else set(seed)
        todo = list(out)
        while todo:
            for q in parents.get(todo.pop(), ()):
                if q not in out:
                    out.add(q)
                    todo.append(q)
        return out

    def _descendants(self, roots):
        out = set(roots)
        todo = list(out)
        while todo:
            for c in self.kids.get(todo.pop(), ()):
                if c not in out:
                    out.add(c)
                    todo.append(c)
        return out

    def _strip_nl(self, nid):
        """The node refuses every string value ending in a newline (marked ``approx_nl``)."""
        p = self.p
        self.nl_stripped.add(nid)
        if p.kind[nid] != NODE_VALUE or not p.types[nid] & T_STR:
            return
        global _NL_END_DFA
        if _NL_END_DFA is None:
            _NL_END_DFA = complement_dfa(regex_dfa("\\n$"))
        if p.str_dfa[nid] < 0:
            d = _NL_END_DFA
        else:
            d = intersect_dfas([self.str_dfa_obj[nid], _NL_END_DFA])
        p.str_dfa[nid] = p.add_dfa(d)
        self.str_dfa_obj[nid] = d
        self.approx_nl.add(nid)

    def _types_of(self, nid, seen=()):
        """The JSON types a node's schema may hold: its types, and objects too where its keys
        are approximate (a key the engines read differently is refused, and a required one
        then drops the object type although the schema allows objects)."""
        p = self.p
        if p.kind[nid] != NODE_CHOICE:
            return p.types[nid] | (T_OBJ if nid in self.approx else 0) | self.approx_types.get(nid, 0)
        if nid in seen:
            return T_ALL
        t = 0
        for a in p.alt_pool[p.alt_off[nid]: p.alt_off[nid] + p.alt_n[nid]]:
            t |= self._types_of(a, seen + (nid,))
        return t

    def check_oneof(self):
        """oneOf is exact only when each alternative is: "exactly one" refuses a value two
        alternatives both accept, so an alternative that wrongly refuses a value would let the
        value through another one.  Approximate alternatives are allowed when no two
        alternatives share a JSON type (then at most one can ever match).  When the only
        approximations an alternative reaches refuse a value for a string value ending in a
        newline (a ``$`` pattern, or such a refusal made here), every node of every
        alternative refuses string values ending in a newline: a value accepted through one
        alternative then contains no such string, so no other alternative can match it under
        Python's reading either.  Otherwise the schema is refused."""
        if not self.oneof_ptr:
            return
        p = self.p
        while True:
            hot = hot_nl = hot_int = None
            strip = set()
            exact_int = set()
            for nid, ptr in self.oneof_ptr.items():
                if p.kind[nid] != NODE_CHOICE or not p.oneof[nid]:
                    continue
                alts = p.alt_pool[p.alt_off[nid]: p.alt_off[nid] + p.alt_n[nid]]
                if hot is None:
                    # an enum or const number takes a few spellings of its values only
                    # ("1.5", not "1.50" or "15e-1", number_texts): beside an alternative
                    # that takes every spelling, "exactly one" would let "1.50" through
                    hot = self.reaches_approx(self.approx | set(self.enum_nums))
                    hot_nl = self.reaches_approx(self.approx_nl)
                    int_nodes = self._integer_syntax_nodes()
                    hot_int = self.reaches_approx(int_nodes)
                if not any(a in hot or a in hot_nl or a in hot_int for a in alts):
                    continue
                types = [self._types_of(a) for a in alts]
                need = need_int = False
                for i in range(len(alts)):
                    for j in range(i + 1, len(alts)):
                        if not types[i] & types[j]:
                            continue
                        # per shared JSON type: the worse of the two alternatives' approximations
                        # there, unless no value of that type can satisfy both
                        level = self._pair_level(alts[i], alts[j], types[i], types[j], hot, hot_nl)
                        if level == 2:
                            # the approximations may all lie in the conjuncts every alternative
                            # shares (see _pure_oneof_level): then what the alternatives alone
                            # need decides
                            level = self._pure_oneof_level(nid)
                        if level == 2:
                            raise UnsupportedSchemaError(
                                f"oneOf at {ptr}: an alternative uses a narrowed format, a pattern the "
                                "regex engines read differently or a format/const its draft leaves an "
                                "annotation, and another alternative can match a "
                                "value of the same type; 'exactly one' cannot be enforced exactly",
                                keyword="oneOf", pointer=ptr)
                        if level == 1:
                            need = True
                        if (alts[i] in hot_int or alts[j] in hot_int) and not all(
                                self._disjoint(alts[i], alts[j], t) for t in _bits(types[i] & types[j])):
                            need_int = True
                if need:
                    strip |= self._descendants(alts)
                if need_int:
                    exact_int |= self._descendants(alts) & int_nodes
            strip -= self.nl_stripped
            if not strip and not exact_int:
                return
            for n in sorted(strip):
                self._strip_nl(n)
            self._exact_integers(exact_int)

    def _pair_level(self, a, b, ta, tb, hot, hot_nl):
        """Per shared JSON type: the worse of two alternatives' approximations there (see
        _approx_level), unless no value of that type can satisfy both."""
        level = 0
        for t in _bits(ta & tb):
            if t in (T_INT, T_NUM) and a in self.enum_nums and b in self.enum_nums:
                continue   # two enums take the same spellings of a value
            lv = max(self._approx_level(a, t, hot, hot_nl), self._approx_level(b, t, hot, hot_nl))
            if lv > level and not self._disjoint(a, b, t):
                level = lv
        return level

    def _pure_oneof_level(self, nid):
        """The approximation level check_oneof needs for oneOf node ``nid``, read from its
        alternatives compiled alone, without the conjuncts the oneOf was distributed over.

        Alternative i is compiled as R and A_i, where R (the schema holding the oneOf, its
        allOf siblings...) is the same for every i.  An approximation narrows a value set at
        a place in the document (a format's strings, a pattern's, an enum number's spellings)
        and compiled conjunctions intersect: R and A_i accepts exactly the documents that
        satisfy R and A_i and lie in the narrowing N_R of R's approximate parts, times A_i's
        own narrowing.  N_R is the same set for every i, so where the A_i alone are exact (or
        apart where they are not), a document outside N_R is refused by every alternative
        (refused, never wrongly accepted), and a document inside it is counted exactly: the
        oneOf is exact on it.  2 when the alternatives alone need it (or cannot be compiled
        alone), else their own level (1: strip the newline-ending strings as usual)."""
        hit = self._pure_levels.get(nid)
        if hit is not None:
            return hit
        level = 2
        ptrs = self.oneof_alts.get(nid)
        if ptrs:
            sub = Compiler(self.schema.doc)
            sub.schema.synthetic = dict(self.schema.synthetic)
            sub.schema.draft = self.schema.draft
            try:
                alts = [sub.node([_Part(ptr)]) for ptr in ptrs]
                sub.check_oneof()     # the oneOfs inside the alternatives hold on their own
            except (UnsupportedSchemaError, GrammarLimitError, RecursionError):
                alts = None
            if alts is not None:
                hot = sub.reaches_approx(sub.approx | set(sub.enum_nums))
                hot_nl = sub.reaches_approx(sub.approx_nl)
                types = [sub._types_of(a) for a in alts]
                level = max([sub._pair_level(alts[i], alts[j], types[i], types[j], hot, hot_nl)
                             for i in range(len(alts)) for j in range(i + 1, len(alts))], default=0)
        self._pure_levels[nid] = level
        return level

    def _alts(self, n):
        p = self.p
        return p.alt_pool[p.alt_off[n]: p.alt_off[n] + p.alt_n[n]]

    def _approx_level(self, n, t, hot, hot_nl, seen=()):
        """How node n's verdict on values of JSON type bit t may differ from its schema's:
        0 exact, 1 only for a string value ending in a newline (a '$' pattern), 2 otherwise."""
        p = self.p
        if p.kind[n] == NODE_CHOICE:
            if n in seen:
                return 2 if n in hot else (1 if n in hot_nl else 0)
            return max([self._approx_level(a, t, hot, hot_nl, seen + (n,)) for a in self._alts(n)
                        if self._types_of(a) & t], default=0)
        if self.approx_types.get(n, 0) & t:
            return 2     # an enum that dropped a value of this type under an approximation
        if not p.types[n] & t:
            return 0
        if t == T_STR:
            return 2 if n in self.approx else (1 if n in self.approx_nl else 0)
        if t in (T_INT, T_NUM):
            return 2 if n in self.enum_nums else 0   # (see check_oneof: enum number spellings)
        if t in (T_ARR, T_OBJ):
            # through items and property values; an object's own keys (propertyNames,
            # patternProperties the engines read differently) mark the node itself
            level = 2 if t == T_OBJ and n in self.approx else 0
            for c in self.kids.get(n, ()):
                if c in hot:
                    return 2
                if c in hot_nl:
                    level = max(level, 1)
            return level
        return 0

    def _disjoint(self, a, b, t, depth=0):
        """No value of JSON type bit t satisfies both nodes' schemas.  Read from facts that
        hold for the schema, not only for its (maybe narrowed) node: types, length and count
        ranges, required properties against the other side's value for that property (or its
        refusal of the key), enum strings of exact nodes."""
        key = (a, b, t) if a <= b else (b, a, t)
        hit = self._disjoint_memo.get(key)
        if hit is None:
            hit = self._disjoint_memo[key] = self._disjoint_uncached(a, b, t, depth)
        return hit

    def _disjoint_uncached(self, a, b, t, depth):
        p = self.p
        if depth > 8:
            return False
        for x, y in ((a, b), (b, a)):
            if p.kind[x] == NODE_CHOICE:
                return all(self._disjoint(c, y, t, depth + 1) for c in self._alts(x) if self._types_of(c) & t)
        if not self._types_of(a) & self._types_of(b) & t:
            return True
        if (self.approx_types.get(a, 0) | self.approx_types.get(b, 0)) & t:
            return False     # a value it dropped is no fact of its schema

        def apart(lo1, hi1, lo2, hi2):
            return (hi1 >= 0 and lo2 > hi1) or (hi2 >= 0 and lo1 > hi2)

        if t == T_STR:
            if apart(p.str_min[a], p.str_max[a], p.str_min[b], p.str_max[b]):
                return True
            da, db = self._string_superset(a), self._string_superset(b)
            if da is not None and db is not None:
                return not (intersect_dfas([da, db]).accept >= 0).any()
            return False
        if t == T_OBJ:
            if apart(p.obj_min[a], p.obj_max[a], p.obj_min[b], p.obj_max[b]):
                return True
            for x, y in ((a, b), (b, a)):
                if x not in self.obj_keys:
                    continue
                for name in sorted(self.obj_keys[x][1]):
                    vy = self._value_node(y, name)
                    if vy == NEVER_NODE or self._disjoint_all(self._value_node(x, name), vy, depth + 1):
                        return True
            return False
        if t == T_ARR:
            if apart(p.arr_min[a], p.arr_max[a], p.arr_min[b], p.arr_max[b]):
                return True
            for i in range(min(max(p.arr_min[a], p.arr_min[b]), 16)):
                ia, ib = self._item_node(a, i), self._item_node(b, i)
                if ib == NEVER_NODE or ia == NEVER_NODE or self._disjoint_all(ia, ib, depth + 1):
                    return True
            return False
        if t & (T_INT | T_NUM) and a in self.enum_nums and b in self.enum_nums:
            return not any(json_equal(u, v) for u in self.enum_nums[a] for v in self.enum_nums[b])
        if t & (T_INT | T_NUM):
            # an enum's numbers against the other node's exact bounds and multipleOf
            for x, y in ((a, b), (b, a)):
                if x in self.enum_nums and y not in self.enum_nums and p.num_check[y] >= 0 and p.num_dfa[y] < 0:
                    check = p.num_checks[p.num_check[y]]
                    if not any(number_check(check, repr(float(v)) if isinstance(v, float) else str(v))
                               for v in self.enum_nums[x]):
                        return True
        return False

    def _disjoint_all(self, a, b, depth):
        return all(self._disjoint(a, b, t, depth) for t in _bits(self._types_of(a) & self._types_of(b)))

    def _value_node(self, n, name):
        """The node a property's value must satisfy in object node n (NEVER: the key is refused);
        ANY where n's keys are approximate (their refusals do not hold for the schema)."""
        info = self.obj_keys.get(n)
        if info is None or n in self.approx:
            return ANY_NODE
        d = info[0]
        st = d.run(name.encode("utf-8"))
        if st < 0 or d.accept[st] < 0:
            return NEVER_NODE
        return self.p.cls_node[int(d.accept[st])]

    def _item_node(self, n, i):
        p = self.p
        if i < p.arr_prefix_n[n]:
            return p.prefix_pool[p.arr_prefix_off[n] + i]
        return p.arr_items[n]

    def _integer_syntax_nodes(self):
        """Nodes that read ``integer`` as integer syntax, refusing an integral value written
        as a decimal (1.0, 1e2, -0.0) that is an integer from draft 6 on (in draft 4 only
        integer syntax is: exact there): plain integer nodes and integer enums."""
        if self.schema.draft < 6:
            return set()
        p = self.p
        return {n for n in range(len(p.kind))
                if p.kind[n] == NODE_VALUE and p.types[n] & T_INT and not p.types[n] & T_NUM
                and (p.num_dfa[n] < 0 or p.num_dfa[n] in self._int_enum_full)}

    def _exact_integers(self, nodes):
        """Integer nodes that a oneOf counts (an alternative refusing 1.0 would let 1.0 pass
        another alternative that also holds it, fuzz finding seed 7: oneOf [integer, number]
        took 1.0) read integer as the draft does: any number whose value is integral
        (multipleOf 1, whose liveness the number check already makes exact), an integer enum
        its values' texts "1" and "1.0" as any number enum does."""
        p = self.p
        one = norm_decimal(1)
        for n in sorted(nodes):
            if p.num_dfa[n] >= 0:
                p.num_dfa[n] = p.add_dfa(self._int_enum_full[p.num_dfa[n]])
            else:
                old = p.num_checks[p.num_check[n]] if p.num_check[n] >= 0 else {"lo": None, "hi": None, "mult": None}
                p.num_check[n] = len(p.num_checks)
                p.num_checks.append(dict(old, mult=_lcm_decimal([one] + ([old["mult"]] if old["mult"] else []))))
            p.types[n] |= T_NUM

    def _make_never(self, nid):
        self.p.kind[nid] = NODE_VALUE
        self.p.types[nid] = 0

    def _copy_node(self, nid, src):
        p = self.p
        self.kids[nid] = [src]
        if src in self.oneof_ptr:
            self.oneof_ptr[nid] = self.oneof_ptr[src]
            self.oneof_alts[nid] = self.oneof_alts[src]
        for name in ("kind", "types", "str_min", "str_max", "str_dfa", "num_dfa", "num_check", "int_lo",
                     "int_hi", "int_flags", "arr_prefix_off", "arr_prefix_n", "arr_items", "arr_min",
                     "arr_max", "arr_unique", "arr_cmin", "arr_cmax", "obj_key_dfa", "obj_nwords", "obj_req_off", "obj_min",
                     "obj_max", "obj_other_ok", "obj_dep_off", "obj_dep_n", "alt_off", "alt_n", "oneof", "alt_mark"):
            arr = getattr(p, name)
            arr[nid] = arr[src]
        if src in self.str_dfa_obj:
            self.str_dfa_obj[nid] = self.str_dfa_obj[src]
        if src in self.obj_keys:
            self.obj_keys[nid] = self.obj_keys[src]
        if src in self.enum_nums:
            self.enum_nums[nid] = self.enum_nums[src]
        if src in self.str_sup:
            self.str_sup[nid] = self.str_sup[src]
        # a copy is as approximate as its source (for the per-type levels of check_oneof)
        if src in self.approx:
            self.approx.add(nid)
        if src in self.approx_types:
            self.approx_types[nid] = self.approx_types[src]
        if src in self.approx_nl:
            self.approx_nl.add(nid)
        if src >= len(p.kind) or p.kind[src] is None:
            raise AssertionError

    def _value_ok(self, value, parts, unsure=False, verdict=False):
        """Whether a concrete JSON value satisfies a conjunction (compiled, then run on the
        runtime: the C one, the Python reference only where the extension is not built).
        The program may refuse values the conjunction allows (see ``approx``): a refusal then
        answers ``unsure``.  ``verdict``: (that answer, whether it is certain) -- a refusal by
        an approximate program is not, unless its approximations concern only strings ending
        in a newline and the value holds none.  A conjunction's program is built once per
        compile and its runtime made on first use: every value of an enum is run on the same
        one (making a C runtime costs more than the Python reference's lazy start, so once
        rather than per value)."""
        key = tuple(sorted(q.key() for q in parts))
        hit = self._value_programs.get(key)
        if hit is None:
            sub = Compiler(self.schema.doc)
            sub.schema.synthetic = dict(self.schema.synthetic)
            sub.schema.draft = self.schema.draft
            root = sub.node(parts)
            sub.check_oneof()
            level = 2 if root in sub.reaches_approx(sub.approx) else 1 if root in sub.reaches_approx() else 0
            hit = self._value_programs[key] = [sub, root, level, None]
        sub, root, level, grammar = hit
        approx = level == 2 or (level == 1 and _holds_nl_end(value))
        if unsure and approx and not verdict:
            return True
        if grammar is None:
            sub.p.root = root
            grammar = hit[3] = runtime.make(sub.p.finish())[0]
        try:
            texts = [compact(value)]
        except ValueError:
            return (False, True) if verdict else False
        if unsure and isinstance(value, (int, float)) and not isinstance(value, bool):
            # a number is the same value in every spelling the enum will take ("1", "1.0"):
            # the `not` filter drops it when its schema holds for any of them (fuzz finding,
            # seed 7: not {type: integer} "held" for 1.0, which type: integer reads as 1)
            texts += [t for t in number_texts(value) if t not in texts]
        for text in texts:
            st = grammar.start()
            if st.feed(text.encode("utf-8")) and st.is_complete():
                return (True, True) if verdict else True
        if verdict:
            # refused: certain where the program is exact; under `unsure` an approximate
            # program's refusal reads as "may hold"
            return (unsure and approx, not approx)
        return False

    def _make_enum(self, nid, values, int_only=False):
        """A node accepting exactly the given values (numbers in integer syntax only when
        ``int_only``)."""
        p = self.p
        strs = [v for v in values if isinstance(v, str)]
        nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        comps = [v for v in values if isinstance(v, (list, dict))]
        types = 0
        for v in values:
            if v is None:
                types |= T_NULL
            elif v is True:
                types |= T_TRUE
            elif v is False:
                types |= T_FALSE
        if strs:
            types |= T_STR
            d = literal_dfa(sorted({s.encode("utf-8") for s in strs}))
            p.str_dfa[nid] = p.add_dfa(d)
            self.str_dfa_obj[nid] = d
        if nums:
            texts = sorted({t.encode() for v in nums for t in number_texts(v)})
            all_texts = texts
            if int_only:
                texts = [t for t in texts if t.lstrip(b"-").isdigit()]
            if texts:
                types |= T_INT if int_only else T_INT | T_NUM
                p.num_dfa[nid] = p.add_dfa(literal_dfa(texts))
                self.enum_nums[nid] = [v for v in nums if not int_only or float(v).is_integer()]
                if len(texts) < len(all_texts) and self.schema.draft >= 6:
                    self._int_enum_full[p.num_dfa[nid]] = literal_dfa(all_texts)
        if not comps:
            p.types[nid] = types
            return
        # composite values: a choice of the scalar part and one exact schema per value
        alts = []
        if types:
            scalar = self._new_node_raw()
            for name in ("types", "str_dfa", "num_dfa"):
                getattr(p, name)[scalar] = getattr(p, name)[nid]
            if nid in self.str_dfa_obj:
                self.str_dfa_obj[scalar] = self.str_dfa_obj[nid]
            if nid in self.enum_nums:
                self.enum_nums[scalar] = self.enum_nums[nid]
            p.types[scalar] = types
            alts.append(scalar)
        uniq = []
        for v in comps:
            if not any(json_equal(v, w) for w in uniq):
                uniq.append(v)
        for v in uniq:
            alts.append(self.node([_Part(self.schema.synth(_const_schema(v)))]))
        if len(alts) == 1:
            self._copy_node(nid, alts[0])
            return
        p.kind[nid] = NODE_CHOICE
        p.alt_off[nid] = len(p.alt_pool)
        p.alt_n[nid] = len(alts)
        p.alt_pool.extend(alts)
        p.oneof[nid] = 0
        self.kids[nid] = list(alts)

    def _fill_string(self, nid, flat):
        p = self.p
        dfas = []
        sup = []     # a superset of the schema's strings: what either engine matches, formats apart
        for part, sch in flat:
            ex = part.excl
            if "minLength" in sch and "minLength" not in ex:
                p.str_min[nid] = max(p.str_min[nid], _nonneg_int(sch["minLength"], part.ptr, "minLength"))
            if "maxLength" in sch and "maxLength" not in ex:
                v = min(_nonneg_int(sch["maxLength"], part.ptr, "maxLength"), COUNT_CAP)
                p.str_max[nid] = v if p.str_max[nid] < 0 else min(p.str_max[nid], v)
            if "pattern" in sch and "pattern" not in ex:
                pat = sch["pattern"]
                if not isinstance(pat, str):
                    raise SchemaError(f"pattern at {part.ptr} is not a string")
                dfas.append(self._pattern(pat, part.ptr + "/pattern", nid=nid, value=True))
                sup.append(("either", pat))
            if "__not_pattern" in sch:
                # the complement of what either engine matches: refused by both
                dfas.append(complement_dfa(self._pattern(sch["__not_pattern"], part.ptr + "/not/pattern",
                                                         mode="either", nid=nid)))
            if "__not_format" in sch:
                dfas.append(complement_dfa(self._format(sch["__not_format"], part.ptr + "/not/format")))
            if "__not_strings" in sch:
                dfas.append(complement_dfa(literal_dfa(sorted({x.encode("utf-8") for x in sch["__not_strings"]}))))
                sup.append(("dfa", dfas[-1]))
            if "format" in sch and "format" not in ex:
                f = draft_format(sch["format"], self.schema.draft)
                if f in ENFORCED_FORMATS:
                    dfas.append(self._format(f, part.ptr + "/format"))
                    if f in NARROWED_FORMATS or not format_defined(f, self.schema.draft):
                        self.approx.add(nid)
                    if f in FORMAT_MAX_LENGTH:
                        n = FORMAT_MAX_LENGTH[f]
                        p.str_max[nid] = n if p.str_max[nid] < 0 else min(p.str_max[nid], n)
                elif f in UNENFORCED_STANDARD_FORMATS:
                    raise UnsupportedSchemaError(f"format {f!r} is not enforced (at {part.ptr})",
                                                 keyword="format", pointer=part.ptr + "/format")
                # other (non-standard) formats are annotations
        if p.str_min[nid] > COUNT_CAP:
            p.str_min[nid] = 0
            p.types[nid] &= ~T_STR
        if dfas:
            d = intersect_dfas(dfas)
            p.str_dfa[nid] = p.add_dfa(d)
            self.str_dfa_obj[nid] = d
        if sup:
            self.str_sup[nid] = sup

    def _string_superset(self, n):
        """An automaton holding every string value node n's schema allows (None: any string):
        the node's own automaton where it is exact, else its patterns read by either engine."""
        if n not in self.approx and n not in self.approx_nl:
            return self.str_dfa_obj.get(n)
        parts = self.str_sup.get(n)
        if not parts:
            return None
        dfas = [d if kind == "dfa" else self._pattern(d, "#", mode="either") for kind, d in parts]
        return intersect_dfas(dfas)

    _pattern_cache = {}

    def _pattern(self, pat, ptr, mode="both", nid=None, value=False):
        """The DFA of a user pattern in a dialect mode (see ``regex_dfa``), memoised per
        process (patterns recur).  When the engines read the pattern differently the node
        ``nid`` is marked approximate (it may refuse a value one engine allows).  A pattern
        whose only difference is ``$`` is exact in "either" mode (Python's reading: ECMA's
        matches are a subset), and in "both" mode, for a string ``value``, refuses only
        strings ending in a newline that Python matches (``approx_nl``)."""
        key = (pat, mode)
        hit = Compiler._pattern_cache.get(key)
        if hit is None:
            hit = _regex(pat, ptr, mode)
            if len(Compiler._pattern_cache) >= 1024:
                Compiler._pattern_cache.clear()
            Compiler._pattern_cache[key] = hit
        if hit[1] and nid is not None:
            if hit[1] == 2:
                self.approx.add(nid)
            elif mode == "both":
                (self.approx_nl if value else self.approx).add(nid)
        return hit[0]

    def _format(self, name, ptr):
        """The DFA of a built-in format (``FORMAT_REGEX``: ASCII rules, read as written)."""
        return self._pattern(format_regex(name, self.schema.draft), ptr)

    def _fill_number(self, nid, flat, types):
        p = self.p
        lo = hi = None   # (dec, exclusive)
        mults = []
        for part, sch in flat:
            ex = part.excl
            for kw in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"):
                if kw not in sch or kw in ex:
                    continue
                v = sch[kw]
                if kw in ("exclusiveMinimum", "exclusiveMaximum") and isinstance(v, bool):
                    continue  # draft-4 form: handled with minimum/maximum
                if not isinstance(v, (int, float)) or isinstance(v, bool):
                    raise SchemaError(f"{kw} at {part.ptr} is not a number")
                d = norm_decimal(v)
                if d[1] and abs(d[2]) + len(d[1]) > MAX_NUM_EXP:
                    raise GrammarLimitError(f"{kw} at {part.ptr} is beyond 10**+-{MAX_NUM_EXP}")
                if kw == "multipleOf":
                    if dec_to_fraction(d) <= 0:
                        raise SchemaError(f"multipleOf at {part.ptr} must be > 0")
                    if len(d[1]) > 18:
                        raise GrammarLimitError(f"multipleOf with more than 18 digits at {part.ptr}")
                    mults.append(d)
                    continue
                is_min = kw in ("minimum", "exclusiveMinimum")
                excl = kw.startswith("exclusive") or (
                    sch.get("exclusiveMinimum" if is_min else "exclusiveMaximum") is True)
                if is_min:
                    if lo is None or dec_cmp(d, lo[0]) > 0 or (dec_cmp(d, lo[0]) == 0 and excl):
                        lo = (d, excl)
                else:
                    if hi is None or dec_cmp(d, hi[0]) < 0 or (dec_cmp(d, hi[0]) == 0 and excl):
                        hi = (d, excl)
        mult = _lcm_decimal(mults) if mults else None
        if lo is None and hi is None and mult is None:
            return
        if lo is not None and hi is not None:
            c = dec_cmp(lo[0], hi[0])
            if c > 0 or (c == 0 and (lo[1] or hi[1])):
                p.types[nid] &= ~(T_INT | T_NUM)
                return
        p.num_check[nid] = len(p.num_checks)
        p.num_checks.append({"lo": lo, "hi": hi, "mult": mult})
        # constraints no number meets (an integer between 0.5 and 0.7, no multiple inside
        # the range): the numeric types are dropped, so the value cannot start
        only_int = not (p.types[nid] & T_NUM)
        firsts = [(b"-", N_MINUS), (b"0", N_ZERO)] + [(bytes([c]), N_INT) for c in b"123456789"]
        if not any(number_live(p.num_checks[-1], text, ph, only_int) for text, ph in firsts):
            p.types[nid] &= ~(T_INT | T_NUM)
        # integer early bounds (inclusive, int64 range)
        flags = 0
        if lo is not None:
            f = dec_to_fraction(lo[0])
            v = math.floor(f) + 1 if (lo[1] and f == math.floor(f)) else math.ceil(f)
            if -2 ** 62 < v < 2 ** 62:
                p.int_lo[nid] = int(v)
                flags |= 1
        if hi is not None:
            f = dec_to_fraction(hi[0])
            v = math.ceil(f) - 1 if (hi[1] and f == math.ceil(f)) else math.floor(f)
            if -2 ** 62 < v < 2 ** 62:
                p.int_hi[nid] = int(v)
                flags |= 2
        p.int_flags[nid] = flags

    def _fill_array(self, nid, flat):
        p = self.p
        for part, sch in flat:
            ex = part.excl
            if "minItems" in sch and "minItems" not in ex:
                p.arr_min[nid] = max(p.arr_min[nid], _nonneg_int(sch["minItems"], part.ptr, "minItems"))
            if "maxItems" in sch and "maxItems" not in ex:
                v = min(_nonneg_int(sch["maxItems"], part.ptr, "maxItems"), COUNT_CAP)
                p.arr_max[nid] = v if p.arr_max[nid] < 0 else min(p.arr_max[nid], v)
            if sch.get("uniqueItems") is True and "uniqueItems" not in ex:
                p.arr_unique[nid] = 1
        # rebuild precisely per source
        sources = []
        for part, sch in flat:
            ex = part.excl
            tl, tail = None, None
            if "prefixItems" in sch and "prefixItems" not in ex:
                tl = (f"{part.ptr}/prefixItems", len(sch["prefixItems"]))
                if "items" in sch and "items" not in ex:
                    tail = f"{part.ptr}/items"
            elif "items" in sch and "items" not in ex:
                if isinstance(sch["items"], list):
                    tl = (f"{part.ptr}/items", len(sch["items"]))
                    if "additionalItems" in sch and "additionalItems" not in ex:
                        tail = f"{part.ptr}/additionalItems"
                else:
                    tail = f"{part.ptr}/items"
            sources.append((tl, tail))
        n_prefix = max([tl[1] for tl, _ in sources if tl is not None], default=0)
        contains = self._contains(flat)
        node_ids, conjs = [], []
        for i in range(n_prefix + 1):
            conj = []
            for tl, tail in sources:
                if tl is not None and i < tl[1]:
                    conj.append(_Part(f"{tl[0]}/{i}"))
                elif tail is not None:
                    conj.append(_Part(tail))
            node_ids.append(self.node(conj) if conj else ANY_NODE)
            conjs.append(conj)
        # tighten maxItems when the items after the prefix are impossible
        if node_ids[n_prefix] == NEVER_NODE:
            mx = n_prefix
            for i in range(n_prefix):
                if node_ids[i] == NEVER_NODE:
                    mx = i
                    break
            p.arr_max[nid] = mx if p.arr_max[nid] < 0 else min(p.arr_max[nid], mx)
        if contains is not None:
            node_ids = self._counted_items(nid, node_ids, conjs, contains)
        self.kids.setdefault(nid, []).extend(node_ids)
        p.arr_prefix_off[nid] = len(p.prefix_pool)
        p.arr_prefix_n[nid] = n_prefix
        p.prefix_pool.extend(node_ids[:n_prefix])
        p.arr_items[nid] = node_ids[n_prefix]
        if (p.arr_max[nid] >= 0 and p.arr_min[nid] > p.arr_max[nid]) or p.arr_min[nid] > COUNT_CAP:
            p.arr_min[nid] = min(p.arr_min[nid], COUNT_CAP)
            p.types[nid] &= ~T_ARR
        if p.arr_max[nid] >= 0 and p.arr_cmin[nid] > p.arr_max[nid]:
            p.types[nid] &= ~T_ARR      # more matching items than items

    def _contains(self, flat):
        """The conjunction's ``contains``: (pointer of its schema, minContains, maxContains or
        -1), None where there is none or it asks for nothing (minContains 0, no maximum)."""
        found = []
        for part, sch in flat:
            if "contains" in sch and "contains" not in part.excl:
                lo = _nonneg_int(sch.get("minContains", 1), part.ptr, "minContains")
                hi = _nonneg_int(sch["maxContains"], part.ptr, "maxContains") if "maxContains" in sch else -1
                if lo == 0 and hi < 0:
                    continue
                found.append((part.ptr + "/contains", min(lo, COUNT_CAP), min(hi, COUNT_CAP)))
        if len(found) > 1:
            raise UnsupportedSchemaError(f"two contains keywords on one array (at {found[1][0]}): one "
                                         "count per array", keyword="contains", pointer=found[1][0])
        return found[0] if found else None

    def _counted_items(self, nid, node_ids, conjs, contains):
        """contains: each item position becomes a choice of (its schema and the contains
        schema, counted: ``alt_mark``) or (its schema; and not the contains schema where a
        maximum makes the count exact).  Without a maximum an item that matches may go either
        way: some thread counts every match, and the array closes when one thread counted
        minContains (threads of equal, capped counts merge).  With one, the two alternatives
        are disjoint and the one thread counts exactly."""
        ptr, lo, hi = contains
        p = self.p
        other = None
        if hi >= 0:
            try:
                neg = self.schema.negate(ptr, 0)
            except UnsupportedSchemaError as exc:
                raise UnsupportedSchemaError(
                    f"maxContains at {ptr.rsplit('/', 1)[0]} needs the exact complement of its contains "
                    f"schema: {exc}", keyword="maxContains", pointer=ptr.rsplit("/", 1)[0] + "/maxContains") from None
            other = _Part(self.schema.synth(neg))
        p.arr_cmin[nid] = lo
        p.arr_cmax[nid] = hi
        out = []
        memo = {}
        for base, parts in zip(node_ids, conjs):
            if base == NEVER_NODE:
                out.append(NEVER_NODE)
                continue
            if base in memo:
                out.append(memo[base])
                continue
            hit = self.node(parts + [_Part(ptr)])
            miss = self.node(parts + [other]) if other is not None else base
            alts = [a for a in (hit, miss) if a != NEVER_NODE]
            if not alts:
                memo[base] = NEVER_NODE
                out.append(NEVER_NODE)
                continue
            cid = self._new_node_raw(kind=NODE_CHOICE)
            p.alt_off[cid] = len(p.alt_pool)
            p.alt_n[cid] = len(alts)
            p.alt_pool.extend(alts)
            p.alt_mark[cid] = 0 if hit != NEVER_NODE else -1
            self.kids[cid] = list(alts)
            memo[base] = cid
            out.append(cid)
        if lo > 0 and all(p.alt_mark[c] < 0 for c in out if c != NEVER_NODE):
            p.types[nid] &= ~T_ARR      # no item can match
        return out

    def _fill_object(self, nid, flat):
        p = self.p
        props = {}         # name -> list of parts
        patterns = []      # (regex, part pointer)
        required = set()
        additional_sources = []   # per source: (declared names set, pattern list, additional ptr or None)
        deps = []                 # (property, [properties it requires])
        name_dfas = []
        for part, sch in flat:
            ex = part.excl
            names = set()
            pats = []
            if "properties" in sch and "properties" not in ex:
                pr = sch["properties"]
                if not isinstance(pr, dict):
                    raise SchemaError(f"properties at {part.ptr} is not an object")
                for k in pr:
                    props.setdefault(k, [])
                    names.add(k)
            if "patternProperties" in sch and "patternProperties" not in ex:
                for k in sch["patternProperties"]:
                    pats.append((k, f"{part.ptr}/patternProperties/{_escape_ptr(k)}"))
            if "required" in sch and "required" not in ex:
                req = sch["required"]
                if not isinstance(req, list):
                    raise SchemaError(f"required at {part.ptr} is not a list")
                required.update(req)
            if self.schema.draft <= 3 and "properties" in sch and "properties" not in ex \
                    and not part.ptr.startswith("~syn"):
                # draft 3: a property schema's `required: true` makes its object require it
                # (any true value, as jsonschema reads it: a list there is no draft-3 form,
                # and requiring is the stricter reading)
                for k in sch["properties"]:
                    sub = self.schema.raw(f"{part.ptr}/properties/{_escape_ptr(k)}")
                    if isinstance(sub, dict) and sub.get("required"):
                        required.add(k)
            if "minProperties" in sch and "minProperties" not in ex:
                p.obj_min[nid] = max(p.obj_min[nid], _nonneg_int(sch["minProperties"], part.ptr, "minProperties"))
            if "maxProperties" in sch and "maxProperties" not in ex:
                v = min(_nonneg_int(sch["maxProperties"], part.ptr, "maxProperties"), COUNT_CAP)
                p.obj_max[nid] = v if p.obj_max[nid] < 0 else min(p.obj_max[nid], v)
            addl = None
            if "additionalProperties" in sch and "additionalProperties" not in ex:
                addl = f"{part.ptr}/additionalProperties"
            additional_sources.append((part, names, pats, addl))
            for dk in ("dependencies", "dependentRequired"):
                if dk in sch and dk not in ex:
                    for name, dv in sch[dk].items():
                        dv = _property_dependency(self.schema, dk, dv, f"{part.ptr}/{dk}/{_escape_ptr(name)}")
                        if dv is None:
                            continue  # schema dependencies were rewritten in expand()
                        deps.append((name, list(dv)))
            if "propertyNames" in sch and "propertyNames" not in ex:
                name_dfas.append(self._names_dfa(f"{part.ptr}/propertyNames", nid))
            patterns.extend(pats)
        for k in required:
            props.setdefault(k, [])
        for k, ks in deps:
            props.setdefault(k, [])
            for k2 in ks:
                props.setdefault(k2, [])
        names = sorted(props)
        if len(names) > 64 * 8:
            raise GrammarLimitError(f"object with {len(names)} declared properties")

        def value_parts(key_name, matched_patterns):
            """Conjunction for a key: per source its property, matching patterns, else additional."""
            conj = []
            for part, src_names, pats, addl in additional_sources:
                hit = False
                if key_name is not None and key_name in src_names:
                    conj.append(_Part(f"{part.ptr}/properties/{_escape_ptr(key_name)}"))
                    hit = True
                for (rx, pptr) in pats:
                    if rx in matched_patterns:
                        conj.append(_Part(pptr))
                        hit = True
                if not hit and addl is not None:
                    conj.append(_Part(addl))
            return conj

        pattern_list = sorted(set(rx for rx, _ in patterns))
        pattern_dfas = [self._pattern(rx, "patternProperties", nid=nid) for rx in pattern_list]
        # a pattern the engines read differently also runs in "either" mode: a key one engine
        # matches and the other does not is refused (its value schema would be ambiguous)
        either_dfas = [(j, self._pattern(rx, "patternProperties", mode="either"))
                       for j, rx in enumerate(pattern_list) if regex_sensitive(rx)]

        def hits(d, name):
            st = d.run(name.encode("utf-8"))
            return st >= 0 and d.accept[st] >= 0

        def matched(name):
            out = set()
            for rx, d in zip(pattern_list, pattern_dfas):
                if hits(d, name):
                    out.add(rx)
            for j, d in either_dfas:
                if hits(d, name) and pattern_list[j] not in out:
                    return None
            return frozenset(out)

        # key classes: declared names first
        classes = {}     # (prop index or -1, frozenset patterns) -> class id
        cls_prop, cls_node = [], []

        def class_id(pidx, pats):
            key = (pidx, pats)
            if key not in classes:
                name = names[pidx] if pidx >= 0 else None
                node = NEVER_NODE if pats is None else self.node(value_parts(name, pats))
                classes[key] = len(cls_prop)
                cls_prop.append(pidx)
                cls_node.append(node)
            return classes[key]

        name_labels = []
        # declared names the key automaton refuses only because of an approximation: the
        # engines read a pattern differently on them, or a narrowed propertyNames format
        disputed = set()
        for i, k in enumerate(names):
            m = matched(k)
            if m is None or (name_dfas and nid in self.approx):
                disputed.add(k)
            name_labels.append(class_id(i, m))
        if not pattern_dfas and not name_dfas:
            key_dfa = literal_dfa([k.encode("utf-8") for k in names], labels=name_labels,
                                  other_label=class_id(-1, frozenset()))
            return self._finish_object(nid, key_dfa, names, cls_prop, cls_node, required, name_labels, deps,
                                       disputed)
        # product DFA: names trie x patterns x propertyNames
        trie = literal_dfa([k.encode("utf-8") for k in names], labels=list(range(len(names)))) \
            if names else _dead_dfa()
        comps = [trie] + pattern_dfas + [d for _, d in either_dfas] + name_dfas
        n_pat = len(pattern_dfas)
        n_either = len(either_dfas)
        complete = [True] * (1 + n_pat + n_either) + [False] * len(name_dfas)

        def combine(labels):
            for j in range(1 + n_pat + n_either, len(labels)):
                if labels[j] < 0:
                    return -1
            if labels[0] >= 0:
                return name_labels[labels[0]]
            for (j, _), lab in zip(either_dfas, labels[1 + n_pat:1 + n_pat + n_either]):
                if lab >= 0 and labels[1 + j] < 0:
                    return -1    # one engine matches the key, the other does not: refused
            pats = frozenset(rx for rx, lab in zip(pattern_list, labels[1:1 + n_pat]) if lab >= 0)
            return class_id(-1, pats)

        key_dfa = product_dfa(comps, combine, complete)
        return self._finish_object(nid, key_dfa, names, cls_prop, cls_node, required, name_labels, deps,
                                       disputed)

    def _finish_object(self, nid, key_dfa, names, cls_prop, cls_node, required, name_labels, deps=(),
                       disputed=frozenset()):
        p = self.p
        # classes whose value schema is impossible are not valid keys
        acc_in = key_dfa.accept.tolist()
        acc = [a if (a >= 0 and cls_node[a] != NEVER_NODE) else -1 for a in acc_in]
        key_dfa = prune_dfa_keep(key_dfa if acc == acc_in else key_dfa.relabel(acc, trim=False))
        nwords = max(1, (len(names) + 63) // 64)
        reach, other = _reach_sets(key_dfa, cls_prop, nwords)
        cls_base = len(p.cls_prop)
        self.kids.setdefault(nid, []).extend(cls_node)
        p.cls_prop.extend(cls_prop)
        p.cls_node.extend(cls_node)
        if cls_base:
            key_dfa = key_dfa.relabel([a + cls_base if a >= 0 else -1 for a in key_dfa.accept.tolist()])
        p.obj_key_dfa[nid] = p.add_dfa(key_dfa, reach, other)
        self.obj_keys[nid] = (key_dfa, frozenset(required))
        p.obj_nwords[nid] = nwords
        req_words = [0] * nwords
        for k in required:
            i = names.index(k)
            if cls_node[name_labels[i]] == NEVER_NODE:
                p.types[nid] &= ~T_OBJ  # a required property can never be valid
                if k in disputed:
                    self._approx_void.add(nid)
            req_words[i // 64] |= 1 << (i % 64)
        p.obj_req_off[nid] = len(p.words)
        p.words.extend(req_words)
        p.obj_dep_off[nid] = len(p.dep_pool) // 2
        p.obj_dep_n[nid] = len(deps)
        for k, ks in deps:
            w = [0] * nwords
            for k2 in ks:
                i = names.index(k2)
                w[i // 64] |= 1 << (i % 64)
            p.dep_pool.extend([names.index(k), len(p.words)])
            p.words.extend(w)
        p.obj_other_ok[nid] = 1 if any(other) else 0
        if (p.obj_max[nid] >= 0 and p.obj_min[nid] > p.obj_max[nid]) or p.obj_min[nid] > COUNT_CAP:
            p.obj_min[nid] = min(p.obj_min[nid], COUNT_CAP)
            p.types[nid] &= ~T_OBJ
        if p.obj_max[nid] >= 0 and len(required) > p.obj_max[nid]:
            p.types[nid] &= ~T_OBJ

    def _names_dfa(self, ptr, nid):
        """propertyNames: a string-only schema made of pattern/enum/const/format/type/maxLength-free parts."""
        sch = self.schema.get(ptr)
        if sch is True or sch == {}:
            return _all_dfa()
        if sch is False:
            return _dead_dfa()
        flat = self.schema.expand([_Part(ptr)])
        if flat is None:
            return _dead_dfa()
        dfas = []
        for part, s in flat:
            for k in s:
                if k in ANNOTATIONS or k in part.excl:
                    continue
                if k == "type":
                    if s[k] != "string" and "string" not in (s[k] if isinstance(s[k], list) else []):
                        return _dead_dfa()
                elif k == "pattern":
                    dfas.append(self._pattern(s[k], f"{part.ptr}/pattern", nid=nid))
                elif k in ("enum", "const"):
                    vals = s[k] if k == "enum" else [s[k]]
                    dfas.append(literal_dfa(sorted({v.encode("utf-8") for v in vals if isinstance(v, str)}))
                                if any(isinstance(v, str) for v in vals) else _dead_dfa())
                elif k == "format":
                    f = draft_format(s[k], self.schema.draft)
                    if f in FORMAT_MAX_LENGTH:
                        raise UnsupportedSchemaError(f"format {f!r} in propertyNames (its length bound needs "
                                                     "a string node)", keyword="format", pointer=f"{part.ptr}/format")
                    if f in ENFORCED_FORMATS:
                        dfas.append(self._format(f, f"{part.ptr}/format"))
                        if f in NARROWED_FORMATS:
                            self.approx.add(nid)
                    elif f in UNENFORCED_STANDARD_FORMATS:
                        raise UnsupportedSchemaError(f"format {f!r} in propertyNames", keyword="format",
                                                     pointer=f"{part.ptr}/format")
                elif k == "maxLength" or k == "minLength":
                    n = _nonneg_int(s[k], part.ptr, k)
                    if n > 1000:
                        raise GrammarLimitError(f"{k} {n} inside propertyNames at {part.ptr}: the key "
                                                "automaton counts at most 1000 code points")
                    any_cp = ("set", cs_norm([(0, MAX_CP)]))
                    ast = ("rep", any_cp, n, None) if k == "minLength" else ("rep", any_cp, 0, n)
                    nfa = NFA()
                    a, b = nfa.new(), nfa.new()
                    nfa.build(ast, a, b)
                    dfas.append(nfa_to_dfa(nfa, a, b))
                elif k in SUPPORTED:
                    raise UnsupportedSchemaError(f"keyword {k!r} inside propertyNames", keyword=k,
                                                 pointer=f"{part.ptr}/{k}")
        if not dfas:
            return _all_dfa()
        return intersect_dfas(dfas)


def _bits(mask):
    return [1 << i for i in range(8) if mask >> i & 1]


def _lcm_decimal(mults):
    """The least common multiple of positive exact decimals (multipleOf values)."""
    fr = [dec_to_fraction(m) for m in mults]
    # lcm of rationals: lcm(numerators) / gcd(denominators)
    num = 1
    den = 0
    for f in fr:
        num = num * f.numerator // math.gcd(num, f.numerator)
        den = math.gcd(den, f.denominator)
    mval = Fraction(num, den)
    # back to a decimal (den divides a power of 10 since all were decimals)
    e = 0
    while (mval * 10 ** e).denominator != 1:
        e += 1
    mult = norm_decimal(str(int(mval * 10 ** e)) + ("e-%d" % e if e else ""))
    if len(mult[1]) > 18:
        raise GrammarLimitError("multipleOf combination with more than 18 digits")
    return mult


def _const_schema(v):
    if isinstance(v, dict):
        return {"type": "object", "properties": {k: _const_schema(x) for k, x in v.items()},
                "required": list(v), "additionalProperties": False}
    if isinstance(v, list):
        return {"type": "array", "prefixItems": [_const_schema(x) for x in v], "items": False,
                "minItems": len(v)}
    return {"const": v}


def _holds_nl_end(v):
    """Whether a JSON value holds a string (a key too) that ends in a newline."""
    if isinstance(v, str):
        return v.endswith("\n")
    if isinstance(v, list):
        return any(_holds_nl_end(x) for x in v)
    if isinstance(v, dict):
        return any(k.endswith("\n") or _holds_nl_end(x) for k, x in v.items())
    return False


def _value_type_bit(v):
    if v is None:
        return T_NULL
    if v is True:
        return T_TRUE
    if v is False:
        return T_FALSE
    if isinstance(v, int):
        return T_INT
    if isinstance(v, float):
        return T_INT if v.is_integer() else T_NUM
    if isinstance(v, str):
        return T_STR
    if isinstance(v, list):
        return T_ARR
    if isinstance(v, dict):
        return T_OBJ
    return 0


# ============================================================================
# a schema's program

def compile_program(schema):
    if not isinstance(schema, (dict, bool)):
        raise SchemaError(f"a schema must be an object or a boolean, found {type(schema).__name__}")
    c = Compiler(schema)
    try:
        root = c.node([_Part("#")])
    except RecursionError:
        raise GrammarLimitError("schema nesting too deep to compile") from None
    c.check_oneof()
    c.p.root = root
    return c.p.finish()

