"""needle-cy: user errors are one line on stderr with a non-zero exit; run/batch/inspect work."""
import io
import json
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
    assert rows == [{"prompt": "kitchen light on", "name": "set_light",
                     "parameters": {"room": "kitchen", "on": True}},
                    {"prompt": "again", "name": "set_light", "parameters": {"room": "kitchen", "on": True}}]


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
