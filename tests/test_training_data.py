"""The synthetic training data: deterministic, parses, and validates against the tools."""
import json
import re

import pytest

from needle_cy.training import data

jsonschema = pytest.importorskip("jsonschema")

N = 1500


@pytest.fixture(scope="module")
def examples():
    return data.generate(N, seed=7)


def test_deterministic_for_a_seed():
    a = data.generate(50, seed=3)
    b = data.generate(50, seed=3)
    c = data.generate(50, seed=4)
    assert a == b
    assert a != c


def test_calls_validate_against_the_rendered_tools(examples):
    for ex in examples:
        assert 1 <= len(ex["tools"]) <= data.MAX_RENDERED_TOOLS
        names = [t["name"] for t in ex["tools"]]
        assert len(set(names)) == len(names)
        by_name = {t["name"]: t for t in ex["tools"]}
        for turn in ex["history"] + [ex]:
            for call in turn["answers"]:
                assert call["name"] in by_name, (ex["query"], call)
                schema = by_name[call["name"]]["parameters"]
                jsonschema.Draft202012Validator(schema).validate(call["arguments"])
                # arguments are written in schema property order
                order = list(schema.get("properties", {}))
                keys = list(call["arguments"])
                assert keys == sorted(keys, key=order.index)


def test_catalogue_calls_follow_the_labelling_rules(examples):
    catalogue = {t["name"]: t for t in data.load_catalogue()}
    seen = set()
    for ex in examples:
        calls = ex["answers"]
        assert len({c["name"] for c in calls}) == len(calls)  # no tool twice in a case
        for call in calls:
            if call["name"] not in catalogue:
                continue
            # a catalogue name always means the catalogue's schema
            assert next(t for t in ex["tools"] if t["name"] == call["name"]) == catalogue[call["name"]]
            seen.add(call["name"])
            args = call["arguments"]
            if call["name"] == "set_alarm":
                assert re.fullmatch(r"([01][0-9]|2[0-3]):[0-5][0-9]", args["time"])
            if call["name"] == "set_thermostat":
                assert (args["temperature"] * 2) == int(args["temperature"] * 2)
            if call["name"] == "play_music":
                q = args["query"].lower()
                assert not q.startswith("some ") and "playlist" not in q and "music" not in q
            if call["name"] == "set_light" and "brightness" in args:
                assert args["on"] is True
    assert seen == set(catalogue)  # every tool is exercised


def test_numbers_and_phrasing_conventions():
    rng = __import__("random").Random(0)
    assert data.number_words(0) == "zero"
    assert data.number_words(45) == "forty-five"
    assert data.number_words(105) == "one hundred and five"
    assert data.json_number(21.0) == 21 and isinstance(data.json_number(21.0), int)
    assert data.json_number(21.5) == 21.5
    for _ in range(300):
        minutes, said = data._duration(rng)
        if said == "an hour and a half":
            assert minutes == 90
        if said == "half an hour":
            assert minutes == 30
        hhmm, said = data._clock(rng)
        if said.endswith(("pm", "PM", "p.m.")) and not said.startswith(("12", "twelve")):
            assert int(hhmm[:2]) >= 13


def test_mix_of_kinds(examples):
    kinds = {}
    for ex in examples:
        kinds[ex["kind"]] = kinds.get(ex["kind"], 0) + 1
    for kind in ("single", "multi", "refuse", "invented", "invented_refuse", "result"):
        assert kinds.get(kind, 0) > 0, kind
    refusals = sum(1 for ex in examples if not ex["answers"])
    assert 0.1 < refusals / len(examples) < 0.45


def test_render_matches_the_template(examples):
    for ex in examples[:300]:
        prompt, target = data.render(ex)
        tools_json = json.dumps(ex["tools"], separators=(",", ":"), ensure_ascii=False)
        assert f"<|im_start|>user\n<tools>{tools_json}</tools>\n" in prompt
        assert prompt.endswith("<|im_end|>\n<|im_start|>assistant\n")
        if ex["system"]:
            assert prompt.startswith(f"<|im_start|>system\n{ex['system']}<|im_end|>\n")
        else:
            assert prompt.startswith("<|im_start|>user\n")
        m = re.fullmatch(r"(?:<think>\n(.+)\n</think>\n)?<tool_call>(.*)</tool_call><\|im_end\|>",
                         target, re.S)
        assert m, target
        assert json.loads(m.group(2)) == ex["answers"]
        assert m.group(2) == json.dumps(ex["answers"], separators=(",", ":"), ensure_ascii=False)
        if ex.get("is_result"):
            assert "<tool_result>" in prompt and ex["answers"] == []


def test_never_reads_the_dev_set():
    import inspect
    source = inspect.getsource(data)
    assert "home_dev" not in source
