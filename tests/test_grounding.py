"""Value grounding (needle_cy.grounding): string arguments come from what was said.

Unit rules on the byte scanner, the fast proposal set checked against the exact per-token
test over the whole vocabulary, and whole turns with scripted logits (grounded vs not)."""
import json
import random

import pytest

from conftest import fixture_path
from needle_cy.generate import DecodeSettings, run_turn
from needle_cy.grounding import (GroundingIndex, NoteGrounder, ValueGrounder, mentioned_members, says_number,
                                 unsaid_number_keys, value_rule)
from needle_cy.prompt import Conversation, render_tools_json
from scripted_support import ScriptedModel

ROOMS = ["living room", "kitchen", "bedroom", "kids room"]
TOOLS = {
    "set_light": {"type": "object", "properties": {
        "room": {"type": "string", "enum": ROOMS}, "on": {"type": "boolean"}},
        "required": ["room", "on"], "additionalProperties": False},
    "set_timer": {"type": "object", "properties": {
        "minutes": {"type": "integer", "minimum": 1, "maximum": 600},
        "label": {"type": "string", "maxLength": 40}}, "required": ["minutes"],
        "additionalProperties": False},
    "vacuum": {"type": "object", "properties": {
        "rooms": {"type": "array", "items": {"type": "string", "enum": ROOMS}, "uniqueItems": True}},
        "additionalProperties": False},
    "unlock": {"type": "object", "properties": {
        "code": {"type": "string", "pattern": "^[0-9]{4}$"}}, "required": ["code"],
        "additionalProperties": False},
    "order": {"type": "object", "properties": {
        "dish": {"type": "string", "enum": ["soup", "salad"]},
        "count": {"type": "integer", "minimum": 1}},
        "required": ["dish"], "additionalProperties": False},
}


@pytest.fixture(scope="module")
def tok():
    from needle_cy.tokenizer import Tokenizer
    return Tokenizer.from_archive(str(fixture_path("needle3_tiny_a", "model.cact")))


@pytest.fixture(scope="module")
def index(tok):
    return GroundingIndex(tok.piece_table(size=tok.vocab_size))


def grounder(index, said, tools=TOOLS):
    return ValueGrounder(tools, said if isinstance(said, list) else [said], index)


def at(index, said, prefix):
    g = grounder(index, said)
    g.feed(prefix.encode())
    return g


LABEL = '[{"name":"set_timer","arguments":{"minutes":5,"label":"'
ROOM = '[{"name":"set_light","arguments":{"room":"'


# ------------------------------------------------------------------ rules
def test_value_rule_by_schema():
    said = "turn on the kitchen light on saturday"
    assert value_rule({"type": "string"}, said) == ("copy",)
    # a pattern string is copied only when a span of what was said fits the pattern
    assert value_rule({"type": "string", "pattern": "^[0-9]+$"}, said, [said]) is None
    assert value_rule({"type": "string", "pattern": "^[0-9]+$"}, said, ["code 4471 please"]) == ("copy",)
    # a time's pattern: one of the times said, as the pattern writes them (spoken_time)
    assert value_rule({"type": "string", "pattern": "^[0-9]{2}:[0-9]{2}$"}, said,
                      ["wake me at 5:15 pm"]) == ("enum", [b"17:15"])
    assert value_rule({"type": "string", "pattern": "^[0-9]{2}:[0-9]{2}$"}, said,
                      ["alarm for quarter to eight"]) == ("enum", [b"07:45", b"19:45"])
    assert value_rule({"type": "string", "pattern": "^[0-9]{2}:[0-9]{2}$"}, said,
                      ["wake me in twenty minutes"]) is None      # no time of day said
    assert value_rule({"type": "string", "pattern": "("}, said, ["a (b"]) is None   # invalid
    assert value_rule({"type": ["string", "null"]}, said) == ("copy",)
    assert value_rule({"type": "string", "format": "date"}, said) is None
    assert value_rule({"const": "x"}, said) is None
    assert value_rule({"anyOf": [{"type": "string"}]}, said) is None
    assert value_rule({"type": "integer"}, said) is None
    assert value_rule({"enum": ROOMS}, said) == ("enum", [b"kitchen"])
    assert value_rule({"enum": ["bathroom"]}, said) is None          # nothing mentioned
    assert value_rule({"enum": ["a", 1]}, said) is None              # not all strings


def test_day_group_words_mention_their_days():
    days = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
    assert mentioned_members(days, "at 6:30 on weekdays") == days[:5]
    assert mentioned_members(days, "every weekend") == days[5:]
    assert mentioned_members(days, "daily at 7") == days
    assert mentioned_members(["Monday", "Saturday"], "on week days") == ["Monday"]
    assert mentioned_members(["montage", "satin"], "on weekdays and weekends") == []   # not days


def test_mentions_start_at_a_word_and_ignore_case():
    assert mentioned_members(["sat", "sun", "mon"], "on saturday and sunday") == ["sat", "sun"]
    assert mentioned_members(["room"], "the bedroom") == []           # not at a word start
    assert mentioned_members(["Living Room"], "the living room lights") == ["Living Room"]
    assert mentioned_members(["eco"], "put it on eco.") == ["eco"]


def test_free_string_is_a_word_bounded_span(index):
    said = "start a timer for the roast please"
    g = at(index, said, LABEL)
    assert g.constrained
    assert g.accepts(b'roast"')
    assert g.accepts(b'the roast"')
    assert g.accepts(b'ro')                      # a word in progress
    assert not g.accepts(b'oast')                # does not begin at a word start
    assert not g.accepts(b'roa"')                # does not end at a word end
    assert not g.accepts(b'lasagne"')            # never said
    assert not g.accepts(b' roast')              # spans begin at a word, not a space
    g = at(index, "play Fleetwood Mac.", LABEL)
    assert g.accepts(b'Fleetwood Mac"') and not g.accepts(b'Fleetwood Mac."')   # no full stop
    assert at(index, said, LABEL + "roast").accepts(b'"}}]')


def test_sources_are_compared_in_json_escaping(index):
    said = 'label it the "blue" one'
    g = at(index, said, LABEL)
    assert g.accepts(b'the \\"blue\\" one"')     # an inner quote is copied escaped
    assert g.accepts(b'blue"')
    assert not g.accepts(b'\\"blue')                # spans begin at a word, not a quote
    assert at(index, ["first turn words", "the second turn"], LABEL).accepts(b'first turn"')


def test_enum_value_is_a_mentioned_member(index):
    g = at(index, "Turn on the KITCHEN light", ROOM)
    assert g.accepts(b'kitchen"')
    assert not g.accepts(b'bedroom"')
    assert not g.accepts(b'kit"')
    # Nothing mentioned: grounding has no opinion.
    g = at(index, "lights on please", ROOM)
    assert not g.constrained and g.accepts(b'bedroom"')


def test_unique_enum_array_stops_when_the_mentioned_members_are_used(index):
    said = "vacuum the kitchen and the bedroom"
    prefix = '[{"name":"vacuum","arguments":{"rooms":["kitchen"'
    g = at(index, said, prefix)
    assert g.accepts(b',')
    g2 = at(index, said, prefix + ',"bedroom"')
    assert not g2.accepts(b',')                   # both said rooms are written
    assert g2.accepts(b']}}]')
    assert not at(index, said, prefix + ',').accepts(b'"kitchen"')   # no repeat


def test_keys_names_and_other_tools_are_not_grounded(index):
    g = at(index, "zzz", '[{"name":"')
    assert g.accepts(b'set_light"')               # the tool name is the grammar's business
    g = at(index, "zzz", '[{"name":"set_timer","arguments":{"')
    assert g.accepts(b'label"')                   # keys too
    g = at(index, "zzz", '[{"name":"mystery","arguments":{"x":"')
    assert g.accepts(b'anything"')                # a tool grounding does not know


def test_says_number_in_digits_or_words():
    assert says_number("add 2 apples") and says_number("a dozen eggs") and says_number("full brightness")
    assert says_number("twenty minutes") and says_number("quarter to eight")
    assert not says_number("add butter to the list") and not says_number("someone gone often")


def test_unsaid_number_keys_are_the_optional_plain_numbers():
    assert unsaid_number_keys(TOOLS["order"], number_said=False) == {b"count"}
    sized = {"type": "object", "properties": {"size": {"type": "number", "enum": [1, 2]},
                                              "n": {"type": ["integer", "null"]}}}
    assert unsaid_number_keys(sized, number_said=False) == frozenset()   # a named choice; nullable
    assert unsaid_number_keys(TOOLS["order"], number_said=True) == frozenset()
    assert unsaid_number_keys(TOOLS["set_timer"], number_said=False) == frozenset()  # minutes required


def test_optional_number_needs_a_said_number(index):
    prefix = '[{"name":"order","arguments":{"dish":"soup"'
    g = at(index, "order the soup", prefix)
    assert not g.accepts(b',"count":3}}]')
    assert not g.accepts(b',')                    # only refused keys could follow the comma
    assert g.refuses_key(b',') and not g.refuses_key(b'}}]')
    assert g.accepts(b'}}]')
    g = at(index, "order the soup", '[{"name":"order","arguments":{"')
    assert not g.accepts(b'count"') and not g.accepts(b'co') and g.accepts(b'dish"')
    noted = dict(TOOLS["order"], properties=dict(TOOLS["order"]["properties"], note={"type": "string"}))
    g = grounder(index, "order the soup", dict(TOOLS, order=noted))
    g.feed(prefix.encode())
    assert g.accepts(b',') and g.accepts(b',"note"') and not g.accepts(b',"count"')
    said = at(index, "order two soups", prefix)
    assert said.accepts(b',"count":2}}]')


def order_turn(tok, index, count, query, ground=True):
    """The calls of a turn whose script orders soup with ``count``."""
    order = {"name": "order", "description": "Order food.", "parameters": TOOLS["order"]}
    script = '<tool_call>[{"name":"order","arguments":{"dish":"soup","count":%d}}]' % count
    return turn(tok, index, script, query, ground=ground, tools=(order,)).calls


def soup(**arguments):
    return [{"name": "order", "arguments": dict(dish="soup", **arguments)}]


def test_turn_grounds_an_optional_number(tok, index):
    assert order_turn(tok, index, 3, "order the soup", ground=False) == soup(count=3)
    assert order_turn(tok, index, 3, "order the soup") == soup()       # nothing counted: the tool's
    assert order_turn(tok, index, 3, "order soup for 3 people") == soup(count=3)
    assert order_turn(tok, index, 5, "order two soups", ground=False) == soup(count=5)
    assert order_turn(tok, index, 5, "order two soups") == soup(count=2)   # the number said
    assert order_turn(tok, index, 5, "order soup for 5 of us") == soup(count=5)


def test_said_number_values_fit_the_schema():
    from needle_cy.grounding import said_number_values
    level = {"type": "integer", "minimum": 0, "maximum": 100}
    assert said_number_values(level, "bathroom lights to full brightness") == (b"100",)
    assert said_number_values(level, "open the blinds halfway") == (b"50",)
    assert said_number_values(level, "lights at 80 percent and a 50 minute timer") == (b"80", b"50")
    assert said_number_values(level, "twenty-five percent") == (b"25", b"20", b"5")
    assert said_number_values(level, "set it to 150") == ()               # out of range
    assert said_number_values(level, "set it to 2.5") == ()               # not an integer
    assert said_number_values({"type": "number"}, "set it to 2.5") == (b"2.5",)
    assert said_number_values({"type": "integer"}, "full please") == ()   # no bound to name


def test_a_duration_in_a_unit_is_a_said_duration(index):
    from needle_cy.grounding import said_duration_values
    minutes = {"type": "integer", "minimum": 1, "maximum": 600}
    assert said_duration_values("minutes", minutes, ["three quarters of an hour"]) == (b"45",)
    assert said_duration_values("duration_seconds", {"type": "number"}, ["half an hour"]) == (b"1800",)
    assert said_duration_values("hours", {"type": "number"}, ["90 minutes"]) == (b"1.5",)
    assert said_duration_values("minutes", minutes, ["a 2 second beep"]) == ()    # not whole
    assert said_duration_values("count", minutes, ["half an hour"]) == ()         # no unit
    assert said_duration_values("minutes", minutes, ["timer for 5"]) == ()        # no duration
    # required or not, a minutes argument takes the duration said, not the model's sum
    g = at(index, "a timer for 3 hours and forty-five minutes", '[{"name":"set_timer","arguments":{"minutes":')
    assert g.accepts(b"225,") and not g.accepts(b"210,") and not g.accepts(b"3,")


def test_optional_number_is_a_said_number(index):
    prefix = '[{"name":"order","arguments":{"dish":"soup","count":'
    g = at(index, "order two soups", prefix)
    assert g.accepts(b"2}}]") and g.accepts(b"2")
    assert not g.accepts(b"3}}]") and not g.accepts(b"22") and not g.accepts(b"20")
    g = at(index, "order soup for 12 people", prefix)
    assert g.accepts(b"1") and g.accepts(b"12}}]") and not g.accepts(b"1}}]")
    # the numbers said but out of the schema's range leave the value to the model
    g = at(index, "order soup, table 0", prefix)
    assert g.accepts(b"7}}]")


def test_state_follows_tokens_that_break_the_rules(index):
    # A fallback token (taken when nothing grounded fits) is tracked like any other.
    g = at(index, "roast", LABEL)
    assert g.feed(b'zzz"') is False
    assert g.feed(b'}},{"name":"set_light","arguments":{"room":"') is True
    assert g.constrained and g.rule is None or not g.constrained


def test_proposals_match_the_exact_check_over_the_vocabulary(tok, index):
    """candidates() (a dictionary lookup per source position) proposes exactly the tokens
    without backslashes that accepts() (the byte-by-byte check) takes, at random points."""
    rng = random.Random(5)
    pieces = tok.piece_table(size=tok.vocab_size)
    saids = ["Play Fleetwood Mac in the kitchen", "add two cartons of oat milk, please",
             "tell the kids: dinner's ready!", "set a timer for the roast"]
    checked = 0
    for said in saids:
        for depth in range(4):
            words = said.split()
            start = rng.randrange(len(words))
            value = " ".join(words[start:])[:rng.randrange(0, 12)] if depth else ""
            g = at(index, said, LABEL + value)
            cand = g.candidates()
            if not g.constrained or cand is None:
                continue
            exact = {t for t, p in enumerate(pieces) if p and b"\\" not in p and g.accepts(p)}
            assert {t for t in cand if g.accepts(pieces[t])} == exact, (said, value)
            checked += 1
    for said, prefix in (("vacuum the kitchen and the kids room", '[{"name":"vacuum","arguments":{"rooms":["'),
                         ("kids room light on", ROOM + "ki")):
        g = at(index, said, prefix)
        exact = {t for t, p in enumerate(pieces) if p and b"\\" not in p and g.accepts(p)}
        assert {t for t in g.candidates() if g.accepts(pieces[t])} == exact
        assert exact
        checked += 1
    # A number: every proposal is accepted, and every accepted token that goes on with a
    # digit or ends the number with , } ] is proposed (whitespace the grammar decides).
    prefix = '[{"name":"order","arguments":{"dish":"soup","count":'
    for said, value in (("order 12 or 150 soups for 2", ""), ("order 12 soups", "1"),
                        ("order 12 or 2 soups", "1"), ("order 2 soups", "2")):
        g = at(index, said, prefix + value)
        cand = g.candidates()
        assert all(g.accepts(pieces[t]) for t in cand)
        lead = b"0123456789,}]" if value else b"0123456789"     # (no value yet: the grammar's)
        exact = {t for t, p in enumerate(pieces) if p and p[:1] in lead and g.accepts(p)}
        assert exact and exact <= cand
        checked += 1
    assert checked >= 12


# ------------------------------------------------------------------ whole turns
LIGHT = {"name": "set_light", "description": "Lights.", "parameters": TOOLS["set_light"]}
TIMER = {"name": "set_timer", "description": "Timer.", "parameters": TOOLS["set_timer"]}


def turn(tok, index, script, query, ground=True, tools=(LIGHT, TIMER), ground_notes=False, **kw):
    from needle_cy.grammar import compile_tools
    model = ScriptedModel(tok, [script], **kw)
    conv = Conversation(tok, None, render_tools_json(list(tools)))
    model.prefill(conv.prefix_ids)
    schemas = {t["name"]: t["parameters"] for t in tools}
    gen = run_turn(model, tok, compile_tools(list(tools)), conv.query_ids(query),
                   DecodeSettings(ground_values=ground, ground_notes=ground_notes),
                   tok.piece_table(size=tok.vocab_size),
                   grounder=ValueGrounder(schemas, [query], index),
                   note_grounder=NoteGrounder(schemas, [query], index))
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            return stop.value


def test_turn_copies_a_said_label_instead_of_an_invented_one(tok, index):
    query = "start a timer for the roast"
    script = '<tool_call>[{"name":"set_timer","arguments":{"minutes":5,"label":"zebra crossing"}}]'
    free = turn(tok, index, script, query, ground=False)
    assert free.calls[0]["arguments"]["label"] == "zebra crossing"
    grounded = turn(tok, index, script, query)
    label = grounded.calls[0]["arguments"]["label"]
    words = query.split()
    spans = {" ".join(words[i:j]) for i in range(len(words)) for j in range(i + 1, len(words) + 1)}
    assert label in spans
    assert grounded.calls[0]["arguments"]["minutes"] == 5


def test_turn_keeps_a_label_the_model_copies(tok, index):
    query = "start a timer for the roast"
    script = '<tool_call>[{"name":"set_timer","arguments":{"minutes":5,"label":"roast"}}]'
    res = turn(tok, index, script, query)
    assert res.calls == [{"name": "set_timer", "arguments": {"minutes": 5, "label": "roast"}}]


def test_turn_picks_the_mentioned_room(tok, index):
    script = '<tool_call>[{"name":"set_light","arguments":{"room":"bedroom","on":true}}]'
    assert turn(tok, index, script, "kitchen lights on", ground=False).calls[0]["arguments"]["room"] == "bedroom"
    assert turn(tok, index, script, "kitchen lights on").calls[0]["arguments"]["room"] == "kitchen"
    # Not mentioned: the model's choice stands.
    assert turn(tok, index, script, "lights on").calls[0]["arguments"]["room"] == "bedroom"


def test_turn_falls_back_to_the_grammar_when_nothing_said_fits(tok, index):
    # Every word of the request is longer than maxLength 3: no grounded value exists.  The
    # copy goes as far as the schema lets it, then the grammar alone closes the string, so
    # the turn never strands and the call stays schema-valid.
    short = {"name": "note", "description": "Note.", "parameters": {
        "type": "object", "properties": {"text": {"type": "string", "maxLength": 3}},
        "required": ["text"], "additionalProperties": False}}
    script = '<tool_call>[{"name":"note","arguments":{"text":"ab"}}]'
    res = turn(tok, index, script, "remember everything", tools=(short,))
    assert res.success and res.n_backtracks == 0
    text = res.calls[0]["arguments"]["text"]
    assert 0 < len(text) <= 3 and "remember everything".find(text) >= 0


def test_agent_grounds_by_default_and_can_be_switched_off(tok):
    from needle_cy.agent import Needle
    script = '<tool_call>[{"name":"set_timer","arguments":{"minutes":5,"label":"zebra"}}]'
    labels = {}
    for ground in (True, False):
        agent = Needle(model=ScriptedModel(tok, [script]), tokenizer=tok, tools=[LIGHT, TIMER],
                       ground_values=ground)
        labels[ground] = agent.complete("a timer for the roast")["function_calls"][0]["arguments"]["label"]
    assert labels[False] == "zebra"
    assert labels[True] in "a timer for the roast" and labels[True] != "zebra"


def test_sources_are_the_conversation_so_far(tok):
    """A later turn may copy what an earlier user turn said; after reset() it may not."""
    from needle_cy.agent import Needle
    first = '<tool_call>[{"name":"set_light","arguments":{"room":"kitchen","on":true}}]'
    second = '<tool_call>[{"name":"set_timer","arguments":{"minutes":5,"label":"roast"}}]'
    agent = Needle(model=ScriptedModel(tok, [first, second]), tokenizer=tok, tools=[LIGHT, TIMER])
    agent.complete("kitchen lights on, the roast is in")
    label = agent.complete("and a five minute timer")["function_calls"][0]["arguments"]["label"]
    assert label == "roast"
    agent.reset()
    agent.model.scripts = [agent.model.scripts[1]]
    label = agent.complete("and a five minute timer")["function_calls"][0]["arguments"]["label"]
    assert label != "roast" and label in "and a five minute timer"


def test_tool_results_are_a_source(tok):
    from needle_cy.agent import Needle
    first = '<tool_call>[{"name":"set_light","arguments":{"room":"kitchen","on":true}}]'
    second = '<tool_call>[{"name":"set_timer","arguments":{"minutes":5,"label":"Dishwasher done"}}]'
    agent = Needle(model=ScriptedModel(tok, [first, second]), tokenizer=tok, tools=[LIGHT, TIMER])
    agent.complete("kitchen lights on")
    res = agent.complete([{"status": "Dishwasher done"}])
    assert res["function_calls"][0]["arguments"]["label"] == "Dishwasher done"


# ------------------------------------------------------------------ reasoning notes
def notes_at(index, said, text, tools=TOOLS):
    g = NoteGrounder(tools, said if isinstance(said, list) else [said], index)
    g.feed(text.encode())
    return g


def test_note_from_quote_is_a_span_of_what_was_said(index):
    g = notes_at(index, "Play some jazz in the Kitchen", 'play_music: query = "jazz" from "')
    assert g.candidates() is not None
    assert g.accepts(b"some") and g.accepts(b"kitchen") and g.accepts(b"Kitchen")   # either case
    assert not g.accepts(b"zebra") and not g.accepts(b"azz")     # not said / not at a word start
    g.feed(b"some jazz")
    assert g.accepts(b'"') and g.accepts(b'"; ') and g.accepts(b'"\n')
    assert not g.accepts(b'"}},')                 # JSON after a note's quote derails the notes
    h = notes_at(index, "Play some jazz", 'play_music: query = "jazz" from "some ')
    assert not h.accepts(b'"')                    # a span ends at a word end, not after a space


def test_note_value_quote_follows_the_keys_schema(index):
    said = "set a timer for the roast and kitchen lights on"
    label = notes_at(index, said, 'set_timer: minutes = 5 from "5"; label = "')
    assert label.accepts(b"roast") and not label.accepts(b"zebra")
    room = notes_at(index, said, 'set_light: room = "')
    assert room.accepts(b"kitchen") and not room.accepts(b"bedroom")    # the mentioned member
    # an unknown tool or key, or a quote in free text: no rule, nothing proposed
    for text in ('dance: style = "', 'set_light: shade = "', 'the person said "'):
        g = notes_at(index, said, text)
        assert g.candidates() is None and g.accepts(b"zebra")
    # a new line starts a new tool; ';' a new note of the same tool
    g = notes_at(index, said, 'set_light: room = "kitchen"\nset_timer: label = "')
    assert g.accepts(b"roast") and not g.accepts(b"zebra")


def test_note_candidates_match_the_exact_check(tok, index):
    pieces = tok.piece_table(size=tok.vocab_size)
    tools = dict(TOOLS, play_music={"type": "object", "properties": {"query": {"type": "string"}}})
    for text in ('play_music: query = "', 'play_music: query = "x" from "Fleet',
                 'set_light: room = "ki'):
        g = notes_at(index, "Play Fleetwood Mac in the kitchen", text, tools)
        exact = {t for t, p in enumerate(pieces) if p and b"\\" not in p and g.accepts(p)}
        assert exact and {t for t in g.candidates() if g.accepts(pieces[t])} == exact


def test_turn_grounds_the_reasoning_quotes(tok, index):
    query = "start a timer for the roast"
    script = ('<think>set_timer: label = "zebra" from "zebra"</think>'
              '<tool_call>[{"name":"set_timer","arguments":{"minutes":5}}]')
    results = {on: turn(tok, index, script, query, ground_notes=on) for on in (True, False)}
    assert 'label = "zebra" from "zebra"' in results[False].reasoning
    # (the scripted model does not adapt to the shorter copy, so only the first quote is
    # compared: it is a span of the request, not the invented word)
    label = results[True].reasoning.split('"')[1]
    assert label and label != "zebra" and f" {label} " in f" {query} ", results[True].reasoning


def test_note_value_after_its_source_is_a_span_of_that_source(index):
    """Source-first notes (data version 6): the value is copied from the quote before it."""
    said = "play some blues in the kitchen"
    tools = dict(TOOLS, play_music={"type": "object", "properties": {"query": {"type": "string"}}})
    g = notes_at(index, said, 'play_music: query from "some blues" = "', tools)
    assert g.accepts(b"blues") and not g.accepts(b"some")   # "some" introduces, never begins a value
    assert not g.accepts(b"kitchen")              # said, but not in the quoted source
    # a new note forgets the source; a value-first note is unchanged
    h = notes_at(index, said, 'play_music: query from "some blues" = "blues"; query = "', tools)
    assert h.accepts(b"kitchen")
    room = notes_at(index, said, 'play_music: room from "some blues" = "', dict(tools, play_music={
        "type": "object", "properties": {"room": {"enum": ROOMS}}}))
    assert room.accepts(b"kitchen") and not room.accepts(b"blues")   # enums keep their rule


def test_copied_span_does_not_end_on_a_word_waiting_for_more(index):
    said = "tell my partner I'm going to the shop"
    g = at(index, said, LABEL)
    assert not g.accepts(b"I'm going to the\"")
    assert not g.accepts(b'my"')
    assert g.accepts(b"I'm going to the shop\"") and g.accepts(b'partner"')
    assert at(index, "add vitamin A to the list", LABEL).accepts(b'vitamin A"')   # a letter's name


def test_instruction_words_are_the_tool_name_words_said_once():
    from needle_cy.grounding import _instruction_words
    assert _instruction_words("add_to_shopping_list", "add butter to the shopping list") == \
        {b"add", b"shopping", b"list"}                      # never the little word "to"
    assert _instruction_words("add_to_shopping_list", "add shopping bags to the shopping list") == \
        {b"add", b"list"}                                   # said twice: may be the value


def test_value_is_not_the_words_that_asked_for_the_tool(index):
    said = "Set a 10 minute timer called hope"
    g = at(index, said, LABEL)
    assert g.accepts(b'hope"')
    assert not g.accepts(b'timer"') and not g.accepts(b'Set"') and not g.accepts(b'timer called hope"')
    assert g.accepts(b'a 10 minute"')                      # not the tool's words: the model's call
    # A start that cannot be completed without the held word is not begun at all.
    g = at(index, "mind the timer on", LABEL)
    assert not g.accepts(b"the") and g.accepts(b'mind"')
    # In the notes, a key's value likewise (its from-quote may name the instruction).
    note = notes_at(index, said, 'set_timer: label = "')
    assert note.accepts(b'hope"') and not note.accepts(b'timer"')
    assert notes_at(index, said, 'set_timer: label from "').accepts(b'timer called hope"')


def test_introducers_neither_begin_nor_end_a_value(index):
    g = at(index, "Set a 10 minute timer called hope", LABEL)
    assert not g.accepts(b'called"') and not g.accepts(b'called hope"') and g.accepts(b'hope"')
    g = at(index, "play some jazz", LABEL)
    assert not g.accepts(b'some') and g.accepts(b'jazz"')
    assert notes_at(index, "play some jazz", 'set_timer: label from "').accepts(b'some jazz"')


ALARM = {"set_alarm": {"type": "object", "properties": {
    "time": {"type": "string", "pattern": "^([01][0-9]|2[0-3]):[0-5][0-9]$"},
    "label": {"type": "string"}}, "required": ["time"], "additionalProperties": False}}
ALARM_TIME = '[{"name":"set_alarm","arguments":{"time":"'


def test_time_value_is_a_time_that_was_said(index):
    g = grounder(index, "Alarm for quarter to eight in the morning on Saturday", ALARM)
    g.feed(ALARM_TIME.encode())
    assert g.constrained
    assert g.accepts(b'07:45"') and g.accepts(b"07:")
    assert not g.accepts(b'01:45"') and not g.accepts(b'19:45"') and not g.accepts(b'07:15"')
    g = grounder(index, "Alarm for quarter to eight", ALARM)     # no part of the day: either
    g.feed(ALARM_TIME.encode())
    assert g.accepts(b'07:45"') and g.accepts(b'19:45"') and not g.accepts(b'08:45"')


def test_a_string_described_as_hh_mm_is_a_time(index):
    described = {"type": "string", "description": "24-hour HH:MM"}
    assert value_rule(described, "", ["remind me at 6 p.m."]) == ("enum", [b"18:00"])
    assert value_rule(described, "", ["remind me to call mum"]) == ("copy",)   # no time said
    assert value_rule({"type": "string", "description": "hh:mm or a word"}, "", ["at 6 pm"]) == ("copy",)
    tools = {"remind": {"type": "object", "properties": {"task": {"type": "string"}, "time": described}}}
    g = grounder(index, "At 7:15 pm remind me to buy flowers", tools)
    g.feed(b'[{"name":"remind","arguments":{"time":"')
    assert g.accepts(b'19:15"') and not g.accepts(b'07:15"')
    g.feed(b'19:15","task":"')
    assert g.accepts(b'buy flowers"') and not g.accepts(b'7:15 pm"')     # the time's words are held


def test_other_values_of_a_time_call_are_not_the_time(index):
    said = "Set a 5:15 pm alarm called gym."
    g = grounder(index, said, ALARM)
    g.feed((ALARM_TIME + '17:15","label":"').encode())
    assert g.accepts(b'gym"')
    assert not g.accepts(b'a 5"') and not g.accepts(b'a 5:15"') and not g.accepts(b'pm"')
    # a tool without a time argument may copy the time's words (a message saying it)
    assert at(index, "tell them dinner at 7pm", LABEL).accepts(b'dinner at 7pm"')


def test_a_number_with_a_colon_or_point_is_one_word(index):
    g = at(index, "a 5:15 slot and 2.5 kilos", LABEL)
    assert not g.accepts(b'a 5"') and not g.accepts(b'15') and g.accepts(b'a 5:15 slot"')
    assert not g.accepts(b'and 2"') and g.accepts(b'2.5 kilos"')


def test_a_copy_does_not_cut_through_a_name(index):
    g = at(index, "Play Fleetwood Mac.", LABEL)
    assert g.accepts(b'Fleetwood Mac"')
    assert not g.accepts(b'Mac"') and not g.accepts(b'Fleetwood"')
    g = at(index, "put on songs by Todd Willis on the garage speaker", LABEL)
    assert g.accepts(b'Todd Willis"') and not g.accepts(b'Todd"') and not g.accepts(b'Willis"')
    # the first word of a sentence, a lowercase word and the pronoun I are not name words
    assert at(index, "Fleetwood Mac, play it", LABEL).accepts(b'Mac"')
    assert at(index, "tell Tom I'm late", LABEL).accepts(b'I\'m late"')
    assert at(index, "play the album Believe now", LABEL).accepts(b'Believe"')


def test_a_value_is_not_filler_alone(index):
    for said, filler, value in (("I'd like you to stream salsa music", b"I'd like you", b"salsa"),
                                ("Put some hvaac on the list", b"Put", b"hvaac"),
                                ("Put on summer hits", b"on", b"summer hits")):
        g = at(index, said, LABEL)
        assert not g.accepts(filler + b'"') and g.accepts(value + b'"'), said
    g = at(index, "Can you add garr to the list, please?", LABEL)
    assert g.accepts(b'garr"') and not g.accepts(b'Can"') and not g.accepts(b'please"')
    assert not g.accepts(b'Can you"') and g.accepts(b'Can you add garr"')   # filler with content
    assert g.accepts(b"Can")                    # begun: content can still be reached
    # a copy is not begun where only filler can follow before the end
    g = at(index, "add cereal, thank you", LABEL)
    assert not g.accepts(b"thank") and g.accepts(b'cereal"')
