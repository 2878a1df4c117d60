"""The evaluation scorer on hand-made predictions (no model needed)."""
import json

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
