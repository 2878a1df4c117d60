"""Evaluation harness: run the agent on labelled cases and score exact-match calls.

    python -m needle_cy.eval --data FILE.jsonl [--tools tools.json] [--model m.cact] [--json]

Case format (one JSON object per line, as in ../shared/eval/home_dev.jsonl):
``{"id", "category", "query", "answers": [{"name", "arguments"}], "tools"?}``; a case's
own ``"tools"`` list overrides the catalogue given by ``--tools`` (default: the
packaged smart-home catalogue).

Scoring follows the dev set's README: a case is correct when the predicted call list
equals the expected one exactly (same length and order, names, argument keys and
values; numbers compared by value, so 21 == 21.0, but booleans are not numbers).
Reported: accuracy per category and overall, schema validity (every predicted call
names a tool of the case and its arguments validate against that tool's
``parameters`` under JSON Schema Draft 2020-12, format checking off), the refusal
confusion matrix, and latency: the wall time of ``agent.complete`` per case (for a
single greedy completion the first call is complete when the completion is, so this
is the time to first call; for multi-call cases it is the time to the last call).
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


def score_case(case, predicted, tools, latency_s=None, error=None, _cache=None):
    """One scored record: the case id/category, the prediction and its verdicts."""
    expected = case.get("answers", [])
    return {
        "id": case.get("id"),
        "category": case.get("category", "refuse" if not expected else "single"),
        "query": case.get("query"),
        "expected": expected,
        "predicted": predicted,
        "correct": calls_equal(expected, predicted),
        "schema_valid": schema_valid(predicted, tools, _cache),
        "latency_s": latency_s,
        "error": error,
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
    return out


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
            if "query" not in case or "answers" not in case:
                raise ValueError(f"{path}:{n}: a case needs 'query' and 'answers'")
            cases.append(case)
    return cases


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


def run_cases(cases, tools, model=None, threads=None, include_suppressed=False, progress=None,
              backend=None, ground_values=True, prefix_checkpoint_mb=None,
              query_expansion="default", max_retrieved_tools=None, ground_notes=True,
              negation_gate=True):
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
            if threads:
                kwargs["threads"] = threads
            if backend:
                kwargs["backend"] = backend
            agent = agents[key] = Needle(**kwargs)
        agent.reset()
        error, predicted, latency = None, None, None
        t0 = time.perf_counter()
        try:
            response = agent.complete(case["query"])
            latency = time.perf_counter() - t0
            predicted = predicted_calls(response, include_suppressed)
        except Exception as exc:  # a failed case is scored wrong, the run goes on
            latency = time.perf_counter() - t0
            error = f"{type(exc).__name__}: {exc}"
        records.append(score_case(case, predicted, case_tools, latency, error, cache))
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
    parser.add_argument("--no-query-expansion", action="store_true",
                        help="BM25 retrieval on the request's own words (no learned expansion)")
    parser.add_argument("--no-negation-gate", action="store_true",
                        help="keep calls the request negates (\"Cancel my alarm\" -> set_alarm)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each wrong case")
    args = parser.parse_args(argv)

    with open(args.tools, encoding="utf-8") as handle:
        tools = json.load(handle)
    cases = load_cases(args.data)
    if args.limit:
        cases = cases[:args.limit]

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
                        ground_notes=not (args.no_grounding or args.no_note_grounding))
    summary = summarize(records)
    summary["grounding"] = not args.no_grounding
    summary["note_grounding"] = not (args.no_grounding or args.no_note_grounding)
    summary["prefix_checkpoint_mb"] = args.prefix_checkpoint_mb
    summary["query_expansion"] = not args.no_query_expansion
    summary["max_retrieved_tools"] = args.max_retrieved_tools
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
