"""needle-cy: user errors are one line on stderr with a non-zero exit; run/batch/inspect work."""
import io
import json
import os
import shutil
import subprocess
import sys

import pytest

import needle_cy.agent as agent_mod
from conftest import REPO, fixture_path
from needle_cy import cli
from scripted_support import FiniteGrammar, ScriptedModel
from test_generate_scripted import compile_tools

TOOLS = [{"name": "set_light", "description": "Turn the lights in one room on or off",
          "parameters": {"type": "object", "properties": {
              "room": {"type": "string", "enum": ["kitchen", "bedroom"]}, "on": {"type": "boolean"}},
              "required": ["room", "on"]}}]
CALL = '{"name":"set_light","arguments":{"room":"kitchen","on":true}}'


def run_cli(*argv):
    proc = subprocess.run([sys.executable, "-m", "needle_cy", *argv], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture
def tools_file(tmp_path):
    path = tmp_path / "tools.json"
    path.write_text(json.dumps(TOOLS))
    return path


def assert_one_line_error(rc, err, fragment):
    assert rc != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("needle-cy: error:"), err
    assert "Traceback" not in err and fragment in lines[0]


def test_missing_tools_file_is_one_line(tmp_path):
    rc, _, err = run_cli("run", "hi", "--tools", str(tmp_path / "absent.json"))
    assert_one_line_error(rc, err, "tools file not found")


def test_malformed_json_is_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('[{"name": "x",')
    rc, _, err = run_cli("run", "hi", "--tools", str(bad))
    assert_one_line_error(rc, err, "not valid JSON")


def test_unsupported_schema_is_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"name": "x", "parameters": {"type": "object", "properties": {
        "a": {"type": "integer", "minimum": 3, "maximum": 1}}}}]))
    rc, _, err = run_cli("run", "hi", "--tools", str(bad))
    assert_one_line_error(rc, err, "greater than")


@pytest.mark.parametrize("content, fragment", [
    ({"tools": 5}, '"tools" must be a list of tool definitions, got int 5; write the file as a JSON list'),
    (5, "must hold a JSON list of tool definitions, got int; write the file as a JSON list"),
    ([1], 'entry 0 must be an object, got int; each tool is {"name": '),
])
def test_a_tools_file_of_the_wrong_shape_says_how_to_write_it(tmp_path, capsys, content, fragment):
    bad = tmp_path / "tools.json"
    bad.write_text(json.dumps(content))
    assert cli.main(["run", "hi", "--tools", str(bad)]) == 1
    err = capsys.readouterr().err
    assert_one_line_error(1, err, fragment)


def test_a_misspelt_schema_keyword_is_a_warning_line_or_with_strict_an_error(scripted, tmp_path, capsys):
    typo = [dict(TOOLS[0], parameters={**TOOLS[0]["parameters"], "requried": ["room"]})]
    path = tmp_path / "typo.json"
    path.write_text(json.dumps(typo))
    assert cli.main(["run", "kitchen light on", "--tools", str(path)]) == 0
    warning = [line for line in capsys.readouterr().err.splitlines() if "requried" in line]
    assert warning == [warning[0]] and warning[0].startswith(
        "needle-cy: warning: tool 'set_light': parameters has the key 'requried'")
    assert cli.main(["run", "kitchen light on", "--tools", str(path), "--strict"]) == 1
    assert_one_line_error(1, capsys.readouterr().err, "'requried'")


def test_missing_model_is_one_line(tools_file, tmp_path):
    rc, _, err = run_cli("run", "hi", "--tools", str(tools_file), "--model", str(tmp_path / "m.cact"))
    assert_one_line_error(rc, err, "model archive not found")


def test_inspect_describes_an_archive_and_rejects_non_archives():
    rc, out, err = run_cli("inspect", str(fixture_path("needle3_tiny_a", "model.cact")))
    assert rc == 0 and "d_model" in out and "64" in out
    rc, _, err = run_cli("inspect", str(fixture_path("needle3_tiny_a", "cases.json")))
    assert_one_line_error(rc, err, "cases.json")


def test_usage_error_exits_2():
    rc, _, err = run_cli("run")
    assert rc == 2 and "usage" in err


@pytest.fixture
def scripted(monkeypatch):
    """Make the CLI build its agent over a scripted model (the real tokenizer of tiny_a)."""
    from needle_cy.tokenizer import Tokenizer
    tok = Tokenizer.from_archive(str(fixture_path("needle3_tiny_a", "model.cact")))
    real = agent_mod.Needle

    def factory(model, tools, **kw):
        for key in ("threads", "backend"):
            kw.pop(key, None)
        # The script repeats one call whatever the prompt says: no value grounding
        # (tests/test_grounding.py covers it).
        kw["ground_values"] = False
        agent = real(ScriptedModel(tok, [f"<think>\nKitchen.\n</think>\n<tool_call>[{CALL}]"] * 3),
                     tools=tools, tokenizer=tok, **kw)
        if compile_tools is None:
            agent.compile_grammar = lambda s, m: FiniteGrammar([f"[{CALL}]", "[]"])
        return agent
    monkeypatch.setattr(agent_mod, "Needle", factory)
    return tok


def test_run_prints_the_call_and_the_envelope(scripted, tools_file, capsys):
    assert cli.main(["run", "kitchen light on", "--tools", str(tools_file)]) == 0
    out = capsys.readouterr().out
    assert out.strip() == 'set_light(room="kitchen", on=true)'
    assert cli.main(["run", "kitchen light on", "--tools", str(tools_file), "--json"]) == 0
    env = json.loads(capsys.readouterr().out)
    assert env["function_calls"] == [json.loads(CALL)] and env["reasoning"] == "Kitchen."


def test_batch_writes_the_call_me_maybe_contract(scripted, tmp_path):
    fdef = tmp_path / "functions_definition.json"
    fdef.write_text(json.dumps([{"name": "set_light", "description": "Lights.",
                                 "parameters": {"room": {"type": "string"}, "on": {"type": "boolean"}},
                                 "returns": {"type": "boolean"}}]))
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps([{"prompt": "kitchen light on"}, {"prompt": "again"}]))
    out = tmp_path / "out.json"
    assert cli.main(["batch", "--functions-definition", str(fdef), "--input", str(prompts),
                     "--output", str(out), "--quiet"]) == 0
    rows = json.loads(out.read_text())
    light = {"name": "set_light", "parameters": {"room": "kitchen", "on": True}}
    assert rows == [{"prompt": "kitchen light on", **light, "calls": [light], "held_back": []},
                    {"prompt": "again", **light, "calls": [light], "held_back": []}]


def test_batch_rejects_a_bad_prompts_file(scripted, tools_file, tmp_path, capsys):
    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps({"prompt": "x"}))
    rc = cli.main(["batch", "--functions-definition", str(tools_file), "--input", str(prompts),
                   "--output", str(tmp_path / "o.json")])
    assert rc == 1 and "must hold a JSON list" in capsys.readouterr().err


def test_partial_call_rendering():
    text = '[{"name":"set_light","arguments":{"room":"kitchen","on":true,"tags":["a"]}},{"name":"t","arguments":{}}]'
    assert cli.render_partial_calls(text) == 'set_light(room="kitchen", on=true, tags=["a"])\nt()'
    assert cli.render_partial_calls(text[:46]) == 'set_light(room="kitc'


def test_run_end_to_end_on_a_fixture_archive(tmp_path, tools_file):
    model = str(fixture_path("needle3_tiny_a", "model.cact"))
    rc, out, err = run_cli("run", "turn on the kitchen light", "--tools", str(tools_file), "--model", model,
                           "--json", "--reasoning-limit", "16", "--max-new-tokens", "32")
    assert rc in (0, 1), err
    env = json.loads(out)
    assert set(env) >= {"success", "function_calls", "confidence", "prefill_tps"}
    expected = ("error" if not env["success"] else
                "call" if env["function_calls"] or env["suppressed_calls"] else "refusal")
    assert env["type"] == expected
    assert env["timings"]["n_reasoning"] <= 16
    assert env["confidence"] is None or 0 <= env["confidence"] <= 1


def test_chat_repl_on_a_fixture_archive(tools_file):
    model = str(fixture_path("needle3_tiny_a", "model.cact"))
    proc = subprocess.run([sys.executable, "-m", "needle_cy", "chat", "--tools", str(tools_file),
                           "--model", model, "--reasoning-limit", "4", "--max-new-tokens", "24"],
                          input="turn on the light\n/reset\nagain\n/quit\n", capture_output=True,
                          text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "(conversation reset)" in proc.stdout and "Traceback" not in proc.stderr


def test_chat_runs_each_call_once_and_shows_its_result(scripted, tools_file, capsys, monkeypatch):
    # The script asks for the same call on every turn: chat must not run it again.
    monkeypatch.setattr("sys.stdin", io.StringIO("kitchen light on\n/reset\nkitchen light on\n/quit\n"))
    assert cli.main(["chat", "--tools", str(tools_file)]) == 0
    out = capsys.readouterr().out
    executed = [line for line in out.splitlines() if "set_light(" in line]
    assert len(executed) == 2, out                       # once per conversation
    assert all('set_light(room="kitchen", on=true) -> {"ok": true, "tool": "set_light"' in line
               for line in executed)
    assert "(no call)" not in out and out.count("not run twice") == 2


def test_chat_shows_held_back_calls(scripted, tools_file, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("don't turn on the kitchen light\n"))
    assert cli.main(["chat", "--tools", str(tools_file)]) == 0
    out = capsys.readouterr().out
    assert 'held back (the request negates it, escalate): set_light(room="kitchen", on=true)' in out
    assert "->" not in out and "(no call)" not in out


# ----------------------------------------------------------- the CLI as a user meets it

TIMER_TOOL = {"name": "set_timer", "description": "Start a timer",
              "parameters": {"type": "object", "properties": {"minutes": {"type": "integer"}},
                             "required": ["minutes"]}}
TWO_CALLS = f'[{CALL},{{"name":"set_timer","arguments":{{"minutes":5}}}}]'     # one call per tool a turn


@pytest.fixture
def scripted_agents(monkeypatch):
    """Like ``scripted``, with the script given by the test; records each agent built."""
    from needle_cy.tokenizer import Tokenizer
    tok = Tokenizer.from_archive(str(fixture_path("needle3_tiny_a", "model.cact")))
    real, built = agent_mod.Needle, []

    def use(script):
        def factory(model, tools, **kw):
            for key in ("threads", "backend"):
                kw.pop(key, None)
            kw["ground_values"] = False
            agent = real(ScriptedModel(tok, [script] * 3), tools=tools, tokenizer=tok, **kw)
            if compile_tools is None:
                agent.compile_grammar = lambda s, m: FiniteGrammar([script.split("<tool_call>")[-1], "[]"])
            built.append(agent)
            return agent
        monkeypatch.setattr(agent_mod, "Needle", factory)
        return built
    return use


def test_a_blank_request_is_one_line_and_no_call():
    rc, out, err = run_cli("run", "   ")
    assert_one_line_error(rc, err, "the request is blank")
    assert out == ""


def test_a_request_that_is_not_utf8_is_named():
    proc = subprocess.run([sys.executable, "-m", "needle_cy", "run", b"\xff lights"], capture_output=True,
                          cwd=REPO, timeout=120)
    err = proc.stderr.decode("utf-8", "replace")
    assert_one_line_error(proc.returncode, err, "the query argument is not UTF-8 text (byte 0xFF at character 0)")
    assert "surrogate" not in err


@pytest.mark.parametrize("flag, value, expected", [("--max-new-tokens", "-1", "an integer >= 1, got -1"),
                                                   ("--reasoning-limit", "-3", "an integer >= 0, got -3"),
                                                   ("--threads", "0", "an integer >= 1, got 0"),
                                                   ("--tools-per-clause", "0", "an integer >= 1, got 0"),
                                                   ("--name-prior", "0", "a finite number > 0, got 0"),
                                                   ("--name-prior", "nan", "a finite number > 0, got nan"),
                                                   ("--name-prior", "x", "a number > 0, got 'x'")])
def test_counts_out_of_range_are_usage_errors(flag, value, expected):
    rc, _, err = run_cli("run", "hi", flag, value)
    assert rc == 2 and f"argument {flag}: expected {expected}" in err


def test_selection_and_name_prior_flags_reach_the_agent(monkeypatch, tools_file, tmp_path):
    """--tools-per-clause and --name-prior are the agent's options of the same names, for
    run and batch alike (off when not given)."""
    seen = []

    class Stop(Exception):
        pass

    def factory(model, tools, **kw):
        seen.append((kw["tools_per_clause"], kw["name_prior"]))
        raise Stop
    monkeypatch.setattr(agent_mod, "Needle", factory)
    prompts = tmp_path / "prompts.json"
    prompts.write_text('["hi"]')
    for argv in (["run", "hi", "--tools", str(tools_file)],
                 ["run", "hi", "--tools", str(tools_file), "--tools-per-clause", "1", "--name-prior", "0.5"],
                 ["batch", "--functions-definition", str(tools_file), "--input", str(prompts),
                  "--output", str(tmp_path / "out.json"), "--tools-per-clause", "2", "--name-prior", "1"]):
        with pytest.raises(Stop):
            cli.main(argv)
    assert seen == [(None, None), (1, 0.5), (2, 1.0)]


def test_version_and_inspect_json():
    from needle_cy import __version__
    rc, out, _ = run_cli("--version")
    assert rc == 0 and out.strip() == f"needle-cy {__version__}"
    rc, out, err = run_cli("inspect", "--json", str(fixture_path("needle3_tiny_a", "model.cact")))
    assert rc == 0, err
    info = json.loads(out)
    assert info["header"]["d_model"] == 64 and info["parameters"] > 0
    assert info["tensors"][0]["index"] == 0 and {"role", "dtype", "shape", "bits", "nbytes"} <= set(info["tensors"][0])


def test_a_closed_pipe_ends_quietly():
    read_end, write_end = os.pipe()
    os.close(read_end)                       # the reader is gone before anything is written
    try:
        proc = subprocess.run([sys.executable, "-m", "needle_cy", "inspect",
                               str(fixture_path("needle3_tiny_a", "model.cact"))],
                              stdout=write_end, stderr=subprocess.PIPE, cwd=REPO, timeout=120)
    finally:
        os.close(write_end)
    assert proc.stderr == b"" and proc.returncode == 141


def test_model_given_as_a_folder(tmp_path):
    model = fixture_path("needle3_tiny_a", "model.cact")
    one = tmp_path / "one"
    one.mkdir()
    (one / "tiny.cact").symlink_to(model)
    rc, out, err = run_cli("inspect", str(one))
    assert rc == 0 and "d_model" in out, err
    empty = tmp_path / "empty"
    empty.mkdir()
    rc, _, err = run_cli("inspect", str(empty))
    assert_one_line_error(rc, err, "holds no .cact archive")
    (one / "other.cact").symlink_to(model)
    rc, _, err = run_cli("inspect", str(one))
    assert_one_line_error(rc, err, "several .cact archives (other.cact, tiny.cact)")
    rc, out, _ = run_cli("inspect", str(one), "--model-file", "other.cact")
    assert rc == 0 and "other.cact" in out
    rc, _, err = run_cli("run", "hi", "--model", str(empty))
    assert_one_line_error(rc, err, "holds no .cact archive")
    assert "Errno" not in err
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS))
    rc, _, err = run_cli("run", "hi", "--model", str(one), "--model-file", "other.cact", "--tools", str(tools))
    assert rc == 0 and "several .cact archives" not in err, err          # run reads --model-file too


def test_batch_keeps_every_call_and_marks_held_back_ones(scripted_agents, tmp_path, capsys):
    scripted_agents(f"<tool_call>{TWO_CALLS}")
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS + [TIMER_TOOL]))
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps([{"prompt": "kitchen light on and a five minute timer"},
                                   {"prompt": "don't turn on the kitchen light"}]))
    out = tmp_path / "out.json"
    assert cli.main(["batch", "--functions-definition", str(tools), "--input", str(prompts),
                     "--output", str(out)]) == 0
    light = {"name": "set_light", "parameters": {"room": "kitchen", "on": True}}
    timer = {"name": "set_timer", "parameters": {"minutes": 5}}
    assert json.loads(out.read_text()) == [
        {"prompt": "kitchen light on and a five minute timer", **light, "calls": [light, timer], "held_back": []},
        {"prompt": "don't turn on the kitchen light", "name": None, "parameters": {}, "calls": [],
         "held_back": [{**light, "reason": "negated"}, {**timer, "reason": "negated"}]}]
    err = capsys.readouterr().err
    assert "\r" not in err and "\033" not in err          # stderr is not a terminal: nothing drawn
    assert "wrote 2 records (2 calls, 2 held back)" in err
    assert list(tmp_path.glob(".needle-cy-*")) == []       # no temporary file left


def test_batch_checks_the_output_path_before_running_any_prompt(scripted_agents, tools_file, tmp_path, capsys):
    built = scripted_agents(f"<tool_call>[{CALL}]")
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps(["kitchen light on"]))
    for output, fragment in ((tmp_path / "absent" / "out.json", "does not exist"),
                             (tmp_path, "is a directory")):
        rc = cli.main(["batch", "--functions-definition", str(tools_file), "--input", str(prompts),
                       "--output", str(output)])
        assert rc == 1 and fragment in capsys.readouterr().err
    assert built == []                                    # no model was even loaded


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_live_drawing_fits_a_narrow_terminal(scripted_agents, tools_file, monkeypatch):
    # two calls on one line are longer than the 40 columns: a wrapped line would leave rows behind
    scripted_agents(f"<think>\nA light and a timer.\n</think>\n<tool_call>{TWO_CALLS}")
    tools = tools_file.parent / "two_tools.json"
    tools.write_text(json.dumps(TOOLS + [TIMER_TOOL]))
    screen = FakeTerminal()
    monkeypatch.setattr(sys, "stdout", screen)
    monkeypatch.setattr(shutil, "get_terminal_size", lambda fallback=None: os.terminal_size((40, 24)))
    assert cli.main(["run", "light and timer", "--tools", str(tools)]) == 0
    drawn, _, printed = screen.getvalue().rpartition("\r\033[K")
    frames = [f.replace("\033[K", "") for f in drawn.split("\r") if f]
    assert any("set_light(" in f for f in frames)
    assert all(len(f) <= 39 for f in frames), [f for f in frames if len(f) > 39]
    assert any(f.startswith("reading the request") for f in frames)      # the phase line
    assert any(f.startswith("thinking") for f in frames)
    assert printed.splitlines()[0] == 'set_light(room="kitchen", on=true)'


def test_fit_to_width_keeps_the_end_and_counts_wide_characters():
    assert cli.fit_to_width("abc", 10) == "abc"
    assert cli.fit_to_width("abcdefghij", 6) == "…ghij"
    assert cli.fit_to_width("a\nb", 10) == "a; b"
    assert cli.fit_to_width("設定設定設定", 6) == "…設定"        # two columns each


def test_bench_uses_the_embedded_catalogue_and_its_columns_add_up(scripted_agents, capsys):
    scripted_agents(f"<tool_call>[{CALL}]")
    assert cli.main(["bench", "--queries", "kitchen light on", "bedroom light on"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("tools: 20 from ") and lines[0].split(";")[0].endswith("home_tools.json")
    assert "other" in lines[1]
    rows = [line[33:].split() for line in lines[2:4]]
    for total, prefill, reason, constr, other, *_ in rows:
        assert abs(float(total) - (float(prefill) + float(reason) + float(constr) + float(other))) <= 0.0025
