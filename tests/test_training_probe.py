"""The reading probe's token roles (needle_cy.training.probe)."""
import json

from needle_cy.training import data, probe


def _turn(reasoning=""):
    call = {"name": "set_timer", "arguments": {"label": "tea time", "minutes": 4}}
    ex = {"source": "mix", "system": "", "tools": [], "history": [], "query": "tea timer for 4 minutes",
          "reasoning": reasoning, "answers": [call]}
    return ex, data.render(ex)[1]


def _spans(target, roles, role):
    out, cur = [], ""
    for ch, r in zip(target, roles):
        if r == role:
            cur += ch
        elif cur:
            out.append(cur)
            cur = ""
    return out + ([cur] if cur else [])


def test_roles_mark_the_name_keys_and_values_of_the_call():
    ex, target = _turn()
    roles = probe.token_roles(target, ex["answers"])
    assert _spans(target, roles, "name") == ["set_timer"]
    assert _spans(target, roles, "key") == ["label", "minutes"]
    assert _spans(target, roles, "value") == [json.dumps("tea time"), "4"]
    assert "think" not in roles


def test_roles_in_the_note_mark_its_name_and_quoted_values():
    ex, target = _turn('set_timer: label = "tea time"; minutes = 4')
    roles = probe.token_roles(target, ex["answers"])
    assert "<think>" in target
    assert _spans(target, roles, "name") == ["set_timer", "set_timer"]
    assert _spans(target, roles, "value")[0] == "tea time"       # the note's, inside its quotes
    assert "think" in roles


def test_piece_roles_follow_the_characters_each_piece_covers():
    ex, target = _turn()
    # one piece per character after a dummy-prefix space: each piece has its character's role
    pieces = [" "] + [c for c in target]
    pieces[1] = " " + pieces[1]
    pieces = pieces[1:]
    got = probe.piece_roles(pieces, target, ex["answers"])
    assert got == probe.token_roles(target, ex["answers"])
    # a piece spanning structure and the name takes the name's role
    j = target.index("set_timer")
    merged = [target[:j - 1], target[j - 1:j + 3], target[j + 3:]]
    assert probe.piece_roles(merged, target, ex["answers"]) == ["struct", "name", "name"]
