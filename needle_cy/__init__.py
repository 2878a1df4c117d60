"""needle_cy: a Cython CPU engine for Needle tool-calling models.

Public names are imported lazily so that importing the package is cheap and a
module's heavy dependencies load only when used.  Type checkers see them through the
``TYPE_CHECKING`` imports below (a module ``__getattr__`` alone makes every name ``Any``
to mypy and pyright).
"""
import os
from importlib import import_module
from typing import TYPE_CHECKING

# OpenMP waits spin briefly, then sleep.  A decode step runs ~70 short parallel
# regions back to back: sleeping waits (OMP_WAIT_POLICY=passive) pay ~80 µs per
# region to wake a halted vCPU (2 threads were 1.8x slower than 1), while waits
# that spin forever burn the core a busy machine's other work needs.  A bounded
# spin covers the gaps inside a step and sleeps between calls.  libgomp reads
# GOMP_SPINCOUNT (iterations), LLVM's libomp KMP_BLOCKTIME (ms); an explicit
# OMP_WAIT_POLICY from the user wins.  Both must be set before the first OpenMP
# extension loads, hence here.
from .config import OPENMP_DEFAULTS

if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.update({name: value for name, value in OPENMP_DEFAULTS if name not in os.environ})

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
    SchemaWarning,
    UnsupportedSchemaError,
)

if TYPE_CHECKING:     # the same names as _LAZY (tests/test_api_surface.py checks they agree)
    from .agent import Needle, extract
    from .archive import Archive
    from .envelope import ExecutedCall, Response, RunResponse
    from .model import Model
    from .threads import get_num_threads, set_num_threads
    from .tokenizer import Tokenizer
    from .toolspec import Field, home_tools, tool

__version__ = "0.1.0"

_LAZY = {
    "Archive": ("needle_cy.archive", "Archive"),
    "Model": ("needle_cy.model", "Model"),
    "Tokenizer": ("needle_cy.tokenizer", "Tokenizer"),
    "Needle": ("needle_cy.agent", "Needle"),
    "tool": ("needle_cy.toolspec", "tool"),
    "home_tools": ("needle_cy.toolspec", "home_tools"),
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
    "SchemaWarning",
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
