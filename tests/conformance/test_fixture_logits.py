"""The NumPy reference engine against the official JAX model's outputs (../shared/fixtures).

Tolerances (see ../shared/fixtures/README.md for why):
* ``float`` numerics vs ``<case>.logits_cqw``: relative error
  ``max|Δ| / max|ref|`` over all positions of a case ≤ 1e-4.
* ``deploy`` numerics vs ``<case>.logits_deploy`` (stored float16): mean |Δlogit| ≤ 0.01
  and greedy ids identical wherever the stored ``margin_deploy`` > 0.1.
* hidden cells (tiny_a ``activations.npz``): the scaled input embedding row exact
  to float32 rounding; every block row close on average (8-bit rounding flips
  in the KV cache spread along the sequence, so per-row mean |Δ| ≤ 1% of the
  row's mean |ref| and max |Δ| ≤ 5% of its max |ref|).
* probe heads: ``<case>.head_*_deploy`` are the heads pooled over the whole case;
  compared with 5e-3 absolute (embedding unit vector, router logits) and 5e-3
  relative (confidence logit).

The 608-token case runs in one test only (deploy, tiny_a) to keep the module fast.
Every test runs the NumPy reference; the logits/heads tests also run the Cython
engine when ``needle_cy._model`` is built (skipped otherwise).
"""
import numpy as np
import pytest

from conftest import FIXTURE_MODELS, fixture_path

from needle_cy.model import Model

LONG_CASE = "system_parallel_long"
SHORT_CASES = ["single_call", "non_ascii", "multi_turn_tool_result", "teacher_forced_think", "plain_short"]

_MODELS = {}
_CASES = {}


def _cython_built():
    try:
        import needle_cy._model  # noqa: F401
    except ImportError:
        return False
    return True


BACKENDS = ["numpy", pytest.param("cython", marks=pytest.mark.skipif(
    not _cython_built(), reason="needle_cy._model (Cython engine) is not built"))]


def model(name, numerics, backend="numpy"):
    key = (name, numerics, backend)
    if key not in _MODELS:
        _MODELS[key] = Model.load(fixture_path(name, "model.cact"), backend=backend, numerics=numerics)
    return _MODELS[key]


def logits_and_heads(m, ids):
    """Logits at every position and the heads over the whole case (public API, or the
    reference's cells when available, which saves a second pass)."""
    if m.backend == "numpy":
        logits, cells = m.engine.forward_cells(ids)
        return logits, m.engine.heads_from_cells(cells, ids)
    logits = m.forward(ids)
    m.reset()
    m.prefill(ids)
    heads = m.head_outputs()
    m.reset()
    return logits, heads


def cases(name):
    if name not in _CASES:
        _CASES[name] = np.load(fixture_path(name, "cases.npz"))
    return _CASES[name]


def deploy_checks(logits, z, case):
    ref = z[f"{case}.logits_deploy"].astype(np.float32)
    assert logits.shape == ref.shape
    diff = np.abs(logits - ref)
    margin = z[f"{case}.margin_deploy"]
    confident = margin > 0.1
    greedy_same = logits.argmax(-1) == z[f"{case}.greedy_deploy"]
    assert diff.mean() <= 0.01, f"{case}: mean |Δlogit| {diff.mean():.4f} > 0.01 (max {diff.max():.3f})"
    bad = np.flatnonzero(confident & ~greedy_same)
    assert bad.size == 0, f"{case}: greedy differs at positions {bad[:10]} with margins {margin[bad[:10]]}"
    return diff


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", FIXTURE_MODELS)
def test_float_logits_match_cqw(name, backend):
    z = cases(name)
    m = model(name, "float", backend)
    checked = 0
    for case in SHORT_CASES:
        if f"{case}.logits_cqw" not in z.files:
            continue
        ref = z[f"{case}.logits_cqw"]
        logits = m.forward(z[f"{case}.ids"])
        rel = np.abs(logits - ref).max() / np.abs(ref).max()
        assert rel <= 1e-4, f"{name}/{case}: relative error {rel:.2e}"
        np.testing.assert_array_equal(logits.argmax(-1), z[f"{case}.greedy_cqw"])
        checked += 1
    assert checked >= 3


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", FIXTURE_MODELS)
def test_deploy_logits_and_heads(name, backend):
    z = cases(name)
    m = model(name, "deploy", backend)
    for case in SHORT_CASES:
        ids = z[f"{case}.ids"]
        logits, heads = logits_and_heads(m, ids)
        deploy_checks(logits, z, case)
        assert set(heads) == {"embedding", "confidence", "router"}
        np.testing.assert_allclose(heads["embedding"], z[f"{case}.head_embedding_deploy"], atol=5e-3)
        np.testing.assert_allclose(heads["router"], z[f"{case}.head_router_deploy"], atol=5e-3)
        conf = float(z[f"{case}.head_confidence_deploy"])
        assert abs(heads["confidence"] - conf) <= 5e-3 * max(1.0, abs(conf))


@pytest.mark.parametrize("backend", BACKENDS)
def test_deploy_long_case_incremental_with_online_heads(backend):
    """The 608-token case: prefill a prefix, step the rest; logits and online heads vs JAX."""
    name = "needle3_tiny_a"
    z = cases(name)
    m = model(name, "deploy", backend)
    ids = z[f"{LONG_CASE}.ids"]
    m.reset()
    split = 500
    rows = [m.forward(ids[:split])]               # every prefix position, stateless
    m.prefill(ids[:split])
    rows += [m.step(int(t))[None] for t in ids[split:]]
    deploy_checks(np.concatenate(rows), z, LONG_CASE)
    heads = m.head_outputs()
    np.testing.assert_allclose(heads["embedding"], z[f"{LONG_CASE}.head_embedding_deploy"], atol=5e-3)
    np.testing.assert_allclose(heads["router"], z[f"{LONG_CASE}.head_router_deploy"], atol=5e-3)
    assert abs(heads["confidence"] - float(z[f"{LONG_CASE}.head_confidence_deploy"])) <= 5e-3
    m.reset()


def test_hidden_cells_match_activations():
    name = "needle3_tiny_a"
    z = cases(name)
    acts = np.load(fixture_path(name, "activations.npz"))
    m = model(name, "deploy")
    for case in ["single_call", "non_ascii", "plain_short"]:
        ref = acts[f"{case}.hidden_cells_deploy"]
        _, cells = m.engine.forward_cells(z[f"{case}.ids"])
        assert cells.shape == ref.shape
        np.testing.assert_allclose(cells[:, 0], ref[:, 0], rtol=1e-6, atol=1e-6)
        for r in range(1, ref.shape[1]):
            diff = np.abs(cells[:, r] - ref[:, r])
            assert diff.mean() <= 0.01 * np.abs(ref[:, r]).mean(), f"{case} row {r}: mean |Δ| {diff.mean():.2e}"
            assert diff.max() <= 0.05 * np.abs(ref[:, r]).max(), f"{case} row {r}: max |Δ| {diff.max():.2e}"
        # before any 8-bit flip can spread (a short case) the cells agree to float rounding
        if case == "plain_short":
            np.testing.assert_allclose(cells, ref, rtol=1e-4, atol=1e-5)
