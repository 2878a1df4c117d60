"""``Needle.snapshot`` / ``restore`` (a conversation taken and resumed, also across agents
sharing one model) and ``require_tool`` (a turn that must call one named tool), on the
embedded model and its smart-home catalogue."""
import pytest

from needle_cy import Needle, home_tools
from needle_cy.agent import ConversationSnapshot
from needle_cy.toolspec import normalize_tool

RESULTS = [{"ok": True}]


@pytest.fixture(scope="module")
def agent():
    return Needle(tools=home_tools(), threads=1)


@pytest.fixture(scope="module")
def straight(agent):
    """The two-turn conversations run straight through: request, then tool results."""
    out = {}
    for query in ("set the thermostat to 21 degrees", "set a timer for ten minutes"):
        agent.reset()
        first = agent.complete(query)
        second = agent.complete(RESULTS)
        out[query] = (first["function_calls"], second["function_calls"], agent.conversation_ids())
    return out


def test_a_restored_conversation_continues_as_if_never_left(agent, straight):
    a, b = "set the thermostat to 21 degrees", "set a timer for ten minutes"
    agent.reset()
    assert agent.complete(a)["function_calls"] == straight[a][0]
    taken = agent.snapshot()
    assert isinstance(taken, ConversationSnapshot) and taken.nbytes > 0
    # another conversation in between, on the same agent and model
    agent.reset()
    assert agent.complete(b)["function_calls"] == straight[b][0]
    other = agent.snapshot()
    agent.restore(taken)
    assert agent.complete(RESULTS)["function_calls"] == straight[a][1]
    assert agent.conversation_ids() == straight[a][2]
    # the snapshot stays valid: the same point again, and the other conversation too
    agent.restore(taken)
    assert agent.complete(RESULTS)["function_calls"] == straight[a][1]
    agent.restore(other)
    assert agent.complete(RESULTS)["function_calls"] == straight[b][1]
    assert agent.conversation_ids() == straight[b][2]


def test_agents_sharing_a_model_resume_their_own_conversations(agent, straight):
    a, b = "set the thermostat to 21 degrees", "set a timer for ten minutes"
    other = Needle(agent.model, tools=home_tools()[:10], tokenizer=agent.tokenizer)
    agent.reset()
    agent.complete(a)
    taken = agent.snapshot()
    other.complete(b)                 # moves the shared model's state elsewhere
    agent.restore(taken)
    assert agent.complete(RESULTS)["function_calls"] == straight[a][1]
    assert agent.conversation_ids() == straight[a][2]
    with pytest.raises(ValueError, match="snapshot"):
        other.restore(taken)          # another agent's conversation
    with pytest.raises(ValueError, match="snapshot"):
        agent.restore("not a snapshot")


def test_a_snapshot_before_any_turn_restores_to_a_fresh_conversation(agent, straight):
    a = "set the thermostat to 21 degrees"
    agent.reset()
    empty = agent.snapshot()
    assert empty.nbytes == 0
    agent.complete(a)
    agent.restore(empty)
    assert agent.conversation_ids() == []
    assert agent.complete(a)["function_calls"] == straight[a][0]


def _schema_valid(agent, call):
    jsonschema = pytest.importorskip("jsonschema")
    params = normalize_tool(agent.tools[call["name"]].schema).grammar_schema()["parameters"]
    jsonschema.validate(call["arguments"], params)


@pytest.mark.parametrize("query, name", [("hello there", "set_light"),
                                         ("turn on the kitchen light", "set_thermostat"),
                                         ("turn on the kitchen light", "play_music")])
def test_require_tool_makes_the_turn_call_that_tool(agent, query, name):
    agent.reset()
    r = agent.complete(query, require_tool=name)
    calls = r["function_calls"] + r["suppressed_calls"]
    assert r["success"] and calls, r
    assert all(c["name"] == name for c in calls)
    for call in calls:
        _schema_valid(agent, call)
    # a tool the retrieval would leave out of this conversation is put into its prompt
    assert name in r["tools"]
    assert r["tools"] == [s.name for s in agent.specs if s.name in r["tools"]]   # catalogue order


def test_require_tool_names_a_tool_of_the_agent(agent):
    agent.reset()
    with pytest.raises(ValueError, match="not one of this agent's tools"):
        agent.complete("turn on the kitchen light", require_tool="launch_rocket")
    free = Needle(agent.model, tools=home_tools(), tokenizer=agent.tokenizer, constrained=False)
    with pytest.raises(ValueError, match="constrained"):
        free.complete("turn on the kitchen light", require_tool="set_light")
