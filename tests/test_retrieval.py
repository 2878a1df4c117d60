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


# ------------------------------------------------------------ query expansion ---

from needle_cy.errors import QueryExpansionError  # noqa: E402
from needle_cy.retrieval import QueryExpansion, _one_edit_apart, default_query_expansion  # noqa: E402


def _home_specs():
    with open(shared_path("eval", "home_tools.json"), encoding="utf-8") as f:
        return normalize_tools(json.load(f))


def test_bm25_weighted_terms_scale_each_words_sum():
    index = BM25([["light", "kitchen"], ["timer", "kitchen"], ["fan"]])
    plain = index.scores(["light", "kitchen", "kitchen"])
    assert np.allclose(index.scores({"light": 1.0, "kitchen": 1.0}), plain)
    light, kitchen = index.scores(["light"]), index.scores(["kitchen"])
    assert np.allclose(index.scores({"light": 0.5, "kitchen": 2.0, "absent": 3.0}), 0.5 * light + 2.0 * kitchen)
    assert np.allclose(index.scores({"light": 0.0}), 0.0)


def test_one_edit_apart_is_damerau_distance_one():
    for a, b in [("voluem", "volume"), ("alarm", "alrm"), ("light", "lights"), ("light", "lighr"),
                 ("ab", "ba")]:
        assert _one_edit_apart(a, b) and _one_edit_apart(b, a), (a, b)
    for a, b in [("light", "light"), ("light", "lgiht s"), ("volume", "vloume s"), ("abc", "cab"),
                 ("timer", "tim")]:
        assert not _one_edit_apart(a, b), (a, b)


def test_expansion_adds_weighted_name_words_and_reads_long_typos():
    table = QueryExpansion({"dim": {"set": 1.0, "light": 0.8}, "mute": {"volume": 1.0}}, weight=0.5)
    terms = table.weighted_terms(["dim", "kitchen", "dim"], vocabulary={"kitchen": 1.0, "light": 1.0})
    assert terms == {"dim": 1.0, "set": 0.5, "light": 0.4, "kitchen": 1.0}
    # An unknown word of 5+ letters stands for its known neighbours one edit away (and
    # their expansions); shorter or known words are taken as they are.
    vocab = {"kitchen": 1.0, "volume": 1.0}
    assert table.weighted_terms(["kitchn"], vocab) == {"kitchen": 1.0}
    assert table.weighted_terms(["voluem"], vocab) == {"volume": 1.0}
    assert table.weighted_terms(["mte"], vocab) == {"mte": 1.0}
    assert table.weighted_terms(["zzzzzz"], vocab) == {"zzzzzz": 1.0}


def test_shipped_expansion_finds_tools_by_the_words_people_use():
    specs = _home_specs()
    names = [s.name for s in specs]
    expansion = default_query_expansion()
    for query, tool in [("dim the kitchen to 30", "set_light"), ("mute the kitchen", "set_volume"),
                        ("how humid is it", "get_sensor_reading"),
                        ("turn the voluem up", "set_volume")]:
        plain = [names[i] for i in rank_bm25(query, specs)]
        expanded = [names[i] for i in rank_bm25(query, specs, expansion=expansion)]
        assert expanded[0] == tool, (query, expanded[:3])
        assert plain[0] != tool, (query, plain[:3])       # what the expansion adds
    query = "put some classical on in the office"       # "put ... on" is the shopping list's too
    assert "play_music" in [names[i] for i in rank_bm25(query, specs, expansion=expansion)[:5]]
    assert "play_music" not in [names[i] for i in rank_bm25(query, specs)[:5]]
    # words the table does not know rank as before
    assert rank_bm25("zzzz qqqq", specs, expansion=expansion) == list(range(len(specs)))


def test_shipped_expansion_is_what_the_training_script_learns():
    from needle_cy.retrieval import _DEFAULT_EXPANSION
    from needle_cy.training import query_expansion
    learned = query_expansion.learn()
    with open(_DEFAULT_EXPANSION, encoding="utf-8") as f:
        shipped = json.load(f)
    assert learned.to_json() == shipped
    assert all(w.isalpha() for w in shipped["terms"])


@pytest.mark.parametrize("content, match", [
    ("{not json", "cannot read it as JSON"),
    ('{"format": "other/1", "terms": {}}', "expected an object"),
    ('{"format": "needle_cy.query_expansion/1", "terms": []}', "'terms' must be an object"),
    ('{"format": "needle_cy.query_expansion/1", "terms": {"dim": {"light": 1.5}}}', "shares in \\[0, 1\\]"),
    ('{"format": "needle_cy.query_expansion/1", "terms": {"dim": ["light"]}}', "entry 'dim'"),
    ('{"format": "needle_cy.query_expansion/1", "weight": -1, "terms": {}}', "'weight' must be"),
])
def test_malformed_expansion_tables_are_named_errors(tmp_path, content, match):
    path = tmp_path / "table.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(QueryExpansionError, match=match):
        QueryExpansion.load(path)
    with pytest.raises(QueryExpansionError, match="cannot read"):
        QueryExpansion.load(tmp_path / "absent.json")


def test_agent_uses_the_shipped_expansion_unless_told_not_to(tmp_path):
    from needle_cy.agent import Needle
    with open(shared_path("eval", "home_tools.json"), encoding="utf-8") as f:
        tools = json.load(f)
    names = [t["name"] for t in tools]
    agent = Needle(tools=tools)
    assert names[agent.rank_tools("dim the kitchen to 30")[0]] == "set_light"
    assert "set_light" in [s.name for s in agent.select_tools("dim the kitchen to 30")]
    plain = Needle(tools=tools, query_expansion=None)
    assert names[plain.rank_tools("dim the kitchen to 30")[0]] != "set_light"
    table = tmp_path / "t.json"
    table.write_text(json.dumps(QueryExpansion({"dim": {"thermostat": 1.0}}).to_json()), encoding="utf-8")
    custom = Needle(tools=tools, query_expansion=str(table))
    assert names[custom.rank_tools("dim")[0]] == "set_thermostat"
    with pytest.raises(QueryExpansionError):
        Needle(tools=tools, query_expansion=str(tmp_path / "absent.json"))
    with pytest.raises(ValueError, match="query_expansion"):
        Needle(tools=tools, query_expansion=3)


def test_a_piece_without_a_letter_stays_with_its_clause():
    """"2 and 3" is one thing asked for: a piece of only numbers and signs is no clause of
    its own, while words after a number still start one."""
    from needle_cy.retrieval import request_clauses
    assert request_clauses("What is the sum of 2 and 3?") == ["What is the sum of 2 and 3"]
    assert request_clauses("set it to 21, 5") == ["set it to 21, 5"]
    assert request_clauses("dim to 30 and lock the front door") == ["dim to 30", "lock the front door"]
    assert request_clauses("turn on the light, then lock the door and play jazz") == [
        "turn on the light", "lock the door", "play jazz"]
    assert request_clauses("") == [] and request_clauses(" and ") == []
