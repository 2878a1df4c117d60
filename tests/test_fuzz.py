"""The fuzz harness (tests/fuzz_harness.py) on a short, seeded budget.

Each target must hold for every input: named errors only, no crash, and for the grammar
rule zero against jsonschema (0 false accepts) plus Cython = Python runtime.  The long
campaign command is in the harness docstring and docs/testing.md.
"""
import pytest

import fuzz_harness as fh


@pytest.mark.parametrize("target,cases,expect", [
    ("archive", 150, ("refused", "opened")),
    ("tokenizer_record", 200, ("refused", "parsed")),
    ("encoder", 150, ("encoded",)),
    ("model_inputs", 150, ("refused", "ran")),
    ("untrusted_text", 30, ("held",)),
])
def test_fuzz_target_short_budget(target, cases, expect):
    counts = fh.run_random(target, cases, seed=19)
    assert sum(counts.values()) == cases
    for outcome in expect:   # both branches of each target were really exercised
        assert counts.get(outcome, 0) > 0, counts


def test_fuzz_grammar_differential_short_budget():
    stats = fh.GrammarStats()
    fh.run_random("grammar", 24, seed=19, stats=stats)
    assert stats.schemas == 24 and stats.compiled >= 15
    assert stats.docs >= 600 and stats.accepted >= 150, stats.line()


def test_harness_detects_a_false_accept(monkeypatch):
    """The differential really judges: a grammar that accepts everything is caught."""
    import needle_cy.grammar as grammar

    class AcceptAll:
        def __init__(self, real):
            self.real = real

        def accepts(self, data):
            return True

        def start(self):
            return self.real.start()

    real = grammar.compile_schema
    monkeypatch.setattr(grammar, "compile_schema", lambda s, backend="cython": AcceptAll(real(s, backend)))
    with pytest.raises(fh.Finding, match="FALSE ACCEPT|not JSON|disagree"):
        fh.run_random("grammar", 30, seed=19, stats=fh.GrammarStats())


def test_harness_detects_a_forged_marker(monkeypatch):
    """The untrusted-text target really judges: an encoder that turns marker spellings
    in outside text into marker ids (the spec encoding everywhere) is caught."""
    from needle_cy.tokenizer import Tokenizer

    real = Tokenizer.encode
    monkeypatch.setattr(Tokenizer, "encode",
                        lambda self, text, dummy_prefix=True, allowed_special=None:
                        real(self, text, dummy_prefix, allowed_special="all"))
    with pytest.raises(fh.Finding, match="where the template puts"):
        fh.run_random("untrusted_text", 10, seed=19)


@pytest.mark.parametrize("cut", [0, 1, 5, 306, 399])
@pytest.mark.parametrize("then", [0, 1, 3])
def test_archive_mutations_after_a_truncation(cut, then):
    """Each mutation reads the blob's length as it is: after a truncation to fewer bytes than
    the header, the directory or the tokenizer record, a header write or a tail flip once
    raised struct.error / IndexError inside the harness (seeds 4243-4246)."""
    import struct
    # Src choices: 3 mutations; truncation at `cut`; then `then` twice, every further choice
    # the largest offset / edge value the mutation can draw
    words = [2, 2, cut, then, 2 ** 32 - 1, 2 ** 32 - 1, 2 ** 32 - 1, then] + [2 ** 32 - 1] * 16
    data = struct.pack(f"<{len(words)}I", *words)
    assert fh.archive_target(data) in ("refused", "opened")


def test_campaign_collects_every_finding_by_shape(monkeypatch, tmp_path):
    """The campaign does not stop at the first finding: every one is counted, deduplicated
    by its shape key, and the smallest example of each shape becomes a reproducer that
    replays (here a target that fails in two ways on known inputs)."""
    import json

    def flaky(data):
        if data[0] % 7 == 0:
            raise fh.Finding("FALSE ACCEPT: seeded for the test " + "x" * (data[1] % 5))
        if data[0] % 11 == 0:
            return [][data[0]]      # IndexError, a crash
        return "encoded"

    monkeypatch.setitem(fh.TARGETS, "encoder", flaky)
    summary = fh.campaign("encoder", [11, 12], goal=1200, workers=2, budget_s=120, findings_dir=tmp_path,
                          log=lambda m: None)
    datas = [fh.case_bytes("encoder", s, i) for s in (11, 12) for i in range(summary["per_seed_cases"][s])]
    sevens = sum(d[0] % 7 == 0 for d in datas)
    elevens = sum(d[0] % 7 != 0 and d[0] % 11 == 0 for d in datas)
    assert summary["cases"] == len(datas) >= 1200
    assert summary["findings"] == sevens + elevens and sevens > 1 and elevens > 1
    assert sorted(summary["shapes"].values()) == sorted([sevens, elevens])
    assert len(summary["reproducers"]) == 2
    crash = [p for p in summary["reproducers"] if "IndexError" in open(p).read()]
    rec = json.loads(open(crash[0]).read())
    assert rec["key"].startswith("encoder | crash | IndexError") and rec["count"] == elevens
    with pytest.raises(IndexError):
        fh.replay(crash[0])


def test_grammar_target_runs_on_either_runtime():
    for backend in ("cython", "python"):
        stats = fh.GrammarStats()
        for i in range(6):
            fh.grammar_target(fh.case_bytes("grammar", 19, i), stats, backend=backend)
        assert stats.schemas == 6 and stats.docs > 50
