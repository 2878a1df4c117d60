"""Evaluation harness: run the agent on labelled cases and score exact-match calls.

    python -m needle_cy.eval --data FILE.jsonl [--tools tools.json] [--model m.cact] [--json]
                             [--components]
    python -m needle_cy.eval --naturalness --data FILE.jsonl [--tools tools.json] [--json]

Case format (one JSON object per line, as in ../shared/eval/home_dev.jsonl):
``{"id", "category", "query", "answers": [{"name", "arguments"}], "tools"?, "kind"?}``; a
case's own ``"tools"`` list overrides the catalogue given by ``--tools`` (default: the
packaged smart-home catalogue).  ``kind`` is a finer label of the case (the held-out cases
of ``python -m needle_cy.training.mix --eval-cases`` carry one: ``refuse_missing_value``…).

Follow-up cases: ``"history"`` lists the earlier turns of the conversation, each
``{"query", "answers", "results"?}`` (the training data's shape, ``needle_cy.training.data``):
the request, the assistant's answer to it, and optionally the tool results of those calls
(then answered ``[]``).  The history is put into the conversation as given
(``Needle.add_turn``: the model decodes none of it), then the case's own turn is decoded.
That turn is a new request (``"query"``), or, in place of ``"query"``, ``"results"``: the
results of the last history turn's calls, one per call, as ``Needle.run`` feeds a tool's
return values back (a list, or its JSON text).  So "Lock the front door" → ``lock_door`` →
``"results": [{"locked": true}]`` with ``"answers": []`` asks whether the model knows that
the job is done::

    {"id": "f01", "category": "followup",
     "history": [{"query": "Lock the front door.",
                  "answers": [{"name": "lock_door", "arguments": {"door": "front door"}}]}],
     "results": [{"door": "front door", "locked": true}], "answers": []}

A case with a history and no category is in the category ``followup``.

Scoring follows the dev set's README: a case is correct when the predicted call list
equals the expected one exactly (same length and order, names, argument keys and
values; numbers compared by value, so 21 == 21.0, but booleans are not numbers).
Reported: accuracy per category and overall, schema validity (every predicted call
names a tool of the case and its arguments validate against that tool's
``parameters`` under JSON Schema Draft 2020-12, format checking off), the refusal
confusion matrix, and latency: the wall time of ``agent.complete`` per case (for a
single greedy completion the first call is complete when the completion is, so this
is the time to first call; for multi-call cases it is the time to the last call).

Components (``summary["components"]``), to see which part of a call goes wrong:

* ``arguments``: over the expected calls of the cases with calls, each matched with the
  first unmatched predicted call of the same name (so a missed first call does not
  shift the others): ``named`` (such a call exists), ``keys`` (its argument keys are the
  expected set, of the named), ``values`` (every value equal too, of those with the
  right keys);
* ``refusals_by_kind``: the refusal accuracy of the cases whose answer is ``[]``, per
  ``kind`` where a case has one, else per category;
* ``followup``: the accuracy of the cases with a history;
* ``forced_name`` (only with ``--components``, as it decodes every case with calls a
  second time): the same turn decoded with ``require_call=True``, where the model must
  call a tool; correct when that first call (kept or held back) names the first expected
  tool.  It measures the choice of tool apart from the choice to call at all.

``--naturalness`` reports, without a model, how lexically close a case set's requests
sit to their tools (``needle_cy.training.naturalness``).
"""
import argparse
import json
import math
import sys
import time
from pathlib import Path

DEFAULT_TOOLS = Path(__file__).resolve().parent / "models" / "home_tools.json"


# ------------------------------------------------------------------ scoring ---

def canonical(value):
    """A hashable form in which numbers compare by value and bools stay distinct."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, (int, float)):
        return ("num", float(value))
    if isinstance(value, str):
        return ("str", value)
    if value is None:
        return ("null",)
    if isinstance(value, (list, tuple)):
        return ("list", tuple(canonical(v) for v in value))
    if isinstance(value, dict):
        return ("obj", tuple(sorted((str(k), canonical(v)) for k, v in value.items())))
    raise TypeError(f"not a JSON value: {value!r}")


def calls_equal(expected, predicted):
    """Exact match of two call lists (order matters; argument key order does not)."""
    if predicted is None or len(expected) != len(predicted):
        return False
    for want, got in zip(expected, predicted):
        if not isinstance(got, dict):
            return False
        if want.get("name") != got.get("name"):
            return False
        try:
            if canonical(want.get("arguments") or {}) != canonical(got.get("arguments") or {}):
                return False
        except TypeError:
            return False
    return True


def _validator(schema):
    from jsonschema import Draft202012Validator
    return Draft202012Validator(schema)


def schema_valid(predicted, tools, _cache=None):
    """True when every predicted call names one of ``tools`` and validates against it."""
    if predicted is None or not isinstance(predicted, list):
        return False
    by_name = {t["name"]: t for t in tools}
    for call in predicted:
        if not isinstance(call, dict) or call.get("name") not in by_name:
            return False
        args = call.get("arguments", {})
        if not isinstance(args, dict):
            return False
        schema = by_name[call["name"]].get("parameters") or {"type": "object"}
        key = json.dumps(schema, sort_keys=True)
        validator = None
        if _cache is not None:
            validator = _cache.get(key)
        if validator is None:
            validator = _validator(schema)
            if _cache is not None:
                _cache[key] = validator
        if not validator.is_valid(args):
            return False
    return True


def default_category(case):
    if case.get("category"):
        return case["category"]
    if case.get("history"):
        return "followup"
    return "single" if case.get("answers") else "refuse"


def turn_text(case):
    """The text of a case's own turn: its request, or the JSON text of its tool results."""
    if "results" in case:
        results = case["results"]
        return results if isinstance(results, str) else json.dumps(results)
    return case.get("query")


def score_case(case, predicted, tools, latency_s=None, error=None, _cache=None, forced=None):
    """One scored record: the case id/category, the prediction and its verdicts.
    ``forced``: the calls of the same turn decoded with a call required (or None when
    that was not run), scored into ``forced_correct``."""
    expected = case.get("answers", [])
    rec = {
        "id": case.get("id"),
        "category": default_category(case),
        "kind": case.get("kind"),
        "followup": bool(case.get("history")),
        "query": turn_text(case),
        "expected": expected,
        "predicted": predicted,
        "correct": calls_equal(expected, predicted),
        "schema_valid": schema_valid(predicted, tools, _cache),
        "latency_s": latency_s,
        "error": error,
    }
    if forced is not None:
        rec["forced"] = forced
        rec["forced_correct"] = bool(expected and forced and isinstance(forced[0], dict)
                                     and forced[0].get("name") == expected[0].get("name"))
    return rec


def argument_components(expected, predicted):
    """(named, keys, values) counts for one case: each expected call matched with the
    first unmatched predicted call of its name."""
    named = keys = values = 0
    pool = [c for c in (predicted or []) if isinstance(c, dict)]
    for want in expected:
        got = next((c for c in pool if c.get("name") == want.get("name")), None)
        if got is None:
            continue
        pool.remove(got)
        named += 1
        want_args, got_args = want.get("arguments") or {}, got.get("arguments") or {}
        if not isinstance(got_args, dict) or set(want_args) != set(got_args):
            continue
        keys += 1
        try:
            values += canonical(want_args) == canonical(got_args)
        except TypeError:
            pass
    return named, keys, values


def _share(correct, total):
    return {"cases": total, "correct": correct, "accuracy": correct / total if total else None}


def components(records):
    """The components of ``summarize`` (see the module docstring)."""
    calls = named = keys = values = 0
    for rec in records:
        if rec["expected"]:
            n, k, v = argument_components(rec["expected"], rec["predicted"])
            calls += len(rec["expected"])
            named, keys, values = named + n, keys + k, values + v
    arguments = {"calls": calls, "named": named, "keys": keys, "values": values,
                 "name_accuracy": named / calls if calls else None,
                 "key_accuracy": keys / named if named else None,
                 "value_accuracy": values / keys if keys else None}
    by_kind = {}
    for rec in records:
        if not rec["expected"]:
            kind = rec.get("kind") or rec["category"]
            tally = by_kind.setdefault(kind, [0, 0])
            tally[0] += not rec["predicted"]
            tally[1] += 1
    follow = [r for r in records if r.get("followup")]
    forced = [r for r in records if "forced_correct" in r]
    return {
        "arguments": arguments,
        "refusals_by_kind": {k: _share(c, n) for k, (c, n) in sorted(by_kind.items())},
        "followup": _share(sum(bool(r["correct"]) for r in follow), len(follow)) if follow else None,
        "forced_name": (_share(sum(r["forced_correct"] for r in forced), len(forced))
                        if forced else None),
    }


def _percentile(values, q):
    if not values:
        return None
    values = sorted(values)
    pos = (len(values) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


def summarize(records):
    """Accuracy per category and overall, schema validity, refusal confusion, latency."""
    out = {"cases": len(records), "categories": {}}
    for rec in records:
        cat = out["categories"].setdefault(rec["category"], {"cases": 0, "correct": 0})
        cat["cases"] += 1
        cat["correct"] += bool(rec["correct"])
    for cat in out["categories"].values():
        cat["accuracy"] = cat["correct"] / cat["cases"]
    correct = sum(bool(r["correct"]) for r in records)
    out["correct"] = correct
    out["accuracy"] = correct / len(records) if records else 0.0
    out["schema_valid"] = (sum(bool(r["schema_valid"]) for r in records) / len(records)
                           if records else 0.0)
    # refusal confusion: expected refusal ([]) vs predicted refusal ([] or no answer)
    conf = {"refuse_as_refuse": 0, "refuse_as_call": 0, "call_as_refuse": 0, "call_as_call": 0}
    for rec in records:
        want_refuse = len(rec["expected"]) == 0
        got_refuse = not rec["predicted"]
        key = ("refuse" if want_refuse else "call") + "_as_" + ("refuse" if got_refuse else "call")
        conf[key] += 1
    out["refusal_confusion"] = conf
    n_refuse = conf["refuse_as_refuse"] + conf["refuse_as_call"]
    out["refusal_accuracy"] = conf["refuse_as_refuse"] / n_refuse if n_refuse else None
    out["errors"] = sum(1 for r in records if r.get("error"))
    lat = [r["latency_s"] for r in records if r.get("latency_s") is not None]
    call_lat = [r["latency_s"] for r in records
                if r.get("latency_s") is not None and r["predicted"]]
    out["latency_ms"] = {
        "median": None if not lat else round(1000 * _percentile(lat, 0.5), 1),
        "p90": None if not lat else round(1000 * _percentile(lat, 0.9), 1),
        "first_call_median": None if not call_lat else round(1000 * _percentile(call_lat, 0.5), 1),
        "first_call_p90": None if not call_lat else round(1000 * _percentile(call_lat, 0.9), 1),
    }
    out["components"] = components(records)
    return out


def _pct(share):
    return "-" if share is None else f"{100 * share:.1f}%"


def format_components(comp):
    lines = ["components:"]
    forced = comp.get("forced_name")
    if forced is not None:
        lines.append(f"  tool choice with a call required: {forced['correct']}/{forced['cases']} "
                     f"{_pct(forced['accuracy'])}")
    a = comp["arguments"]
    if a["calls"]:
        lines.append(f"  expected calls {a['calls']}: named {a['named']} {_pct(a['name_accuracy'])}; "
                     f"keys right {a['keys']}/{a['named']} {_pct(a['key_accuracy'])}; "
                     f"values right {a['values']}/{a['keys']} {_pct(a['value_accuracy'])}")
    if comp["refusals_by_kind"]:
        lines.append("  refusals by kind: " + ", ".join(
            f"{k} {v['correct']}/{v['cases']}" for k, v in comp["refusals_by_kind"].items()))
    follow = comp.get("followup")
    if follow is not None:
        lines.append(f"  follow-ups: {follow['correct']}/{follow['cases']} {_pct(follow['accuracy'])}")
    return lines


def format_summary(summary, model=None):
    lines = []
    if model:
        lines.append(f"model: {model}")
    lines.append(f"{'category':<10} {'cases':>5} {'correct':>7} {'accuracy':>9}")
    for name in sorted(summary["categories"]):
        c = summary["categories"][name]
        lines.append(f"{name:<10} {c['cases']:>5} {c['correct']:>7} {100 * c['accuracy']:>8.1f}%")
    lines.append(f"{'overall':<10} {summary['cases']:>5} {summary['correct']:>7} "
                 f"{100 * summary['accuracy']:>8.1f}%")
    lines.append(f"schema-valid outputs: {100 * summary['schema_valid']:.1f}%")
    c = summary["refusal_confusion"]
    lines.append("refusals (rows: expected, cols: predicted)   refuse   call")
    lines.append(f"  refuse {c['refuse_as_refuse']:>40} {c['refuse_as_call']:>6}")
    lines.append(f"  call   {c['call_as_refuse']:>40} {c['call_as_call']:>6}")
    lat = summary["latency_ms"]
    if lat["median"] is not None:
        lines.append(f"latency per case: median {lat['median']} ms, p90 {lat['p90']} ms; "
                     f"time to first call (cases with calls): median {lat['first_call_median']} ms, "
                     f"p90 {lat['first_call_p90']} ms")
    if summary.get("errors"):
        lines.append(f"errors: {summary['errors']}")
    if summary.get("components"):
        lines.extend(format_components(summary["components"]))
    return "\n".join(lines)


# ------------------------------------------------------------------- running ---

def load_cases(path):
    cases = []
    with open(path, encoding="utf-8") as handle:
        for n, line in enumerate(handle, 1):
            line = line.strip()
            if not line:
                continue
            try:
                case = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not JSON ({exc.msg})") from None
            problem = case_problem(case)
            if problem:
                raise ValueError(f"{path}:{n}: {problem}")
            cases.append(case)
    return cases


def _is_calls(value):
    return isinstance(value, list) and all(isinstance(c, dict) and isinstance(c.get("name"), str)
                                           for c in value)


def case_problem(case):
    """What is wrong with a case's shape (see the module docstring), or None."""
    if not isinstance(case, dict):
        return "a case is a JSON object"
    if "answers" not in case or ("query" in case) == ("results" in case):
        return "a case needs 'answers' and either 'query' or 'results'"
    if not _is_calls(case["answers"]):
        return "'answers' must be a list of {\"name\", \"arguments\"} calls"
    history = case.get("history", [])
    if not isinstance(history, list):
        return "'history' must be a list of turns"
    for i, turn in enumerate(history):
        if not (isinstance(turn, dict) and isinstance(turn.get("query"), str)
                and _is_calls(turn.get("answers"))):
            return (f"history turn {i} needs a 'query' and its 'answers' (a list of "
                    f"{{\"name\", \"arguments\"}} calls)")
        if "results" in turn and not turn["answers"]:
            return f"history turn {i} has 'results' but no calls"
    if "results" in case and not (history and history[-1]["answers"] and "results" not in history[-1]):
        return ("'results' are the tool results of the last history turn's calls: that turn "
                "needs calls and no 'results' of its own")
    return None


def predicted_calls(response, include_suppressed=False):
    """The call list of an agent response (dict envelope or object with the fields)."""
    get = response.get if isinstance(response, dict) else (lambda k, d=None: getattr(response, k, d))
    calls = get("function_calls", None)
    if calls is None:
        calls = []
    calls = [{"name": c.get("name"), "arguments": c.get("arguments", {})} if isinstance(c, dict) else c
             for c in calls]
    if include_suppressed and not calls:
        calls = list(get("suppressed_calls", None) or [])
    return calls


def replay_history(agent, case):
    """Put the case's earlier turns into the agent's (reset) conversation as given."""
    for turn in case.get("history") or []:
        agent.add_turn(turn["query"], turn["answers"])
        if "results" in turn:
            agent.add_turn(turn["results"], [])


def turn_input(case):
    """What the case's own turn gives the agent: its request, or its tool results."""
    return case["results"] if "results" in case else case["query"]


def run_cases(cases, tools, model=None, threads=None, include_suppressed=False, progress=None,
              backend=None, ground_values=True, prefix_checkpoint_mb=None,
              query_expansion="default", max_retrieved_tools=None, ground_notes=True,
              negation_gate=True, components=False, tools_per_clause=None, name_prior=None):
    """Score every case (``score_case`` records).  ``components``: also decode each case
    with calls with a call required (``forced_name``).  ``tools_per_clause``: None the
    agent's default, 0 off (the agent's ``None``), else the agent's value; ``name_prior``
    likewise."""
    from needle_cy.agent import Needle

    agents = {}
    cache = {}
    records = []
    for i, case in enumerate(cases):
        case_tools = case.get("tools") or tools
        key = json.dumps(case_tools, sort_keys=True)
        agent = agents.get(key)
        if agent is None:
            kwargs = {"model": model, "tools": case_tools, "ground_values": ground_values,
                      "ground_notes": ground_notes, "negation_gate": negation_gate,
                      "query_expansion": query_expansion}
            if prefix_checkpoint_mb is not None:
                kwargs["prefix_checkpoint_mb"] = prefix_checkpoint_mb
            if max_retrieved_tools is not None:
                kwargs["max_retrieved_tools"] = max_retrieved_tools
            if tools_per_clause is not None:
                kwargs["tools_per_clause"] = tools_per_clause or None
            if name_prior is not None:
                kwargs["name_prior"] = name_prior or None
            if threads:
                kwargs["threads"] = threads
            if backend:
                kwargs["backend"] = backend
            agent = agents[key] = Needle(**kwargs)
        error, predicted, latency = None, None, None
        try:
            agent.reset()
            replay_history(agent, case)
            t0 = time.perf_counter()
            try:
                response = agent.complete(turn_input(case))
                predicted = predicted_calls(response, include_suppressed)
            finally:
                latency = time.perf_counter() - t0
        except Exception as exc:  # a failed case is scored wrong, the run goes on
            error = f"{type(exc).__name__}: {exc}"
        forced = None
        if components and case["answers"]:
            try:
                agent.reset()
                replay_history(agent, case)
                response = agent.complete(turn_input(case), require_call=True)
                forced = [{"name": c.get("name"), "arguments": c.get("arguments", {})}
                          for c in response["function_calls"] + response["suppressed_calls"]]
            except Exception:     # scored wrong, like a failed case
                forced = []
        records.append(score_case(case, predicted, case_tools, latency, error, cache, forced))
        if progress:
            progress(i + 1, len(cases), records[-1])
    return records


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m needle_cy.eval",
                                     description="Score a Needle model on labelled tool-call cases.")
    parser.add_argument("--data", required=True, help="JSONL cases")
    parser.add_argument("--tools", default=str(DEFAULT_TOOLS), help="tool catalogue (JSON list)")
    parser.add_argument("--model", default=None, help=".cact archive (default: the packaged model)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--out", help="write per-case records (JSONL) here")
    parser.add_argument("--limit", type=int, help="only the first N cases")
    parser.add_argument("--threads", type=int, help="engine threads (default: chosen per call)")
    parser.add_argument("--backend", choices=("cython", "numpy"), help="engine (default: the agent's)")
    parser.add_argument("--include-suppressed", action="store_true",
                        help="count suppressed (escalated) calls as predictions")
    parser.add_argument("--no-grounding", action="store_true",
                        help="decode string values and reasoning notes without grounding "
                             "(for comparison)")
    parser.add_argument("--no-note-grounding", action="store_true",
                        help="ground the call's values but not the <think> notes' quotes")
    parser.add_argument("--prefix-checkpoint-mb", type=float,
                        help="the agent's prefix checkpoint memory (0: every new tool selection "
                             "prefills its whole prefix, the cold latency)")
    parser.add_argument("--max-retrieved-tools", type=int,
                        help="tools the agent keeps in the prompt (default: the agent's, 5)")
    parser.add_argument("--tools-per-clause", type=int,
                        help="the prompt holds the best N tools of the request and of each "
                             "of its clauses (default: the agent's, off; 0: off)")
    parser.add_argument("--name-prior", type=float, metavar="ALPHA",
                        help="weight of the BM25 ranker's prior on each call's tool name "
                             "(default: the agent's, off; 0: off)")
    parser.add_argument("--no-query-expansion", action="store_true",
                        help="BM25 retrieval on the request's own words (no learned expansion)")
    parser.add_argument("--no-negation-gate", action="store_true",
                        help="keep calls the request negates (\"Cancel my alarm\" -> set_alarm)")
    parser.add_argument("--components", action="store_true",
                        help="also decode every case with calls with a call required and report "
                             "that tool choice (forced_name; the cases with calls take twice as long)")
    parser.add_argument("--naturalness", action="store_true",
                        help="no model: how close the requests' words sit to their tools' "
                             "(needle_cy.training.naturalness)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each wrong case")
    args = parser.parse_args(argv)

    with open(args.tools, encoding="utf-8") as handle:
        tools = json.load(handle)
    cases = load_cases(args.data)
    if args.limit:
        cases = cases[:args.limit]
    if args.naturalness:
        from needle_cy.training import naturalness
        figures = naturalness.measure(cases, tools)
        figures["data"] = args.data
        print(json.dumps(figures, indent=1) if args.json else naturalness.format_figures(figures))
        return 0

    def progress(i, n, rec):
        if args.verbose and not rec["correct"]:
            print(f"[{rec['id']}] {rec['query']!r}\n  want {json.dumps(rec['expected'])}\n"
                  f"  got  {json.dumps(rec['predicted'])}"
                  + (f"\n  error {rec['error']}" if rec["error"] else ""), file=sys.stderr)

    records = run_cases(cases, tools, args.model, args.threads, args.include_suppressed, progress,
                        args.backend, ground_values=not args.no_grounding,
                        prefix_checkpoint_mb=args.prefix_checkpoint_mb,
                        query_expansion=None if args.no_query_expansion else "default",
                        max_retrieved_tools=args.max_retrieved_tools,
                        negation_gate=not args.no_negation_gate,
                        ground_notes=not (args.no_grounding or args.no_note_grounding),
                        components=args.components, tools_per_clause=args.tools_per_clause,
                        name_prior=args.name_prior)
    summary = summarize(records)
    summary["grounding"] = not args.no_grounding
    summary["note_grounding"] = not (args.no_grounding or args.no_note_grounding)
    summary["prefix_checkpoint_mb"] = args.prefix_checkpoint_mb
    summary["query_expansion"] = not args.no_query_expansion
    summary["max_retrieved_tools"] = args.max_retrieved_tools
    summary["tools_per_clause"] = args.tools_per_clause
    summary["name_prior"] = args.name_prior
    summary["model"] = args.model or "default"
    summary["data"] = args.data
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            for rec in records:
                handle.write(json.dumps(rec, ensure_ascii=False) + "\n")
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print(format_summary(summary, args.model or "default"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
