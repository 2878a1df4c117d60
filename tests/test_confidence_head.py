"""Post-hoc confidence head (needle_cy.training.confidence): the head a fit writes is read
by the engine with the layout the fit assumed, and nothing else in the archive changes."""
import numpy as np
import pytest

from needle_cy.archive import Archive
from needle_cy.model import Model
from needle_cy.testing import make_random_archive
from needle_cy.training import confidence


def _random_head(R, d, seed=0):
    rng = np.random.default_rng(seed)
    k, q = confidence.PROBES, confidence.QUERIES
    return {"probes": rng.normal(0, 1, (R, k, d)), "gain": rng.uniform(0.5, 1.5, (R, k)),
            "query": rng.normal(0, 1, (q, d)), "row_bias": rng.normal(0, 0.5, (q, R, k)),
            "proj": rng.normal(0, 0.2, (1, q * d)), "bias": np.array([0.3])}


@pytest.fixture(scope="module")
def archives(tmp_path_factory):
    root = tmp_path_factory.mktemp("conf")
    base = make_random_archive(root / "base.cact", layers=3, d_model=64, vocab=256, bits=4,
                               group_size=64, heads=False, max_seq_len=256)
    R = Archive.open(base).config.num_layers + 1
    head = _random_head(R, 64)
    np.savez(root / "head.npz", **head)
    out = confidence.attach(base, root / "head.npz", root / "with_head.cact")
    return base, out, head


def test_attach_adds_only_the_confidence_head(archives):
    base, out, _ = archives
    a, b = Archive.open(base), Archive.open(out)
    assert a.heads == () and b.heads == ("confidence",)
    roles_a = [r.role for r in a.records if r.role not in ("tokenizer",)]
    for role in roles_a:
        ra, rb = a.records[a.roles[role]], b.records[b.roles[role]]
        assert (ra.dtype, ra.shape, ra.bits, ra.group_size) == (rb.dtype, rb.shape, rb.bits, rb.group_size), role
        ta, tb = a.tensor(role), b.tensor(role)
        if hasattr(ta, "packed"):          # CQ matrices are copied, never re-quantized
            assert np.array_equal(ta.packed, tb.packed) and np.array_equal(ta.norms, tb.norms), role
        else:
            assert np.array_equal(np.asarray(ta), np.asarray(tb)), role


def test_engine_reads_the_head_with_the_layout_the_fit_trains(archives):
    _, out, head = archives
    arch = Archive.open(out)
    params = {name: np.asarray(arch.dequantize(f"heads.confidence.{name}"), np.float64)
              for name in ("probes", "gain", "query", "row_bias", "proj", "bias")}
    R, d = arch.config.num_layers + 1, arch.config.d_model
    params["probes"] = params["probes"].reshape(R, confidence.PROBES, d)
    # the stored head is the written one up to CQ 4-bit / FP16 rounding
    assert np.corrcoef(params["proj"].ravel(), head["proj"].ravel())[0, 1] > 0.95
    ids = np.array([2, 17, 33, 90, 5, 250, 41, 41, 7, 1], np.int64)
    for backend in ("cython", "numpy"):
        model = Model.load(out, backend=backend, numerics="float")
        _, cells = model.engine.forward_cells(ids)
        model.reset()
        model.prefill(ids)
        engine_logit = float(np.asarray(model.head_outputs()["confidence"]).reshape(-1)[0])
        ours = confidence.pool_logit(params, cells[None].astype(np.float64), np.ones((1, len(ids)), bool))[0]
        assert engine_logit == pytest.approx(float(ours), rel=1e-3, abs=1e-3), backend


def test_attach_refuses_an_archive_that_already_has_the_head(archives, tmp_path):
    _, out, _ = archives
    with pytest.raises(ValueError, match="already has a confidence head"):
        confidence.attach(out, tmp_path / "missing.npz", tmp_path / "x.cact")


def test_auc_counts_ties_half():
    assert confidence.auc([1, 0, 1, 0], np.array([0.9, 0.1, 0.8, 0.2])) == 1.0
    assert confidence.auc([1, 0], np.array([0.5, 0.5])) == 0.5
    assert confidence.auc([0, 0], np.array([0.1, 0.2])) != confidence.auc([0, 0], np.array([0.1, 0.2]))  # nan
