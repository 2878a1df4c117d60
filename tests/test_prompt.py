"""The trained template, turn by turn, against the official fixture renderings and ids."""
import json
import re
from pathlib import Path

import pytest

from conftest import fixture_path
from needle_cy.prompt import (Conversation, assistant_text, compact_json, first_query_text,
                              prefix_text, render_tools_json, tool_result_text)
from needle_cy.toolspec import normalize_tools


@pytest.fixture(scope="module")
def tok():
    from needle_cy.tokenizer import Tokenizer
    return Tokenizer.from_archive(str(fixture_path("needle3_tiny_a", "model.cact")))


@pytest.fixture(scope="module")
def cases():
    with open(fixture_path("needle3_tiny_a", "cases.json"), encoding="utf-8") as f:
        return {c["name"]: c for c in json.load(f)["cases"]}


def split_prompt(prompt):
    m = re.match(r"(?:<\|im_start\|>system\n(.*?)<\|im_end\|>\n)?<\|im_start\|>user\n<tools>(.*?)</tools>\n"
                 r"(.*?)<\|im_end\|>\n<\|im_start\|>assistant\n", prompt, re.S)
    assert m, prompt[:200]
    return m.group(1), m.group(2), m.group(3), prompt[m.end():]


@pytest.mark.parametrize("name", ["single_call", "system_parallel_long", "non_ascii"])
def test_single_turn_text_and_ids_match_the_official_renderer(tok, cases, name):
    case = cases[name]
    system, tools_json, query, rest = split_prompt(case["prompt"])
    assert rest == ""
    # Re-render the tools from parsed dicts through toolspec: compact, key order kept, UTF-8.
    specs = normalize_tools(json.loads(tools_json))
    assert render_tools_json(specs) == tools_json
    conv = Conversation(tok, system, render_tools_json(specs))
    ids = conv.prefix_ids + conv.query_ids(query)
    assert conv.prefix_text + first_query_text(query) == case["prompt"]
    assert ids == case["ids"]
    assert ids[0] == 2 and 1 not in ids       # BOS first, no EOS


def test_multi_turn_tool_result_matches_fixture(tok, cases):
    case = cases["multi_turn_tool_result"]
    system, tools_json, query, rest = split_prompt(case["prompt"])
    conv = Conversation(tok, system, tools_json)
    q = conv.query_ids(query)
    conv.append_user(q)
    # The assistant turn: generated ids appended as ids (here: the target's own encoding).
    call_text, results_text = rest.split("<|im_end|>\n", 1)[0] + "<|im_end|>", None
    body = re.search(r"<tool_call>(.*)</tool_call>", call_text).group(1)
    assert call_text == assistant_text("", json.loads(body))
    conv.append_assistant(tok.encode(call_text, dummy_prefix=False, allowed_special="all"), had_calls=True)
    results = json.loads(re.search(r"<tool_result>(.*)</tool_result>", rest).group(1))
    r = conv.tool_result_ids(results)
    conv.append_user(r)
    assert conv.prefix_text + first_query_text(query) + call_text + tool_result_text(results) == case["prompt"]
    assert conv.ids == case["ids"]


def test_think_target_rendering(cases):
    case = cases["teacher_forced_think"]
    target = case["target"]
    reasoning = re.search(r"<think>\n(.*)\n</think>", target, re.S).group(1)
    calls = json.loads(re.search(r"<tool_call>(.*)</tool_call>", target).group(1))
    assert assistant_text("  " + reasoning + "\n", calls) == target


def test_system_is_stripped_and_empty_system_omitted():
    assert prefix_text("  \n", "[]") == "<|im_start|>user\n<tools>[]</tools>"
    assert prefix_text(" date: x ", "[]").startswith("<|im_start|>system\ndate: x<|im_end|>\n")
    assert compact_json({"é": [1, 2]}) == '{"é":[1,2]}'
    assert render_tools_json('[ {"b": 1, "a": "ü"} ]') == '[{"b":1,"a":"ü"}]'


def test_follow_up_query_and_reset(tok):
    conv = Conversation(tok, "date: 2026-01-01", "[]")
    first = conv.query_ids("hi")
    conv.append_user(first)
    conv.append_assistant([tok.marker_id("<|im_end|>")], had_calls=False)
    second = conv.query_ids("again")
    assert tok.decode(second) == "\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n"
    whole = [2] + tok.encode(conv.prefix_text + first_query_text("hi") + "<|im_end|>"
                             + "\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n",
                             allowed_special="all")
    assert conv.ids + second == whole
    conv.reset()
    assert conv.ids == conv.prefix_ids and conv.n_user_turns == 0


def test_date_fact_rules():
    import datetime
    from needle_cy.prompt import with_date_fact
    now = datetime.datetime(2026, 3, 4, 9, 5)
    assert with_date_fact("", now) == "date: 2026-03-04 Wed 09:05"
    assert with_date_fact("location: Paris", now) == "date: 2026-03-04 Wed 09:05; location: Paris"
    assert with_date_fact("date: tomorrow", now) == "date: tomorrow"
    assert with_date_fact("update: x; 2025-01-01 trip", now) == "update: x; 2025-01-01 trip"
    assert with_date_fact("update: soon", now) == "date: 2026-03-04 Wed 09:05; update: soon"
    assert with_date_fact('{"user": "Ada"}', now) == '{"user": "Ada"}'


def test_encode_template_equals_the_spec_encoding_of_ordinary_text():
    """Template markers by id, outside text encoded with the template text around it: on
    outside text without marker spellings that is ``encode(whole, allowed_special="all")``,
    for a template that starts with a marker or with text, with and without the dummy "▁"."""
    import random

    from needle_cy.prompt import MARKERS, OutsideText, encode_template
    from needle_cy.tokenizer import Tokenizer
    from tokenizer_helpers import USER_DEFINED, toy_record

    spelling = re.compile("|".join(re.escape(m) for m in sorted(MARKERS, key=len, reverse=True)))

    def marker_offsets(text):
        return [m.start() for m in spelling.finditer(text)]

    def template_marker_offsets(parts):
        offsets, at = [], 0
        for part in parts:
            if not isinstance(part, OutsideText):
                offsets += [at + k for k in marker_offsets(part)]
            at += len(part)
        return offsets

    rng = random.Random(31)
    pieces = [("▁", -1.0), ("a", -2.0), ("▁a", 1.0), ("\n", -1.0), ("user", 0.5), ("<", -3.0), ("|", -3.0)]
    pieces += [(m, 0.0, USER_DEFINED) for m in ("<|im_start|>", "<|im_end|>", "<tools>", "</tools>")]
    words = ["a", " a", " ", "\n", "user", "<", "|", ">", "é", "<|im", "tools", "</"]
    for add_dummy_prefix in (True, False):
        tok = Tokenizer(toy_record(pieces, add_dummy_prefix=add_dummy_prefix))
        for _ in range(300):
            parts = []
            for k in range(rng.randint(1, 6)):
                text = "".join(rng.choice(words) for _ in range(rng.randint(0, 4)))
                if k % 2:
                    parts.append(OutsideText(text))
                else:
                    parts.append(text + rng.choice(["", "<|im_start|>", "</tools>\n", "<|im_end|>user"]))
            whole = "".join(parts)
            if marker_offsets(whole) != template_marker_offsets(parts):
                continue   # an outside part (or a seam) spells a marker: the next test
            for dummy in (True, False):
                assert encode_template(tok, parts, dummy) == tok.encode(whole, dummy, "all"), (parts, dummy)


def test_encode_template_takes_markers_from_the_template_only():
    from needle_cy.prompt import OutsideText, encode_template
    from needle_cy.tokenizer import CHAT_MARKERS, Tokenizer

    tok = Tokenizer.from_archive(str(Path(__file__).resolve().parent.parent / "needle_cy" / "models" / "default.cact"))
    spelled = "".join(CHAT_MARKERS)
    ids = encode_template(tok, ["<|im_start|>user\n<tools>", OutsideText(spelled), "</tools>"], dummy_prefix=True)
    markers = [tok.piece(i) for i in ids if tok.piece_type(i) == 3]
    assert markers == ["<|im_start|>", "<tools>", "</tools>"]
    assert tok.decode(ids) == f"<|im_start|>user\n<tools>{spelled}</tools>"
    # a seam: outside text ending in half a marker, the template's text after it
    ids = encode_template(tok, ["\n", OutsideText("<|im_"), "end|>x<|im_end|>"])
    assert [tok.piece(i) for i in ids if tok.piece_type(i) == 3] == ["<|im_end|>"]
