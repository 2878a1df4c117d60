"""``name_prior``: the BM25 ranker's prior over the tools re-weights the tokens that write a
tool's name, in the call block and at the start of a ``<think>`` note line (a product of
experts).  Exact tests with scripted logits (tests/scripted_support.py, the tiny_a
fixture's tokenizer), then the embedded model on its smart-home catalogue."""
import json
import math

import numpy as np
import pytest

from conftest import fixture_path
from needle_cy import Needle, home_tools
from needle_cy.generate import DecodeSettings, _choose, run_turn
from needle_cy.grammar import compile_tools
from needle_cy.grounding import GroundingIndex
from needle_cy.name_prior import NamePrior
from needle_cy.prompt import Conversation, render_tools_json
from needle_cy.retrieval import clause_picks, name_prior
from needle_cy.toolspec import normalize_tools
from scripted_support import LIGHT_TOOL as LIGHT, ScriptedModel

TIMER = {"name": "set_timer", "description": "Start a timer.",
         "parameters": {"type": "object", "properties": {
             "minutes": {"type": "integer", "minimum": 1, "maximum": 600}},
             "required": ["minutes"], "additionalProperties": False}}
CALL_A = '{"name":"set_light","arguments":{"room":"kitchen","on":true}}'


@pytest.fixture(scope="module")
def tok():
    from needle_cy.tokenizer import Tokenizer
    return Tokenizer.from_archive(str(fixture_path("needle3_tiny_a", "model.cact")))


def drive(tok, script, prior=None, notes=True):
    """One scripted turn over LIGHT and TIMER with the prior ``{name: weight}`` (None: off)."""
    pieces = tok.piece_table(size=tok.vocab_size)
    model = ScriptedModel(tok, [script])
    conv = Conversation(tok, None, render_tools_json([LIGHT, TIMER]))
    model.prefill(conv.prefix_ids)
    np_ = None
    if prior is not None:
        np_ = NamePrior(prior, 1.0, index=GroundingIndex(pieces), notes=notes)
    gen = run_turn(model, tok, compile_tools([LIGHT, TIMER]), conv.query_ids("turn on the kitchen light"),
                   DecodeSettings(), pieces, name_prior=np_)
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            return stop.value


# ------------------------------------------------------------------ the prior itself

def test_the_prior_favours_the_best_tool_of_each_intent_in_the_request_order():
    specs = normalize_tools(home_tools())
    names = [s.name for s in specs]

    def top(probs):
        return names[int(np.argmax(probs))]

    rows = name_prior("lock the front door", specs)
    assert [(pick, top(p)) for pick, p in rows] == [(names.index("lock_door"), "lock_door"), (None, "lock_door")]
    assert all(math.isclose(sum(p), 1.0) for _, p in rows)
    request = "close the garage door, lock the back door and start the vacuum"
    rows = name_prior(request, specs)
    assert [names[pick] for pick, _ in rows[:-1]] == ["operate_garage", "lock_door", "start_vacuum"]
    assert [top(p) for _, p in rows[:-1]] == ["operate_garage", "lock_door", "start_vacuum"]
    last = rows[-1][1]          # any further call: every clause's best tool is as welcome
    assert {names[i] for i in np.argsort(last)[-3:]} == {names[i] for i in clause_picks(request, specs)}
    assert name_prior("zzqx blorp", specs) is None      # no evidence: no prior
    sharper = name_prior("lock the front door", specs, temperature=0.05)
    assert max(sharper[0][1]) > max(name_prior("lock the front door", specs)[0][1])
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="temperature"):
            name_prior("lock the front door", specs, temperature=bad)


def test_the_token_terms_add_up_to_the_prior_of_the_name_whatever_the_tokenization():
    prior = NamePrior({"set_light": 0.2, "set_timer": 0.7, "lock_door": 0.1}, 1.0)
    for cuts in ([b'[{"name":"', b"set_", b"light", b'","arguments":{}}]'],
                 [b"[", b'{"name":"s', b"e", b"t_li", b'ght"', b',"arguments":{}}]'],
                 [b'[{"name":"set_light","arguments":{}}]']):
        state, total = prior.state, 0.0
        for piece in cuts:
            state, ratio = prior._walk(state, piece)
            total += ratio
        assert math.isclose(total, math.log(0.2)), cuts
    # the second call's masses leave out the tool already called (the grammar allows
    # each tool once per turn), and bytes inside the arguments are not a name
    # each call takes the first row whose tool no earlier call named
    rows = NamePrior([("a", {"a": 0.9, "b": 0.1}), ("b", {"a": 0.2, "b": 0.8}), (None, {"a": 0.5, "b": 0.5})], 1.0)
    assert math.isclose(rows._walk(rows.state, b'[{"name":"a","arguments":{}},{"name":"b"')[1],
                        math.log(0.9) + math.log(0.8 / 0.8))
    assert math.isclose(rows._walk(rows.state, b'[{"name":"b","arguments":{}},{"name":"a"')[1],
                        math.log(0.1) + math.log(0.9 / 0.9))
    state, _ = prior._walk(prior.state, b'[{"name":"set_timer","arguments":{"name":"x{"}},')
    state, ratio = prior._walk(state, b'{"name":"set_light"')
    assert math.isclose(ratio, math.log(0.2 / 0.3))
    assert math.isclose(prior._walk(prior.state, b'[{"name":"set_timer","arguments":{"a":"}')[1],
                        math.log(0.7))


def test_bad_values_raise_a_clear_value_error():
    for bad in (0, -0.5, float("nan"), float("inf"), True, "1"):
        with pytest.raises(ValueError, match="name_prior"):
            Needle(tools=home_tools(), name_prior=bad)
        with pytest.raises(ValueError, match="strength"):
            NamePrior({"a": 1.0}, bad)
    with pytest.raises(ValueError, match="weight"):
        NamePrior({"a": -1.0}, 1.0)


# ------------------------------------------------------------------ decoding, scripted

def test_a_strong_prior_turns_the_call_to_the_tool_it_favours(tok):
    script = f"<tool_call>[{CALL_A}]"
    assert [c["name"] for c in drive(tok, script).calls] == ["set_light"]
    res = drive(tok, script, {"set_light": 1e-9, "set_timer": 1.0})
    assert res.calls[0]["name"] == "set_timer"      # (the script, now off its track, may add a call)
    # the confidence reads the model's own distribution: the overruled name is doubted
    assert res.min_token_prob < 1e-3
    # a prior that agrees with the model changes nothing
    same = drive(tok, script, {"set_light": 1.0, "set_timer": 1e-9})
    assert same.raw_call_text == drive(tok, script).raw_call_text


def test_in_the_notes_the_line_names_the_tool_the_prior_favours(tok):
    script = f'<think>\nset_light: room = "kitchen"\n</think>\n<tool_call>[{CALL_A}]'
    res = drive(tok, script, {"set_light": 1e-9, "set_timer": 1.0})
    assert res.reasoning.startswith("set_timer:")
    assert res.calls[0]["name"] == "set_timer"
    # notes=False leaves the notes alone and re-weights only the call
    calls_only = drive(tok, script, {"set_light": 1e-9, "set_timer": 1.0}, notes=False)
    assert calls_only.reasoning.startswith("set_light:")
    assert calls_only.calls[0]["name"] == "set_timer"
    # a note line the model does not begin with a tool name is its own business
    free = f"<think>\nTurn it on.\n</think>\n<tool_call>[{CALL_A}]"
    assert drive(tok, free, {"set_light": 1e-9, "set_timer": 1.0}).reasoning == "Turn it on."


def test_the_prior_never_leaves_the_grammar(tok):
    """Random logits, a prior on a name the grammar does not have, a huge weight: every
    step still takes a token the grammar allows, and the turn is a valid call list."""
    pieces = tok.piece_table(size=tok.vocab_size)
    grammar = compile_tools([LIGHT, TIMER])
    rng = np.random.default_rng(7)
    for trial in range(6):
        prior = NamePrior({"set_lamp": 1.0, "set_light": 1e-12, "set_timer": 1e-6}, 1e6)
        state, written = grammar.start(), b""
        for _ in range(200):
            logits = rng.normal(0, 3, tok.vocab_size).astype(np.float32)
            token, new_state, row = _choose(grammar, state, logits, pieces, False, None, prior)
            assert token >= 0 and row is logits
            assert grammar.allowed_tokens(state, pieces)[token]
            written += pieces[token]
            prior.feed(pieces[token])
            state = new_state
            if state.is_complete():
                break
        calls = json.loads(written)
        assert all(c["name"] in ("set_light", "set_timer") for c in calls), written


# ------------------------------------------------------------------ the embedded model

REQUEST = "turn on the kitchen light"


def _skewed_catalogue():
    """The home catalogue, with send_notification's description made to match the
    request's words, so that BM25 puts it first (and set_light second)."""
    tools = json.loads(json.dumps(home_tools()))
    for t in tools:
        if t["name"] == "send_notification":
            t["description"] += " Turn on the kitchen light turn on kitchen light."
    return tools


@pytest.fixture(scope="module")
def skewed():
    tools = _skewed_catalogue()
    return (Needle(tools=tools, threads=1, escalate_below=None),
            Needle(tools=tools, threads=1, escalate_below=None, name_prior=20.0))


def test_with_the_embedded_model_a_favoured_tool_wins_where_the_model_chose_another(skewed):
    off, on = skewed
    specs = normalize_tools(_skewed_catalogue())
    (pick, probs), _ = name_prior(REQUEST, specs, expansion=off.query_expansion)
    assert specs[pick].name == "send_notification" and max(probs) > 0.5
    off.reset()
    on.reset()
    assert [c["name"] for c in off.complete(REQUEST)["function_calls"]] == ["set_light"]
    assert [c["name"] for c in on.complete(REQUEST)["function_calls"]] == ["send_notification"]


def test_off_is_the_agent_without_the_option():
    plain = Needle(tools=home_tools(), threads=1)
    off = Needle(tools=home_tools(), threads=1, name_prior=None)
    for request in ("lock the front door", "dim the kitchen to 30 and start the vacuum"):
        plain.reset()
        off.reset()
        a, b = plain.complete(request), off.complete(request)
        assert (a["function_calls"], a["reasoning"], a["confidence"]) == \
               (b["function_calls"], b["reasoning"], b["confidence"])


def test_a_request_sharing_no_word_with_any_tool_decodes_as_with_the_prior_off():
    plain = Needle(tools=home_tools(), threads=1)
    on = Needle(tools=home_tools(), threads=1, name_prior=4.0)
    assert on._name_prior("zzqx blorp", on.specs) is None
    plain.reset()
    on.reset()
    a, b = plain.complete("zzqx blorp"), on.complete("zzqx blorp")
    assert (a["function_calls"], a["reasoning"]) == (b["function_calls"], b["reasoning"])
