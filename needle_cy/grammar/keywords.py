"""The JSON Schema keywords the compiler knows, as tables, and the shape checks of their values.

``SUPPORTED`` keywords are compiled, ``ANNOTATIONS`` are ignored, ``KNOWN_UNSUPPORTED`` raise
``UnsupportedSchemaError``; any other keyword is an annotation.  ``_check_values`` turns a
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
    "anyOf", "oneOf", "not",
} | INTERNAL

KNOWN_UNSUPPORTED = {
    "contains",
    "minContains", "maxContains", "unevaluatedProperties", "unevaluatedItems", "$dynamicRef",
    "$recursiveRef", "$dynamicAnchor", "$recursiveAnchor", "disallow", "extends", "divisibleBy",
}


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
            if isinstance(v, bool) and draft <= 3:
                continue
            names(k, v)
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

