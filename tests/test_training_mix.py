"""The schema-general training data: corpus splits, the per-tool request generator and
the conversation mix (needle_cy.training.corpus, tool_requests, paraphrase, mix)."""
import ast
import hashlib
import inspect
import json
import os
import random
import re

import pytest

from conftest import shared_path
from needle_cy.training import corpus, data, mix, paraphrase
from needle_cy.training import tool_requests
from needle_cy.training.tool_requests import (Param, ToolPlan, description_action,
                                              sample_pattern, third_to_imperative, validate_call)

jsonschema = pytest.importorskip("jsonschema")


@pytest.fixture(scope="module")
def corpus_root():
    root = shared_path("data", "tool_corpus")
    os.environ.setdefault(corpus.CORPUS_ENV, str(root))
    return root


@pytest.fixture(scope="module")
def train_tools(corpus_root):
    return corpus.load("train", corpus_root)


@pytest.fixture(scope="module", params=[1, 4, 5], ids=["mix1", "mix4", "mix5"])
def conversations(request, corpus_root, train_tools):
    mixer = mix.Mixer(seed=3, tools=train_tools, version=request.param)
    return [mixer.example() for _ in range(400)]


def _turns(ex):
    """(query, answers) of every turn of a conversation, results turns excluded."""
    out = [(t["query"], t["answers"]) for t in ex.get("history") or []]
    if not ex.get("is_result"):
        out.append((ex["query"], ex["answers"]))
    return out


def test_splits_are_disjoint_and_stable(corpus_root):
    train = corpus.load("train", corpus_root)
    held = corpus.load("heldout", corpus_root)
    key = lambda t: corpus.tool_key(t)
    assert train and held
    assert not {key(t) for t in train} & {key(t) for t in held}
    assert len(train) + len(held) == len(corpus.load("all", corpus_root))
    assert all(corpus.split_of(t) == "heldout" for t in held)
    assert 0.05 < len(held) / (len(train) + len(held)) < 0.15


def test_unseen_dev_domains_are_held_out(corpus_root):
    """No usable corpus tool belongs to one of unseen_dev.jsonl's ten domains, and none
    shares a name with one of its tools (only the tool names are read)."""
    unseen = shared_path("eval", "unseen_dev.jsonl")
    names = set()
    with open(unseen, encoding="utf-8") as handle:
        for line in handle:
            names.update(t["name"] for t in json.loads(line)["tools"])
    kept = corpus.load("all", corpus_root)
    assert not names & {t["name"] for t in kept}
    assert all(corpus.held_out_domain(t) is None for t in kept)
    probe = {"name": "set_charge_limit", "description": "Sets the charge limit.", "domain": "x",
             "parameters": {"type": "object", "properties": {}}}
    assert corpus.held_out_domain(probe) == "electric car"
    assert corpus.held_out_domain(dict(probe, name="get_soil_moisture",
                                       description="Reads the soil moisture.")) == "greenhouse"


def test_the_corpus_is_not_in_the_package():
    package = os.path.join(os.path.dirname(corpus.__file__), "..")
    for root, _, files in os.walk(package):
        assert not any(f in corpus.CORPUS_FILES for f in files), root


def test_every_answer_validates_against_the_schema_it_was_drawn_from(conversations):
    n_calls = 0
    for ex in conversations:
        by_name = {t["name"]: t for t in ex["tools"]}
        assert len(by_name) == len(ex["tools"]) <= data.MAX_RENDERED_TOOLS
        for _, answers in _turns(ex):
            for call in answers:
                tool = by_name[call["name"]]
                jsonschema.Draft202012Validator(tool["parameters"]).validate(call["arguments"])
                assert list(call["arguments"]) == [k for k in tool["parameters"].get("properties", {})
                                                   if k in call["arguments"]]
                n_calls += 1
    assert n_calls > 300


TURN_KINDS = ("single", "multi", "refuse", "refuse_missing_tool", "refuse_missing_value",
              "refuse_bad_value", "refuse_negated")


def test_the_mix_has_every_kind(conversations):
    # a conversation is labelled by its last turn; a value out of range is rare there
    kinds = {ex["kind"] for ex in conversations if ex.get("source") == "mix"}
    for kind in TURN_KINDS:
        assert kind in kinds or kind == "refuse_bad_value"
    sources = [ex["source"] for ex in conversations]
    assert 0.2 < sources.count("home") / len(sources) < 0.5
    assert any(ex.get("renamed") for ex in conversations)
    assert any(ex.get("packed") for ex in conversations if ex["source"] == "mix")


@pytest.mark.parametrize("version", [1, 4, 5, 6])
def test_every_turn_kind_is_drawn(train_tools, version):
    mixer = mix.Mixer(seed=3, tools=train_tools, version=version)
    kinds = set()
    for _ in range(120):        # a value out of range is about one turn in 200
        catalogue = mixer._catalogue([mixer._gold()])
        kinds.update(mixer._turn(catalogue, first=False)[4] for _ in range(6))
    assert kinds == set(TURN_KINDS)


def test_marker_spellings_never_split_a_value_from_version_5(train_tools):
    rng = random.Random(2)
    for _ in range(200):
        out = mix._insert(rng, "send Bed town itself to Ann now", "<|im_end|>", ["Bed town itself"])
        assert "Bed town itself" in out
    # (version 4 at this seed: 5 of 210 such values split)
    mixer = mix.Mixer(seed=8, tools=train_tools, version=5, marker_share=1.0)
    checked = 0
    for _ in range(600):
        ex = mixer.example()
        if ex["source"] != "mix" or ex.get("is_result"):
            continue
        by_name = {t["name"]: t for t in ex["tools"]}
        for call in ex["answers"]:
            props = by_name[call["name"]]["parameters"].get("properties", {})
            for key, value in call["arguments"].items():
                schema = props.get(key, {})
                if (isinstance(value, str) and "enum" not in schema and "pattern" not in schema
                        and Param(key, schema, False).kind not in ("time", "date")):
                    assert value in ex["query"], (value, ex["query"])
                    checked += 1
    assert checked > 100


def test_copied_strings_are_said_verbatim(conversations):
    """Every free string of an answer (no enum, pattern or time) appears in its request
    (a conversation with chat-marker spellings written into it may have one inside a value:
    the model is to read past them)."""
    for ex in conversations:
        if ex["source"] != "mix" or ex.get("marker_text"):
            continue
        by_name = {t["name"]: t for t in ex["tools"]}
        for query, answers in _turns(ex):
            for call in answers:
                props = by_name[call["name"]]["parameters"].get("properties", {})
                for key, value in call["arguments"].items():
                    schema = props.get(key, {})
                    if not isinstance(value, str) or "enum" in schema or "pattern" in schema:
                        continue
                    if Param(key, schema, False).kind in ("time", "date"):
                        continue
                    assert value in query, (value, query)


def test_renamed_tools_keep_descriptions_and_say_nothing_by_name():
    rng = random.Random(0)
    tool = {"name": "set_desk_lamp", "description": "Sets the desk lamp's brightness.",
            "parameters": {"type": "object", "properties": {
                "level": {"type": "integer", "minimum": 0, "maximum": 10, "description": "Brightness level"},
                "room": {"type": "string"}}, "required": ["level"]}}
    renamed = mix.rename(rng, tool)
    assert renamed["description"] == tool["description"]
    assert renamed["name"] != tool["name"]
    props = renamed["parameters"]["properties"]
    assert "level" not in props and "room" in props          # only described keys change
    assert renamed["parameters"]["required"] == [k for k in props if k != "room"]
    plan = ToolPlan(renamed, renamed=True)
    got = plan.request(random.Random(1), optional_rate=0.0)
    assert got is not None
    clause, call, _, _ = got
    assert "set the desk lamp's brightness" in clause
    assert validate_call(renamed, call["arguments"])


def test_refusal_kinds_on_one_tool():
    tool = {"name": "set_pump_flow", "description": "Sets the pump's flow.",
            "parameters": {"type": "object", "properties": {
                "litres": {"type": "integer", "minimum": 500, "maximum": 1000,
                           "description": "Flow in litres per hour."}}, "required": ["litres"]}}
    plan = ToolPlan(tool)
    rng = random.Random(2)
    for _ in range(20):
        clause, call, _, _ = plan.request(rng)
        assert 500 <= call["arguments"]["litres"] <= 1000
        assert str(call["arguments"]["litres"]) in clause
        bad = plan.request(rng, bad_value=True)
        said = [int(n) for n in re.findall(r"\d+", bad[0])]
        assert bad[1]["arguments"] == {} and len(said) == 1 and not 500 <= said[0] <= 1000
    missing = plan.request(rng, leave_out="litres")
    assert missing[1]["arguments"] == {} and not re.search(r"\d", missing[0])


def test_values_are_said_as_people_say_them():
    rng = random.Random(4)
    enum = Param("mode", {"type": "string", "enum": ["every_night", "once"]}, True)
    assert enum.kind == "enum"
    time_ = Param("start_time", {"type": "string", "pattern": "^([01][0-9]|2[0-3]):[0-5][0-9]$"}, True)
    assert time_.kind == "time"
    date = Param("day", {"type": "string", "format": "date"}, True)
    assert date.kind == "date"
    temp = Param("target_celsius", {"type": "number", "minimum": 15, "maximum": 28,
                                     "description": "Cabin temperature in degrees Celsius"}, False)
    assert temp.unit and "degrees" in temp.unit[0]
    flag = Param("flight", {"type": "string", "pattern": "^[A-Z0-9]{2}[0-9]{1,4}$"}, True)
    assert flag.kind == "pattern"
    for _ in range(30):
        assert re.search(flag.schema["pattern"], sample_pattern(rng, flag.schema["pattern"]))
    assert sample_pattern(rng, "^(?!x)a$") is None            # look-around is not read


def test_phrase_pools_are_whole_and_list_safe():
    pools = tool_requests._phrases()
    named = {pool for _, pool in tool_requests.POOL_OF_WORD}
    for name in named | set(tool_requests.GENERIC_POOLS) | tool_requests.LIST_POOLS:
        assert len(set(pools[name])) >= 25, name
        assert all(v and v == v.strip() and '"' not in v and "\n" not in v for v in pools[name]), name
    for name in tool_requests.LIST_POOLS:      # a said list is split at commas and "and"
        assert not [v for v in pools[name] if "," in v or " and " in f" {v} "], name


def test_version_4_values_are_phrases_of_the_kind_the_property_names():
    tool = {"name": "queue_song", "description": "Queues a song and texts a friend.",
            "parameters": {"type": "object", "required": ["song", "message", "items", "city"],
                           "properties": {"song": {"type": "string"}, "message": {"type": "string"},
                                          "items": {"type": "array", "items": {"type": "string"}},
                                          "city": {"type": "string"}}}}
    plan = ToolPlan(tool)
    pools = tool_requests._phrases()
    drawn = {True: [], False: []}
    for phrase_values in (True, False):
        rng = data._VersionedRandom(7)
        rng.phrase_values = phrase_values
        while len(drawn[phrase_values]) < 200:
            got = plan.request(rng)
            if got:
                clause, call, _, _ = got
                assert validate_call(tool, call["arguments"])
                assert call["arguments"]["song"] in clause
                drawn[phrase_values].append(call["arguments"])
    share = lambda calls, key, pool: sum(
        all(v in pools[pool] for v in (c[key] if isinstance(c[key], list) else [c[key]])) for c in calls) / len(calls)
    assert share(drawn[True], "song", "song") > 0.7
    assert share(drawn[True], "message", "message") > 0.6
    assert share(drawn[True], "items", "grocery") > 0.7
    assert share(drawn[True], "city", "city") > 0.45
    assert share(drawn[False], "song", "song") < 0.1      # earlier versions: open-pool words
    assert share(drawn[False], "items", "grocery") < 0.1


def test_descriptions_become_imperatives():
    assert third_to_imperative("Schedules") == "schedule"
    assert third_to_imperative("Applies") == "apply"
    assert third_to_imperative("Watches") == "watch"
    assert description_action("Heats or cools the parked car's cabin ahead of a trip.") == \
        "heat or cool the parked car's cabin ahead of a trip"
    assert description_action("Returns the estimated range in kilometres.") == \
        "get the estimated range in kilometres"
    assert description_action("Calculate the area of a triangle given its base and height.") == \
        "calculate the area of a triangle"
    assert description_action("Playback mode that selects the media in randomized order.") is None


def test_deterministic_for_a_seed(train_tools):
    m1, m2, m3 = (mix.Mixer(seed=s, tools=train_tools) for s in (5, 5, 6))
    a = [json.dumps(m1.example()) for _ in range(30)]
    assert a == [json.dumps(m2.example()) for _ in range(30)]
    assert a != [json.dumps(m3.example()) for _ in range(30)]


def test_render_and_tokenizer_masks_cover_every_answer(conversations, tmp_path):
    """Every assistant turn of a packed conversation is a target of the token file."""
    from needle_cy.training import train

    path = tmp_path / "d.jsonl"
    packed = [ex for ex in conversations if ex.get("packed")][:20]
    path.write_text("".join(json.dumps(ex) + "\n" for ex in packed), encoding="utf-8")
    record = os.path.join(os.path.dirname(data.__file__), "..", "models", "default.cact")
    from needle_cy.archive import Archive
    with Archive.open(record) as archive:
        tok = train.ArchiveTokenizer(archive.tokenizer_bytes)
    train._tokenize(tok, str(path), str(tmp_path / "t.npz"), max_len=1024)
    import numpy as np
    z = np.load(tmp_path / "t.npz")
    im_end = tok.piece_to_id("<|im_end|>")
    call = tok.piece_to_id("<tool_call>")
    for i in range(len(z["offsets"]) - 1):
        ids = z["ids"][z["offsets"][i]:z["offsets"][i + 1]]
        mask = z["target_mask"][z["offsets"][i]:z["offsets"][i + 1]]
        # every <tool_call> marker is inside a target span
        assert all(mask[j] for j in np.nonzero(ids == call)[0])
        assert (mask > 0).sum() < len(mask)
    _check_role_codes(tok, packed, z)


def _check_role_codes(tok, examples, z):
    """The name and value codes of the target mask cover the answers' names and string
    values: each name occurrence starts with one name_start piece, and the pieces coded
    as a name (or value) spell names (values) of the turn's answers."""
    import numpy as np

    from needle_cy.training import train

    codes = train.ROLE_CODES
    assert set(np.unique(z["target_mask"])) <= {0, 1} | set(codes.values())
    n_names = 0
    for i, ex in enumerate(examples):
        ids = z["ids"][z["offsets"][i]:z["offsets"][i + 1]]
        mask = z["target_mask"][z["offsets"][i]:z["offsets"][i + 1]]
        names = {c["name"] for t in (ex.get("history") or []) + [ex] for c in t.get("answers") or []}
        values = {v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, separators=(",", ":"))
                  for t in (ex.get("history") or []) + [ex] for c in t.get("answers") or []
                  for v in c["arguments"].values()}
        j = 0
        while j < len(ids):
            if mask[j] == codes["name_start"]:
                k = j + 1
                while k < len(ids) and mask[k] == codes["name"]:
                    k += 1
                spelled = b"".join(train._piece_bytes(tok, t) for t in ids[j:k]).decode().strip()
                assert spelled in names, (spelled, names)
                n_names += 1
                j = k
            else:
                assert mask[j] != codes["name"]          # a name piece follows its start
                j += 1
        for j in np.nonzero(mask == codes["value"])[0]:
            try:
                piece = train._piece_bytes(tok, ids[j]).decode("utf-8").strip()
            except UnicodeDecodeError:      # one byte of a character written byte by byte
                continue
            assert any(piece in v for v in values) or not piece, (piece, values)
    assert n_names > len(examples)


def test_role_weights_weight_names_and_values(tmp_path):
    import numpy as np

    from needle_cy.training import train

    ids = np.array([2, 10, 11, 12, 13, 14, 15, 1], np.int32)
    mask = np.array([0, 0, 1, 4, 2, 3, 1, 1], np.uint8)
    np.savez(tmp_path / "t.npz", ids=ids, offsets=np.array([0, 8], np.int64),
             prompt_lens=np.array([2], np.int32), target_mask=mask)
    hyper = dict(buckets=[8], tokens_per_batch=8, seed=0, prompt_weight=0.1)
    plain = train.Batches(str(tmp_path), hyper, "t.npz").batch(0)[1][0]
    np.testing.assert_allclose(plain, [0.1, 0.1, 1, 1, 1, 1, 1, 1])
    weighted = train.Batches(str(tmp_path), dict(hyper, role_weights={"name_start": 4, "name": 2, "value": 1.5}),
                             "t.npz").batch(0)[1][0]
    np.testing.assert_allclose(weighted, [0.1, 0.1, 1, 4, 2, 1.5, 1, 1])
    with pytest.raises(ValueError, match="unknown role"):
        train.Batches(str(tmp_path), dict(hyper, role_weights={"keys": 2}), "t.npz")
    with pytest.raises(ValueError, match=">= 1"):
        train.Batches(str(tmp_path), dict(hyper, role_weights={"name": 0.5}), "t.npz")


def test_held_out_cases_come_from_the_held_out_split(corpus_root, train_tools):
    """No gold tool of the held-out cases is a training-split tool."""
    cases = mix.eval_cases(40, seed=11)
    train_keys = {(t["name"], json.dumps(t["parameters"], sort_keys=True)) for t in train_tools}
    assert {c["category"] for c in cases} == {"single", "multi", "refuse"}
    n = 0
    for case in cases:
        for call in case["answers"]:
            tool = next(t for t in case["tools"] if t["name"] == call["name"])
            assert validate_call(tool, call["arguments"])
            assert (tool["name"], json.dumps(tool["parameters"], sort_keys=True)) not in train_keys
            n += 1
    assert n > 20


def test_a_run_retrains_its_tokenizer_on_the_mix(corpus_root, tmp_path):
    """`train tokenizer`: a SentencePiece model on mix text, the same as an archive record
    (the engine's encoder agrees with sentencepiece on fresh mix text), run.json's vocabulary,
    and add-data tokenizes with it."""
    pytest.importorskip("sentencepiece")
    import numpy as np
    from needle_cy.tokenizer import Tokenizer
    from needle_cy.training import train

    run = tmp_path / "run"
    shipped = os.path.join(os.path.dirname(data.__file__), "..", "models", "default.cact")
    train.warm_start(str(run), shipped, params=False)
    train.retrain_tokenizer(str(run), vocab_size=700, examples=120, seed=5)
    meta = json.loads((run / "run.json").read_text())
    assert meta["hyper"]["vocab_size"] == 700 and meta["tokenizer"]["source"] == "mix"
    sp = train.run_tokenizer(str(run))
    assert sp.get_piece_size() == 700
    ours = Tokenizer.from_record_bytes((run / "tokenizer.record").read_bytes())
    for example in mix.generate(5, seed=77):
        prompt, target = data.render(example)
        assert ours.encode(prompt + target, allowed_special="all") == sp.encode(prompt + target)
    train.add_data(str(run), "m", 8, 9, "mix")
    z = np.load(run / "tokens_m.npz")
    assert int(z["ids"].max()) < 700 and len(z["offsets"]) == 9
    train.add_data(str(run), "m2", 12, 9, "mix2")       # version 2: the consumer catalogues too
    z = np.load(run / "tokens_m2.npz")
    assert int(z["ids"].max()) < 700 and len(z["offsets"]) == 13 and "target_mask" in z
    sources = {json.loads(line)["source"] for line in (run / "data_m2.jsonl").read_text().splitlines()}
    assert "catalogue" in sources


def test_marker_spellings_in_outside_text_are_trained_as_text(train_tools, tmp_path):
    """Version 2 writes chat-marker spellings into a few conversations' outside text with
    the answers kept; the token file holds exactly the markers the template writes (the
    agent's encoding), and an example without such text has sentencepiece's ids."""
    import numpy as np
    from needle_cy.archive import Archive
    from needle_cy.training import train

    mixer = mix.Mixer(seed=3, tools=train_tools, version=2, marker_share=0.5)
    plain = mix.Mixer(seed=3, tools=train_tools, version=2, marker_share=0.0)
    examples = [mixer.example() for _ in range(40)]
    same = [plain.example() for _ in range(40)]
    marked = [i for i, ex in enumerate(examples) if ex.get("marker_text")]
    assert 8 <= len(marked) <= 32
    for i, (ex, ref) in enumerate(zip(examples, same)):
        assert ex["answers"] == ref["answers"]          # the same conversations, answers kept
        assert data.has_marker_text(ex) == (i in marked)
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(ex) + "\n" for ex in examples), encoding="utf-8")
    record = os.path.join(os.path.dirname(data.__file__), "..", "models", "default.cact")
    with Archive.open(record) as archive:
        tok = train.ArchiveTokenizer(archive.tokenizer_bytes)
    with pytest.raises(ValueError, match="tokenizer.record"):
        train._tokenize(tok, str(path), str(tmp_path / "x.npz"))
    train._tokenize(tok, str(path), str(tmp_path / "t.npz"), text_tok=tok.tok)
    z = np.load(tmp_path / "t.npz")
    marker_ids = {tok.piece_to_id(m) for m in data.CHAT_MARKERS}
    for i, ex in enumerate(examples):
        ids = z["ids"][z["offsets"][i]:z["offsets"][i + 1]].tolist()
        prompt_ids = ids[1:z["prompt_lens"][i]]
        prompt, target = data.render(ex)
        parts, _ = data.render_parts(ex)
        template_markers = sum(part.count(m) for part in parts if type(part) is str for m in data.CHAT_MARKERS)
        assert sum(prompt_ids.count(m) for m in marker_ids) == template_markers
        assert tok.tok.decode(prompt_ids).strip() == prompt.strip()
        if i not in marked:
            assert prompt_ids == tok.encode(prompt)


# sha256 of the first 50 examples of seed 204 (json.dumps, sort_keys, one a line), taken
# before version 5 was added: a later version's draws must leave earlier streams as they were
STREAM_DIGESTS = {3: "7c3eafb61d138d9778cf4629007d7bd9ba341d3b53e14e0a567d2f9a1e719924",
                  4: "4c8ce628a3ed26d7b21b70887ccbccb6088694c2cabab1230442b898ad985de5",
                  5: "614c06d86a0973a666924f09a514a9d0d60d58a35de430dc694f3ea1aac5c203",   # before version 6
                  6: "ea8557b2836f8d69dfc52cee08ab8c3ab84911c2e800a1b315414796ea8c4525"}   # before version 7


@pytest.mark.parametrize("version", [3, 4, 5, 6])
def test_earlier_versions_draw_the_same_stream(train_tools, version):
    mixer = mix.Mixer(seed=204, tools=train_tools, version=version)
    text = "\n".join(json.dumps(mixer.example(), sort_keys=True, ensure_ascii=False) for _ in range(50))
    assert hashlib.sha256(text.encode("utf-8")).hexdigest() == STREAM_DIGESTS[version]


def test_paraphrase_tables_are_well_formed():
    """Keys lower-case and trimmed, each written once (a dict literal keeps a repeated key's
    last entry silently), entries other words than their key, frames carrying their slots."""
    tree = ast.parse(inspect.getsource(paraphrase))
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            keys = [k.value for k in node.value.keys if isinstance(k, ast.Constant)]
            assert len(keys) == len(set(keys)), (node.targets[0].id, [k for k in keys if keys.count(k) > 1])
    assert len(paraphrase.NOUNS) >= 150 and len(paraphrase.VERBS) >= 100
    for table in (paraphrase.VERBS, paraphrase.NOUNS):
        for key, subs in table.items():
            assert key == key.strip().lower() and key and subs, key
            assert len(set(subs)) == len(subs), key
            for sub in subs:
                assert sub == sub.strip() and sub and sub.lower() != key and not set(sub) & set("{}\"\n"), (key, sub)
    for key, pairs in paraphrase.CLAUSES.items():
        assert key == key.lower() and pairs
        assert all(len(p) == 2 and all(p) for p in pairs), key
    assert all(f.endswith("?") and "{o}" in f and "{a}" in f for f in paraphrase.QUESTION_FRAMES)
    assert all("{a}" in f and ("{o}" in f or "{b}" in f) for f in paraphrase.PLURAL_QUESTION_FRAMES)
    assert all("{o}{a}" in f for f in paraphrase.NEED_FRAMES)
    assert all("{w}{a}" in f for f in paraphrase.CLAUSE_FRAMES)
    assert all("{s}" in f for f in paraphrase.PLACE_CONTEXTS)
    for form, wraps in paraphrase.WRAPS.items():
        assert all("{c}" in w or "{C}" in w for w in wraps), form
    for units, forms in paraphrase.UNIT_FORMS:
        assert units and all("{s}" in f for f in forms)


def _v5_rng(seed):
    rng = data._VersionedRandom(seed)
    rng.phrase_values = rng.paraphrase = True
    return rng


def test_version_5_says_the_tool_in_other_words():
    """A request says the action in people's words, drops the phrases that only point at
    an argument, asks as a question, a noun phrase or a command; the call validates and
    the place is said as it is."""
    tool = {"name": "get_humidity_forecast",
            "description": "Retrieve a humidity forecast for a specific location for a certain number of days.",
            "parameters": {"type": "object", "required": ["location", "days"], "properties": {
                "location": {"type": "string", "description": "The city to forecast."},
                "days": {"type": "integer", "minimum": 1, "maximum": 16, "description": "Number of days"}}}}
    plan = ToolPlan(tool)
    rng = _v5_rng(5)
    clauses = []
    while len(clauses) < 200:
        got = plan.request(rng)
        if got is None:
            continue
        clause, call, _, copied = got
        assert validate_call(tool, call["arguments"])
        assert call["arguments"]["location"] in clause and copied == [call["arguments"]["location"]]
        assert not re.search(r"\b(certain|specific|the location for)\b", clause), clause
        clauses.append(clause)
    forms = {c.form for c in clauses}
    assert {"question", "noun", "imperative"} <= forms, forms
    assert sum("humidity forecast" in c for c in clauses) < 0.5 * len(clauses)
    assert sum(c.startswith("retrieve ") for c in clauses) < 0.2 * len(clauses)
    # the old stream is untouched: the same plan, knob off, says the tool's own words
    plain = data._VersionedRandom(5)
    assert all(type(plan.request(plain)[0]) is str for _ in range(20))


def test_version_5_fills_a_pointing_phrase_with_the_value():
    """"the definition of a word" + word=opera -> "… definition of opera" (or meaning)."""
    tool = {"name": "lookup_definition", "description": "Finds the definition of a word.",
            "parameters": {"type": "object", "required": ["word"],
                           "properties": {"word": {"type": "string"}}}}
    plan = ToolPlan(tool)
    rng = _v5_rng(8)
    filled = 0
    for _ in range(100):
        clause, call, _, _ = plan.request(rng)
        word = call["arguments"]["word"]
        assert word in clause
        filled += bool(re.search(r"\bof ['\"]?" + re.escape(word), clause))
    assert filled > 20


def test_version_5_requests_join_as_people_join_them(train_tools):
    """No command wrapper around a question ("could you what's …"), none inside a negation."""
    mixer = mix.Mixer(seed=7, tools=train_tools, version=5)
    bad = re.compile(r"\b(let's|can you|could you|would you|I need to|I want to|please|time to|help me|"
                     r"we should|I'd like to|don't|do not) (what's|what is|what are|any idea|do you know|"
                     r"are there|can you tell)\b", re.I)
    n = 0
    for _ in range(200):
        ex = mixer.example()
        if ex["source"] != "mix":
            continue
        for query, _ in _turns(ex):
            assert not bad.search(query), query
            n += 1
    assert n > 300


def test_version_5_requests_share_fewer_words_with_their_tool(corpus_root):
    """The same held-out draw (seed 902): version 5's requests hold fewer of the gold
    tool's words than version 4's, and BM25 finds the tool first less often."""
    from needle_cy.training import naturalness

    figures = {v: naturalness.measure(mix.eval_cases(100, seed=902, version=v), None) for v in (4, 5)}
    assert figures[5]["word_share"] < figures[4]["word_share"] - 0.1
    assert figures[5]["bm25_top1"]["accuracy"] < figures[4]["bm25_top1"]["accuracy"] - 0.05


def test_version_6_asks_more_refusals_that_need_the_catalogue(train_tools):
    shares = {}
    for version in (5, 6):
        mixer = mix.Mixer(seed=12, tools=train_tools, version=version)
        kinds = []
        for _ in range(150):
            catalogue = mixer._catalogue([mixer._gold()])
            kinds += [mixer._turn(catalogue, first=False)[4] for _ in range(6)]
        shares[version] = {k: kinds.count(k) / len(kinds) for k in TURN_KINDS}
    for kind in ("refuse_missing_tool", "refuse_missing_value"):
        assert shares[6][kind] > 1.4 * shares[5][kind], (kind, shares)
    assert shares[6]["single"] + shares[6]["multi"] > 0.65


def test_version_7_writes_marker_text_into_three_times_as_many_conversations(train_tools):
    """Version 7 is version 6 with marker_share 0.12: the marked share of 600 conversations
    is near it (a binomial draw: 6–20 % holds with odds of a false alarm below 1e-4), and
    version 6's own share stays near 0.04."""
    shares = {}
    for version in (6, 7):
        mixer = mix.Mixer(seed=11, tools=train_tools, version=version)
        shares[version] = sum(bool(mixer.example().get("marker_text")) for _ in range(600)) / 600
    assert 0.06 <= shares[7] <= 0.20 and shares[6] <= 0.08, shares
