"""Official fixtures: the reference tokenizer's ids and decodes, and every fixture case's prompt ids."""
import json

import pytest
from conftest import FIXTURE_MODELS, fixture_path

from needle_cy.reference import bpe as ref
from needle_cy.tokenizer import Tokenizer

# The fixtures are sentencepiece's ids, which turn marker spellings into markers: the spec
# encoding, asked for by name (the default encodes them as text).
ALL = "all"


@pytest.fixture(scope="module", params=FIXTURE_MODELS)
def model(request):
    return request.param


@pytest.fixture(scope="module")
def tok(model):
    return Tokenizer.from_archive(fixture_path(model, "model.cact"))


def _stress_cases():
    return json.loads(fixture_path("tokenizer_cases.json").read_text(encoding="utf-8"))["stress"]


def test_stress_strings(tok):
    cases = _stress_cases()
    assert len(cases) >= 25
    for case in cases:
        text = case["text"]
        assert tok.encode(text, allowed_special=ALL) == case["ids_reftokenizer"] == case["ids_sentencepiece"], text
        assert ref.encode(text, tok.record) == case["ids_reftokenizer"], text
        assert tok.decode(case["ids_reftokenizer"]) == case["decode_reftokenizer"], text


def test_case_prompts(tok, model):
    data = json.loads(fixture_path(model, "cases.json").read_text(encoding="utf-8"))
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (data["bos_id"], data["eos_id"], data["pad_id"])
    assert len(data["cases"]) >= 6
    for case in data["cases"]:
        ids = [tok.bos_id] + tok.encode(case["prompt"], allowed_special=ALL)
        if case.get("target"):
            # training rendering (spec §7.1): prompt and target are separate encode calls
            ids += tok.encode(case["target"], allowed_special=ALL) + [tok.eos_id]
        assert ids == case["ids"], case["name"]
        assert len(ids) == case["num_tokens"]
        # the target's own dummy "▁" decodes as a space between prompt and target
        assert tok.decode(ids) == case["prompt"] + (" " + case["target"] if case.get("target") else "")
        if len(case["prompt"]) < 1500:  # the quadratic reference on the shorter prompts
            assert ref.encode(case["prompt"], tok.record) == ids[1:1 + len(tok.encode(case["prompt"], allowed_special=ALL))]
