"""The evaluation scorer on hand-made predictions; the command line, the forced tool choice and
the follow-up cases on the default model."""
import json
from pathlib import Path

import pytest

from needle_cy import eval as ev

pytest.importorskip("jsonschema")

TOOLS = [
    {"name": "set_light", "description": "lights",
     "parameters": {"type": "object", "properties": {
         "room": {"type": "string", "enum": ["kitchen", "bedroom"]},
         "on": {"type": "boolean"},
         "brightness": {"type": "integer", "minimum": 0, "maximum": 100}},
         "required": ["room", "on"]}},
    {"name": "set_thermostat", "description": "heat",
     "parameters": {"type": "object", "properties": {
         "temperature": {"type": "number", "multipleOf": 0.5}}, "required": ["temperature"]}},
    {"name": "set_alarm", "description": "alarm",
     "parameters": {"type": "object", "properties": {
         "time": {"type": "string", "pattern": "^([01][0-9]|2[0-3]):[0-5][0-9]$"},
         "days": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
         "required": ["time"]}},
]


def call(name, **arguments):
    return {"name": name, "arguments": arguments}


def test_numbers_compare_by_value_but_bools_are_not_numbers():
    assert ev.calls_equal([call("set_thermostat", temperature=21)],
                          [call("set_thermostat", temperature=21.0)])
    assert not ev.calls_equal([call("set_thermostat", temperature=21)],
                              [call("set_thermostat", temperature=21.5)])
    # True == 1 in Python; the scorer must not accept it
    assert not ev.calls_equal([call("set_light", room="kitchen", on=True)],
                              [call("set_light", room="kitchen", on=1)])


def test_order_of_calls_matters_but_not_key_order():
    a, b = call("set_light", room="kitchen", on=True), call("set_thermostat", temperature=20)
    assert ev.calls_equal([a, b], [a, b])
    assert not ev.calls_equal([a, b], [b, a])
    swapped = {"name": "set_light", "arguments": {"on": True, "room": "kitchen"}}
    assert ev.calls_equal([a], [swapped])


def test_extra_or_missing_arguments_and_calls_are_wrong():
    want = [call("set_light", room="kitchen", on=True)]
    assert not ev.calls_equal(want, [call("set_light", room="kitchen", on=True, brightness=50)])
    assert not ev.calls_equal(want, [call("set_light", room="kitchen")])
    assert not ev.calls_equal(want, want + want)
    assert not ev.calls_equal(want, [])
    assert not ev.calls_equal(want, None)
    assert ev.calls_equal([], [])


def test_list_values_compare_in_order():
    want = [call("set_alarm", time="07:00", days=["mon", "tue"])]
    assert ev.calls_equal(want, [call("set_alarm", time="07:00", days=["mon", "tue"])])
    assert not ev.calls_equal(want, [call("set_alarm", time="07:00", days=["tue", "mon"])])


def test_schema_validity():
    assert ev.schema_valid([], TOOLS)
    assert ev.schema_valid([call("set_light", room="kitchen", on=False)], TOOLS)
    assert not ev.schema_valid([call("set_light", room="attic", on=False)], TOOLS)  # enum
    assert not ev.schema_valid([call("set_light", room="kitchen")], TOOLS)  # required
    assert not ev.schema_valid([call("set_light", room="kitchen", on=True, brightness=101)], TOOLS)
    assert not ev.schema_valid([call("set_thermostat", temperature=20.3)], TOOLS)  # multipleOf
    assert not ev.schema_valid([call("set_alarm", time="7am")], TOOLS)  # pattern
    assert not ev.schema_valid([call("open_window")], TOOLS)  # unknown tool
    assert not ev.schema_valid(None, TOOLS)
    # one bad call spoils the output
    assert not ev.schema_valid([call("set_thermostat", temperature=20),
                                call("set_alarm", time="25:00")], TOOLS)


def test_summary_counts_categories_confusion_and_latency():
    cases = [
        {"id": "a", "category": "single", "query": "q", "answers": [call("set_thermostat", temperature=20)]},
        {"id": "b", "category": "single", "query": "q", "answers": [call("set_thermostat", temperature=21)]},
        {"id": "c", "category": "multi", "query": "q",
         "answers": [call("set_thermostat", temperature=20), call("set_light", room="kitchen", on=True)]},
        {"id": "d", "category": "refuse", "query": "q", "answers": []},
        {"id": "e", "category": "refuse", "query": "q", "answers": []},
    ]
    preds = [
        [call("set_thermostat", temperature=20.0)],            # right
        [],                                                     # wrongly refused
        [call("set_thermostat", temperature=20)],              # one call short
        [],                                                     # right refusal
        [call("set_light", room="attic", on=True)],            # wrong call, schema-invalid
    ]
    records = [ev.score_case(c, p, TOOLS, latency_s=0.01 * (i + 1)) for i, (c, p) in enumerate(zip(cases, preds))]
    s = ev.summarize(records)
    assert s["cases"] == 5 and s["correct"] == 2
    assert s["categories"]["single"] == {"cases": 2, "correct": 1, "accuracy": 0.5}
    assert s["categories"]["multi"]["correct"] == 0
    assert s["categories"]["refuse"]["accuracy"] == 0.5
    assert s["accuracy"] == pytest.approx(0.4)
    assert s["schema_valid"] == pytest.approx(0.8)
    assert s["refusal_confusion"] == {"refuse_as_refuse": 1, "refuse_as_call": 1,
                                      "call_as_refuse": 1, "call_as_call": 2}
    assert s["refusal_accuracy"] == 0.5
    assert s["latency_ms"]["median"] == pytest.approx(30.0)
    assert s["latency_ms"]["p90"] == pytest.approx(46.0)
    # cases with calls: a, c, e → latencies 10, 30, 50 ms
    assert s["latency_ms"]["first_call_median"] == pytest.approx(30.0)
    text = ev.format_summary(s)
    assert "overall" in text and "40.0%" in text


def test_failed_case_is_wrong_and_invalid():
    case = {"id": "x", "category": "single", "query": "q", "answers": [call("set_thermostat", temperature=20)]}
    rec = ev.score_case(case, None, TOOLS, error="RuntimeError: boom")
    assert not rec["correct"] and not rec["schema_valid"]
    assert ev.summarize([rec])["errors"] == 1


def test_predicted_calls_reads_envelopes():
    env = {"type": "call", "function_calls": [call("set_thermostat", temperature=20)],
           "suppressed_calls": []}
    assert ev.predicted_calls(env) == [call("set_thermostat", temperature=20)]
    esc = {"function_calls": [], "suppressed_calls": [call("set_thermostat", temperature=20)]}
    assert ev.predicted_calls(esc) == []
    assert ev.predicted_calls(esc, include_suppressed=True) == [call("set_thermostat", temperature=20)]


def test_load_cases_rejects_bad_lines(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"id": "1", "query": "hi", "answers": []}) + "\n\n")
    assert len(ev.load_cases(good)) == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"query": "hi"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        ev.load_cases(bad)


def test_default_catalogue_is_the_shared_one():
    from conftest import shared_path
    shared = json.loads(shared_path("eval", "home_tools.json").read_text())
    packaged = json.loads(ev.DEFAULT_TOOLS.read_text())
    assert packaged == shared


def test_main_runs_the_default_model_cold_or_with_prefix_checkpoints(tmp_path, capsys):
    """The command line scores the packaged model; ``--prefix-checkpoint-mb 0`` turns the
    agent's prefix checkpoints off (the cold latency) and changes no prediction."""
    cases = [{"id": f"c{i}", "category": "single", "query": q,
              "answers": [call("set_light", room="kitchen", on=True)]}
             for i, q in enumerate(["turn on the kitchen lights", "kitchen lights on please",
                                    "switch the kitchen light on"])]
    data = tmp_path / "cases.jsonl"
    data.write_text("".join(json.dumps(c) + "\n" for c in cases))
    runs = []
    for extra in ([], ["--prefix-checkpoint-mb", "0"]):
        out = tmp_path / f"records{len(runs)}.jsonl"
        assert ev.main(["--data", str(data), "--json", "--out", str(out)] + extra) == 0
        summary = json.loads(capsys.readouterr().out)
        assert summary["cases"] == 3 and summary["schema_valid"] == 1.0
        assert summary["prefix_checkpoint_mb"] == (0 if extra else None)
        runs.append([json.loads(line)["predicted"] for line in out.read_text().splitlines()])
    assert runs[0] == runs[1]


def test_main_passes_tool_count_and_query_expansion_to_the_agent(tmp_path, capsys):
    """With one retrieved tool the grammar can call only that one: the expansion picks
    set_light for "dim", plain BM25 another tool."""
    case = {"id": "d", "category": "single", "query": "dim the kitchen to 30",
            "answers": [call("set_light", room="kitchen", on=True, brightness=30)]}
    data = tmp_path / "cases.jsonl"
    data.write_text(json.dumps(case) + "\n")
    names = {}
    for extra in ([], ["--no-query-expansion"]):
        out = tmp_path / "records.jsonl"
        assert ev.main(["--data", str(data), "--json", "--out", str(out), "--max-retrieved-tools", "1"]
                       + extra) == 0
        summary = json.loads(capsys.readouterr().out)
        assert summary["max_retrieved_tools"] == 1 and summary["query_expansion"] is not bool(extra)
        names[bool(extra)] = {c["name"] for c in json.loads(out.read_text())["predicted"] or []}
    assert names[False] <= {"set_light"} and "set_light" not in names[True]


# ------------------------------------------------------------------ components

def test_argument_components_match_calls_by_name():
    want = [call("set_light", room="kitchen", on=True), call("set_thermostat", temperature=20)]
    # a missed first call does not shift the second
    assert ev.argument_components(want, [call("set_thermostat", temperature=20.0)]) == (1, 1, 1)
    # right name, a key too many; right keys, a wrong value; the order does not matter here
    predicted = [call("set_thermostat", temperature=21),
                 call("set_light", room="kitchen", on=True, brightness=5)]
    assert ev.argument_components(want, predicted) == (2, 1, 0)
    assert ev.argument_components(want, want) == (2, 2, 2)
    assert ev.argument_components(want, None) == (0, 0, 0)
    # each predicted call is matched once
    twice = [call("set_timer", minutes=5), call("set_timer", minutes=10)]
    assert ev.argument_components(twice, [call("set_timer", minutes=10)]) == (1, 1, 0)
    # booleans are not numbers here either
    assert ev.argument_components([call("set_light", room="kitchen", on=True)],
                                  [call("set_light", room="kitchen", on=1)]) == (1, 1, 0)


def test_summary_components_arguments_refusals_by_kind_followups_and_forced_name():
    cases = [
        {"id": "a", "category": "single", "kind": "single", "query": "q",
         "answers": [call("set_thermostat", temperature=20)]},
        {"id": "b", "category": "multi", "query": "q",
         "answers": [call("set_thermostat", temperature=20), call("set_light", room="kitchen", on=True)]},
        {"id": "c", "category": "refuse", "kind": "refuse_missing_value", "query": "q", "answers": []},
        {"id": "d", "category": "refuse", "kind": "refuse_missing_value", "query": "q", "answers": []},
        {"id": "e", "category": "refuse", "kind": "refuse_negated", "query": "q", "answers": []},
        {"id": "f", "category": "refuse", "query": "q", "answers": []},                 # no kind
        {"id": "g", "history": [{"query": "q", "answers": [call("set_timer", minutes=5)]}],
         "results": [{"ok": True}], "answers": []},
    ]
    preds = [
        [call("set_thermostat", temperature=21)],                                   # value wrong
        [call("set_light", room="kitchen", on=True, brightness=3)],                 # one missed, keys wrong
        [], [call("set_alarm", time="07:00")], [], [], [],
    ]
    forced = [[call("set_thermostat", temperature=20)], [call("set_light", room="kitchen", on=True)],
              None, None, None, None, None]
    records = [ev.score_case(c, p, TOOLS, forced=f) for c, p, f in zip(cases, preds, forced)]
    assert records[6]["category"] == "followup" and records[6]["followup"]
    assert records[6]["query"] == '[{"ok": true}]'
    s = ev.summarize(records)
    comp = s["components"]
    assert comp["arguments"] == {"calls": 3, "named": 2, "keys": 1, "values": 0, "name_accuracy": 2 / 3,
                                 "key_accuracy": 0.5, "value_accuracy": 0.0}
    assert comp["refusals_by_kind"] == {
        "followup": {"cases": 1, "correct": 1, "accuracy": 1.0},
        "refuse": {"cases": 1, "correct": 1, "accuracy": 1.0},
        "refuse_missing_value": {"cases": 2, "correct": 1, "accuracy": 0.5},
        "refuse_negated": {"cases": 1, "correct": 1, "accuracy": 1.0}}
    assert comp["followup"] == {"cases": 1, "correct": 1, "accuracy": 1.0}
    # b's forced call names set_light, its first expected call is set_thermostat
    assert comp["forced_name"] == {"cases": 2, "correct": 1, "accuracy": 0.5}
    # the keys the summary had before the components are all still there
    assert {"cases", "categories", "correct", "accuracy", "schema_valid", "refusal_confusion",
            "refusal_accuracy", "errors", "latency_ms"} <= set(s)
    text = ev.format_summary(s)
    assert "tool choice with a call required: 1/2 50.0%" in text
    assert "keys right 1/2 50.0%" in text and "refuse_missing_value 1/2" in text
    assert "follow-ups: 1/1 100.0%" in text
    # without forced runs and follow-ups those components are None, not zero
    plain = ev.summarize([ev.score_case(c, p, TOOLS) for c, p in zip(cases[:2], preds[:2])])
    assert plain["components"]["forced_name"] is None and plain["components"]["followup"] is None
    assert "call required" not in ev.format_summary(plain)


def test_load_cases_checks_the_followup_shape(tmp_path):
    timer = call("set_timer", minutes=5)
    good = [
        {"id": "1", "history": [{"query": "timer", "answers": [timer]}], "results": [{"ok": True}],
         "answers": []},
        {"id": "2", "history": [{"query": "timer", "answers": [timer], "results": [{"ok": True}]}],
         "query": "and another", "answers": [timer]},
    ]
    path = tmp_path / "good.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in good))
    assert ev.load_cases(path) == good
    bad = [
        ({"results": [{"ok": True}], "answers": []}, "last history turn"),
        ({"history": [{"query": "hi", "answers": []}], "results": [], "answers": []}, "last history turn"),
        ({"history": [{"query": "timer", "answers": [timer], "results": ["ok"]}], "results": ["ok"],
          "answers": []}, "last history turn"),
        ({"history": [{"query": "hi", "answers": [], "results": ["ok"]}], "query": "x", "answers": []},
         "'results' but no calls"),
        ({"history": [{"answers": []}], "query": "x", "answers": []}, "history turn 0"),
        ({"history": "timer", "query": "x", "answers": []}, "'history' must be a list"),
        ({"query": "x", "results": [], "answers": []}, "either 'query' or 'results'"),
        ({"query": "x", "answers": [{"arguments": {}}]}, "'answers' must be a list"),
    ]
    for n, (case, match) in enumerate(bad):
        path = tmp_path / f"bad{n}.jsonl"
        path.write_text(json.dumps(case) + "\n")
        with pytest.raises(ValueError, match=f"bad{n}.jsonl:1: .*{match}"):
            ev.load_cases(path)


WEATHER = {"name": "get_weather", "description": "Get the weather forecast for a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}


def test_components_force_a_call_where_the_normal_run_refuses(tmp_path, capsys):
    """--components decodes each case with calls a second time with a call required.  A
    question no tool answers, labelled with a call so that it is run: the default model
    refuses it, and the forced turn calls the only tool there is."""
    cases = [{"id": "w", "category": "single", "tools": [WEATHER], "query": "What is the capital of France?",
              "answers": [call("get_weather", city="Paris")]},
             {"id": "r", "category": "refuse", "tools": [WEATHER], "query": "tell me a joke", "answers": []}]
    data = tmp_path / "cases.jsonl"
    data.write_text("".join(json.dumps(c) + "\n" for c in cases))
    out = tmp_path / "records.jsonl"
    assert ev.main(["--data", str(data), "--json", "--components", "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert records[0]["predicted"] == [] and not records[0]["correct"]
    assert records[0]["forced"] and records[0]["forced"][0]["name"] == "get_weather"
    assert records[0]["forced_correct"] is True
    assert "forced" not in records[1]                    # a refusal case is not forced
    assert summary["components"]["forced_name"] == {"cases": 1, "correct": 1, "accuracy": 1.0}
    # without the flag no turn is forced
    assert ev.main(["--data", str(data), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["components"]["forced_name"] is None


FOLLOWUPS = Path(__file__).resolve().parent.parent / "benchmarks" / "cases" / "followups_home.jsonl"


def test_the_home_followup_cases_replay_on_the_default_agent(capsys):
    """The packaged follow-up cases: 20, each a valid history on the smart-home catalogue
    (every call schema-valid and on a tool the agent selects for the first request, or
    add_turn would refuse it and the case would be an error), then the results of its
    calls, answered with no call."""
    cases = ev.load_cases(FOLLOWUPS)
    assert len(cases) == 20 and len({c["id"] for c in cases}) == 20
    tools = json.loads(ev.DEFAULT_TOOLS.read_text())
    for case in cases:
        assert case["answers"] == [] and ev.default_category(case) == "followup"
        for turn in case["history"]:
            assert ev.schema_valid(turn["answers"], tools), case["id"]
        assert len(case["results"]) == len(case["history"][-1]["answers"])
    records = ev.run_cases(cases, tools)
    assert [r["error"] for r in records] == [None] * 20
    s = ev.summarize(records)
    assert s["components"]["followup"]["cases"] == 20 and s["categories"]["followup"]["cases"] == 20
