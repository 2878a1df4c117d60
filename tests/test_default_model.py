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
    ("lock the front door", [{"name": "lock_door", "arguments": {"door": "front door"}}]),
    ("Stop the vacuum", [{"name": "stop_vacuum", "arguments": {}}]),
    ("Start the vacuum", [{"name": "start_vacuum", "arguments": {}}]),
    ("Turn off the bedroom lights", [{"name": "set_light", "arguments": {"room": "bedroom", "on": False}}]),
    ("Set the thermostat to 20 degrees", [{"name": "set_thermostat", "arguments": {"temperature": 20}}]),
    ("Open the garage", [{"name": "operate_garage", "arguments": {"action": "open"}}]),
    ("Set a timer for 10 minutes", [{"name": "set_timer", "arguments": {"minutes": 10}}]),
    ("Activate the party scene", [{"name": "activate_scene", "arguments": {"scene": "party"}}]),
    ("What's the capital of France?", []),
    ("Turn on the TV", []),
    ("Tell me a joke", []),
    ("Book me a flight to Rome", []),
    # free strings and enum members come from the request (value grounding)
    ("Add oat milk to the shopping list", [{"name": "add_to_shopping_list", "arguments": {"item": "oat milk"}}]),
    ("Tell everyone the taxi is here",
     [{"name": "send_notification", "arguments": {"message": "the taxi is here", "recipient": "everyone"}}]),
    ("Set a 15 minute timer called tea", [{"name": "set_timer", "arguments": {"minutes": 15, "label": "tea"}}]),
    ("Stop the music", [{"name": "stop_music", "arguments": {}}]),
    ("Turn on the hallway lights", [{"name": "set_light", "arguments": {"room": "hallway", "on": True}}]),
    ("Close the office blinds", [{"name": "set_blinds", "arguments": {"room": "office", "position": 0}}]),
    ("Unlock the front door, code 4821",
     [{"name": "unlock_door", "arguments": {"door": "front door", "code": "4821"}}]),
    # "dim" reaches set_light through the retrieval's query expansion
    ("dim the kitchen to 30 and lock the front door",
     [{"name": "set_light", "arguments": {"room": "kitchen", "on": True, "brightness": 30}},
      {"name": "lock_door", "arguments": {"door": "front door"}}]),
    ("Lock the front door and turn off the kitchen lights",
     [{"name": "lock_door", "arguments": {"door": "front door"}},
      {"name": "set_light", "arguments": {"room": "kitchen", "on": False}}]),
    # said times, durations and numbers are read exactly; names are copied whole; filler
    # is never a value (grounding)
    ("Wake me at quarter past six in the morning", [{"name": "set_alarm", "arguments": {"time": "06:15"}}]),
    ("Set a 6:45 pm alarm called yoga",
     [{"name": "set_alarm", "arguments": {"time": "18:45", "label": "yoga"}}]),
    ("Set a timer for three quarters of an hour", [{"name": "set_timer", "arguments": {"minutes": 45}}]),
    ("Put the kitchen lights on at full brightness",
     [{"name": "set_light", "arguments": {"room": "kitchen", "on": True, "brightness": 100}}]),
    ("Play some Miles Davis in the kitchen",
     [{"name": "play_music", "arguments": {"query": "Miles Davis", "room": "kitchen"}}]),
    ("Can you add flour to the shopping list please",
     [{"name": "add_to_shopping_list", "arguments": {"item": "flour"}}]),
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
    assert archive.heads == ("confidence",)     # fitted by needle_cy.training.confidence


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
    assert response["escalate"] is False and 0.1 <= response["confidence"] <= 1.0


def test_a_negated_request_is_held_back(agent):
    agent.reset()
    response = agent.complete("Don't lock the front door")
    assert response["function_calls"] == [] and response["escalate"] is True
    assert response["validation"] == {"negation": True}
    assert [c["name"] for c in response["suppressed_calls"]] == ["lock_door"]


def test_a_new_tool_selection_resumes_from_a_prefix_checkpoint_exactly(catalogue):
    """Tools render in catalogue order, so selections share leading tools: the second
    request restores the checkpoint at the longest shared 64-token run and prefills the
    rest; what it computes is bit-identical to a prefill from position 0."""
    import numpy as np
    from needle_cy.agent import Needle

    first, second = "Set the kitchen lights to 50", "Turn on the bathroom light"
    cached = Needle(model=None, tools=catalogue)
    fresh = Needle(model=None, tools=catalogue, prefix_checkpoint_mb=0)
    assert cached.select_tools(first) != cached.select_tools(second)
    cached.complete(first)
    cached.reset()
    got = cached.complete(second)
    want = fresh.complete(second)
    reused = got["timings"]["n_prefix_reused"]
    assert reused > 0 and reused % 64 == 0
    assert got["timings"]["n_prefix"] + reused == len(cached._active.conversation.prefix_ids)
    assert want["timings"]["n_prefix_reused"] == 0 and len(fresh._checkpoints) == 0
    for key in ("function_calls", "confidence", "reasoning"):
        assert got[key] == want[key]
    token = cached.tokenizer.encode("ok", dummy_prefix=False)[0]
    assert np.array_equal(cached.model.step(token), fresh.model.step(token))


@pytest.mark.parametrize("backend", ["cython", "numpy"])
def test_snapshot_sizes_follow_the_positions_in_use(backend):
    """Prefix checkpoints are budgeted by ``snapshot().nbytes``: both engines report the
    bytes their state arrays hold, growing with the KV slots in use."""
    from needle_cy.model import Model

    model = Model.load(DEFAULT, backend=backend)
    model.prefill(list(range(20, 40)))
    short = model.snapshot().nbytes
    model.prefill(list(range(40, 80)))
    long = model.snapshot().nbytes
    cfg = model.config
    per_head = (cfg.qk_head_dim + cfg.v_head_dim) * 4                 # float32 values
    if getattr(model.engine, "kv_storage", "float32") == "int8":       # codes + two scales
        per_head = -(-cfg.qk_head_dim // 4) * 4 + cfg.v_head_dim + 2 * 4
    kv_per_token = cfg.num_layers * cfg.num_kv_heads * per_head
    assert 0 < short < long
    assert long - short >= 40 * kv_per_token
