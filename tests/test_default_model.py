"""The shipped default model: it loads from the package and answers fixed requests.

Only requests the shipped model was measured to answer correctly are asserted
(see needle_cy/models/MODEL_CARD.md for its full evaluation); when a new model
ships, rerun the candidates and keep the ones it gets right.
"""
import json
from pathlib import Path

import pytest

MODELS = Path(__file__).resolve().parent.parent / "needle_cy" / "models"
DEFAULT = MODELS / "default.cact"

pytestmark = pytest.mark.skipif(
    not DEFAULT.exists(), reason=f"no shipped default model at {DEFAULT} (train one with "
    "python -m needle_cy.training.train_default --out needle_cy/models/default.cact)")

# (request, expected calls) — phrasings written for this test, not taken from any eval set
FIXED = [
    ("Lock the back door", [{"name": "lock_door", "arguments": {"door": "back door"}}]),
    ("Stop the vacuum", [{"name": "stop_vacuum", "arguments": {}}]),
    ("What's the capital of France?", []),
    ("Turn on the TV", []),
]


@pytest.fixture(scope="module")
def catalogue():
    return json.loads((MODELS / "home_tools.json").read_text())


def test_archive_is_small_and_complete():
    from needle_cy.archive import Archive

    assert DEFAULT.stat().st_size <= 16 * 1024 * 1024
    archive = Archive.open(DEFAULT)
    cfg = archive.config
    assert 192 <= cfg.d_model <= 320 and 4 <= cfg.num_layers <= 8
    assert archive.tokenizer_bytes is not None


@pytest.fixture(scope="module")
def agent(catalogue):
    from needle_cy.agent import Needle

    return Needle(model=None, tools=catalogue)


@pytest.mark.parametrize("request_text,expected", FIXED, ids=[q for q, _ in FIXED])
def test_fixed_requests(agent, request_text, expected):
    from needle_cy.eval import calls_equal, predicted_calls

    agent.reset()
    response = agent.complete(request_text)
    got = predicted_calls(response)
    assert calls_equal(expected, got), f"{request_text!r}: got {got}"
