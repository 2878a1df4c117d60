"""The package's import graph: no cycles, and the reference (the executable spec) stays out of
the fast path.

Every ``.py`` under ``needle_cy/`` is parsed with ``ast``; ``.pyx``/``.pxd`` files (which
``ast`` cannot read) are scanned line by line for ``import``/``cimport`` statements outside
strings.  An import inside a function body is *lazy* (it runs when the function is called);
any other import runs when the module is imported.  Two graphs must be acyclic:

* every import, lazy ones included -- a lazy import that closes a cycle is still a cycle in
  the layering (``archive`` <-> ``reference.cq`` and ``grammar`` <-> ``reference.grammar``
  were two such);
* what runs at import time, plus the package ``__init__`` that importing a submodule from
  outside its package runs first.

Outside ``needle_cy/reference/`` the reference is imported only where the table below says,
each with its reason; anything new must be added there (or, better, go through a leaf module).
"""
import ast
import re
import subprocess
import sys
import textwrap

from conftest import REPO

PKG = REPO / "needle_cy"

# (importing module, function) -> why it may load needle_cy.reference.* lazily
REFERENCE_LAZY_OK = {
    ("needle_cy.model", "_make_engine"): 'backend="numpy": the reference engine is that backend',
    ("needle_cy.grammar.runtime", "make"): 'backend="python", or no built extension: the reference runtime',
    ("needle_cy.grammar.runtime", "state_type"): "the State class when the C runtime is not built",
    ("needle_cy.archive", "Archive.dequantize"): "a whole-matrix decode for inspection (the kernels never need one)",
    ("needle_cy.archive", "write_archive"): "writing quantizes with the spec's encoder (not an inference path)",
}
# importing module -> why it may import needle_cy.reference.* when it is imported
REFERENCE_AT_IMPORT_OK = {
    "needle_cy.training.torch_model": "the PyTorch twin of the engine, built on the reference's operators "
                                      "(training only; no runtime module imports it)",
}
# what the reference may import from the rest of the package: leaf modules only
REFERENCE_MAY_IMPORT = {
    "needle_cy.errors", "needle_cy.cq_format", "needle_cy.weights",
    "needle_cy.grammar", "needle_cy.grammar.limits", "needle_cy.grammar.numbers",
}


def _modules():
    """module name -> list of source files (a .pyx and its .pxd are one module)."""
    out = {}
    for path in sorted(PKG.rglob("*")):
        if path.suffix not in (".py", ".pyx", ".pxd") or "__pycache__" in path.parts:
            continue
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out.setdefault(".".join(parts), []).append(path)
    return out


MODULES = _modules()


def _is_package(name):
    return (REPO.joinpath(*name.split(".")) / "__init__.py").exists()


def _resolve(module, level, target, names):
    """The needle_cy modules an import statement of ``module`` names."""
    if level:
        base = module.split(".")
        if not _is_package(module):
            base = base[:-1]
        base = base[:len(base) - (level - 1)]
        target = ".".join(base + ([target] if target else []))
    if not target or not (target == "needle_cy" or target.startswith("needle_cy.")):
        return []
    out = []
    for n in names:          # `from pkg import submodule` names the submodule
        sub = f"{target}.{n}"
        if sub in MODULES:
            out.append(sub)
    if len(out) < len(names) or not names:
        out.append(target)
    return [m for m in out if m in MODULES]


def _is_type_checking(test):
    return getattr(test, "id", None) == "TYPE_CHECKING" or getattr(test, "attr", None) == "TYPE_CHECKING"


def _py_imports(module, path):
    """(target, lazy, function qualname or None) for each import of a .py file."""
    tree = ast.parse(path.read_text(), str(path))
    found = []

    def visit(node, func, scope):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, func or ".".join(scope + [child.name]), scope + [child.name])
            elif isinstance(child, ast.ClassDef):
                visit(child, func, scope + [child.name])
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                # `if TYPE_CHECKING:` imports never run (the package __init__ names its lazily
                # loaded exports there for type checkers, as _LAZY does for the interpreter)
                visit(ast.Module(body=child.orelse, type_ignores=[]), func, scope)
            elif isinstance(child, ast.Import):
                for alias in child.names:
                    for t in _resolve(module, 0, alias.name, []):
                        found.append((t, func is not None, func))
            elif isinstance(child, ast.ImportFrom):
                for t in _resolve(module, child.level, child.module, [a.name for a in child.names]):
                    found.append((t, func is not None, func))
            else:
                visit(child, func, scope)

    visit(tree, None, [])
    return found


_CY_IMPORT = re.compile(r"^(\s*)(?:from\s+(\.*)([\w.]*)\s+c?import\s+\(?([\w\s,]+)|c?import\s+([\w.]+))")


def _cy_imports(module, path):
    """Imports of a .pyx/.pxd: strings and `cdef extern` blocks removed, indented = lazy."""
    text = re.sub(r'"""(?:.|\n)*?"""', '""', path.read_text())
    found = []
    for line in text.splitlines():
        m = _CY_IMPORT.match(line)
        if not m:
            continue
        indent, dots, target, names, plain = m.groups()
        if plain:
            targets = _resolve(module, 0, plain, [])
        else:
            targets = _resolve(module, len(dots), target, [n.strip() for n in names.split(",") if n.strip()])
        for t in targets:
            found.append((t, bool(indent), "(indented)" if indent else None))
    return found


def _imports():
    """module -> list of (target, lazy, function)."""
    out = {}
    for name, paths in MODULES.items():
        edges = []
        for path in paths:
            edges += _py_imports(name, path) if path.suffix == ".py" else _cy_imports(name, path)
        out[name] = [e for e in edges if e[0] != name]
    return out


IMPORTS = _imports()


def _find_cycle(graph):
    """A cycle as a list of modules, or None (iterative depth-first search)."""
    color = {}
    for root in sorted(graph):
        if root in color:
            continue
        stack = [(root, iter(sorted(graph[root])))]
        color[root] = 1
        path = [root]
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                color[node] = 2
                stack.pop()
                path.pop()
            elif color.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif nxt not in color:
                color[nxt] = 1
                stack.append((nxt, iter(sorted(graph.get(nxt, ())))))
                path.append(nxt)
    return None


def _parents_run_first(importer, target):
    """The packages whose __init__ runs when ``importer`` imports ``target`` (those that do not
    contain ``importer``: its own packages are already being imported)."""
    parts = target.split(".")
    out = []
    for i in range(1, len(parts)):
        pkg = ".".join(parts[:i])
        if not (importer == pkg or importer.startswith(pkg + ".")):
            out.append(pkg)
    return out


def test_the_walk_sees_the_package():
    # the walker must see what matters, or the assertions below prove nothing
    assert {"needle_cy.grammar", "needle_cy.grammar.builder", "needle_cy.grammar._runtime",
            "needle_cy._model", "needle_cy.reference.grammar", "needle_cy.cq_format"} <= set(MODULES)
    assert ("needle_cy.grammar.limits", False, None) in IMPORTS["needle_cy.reference.grammar"]
    assert ("needle_cy._cq", False, None) in IMPORTS["needle_cy._model"]           # a cimport
    assert ("needle_cy.errors", False, None) in IMPORTS["needle_cy.grammar._runtime"]
    assert ("needle_cy.reference.model", True, "_make_engine") in IMPORTS["needle_cy.model"]
    assert _find_cycle({"a": ["b"], "b": ["c"], "c": ["a"]}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": ["b"], "b": [], "c": ["a"]}) is None


def test_no_import_cycle_counting_lazy_imports():
    graph = {m: sorted({t for t, _, _ in edges}) for m, edges in IMPORTS.items()}
    assert _find_cycle(graph) is None, " -> ".join(_find_cycle(graph))


def test_no_import_cycle_at_import_time():
    graph = {}
    for m, edges in IMPORTS.items():
        targets = set()
        for t, lazy, _ in edges:
            if not lazy:
                targets.add(t)
                targets.update(_parents_run_first(m, t))
        graph[m] = sorted(targets)
    assert _find_cycle(graph) is None, " -> ".join(_find_cycle(graph))


def _is_reference(name):
    return name == "needle_cy.reference" or name.startswith("needle_cy.reference.")


def test_the_reference_is_imported_only_where_listed():
    lazy, at_import = {}, set()
    for m, edges in IMPORTS.items():
        if _is_reference(m):
            continue
        for t, is_lazy, func in edges:
            if not _is_reference(t):
                continue
            if is_lazy:
                lazy.setdefault((m, func), set()).add(t)
            else:
                at_import.add(m)
    assert set(lazy) == set(REFERENCE_LAZY_OK), sorted(set(lazy) ^ set(REFERENCE_LAZY_OK))
    assert at_import == set(REFERENCE_AT_IMPORT_OK), sorted(at_import ^ set(REFERENCE_AT_IMPORT_OK))


def test_the_reference_imports_only_leaf_modules():
    for m, edges in IMPORTS.items():
        if not _is_reference(m):
            continue
        outside = {t for t, _, _ in edges if not _is_reference(t)}
        assert outside <= REFERENCE_MAY_IMPORT, (m, sorted(outside - REFERENCE_MAY_IMPORT))
    # and those leaves import no other part of the package at import time (errors aside)
    for leaf in REFERENCE_MAY_IMPORT - {"needle_cy.grammar"}:
        deps = {t for t, lazy, _ in IMPORTS[leaf] if not lazy} - {"needle_cy.errors"}
        assert deps <= {"needle_cy.grammar.limits"}, (leaf, sorted(deps))


def test_the_fast_paths_load_no_reference_module():
    """What the static walk says, checked in a fresh interpreter: reading an archive, binding
    its weights, compiling schemas (enum filtering runs programs on the C runtime) and tool
    sets, and decoding with the grammar leave needle_cy.reference unloaded."""
    code = textwrap.dedent("""
        import sys
        import needle_cy
        from needle_cy.agent import DEFAULT_MODEL_PATH
        from needle_cy.archive import Archive
        from needle_cy.grammar import State, compile_schema, compile_tools
        from needle_cy.weights import bind_weights
        bind_weights(Archive.open(DEFAULT_MODEL_PATH))
        g = compile_schema({"type": "object", "properties": {
            "n": {"enum": [1, 2, 3, "x"], "minimum": 2}, "s": {"type": "string", "format": "date"}}})
        assert g.accepts(b'{"n":2}') and not g.accepts(b'{"n":1}')
        t = compile_tools([{"name": "f", "parameters": {"type": "object", "properties": {
            "k": {"type": "integer", "maximum": 3}}}}])
        st = t.start()
        assert isinstance(st, State) and st.feed(b'[{"name":"f","arguments":{"k":3}}]') and st.is_complete()
        loaded = sorted(m for m in sys.modules if m.startswith("needle_cy.reference"))
        print("LOADED", loaded)
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "LOADED []" in out.stdout, out.stdout


def test_the_grammar_constants_agree_with_the_c_runtime():
    from needle_cy.grammar import _runtime, limits
    c = _runtime._shared_constants()
    starts = c.pop("S_BITS")
    for name, value in c.items():
        assert getattr(limits, name) == value, name
    assert starts == [limits.start_bit(b) for b in range(256)]
