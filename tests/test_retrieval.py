"""Tool retrieval: BM25 ranking, budgeted prefix selection, embedding ranking + disk cache."""
import json
import math

import numpy as np
import pytest

from conftest import shared_path
from needle_cy.retrieval import (BM25, EmbeddingRanker, bm25_tokens, rank_bm25, select_prefix,
                                 tool_document)
from needle_cy.toolspec import normalize_tools


def test_tokens_split_names_and_case():
    assert bm25_tokens("set_lightColor: Turn ON!") == ["set", "light", "color", "turn", "on"]


def test_bm25_scores_match_the_formula():
    docs = [["light", "kitchen", "light"], ["timer"], ["light", "oven", "timer", "x"]]
    index = BM25(docs)
    n, avg = 3, (3 + 1 + 4) / 3
    idf = math.log(1 + (n - 2 + 0.5) / (2 + 0.5))
    expect0 = idf * 2 * 2.2 / (2 + 1.2 * (0.25 + 0.75 * 3 / avg))
    expect2 = idf * 1 * 2.2 / (1 + 1.2 * (0.25 + 0.75 * 4 / avg))
    s = index.scores(["light", "light", "absent"])
    assert s[0] == pytest.approx(expect0) and s[2] == pytest.approx(expect2) and s[1] == 0


def test_bm25_ranks_the_smart_home_catalogue_sensibly():
    with open(shared_path("eval", "home_tools.json"), encoding="utf-8") as f:
        specs = normalize_tools(json.load(f))
    cases = [("Set the thermostat to 21 degrees", "set_thermostat"),
             ("turn on the lights in the kitchen", "set_light")]
    for query, expected in cases:
        order = rank_bm25(query, specs)
        assert specs[order[0]].name == expected or expected in [specs[i].name for i in order[:3]]
    # Deterministic, and ties (no overlap at all) keep catalogue order.
    assert rank_bm25("zzzz qqqq", specs) == list(range(len(specs)))
    assert rank_bm25("thermostat", specs) == rank_bm25("thermostat", specs)


def test_select_prefix_respects_count_and_token_budget():
    order = [3, 0, 2, 1]
    counts = [10, 50, 20, 30]
    assert select_prefix(order, counts, max_tools=2) == [3, 0]
    assert select_prefix(order, counts, max_tools=None, token_budget=45) == [3, 0]
    # A prefix: a tool that does not fit stops the selection even if a later one would.
    assert select_prefix(order, counts, max_tools=None, token_budget=59) == [3, 0]
    assert select_prefix(order, counts, max_tools=None, token_budget=29) == []
    assert select_prefix(order, counts) == order


def test_embedding_ranker_cosine_and_disk_cache(tmp_path):
    calls = []
    basis = {"query": [1.0, 0.2, 0.0], "a": [0.0, 1.0, 0.0], "b": [1.0, 0.0, 0.0], "c": [0.7, 0.7, 0.0]}

    def embed(text):
        calls.append(text)
        v = np.array(basis[text], np.float32)
        return v / np.linalg.norm(v)

    path = tmp_path / "tools.npz"
    ranker = EmbeddingRanker(embed, "model-1", path)
    assert ranker.rank("query", ["a", "b", "c"]) == [1, 2, 0]
    assert calls == ["a", "b", "c", "query"]
    # A new ranker reads tool vectors from disk: only the query is embedded.
    calls.clear()
    again = EmbeddingRanker(embed, "model-1", path)
    assert again.rank("query", ["a", "b", "c"]) == [1, 2, 0]
    assert calls == ["query"]
    # A different model fingerprint never reuses the cache; a changed tool re-embeds alone.
    calls.clear()
    EmbeddingRanker(embed, "model-2", path).rank("query", ["a"])
    assert calls == ["a", "query"]
    calls.clear()
    EmbeddingRanker(embed, "model-1", path).rank("query", ["a", "c"])
    assert calls == ["query"]
    # A corrupt cache is rebuilt rather than trusted.
    path.write_bytes(b"not an npz")
    calls.clear()
    EmbeddingRanker(embed, "model-1", path).rank("query", ["a"])
    assert calls == ["a", "query"]


def test_tool_document_uses_name_and_description():
    spec = normalize_tools([{"name": "set_light", "description": "Lamp control"}])[0]
    assert tool_document(spec) == ["set", "light", "lamp", "control"]


def test_tool_document_indexes_schema_words_stemmed():
    spec = normalize_tools([{"name": "activate_scene", "description": "Activate a lighting scene",
                             "parameters": {"type": "object", "properties": {
                                 "scene": {"type": "string", "enum": ["movie night", "good morning"]},
                                 "rooms": {"type": "array", "items": {"type": "string",
                                                                      "description": "Living areas"}}}}}])[0]
    doc = tool_document(spec)
    for word in ("movie", "night", "morn", "room", "area", "light", "scene"):
        assert word in doc, word
    assert "lighting" not in doc and "rooms" not in doc     # stemmed


def test_each_clause_of_a_multi_intent_request_reaches_the_front():
    with open(shared_path("eval", "home_tools.json"), encoding="utf-8") as f:
        specs = normalize_tools(json.load(f))
    names = [s.name for s in specs]
    order = rank_bm25("Close the garage door, lock the back door and start the vacuum", specs)
    assert set(names[i] for i in order[:3]) == {"operate_garage", "lock_door", "start_vacuum"}
    # Clause order, and a permutation of the whole catalogue.
    assert [names[i] for i in order[:3]] == ["operate_garage", "lock_door", "start_vacuum"]
    assert sorted(order) == list(range(len(specs)))
    # One clause: the plain BM25 order over the whole request.
    single = rank_bm25("movie night mode please", specs)
    assert names[single[0]] == "activate_scene"
