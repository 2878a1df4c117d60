"""Shared test configuration: where the official fixtures live.

``NEEDLE_CY_FIXTURES`` overrides the default ``../shared/fixtures`` beside the
repository.  Tests that need fixtures skip loudly when they are absent, except
under ``CI=true`` where absence is a failure (CI always has them).
"""
import os
from pathlib import Path

# Small matmuls in the NumPy reference oversubscribe a 2-core machine when BLAS
# spawns its own threads; the tests measure correctness, not BLAS speed.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# OpenMP threads that spin while waiting for a descheduled sibling make a loaded
# 2-core machine 100x slower; sleeping waits keep the suite fast there too.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(os.environ.get("NEEDLE_CY_FIXTURES", REPO.parent / "shared" / "fixtures"))
SHARED = FIXTURES.parent
FIXTURE_MODELS = ["needle3_tiny_a", "needle3_tiny_b"]  # the fixtures shipped in ../shared


def _require(path):
    path = Path(path)
    if path.exists():
        return path
    msg = f"official fixture missing: {path} (set NEEDLE_CY_FIXTURES to the fixtures folder)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(msg)
    pytest.skip("LOUD SKIP: " + msg)


@pytest.fixture(scope="session")
def fixtures_dir():
    return _require(FIXTURES)


def fixture_path(*parts):
    """Path under the fixtures folder; skip (or fail under CI) when absent."""
    return _require(FIXTURES.joinpath(*parts))


def shared_path(*parts):
    """Path under ../shared (eval data etc.); skip (or fail under CI) when absent."""
    return _require(SHARED.joinpath(*parts))


def available_fixture_models():
    return [m for m in FIXTURE_MODELS if (FIXTURES / m / "model.cact").exists()]
