"""Where the C lives: every C source under needle_cy/csrc/, none in Python strings, and
setup.py's extension table naming each header and .pxi file an extension compiles.

These read files only (no build, no import of the extensions): the layout is what a
reader and the build rely on, and a header left out of `depends` only shows later, as
a stale extension that did not rebuild after its header changed."""
import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PKG = REPO / "needle_cy"
CSRC = PKG / "csrc"

# the longest Python string that a `cdef extern from *` may still carry (a one-line
# #define, say); anything longer is C source and belongs in a header under csrc/
VERBATIM_MAX_LINES = 3

EXTERN_RE = re.compile(r'^\s*cdef\s+extern\s+from\s+"([^"]+)"', re.M)
VERBATIM_RE = re.compile(r'^\s*cdef\s+extern\s+from\s+\*[^\n]*\n\s*("""|\'\'\')(.*?)\1', re.M | re.S)
CIMPORT_RE = re.compile(r"^\s*from\s+(needle_cy(?:\.\w+)+|\.+\w*(?:\.\w+)*)\s+cimport\b", re.M)
INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
PXI_RE = re.compile(r'^\s*include\s+"([^"]+\.pxi)"', re.M)     # Cython's textual include


def _extensions():
    """setup.py's EXTENSIONS literal, read without running setup.py."""
    tree = ast.parse((REPO / "setup.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "EXTENSIONS" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py has no EXTENSIONS table")


def _cython_files():
    return sorted(p for p in PKG.rglob("*") if p.suffix in (".pyx", ".pxd", ".pxi"))


def _pxd_of(module, src):
    """The .pxd file a `from X cimport` names (None for libc, numpy, cython...)."""
    if module.startswith("."):
        level = len(module) - len(module.lstrip("."))
        base = src.parent
        for _ in range(level - 1):
            base = base.parent
        parts = [p for p in module.lstrip(".").split(".") if p]
    else:
        base = REPO
        parts = module.split(".")
    path = base.joinpath(*parts).with_suffix(".pxd")
    return path if path.exists() else None


def _resolve(name, where):
    """A quoted include as the compiler finds it: beside the including file, else in
    needle_cy/ (setup.py's include directory).  None for headers outside the package."""
    for base in (where, PKG):
        path = (base / name).resolve()
        if path.exists():
            return path
    return None


def _headers_of(source):
    """Every package header the C of one .pyx compiles: its own .pxd, the .pxd files it
    cimports and the .pxi files it includes (transitively), their `cdef extern from`
    headers and those headers' #include lines (transitively); the .pxi files too."""
    cython, seen = [source], set()
    own_pxd = source.with_suffix(".pxd")
    if own_pxd.exists():
        cython.append(own_pxd)
    headers = set()
    while cython:
        path = cython.pop()
        if path in seen:
            continue
        seen.add(path)
        text = path.read_text(encoding="utf-8")
        for module in CIMPORT_RE.findall(text):
            pxd = _pxd_of(module, path)
            if pxd is not None:
                cython.append(pxd)
        for name in PXI_RE.findall(text):
            pxi = (path.parent / name).resolve()
            assert pxi.exists(), f"{path.relative_to(REPO)} includes {name!r}, which is not beside it"
            cython.append(pxi)
        for name in EXTERN_RE.findall(text):
            header = _resolve(name, path.parent)
            if header is not None:
                headers.add(header)
    todo = list(headers)
    headers |= {p.resolve() for p in seen if p.suffix == ".pxi"}
    while todo:
        header = todo.pop()
        for name in INCLUDE_RE.findall(header.read_text(encoding="utf-8")):
            found = _resolve(name, header.parent)
            assert found is not None, f"{header.relative_to(REPO)} includes {name!r}, which is not in the package"
            if found not in headers:
                headers.add(found)
                todo.append(found)
    return headers


def test_no_header_outside_csrc():
    stray = sorted(str(p.relative_to(REPO)) for p in PKG.rglob("*.h") if CSRC not in p.parents)
    assert not stray, f"C headers belong in needle_cy/csrc/, found: {stray}"


def test_no_c_source_in_python_strings():
    found = []
    for path in _cython_files():
        for match in VERBATIM_RE.finditer(path.read_text(encoding="utf-8")):
            lines = [line for line in match.group(2).splitlines() if line.strip()]
            if len(lines) > VERBATIM_MAX_LINES:
                found.append(f"{path.relative_to(REPO)}: {len(lines)} lines")
    assert not found, ("C source inside `cdef extern from *` strings (move it to a header under "
                       f"needle_cy/csrc/ and `cdef extern from` that header): {found}")


def test_every_extension_is_listed_with_its_source():
    table = _extensions()
    pyx = {".".join(p.relative_to(REPO).with_suffix("").parts): str(p.relative_to(REPO)) for p in PKG.rglob("*.pyx")}
    assert set(table) == set(pyx), f"setup.py EXTENSIONS {sorted(table)} against the .pyx files {sorted(pyx)}"
    for name, spec in table.items():
        assert spec["sources"] == [pyx[name]], f"{name}: sources {spec['sources']}, expected {[pyx[name]]}"


def test_depends_names_every_header_an_extension_compiles():
    for name, spec in _extensions().items():
        compiled = {str(h.relative_to(REPO)) for src in spec["sources"] for h in _headers_of(REPO / src)}
        listed = set(spec["depends"])
        assert compiled <= listed, (f"setup.py: {name} compiles {sorted(compiled - listed)} but its depends "
                                    "leave them out (editing them would not rebuild it)")
        assert listed <= compiled, f"setup.py: {name} depends on {sorted(listed - compiled)}, which it does not include"


def test_every_pxi_is_included_by_some_extension():
    used = {h for spec in _extensions().values() for src in spec["sources"] for h in _headers_of(REPO / src)}
    unused = sorted(str(p.relative_to(REPO)) for p in PKG.rglob("*.pxi") if p.resolve() not in used)
    assert not unused, f".pxi files no extension includes: {unused}"


def test_every_csrc_header_is_compiled_by_some_extension():
    used = {h for spec in _extensions().values() for src in spec["sources"] for h in _headers_of(REPO / src)}
    unused = sorted(str(p.relative_to(REPO)) for p in CSRC.glob("*.h") if p.resolve() not in used)
    assert not unused, f"headers no extension includes: {unused}"


def test_headers_are_self_contained_or_named_as_fragments():
    for path in sorted(CSRC.glob("*.h")):
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(REPO)
        assert text.startswith("/*"), f"{rel} should open with a comment saying what it holds"
        first = text[: text.index("*/")]
        if path.name.endswith("_tmpl.h"):
            # a fragment: its opening comment names the header(s) that include it
            includers = [h.name for h in CSRC.glob("*.h")
                         if h != path and re.search(r'#\s*include\s+"' + re.escape(path.name) + '"', h.read_text(encoding="utf-8"))]
            assert includers, f"{rel}: no header includes this fragment"
            assert re.search(r"[Ii]ncluded\b", first), f"{rel}: its opening comment should say who includes it and with which defines"
            for includer in includers:
                assert includer in first, f"{rel}: its opening comment should name {includer}, which includes it"
        else:
            guard = re.search(r"^#ifndef\s+(\w+)\s*\n#define\s+\1\b", text, re.M)
            assert guard, f"{rel}: a header meant to be included once needs an include guard (or a _tmpl.h name)"


def test_headers_ship_in_sdist_and_wheel():
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert '"csrc/*.h"' in pyproject, "pyproject.toml package-data should list csrc/*.h (the wheel's headers)"
    manifest = (REPO / "MANIFEST.in").read_text(encoding="utf-8")
    assert re.search(r"^recursive-include\s+needle_cy/csrc\s+\*\.h\s*$", manifest, re.M), \
        "MANIFEST.in should carry needle_cy/csrc/*.h into the sdist"
    if any(PKG.glob("*.pxi")):
        assert '"*.pxi"' in pyproject, "pyproject.toml package-data should list *.pxi (the .pyx files include them)"
        assert re.search(r"^include\s+needle_cy/\*\.pxi\s*$", manifest, re.M), \
            "MANIFEST.in should carry needle_cy/*.pxi into the sdist"
