"""Schema access and normalisation: a schema document (plus the compiler's synthetic schemas)
resolved, pointer by pointer, into flat conjunctions of parts -- ``$ref``, ``allOf``, ``not``,
``if``/``then``/``else`` and schema dependencies rewritten -- with every keyword checked.

``SchemaResolver`` is the first half of compiling (llguidance's ``schema.rs``); the builder
(``builder.Compiler``) turns its conjunctions into program nodes."""
from __future__ import annotations

import json
from urllib.parse import unquote

from ..errors import SchemaError, UnsupportedSchemaError
from .formats import EXACT_FORMATS, NARROWED_FORMATS, UNENFORCED_STANDARD_FORMATS, draft_format, format_defined
from .keywords import ANNOTATIONS, DRAFT_DROPPED, KNOWN_UNSUPPORTED, SUPPORTED, _check_values, _nonneg_int

# ============================================================================
# JSON helpers

def compact(value):
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def json_equal(a, b):
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return type(a) == type(b) and a == b


# ============================================================================
# conjunctions of parts

class _Part:
    """One member of a conjunction: the schema at a JSON pointer minus some keywords."""
    __slots__ = ("ptr", "excl")

    def __init__(self, ptr, excl=frozenset()):
        self.ptr = ptr
        self.excl = excl

    def key(self):
        return (self.ptr, self.excl)


def _escape_ptr(k):
    return k.replace("~", "~0").replace("/", "~1")


def _has_ref(node):
    if isinstance(node, dict):
        return "$ref" in node or any(_has_ref(v) for k, v in node.items() if k not in ("enum", "const"))
    if isinstance(node, list):
        return any(_has_ref(v) for v in node)
    return False


def _schema_at(doc, ptr):
    if ptr == "#" or ptr == "":
        return doc
    if not ptr.startswith("#/"):
        raise UnsupportedSchemaError(f"non-local $ref {ptr!r}", keyword="$ref", pointer=ptr)
    cur = doc
    for raw in ptr[2:].split("/"):
        tok = raw.replace("~1", "/").replace("~0", "~") if "~" in raw else raw
        if "%" in tok:
            tok = unquote(tok)
        if isinstance(cur, dict) and tok in cur:
            cur = cur[tok]
        elif isinstance(cur, list) and tok.isdigit() and int(tok) < len(cur):
            cur = cur[int(tok)]
        else:
            raise SchemaError(f"$ref target {ptr!r} does not exist")
    return cur


def _property_dependency(resolver, dk, dv, ptr):
    """The property names a dependency requires, or None for a schema dependency: a list
    (draft 3: one name as a string), or a schema of ``required`` alone."""
    if isinstance(dv, list):
        return dv
    if isinstance(dv, str) and resolver.draft <= 3 and dk == "dependencies":
        return [dv]
    if isinstance(dv, dict):
        view = resolver.get(ptr)
        if set(view) - ANNOTATIONS <= {"required"}:
            return view.get("required", [])
    return None


class SchemaResolver:
    """A schema document and the compiler's synthetic schemas (``~synN`` pointers), resolved into
    flat conjunctions (``expand``) and negated exactly (``negate``)."""

    def __init__(self, doc):
        self.doc = doc
        self.synthetic = {}   # pointer "~synN" -> schema dict
        self.draft = self._draft(doc)
        self.neg_errors = {}     # pointer -> why its `not` has no exact rewrite (fill() raises it
                                 # unless a finite enum makes that `not` exact)
        self._checked = set()    # ids of schema dicts whose keyword values were checked
        self._views = {}         # id of a user schema dict -> (that dict, its view in its draft)

    @staticmethod
    def _draft(doc):
        s = doc.get("$schema", "") if isinstance(doc, dict) else ""
        if not isinstance(s, str):
            raise SchemaError(f"$schema at # must be a string (a URI), found {type(s).__name__} {s!r}")
        for d in ("draft-03", "draft-04", "draft-06", "draft-07"):
            if d in s:
                return int(d[-1])
        if "2019-09" in s:
            return 2019
        return 2020

    # -- schema access
    def get(self, ptr):
        """The schema at ``ptr``.  A user schema is read in its draft's vocabulary: the keywords
        the draft does not define are annotations there and are dropped here, before any rule
        reads them (``keywords.DRAFT_DROPPED``: draft 4's ``const`` is no constraint, its
        ``enum`` is).  A synthetic schema (``~synN``) is the compiler's and keeps every keyword
        whatever the document's draft."""
        if ptr.startswith("~syn"):
            head, _, rest = ptr.partition("/")
            base = self.synthetic[head]
            if not rest:
                return base
            cur = base
            for raw in rest.split("/"):
                tok = raw.replace("~1", "/").replace("~0", "~")
                cur = cur[int(tok)] if isinstance(cur, list) else cur[tok]
            return cur
        sch = _schema_at(self.doc, ptr)
        if type(sch) is not dict:
            return sch
        hit = self._views.get(id(sch))
        if hit is None:
            dropped = DRAFT_DROPPED[self.draft]
            view = sch if dropped.isdisjoint(sch) else {k: v for k, v in sch.items() if k not in dropped}
            hit = self._views[id(sch)] = (sch, view)   # (the dict itself keeps its id unique)
        return hit[1]

    def raw(self, ptr):
        """The user schema at ``ptr`` as written (for draft 3's ``required: true``, read by the
        object that holds the property)."""
        return _schema_at(self.doc, ptr)

    def synth(self, schema):
        name = f"~syn{len(self.synthetic)}"
        self.synthetic[name] = schema
        return name

    # -- conjunction expansion
    def expand(self, parts):
        """Flatten $ref and allOf; returns list of (_Part, dict) or None when false."""
        out = []
        seen = set()
        stack = list(parts)
        while stack:
            part = stack.pop()
            if part.key() in seen:
                continue
            seen.add(part.key())
            sch = self.get(part.ptr)
            if sch is True or sch == {}:
                continue
            if sch is False:
                return None
            if not isinstance(sch, dict):
                raise SchemaError(f"schema at {part.ptr} is not an object or boolean")
            self.check_keywords(sch, part.ptr)
            excl = set(part.excl)
            if "$ref" in sch and "$ref" not in excl:
                ref = sch["$ref"]
                if not isinstance(ref, str):
                    raise SchemaError(f"$ref at {part.ptr} is not a string")
                target = self.resolve_ref(ref, part.ptr)
                stack.append(_Part(target))
                excl.add("$ref")
                if self.draft <= 7:
                    # draft <= 7: siblings of $ref are ignored
                    continue
            if "__ptr" in sch and "__ptr" not in excl:
                stack.append(_Part(sch["__ptr"]))
                excl.add("__ptr")
            if "not" in sch and "not" not in excl:
                try:
                    neg = self.negate(f"{part.ptr}/not", 0)
                except UnsupportedSchemaError as exc:
                    neg = None   # left to fill(): exact by filtering a finite enum, or this error
                    self.neg_errors[part.ptr] = exc
                if neg is not None:
                    stack.append(_Part(self.synth(neg)))
                    excl.add("not")
            for dk in ("dependencies", "dependentSchemas"):
                if dk in sch and dk + ":schemas" not in excl and isinstance(sch[dk], dict):
                    # a schema dependency: the property is absent, or the schema holds
                    for name, dv in sch[dk].items():
                        dp = f"{part.ptr}/{dk}/{_escape_ptr(name)}"
                        if _property_dependency(self, dk, dv, dp) is not None:
                            continue  # property dependencies: checked by the object frame
                        stack.append(_Part(self.synth({"anyOf": [{"properties": {name: False}}, {"__ptr": dp}]})))
                    excl.add(dk + ":schemas")
            if "if" in sch and "if" not in excl:
                # (if and then) or (not if and else), with `not if` rewritten exactly
                ip = f"{part.ptr}/if"
                neg_if = self.negate(ip, 0)
                then = {"__ptr": f"{part.ptr}/then"} if "then" in sch else True
                els = {"__ptr": f"{part.ptr}/else"} if "else" in sch else True
                stack.append(_Part(self.synth({"anyOf": [{"allOf": [{"__ptr": ip}, then]},
                                                         {"allOf": [neg_if, els]}]})))
                excl.update(("if", "then", "else"))
            if "allOf" in sch and "allOf" not in excl:
                subs = sch["allOf"]
                if not isinstance(subs, list):
                    raise SchemaError(f"allOf at {part.ptr} is not a list")
                for i in range(len(subs)):
                    stack.append(_Part(f"{part.ptr}/allOf/{i}"))
                excl.add("allOf")
            out.append((_Part(part.ptr, frozenset(excl)), sch))
        return out

    # -- negation (`not`), rewritten exactly into positive keywords (De Morgan per keyword)
    ALL_TYPES = ("null", "boolean", "object", "array", "number", "string")

    def negate(self, ptr, depth):
        """A schema accepting exactly the instances the schema at ptr rejects."""
        if depth > 20:
            raise UnsupportedSchemaError(f"'not' nested too deep at {ptr}", keyword="not", pointer=ptr)
        sch = self.get(ptr)
        if sch is True:
            return False
        if sch is False:
            return True
        if not isinstance(sch, dict):
            raise SchemaError(f"schema at {ptr} is not an object or boolean")
        self.check_keywords(sch, ptr)
        keys = [k for k in sch if k not in ANNOTATIONS and not k.startswith("x-")]
        if "$ref" in keys and self.draft <= 7:
            return self.negate(self.resolve_ref(sch["$ref"], ptr), depth + 1)
        alts = []
        done = set()
        for k in keys:
            if k in done:
                continue
            done.add(k)
            v = sch[k]
            if k not in SUPPORTED and k not in ("__ptr",):
                continue  # unknown keyword: an annotation, always satisfied
            alts.append(self._negate_keyword(ptr, sch, k, v, depth, done))
        alts = [a for a in alts if a is not False]
        if not alts:
            return False
        if any(a is True for a in alts):
            return True
        return alts[0] if len(alts) == 1 else {"anyOf": alts}

    def _others(self, *types):
        rest = [t for t in self.ALL_TYPES if t not in types]
        return {"type": rest} if rest else False

    def _negate_keyword(self, ptr, sch, k, v, depth, done):
        """Negation of one keyword.  A keyword that constrains one type only (pattern, minimum,
        required...) is satisfied by every other type, so its negation keeps that type only."""
        kp = f"{ptr}/{_escape_ptr(k)}"

        def unsupported():
            raise UnsupportedSchemaError(f"'not' over {k!r} is not supported (at {kp})", keyword="not", pointer=kp)

        def either(*alts):
            alts = [a for a in alts if a is not False]
            if not alts:
                return False
            return alts[0] if len(alts) == 1 else {"anyOf": list(alts)}

        if k == "$ref":
            return self.negate(self.resolve_ref(v, ptr), depth + 1)
        if k == "__ptr":
            return self.negate(v, depth + 1)
        if k == "not":
            return {"__ptr": kp}
        if k == "anyOf" and isinstance(v, list):
            return {"allOf": [self.negate(f"{kp}/{i}", depth + 1) for i in range(len(v))]}
        if k == "allOf" and isinstance(v, list):
            return {"anyOf": [self.negate(f"{kp}/{i}", depth + 1) for i in range(len(v))]} if v else False
        if k == "type":
            tl = v if isinstance(v, list) else [v]
            if "integer" in tl and "number" not in tl:
                unsupported()
            return self._others(*[("number" if t == "integer" else t) for t in tl])
        if k in ("enum", "const"):
            vals = v if k == "enum" else [v]
            if any(isinstance(x, (list, dict)) for x in vals):
                unsupported()
            nums = [x for x in vals if isinstance(x, (int, float)) and not isinstance(x, bool)]
            strs = [x for x in vals if isinstance(x, str)]
            lits = [x for x in (True, False, None) if not any(json_equal(x, y) for y in vals)]

            def other_than(n):
                return {"anyOf": [{"type": "number", "exclusiveMaximum": n},
                                  {"type": "number", "exclusiveMinimum": n}]}
            return either(self._others("boolean", "null", "string", "number"),
                          {"enum": lits} if lits else False,
                          {"type": "string", "__not_strings": strs} if strs else {"type": "string"},
                          {"allOf": [other_than(n) for n in nums]} if nums else {"type": "number"})
        if k == "pattern":
            if not isinstance(v, str):
                raise SchemaError(f"pattern at {ptr} is not a string")
            return {"type": "string", "__not_pattern": v}   # non-strings satisfy `pattern`
        if k == "format":
            v = draft_format(v, self.draft)
            if not format_defined(v, self.draft):
                return False         # `not` over what is, by the letter of the draft, an annotation
            if v in NARROWED_FORMATS:
                raise UnsupportedSchemaError(
                    f"'not' over format {v!r} (at {kp}): the grammar's {v} refuses some valid "
                    f"values, so its complement would accept them; negation is exact only for "
                    f"formats {sorted(EXACT_FORMATS)}", keyword="not", pointer=kp)
            if v in EXACT_FORMATS:
                return {"type": "string", "__not_format": v}
            if v in UNENFORCED_STANDARD_FORMATS:
                unsupported()
            return False
        if k == "required":
            if not v:
                return False
            return either(*[{"type": "object", "properties": {name: False}} for name in v])
        if k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            if isinstance(v, bool):
                return False  # draft-4 flag: negated together with its bound
            is_min = k in ("minimum", "exclusiveMinimum")
            excl = k.startswith("exclusive") or sch.get("exclusiveMinimum" if is_min else "exclusiveMaximum") is True
            # not (x >= m) is x < m; not (x > m) is x <= m
            bound = ("exclusiveMaximum" if not excl else "maximum") if is_min else \
                    ("exclusiveMinimum" if not excl else "minimum")
            return {"type": "number", bound: v}   # (synthetic: the numeric form in every draft)
        counts = {"minLength": ("string", "maxLength"), "maxLength": ("string", "minLength"),
                  "minItems": ("array", "maxItems"), "maxItems": ("array", "minItems"),
                  "minProperties": ("object", "maxProperties"), "maxProperties": ("object", "minProperties")}
        if k in counts:
            t, other = counts[k]
            n = _nonneg_int(v, ptr, k)
            if k.startswith("min"):
                return {"type": t, other: n - 1} if n > 0 else False
            return {"type": t, other: n + 1}
        if k == "uniqueItems" and v is False:
            return False
        if k in ("contains", "minContains", "maxContains"):
            # fewer matching items than minContains (default 1), or more than maxContains:
            # a count of the contains schema with the other bound (maxContains needs its
            # complement, made where the count is compiled)
            done.update(("contains", "minContains", "maxContains"))
            if "contains" not in sch:
                return False       # minContains/maxContains alone constrain nothing
            cp = f"{ptr}/contains"
            lo = _nonneg_int(sch.get("minContains", 1), ptr, "minContains")
            hi = _nonneg_int(sch["maxContains"], ptr, "maxContains") if "maxContains" in sch else None
            fewer = {"type": "array", "contains": {"__ptr": cp}, "minContains": 0, "maxContains": lo - 1} \
                if lo > 0 else False
            more = {"type": "array", "contains": {"__ptr": cp}, "minContains": hi + 1} if hi is not None else False
            return either(fewer, more)
        if k == "properties" and isinstance(v, dict):
            # violated iff some declared property is present with a value its schema rejects
            return either(*[{"type": "object", "required": [name],
                             "properties": {name: self.negate(f"{kp}/{_escape_ptr(name)}", depth + 1)}}
                            for name in v])
        unsupported()

    def resolve_ref(self, ref, where):
        if ref == "#":
            return "#"
        if ref.startswith("#/"):
            # validate it exists
            try:
                _schema_at(self.doc, ref)
            except SchemaError:
                raise SchemaError(f"$ref {ref!r} at {where} does not resolve") from None
            return ref
        if ref.startswith("#"):
            # plain-name anchor: search $anchor / id fragments
            name = ref[1:]
            found = self._find_anchor(self.doc, "#", name)
            if found is None:
                raise UnsupportedSchemaError(f"$ref {ref!r} (anchor) at {where}", keyword="$ref", pointer=where)
            return found
        raise UnsupportedSchemaError(f"remote $ref {ref!r} at {where}", keyword="$ref", pointer=where)

    def _find_anchor(self, node, ptr, name):
        if isinstance(node, dict):
            if node.get("$anchor") == name or node.get("$id") == "#" + name or node.get("id") == "#" + name:
                return ptr
            for k, v in node.items():
                if k in ("enum", "const", "default", "examples"):
                    continue
                r = self._find_anchor(v, f"{ptr}/{_escape_ptr(k)}", name)
                if r:
                    return r
        elif isinstance(node, list):
            for i, v in enumerate(node):
                r = self._find_anchor(v, f"{ptr}/{i}", name)
                if r:
                    return r
        return None

    def check_keywords(self, sch, ptr):
        if id(sch) not in self._checked:
            _check_values(sch, ptr, self.draft)
            self._checked.add(id(sch))
        for k in sch:
            if k in KNOWN_UNSUPPORTED:
                if k in ("then", "else") and "if" not in sch:
                    continue  # without "if" they do nothing
                raise UnsupportedSchemaError(f"keyword {k!r} is not supported (at {ptr})", keyword=k,
                                             pointer=f"{ptr}/{_escape_ptr(k)}")
        # an embedded resource id changes how $refs inside it resolve: refused only when some
        # $ref lives under it (otherwise it changes nothing)
        for idk in ("id", "$id"):
            if idk == "id" and self.draft > 4:
                continue
            v = sch.get(idk)
            if isinstance(v, str) and ptr != "#" and not v.startswith("#") and _has_ref(sch):
                raise UnsupportedSchemaError(f"embedded schema resource {idk} {v!r} with $refs at {ptr}",
                                             keyword=idk, pointer=ptr)

