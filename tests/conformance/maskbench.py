"""MaskBench harness: compile each schema, feed every instance compactly serialised.

Used by tests/conformance/test_maskbench.py (a deterministic subset, fast) and as a
script for the full run:  python tests/conformance/maskbench.py [--backend python] [--limit N]
"""
import argparse
import collections
import gzip
import json
import os
import sys
import time
from pathlib import Path

from needle_cy.errors import GrammarLimitError, SchemaError, UnsupportedSchemaError
from needle_cy.grammar import compile_schema


def load(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def source_of(case_id):
    head = case_id.split("---")[0]
    if head.startswith("BFCL"):
        return "BFCL"
    return head.rsplit("_", 1)[0] if head[-1:].isdigit() and "_" in head else head


def serialise(value):
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


def run_case(case, backend):
    """Returns (status, reason, wrongly_accepted list)."""
    try:
        g = compile_schema(case["schema"], backend=backend)
    except UnsupportedSchemaError as exc:
        return "unsupported", f"unsupported: {exc.keyword}", []
    except GrammarLimitError as exc:
        return "limit", f"limit: {str(exc)[:60]}", []
    except SchemaError as exc:
        return "schema_error", f"schema error: {str(exc)[:60]}", []
    except RecursionError:
        return "limit", "limit: recursion", []
    bad_accept, bad_reject = [], 0
    for t in case["tests"]:
        try:
            data = serialise(t["data"])
        except ValueError:
            continue
        ok = g.accepts(data)
        if ok and not t["valid"]:
            bad_accept.append(data)
        if not ok and t["valid"]:
            bad_reject += 1
    if bad_accept:
        return "unsound", "accepted an invalid instance", bad_accept
    if bad_reject:
        return "rejects_valid", "rejected a valid instance", []
    return "pass", "", []


def run(cases, backend="cython"):
    per_source = collections.defaultdict(collections.Counter)
    reasons = collections.Counter()
    unsound = []
    results = {}
    for case in cases:
        status, reason, bad = run_case(case, backend)
        src = source_of(case["id"])
        per_source[src][status] += 1
        results[case["id"]] = status
        if reason:
            reasons[reason] += 1
        if bad:
            unsound.append((case["id"], bad))
    return per_source, reasons, unsound, results


def report(per_source, reasons, out=sys.stdout):
    total = collections.Counter()
    print(f"{'source':<28}{'schemas':>8}{'pass':>7}{'rate':>8}  unsupported  limit  rejects_valid  unsound", file=out)
    for src in sorted(per_source, key=lambda s: -sum(per_source[s].values())):
        c = per_source[src]
        n = sum(c.values())
        total.update(c)
        print(f"{src:<28}{n:>8}{c['pass']:>7}{100 * c['pass'] / n:>7.1f}%  {c['unsupported']:>11}"
              f"{c['limit']:>7}{c['rejects_valid']:>15}{c['unsound']:>9}", file=out)
    n = sum(total.values())
    print(f"{'TOTAL':<28}{n:>8}{total['pass']:>7}{100 * total['pass'] / max(n, 1):>7.1f}%  "
          f"{total['unsupported']:>11}{total['limit']:>7}{total['rejects_valid']:>15}{total['unsound']:>9}", file=out)
    print("top failure reasons:", file=out)
    for r, k in reasons.most_common(15):
        print(f"  {k:>5}  {r}", file=out)
    return total


def main(argv=None):
    ap = argparse.ArgumentParser()
    # the data sits in ../shared beside the repository, or beside NEEDLE_CY_FIXTURES' folder
    # (as tests/conftest.py finds it: a git worktree elsewhere sets that variable)
    fixtures = os.environ.get("NEEDLE_CY_FIXTURES")
    shared = Path(fixtures).parent if fixtures else Path(__file__).resolve().parents[3] / "shared"
    ap.add_argument("--path", default=str(shared / "eval" / "jsonschema" / "maskbench_public.jsonl.gz"))
    ap.add_argument("--backend", default="cython")
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--every", type=int, default=1)
    ap.add_argument("--failures", default="")
    args = ap.parse_args(argv)
    cases = load(args.path)[:: args.every]
    if args.limit:
        cases = cases[: args.limit]
    t0 = time.perf_counter()
    per_source, reasons, unsound, results = run(cases, args.backend)
    dt = time.perf_counter() - t0
    report(per_source, reasons)
    print(f"{len(cases)} schemas in {dt:.1f} s ({args.backend})")
    if args.failures:
        with open(args.failures, "w") as f:
            json.dump(results, f)
    for cid, bad in unsound[:20]:
        print("UNSOUND", cid, bad[:2])
    return 1 if unsound else 0


if __name__ == "__main__":
    sys.exit(main())
