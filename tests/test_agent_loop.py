"""run() as a loop that must not repeat side effects or lose results: schema-only tools,
labelled results, tool timeouts, cancel while a tool runs, SystemExit in a tool, results
that do not fit the context; the input checks and the envelope's ``type``."""
import json
import threading

import pytest

from needle_cy import ContextOverflowError, Needle
from needle_cy.generate import CLOSING_RESERVE
from scripted_support import ScriptedModel
from test_agent import (BOOM_CALL, LIGHT_CALL, TIMER_CALL, make_agent, set_light, set_timer,  # noqa: F401
                        tok)

LIGHT = json.loads(LIGHT_CALL)
TIMER = json.loads(TIMER_CALL)
LIGHT_SCHEMA = {"name": "set_light", "description": "Turn a light on or off.",
                "parameters": {"type": "object", "properties": {
                    "room": {"type": "string"}, "on": {"type": "boolean"}}, "required": ["room", "on"]}}
TIMER_SCHEMA = {"name": "set_timer", "description": "Start a timer.",
                "parameters": {"type": "object", "properties": {"minutes": {"type": "integer"}},
                               "required": ["minutes"]}}


def assistant_turns(tok, model):
    return tok.decode(model.history).count("<|im_start|>assistant")


def test_schema_only_tools_end_the_turn_with_the_calls_unexecuted(tok):
    agent, model = make_agent(tok, [f"<tool_call>[{LIGHT_CALL}]"] * 8, tools=(LIGHT_SCHEMA, TIMER_SCHEMA))
    r = agent.run("turn on the kitchen light")
    assert r["success"] and r["loop_stop"] == "not_executable"
    assert r["function_calls"] == [LIGHT] and r["results"] == [] and r["steps"] == 0
    assert "set_light" in r["unexecuted_reason"] and "no Python function" in r["unexecuted_reason"]
    assert assistant_turns(tok, model) == 1          # nothing was fed back, no loop


def test_a_turn_mixing_a_function_and_a_schema_only_tool_runs_neither(tok):
    ran = []

    def set_light(room: str, on: bool):
        """Switch the lights in one room."""
        ran.append(room)

    agent, _ = make_agent(tok, [f"<tool_call>[{LIGHT_CALL},{TIMER_CALL}]"] * 3, tools=(set_light, TIMER_SCHEMA))
    r = agent.run("kitchen light on and a five minute timer")
    assert ran == [] and r["loop_stop"] == "not_executable"
    assert r["function_calls"] == [LIGHT, TIMER] and "set_timer has no" in r["unexecuted_reason"]


def test_each_executed_call_is_returned_beside_its_result(tok):
    agent, _ = make_agent(tok, [f"<tool_call>[{LIGHT_CALL},{TIMER_CALL}]", f"<tool_call>[{BOOM_CALL}]",
                                "<tool_call>[]"])
    r = agent.run("kitchen light on, five minute timer, and blow up")
    assert r["loop_stop"] == "no_calls" and r["type"] == "respond" and r["function_calls"] == []
    assert r["executed_calls"] == [
        {"name": "set_light", "arguments": LIGHT["arguments"], "result": {"ok": True, "room": "kitchen", "on": True},
         "status": "ok", "step": 1},
        {"name": "set_timer", "arguments": {"minutes": 5}, "result": {"ok": True, "minutes": 5},
         "status": "ok", "step": 1},
        {"name": "explode", "arguments": {}, "result": {"error": "device offline"}, "status": "error", "step": 2}]
    assert r["results"] == [e["result"] for e in r["executed_calls"]]


def test_a_hanging_tool_times_out_and_the_model_is_told(tok):
    release = threading.Event()

    def set_timer(minutes: int):
        """Start a timer."""
        release.wait(120)         # hangs until the test lets it go
        return {"ok": True}

    agent, model = make_agent(tok, [f"<tool_call>[{TIMER_CALL}]", "<tool_call>[]"],
                              tools=(set_light, set_timer))
    try:
        r = agent.run("five minute timer", tool_timeout=0.2)
    finally:
        release.set()
    assert r["success"] and r["executed_calls"][0]["status"] == "timeout"
    assert r["results"] == [{"error": "Tool set_timer timed out after 0.2 s"}]
    assert "timed out after 0.2 s" in tok.decode(model.history)


def test_cancel_while_a_tool_runs_stops_the_run_and_keeps_what_ran(tok):
    started, release = threading.Event(), threading.Event()
    lights = []

    def set_light(room: str, on: bool):
        """Switch the lights in one room."""
        lights.append(room)
        return {"ok": True}

    def set_timer(minutes: int):
        """Start a timer."""
        started.set()
        release.wait(120)
        return {"ok": True}

    agent, _ = make_agent(tok, [f"<tool_call>[{LIGHT_CALL},{TIMER_CALL}]", "<tool_call>[]",
                                f"<tool_call>[{LIGHT_CALL}]"], tools=(set_light, set_timer))
    out = {}
    worker = threading.Thread(target=lambda: out.setdefault("r", agent.run("light and timer", tool_timeout=None)))
    worker.start()
    try:
        assert started.wait(120)
        agent.cancel()
        worker.join(120)             # a guard against a hang, not a timing check
        assert not worker.is_alive()
    finally:
        release.set()
    r = out["r"]
    assert not r["success"] and r["error_code"] == "cancelled" and r["type"] == "error"
    assert "tool set_timer" in r["error"]
    assert [(e["name"], e["status"]) for e in r["executed_calls"]] == [("set_light", "ok"), ("set_timer", "cancelled")]
    assert lights == ["kitchen"]
    agent.reset()                                    # the agent stays usable
    assert agent.complete("light and timer")["function_calls"] == [LIGHT, TIMER]


def test_a_cancel_made_just_before_a_turn_cancels_it(tok):
    agent, _ = make_agent(tok, [f"<tool_call>[{LIGHT_CALL}]"] * 2)
    agent.cancel()
    r = agent.complete("light")
    assert r["error_code"] == "cancelled" and not r["success"]
    assert agent.complete("light")["function_calls"] == [LIGHT]       # spent: the next turn runs


def test_system_exit_in_a_tool_is_that_tool_s_error(tok):
    def set_timer(minutes: int):
        """Start a timer."""
        raise SystemExit(3)

    agent, _ = make_agent(tok, [f"<tool_call>[{TIMER_CALL}]", "<tool_call>[]"], tools=(set_timer,))
    r = agent.run("five minute timer")
    assert r["success"] and r["executed_calls"][0]["status"] == "error"
    assert r["results"] == [{"error": "Tool set_timer raised SystemExit(3)"}]


def _position_after_first_turn(tok, tools, script, query):
    agent, model = make_agent(tok, [script], tools=tools)
    agent.complete(query)
    return model.position


def test_a_tool_result_too_big_for_the_context_is_cut_with_a_marker(tok):
    big = "x" * 4000

    def set_timer(minutes: int):
        """Start a timer."""
        return {"ok": True, "log": big}

    script = f"<tool_call>[{TIMER_CALL}]"
    pos = _position_after_first_turn(tok, (set_timer,), script, "timer")
    agent, model = make_agent(tok, [script, "<tool_call>[]"], tools=(set_timer,),
                              max_seq_len=pos + CLOSING_RESERVE + 48 + 60, max_new_tokens=48)
    r = agent.run("timer")
    assert r["success"] and r["results_cut"] == 1 and r["type"] == "respond"
    assert r["results"] == [{"ok": True, "log": big}]              # the caller keeps all of it
    fed = tok.decode(model.history)
    assert "characters]" in fed and "...[cut: " in fed and big not in fed
    assert model.position <= model.config.max_seq_len


def test_results_that_cannot_fit_give_an_error_envelope_that_keeps_what_ran(tok):
    ran = []

    def set_timer(minutes: int):
        """Start a timer."""
        ran.append(minutes)
        return {"ok": True, "log": "y" * 500}

    script = f"<tool_call>[{TIMER_CALL}]"
    pos = _position_after_first_turn(tok, (set_timer,), script, "timer")
    agent, model = make_agent(tok, [script, "<tool_call>[]"], tools=(set_timer,),
                              max_seq_len=pos + CLOSING_RESERVE + 48 + 5, max_new_tokens=48)
    r = agent.run("timer")
    assert not r["success"] and r["error_code"] == "context_overflow" and r["type"] == "error"
    assert ran == [5] and r["executed_calls"][0]["status"] == "ok" and r["steps"] == 1
    assert "reset()" not in r["error"] and "start a new conversation" in r["error"]
    assert model.position <= model.config.max_seq_len
    # a request that does not fit, before anything ran, still raises
    with pytest.raises(ContextOverflowError, match="shorten the request"):
        agent.reset()
        agent.run("timer " * 200)


def test_complete_serializes_results_as_run_does(tok):
    class Reading:
        def __str__(self):
            return "21.5 C"

    agent, model = make_agent(tok, [f"<tool_call>[{TIMER_CALL}]", "<tool_call>[]"])
    agent.complete("timer")
    r = agent.complete([Reading()])
    assert r["success"] and r["type"] == "respond"
    assert '<tool_result>["21.5 C"]</tool_result>' in tok.decode(model.history)


@pytest.mark.parametrize("bad, fragment", [(123, "got int"), (None, "got NoneType"),
                                           (b"light", "got bytes (decode the bytes first)")])
def test_a_turn_of_the_wrong_type_is_a_clear_type_error(tok, bad, fragment):
    agent, _ = make_agent(tok, [f"<tool_call>[{LIGHT_CALL}]"])
    with pytest.raises(TypeError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        agent.complete(bad)
    assert agent.complete("light")["function_calls"] == [LIGHT]


def test_a_blank_request_is_a_value_error(tok):
    agent, model = make_agent(tok, [f"<tool_call>[{LIGHT_CALL}]"])
    for blank in ("", "   ", "\n\t"):
        with pytest.raises(ValueError, match="request is blank"):
            agent.complete(blank)
        with pytest.raises(ValueError, match="request is blank"):
            agent.run(blank)
    assert model.history == [] or assistant_turns(tok, model) == 0


def test_counts_out_of_range_are_named_errors(tok):
    with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 1, got -5"):
        make_agent(tok, [""], max_new_tokens=-5)
    with pytest.raises(ValueError, match="reasoning_limit must be an integer >= 0"):
        make_agent(tok, [""], reasoning_limit=-1)
    agent, _ = make_agent(tok, [f"<tool_call>[{LIGHT_CALL}]"])
    with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 1, got -5"):
        agent.complete("light", max_new_tokens=-5)
    with pytest.raises(ValueError, match="max_steps must be an integer >= 0, got -1"):
        agent.run("light", max_steps=-1)
    with pytest.raises(ValueError, match="tool_timeout must be a number of seconds > 0"):
        agent.run("light", tool_timeout=0)
    with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 1, got 'many'"):
        make_agent(tok, [""], max_new_tokens="many")


def test_the_envelope_type_says_call_refusal_respond_or_error(tok):
    agent, _ = make_agent(tok, [f"<tool_call>[{LIGHT_CALL}]", "<tool_call>[]"])
    assert agent.complete("light")["type"] == "call"
    assert agent.complete([{"ok": True}])["type"] == "respond"
    agent, _ = make_agent(tok, ["<tool_call>[]"])
    r = agent.complete("what's the meaning of life")
    assert r["success"] and r["type"] == "refusal" and r["function_calls"] == []
    agent, _ = make_agent(tok, [f"<tool_call>[{LIGHT_CALL}]"], max_new_tokens=6)
    r = agent.complete("light")
    assert not r["success"] and r["type"] == "error" and r["error_code"] == "max_new_tokens"
    agent.cancel()
    r = agent.complete("light")
    assert r["type"] == "error" and r["error_code"] == "cancelled"
    assert set(r) >= {"tools", "timings", "stop_reason", "suppressed_calls"}
