"""MaskBench (JSONSchemaBench) public suite through the grammar.

Rule zero is a hard assertion: no schema that compiles may accept an invalid
instance.  The pass rate (compiles + every valid accepted + every invalid
rejected) is printed with a per-source table; the full 5,636-schema run takes a
few minutes, so the test runs a deterministic subset (every 20th schema) and the
full run is ``python tests/conformance/maskbench.py`` (figures in
benchmarks/history/grammar.md).
"""
import sys
from pathlib import Path

from conftest import shared_path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import maskbench  # noqa: E402

EVERY = 20


def test_maskbench_subset(capsys):
    path = shared_path("eval", "jsonschema", "maskbench_public.jsonl.gz")
    cases = maskbench.load(path)[::EVERY]
    per_source, reasons, unsound, _ = maskbench.run(cases, "cython")
    with capsys.disabled():
        print()
        total = maskbench.report(per_source, reasons)
    assert not unsound, f"rule zero: invalid instances accepted: {unsound[:5]}"
    n = sum(total.values())
    # the suite must mostly compile and pass; a regression below 80% on the subset is a failure
    assert total["pass"] / n >= 0.80, f"pass rate {total['pass'] / n:.1%}"
