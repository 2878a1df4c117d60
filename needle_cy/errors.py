"""Every error needle_cy raises on bad input, in one place.

Each names what was wrong, where, and what was expected; all derive from
``NeedleError`` so callers can catch the family.
"""


class NeedleError(Exception):
    """Base class of needle_cy's errors."""


class CactFormatError(NeedleError, ValueError):
    """A .cact archive is malformed (field, record index, expected vs found)."""


class TokenizerError(NeedleError, ValueError):
    """A tokenizer record is malformed or an id is out of range."""


class UnsupportedSchemaError(NeedleError, ValueError):
    """A JSON Schema uses a keyword or construct the grammar cannot enforce."""

    def __init__(self, message, keyword=None, pointer=None):
        super().__init__(message)
        self.keyword = keyword
        self.pointer = pointer


class SchemaError(NeedleError, ValueError):
    """A JSON Schema or tool definition is malformed."""


class SchemaWarning(UserWarning):
    """A tool schema that works but is probably not what was meant: a keyword that looks
    like a misspelt JSON-Schema keyword (``"maximun"``) and so is ignored, unenforced.
    ``strict=True`` (``Needle``, ``normalize_tools``) raises ``SchemaError`` instead."""


class GrammarLimitError(NeedleError, ValueError):
    """A schema needs more than the grammar's fixed capacities (stack depth, buffers)."""


class GrammarStateError(NeedleError, ValueError):
    """A grammar state was passed to a grammar that did not start it (or is not a state)."""


class ContextOverflowError(NeedleError, ValueError):
    """A prompt does not fit in the model's context."""


class ModelNotAvailableError(NeedleError, RuntimeError):
    """No model archive was given and no embedded default model is available."""


class LadderError(NeedleError, ValueError):
    """A ladder rung request is invalid (depth outside [1, num_layers], bad explicit layer list)."""


class ModelStateError(NeedleError, RuntimeError):
    """A model call does not fit its state (head outputs before any token, a foreign snapshot)."""


class UnknownMarkerError(TokenizerError, KeyError):
    """``Tokenizer.marker_id`` was asked for a text that is not one of the vocabulary's markers."""

    def __str__(self):  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class QueryExpansionError(NeedleError, ValueError):
    """A query-expansion table (retrieval) is unreadable or malformed."""
