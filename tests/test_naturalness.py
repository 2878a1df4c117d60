"""The naturalness figures of a case set (no model): BM25 top-1, the share of a request's
content words among its tool's words, requests with none."""
import json

import pytest

from needle_cy import eval as ev
from needle_cy.training import naturalness as nat

LIGHT = {"name": "set_light", "description": "Turn the lights in a room on or off.",
         "parameters": {"type": "object", "properties": {
             "room": {"type": "string", "enum": ["kitchen", "bedroom"]}, "on": {"type": "boolean"}},
             "required": ["room", "on"]}}
MUSIC = {"name": "play_music", "description": "Play music by artist or genre.",
         "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}


def call(name, **arguments):
    return {"name": name, "arguments": arguments}


CASES = [
    # every content word is the tool's: turn, kitchen (an enum value), light(s)
    {"id": "1", "query": "Please turn on the kitchen lights",
     "answers": [call("set_light", room="kitchen", on=True)]},
    # a paraphrase: no word in common, and BM25 ranks the first tool (all scores 0)
    {"id": "2", "query": "I fancy hearing Miles Davis", "answers": [call("play_music", query="Miles Davis")]},
    # two calls: the words of both tools count; "jazz" is a value, not a tool word (4 of 5)
    {"id": "3", "query": "turn off the bedroom light and play some jazz",
     "answers": [call("set_light", room="bedroom", on=False), call("play_music", query="jazz")]},
    # refusals have no gold tool: left out
    {"id": "4", "query": "what is the capital of France", "answers": []},
]


def test_content_words_drop_stopwords_and_numbers_and_stem():
    words = nat.content_words("Please set it to 21 degrees, and the lights too!")
    assert words == ["set", "degre", "light"]          # stemmed as BM25 stems
    assert nat.content_words("the the THE") == []
    assert nat.content_words("What's it like in the kitchen?") == ["kitchen"]


def test_measure_on_hand_counted_cases():
    f = nat.measure(CASES, [LIGHT, MUSIC])
    assert f["cases"] == 4 and f["call_cases"] == 3 and f["single_call_cases"] == 2
    assert f["mean_tools"] == 2.0
    assert f["bm25_top1"] == {"cases": 2, "correct": 1, "accuracy": 0.5}
    assert f["word_share"] == pytest.approx((1.0 + 0.0 + 0.8) / 3)
    assert f["no_shared_word_cases"] == 1 and f["no_shared_word"] == pytest.approx(1 / 3)
    text = nat.format_figures(dict(f, data="x.jsonl"))
    assert text.startswith("x.jsonl: 3 cases with calls") and "BM25 top-1 1/2 50.0%" in text


def test_a_case_s_own_tools_replace_the_catalogue():
    # the same request over its own tools, where the gold tool is the only one
    own = [dict(CASES[1], tools=[MUSIC])]
    f = nat.measure(own, [LIGHT, MUSIC])
    assert f["bm25_top1"]["correct"] == 1 and f["mean_tools"] == 1.0


def test_an_answer_on_a_tool_the_case_lacks_is_named():
    with pytest.raises(ValueError, match="case 'x'.*open_window"):
        nat.measure([{"id": "x", "query": "open it", "answers": [call("open_window")]}], [LIGHT])


def test_the_command_line(tmp_path, capsys):
    data = tmp_path / "cases.jsonl"
    data.write_text("".join(json.dumps(c) + "\n" for c in CASES))
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([LIGHT, MUSIC]))
    assert ev.main(["--naturalness", "--data", str(data), "--tools", str(tools), "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["bm25_top1"]["correct"] == 1 and figures["data"] == str(data)
    assert ev.main(["--naturalness", "--data", str(data), "--tools", str(tools)]) == 0
    assert "BM25 top-1 1/2 50.0%" in capsys.readouterr().out
