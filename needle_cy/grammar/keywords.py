"""The JSON Schema keywords the compiler knows, as tables, and the shape checks of their values.

``SUPPORTED`` keywords are compiled, ``ANNOTATIONS`` are ignored, ``KNOWN_UNSUPPORTED`` raise
``UnsupportedSchemaError``; any other keyword is an annotation (``misspelt_keyword`` tells
the ones that look like a typo of a constraint keyword, which ``toolspec`` warns about).  ``_check_values`` turns a
malformed keyword value into a ``SchemaError`` naming keyword and pointer (never a bare Python
exception).  The format names live in ``formats``."""
from __future__ import annotations

from ..errors import SchemaError

ANNOTATIONS = {
    "title", "description", "examples", "example", "default", "$comment", "$schema", "$id", "id",
    "readOnly", "writeOnly", "deprecated", "$anchor", "$vocabulary", "contentMediaType",
    "contentEncoding", "contentSchema", "definitions", "$defs", "markdownDescription",
}
# INTERNAL keywords are made by the compiler (`not`, `if`, dependencies) in its synthetic
# schemas only; in a user schema they are unknown keywords -- annotations, stripped by
# SchemaResolver.get -- so a user schema can never reach them.
INTERNAL = frozenset({"__ptr", "__not_pattern", "__not_strings", "__not_format"})
SUPPORTED = {
    "type", "enum", "const", "minLength", "maxLength", "pattern", "format", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "items", "prefixItems", "additionalItems",
    "minItems", "maxItems", "uniqueItems", "properties", "required", "additionalProperties",
    "patternProperties", "propertyNames", "minProperties", "maxProperties", "$ref", "allOf",
    "dependencies", "dependentRequired", "dependentSchemas", "if", "then", "else",
    "anyOf", "oneOf", "not", "contains", "minContains", "maxContains",
} | INTERNAL

KNOWN_UNSUPPORTED = {
    "unevaluatedProperties", "unevaluatedItems", "$dynamicRef",
    "$recursiveRef", "$dynamicAnchor", "$recursiveAnchor", "disallow", "extends", "divisibleBy",
}

# The keywords each draft defines, of those the compiler knows (SUPPORTED and
# KNOWN_UNSUPPORTED).  In a user schema a keyword its draft does not define is an annotation
# by the letter of that draft -- draft 4's `const` and `propertyNames`, draft 7's
# `dependentRequired`, 2019-09's `dependencies` -- and SchemaResolver.get drops it, in one
# place, before any rule reads the schema.  The compiler's own synthetic schemas are read in
# the full vocabulary whatever the document's draft (an exact value is `const`/`prefixItems`
# in every draft).  Draft 3's `required` is a boolean inside a property schema (read by the
# object that holds the property) and its `dependencies` may name one property as a string.
# 2020-12 keeps the array form of `items` with `additionalItems` (read as draft 4 reads
# them): schemas without `$schema` often use it, and the 2020-12 meta-schema refuses it,
# so no 2020-12 schema reads it otherwise.
_DRAFT3 = {
    "$ref", "type", "enum", "format", "minLength", "maxLength", "pattern", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "items", "additionalItems", "minItems", "maxItems",
    "uniqueItems", "properties", "patternProperties", "additionalProperties", "dependencies",
    "disallow", "extends", "divisibleBy",
}
_DRAFT4 = (_DRAFT3 - {"disallow", "extends", "divisibleBy"}) | {
    "multipleOf", "required", "minProperties", "maxProperties", "allOf", "anyOf", "oneOf", "not",
}
_DRAFT6 = _DRAFT4 | {"const", "contains", "propertyNames"}
_DRAFT7 = _DRAFT6 | {"if", "then", "else"}
_DRAFT2019 = (_DRAFT7 - {"dependencies"}) | {
    "dependentRequired", "dependentSchemas", "minContains", "maxContains", "unevaluatedProperties",
    "unevaluatedItems", "$recursiveRef", "$recursiveAnchor",
}
_DRAFT2020 = (_DRAFT2019 - {"$recursiveRef", "$recursiveAnchor"}) | {"prefixItems", "$dynamicRef", "$dynamicAnchor"}
DRAFT_KEYWORDS = {3: frozenset(_DRAFT3), 4: frozenset(_DRAFT4), 6: frozenset(_DRAFT6), 7: frozenset(_DRAFT7),
                  2019: frozenset(_DRAFT2019), 2020: frozenset(_DRAFT2020)}
# per draft: the known keywords that are annotations there (dropped from user schemas), with
# the compiler's internal ones (never a user's)
DRAFT_DROPPED = {d: frozenset((SUPPORTED | KNOWN_UNSUPPORTED) - kws) for d, kws in DRAFT_KEYWORDS.items()}


# Keywords whose misspelling loses a constraint: an unknown keyword is an annotation, so
# "maximun": 10 silently enforces nothing.  Typos of annotations lose nothing enforced.
_CONSTRAINTS = tuple(sorted((SUPPORTED | KNOWN_UNSUPPORTED) - INTERNAL))
_KNOWN = SUPPORTED | KNOWN_UNSUPPORTED | ANNOTATIONS


def _folded(name):
    return name.lower().replace("_", "").replace("-", "")


def edit_distance(a, b):
    """Edits (insert, delete, substitute, swap two neighbours) that turn ``a`` into ``b``
    (optimal string alignment distance)."""
    prev2, prev = None, list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        prev2, prev = prev, cur
    return prev[-1]


_NUMBER_KEYWORDS = frozenset({
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "divisibleBy",
    "minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties",
    "minContains", "maxContains"})
_STRING_KEYWORDS = frozenset({"pattern", "format", "$ref", "$dynamicRef", "$recursiveRef",
                              "$dynamicAnchor"})
_OBJECT_KEYWORDS = frozenset({"properties", "patternProperties", "dependentSchemas", "dependencies",
                              "dependentRequired"})
_LIST_KEYWORDS = frozenset({"enum", "required", "allOf", "anyOf", "oneOf", "prefixItems"})
_NO_VALUE = object()


def _value_fits(keyword, v):
    """Whether ``v`` has the shape of a value of ``keyword`` (loosely: a typo's value does)."""
    if keyword in _NUMBER_KEYWORDS:
        return isinstance(v, (int, float)) and (not isinstance(v, bool) or keyword.startswith("exclusive"))
    if keyword in _STRING_KEYWORDS:
        return isinstance(v, str)
    if keyword in _OBJECT_KEYWORDS:
        return isinstance(v, dict)
    if keyword in _LIST_KEYWORDS:
        return isinstance(v, list) or (keyword == "required" and isinstance(v, bool))
    if keyword == "type":
        return isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v))
    if keyword in ("uniqueItems", "disallow", "extends", "$recursiveAnchor"):
        return True
    if keyword == "const":
        return True
    return _is_schema(v) or (keyword in ("items", "additionalItems") and isinstance(v, list))


def misspelt_keyword(name, value=_NO_VALUE, known=_CONSTRAINTS):
    """The keyword of ``known`` that the unknown keyword ``name`` (with ``value``, when
    given) looks like a misspelling of, or None: the same up to case, inner ``_`` and
    ``-`` (``max_length``), or within one edit of a keyword of up to 5 letters, two of up
    to 11, three of a longer one (``maximun``, ``minLenght``, ``additionalProperty``),
    and with a value of the shape that keyword takes.  A known keyword of any kind is
    never a typo, nor a name starting with another character than a letter (``_format``,
    ``@type``: the conventional ways to switch a keyword off or to add vendor data), nor
    a near miss of the two-letter or three-letter keywords ``if``/``not`` (``note``)."""
    if not isinstance(name, str) or not name[:1].isalpha() or name in _KNOWN or name in known:
        return None
    folded = _folded(name)
    best, best_d = None, None
    for k in known:
        if value is not _NO_VALUE and not _value_fits(k, value):
            continue
        fk = _folded(k)
        if folded == fk:
            return k
        if len(fk) <= 3 or len(folded) < 3 or abs(len(folded) - len(fk)) > 3:
            continue
        d = edit_distance(folded, fk)
        if d <= (1 if len(fk) <= 5 else 2 if len(fk) <= 11 else 3) and (best_d is None or d < best_d):
            best, best_d = k, d
    return best


def _is_schema(v):
    return isinstance(v, (dict, bool))


def _check_values(sch, ptr, draft):
    """The shape of each keyword's value (a malformed value is a SchemaError naming the keyword,
    the pointer, what was expected and what was found -- never a bare Python exception)."""
    def bad(k, expected, v):
        raise SchemaError(f"{k} at {ptr} must be {expected}, found {type(v).__name__} {_short(v)}")

    def names(k, v):
        if not isinstance(v, list):
            bad(k, "a list of property names", v)
        for i, x in enumerate(v):
            if not isinstance(x, str):
                raise SchemaError(f"{k} at {ptr}: entry {i} must be a property name (string), "
                                  f"found {type(x).__name__} {_short(x)}")

    for k, v in sch.items():
        if k == "required":
            names(k, v)   # (draft 3's boolean form is no keyword of the view: see DRAFT_KEYWORDS)
        elif k == "dependentRequired":
            if not isinstance(v, dict):
                bad(k, "an object of property-name lists", v)
            for name, dv in v.items():
                names(f"{k}/{name}", dv)
        elif k == "dependencies":
            if not isinstance(v, dict):
                bad(k, "an object", v)
            for name, dv in v.items():
                if isinstance(dv, list):
                    names(f"{k}/{name}", dv)
                elif isinstance(dv, str) and draft <= 3:
                    continue   # draft 3: the one property it requires
                elif not _is_schema(dv):
                    bad(f"{k}/{name}", "a list of property names or a schema", dv)
        elif k in ("dependentSchemas", "properties", "patternProperties", "$defs", "definitions"):
            if not isinstance(v, dict):
                bad(k, "an object", v)
        elif k == "prefixItems" or k in ("allOf", "anyOf", "oneOf", "enum"):
            if not isinstance(v, list):
                bad(k, "a list", v)
        elif k == "items":
            if not (_is_schema(v) or isinstance(v, list)):
                bad(k, "a schema or a list of schemas", v)
        elif k in ("additionalItems", "additionalProperties", "propertyNames", "not", "if", "then",
                   "else", "contains"):
            if not _is_schema(v):
                bad(k, "a schema (an object or a boolean)", v)
        elif k in ("pattern", "format", "$ref"):
            if not isinstance(v, str):
                bad(k, "a string", v)
        elif k == "type":
            for x in (v if isinstance(v, list) else [v]):
                if not isinstance(x, (str, dict)):
                    bad(k, "a type name or a list of type names", v)


def _short(v):
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _nonneg_int(v, ptr, kw):
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise SchemaError(f"{kw} at {ptr} must be a non-negative integer, found {v!r}")
    return v

