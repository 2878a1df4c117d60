"""The learning-curve script (needle_cy.training.curve) on a tiny run's snapshots."""
import csv
import json

import pytest

torch = pytest.importorskip("torch", reason="torch is a training-only dependency (pip install '.[train]')")

from needle_cy.training import curve, torch_train  # noqa: E402

from test_torch_train import make_run  # noqa: E402


@pytest.fixture(scope="module")
def snap_run(tmp_path_factory):
    run = make_run(tmp_path_factory.mktemp("curve") / "run")
    spec = json.loads((run / "run.json").read_text())
    spec["hyper"].update(snapshot_every=5, log_every=5)
    (run / "run.json").write_text(json.dumps(spec))
    torch_train.fit(str(run), steps=15, threads=1)
    return run


def test_snapshots_are_listed_in_step_order(snap_run):
    assert [s for s, _ in curve.snapshots(snap_run)] == [5, 10, 15]
    assert curve.snapshots(snap_run / "nowhere") == []


def test_logged_target_ce_reads_the_log_near_the_step(snap_run):
    logged = [json.loads(line) for line in (snap_run / "log.jsonl").read_text().splitlines()]
    at10 = next(r["target_ce"] for r in logged if r.get("step") == 10)
    assert curve.logged_target_ce(snap_run, 10, window=1) == pytest.approx(at10)


def test_update_scores_each_new_snapshot_once(snap_run, tmp_path, monkeypatch):
    scored = []

    def fake_score(model_path, sets, tools, limit=None, components=False, tools_per_clause=None):
        scored.append(model_path.name)
        assert tools_per_clause is None
        assert model_path.exists() and model_path.stat().st_size > 0     # a real export
        return {name: 0.1 * len(scored) for name, _ in sets}

    monkeypatch.setattr(curve, "score_sets", fake_score)
    out = tmp_path / "curve"
    added = curve.update(str(snap_run), [("heldout", "x.jsonl")], out)
    assert [r["step"] for r in added] == [5, 10, 15]
    assert scored == ["step_5.cact", "step_10.cact", "step_15.cact"]
    assert curve.update(str(snap_run), [("heldout", "x.jsonl")], out) == []      # nothing new
    rows = list(csv.DictReader(open(out / "curve.csv")))
    assert [int(r["step"]) for r in rows] == [5, 10, 15]
    assert [int(r["tokens"]) for r in rows] == sorted(int(r["tokens"]) for r in rows)
    assert float(rows[-1]["heldout"]) == pytest.approx(0.3)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (out / "curve.png").stat().st_size > 1000


def test_update_passes_the_agents_selection_to_the_scoring(snap_run, tmp_path, monkeypatch):
    seen, real_score_sets = [], curve.score_sets
    def fake_score(model_path, sets, tools, limit=None, components=False, tools_per_clause=None):
        seen.append(tools_per_clause)
        return {}

    monkeypatch.setattr(curve, "score_sets", fake_score)
    curve.update(str(snap_run), [("heldout", "x.jsonl")], tmp_path / "c", every=3, tools_per_clause=1)
    assert seen == [1]
    passed = {}
    monkeypatch.setattr(curve.evaluation, "run_cases", lambda cases, tools, **kw: passed.update(kw) or [])
    monkeypatch.setattr(curve.evaluation, "load_cases", lambda path: [])
    monkeypatch.setattr(curve.evaluation, "summarize", lambda records: {"accuracy": 0.0, "categories": {},
                                                                        "schema_valid": 1.0})
    real_score_sets("m.cact", [("s", "x.jsonl")], [], tools_per_clause=1)
    assert passed["tools_per_clause"] == 1
