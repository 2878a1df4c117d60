"""Tool definitions: Python functions, JSON-Schema dicts, JSON strings and pydantic
models normalised to one ``ToolSpec`` shape (spec §8.3).

Two views of each tool are kept on purpose:

* ``ToolSpec.schema`` — the dict the model *reads* in the prompt: the spec §8.3 rendering
  (key order ``name``, ``description``, ``parameters``[, ``triggers``]), with
  non-standard type names mapped to JSON Schema, and otherwise as the user wrote it
  (the model is sensitive to formatting, so nothing is added here).
* ``ToolSpec.grammar_schema()`` — what the decoder *enforces*: the same parameters with
  ``additionalProperties: false`` implied on every object that declares ``properties``
  (unless the schema says otherwise) and local ``$ref``s inlined.

Every malformed definition raises ``SchemaError`` naming the tool, the JSON pointer of
the bad keyword, and what was expected.  A keyword JSON Schema does not know is an
annotation (it constrains nothing); one that looks like a misspelt constraint keyword
(``"maximun": 10``, ``"minLenght"``, ``"max_length"``; ``grammar.keywords.misspelt_keyword``)
warns with ``SchemaWarning`` naming the tool and the keyword's path, and raises
``SchemaError`` with ``strict=True``.  A misspelt key of the tool itself (``"parameter"``,
``"params"``) is treated the same way.

``home_tools()`` is the smart-home catalogue the embedded default model was trained on.
"""
from __future__ import annotations

import copy
import enum
import inspect
import json
import os
import re
import sys
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from .errors import ModelNotAvailableError, SchemaError, SchemaWarning

__all__ = ["Field", "tool", "ToolSpec", "normalize_tool", "normalize_tools", "function_schema",
           "home_tools", "HOME_TOOLS_PATH"]

HOME_TOOLS_PATH = Path(__file__).resolve().parent / "models" / "home_tools.json"


def home_tools() -> List[Dict[str, Any]]:
    """The smart-home tool catalogue the embedded default model was trained on (20
    JSON-Schema tool definitions: ``set_light``, ``lock_door``, ...), a fresh copy each
    call.  ``Needle()`` with neither ``model`` nor ``tools`` uses it, as does the CLI
    without ``--tools``; pass it (or a part of it) as ``tools=`` to use it with another
    model."""
    try:
        with open(HOME_TOOLS_PATH, "rb") as f:
            return json.loads(f.read().decode("utf-8"))
    except FileNotFoundError:
        raise ModelNotAvailableError(
            f"the smart-home tool catalogue of the embedded model is not installed "
            f"({HOME_TOOLS_PATH} is missing); reinstall needle_cy, or pass your own tools=[...]"
        ) from None

_MISSING = object()

# Type names seen in the wild (Python-ish, OpenAPI-ish) → JSON Schema.  "any" drops the
# type constraint altogether (any JSON value).
_TYPE_ALIASES = {
    "string": "string", "str": "string", "text": "string",
    "integer": "integer", "int": "integer", "long": "integer",
    "number": "number", "float": "number", "double": "number", "decimal": "number",
    "boolean": "boolean", "bool": "boolean",
    "array": "array", "list": "array", "tuple": "array", "set": "array",
    "object": "object", "dict": "object", "map": "object", "mapping": "object",
    "null": "null", "none": "null",
    "any": None,
}
_JSON_TYPES = {"string", "integer", "number", "boolean", "array", "object", "null"}


# --------------------------------------------------------------------------- Field

class Field:
    """Constraints for one parameter, given as its default value or inside ``Annotated``.

    Mirrors the official ``needle.Field``: ``ge``/``le`` → minimum/maximum, ``gt``/``lt``
    → exclusive bounds, and the JSON-Schema string/array keywords.  A ``Field`` makes a
    parameter optional only when ``default=`` is given.
    """

    # (attribute, JSON-Schema key) in the order the keys are applied (spec §8.3).
    _KEYS = (
        ("description", "description"), ("enum", "enum"), ("ge", "minimum"),
        ("le", "maximum"), ("gt", "exclusiveMinimum"), ("lt", "exclusiveMaximum"),
        ("multiple_of", "multipleOf"), ("min_length", "minLength"),
        ("max_length", "maxLength"), ("pattern", "pattern"), ("format", "format"),
        ("min_items", "minItems"), ("max_items", "maxItems"),
        ("unique_items", "uniqueItems"),
    )

    def __init__(self, default: Any = _MISSING, *, description: Optional[str] = None,
                 enum: Optional[list] = None, ge: Optional[float] = None, le: Optional[float] = None,
                 gt: Optional[float] = None, lt: Optional[float] = None,
                 multiple_of: Optional[float] = None, min_length: Optional[int] = None,
                 max_length: Optional[int] = None, pattern: Optional[str] = None,
                 format: Optional[str] = None, min_items: Optional[int] = None,
                 max_items: Optional[int] = None, unique_items: Optional[bool] = None,
                 const: Any = _MISSING) -> None:
        self.default = default
        self.description = description
        self.enum = list(enum) if enum is not None else None
        self.ge, self.le, self.gt, self.lt = ge, le, gt, lt
        self.multiple_of = multiple_of
        self.min_length, self.max_length = min_length, max_length
        self.pattern, self.format = pattern, format
        self.min_items, self.max_items = min_items, max_items
        self.unique_items = unique_items
        self.const = const

    @property
    def has_default(self) -> bool:
        return self.default is not _MISSING

    def apply(self, schema: dict) -> dict:
        """Set this Field's constraints on ``schema`` (existing keys keep their place)."""
        for attr, key in self._KEYS:
            value = getattr(self, attr)
            if value is not None:
                schema[key] = list(value) if key == "enum" else value
        if self.const is not _MISSING:
            schema["const"] = self.const
        return schema

    def __repr__(self):
        parts = [f"{a}={getattr(self, a)!r}" for a, _ in self._KEYS if getattr(self, a) is not None]
        if self.has_default:
            parts.insert(0, f"default={self.default!r}")
        return f"Field({', '.join(parts)})"


# ----------------------------------------------------------------- callable → schema

def _json_type_of_value(value):
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if value is None:
        return "null"
    return "string"


def _is_pydantic_model(obj):
    if not inspect.isclass(obj):
        return False
    for base in obj.__mro__:
        if base.__name__ == "BaseModel" and base.__module__.startswith("pydantic"):
            return True
    return False


def _non_none_args(annotation):
    return [a for a in typing.get_args(annotation) if a is not type(None)]


def _is_optional(annotation):
    origin = typing.get_origin(annotation)
    if annotation is None or annotation is type(None):
        return True
    if origin is typing.Union or _is_union_type(annotation):
        return any(a is type(None) for a in typing.get_args(annotation))
    if origin is typing.Annotated:
        return _is_optional(typing.get_args(annotation)[0])
    return False


def _is_union_type(annotation):
    union_type = getattr(__import__("types"), "UnionType", None)
    return union_type is not None and isinstance(annotation, union_type)


def _annotation_schema(annotation) -> dict:
    """JSON schema of one annotation (spec §8.3 table)."""
    if annotation is inspect.Parameter.empty or annotation is None or annotation is type(None):
        return {"type": "string"}
    if annotation is typing.Any:
        return {}
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _annotation_schema(typing.get_args(annotation)[0])
    if origin is typing.Union or _is_union_type(annotation):
        members = _non_none_args(annotation)
        return _annotation_schema(members[0]) if members else {"type": "string"}
    if origin is typing.Literal:
        values = list(typing.get_args(annotation))
        return {"type": _json_type_of_value(values[0]) if values else "string", "enum": values}
    if origin in (list, typing.List, set, frozenset, tuple) or annotation in (list, set, tuple, frozenset):
        args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        schema = {"type": "array"}
        if args:
            schema["items"] = _annotation_schema(args[0])
        elif annotation in (list, set, tuple, frozenset):
            schema["items"] = {"type": "string"}
        return schema
    if origin in (dict, typing.Dict) or annotation is dict:
        return {"type": "object"}
    if inspect.isclass(annotation):
        if issubclass(annotation, enum.Enum):
            values = [m.value for m in annotation]
            return {"type": _json_type_of_value(values[0]) if values else "string", "enum": values}
        if _is_pydantic_model(annotation):
            return pydantic_schema(annotation)["parameters"]
        if annotation is bool:
            return {"type": "boolean"}
        if annotation is int:
            return {"type": "integer"}
        if annotation is float:
            return {"type": "number"}
        if annotation is str:
            return {"type": "string"}
    return {"type": "string"}


def _field_of(annotation, default):
    """The Field given as the default, inside Annotated, or inside Optional[Annotated]."""
    if isinstance(default, Field):
        return default
    candidates = [annotation]
    origin = typing.get_origin(annotation)
    if origin is typing.Union or _is_union_type(annotation):
        members = _non_none_args(annotation)
        if len(members) == 1:
            candidates.append(members[0])
    for cand in candidates:
        if typing.get_origin(cand) is typing.Annotated:
            for meta in typing.get_args(cand)[1:]:
                if isinstance(meta, Field):
                    return meta
    return None


_ARG_HEADINGS = re.compile(r"^\s*(args|arguments|parameters|params)\s*:\s*$", re.IGNORECASE)
_SECTION_HEADING = re.compile(r"^\s*[A-Z][\w ]*:\s*$")
_ARG_LINE = re.compile(r"^\s*\*{0,2}(\w+)\s*(?:\(([^)]*)\))?\s*:\s*(.*)$")


def parse_docstring(doc: Optional[str]):
    """(description, {arg: text}) from a Google-style docstring (spec §8.3)."""
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    desc_lines, args = [], {}
    i = 0
    while i < len(lines) and not _ARG_HEADINGS.match(lines[i]):
        desc_lines.append(lines[i].strip())
        i += 1
    if i < len(lines):
        heading_indent = len(lines[i]) - len(lines[i].lstrip())
        i += 1
        current, current_indent = None, None
        for line in lines[i:]:
            if not line.strip():
                continue
            indent = len(line) - len(line.lstrip())
            if indent <= heading_indent and _SECTION_HEADING.match(line):
                break
            if current is not None and indent > current_indent:
                args[current] = (args[current] + " " + line.strip()).strip()
                continue
            m = _ARG_LINE.match(line)
            if m:
                current, current_indent = m.group(1), indent
                args[current] = m.group(3).strip()
            elif current is not None:
                args[current] = (args[current] + " " + line.strip()).strip()
    description = " ".join(part for part in desc_lines if part)
    return description, args


def function_schema(fn: Callable, name=None, description=None, triggers=None) -> dict:
    """Spec §8.3 schema of a Python function."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise SchemaError(f"cannot read the signature of {fn!r}: {exc}") from None
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception:
        hints = {}
    doc_description, doc_args = parse_docstring(inspect.getdoc(fn))
    properties, required = {}, []
    for pname, param in sig.parameters.items():
        if pname in ("self", "cls") or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        annotation = hints.get(pname, param.annotation)
        prop = _annotation_schema(annotation)
        if pname in doc_args and doc_args[pname] and "description" not in prop:
            prop["description"] = doc_args[pname]
        fld = _field_of(annotation, param.default)
        if fld is not None:
            fld.apply(prop)
        has_default = param.default is not inspect.Parameter.empty
        if isinstance(param.default, Field):
            has_default = param.default.has_default
        if not has_default and not _is_optional(annotation):
            required.append(pname)
        properties[pname] = prop
    parameters = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    out = {"name": name or fn.__name__}
    desc = description if description is not None else doc_description
    if desc:
        out["description"] = desc
    out["parameters"] = parameters
    if triggers:
        out["triggers"] = list(triggers)
    return out


def pydantic_schema(model_cls) -> dict:
    """Spec §8.3 schema of a pydantic model class (pydantic v2 or v1)."""
    if hasattr(model_cls, "model_json_schema"):
        js = model_cls.model_json_schema()
    else:  # pydantic v1
        js = model_cls.schema()
    parameters = {"type": "object", "properties": js.get("properties", {})}
    for key in ("required", "$defs", "definitions"):
        if key in js:
            parameters[key] = js[key]
    out = {"name": js.get("title") or model_cls.__name__, "parameters": parameters}
    doc = inspect.getdoc(model_cls)
    if doc and doc.strip() and not doc.startswith(("Usage docs:", "A base class for creating Pydantic models")):
        out["description"] = doc.strip()
    return out


def tool(fn: Optional[Callable] = None, *, name: Optional[str] = None,
         description: Optional[str] = None, triggers: Optional[list] = None) -> Any:
    """Decorator: attach the spec §8.3 schema to a function as ``fn._needle_tool``.

    Usable bare (``@tool``) or with options (``@tool(name=..., triggers=[...])``).
    The function stays callable as before; ``Needle(tools=[fn])`` executes it in ``run``.
    """
    def wrap(f):
        f._needle_tool = function_schema(f, name=name, description=description, triggers=triggers)
        return f
    return wrap(fn) if fn is not None else wrap


# ------------------------------------------------------------------ normalisation

@dataclass
class ToolSpec:
    """One normalised tool: what the prompt shows, what the grammar enforces, what runs."""
    name: str
    description: str
    parameters: dict
    schema: dict                       # rendered into the prompt, key order preserved
    function: Optional[Callable] = None
    pydantic_model: Any = None
    _grammar_schema: Optional[dict] = field(default=None, repr=False)

    def grammar_schema(self) -> dict:
        """{"name","description","parameters"} with additionalProperties:false implied."""
        if self._grammar_schema is None:
            params = _inline_refs(self.parameters, self.parameters, self.name)
            params = _close_objects(params)
            self._grammar_schema = {"name": self.name, "description": self.description,
                                    "parameters": params}
        return self._grammar_schema

    def compact_json(self) -> str:
        return json.dumps(self.schema, separators=(",", ":"), ensure_ascii=False)


def _close_objects(schema):
    """Copy of ``schema`` with additionalProperties:false on objects declaring properties."""
    if isinstance(schema, list):
        return [_close_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in ("properties", "$defs", "definitions", "patternProperties"):
            out[key] = {k: _close_objects(v) for k, v in value.items()} if isinstance(value, dict) else value
        elif key in ("items", "anyOf", "oneOf", "allOf", "prefixItems", "not",
                     "additionalProperties", "contains"):
            out[key] = _close_objects(value)
        else:
            out[key] = value
    if "properties" in out and "additionalProperties" not in out and "patternProperties" not in out:
        out["additionalProperties"] = False
    return out


def _inline_refs(schema, root, tool_name, depth=0):
    """Replace local ``#/$defs/X`` refs by their target (non-recursive schemas only)."""
    if depth > 32:
        raise SchemaError(f"tool {tool_name!r}: $ref nesting deeper than 32 (recursive schema?)")
    if isinstance(schema, list):
        return [_inline_refs(s, root, tool_name, depth) for s in schema]
    if not isinstance(schema, dict):
        return schema
    if "$ref" in schema and isinstance(schema["$ref"], str) and schema["$ref"].startswith("#/"):
        target = root
        for part in schema["$ref"][2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                raise SchemaError(f"tool {tool_name!r}: $ref {schema['$ref']!r} points nowhere")
            target = target[part]
        merged = dict(_inline_refs(target, root, tool_name, depth + 1))
        for k, v in schema.items():
            if k != "$ref":
                merged[k] = _inline_refs(v, root, tool_name, depth)
        return merged
    out = {}
    for key, value in schema.items():
        if key in ("$defs", "definitions") and depth == 0 and schema is root:
            continue
        if key in ("properties", "patternProperties") and isinstance(value, dict):
            out[key] = {k: _inline_refs(v, root, tool_name, depth) for k, v in value.items()}
        elif key in ("items", "anyOf", "oneOf", "allOf", "prefixItems", "not",
                     "additionalProperties", "contains"):
            out[key] = _inline_refs(value, root, tool_name, depth)
        else:
            out[key] = value
    return out


def _map_types(schema, where, tool_name):
    """Copy of ``schema`` with type aliases mapped to JSON Schema types, validated."""
    if not isinstance(schema, dict):
        if schema is True or schema is False:
            return schema
        raise SchemaError(f"tool {tool_name!r}: {where} must be a JSON Schema object, "
                          f"got {type(schema).__name__}")
    out = {}
    for key, value in schema.items():
        ptr = f"{where}/{key}"
        if key == "type":
            mapped = _map_type_value(value, ptr, tool_name)
            if mapped is not None:
                out[key] = mapped
        elif key in ("properties", "patternProperties", "$defs", "definitions"):
            if not isinstance(value, dict):
                raise SchemaError(f"tool {tool_name!r}: {ptr} must be an object mapping names "
                                  f"to schemas, got {type(value).__name__}")
            out[key] = {k: _map_types(v, f"{ptr}/{k}", tool_name) for k, v in value.items()}
        elif key in ("items", "additionalProperties", "not", "contains"):
            if isinstance(value, list) and key == "items":
                out[key] = [_map_types(v, f"{ptr}/{i}", tool_name) for i, v in enumerate(value)]
            else:
                out[key] = _map_types(value, ptr, tool_name)
        elif key in ("anyOf", "oneOf", "allOf", "prefixItems"):
            if not isinstance(value, list) or not value:
                raise SchemaError(f"tool {tool_name!r}: {ptr} must be a non-empty list of schemas")
            out[key] = [_map_types(v, f"{ptr}/{i}", tool_name) for i, v in enumerate(value)]
        else:
            out[key] = value
    _check_keywords(out, where, tool_name)
    return out


def _map_type_value(value, ptr, tool_name):
    def one(v):
        if not isinstance(v, str) or v.strip().lower() not in _TYPE_ALIASES:
            raise SchemaError(f"tool {tool_name!r}: {ptr} is {v!r}, expected one of "
                              f"{sorted(_JSON_TYPES)} (or a common alias such as 'float', 'dict')")
        return _TYPE_ALIASES[v.strip().lower()]
    if isinstance(value, list):
        mapped = [one(v) for v in value]
        if None in mapped:
            return None
        return list(dict.fromkeys(mapped))
    return one(value)


def _check_keywords(s, where, tool_name):
    def bad(key, expected):
        raise SchemaError(f"tool {tool_name!r}: {where}/{key} is {s[key]!r}, expected {expected}")

    def is_num(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    if "enum" in s and (not isinstance(s["enum"], list) or not s["enum"]):
        bad("enum", "a non-empty list of values")
    for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        if key in s and not is_num(s[key]):
            bad(key, "a number")
    if "multipleOf" in s and (not is_num(s["multipleOf"]) or s["multipleOf"] <= 0):
        bad("multipleOf", "a number > 0")
    for key in ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"):
        if key in s and (not isinstance(s[key], int) or isinstance(s[key], bool) or s[key] < 0):
            bad(key, "a non-negative integer")
    for lo, hi in (("minimum", "maximum"), ("minLength", "maxLength"), ("minItems", "maxItems")):
        if lo in s and hi in s and s[lo] > s[hi]:
            raise SchemaError(f"tool {tool_name!r}: {where} has {lo}={s[lo]!r} greater than "
                              f"{hi}={s[hi]!r}; no value can satisfy it")
    if "pattern" in s:
        if not isinstance(s["pattern"], str):
            bad("pattern", "a regular-expression string")
        try:
            re.compile(s["pattern"])
        except re.error as exc:
            raise SchemaError(f"tool {tool_name!r}: {where}/pattern {s['pattern']!r} is not a "
                              f"valid regular expression ({exc})") from None
    if "uniqueItems" in s and not isinstance(s["uniqueItems"], bool):
        bad("uniqueItems", "true or false")
    if "required" in s:
        req = s["required"]
        if not isinstance(req, list) or not all(isinstance(r, str) for r in req):
            bad("required", "a list of property names")
        props = s.get("properties")
        if isinstance(props, dict) and s.get("additionalProperties", False) is False:
            missing = [r for r in req if r not in props]
            if missing:
                raise SchemaError(f"tool {tool_name!r}: {where}/required names {missing} which "
                                  f"are not in properties {list(props)}")
    if "description" in s and not isinstance(s["description"], str):
        bad("description", "a string")


# Keys of a tool definition (besides JSON Schema's own), for the misspelt-key check.
_TOOL_KEYS = ("name", "description", "parameters", "input_schema", "triggers")
_PARAMETERS_ALIASES = ("params", "param", "args", "arguments", "argument")
# Keywords whose values are data, not schemas: nothing under them is a keyword.
_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples", "example"})
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas",
                "dependencies")
_SCHEMA_LISTS = ("prefixItems", "anyOf", "oneOf", "allOf", "items")
_ONE_SCHEMA = ("items", "additionalItems", "additionalProperties", "propertyNames", "not", "if",
               "then", "else", "contains", "unevaluatedItems", "unevaluatedProperties",
               "contentSchema")


def _misspelt_keywords(schema, where):
    """(path, keyword, the keyword it looks like) for each key of ``schema`` and its
    subschemas that looks like a misspelt constraint keyword."""
    from .grammar.keywords import misspelt_keyword     # lazily: the grammar package is heavy
    found = []

    def walk(node, at):
        if not isinstance(node, dict):
            return
        for key, value in node.items():
            meant = misspelt_keyword(key, value)
            if meant is not None:
                found.append((at, key, meant))
            if key in _DATA_KEYWORDS:
                continue
            if key in _SCHEMA_MAPS and isinstance(value, dict):
                for name, sub in value.items():
                    walk(sub, f"{at}/{key}/{name}")
            elif key in _SCHEMA_LISTS and isinstance(value, list):
                for i, sub in enumerate(value):
                    walk(sub, f"{at}/{key}/{i}")
            elif key in _ONE_SCHEMA:
                walk(value, f"{at}/{key}")

    walk(schema, where)
    return found


def _report_misspelt(tool_name, found, strict):
    """Warn (``SchemaWarning``) about each misspelt key, or raise ``SchemaError`` for the
    first one when ``strict``."""
    for at, key, meant in found:
        problem = (f"tool {tool_name!r}: {at} has the key {key!r}, which is not a JSON-Schema "
                   f"keyword (did you mean {meant!r}?)" if at != "tool" else
                   f"tool {tool_name!r}: the tool definition has the key {key!r}, which needle_cy "
                   f"does not read (did you mean {meant!r}?)")
        if strict:
            raise SchemaError(f"{problem}; correct the spelling")
        warnings.warn(f"{problem}; it is ignored, so nothing enforces it: correct the spelling "
                      f"(strict=True, on the command line --strict, makes it an error)", SchemaWarning,
                      stacklevel=_outside_package_stacklevel())


def _outside_package_stacklevel():
    """The ``stacklevel`` of the innermost caller outside needle_cy, so that a warning
    points at the user's line."""
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def _schema_from_dict(d: dict, where="tool", strict=False) -> dict:
    if not isinstance(d, dict):
        raise SchemaError(f"{where}: expected a JSON object describing a tool, got {type(d).__name__}")
    # OpenAI-style wrapper {"type": "function", "function": {...}}
    if d.get("type") == "function" and isinstance(d.get("function"), dict):
        d = d["function"]
    name = d.get("name")
    if not isinstance(name, str) or not name.strip():
        raise SchemaError(f"{where}: missing or empty 'name' (expected a non-empty string), "
                          f"got keys {list(d)}")
    if any(ch.isspace() for ch in name):
        raise SchemaError(f"tool {name!r}: the name contains whitespace; use letters, digits, '_', '-' or '.'")
    from .grammar.keywords import misspelt_keyword     # lazily: the grammar package is heavy
    misspelt = []
    for key in d:
        if key in _TOOL_KEYS:
            continue
        meant = misspelt_keyword(key, known=_TOOL_KEYS)
        if meant is None and key in _PARAMETERS_ALIASES and "parameters" not in d and "input_schema" not in d:
            meant = "parameters"
        if meant is not None:
            misspelt.append(("tool", key, meant))
    out = {}
    for key, value in d.items():
        if key == "input_schema" and "parameters" not in d:   # Anthropic-style
            key = "parameters"
        out[key] = value
    if "parameters" not in out:
        out["parameters"] = {"type": "object", "properties": {}}
    if "description" in out and not isinstance(out["description"], str):
        raise SchemaError(f"tool {name!r}: 'description' must be a string, got "
                          f"{type(out['description']).__name__}")
    params = out["parameters"]
    if not isinstance(params, dict):
        raise SchemaError(f"tool {name!r}: 'parameters' must be a JSON Schema object, got "
                          f"{type(params).__name__}")
    params = _map_types(params, "parameters", name)
    _report_misspelt(name, misspelt + _misspelt_keywords(params, "parameters"), strict)
    ptype = params.get("type", "object" if "properties" in params or not params else None)
    if ptype != "object":
        raise SchemaError(f"tool {name!r}: parameters/type is {params.get('type')!r}, expected "
                          f"'object' (arguments are always a JSON object)")
    if "type" not in params:
        params = {"type": "object", **params}
    out["parameters"] = params
    return out


def normalize_tool(entry: Any, strict: bool = False) -> ToolSpec:
    """One tool from a callable, dict, JSON string or pydantic model class.  ``strict``:
    a misspelt keyword raises ``SchemaError`` instead of warning (module docstring)."""
    function = pydantic_model = None
    if isinstance(entry, ToolSpec):
        return entry
    if isinstance(entry, (str, bytes)):
        text = entry.decode("utf-8") if isinstance(entry, bytes) else entry
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SchemaError(f"tool JSON string is not valid JSON: {exc.msg} at line "
                              f"{exc.lineno} column {exc.colno}") from None
    elif isinstance(entry, dict):
        raw = entry
    elif _is_pydantic_model(entry):
        raw, pydantic_model = pydantic_schema(entry), entry
    elif callable(entry):
        raw = getattr(entry, "_needle_tool", None) or function_schema(entry)
        function = entry
    else:
        raise SchemaError(f"cannot use {entry!r} as a tool: expected a function, a JSON-Schema "
                          f"dict, a JSON string or a pydantic model class")
    schema = _schema_from_dict(copy.deepcopy(raw), strict=strict)
    return ToolSpec(name=schema["name"], description=schema.get("description", ""),
                    parameters=schema["parameters"], schema=schema, function=function,
                    pydantic_model=pydantic_model)


def normalize_tools(tools: Any, strict: bool = False) -> List[ToolSpec]:
    """A list of ToolSpec from ``tools`` (a list, or a JSON string holding a list).
    ``strict``: a misspelt keyword raises ``SchemaError`` instead of warning."""
    if tools is None:
        return []
    if isinstance(tools, (str, bytes)):
        text = tools.decode("utf-8") if isinstance(tools, bytes) else tools
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SchemaError(f"tools JSON is not valid JSON: {exc.msg} at line {exc.lineno} "
                              f"column {exc.colno}") from None
        tools = parsed if isinstance(parsed, list) else [parsed]
    elif isinstance(tools, dict) or callable(tools) and not isinstance(tools, (list, tuple)):
        tools = [tools]
    specs = []
    seen = {}
    for i, entry in enumerate(tools):
        try:
            spec = normalize_tool(entry, strict=strict)
        except SchemaError as exc:
            raise SchemaError(f"tools[{i}]: {exc}") from None
        if spec.name in seen:
            raise SchemaError(f"tools[{i}]: tool name {spec.name!r} is already used by "
                              f"tools[{seen[spec.name]}]; names must be unique")
        seen[spec.name] = i
        specs.append(spec)
    return specs
