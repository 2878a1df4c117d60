"""Exact decoding behaviour with scripted logits (tests/scripted_support.py) and the real
tokenizer of the tiny_a fixture archive."""
import json
import math

import numpy as np
import pytest

from conftest import fixture_path
from needle_cy.generate import CallSplitter, DecodeSettings, run_turn, sigmoid, token_probability
from needle_cy.prompt import Conversation, render_tools_json
from scripted_support import LIGHT_TOOL as LIGHT, FiniteGrammar, ScriptedModel, token_at_byte


def _real_grammar():
    """needle_cy.grammar.compile_tools when it works; None → the finite stand-in."""
    try:
        from needle_cy.grammar import compile_tools as ct
        ct([{"name": "t", "description": "", "parameters": {"type": "object", "properties": {}}}])
        return ct
    except Exception:  # written concurrently; the stand-in keeps these tests meaningful
        return None


compile_tools = _real_grammar()

TIMER = {"name": "set_timer", "description": "Start a timer.",
         "parameters": {"type": "object", "properties": {
             "minutes": {"type": "integer", "minimum": 1, "maximum": 600},
             "label": {"type": "string", "maxLength": 40}}, "required": ["minutes"],
             "additionalProperties": False}}

CALL_A = '{"name":"set_light","arguments":{"room":"kitchen","on":true}}'
CALL_B = '{"name":"set_timer","arguments":{"minutes":5}}'


@pytest.fixture(scope="module")
def tok():
    from needle_cy.tokenizer import Tokenizer
    return Tokenizer.from_archive(str(fixture_path("needle3_tiny_a", "model.cact")))


def grammar_for(sentences, tools=(LIGHT, TIMER), max_calls=4):
    if compile_tools is not None:
        return compile_tools(list(tools), max_calls=max_calls)
    return FiniteGrammar(sentences)


def drive(tok, turns, query="turn on the kitchen light", sentences=(), settings=None, **model_kw):
    """Run one turn; returns (result, events, model, conversation)."""
    model = ScriptedModel(tok, turns, **model_kw)
    conv = Conversation(tok, None, render_tools_json([LIGHT, TIMER]))
    model.prefill(conv.prefix_ids)
    new_ids = conv.query_ids(query)
    gen = run_turn(model, tok, grammar_for(sentences), new_ids, settings or DecodeSettings(),
                   tok.piece_table(size=tok.vocab_size))
    events = []
    while True:
        try:
            events.append(next(gen))
        except StopIteration as stop:
            return stop.value, events, model, conv


def kinds(events):
    return [e["type"] for e in events]


def test_reasoning_shows_marker_spellings_the_model_wrote_as_text(tok):
    """The reasoning is decoded from the generated ids: think markers are dropped by id,
    a marker's spelling written as ordinary pieces (copied from a request) stays visible."""
    def spec(text):
        return tok.encode(text, dummy_prefix=False, allowed_special="all")

    script = (spec("<think>\n") + tok.encode("the page said <think> and </think>, ok", dummy_prefix=False)
              + [tok.marker_id("<think>")] + spec("\n</think>\n<tool_call>[]"))
    res, events, _, _ = drive(tok, [script])
    assert res.success and res.calls == []
    assert res.reasoning == "the page said <think> and </think>, ok"
    assert [e["content"] for e in events if e["type"] == "thinking_end"] == [res.reasoning]


def test_refusal_after_reasoning(tok):
    res, events, model, _ = drive(tok, ["<think>\nNo tool turns on a kettle.\n</think>\n"])
    assert res.calls == [] and res.stop_reason == "refusal" and res.success
    assert res.reasoning == "No tool turns on a kettle."
    assert kinds(events) == (["thinking_start"] + ["thinking_delta"] * (len(kinds(events)) - 2)
                             + ["thinking_end"])     # a refusal has no toolcall events
    assert "".join(e["delta"] for e in events if e["type"] == "thinking_delta").strip() == res.reasoning
    # The turn is closed in the model state: the refusal ends with <|im_end|>, nothing else.
    assert model.history[-1] == tok.marker_id("<|im_end|>")
    assert res.assistant_ids == model.history[-len(res.assistant_ids):]


def test_reasoning_cap_declines_and_closes_the_turn(tok):
    res, events, model, _ = drive(tok, ["<think>\n" + "and then " * 100],
                                  settings=DecodeSettings(reasoning_limit=12))
    assert res.stop_reason == "reasoning_limit" and res.calls == [] and res.success
    assert res.n_reasoning == 12
    assert tok.decode(model.history).endswith("</think>\n<tool_call>[]</tool_call><|im_end|>")
    assert kinds(events)[-1] == "thinking_end" and not any(k.startswith("toolcall") for k in kinds(events))


def test_max_new_tokens_in_reasoning_is_a_decline(tok):
    res, _, _, _ = drive(tok, ["<think>\n" + "and then " * 100],
                         settings=DecodeSettings(max_new_tokens=7, reasoning_limit=50))
    assert res.stop_reason == "max_new_tokens" and res.calls == [] and res.success


def test_multi_call_order_and_closing_tokens(tok):
    body = f"[{CALL_A},{CALL_B}]"
    res, events, model, _ = drive(tok, [f"<think>\nTwo things.\n</think>\n<tool_call>{body}</tool_call>"],
                                  sentences=[body])
    assert [c["name"] for c in res.calls] == ["set_light", "set_timer"]
    assert res.calls[0]["arguments"] == {"room": "kitchen", "on": True}
    assert res.raw_call_text == body
    # Per-call events: start, deltas, end (with the parsed call) for call 0, then call 1.
    calls = [e for e in events if e["type"].startswith("toolcall")]
    assert [(e["type"], e["index"]) for e in calls if e["type"] != "toolcall_delta"] == [
        ("toolcall_start", 0), ("toolcall_end", 0), ("toolcall_start", 1), ("toolcall_end", 1)]
    for i, text in enumerate((CALL_A, CALL_B)):
        assert "".join(e["delta"] for e in calls if e["type"] == "toolcall_delta" and e["index"] == i) == text
    assert [e["call"] for e in calls if e["type"] == "toolcall_end"] == res.calls
    first_end = kinds(events).index("toolcall_end")
    assert kinds(events)[first_end + 1] == "toolcall_start"     # call 0 is known before call 1 starts
    assert tok.decode(model.history).endswith(f"<tool_call>{body}</tool_call><|im_end|>")
    assert res.assistant_ids == model.history[-len(res.assistant_ids):]


def test_no_repeated_tool(tok):
    # The model tries to call set_light twice: the real grammar never lets a tool name repeat
    # within a turn, and exact repeats are dropped after decoding in any case.
    body = f"[{CALL_A},{CALL_A}]"
    res, _, _, _ = drive(tok, [f"<tool_call>{body}"], sentences=[body])
    assert res.success and res.calls[0] == json.loads(CALL_A)
    names = [c["name"] for c in res.calls]
    assert len(names) == len(set(names))


def test_grammar_overrides_the_model_and_confidence_sees_it(tok):
    # The script wants a room the schema does not have; the grammar must pick a valid one,
    # and the confidence must reflect the low model probability of the forced token.
    wanted = '[{"name":"set_light","arguments":{"room":"garage","on":true}}]'
    valid = '[{"name":"set_light","arguments":{"room":"kitchen","on":true}}]'
    res, _, _, _ = drive(tok, [f"<tool_call>{wanted}"], sentences=[valid])
    assert res.calls[0]["arguments"]["room"] in ("kitchen", "bedroom")
    p_peak = token_probability(np.r_[np.float32(12.0), np.zeros(tok.vocab_size - 1, np.float32)], 0)
    assert res.min_token_prob < 1e-3 < p_peak


def test_each_call_has_the_confidence_of_the_calls_up_to_it(tok):
    body = f"[{CALL_A},{CALL_B}]"
    script = f"<tool_call>{body}"
    # a doubt inside the second call's name: the first call keeps its own confidence
    ids, k = token_at_byte(tok, script, script.index("set_timer"))
    over = {(0, k): {(ids[k] + 1) % tok.vocab_size: 12.5}}
    res, _, _, _ = drive(tok, [script], sentences=[body], overrides=over, confidence_logit=4.0)
    assert [c["name"] for c in res.calls] == ["set_light", "set_timer"]
    first, second = res.call_confidences
    assert second == pytest.approx(res.confidence) and second < 0.5 < first
    assert first == pytest.approx(min(sigmoid(4.0), first))
    # a doubt in the first call is every call's (the values are non-increasing)
    ids, k = token_at_byte(tok, script, script.index("kitchen"))
    over = {(0, k): {(ids[k] + 1) % tok.vocab_size: 12.5}}
    res, _, _, _ = drive(tok, [script], sentences=[body], overrides=over, confidence_logit=4.0)
    assert res.call_confidences[0] == pytest.approx(res.call_confidences[1])
    assert res.call_confidences[0] < 0.5


def test_confidence_arithmetic(tok):
    body = f"[{CALL_B}]"
    script = f"<tool_call>{body}"
    ids = tok.encode(script, dummy_prefix=False, allowed_special="all")
    V = tok.vocab_size
    p_peak = math.exp(12.0) / (math.exp(12.0) + V - 1)
    # Make the 4th call token less certain: a rival at logit 11 (not allowed by the grammar
    # or not, the chosen token's full-softmax probability is what counts).
    k = 4
    rival = (ids[k] + 1) % V
    over = {(0, k): {rival: 11.0}}
    # The closed form on a plain vector, then the same on the fake's exact logits (its
    # off-script prior puts escape pieces at -1).
    plain = np.zeros(V, np.float32)
    plain[ids[k]], plain[rival] = 12.0, 11.0
    assert token_probability(plain, ids[k]) == pytest.approx(
        math.exp(12.0) / (math.exp(12.0) + math.exp(11.0) + V - 2), rel=1e-9)
    logits = ScriptedModel(tok, []).prior.copy()
    logits[ids[k]], logits[rival] = 12.0, 11.0
    p_low = token_probability(logits, ids[k])
    res, _, _, _ = drive(tok, [script], sentences=[body], overrides=over)
    assert res.head_confidence is None
    assert res.min_token_prob == pytest.approx(p_low, rel=1e-5)
    assert res.confidence == pytest.approx(p_low, rel=1e-5)
    # With a confidence head: min(sigmoid(head), min token prob).
    res, _, _, _ = drive(tok, [script], sentences=[body], overrides=over, confidence_logit=-1.0)
    assert res.head_confidence == pytest.approx(sigmoid(-1.0))
    assert res.confidence == pytest.approx(min(sigmoid(-1.0), p_low), rel=1e-6)
    res, _, _, _ = drive(tok, [script], sentences=[body], overrides=over, confidence_logit=4.0)
    assert res.confidence == pytest.approx(p_low, rel=1e-5)
    assert p_low < p_peak
    # A refusal has no call tokens: the head alone, or None without a head.
    res, _, _, _ = drive(tok, [""], confidence_logit=0.5)
    assert res.confidence == pytest.approx(sigmoid(0.5))
    res, _, _, _ = drive(tok, [""])
    assert res.confidence is None


def test_max_new_tokens_inside_the_call_is_an_error(tok):
    body = f"[{CALL_A},{CALL_B}]"
    res, events, _, _ = drive(tok, [f"<tool_call>{body}"], sentences=[body],
                              settings=DecodeSettings(max_new_tokens=10))
    assert not res.success and res.error_code == "max_new_tokens"
    assert "toolcall_end" not in kinds(events)


def test_unconstrained_decoding_parses_and_reports_invalid_output(tok):
    body = f"[{CALL_B}]"
    res, _, _, _ = drive(tok, [f"<tool_call>{body}</tool_call>"], sentences=[body],
                         settings=DecodeSettings(constrained=False))
    assert res.success and res.calls == [json.loads(CALL_B)]
    bad = '[{"name":"set_timer","arguments":{"minutes":"soon"}}]'
    res, _, _, _ = drive(tok, [f"<tool_call>{bad}</tool_call>"], sentences=[body],
                         settings=DecodeSettings(constrained=False))
    assert not res.success and res.error_code == "invalid_output"
    assert "not a valid call" in res.error


def test_context_overflow_is_a_clear_error(tok):
    from needle_cy.errors import ContextOverflowError
    with pytest.raises(ContextOverflowError, match="context is 100 tokens"):
        drive(tok, [""], max_seq_len=100)


@pytest.mark.skipif(compile_tools is None, reason="needle_cy.grammar not landed yet")
def test_max_calls_per_turn_is_enforced_by_the_grammar(tok):
    fan = {"name": "set_fan", "description": "Fan speed.", "parameters": {
        "type": "object", "properties": {"speed": {"type": "integer", "minimum": 0, "maximum": 3}},
        "required": ["speed"], "additionalProperties": False}}
    calls = ",".join([CALL_A, CALL_B, '{"name":"set_fan","arguments":{"speed":2}}'])
    for max_calls, expected in ((2, ["set_light", "set_timer"]), (3, ["set_light", "set_timer", "set_fan"])):
        model = ScriptedModel(tok, [f"<tool_call>[{calls}]"])
        conv = Conversation(tok, None, render_tools_json([LIGHT, TIMER, fan]))
        model.prefill(conv.prefix_ids)
        gen = run_turn(model, tok, compile_tools([LIGHT, TIMER, fan], max_calls=max_calls),
                       conv.query_ids("x"), DecodeSettings(), tok.piece_table(size=tok.vocab_size))
        try:
            while True:
                next(gen)
        except StopIteration as stop:
            res = stop.value
        assert [c["name"] for c in res.calls] == expected


@pytest.mark.skipif(compile_tools is None, reason="needle_cy.grammar not landed yet")
def test_string_token_cap_closes_a_runaway_string(tok):
    runaway = '[{"name":"set_timer","arguments":{"minutes":3,"label":"' + "la " * 200
    res, _, _, _ = drive(tok, [f"<tool_call>{runaway}"], settings=DecodeSettings(string_token_cap=6))
    assert res.success
    label = res.calls[0]["arguments"]["label"]
    assert 0 < len(label) <= 40


def test_call_splitter_respects_strings_and_escapes():
    text = '[{"name":"a","arguments":{"s":"}{\\"]","n":[1,{"x":2}]}},{"name":"b","arguments":{}}]'
    sp = CallSplitter()
    events = []
    for i in range(0, len(text), 3):            # arbitrary chunking
        events += sp.feed(text[i:i + 3].encode())
    ends = [e["call"] for e in events if e["type"] == "toolcall_end"]
    assert ends == json.loads(text)
    joined = ["".join(e["delta"] for e in events if e["type"] == "toolcall_delta" and e["index"] == i)
              for i in range(2)]
    assert "[" + ",".join(joined) + "]" == text


def test_grammar_dead_end_is_recovered_by_taking_tokens_back(tok):
    # A buggy grammar lets the model walk into "[{\"name\":\"set_t" + "imer_x" which completes
    # nothing; the decoder must take tokens back and finish a valid call, and the model's
    # state must hold exactly the kept tokens (restore + replay).
    good = f"[{CALL_B}]"
    trap = '[{"name":"set_timer_extra'
    model = ScriptedModel(tok, [f"<tool_call>{trap}"])
    conv = Conversation(tok, None, render_tools_json([LIGHT, TIMER]))
    model.prefill(conv.prefix_ids)
    gen = run_turn(model, tok, FiniteGrammar([good], traps=[trap]), conv.query_ids("timer"),
                   DecodeSettings(), tok.piece_table(size=tok.vocab_size))
    events = []
    try:
        while True:
            events.append(next(gen))
    except StopIteration as stop:
        res = stop.value
    assert res.success and res.calls == [json.loads(CALL_B)] and res.n_backtracks >= 1
    rewinds = [e for e in events if e["type"] == "toolcall_rewind"]
    assert rewinds and rewinds[0]["index"] == 0
    assert not rewinds[0]["text"].endswith("_")
    # Replaying deltas with rewinds gives exactly the final call text.
    text = ""
    for e in events:
        if e["type"] == "toolcall_delta":
            text += e["delta"]
        elif e["type"] == "toolcall_rewind":
            text = e["text"]
    assert text == CALL_B
    assert tok.decode(model.history).endswith(f"<tool_call>{good}</tool_call><|im_end|>")
    assert res.assistant_ids == model.history[-len(res.assistant_ids):]


def test_turn_near_the_context_end_closes_within_it(tok):
    conv = Conversation(tok, None, render_tools_json([LIGHT, TIMER]))
    n_prompt = len(conv.prefix_ids) + len(conv.query_ids("turn on the kitchen light"))
    limit = n_prompt + 30
    res, _, model, _ = drive(tok, ["<think>\n" + "and then " * 100], max_seq_len=limit)
    assert res.stop_reason == "max_new_tokens" and res.success
    assert len(model.history) <= limit
    assert tok.decode(model.history).endswith("</think>\n<tool_call>[]</tool_call><|im_end|>")
