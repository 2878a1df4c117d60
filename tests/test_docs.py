"""The documentation: its examples run, its links resolve, the README stays a short user
guide, every CLI option has a help text; no tracked file carries work-diary numbering or
internal issue numbers; code comments carry few measured figures.

Examples: the fenced blocks of README.md, docs/*.md and benchmarks/README.md.
``python`` blocks of one page run in order in one interpreter (a later block may use an
earlier one's names), in a temporary folder, with the embedded model.  ``bash`` blocks run
command by command in one shell per page, in a temporary folder that links the repository's
folders, with ``needle-cy`` and ``python`` bound to this interpreter.  ``json`` blocks must
parse.  ``text`` blocks (synopses with placeholders) do not run.
"""
import ast
import contextlib
import importlib.util
import io
import json
import os
import re
import select
import shlex
import signal
import subprocess
import sys
import time
import tokenize
from pathlib import Path

import pytest

from conftest import REPO

DOC_PAGES = sorted([REPO / "README.md", REPO / "benchmarks" / "README.md", *(REPO / "docs").glob("*.md")])

# Shell commands the test does not run, each with its reason (a regex on the command).
SHELL_NOT_RUN = {
    r"^pip install\b": "installs packages (network, minutes)",
    r"^python3? -m venv\b": "creates a virtual environment (the test already runs in one)",
    r"^pytest -q$": "the whole test suite (minutes); this test is part of it",
}

# Optional extras: a python block importing one of these modules is skipped, naming the
# extra, when the module is not installed.
EXTRA_OF_MODULE = {"torch": "train", "jax": "train", "needle": "train", "huggingface_hub": "hub",
                   "matplotlib": "bench", "pydantic": "test", "openai": "test", "ollama": "test"}

# Pages whose python examples are clients of `needle-cy serve` at its default address: the
# test starts a server on a free port and runs them against it (the address replaced).
SERVED_PAGES = {"docs/serve.md": "http://127.0.0.1:11434"}

# Pages linked from the README and docs/index that other branches write; remove an entry
# once its page is merged.
WRITTEN_ELSEWHERE = set()


def fenced_blocks(path):
    """[(language, first line number, text)] of a Markdown file's fenced code blocks."""
    blocks, lang, start, buf = [], None, 0, []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        fence = re.match(r"^(\s*)```+\s*([\w+-]*)\s*$", line)
        if lang is None and fence:
            lang, start, buf = fence.group(2) or "text", number + 1, []
        elif lang is not None and re.match(r"^\s*```+\s*$", line):
            blocks.append((lang, start, "\n".join(buf) + "\n"))
            lang = None
        elif lang is not None:
            buf.append(line)
    assert lang is None, f"{path}: a code block opened at line {start} is never closed"
    return blocks


def shell_commands(text):
    """The commands of a shell block: continuation lines joined, comments and blank lines dropped."""
    commands, current = [], ""
    for line in text.splitlines():
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        command = current.strip()
        current = ""
        if command and not command.startswith("#"):
            commands.append(re.sub(r"\s+#\s[^'\"]*$", "", command))
    return commands


def _page_id(path):
    return str(path.relative_to(REPO))


def _env(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, target in (("needle-cy", f'exec "{sys.executable}" -m needle_cy "$@"'),
                         ("python", f'exec "{sys.executable}" "$@"'), ("python3", f'exec "{sys.executable}" "$@"')):
        shim = bin_dir / name
        shim.write_text(f"#!/bin/sh\n{target}\n")
        shim.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.setdefault("NEEDLE_CY_FIXTURES", str(REPO.parent / "shared" / "fixtures"))
    return env


def _workdir(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    for name in ("examples", "needle_cy", "benchmarks", "tests", "tools", "docs"):
        (work / name).symlink_to(REPO / name)
    return work


_RUNNER = r'''
import json, sys, traceback
blocks = json.load(open(sys.argv[1]))
namespace = {"__name__": "__main__"}
for start, code in blocks:
    print(f"--- block at line {start}", flush=True)
    try:
        exec(compile(code, f"<block at line {start}>", "exec"), namespace)
    except BaseException:
        traceback.print_exc()
        print(f"FAILED: the block at line {start}", flush=True)
        sys.exit(1)
'''


def _missing_extras(code):
    """The extras (with their module) a python block imports and this environment lacks."""
    missing = []
    for node in ast.walk(ast.parse(code)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        for name in names:
            top = name.split(".")[0]
            if top in EXTRA_OF_MODULE and importlib.util.find_spec(top) is None:
                missing.append(f"{top} (the [{EXTRA_OF_MODULE[top]}] extra)")
    return missing


PYTHON_PAGES = [p for p in DOC_PAGES if any(lang == "python" for lang, _, _ in fenced_blocks(p))]
SHELL_PAGES = [p for p in DOC_PAGES if any(lang in ("bash", "sh", "shell") for lang, _, _ in fenced_blocks(p))]


@contextlib.contextmanager
def _server():
    """``needle-cy serve`` (embedded model) on a free loopback port; yields its address."""
    proc = subprocess.Popen([sys.executable, "-m", "needle_cy", "serve", "--port", "0", "--threads", "1"],
                            stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env=dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")))
    try:
        line, deadline = "", time.monotonic() + 120
        while "needle-cy serve:" not in line:
            assert proc.poll() is None and time.monotonic() < deadline, f"needle-cy serve did not start: {line}"
            if select.select([proc.stderr], [], [], 1)[0]:
                line = proc.stderr.readline()
        yield line.split(" at ", 1)[1].split()[0]
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stderr.close()


@pytest.mark.parametrize("page", PYTHON_PAGES, ids=_page_id)
def test_python_examples_run(page, tmp_path):
    blocks, skipped = [], []
    for lang, start, code in fenced_blocks(page):
        if lang != "python":
            continue
        missing = _missing_extras(code)
        if missing:
            skipped.append(f"line {start}: needs {', '.join(missing)}")
        else:
            blocks.append((start, code))
    address = SERVED_PAGES.get(_page_id(page))
    if blocks and address and not all(importlib.util.find_spec(m) for m in ("starlette", "uvicorn")):
        skipped += [f"line {start}: needs needle-cy serve (the [serve] extra)" for start, _ in blocks]
        blocks = []
    if blocks:
        with (_server() if address else contextlib.nullcontext()) as url:
            if address:
                blocks = [(start, code.replace(address, url)) for start, code in blocks]
            (tmp_path / "blocks.json").write_text(json.dumps(blocks))
            (tmp_path / "runner.py").write_text(_RUNNER)
            work = _workdir(tmp_path)
            proc = subprocess.run([sys.executable, str(tmp_path / "runner.py"), str(tmp_path / "blocks.json")],
                                  cwd=work, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{_page_id(page)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        assert proc.stdout.count("--- block at line") == len(blocks)
    if skipped:
        pytest.skip(f"{_page_id(page)}: ran {len(blocks)} block(s); skipped " + "; ".join(skipped))


@pytest.mark.parametrize("page", SHELL_PAGES, ids=_page_id)
def test_shell_examples_run(page, tmp_path):
    script, ran = ["set -eu"], 0
    for lang, start, text in fenced_blocks(page):
        if lang not in ("bash", "sh", "shell"):
            continue
        for command in shell_commands(text):
            reason = next((why for pattern, why in SHELL_NOT_RUN.items() if re.search(pattern, command)), None)
            if reason is None:
                script.append(f"echo {shlex.quote(f'--- block at line {start}: {command[:70]}')}")
                script.append(command + " > /dev/null")
                ran += 1
    assert ran, f"{_page_id(page)}: every shell command is on the not-run list"
    proc = subprocess.run(["bash", "-c", "\n".join(script)], cwd=_workdir(tmp_path), env=_env(tmp_path),
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"{_page_id(page)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def test_json_examples_parse():
    for page in DOC_PAGES:
        for lang, start, text in fenced_blocks(page):
            if lang == "json":
                try:
                    json.loads(text)
                except json.JSONDecodeError as exc:
                    pytest.fail(f"{_page_id(page)}, the json block at line {start}: {exc}")


def test_shell_blocks_hold_only_runnable_commands():
    """A synopsis with placeholders belongs in a text block; the not-run list is short."""
    for page in DOC_PAGES:
        for lang, start, text in fenced_blocks(page):
            if lang in ("bash", "sh", "shell"):
                for command in shell_commands(text):
                    assert not re.search(r"\b[A-Z]{2,}\.(cact|json)\b|\[--|\bORG/NAME\b|\.\.\.|…", command), \
                        f"{_page_id(page)} line {start}: placeholders in a bash block: {command}"
    assert len(SHELL_NOT_RUN) <= 5


def test_links_between_the_docs_resolve():
    for page in DOC_PAGES + [REPO / "CHANGELOG.md"]:
        text = page.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            path = (page.parent / target).resolve()
            assert REPO in path.parents, f"{_page_id(page)} links outside the repository: {target}"
            if str(path.relative_to(REPO)) in WRITTEN_ELSEWHERE:
                continue
            assert path.exists(), f"{_page_id(page)} links to {target}, which does not exist"


def test_the_readme_is_a_short_user_guide():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= 350, f"README.md has {len(lines)} lines; move detail to docs/"
    headings = [(i, line) for i, line in enumerate(lines) if line.startswith("## ")]
    limits = next(i for i, line in headings if "Limits" in line)
    assert limits <= 40 and limits == headings[0][0], "the limits come first, near the top"
    assert "does not yet" in text or "calls nothing" in text or "calls no" in text
    # set-up is two commands (a venv, then the editable install with the test extra) and the
    # test command is the one .ci/run runs
    install = next(code for lang, _, code in fenced_blocks(REPO / "README.md")
                   if lang == "bash" and "pip install" in code)
    assert shell_commands(install) == ['python3 -m venv .venv && . .venv/bin/activate', 'pip install -e ".[test]"']
    assert any(shell_commands(code) == ["pytest -q"] for lang, _, code in fenced_blocks(REPO / "README.md")
               if lang == "bash")
    assert re.search(r"^pytest -q$", (REPO / ".ci" / "run").read_text(), re.M)
    # every CLI command and the tools file format are in it
    for command in ("run", "batch", "chat", "inspect", "bench"):
        assert f"needle-cy {command}" in text
    assert '"parameters"' in text and "call-me-maybe" in text


def test_every_cli_option_has_a_help_text():
    import argparse
    from needle_cy.cli import build_parser

    def walk(parser, where):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    assert action._choices_actions and all(a.help for a in action._choices_actions)
                    yield from walk(sub, f"{where} {name}")
            elif not action.help or action.help == argparse.SUPPRESS:
                yield f"{where} {'/'.join(action.option_strings) or action.dest}"
    missing = list(walk(build_parser(), "needle-cy"))
    assert not missing, f"options without a --help text: {missing}"


# ------------------------------------------------------------------ repository hygiene

def tracked_files():
    proc = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True)
    if proc.returncode != 0:
        pytest.skip("not a git checkout: the tracked files cannot be listed")
    return [REPO / name for name in proc.stdout.decode().split("\0") if name]


def _text(path):
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data[:8192]:
        return None
    return data.decode("utf-8", errors="replace")


# Work-diary numbering ("session 24", "stop 3") and internal issue numbers ("issue 18",
# "issue18b", "see #12").  A date and the CPU say when and where.
DIARY = re.compile(r"\b(?:sessions?|stops?)[ -]\d+\b|\bissue[ -]?#?\d+|(?:\(|\bsee |\bfix(?:es)? |\bPR )#\d+",
                   re.IGNORECASE)
# Files allowed to match, with the reason.
DIARY_ALLOWED = {
    "tests/test_docs.py": "holds the pattern and its examples",
}


def test_no_file_carries_work_diary_or_issue_numbers():
    found = []
    for path in tracked_files():
        rel = str(path.relative_to(REPO))
        text = _text(path)
        if text is None or rel in DIARY_ALLOWED:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if DIARY.search(line):
                found.append(f"{rel}:{number}: {line.strip()[:100]}")
    assert not found, "work-diary or issue numbers (give a date and the CPU instead):\n" + "\n".join(found)


# A comment or docstring line that reports a measurement: a speed ratio ("1.07x"), a rate,
# a duration in µs/ns/ms, a bandwidth, a share in per cent, or a named benchmark CPU.
FIGURE = re.compile(r"(?<![\w.])\d+(?:\.\d+)?\s?[x×](?![\w(\[])|tok/s|\d\s?(?:us|µs|ns|ms)\b|GB/s|GMAC/s|GFMA|\d\s?%"
                    r"|\bZen ?\d\b|\bXeon\b|\bEPYC\b")
# The most such lines a code file may hold: figures belong in benchmarks/history/, and a
# comment keeps only the few that explain a constant.
FIGURE_CEILING = 3
FIGURE_CEILING_TOTAL = 36


def comment_lines(path, text):
    """The comment and docstring lines of a code file (Python/Cython by tokens, C by /* */ and //)."""
    if path.suffix in (".py", ".pyx", ".pxd"):
        out = []
        try:
            for tok in tokenize.generate_tokens(io.StringIO(text).readline):
                if tok.type == tokenize.COMMENT:
                    out.append(tok.string)
                elif tok.type == tokenize.STRING and re.match(r"^[rRbBuUfF]*('''|\"\"\")", tok.string):
                    out.extend(tok.string.splitlines())
        except (tokenize.TokenError, IndentationError, SyntaxError):
            out = [line for line in text.splitlines() if line.lstrip().startswith("#")]
        return out
    if path.suffix in (".h", ".c"):
        return [line for m in re.finditer(r"/\*.*?\*/|//[^\n]*", text, re.S) for line in m.group(0).splitlines()]
    if path.suffix == ".sh":
        return [line for line in text.splitlines() if line.lstrip().startswith("#")]
    return []


def figure_lines():
    counts = {}
    for path in tracked_files():
        rel = str(path.relative_to(REPO))
        if not rel.startswith(("needle_cy/", "tools/")) or path.suffix not in (".py", ".pyx", ".pxd", ".h", ".c", ".sh"):
            continue
        text = _text(path)
        if text is None:
            continue
        hits = [line.strip() for line in comment_lines(path, text) if FIGURE.search(line)]
        if hits:
            counts[rel] = hits
    return counts


def test_code_comments_carry_few_measured_figures():
    counts = figure_lines()
    over = {rel: hits for rel, hits in counts.items() if len(hits) > FIGURE_CEILING}
    assert not over, ("comment lines with measured figures above the ceiling (move the figures to "
                      "benchmarks/history/, keep the decision and its reason):\n"
                      + "\n".join(f"{rel}: {len(h)}\n    " + "\n    ".join(h) for rel, h in over.items()))
    total = sum(len(h) for h in counts.values())
    assert total <= FIGURE_CEILING_TOTAL, f"{total} comment lines with measured figures in all"


def test_the_hygiene_patterns_catch_what_they_are_for():
    for bad in ("since session 24", "Session 10 (the", "issue 18's bars", "branch issue18b", "(see #12)",
                "stop 3 of the day"):
        assert DIARY.search(bad), bad
    for fine in ("u32 #27 (byte 108)", "it issues 2 vpermw", "a sessions table", "tensor #2"):
        assert not DIARY.search(fine), fine
    for figure in ("1.07x faster", "842 tok/s", "7 us a block", "16.3 GB/s", "3 % of a step", "on Zen 4"):
        assert FIGURE.search(figure), figure
    for fine in ("a 4x4 matrix", "16 rows x 4 fields", "group 128", "_mm256_set1_epi64x(", "__m512 x[4];"):
        assert not FIGURE.search(fine), fine
    src = "x = 1  # 1.2x faster\ndef f():\n    '''Docstring: 5 us.'''\n    return 'not 3 ms'\n"
    assert comment_lines(Path("a.py"), src) == ["# 1.2x faster", "'''Docstring: 5 us.'''"]
