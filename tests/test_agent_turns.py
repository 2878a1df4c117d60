"""Turns the model is not left to decide alone: ``require_call`` (the turn must call a tool)
and ``add_turn`` (a finished turn put into the conversation as given), over scripted logits."""
import json

import pytest

from needle_cy import Needle, NeedleError
from needle_cy.prompt import BOS_ID, assistant_text
from scripted_support import ScriptedModel
from test_agent import LIGHT_CALL, TIMER_CALL, make_agent, set_light, set_timer, tok  # noqa: F401

LIGHT = json.loads(LIGHT_CALL)
TIMER = json.loads(TIMER_CALL)


def decoded_calls(r):
    return r["function_calls"] + r["suppressed_calls"]


@pytest.mark.parametrize("script", ["<tool_call>[]", "", "<think>\nNothing to do.\n</think>\n"],
                         ids=["empty-list", "stop", "reasoning-then-stop"])
def test_require_call_makes_a_turn_that_would_refuse_call_a_tool(tok, script):
    """The model writes "[]", stops at once, or stops after reasoning: the normal turn
    refuses, the same turn with require_call=True calls one of the agent's tools with
    schema-valid arguments."""
    jsonschema = pytest.importorskip("jsonschema")
    agent, _ = make_agent(tok, [script])
    r = agent.complete("is anyone there")
    assert r["type"] == "refusal" and decoded_calls(r) == []
    agent.reset()
    r = agent.complete("is anyone there", require_call=True)
    assert r["success"] and r["type"] == "call" and r["stop_reason"] == "call"
    calls = decoded_calls(r)
    assert len(calls) >= 1 and calls[0]["name"] in agent.tools
    for call in calls:
        params = agent.tools[call["name"]].grammar_schema()["parameters"]
        jsonschema.validate(call["arguments"], params)


def test_require_call_keeps_a_call_the_model_writes_and_is_a_setting(tok):
    # a call the model writes itself is the same with or without the requirement
    agent, _ = make_agent(tok, [f"<tool_call>[{TIMER_CALL}]"])
    assert agent.complete("a five minute timer", require_call=True)["function_calls"] == [TIMER]
    # the constructor's require_call is the default of every turn; a turn may turn it off
    agent, _ = make_agent(tok, ["<tool_call>[]"], require_call=True)
    assert len(decoded_calls(agent.complete("hello"))) >= 1
    agent.reset()
    assert decoded_calls(agent.complete("hello", require_call=False)) == []


def test_require_call_needs_constrained_decoding(tok):
    with pytest.raises(ValueError, match="require_call needs constrained decoding"):
        make_agent(tok, [""], require_call=True, constrained=False)
    agent, _ = make_agent(tok, ["<tool_call>[]"], constrained=False)
    with pytest.raises(ValueError, match="require_call needs constrained decoding"):
        agent.complete("hello", require_call=True)
    with pytest.raises(TypeError, match="require_call"):
        agent.complete("hello", require_call="yes")


def test_add_turn_holds_the_turn_as_the_template_renders_it(tok):
    """A replayed request and answer, their tool results, then a decoded turn: the model
    saw exactly the tokens of the whole conversation's text, as if encoded at once."""
    agent, model = make_agent(tok, ["", "<tool_call>[]"])
    agent.add_turn("turn on the kitchen light", [LIGHT])
    assert agent.turns == 1 and not model.n_steps          # nothing was decoded
    r = agent.complete([{"ok": True}])
    assert r["type"] == "respond" and r["function_calls"] == []
    conv = agent._active.conversation
    text = (conv.prefix_text + "\nturn on the kitchen light<|im_end|>\n<|im_start|>assistant\n"
            + assistant_text("", [LIGHT])
            + '\n<|im_start|>user\n<tool_result>[{"ok": true}]</tool_result><|im_end|>\n'
              "<|im_start|>assistant\n<tool_call>[]</tool_call><|im_end|>")
    assert model.history == [BOS_ID] + list(tok.encode(text, dummy_prefix=True, allowed_special="all"))
    assert conv.ids == model.history


def test_add_turn_then_a_new_request_keeps_what_was_said(tok):
    agent, model = make_agent(tok, ["", "", f"<tool_call>[{TIMER_CALL}]"])
    agent.add_turn("light please", [LIGHT])
    agent.add_turn(json.dumps([{"ok": True}]), [])        # results as JSON text, answered []
    r = agent.complete("and a five minute timer")
    assert r["function_calls"] == [TIMER] and agent.turns == 3
    text = tok.decode(model.history)
    assert text.count("<|im_start|>user") == 3
    assert '<tool_result>[{"ok": true}]</tool_result><|im_end|>\n<|im_start|>assistant\n' \
           '<tool_call>[]</tool_call><|im_end|>\n<|im_start|>user\nand a five minute timer' in text
    assert agent._said == ["light please", '[{"ok": true}]', "and a five minute timer"]


def test_add_turn_refuses_what_the_turn_could_not_hold(tok):
    agent, model = make_agent(tok, [""])
    for calls, match in (([{"name": "open_window", "arguments": {}}], "not a call list"),
                         ([{"name": "set_timer", "arguments": {"minutes": "five"}}], "not a call list"),
                         ([{"name": "set_timer"}, {"name": "set_timer", "arguments": {"minutes": 2}}],
                          "not a call list"),
                         ([{"name": "set_timer", "args": {}}], "list of"),
                         ("set_timer", "list of")):
        with pytest.raises(ValueError, match=match):
            agent.add_turn("timer", calls)
        assert agent.turns == 0 and agent._active is None
    with pytest.raises(NeedleError, match="no turn with calls precedes"):
        agent.add_turn([{"ok": True}], [])
    with pytest.raises(ValueError, match="blank"):
        agent.add_turn("  ", [])
    agent.add_turn("timer", [])
    with pytest.raises(NeedleError, match="no turn with calls precedes"):
        agent.add_turn([{"ok": True}], [])                 # the last turn made no call
    stateless = Needle(ScriptedModel(tok, [""]), tools=[set_light, set_timer], tokenizer=tok,
                       stateless=True)
    with pytest.raises(NeedleError, match="stateless"):
        stateless.add_turn("timer", [TIMER])
