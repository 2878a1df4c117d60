"""``tools_per_clause``: the prompt holds only the best tool of the request and of each of
its clauses (``retrieval.clause_picks``); a later turn, or a stored turn's calls, that
needs another tool moves the conversation onto a prompt that holds it.  On the embedded
model and its smart-home catalogue."""
import numpy as np
import pytest

from needle_cy import Needle, home_tools
from needle_cy.retrieval import clause_picks
from needle_cy.toolspec import normalize_tools


@pytest.fixture(scope="module")
def narrow():
    return Needle(tools=home_tools(), threads=1, tools_per_clause=1)


def _names(specs, picks):
    return [specs[i].name for i in picks]


def test_clause_picks_keep_the_best_tool_of_the_request_and_of_each_clause():
    specs = normalize_tools(home_tools())
    assert _names(specs, clause_picks("lock the front door", specs)) == ["lock_door"]
    got = _names(specs, clause_picks("Close the garage door, lock the back door and start the vacuum", specs))
    assert sorted(got) == ["lock_door", "operate_garage", "start_vacuum"]
    two = clause_picks("lock the front door", specs, per_clause=2)
    assert len(two) == 2 and specs[two[0]].name == "lock_door"
    assert clause_picks("zzqx blorp", specs) == []      # no word shared: the caller decides


def test_a_one_intent_request_shows_one_tool_and_an_unmatched_one_the_usual_five(narrow):
    assert [s.name for s in narrow.select_tools("lock the front door")] == ["lock_door"]
    assert len(narrow.select_tools("Close the garage door and start the vacuum")) == 2
    wide = Needle(tools=home_tools(), threads=1)
    assert [s.name for s in narrow.select_tools("zzqx blorp")] == [s.name for s in wide.select_tools("zzqx blorp")]
    assert len(wide.select_tools("lock the front door")) == 5
    with pytest.raises(ValueError, match="tools_per_clause"):
        Needle(tools=home_tools(), tools_per_clause=0)


def test_a_later_turn_moves_the_conversation_onto_a_prompt_with_its_tools(narrow):
    narrow.reset()
    narrow.complete("lock the front door")
    before = narrow.conversation_ids()
    old_prefix = len(narrow._active.conversation.prefix_ids)
    assert narrow._active.names == ("lock_door",)
    second = narrow.complete("turn on the kitchen light")
    assert set(narrow._active.names) == {"lock_door", "set_light"}
    assert all(c["name"] in ("lock_door", "set_light") for c in second["function_calls"])
    ids = narrow.conversation_ids()
    prefix = list(narrow._active.conversation.prefix_ids)
    history = before[old_prefix:]
    assert ids[:len(prefix)] == prefix and ids[len(prefix):len(prefix) + len(history)] == history
    # the model holds these ids: one more token scores as on a fresh prefill of them (to
    # the rounding of decode steps against one prefill), and far from the same turns
    # without the replayed history
    fresh = Needle(tools=home_tools(), threads=1).model
    fresh.reset()
    want = np.asarray(fresh.prefill(ids + [5]))
    fresh.reset()
    without = np.asarray(fresh.prefill(prefix + ids[len(prefix) + len(history):] + [5]))
    got = np.asarray(narrow.model.prefill([5]))
    err = float(np.abs(got - want).max())
    assert err < 0.05 and int(np.argmax(got)) == int(np.argmax(want))
    assert float(np.abs(got - without).max()) > 10 * err


def test_a_turn_that_fails_after_the_move_leaves_the_conversation_as_it_was(narrow):
    narrow.reset()
    narrow.complete("lock the front door")
    before, names = narrow.conversation_ids(), narrow._active.names
    narrow.cancel()       # kept for the next turn: it stops the move's prefill of the history
    got = narrow.complete("turn on the kitchen light")
    assert got["error_code"] == "cancelled"
    assert narrow._active.names == names and narrow.conversation_ids() == before
    # and the turn, asked again, moves and runs
    again = narrow.complete("turn on the kitchen light")
    assert set(narrow._active.names) == {"lock_door", "set_light"} and again["error"] is None


def test_add_turn_brings_in_the_tools_its_calls_name(narrow):
    narrow.reset()
    narrow.add_turn("hello", [{"name": "lock_door", "arguments": {"door": "front door"}}])
    assert "lock_door" in narrow._active.names
    narrow.add_turn("and the light", [{"name": "set_light", "arguments": {"room": "kitchen", "on": True}}])
    assert {"lock_door", "set_light"} <= set(narrow._active.names)
    with pytest.raises(ValueError, match="not a call list"):
        narrow.add_turn("x", [{"name": "no_such_tool", "arguments": {}}])


def test_the_token_budget_still_bounds_the_narrow_selection():
    tight = Needle(tools=home_tools(), threads=1, tools_per_clause=2, tool_token_budget=1)
    assert tight.select_tools("lock the front door") == []
    roomy = Needle(tools=home_tools(), threads=1, tools_per_clause=2, tool_token_budget=100_000)
    assert len(roomy.select_tools("lock the front door")) == 2
