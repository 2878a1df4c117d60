"""JSON Schema -> compiled grammar program, and the public grammar API.

A schema compiles into a flat *program*: a table of nodes (one per distinct
conjunction of subschemas), byte-level DFAs (patterns, formats, enums, property
names, tool names) and exact decimal constraints.  The runtime (``_runtime`` in
Cython, ``needle_cy.reference.grammar`` in pure Python, same semantics) walks the program
byte by byte with a stack of frames.

What is enforced, exactly (never accepting what the schema forbids):

* ``type`` (single or list), ``enum``, ``const``, boolean schemas.
* strings: ``minLength``/``maxLength`` in code points; ``pattern`` (ECMA-262
  search semantics, subset below); ``format`` email, uuid, date, time,
  date-time, ipv4, uri, hostname, idn-hostname, ipv6, idn-email, uri-reference,
  iri, iri-reference, uri-template, json-pointer, relative-json-pointer, duration,
  regex (rules in ``FORMAT_REGEX``: date, uuid, ipv4 and json-pointer are exact,
  the others narrowed -- see ``EXACT_FORMATS``); JSON escapes incl.
  ``\\uXXXX`` surrogate pairs (lone surrogates refused); UTF-8 validated byte by
  byte; control characters refused.
* numbers: JSON number syntax, ``minimum``/``maximum``/``exclusive*`` (draft-4
  boolean and numeric forms), ``multipleOf`` -- compared as exact decimals.
  ``integer`` accepts integer *syntax* only (``1.0`` is refused: exact, not
  complete), with or without ``enum``/``const`` -- except inside a ``oneOf``
  whose alternatives share a type and can meet (draft 6 on): there it is any
  number with an integral value (``1.0``, ``1e2``), as the draft reads it.
* arrays: ``items`` (schema or draft-4 list), ``prefixItems``,
  ``additionalItems``, ``minItems``/``maxItems``, ``uniqueItems`` (a duplicate
  item is refused at the byte that completes it; equality is JSON equality,
  computed with a 64-bit canonical hash -- a hash collision can only refuse a
  valid array, never accept an invalid one); ``contains`` with
  ``minContains``/``maxContains`` (each item is also tried against the contains
  schema and the matches counted in the array frame; a maximum needs the contains
  schema's exact complement, as ``not`` rewrites it).
* objects: ``properties``, ``required``, ``additionalProperties``,
  ``patternProperties``, ``propertyNames`` (pattern/enum/const/format),
  ``minProperties``/``maxProperties``; keys in any order, duplicate keys refused.
* ``$ref`` (local: ``#``, ``#/$defs/..``, ``#/definitions/..``, any JSON pointer,
  ``$id``-less anchors are not supported), recursion bounded by the frame stack.
* ``allOf`` (merged statically), ``anyOf`` (parallel threads), ``oneOf``
  (parallel threads; when two alternatives both complete the same value, it is
  refused, though a value can then be refused only at its last byte).  This is
  exact only when each alternative is: an alternative containing a narrowed
  format or a dialect-sensitive pattern (below) is allowed beside another of a
  shared JSON type only when, on that type, both are exact or no value can hold
  both (lengths/counts, enum values, a required property whose values cannot
  meet or that the other refuses, items at required positions, patterns read by
  either engine), else ``UnsupportedSchemaError``.
* ``not``: rewritten into positive keywords (De Morgan over keywords; type,
  enum/const, pattern and the exact formats (complemented automata; a narrowed
  format under ``not`` or ``if`` is refused), required, properties,
  bounds, length/count limits, nested not/anyOf/allOf/$ref); any other ``not`` is
  exact when the value set is a finite ``enum``/``const`` (filtered statically),
  else ``UnsupportedSchemaError``.
* ``if``/``then``/``else`` = (if and then) or (not-if and else), with the same
  negation; ``dependencies``/``dependentRequired`` (property lists, checked when
  the object closes) and schema dependencies/``dependentSchemas`` (= property
  absent, or the schema).

Not supported (``UnsupportedSchemaError`` naming keyword and pointer):
two ``contains`` on one array, ``maxContains`` over a schema without an exact
complement, ``unevaluated*``, dynamic refs, remote refs, ``$id``-based
resources that contain ``$ref``s, ``not`` over ``multipleOf``/``items``/..., a
narrowed format under ``not``/``if``, hostname in ``propertyNames``.  Capacities (frames per thread, aux
words, threads, number length) refuse -- never accept -- what does not fit.

Liveness: acceptance is exact, and violations are refused at the earliest
byte.  A number prefix stays alive exactly while some completion (more bytes, then
a delimiter) meets its bounds and ``multipleOf`` within the NUM_BUF-byte number
buffer -- exponents included (``40`` is alive under ``maximum: 30`` as ``40e-1``;
``3e5`` is not); a number that needs more than NUM_BUF bytes is refused.  Bounds
and ``multipleOf`` beyond 10**+-MAX_NUM_EXP raise ``GrammarLimitError``.

Regex dialect: ECMA-262 with the ``u`` flag (code points) and Python ``re``
(what ``jsonschema`` runs) together.  Where they read a construct differently --
``.`` (ECMA excludes \\r, U+2028, U+2029), ``\\d \\w \\s`` and their complements
(Python's are Unicode), ``$`` (Python also matches before a final newline) -- a
pattern that must hold accepts only what both engines match, and a complemented
one (``not``) refuses what either engine matches; a ``patternProperties`` key the
engines disagree on is refused.  Python's Unicode ``\\d``/``\\w`` are widened in
the complemented direction (to every code point from their first non-ASCII
member), which only refuses more.  ``{,n}`` and a class starting with ``]`` (the
engines disagree) are refused.  ``^`` and ``$`` may stand anywhere (``($|/)``,
``(^|,)``): assertions on the position, kept in the automaton (``$`` is ECMA's end of
input where both engines must match, Python's reading under ``not``).

Drafts: a schema is read by the letter of its ``$schema`` draft (3, 4, 6, 7,
2019-09, 2020-12; 2020-12 when absent).  A keyword its draft does not define is
an annotation there (draft 4's ``const``/``propertyNames``/``if``, draft 7's
``dependentRequired``, 2019-09's ``dependencies``); draft 3's ``required: true``
in a property schema and one-name string ``dependencies`` are read as draft 3
reads them.  The compiler's own synthetic schemas (an enum's object or array
value, a rewritten ``not``) read the same in every draft.

Compiler keywords (``__ptr``, ``__not_pattern``, ``__not_strings``,
``__not_format``) exist only in the compiler's own synthetic schemas: in a user
schema they are unknown keywords, i.e. annotations.  Count bounds (lengths,
items, properties) are int32 at run time: a maximum above 2**31-2 is read as
2**31-2, a minimum above it makes the type impossible.  A malformed keyword value
(``"required": [1]``, ``"prefixItems": 5``, ``"$schema": 5``...) is a ``SchemaError``
naming keyword and pointer.

Regex subset (``pattern``, ``patternProperties``): literals, ``.``, classes
``[...]``/``[^...]`` with ranges, ``\\d \\w \\s \\D \\W \\S`` (the intersection of
the ECMA-262 and Python meanings, so both engines agree with what we accept),
escapes ``\\n \\t \\r \\f \\v \\0 \\xHH \\uHHHH``, groups ``(..)``, ``(?:..)``,
named groups, alternation, quantifiers ``* + ? {n} {n,} {n,m}`` (lazy forms
too), ``^`` and ``$`` anywhere but under a quantifier of their own.  Anything else (look-around, back-references, ``\\b``,
``\\p{..}``, inline flags) raises ``UnsupportedSchemaError``.

The package, in the order a schema goes through it:

``keywords``  the keyword tables and the shape checks of keyword values
``schema``    ``SchemaResolver``: pointers, ``$ref``, ``allOf``, ``not``, ``if`` -> flat conjunctions
``builder``   ``Compiler``: conjunctions -> program nodes; ``compile_program``
``numbers``   exact decimals, number constraints and number liveness
``formats``   the enforced string formats as regexes (exact or narrowed)
``regex``     the regex dialect: parser and compilation to byte automata
``charset``   code point sets, the dialects' classes, UTF-8 byte ranges
``automata``  NFA/DFA over bytes: construction, pruning, products, complements, tries
``program``   ``Program`` (nodes, pools, automaton arena), runtime tables, linking
``tools``     the tool-call list grammar: per-tool programs linked with the tool names
``runtime``   the backend switch and ``Grammar``; ``_runtime`` (.pyx/.pxd) is the C runtime
``limits``    capacities and codes shared with both runtimes (a leaf: the reference imports it)

This module is the public API: ``compile_schema``, ``compile_tools``, ``Grammar``, ``State``
(the class of the states ``Grammar.start()`` returns) and ``clear_caches``.
"""
from __future__ import annotations

from .automata import _LITERAL_DFAS
from .builder import Compiler, compile_program
from .runtime import Grammar
from .tools import _FRAGMENTS, _TOOL_NAME_PROGRAMS, _canonical, _params_of, compile_tools_program

# Names other modules, tests and benchmarks have imported from ``needle_cy.grammar`` since it was
# one module; each lives in its owning module now (import it from there in new code).
from .automata import DFA, _compress, _literal_dfa, complement_dfa, intersect_dfas, literal_dfa  # noqa: E402,F401
from .charset import _WIDE_FROM, _py_class, class_ranges  # noqa: F401
from .formats import EXACT_FORMATS, FORMAT_REGEX, NARROWED_FORMATS  # noqa: F401
from .limits import NUM_BUF  # noqa: F401
from .program import NODE_FIELDS, _program_classes, _state_major  # noqa: F401
from .regex import regex_dfa  # noqa: F401

__all__ = ["Grammar", "State", "clear_caches", "compile_schema", "compile_tools"]


def __getattr__(name):
    # ``State`` is looked up on first use, so importing the package does not load the C runtime
    if name == "State":
        from .runtime import state_type
        return state_type()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def compile_schema(schema, backend="cython"):
    """Compile a JSON Schema (dict or bool) into a Grammar over its compact JSON values."""
    return Grammar(compile_program(schema), backend)


_TOOL_SETS = {}


def clear_caches():
    """Forget every memoised compile result (tool sets, per-tool fragments, tool-name,
    literal and pattern automata): the next compile starts cold.  For tests and benchmarks;
    results are identical either way."""
    for cache in (_TOOL_SETS, _FRAGMENTS, _TOOL_NAME_PROGRAMS, _LITERAL_DFAS, Compiler._pattern_cache):
        cache.clear()
    Compiler._start_program = None


def compile_tools(tools, max_calls=4, backend="cython"):
    """Grammar of a call list: ``[{"name":..,"arguments":..},...]`` or ``[]``.

    A grammar is immutable (states are separate objects), so the grammar of a tool set
    seen before is returned from a small cache; new sets link cached per-tool fragments.
    """
    # the grammar depends on the names and parameters only (descriptions are free to vary);
    # keys are canonical JSON, so a dict mutated after a compile is a new key
    try:
        key = (_canonical([[t["name"], _params_of(t)] for t in tools]), max_calls, backend)
    except (TypeError, ValueError, KeyError, AttributeError):
        key = None
    if key is not None and key in _TOOL_SETS:
        return _TOOL_SETS[key]
    g = Grammar(compile_tools_program(tools, max_calls), backend)
    if key is not None:
        if len(_TOOL_SETS) >= 64:
            _TOOL_SETS.pop(next(iter(_TOOL_SETS)))
        _TOOL_SETS[key] = g
    return g
