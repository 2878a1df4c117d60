"""needle_cy: a Cython CPU engine for Needle tool-calling models.

Public names are imported lazily so that importing the package is cheap and a
module's heavy dependencies load only when used.
"""
import os
from importlib import import_module

# OpenMP threads that spin while a sibling thread is descheduled stall a busy small
# machine (measured: 150x slower on a loaded 2-core box). Sleeping waits cost a few
# microseconds per parallel region instead. Set OMP_WAIT_POLICY=active to override;
# it must be decided before the first OpenMP extension loads, hence here.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

from .errors import (
    CactFormatError,
    ContextOverflowError,
    GrammarLimitError,
    GrammarStateError,
    LadderError,
    ModelNotAvailableError,
    ModelStateError,
    NeedleError,
    QueryExpansionError,
    SchemaError,
    TokenizerError,
    UnsupportedSchemaError,
)

__version__ = "0.1.0"

_LAZY = {
    "Archive": ("needle_cy.archive", "Archive"),
    "Model": ("needle_cy.model", "Model"),
    "Tokenizer": ("needle_cy.tokenizer", "Tokenizer"),
    "Needle": ("needle_cy.agent", "Needle"),
    "tool": ("needle_cy.toolspec", "tool"),
    "Field": ("needle_cy.toolspec", "Field"),
    "extract": ("needle_cy.agent", "extract"),
    "set_num_threads": ("needle_cy.threads", "set_num_threads"),
    "get_num_threads": ("needle_cy.threads", "get_num_threads"),
    "Response": ("needle_cy.envelope", "Response"),
    "RunResponse": ("needle_cy.envelope", "RunResponse"),
    "ExecutedCall": ("needle_cy.envelope", "ExecutedCall"),
}

__all__ = sorted(_LAZY) + [
    "CactFormatError",
    "ContextOverflowError",
    "GrammarLimitError",
    "GrammarStateError",
    "LadderError",
    "ModelNotAvailableError",
    "ModelStateError",
    "NeedleError",
    "QueryExpansionError",
    "SchemaError",
    "TokenizerError",
    "UnsupportedSchemaError",
]


def __dir__():
    """The public names, the lazily loaded ones included (``dir(needle_cy)``, completion)."""
    return sorted(set(__all__) | {"__version__"})


def __getattr__(name):
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'needle_cy' has no attribute {name!r}") from None
    value = getattr(import_module(module), attr)
    globals()[name] = value
    return value
