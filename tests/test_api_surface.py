"""The package as a user meets it: typed (py.typed, annotations, the envelope TypedDicts),
listed by dir(), the README's first example and the examples run and show results."""
import inspect
import os
import re
import subprocess
import sys
import typing

import pytest

import needle_cy
from conftest import REPO
from needle_cy.agent import DEFAULT_MODEL_PATH
from test_agent import LIGHT_CALL, TIMER_CALL, make_agent, tok  # noqa: F401


def test_the_package_is_marked_typed():
    assert (REPO / "needle_cy" / "py.typed").is_file()
    assert '"py.typed"' in (REPO / "pyproject.toml").read_text()      # shipped in the wheel


def test_dir_lists_the_lazily_loaded_names():
    names = dir(needle_cy)
    assert {"Needle", "tool", "Field", "extract", "Model", "Response", "NeedleError"} <= set(names)
    assert "os" not in names and "import_module" not in names


def test_type_checkers_see_every_lazily_loaded_name():
    """Each lazily loaded public name is also imported under TYPE_CHECKING, from the module
    _LAZY loads it from: a module ``__getattr__`` alone makes mypy type them ``Any``."""
    import ast
    tree = ast.parse((REPO / "needle_cy" / "__init__.py").read_text(encoding="utf-8"))
    typed = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom) and imp.level == 1
                typed.update({a.name: f"needle_cy.{imp.module}" for a in imp.names})
    assert typed == {name: module for name, (module, attr) in needle_cy._LAZY.items()}
    assert all(name == attr for name, (_, attr) in needle_cy._LAZY.items())


def test_mypy_types_the_public_api(tmp_path, request):
    """``from needle_cy import Needle`` is the class to mypy, not ``Any`` (the package is
    found through MYPYPATH, as an installed one is through its py.typed)."""
    pytest.importorskip("mypy")
    snippet = tmp_path / "use_needle.py"
    snippet.write_text(
        "from needle_cy import Needle, Model, home_tools\n"
        "agent = Needle(tools=home_tools())\n"
        "response = agent.complete('turn on the kitchen light')\n"
        "reveal_type(response['function_calls'])\n"
        "reveal_type(Model.load)\n"
        "wrong: int = agent\n")
    pytest_cache = getattr(request.config, "cache", None)       # absent under -p no:cacheprovider
    cache = pytest_cache.mkdir("mypy") if pytest_cache is not None else tmp_path / "mypy-cache"
    env = dict(os.environ, MYPYPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "mypy", "--follow-imports=silent", "--no-error-summary",
                           "--cache-dir", str(cache), str(snippet)],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    out = proc.stdout
    assert 'Incompatible types in assignment (expression has type "Needle", variable has type "int")' in out, out
    assert "needle_cy.envelope.Call" in out and "-> needle_cy.model.Model" in out, out
    assert out.count("error:") == 1, out


def _public_functions():
    """(label, function) for the public functions and methods of the agent-level API."""
    from needle_cy.model import Model
    from needle_cy.toolspec import Field
    out = [(name, getattr(needle_cy, name)) for name in
           ("extract", "tool", "set_num_threads", "get_num_threads")]
    for cls in (needle_cy.Needle, Model, Field):
        for name, member in vars(cls).items():
            if name.startswith("_") and name != "__init__":
                continue
            func = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
            if inspect.isfunction(func):
                out.append((f"{cls.__name__}.{name}", func))
    return out


def test_public_functions_are_annotated():
    missing = []
    for label, func in _public_functions():
        sig = inspect.signature(func)
        for p in sig.parameters.values():
            if p.name not in ("self", "cls") and p.annotation is inspect.Parameter.empty:
                missing.append(f"{label}({p.name})")
        if sig.return_annotation is inspect.Signature.empty and not label.endswith("__init__"):
            missing.append(f"{label} -> ?")
        typing.get_type_hints(func)                   # every annotation resolves
    assert not missing, missing


def _response_keys():
    from needle_cy import envelope
    return set(typing.get_type_hints(envelope.Response))


def test_every_turn_envelope_has_exactly_the_documented_fields(tok):
    from needle_cy.agent import _error_envelope
    agent, _ = make_agent(tok, [f"<tool_call>[{LIGHT_CALL}]", "<tool_call>[]"])
    assert set(agent.complete("light")) == _response_keys()
    assert set(_error_envelope("boom", "cancelled")) == _response_keys()
    agent.cancel()
    assert set(agent.complete("light")) == _response_keys()


def test_run_adds_the_documented_run_fields(tok):
    from needle_cy import envelope
    agent, _ = make_agent(tok, [f"<tool_call>[{TIMER_CALL}]"] * 3)
    r = agent.run("timer")
    run_keys = set(typing.get_type_hints(envelope.RunResponse)) - _response_keys()
    assert set(r) - _response_keys() <= run_keys
    assert {"results", "executed_calls", "steps", "loop_stop"} <= set(r)
    assert r["loop_stop"] in typing.get_args(envelope.LoopStop)
    assert set(r["executed_calls"][0]) == set(typing.get_type_hints(envelope.ExecutedCall))
    assert r["executed_calls"][0]["status"] in typing.get_args(envelope.CallStatus)


def test_the_envelope_types_and_stop_reasons_are_the_documented_ones(tok):
    from needle_cy import envelope
    documented_types = set(typing.get_args(envelope.ResponseType))
    documented_stops = set(typing.get_args(envelope.StopReason))
    seen = []
    for script, kw in ((f"<tool_call>[{LIGHT_CALL}]", {}), ("<tool_call>[]", {}),
                       (f"<tool_call>[{LIGHT_CALL}]", {"max_new_tokens": 5}),
                       ("<think>\n" + "word " * 40, {"reasoning_limit": 8})):
        agent, _ = make_agent(tok, [script, "<tool_call>[]"], **kw)
        r = agent.complete("light")
        seen.append((r["type"], r["stop_reason"]))
        if r["type"] == "call":
            seen.append((agent.complete([{"ok": True}])["type"], "refusal"))
    assert {t for t, _ in seen} == documented_types
    assert {s for _, s in seen} <= documented_stops
    assert {"call", "refusal", "max_new_tokens", "reasoning_limit"} <= {s for _, s in seen}


def _first_python_block(path):
    return re.search(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), re.S).group(1)


def _python(args, cwd, timeout=180):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=timeout)


needs_default_model = pytest.mark.skipif(not DEFAULT_MODEL_PATH.exists(),
                                         reason="the embedded default model is not installed")


@needs_default_model
def test_the_readme_first_api_example_runs_as_written(tmp_path):
    code = _first_python_block(REPO / "README.md")
    assert "Needle(" in code and ".cact" not in code.split("#")[0]
    proc = _python(["-c", code], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[{'ok': True}]"


@needs_default_model
@pytest.mark.parametrize("example, shown", [
    ("batch_calls.py", ["'dim the kitchen to 30 and lock the front door': set_light(",
                        'lock_door({"door": "front door"})', 'add_to_shopping_list({"item": "tahini"})']),
    ("extraction.py", ['send_notification: {"message": "dinner is ready", "recipient": "kids"}',
                       "item='oat milk'"]),
    ("smart_home.py", ['{"ok": true, "room": "kitchen", "on": true, "brightness": 40}',
                       '{"ok": true, "temperature": 21.5}']),
])
def test_each_example_shows_a_working_result_with_the_embedded_model(tmp_path, example, shown):
    proc = _python([str(REPO / "examples" / example)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for text in shown:
        assert text in proc.stdout, proc.stdout
