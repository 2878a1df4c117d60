"""The negation gate (needle_cy.negation): calls doing the opposite of the request."""
import pytest

from needle_cy.negation import negated_calls


def call(name, **arguments):
    return {"name": name, "arguments": arguments}


ALARM = call("set_alarm", time="07:00")
EGGS = call("add_to_shopping_list", item="eggs")
KITCHEN_ON = call("set_light", room="kitchen", on=True)


@pytest.mark.parametrize("request_text, calls, negated", [
    # an undo word against a tool that does not undo
    ("Cancel my 7am alarm.", [ALARM], [0]),
    ("Cancel my 7am alarm.", [call("set_alarm", time="07:00", label="Cancel")], [0]),  # the cue alone
    ("Remove eggs from the shopping list", [EGGS], [0]),
    ("please delete the eggs on my shopping list", [EGGS], [0]),
    ("Cancel the vacuum", [call("stop_vacuum")], []),            # the tool itself undoes
    ("Cancel my alarm", [call("cancel_alarm")], []),
    # negated imperatives, typographic apostrophe too
    ("Don't turn on the kitchen lights", [KITCHEN_ON], [0]),
    ("Do not turn on the kitchen lights", [KITCHEN_ON], [0]),
    ("Don\u2019t turn on the kitchen lights", [KITCHEN_ON], [0]),
    ("never mind the kitchen lights", [KITCHEN_ON], [0]),
    ("Don't forget to lock the front door", [call("lock_door", door="front door")], []),
    # only the clause that asked for the call counts
    ("Cancel my alarm and turn on the kitchen lights", [KITCHEN_ON], []),
    ("Cancel my alarm and turn on the kitchen lights", [KITCHEN_ON, ALARM], [1]),
    # a cue inside a value the person wants said is content, not an instruction
    ("let the children know that don't forget your keys",
     [call("send_notification", message="don't forget your keys", recipient="kids")], []),
    ("play the album Nevermind", [call("play_music", query="Nevermind")], []),
    ("is the front door locked? if not, lock it", [call("lock_door", door="front door")], []),
    ("turn on the kitchen lights", [KITCHEN_ON], []),
    ("", [KITCHEN_ON], []),
    ("Cancel my alarm", [], []),
])
def test_negated_calls(request_text, calls, negated):
    assert negated_calls(request_text, calls) == negated
