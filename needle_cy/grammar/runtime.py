"""The runtime behind a compiled program, and ``Grammar``, the object users hold.

``make`` is the backend switch: the C extension ``_runtime`` (``backend="cython"``, the fast
path) or the pure-Python reference ``needle_cy.reference.grammar`` (``backend="python"``, or
where the extension is not built).  It is the only place the grammar package loads the
reference, and only when that backend is asked for or nothing else is there."""
from __future__ import annotations


def _runtime_module():
    try:
        from . import _runtime
        return _runtime
    except ImportError:  # pragma: no cover - the extension is part of the build
        return None


def make(program, backend="cython"):
    """(runtime grammar of ``program``, the backend it runs on: "cython" or "python")."""
    mod = _runtime_module() if backend == "cython" else None
    if mod is not None:
        return mod.CGrammar(program), "cython"
    from ..reference.grammar import ReferenceGrammar
    return ReferenceGrammar(program.pylists()), "python"


def state_type():
    """The class of the states ``Grammar.start()`` returns on the default backend."""
    mod = _runtime_module()
    if mod is not None:
        return mod.CState
    from ..reference.grammar import ReferenceState  # pragma: no cover - the extension is part of the build
    return ReferenceState


class Grammar:
    """A compiled grammar: ``start()`` a state, then feed bytes or whole token pieces."""

    def __init__(self, program, backend="cython"):
        self.program = program
        self._impl, self.backend = make(program, backend)

    def start(self):
        return self._impl.start()

    def accepts(self, data):
        if isinstance(data, str):
            data = data.encode("utf-8")
        st = self.start()
        return st.feed(data) and st.is_complete()

    def allowed_tokens(self, state, piece_table):
        return self._impl.allowed_tokens(state, piece_table)

    def best_allowed(self, state, logits, piece_table, close_string=False):
        return self._impl.best_allowed(state, logits, piece_table, close_string)
