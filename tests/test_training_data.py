"""The synthetic training data: deterministic, parses, and validates against the tools."""
import json
import re

import pytest

from needle_cy.training import data

jsonschema = pytest.importorskip("jsonschema")

N = 1500


@pytest.fixture(scope="module", params=[1, 2, 3, 4, 7], ids=["v1", "v2", "v3", "v4", "v7"])
def examples(request):
    return data.generate(N, seed=7, version=request.param)


def test_deterministic_for_a_seed():
    a = data.generate(50, seed=3)
    b = data.generate(50, seed=3)
    c = data.generate(50, seed=4)
    assert a == b
    assert a != c


def test_calls_validate_against_the_rendered_tools(examples):
    for ex in examples:
        assert 1 <= len(ex["tools"]) <= data.MAX_RENDERED_TOOLS
        names = [t["name"] for t in ex["tools"]]
        assert len(set(names)) == len(names)
        by_name = {t["name"]: t for t in ex["tools"]}
        for turn in ex["history"] + [ex]:
            for call in turn["answers"]:
                assert call["name"] in by_name, (ex["query"], call)
                schema = by_name[call["name"]]["parameters"]
                jsonschema.Draft202012Validator(schema).validate(call["arguments"])
                # arguments are written in schema property order
                order = list(schema.get("properties", {}))
                keys = list(call["arguments"])
                assert keys == sorted(keys, key=order.index)


def test_catalogue_calls_follow_the_labelling_rules(examples):
    catalogue = {t["name"]: t for t in data.load_catalogue()}
    seen = set()
    for ex in examples:
        calls = ex["answers"]
        assert len({c["name"] for c in calls}) == len(calls)  # no tool twice in a case
        for call in calls:
            if call["name"] not in catalogue:
                continue
            # a catalogue name always means the catalogue's schema
            assert next(t for t in ex["tools"] if t["name"] == call["name"]) == catalogue[call["name"]]
            seen.add(call["name"])
            args = call["arguments"]
            if call["name"] == "set_alarm":
                assert re.fullmatch(r"([01][0-9]|2[0-3]):[0-5][0-9]", args["time"])
            if call["name"] == "set_thermostat":
                assert (args["temperature"] * 2) == int(args["temperature"] * 2)
            if call["name"] == "play_music":
                q = args["query"].lower()
                assert not q.startswith("some ") and "playlist" not in q and "music" not in q
            if call["name"] == "set_light" and "brightness" in args:
                assert args["on"] is True
    assert seen == set(catalogue)  # every tool is exercised


def test_numbers_and_phrasing_conventions():
    rng = __import__("random").Random(0)
    assert data.number_words(0) == "zero"
    assert data.number_words(45) == "forty-five"
    assert data.number_words(105) == "one hundred and five"
    assert data.json_number(21.0) == 21 and isinstance(data.json_number(21.0), int)
    assert data.json_number(21.5) == 21.5
    for _ in range(300):
        minutes, said = data._duration(rng)
        if said == "an hour and a half":
            assert minutes == 90
        if said == "half an hour":
            assert minutes == 30
        hhmm, said = data._clock(rng)
        if said.endswith(("pm", "PM", "p.m.")) and not said.startswith(("12", "twelve")):
            assert int(hhmm[:2]) >= 13


def test_mix_of_kinds(examples):
    kinds = {}
    for ex in examples:
        kinds[ex["kind"]] = kinds.get(ex["kind"], 0) + 1
    for kind in ("single", "multi", "refuse", "invented", "invented_refuse", "result"):
        assert kinds.get(kind, 0) > 0, kind
    refusals = sum(1 for ex in examples if not ex["answers"])
    assert 0.1 < refusals / len(examples) < 0.45


def test_render_matches_the_template(examples):
    for ex in examples[:300]:
        prompt, target = data.render(ex)
        tools_json = json.dumps(ex["tools"], separators=(",", ":"), ensure_ascii=False)
        assert f"<|im_start|>user\n<tools>{tools_json}</tools>\n" in prompt
        assert prompt.endswith("<|im_end|>\n<|im_start|>assistant\n")
        if ex["system"]:
            assert prompt.startswith(f"<|im_start|>system\n{ex['system']}<|im_end|>\n")
        else:
            assert prompt.startswith("<|im_start|>user\n")
        m = re.fullmatch(r"(?:<think>\n(.+)\n</think>\n)?<tool_call>(.*)</tool_call><\|im_end\|>",
                         target, re.S)
        assert m, target
        assert json.loads(m.group(2)) == ex["answers"]
        assert m.group(2) == json.dumps(ex["answers"], separators=(",", ":"), ensure_ascii=False)
        if ex.get("is_result"):
            assert "<tool_result>" in prompt and ex["answers"] == []


def test_never_reads_the_dev_set():
    import inspect
    source = inspect.getsource(data)
    assert "home_dev" not in source


def test_version_1_stream_is_the_shipped_recipe():
    """The shipped model's first phases trained on version-1 data from seed 0: the
    generator must keep producing exactly that stream (a digest of its first examples,
    recorded when version 2 was added)."""
    import hashlib
    digest = hashlib.sha256(json.dumps(data.generate(300, seed=0), sort_keys=True).encode()).hexdigest()
    assert digest == "5b76cd3e85df5db860ad44d8b159491dcecf85c950108faf37c829535bf29c31"


@pytest.mark.parametrize("version, expected", [
    (2, "92cfbcb958979807a7f342c6f78c0072ff8e335bcd86d0d80662282bbcefed2a"),
    (3, "1a754c121ee1bd62af509cc2adb34760ae4aeb6ecff3504c3df1fa12d3926588"),
    (4, "4bf6a0461de6f6b07eb4797d07af1a0b5121dc22a753cb5efcd042115da323cf"),
    (5, "dc8582666b2bef9f501a7647db815df9a242bd94d561671d0e4cea8bcc41821f"),
    (6, "3cffb93b3a347f1a898c9e522ef569f6b70b2fb3e16838048e5940382ab58b15"),
    (7, "068bd849e80ae5fb7a0bf523c00e19eaec306be1c387957d2f6e09f1b6d023e5"),
])
def test_versions_2_to_7_streams_are_pinned(version, expected):
    """The shipped model's later phases trained on version-2 to -5 data, the recorded
    experiments on 6 and 7: later versions' phrasings draw only when their knob is on, so
    these streams never change (digests recorded when each was added; 5-7 when version 7
    was)."""
    import hashlib
    digest = hashlib.sha256(json.dumps(data.generate(400, seed=0, version=version),
                                       sort_keys=True).encode()).hexdigest()
    assert digest == expected


def test_version_4_says_times_relative_to_the_hour_and_durations_as_adjectives():
    import random
    rng = data._VersionedRandom(0)
    words = {data.number_words(h): h for h in range(1, 13)}
    seen = set()
    for _ in range(400):
        hhmm, said = data._clock_relative(rng)
        m = re.match(r"(quarter|half|ten|twenty|five|twenty-five) (to|past) (\w+) (.+)$", said)
        assert m, said
        how, rel, hour, part = m.groups()
        hour = words.get(hour) or int(hour)
        pm = part in ("pm", "p.m.", "in the afternoon", "in the evening")
        offset = {"quarter": 15, "half": 30, "ten": 10, "twenty": 20, "five": 5, "twenty-five": 25}[how]
        total = ((hour % 12 + (12 if pm else 0)) * 60 + (offset if rel == "past" else -offset)) % 1440
        assert hhmm == f"{total // 60:02d}:{total % 60:02d}", said
        seen.add(rel)
    assert seen == {"to", "past"}
    assert data._clock_relative(random.Random(1)) == data._clock_relative(random.Random(1))
    assert data._adjectival("two hours") == "two hour"
    assert data._adjectival("25 minutes") == "25 minute"
    assert data._adjectival("an hour") == "one hour"
    ex = data.generate(3000, seed=5, version=4)
    timers = [t for e in ex for t in e["history"] + [e]
              if any(c["name"] == "set_timer" and "label" in c["arguments"] for c in t["answers"])]
    before = [t for t in timers if re.search(r"\d+ minute (\w+ )+timer|hour (\w+ )+timer", t["query"])]
    assert before, "no label said before the word timer"
    for t in before:
        label = next(c["arguments"]["label"] for c in t["answers"] if c["name"] == "set_timer")
        assert label.lower() in t["query"].lower()


def test_version_2_values_come_from_the_open_pool_and_are_said_in_the_request():
    words = json.load(open(data.WORDS_PATH, encoding="utf-8"))
    pool = set(words["words"])
    v2 = data.generate(3000, seed=11, version=2)
    open_items, list_items = 0, 0
    for ex in v2:
        for call in ex["answers"]:
            if call["name"] == "add_to_shopping_list":
                item = call["arguments"]["item"]
                if item in data.ITEMS:
                    list_items += 1
                else:
                    assert set(item.split()) <= pool, item
                    open_items += 1
                # copyable: the value appears in the request (typos never touch it)
                assert item.lower() in ex["query"].lower(), (item, ex["query"])
    assert open_items > 20 and list_items > 20      # about half and half


def test_version_2_distractors_include_retrieval_look_alikes():
    from needle_cy.retrieval import rank_bm25
    from needle_cy.toolspec import normalize_tools
    specs = normalize_tools(data.load_catalogue())
    names = [s.name for s in specs]
    v2 = [ex for ex in data.generate(1500, seed=5, version=2)
          if ex["kind"] == "single" and len(ex["tools"]) == data.MAX_RENDERED_TOOLS]
    hard = 0
    for ex in v2:
        needed = {c["name"] for c in ex["answers"]}
        ranked = [n for n in (names[i] for i in rank_bm25(ex["query"], specs)) if n not in needed]
        shown = {t["name"] for t in ex["tools"]} - needed
        hard += shown == set(ranked[:len(shown)])
    assert 0.3 < hard / len(v2) < 0.8         # half the lists are the top-ranked look-alikes


def test_version_2_tool_results_are_rendered_as_the_agent_sends_them():
    from needle_cy.prompt import tool_result_text
    v2 = [ex for ex in data.generate(3000, seed=2, version=2) if ex.get("history") or ex.get("is_result")]
    assert v2
    for ex in v2:
        prompt, _ = data.render(ex)
        for body in re.findall(r"<tool_result>(.*?)</tool_result>", prompt):
            results = json.loads(body)
            assert tool_result_text(results).split("<tool_result>")[1].split("</tool_result>")[0] == body


def test_unknown_data_version_is_refused():
    with pytest.raises(ValueError, match="data version"):
        data.Generator(version=8)


def test_version_5_values_start_with_tokenizer_word_pieces_said_in_the_request():
    """Version 5 draws most open-pool words from the tokenizer's word pieces, so
    string values start with pieces the earlier pools never wrote there."""
    words = json.load(open(data.WORDS_PATH, encoding="utf-8"))
    vocab, pool = set(words["vocab_words"]), set(words["words"])
    assert len(vocab) > 1000
    firsts = []
    for ex in data.generate(2000, seed=12, version=5):
        for turn in ex["history"] + [ex]:
            for call in turn["answers"]:
                if call["name"] in ("add_to_shopping_list", "send_notification"):
                    value = call["arguments"].get("item") or call["arguments"]["message"]
                    assert value.lower() in turn["query"].lower(), (value, turn["query"])
                    firsts.append(value.split()[0])
    from_vocab = [w for w in firsts if w in vocab and w not in pool]
    assert len(from_vocab) > 0.15 * len(firsts), (len(from_vocab), len(firsts))
    assert len(set(from_vocab)) > 400


def test_eval_cases_are_scoreable_single_turn_cases(tmp_path):
    from needle_cy.eval import load_cases
    from needle_cy.training.data import eval_cases, main
    cases = eval_cases(120, seed=4242)
    assert cases and {c["category"] for c in cases} == {"single", "multi", "refuse"}
    for c in cases:
        assert c["answers"] == [] if c["category"] == "refuse" else c["answers"]
        if "tools" in c:       # invented tools travel with their case
            names = {t["name"] for t in c["tools"]}
            assert {a["name"] for a in c["answers"]} <= names
    path = tmp_path / "held_out.jsonl"
    main(["--out", str(path), "-n", "120", "--seed", "4242", "--version", "2", "--eval-cases"])
    assert load_cases(str(path)) == cases
    # packed versions (3+) give their conversations' first requests
    packed = data.generate(60, seed=4243, version=5)
    v5 = eval_cases(60, seed=4243, version=5)
    assert len(v5) > 40 and {c["category"] for c in v5} == {"single", "multi", "refuse"}
    firsts = {(e["history"][0]["query"], json.dumps(e["history"][0]["answers"])) for e in packed if e.get("packed")}
    assert sum((c["query"], json.dumps(c["answers"])) in firsts for c in v5) > 30


def test_version_3_packs_follow_up_requests_on_the_rendered_tools():
    exs = data.generate(400, seed=11, version=3)
    v2 = data.generate(400, seed=11, version=2)
    packed = [e for e in exs if e.get("packed")]
    assert len(packed) > 300
    assert {e["packed"] for e in packed} == {2, 3, 4}
    # the stream starts as version 2 does: a conversation that already has a second turn
    # (a tool result or a new request) is kept whole; otherwise its request comes first
    i = next(i for i, e in enumerate(v2) if not e["history"])
    assert exs[:i] == v2[:i]
    assert exs[i]["history"][0]["query"] == v2[i]["query"]
    assert exs[i]["history"][0]["answers"] == v2[i]["answers"]
    for e in packed:
        turns = e["history"] + [e]
        assert len(turns) == e["packed"]
        assert all(t.get("results") is None for t in e["history"])
        prompt, target = data.render(e)
        for t in e["history"]:
            assert t["query"] + "<|im_end|>\n<|im_start|>assistant\n" in prompt
        assert prompt.count("<|im_start|>assistant\n") == len(turns)
    assert any(t["answers"] == [] for e in packed for t in e["history"][1:] + [e])


def test_drop_last_turn_makes_the_previous_request_final():
    e = next(e for e in data.generate(50, seed=11, version=3) if e.get("packed") == 3)
    shorter = data.drop_last_turn(e)
    assert shorter["query"] == e["history"][-1]["query"]
    assert shorter["answers"] == e["history"][-1]["answers"]
    assert shorter["history"] == e["history"][:-1]
    assert data.drop_last_turn(data.drop_last_turn(shorter)) is None
    single = data.generate(1, seed=1, version=2)[0]
    assert single["history"] or data.drop_last_turn(single) is None


def test_every_assistant_turn_is_a_target_in_the_token_mask(tmp_path):
    """train._assistant_spans finds each answer; Batches weights them 1, the rest the
    prompt weight; a token file without a mask keeps the one-target behaviour."""
    import numpy as np
    from needle_cy.training import train
    header, im_end = [4, 460, 30], 5
    seq = [2, 9, 9, 4, 460, 30, 77, 78, 5, 30, 4, 11, 5, 30, 4, 460, 30, 79, 5, 1]
    assert train._assistant_spans(seq, header, im_end) == [(6, 9), (17, 19)]
    mask = np.zeros(len(seq), np.uint8)
    mask[6:9] = 1
    mask[17:] = 1
    np.savez(tmp_path / "tokens_m.npz", ids=np.asarray(seq, np.int32),
             offsets=np.asarray([0, len(seq)], np.int64), prompt_lens=np.asarray([17], np.int32),
             target_mask=mask)
    np.savez(tmp_path / "tokens_p.npz", ids=np.asarray(seq, np.int32),
             offsets=np.asarray([0, len(seq)], np.int64), prompt_lens=np.asarray([17], np.int32))
    hyper = dict(train.HYPER, buckets=[32], tokens_per_batch=32)
    ids, w, _ = train.Batches(str(tmp_path), hyper, "tokens_m.npz").batch(0)
    assert list(ids[0, :len(seq)]) == seq
    # compared as arrays of w's dtype: a float32 element == the Python float 0.1 only under
    # NumPy 2's scalar promotion (NumPy 1.24, which pyproject allows, compares in float64)
    expected = np.asarray([1.0 if m else hyper["prompt_weight"] for m in mask], w.dtype)
    np.testing.assert_array_equal(w[0, :len(seq)], expected)
    assert w[0, len(seq):].sum() == 0
    _, w, _ = train.Batches(str(tmp_path), hyper, "tokens_p.npz").batch(0)
    assert (w[0, :17] == hyper["prompt_weight"]).all() and (w[0, 17:len(seq)] == 1.0).all()


def test_copy_probe_cases_are_valid_calls_on_said_words(tmp_path):
    from needle_cy.eval import load_cases
    cases = data.copy_probe_cases(12, seed=5)
    assert cases == data.copy_probe_cases(12, seed=5) != data.copy_probe_cases(12, seed=6)
    assert len(cases) == 2 * 12 * len(data.COPY_PROBE_TEMPLATES)
    assert {c["category"] for c in cases} == {"copy_pool", "copy_piece"}
    by_name = {t["name"]: t for t in data.load_catalogue()}
    words = json.load(open(data.WORDS_PATH, encoding="utf-8"))
    for case in cases:
        (call,) = case["answers"]
        jsonschema.Draft202012Validator(by_name[call["name"]]["parameters"]).validate(call["arguments"])
        word = case["id"].rsplit("-", 1)[1]
        assert word in case["query"].split() and word in call["arguments"].values()
        assert (word in words["words"]) == (case["category"] == "copy_pool")
    path = str(tmp_path / "probe.jsonl")
    data.main(["--copy-probe", "-n", "12", "--seed", "5", "--out", path])
    assert [c["id"] for c in load_cases(path)] == [c["id"] for c in cases]


def test_shipped_phases_are_well_formed_and_the_anneal_is_continuous():
    """The recipe behind the shipped archive: phases advance, train on known data, and a
    phase with its own LR floor (the final anneal) starts at the LR the run was at."""
    from needle_cy.training.train import lr_at
    from needle_cy.training.train_default import EXTRA_DATA, SHIPPED_PHASES, phase_control
    hyper = {"peak_lr": 2e-3, "min_lr_ratio": 0.1, "warmup": 50}
    steps = [p[0] for p in SHIPPED_PHASES]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    for i, phase in enumerate(SHIPPED_PHASES):
        assert phase[3] == "tokens.npz" or phase[3] in EXTRA_DATA
        ctl = phase_control(phase)
        assert ctl["end"] >= phase[0] and ctl["decay_steps"] > 0
        if len(phase) > 4:
            assert 0 < ctl["min_lr_ratio"] < hyper["min_lr_ratio"]
            prev = SHIPPED_PHASES[i - 1]
            before = lr_at(prev[0] - 1, hyper, prev[1], prev[2], phase_control(prev).get("min_lr_ratio"))
            after = lr_at(prev[0], hyper, ctl["end"], ctl["decay_steps"], ctl["min_lr_ratio"])
            assert after == pytest.approx(before, rel=0.01)
            last = lr_at(phase[0] - 1, hyper, ctl["end"], ctl["decay_steps"], ctl["min_lr_ratio"])
            assert last < before        # it anneals
    # the override reaches its own floor; without it the hyper's floor holds
    assert lr_at(10_000, hyper, 10_000, 1_000, 0.01) == pytest.approx(2e-5)
    assert lr_at(10_000, hyper, 10_000, 1_000) == pytest.approx(2e-4)


def test_version_6_is_version_5_with_source_first_notes_on_every_turn():
    v5 = data.generate(60, seed=3, version=5, think_rate=1.0)
    v6 = data.generate(60, seed=3, version=6)
    assert all(ex["reasoning"] for ex in v6 if not ex.get("is_result"))   # a [] after results has none
    rewritten = 0
    for a, b in zip(v5, v6):
        assert (a["query"], a["answers"], a["tools"]) == (b["query"], b["answers"], b["tools"])
        if a["answers"] and a["reasoning"]:
            lines = [line.split(": ", 1) for line in a["reasoning"].split("\n")]
            assert b["reasoning"] == "\n".join(
                name + ": " + "; ".join(data._source_first(n) for n in notes.split("; "))
                for name, notes in lines)
        assert not re.search(r'= [^;\n]* from "', b["reasoning"])    # no value-first note left
        rewritten += a["reasoning"] != b["reasoning"]
    assert rewritten >= 10
    assert data._source_first('query = "jazz" from "some jazz"') == 'query from "some jazz" = "jazz"'
    assert data._source_first('label = "pasta"') == 'label = "pasta"'


def test_version_7_widens_requests_and_refusals():
    import random
    rng = data._VersionedRandom(1)
    rng.wider_requests = rng.more_phrasings = True
    said = [data._near_miss_v7(rng) for _ in range(200)]
    assert all(near and set(near) <= {t["name"] for t in data.load_catalogue()} for _, near in said)
    assert any(re.search(r"\d|o'clock|past|to ", q) and "alarm" in q for q, _ in said)   # a time, no call
    queries = [ex["query"].lower() for ex in data.generate(1500, seed=2, version=7)]
    assert any(q.rstrip(".!?") in data.CLOSINGS or any(q.startswith(c) for c in data.CLOSINGS)
               for q in queries)
    assert any("the music" in q and "percent" in q for q in queries)
    v5 = data.generate(300, seed=2, version=5)
    v7 = data.generate(300, seed=2, version=7)
    assert [ex["query"] for ex in v5] != [ex["query"] for ex in v7]
    assert not any(re.search(r' from "[^"]*" = ', ex["reasoning"]) for ex in v7)   # notes value-first


def test_merge_tokens_concatenates_and_compresses(tmp_path):
    import numpy as np
    from needle_cy.training import train

    def token_file(path, seqs, mask=True):
        ids = np.concatenate([np.asarray(s, np.int32) for s in seqs])
        offsets = np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.int64)
        arrays = dict(ids=ids, offsets=offsets, prompt_lens=np.full(len(seqs), 2, np.int32))
        if mask:
            arrays["target_mask"] = (ids % 2).astype(np.uint8)
        np.savez(path, **arrays)
        return path

    a = token_file(tmp_path / "a.npz", [[2, 5, 6, 1], [2, 7, 1]])
    b = token_file(tmp_path / "b.npz", [[2, 9, 9, 9, 1]])
    out = train.merge_tokens([a, b], tmp_path / "ab.npz")
    z = np.load(out)
    assert z["ids"].dtype == np.uint16
    assert z["ids"].tolist() == [2, 5, 6, 1, 2, 7, 1, 2, 9, 9, 9, 1]
    assert z["offsets"].tolist() == [0, 4, 7, 12]
    assert z["prompt_lens"].tolist() == [2, 2, 2]
    assert z["target_mask"].tolist() == [i % 2 for i in z["ids"].tolist()]
    hyper = dict(buckets=[16], tokens_per_batch=32, seed=0, prompt_weight=0.1)
    ids, weights, _ = train.Batches(str(tmp_path), hyper, "ab.npz").batch(0)   # the trainer reads it
    seqs = [[2, 5, 6, 1], [2, 7, 1], [2, 9, 9, 9, 1]]
    assert ids.shape == (2, 16)
    assert all([int(x) for x in row[row > 0]] in seqs for row in ids)
    with pytest.raises(ValueError, match="target_mask"):
        train.merge_tokens([a, token_file(tmp_path / "c.npz", [[2, 1]], mask=False)], tmp_path / "x.npz")


def test_a_token_file_switched_in_mid_run_starts_at_its_first_batch(tmp_path):
    """control.json's ``tokens_from_step`` makes run step N read the file's batch 0 (a run
    that switches data at step N would otherwise skip the file's first N batches)."""
    import numpy as np
    from needle_cy.training import train

    rows = [list(range(3 + i, 3 + i + 10)) for i in range(40)]
    ids = np.asarray([t for r in rows for t in r], np.int32)
    offsets = np.asarray([0] + [10 * (i + 1) for i in range(40)], np.int64)
    np.savez(tmp_path / "tokens_s.npz", ids=ids, offsets=offsets, prompt_lens=np.full(40, 4, np.int32))
    hyper = dict(train.HYPER, buckets=[16], tokens_per_batch=16)
    plain = train.Batches(str(tmp_path), hyper, "tokens_s.npz")
    assert train.read_tokens_start(str(tmp_path)) == 0
    (tmp_path / "control.json").write_text(json.dumps({"tokens": "tokens_s.npz", "tokens_from_step": 700}))
    assert train.read_tokens_file(str(tmp_path)) == "tokens_s.npz"
    assert train.read_tokens_start(str(tmp_path)) == 700
    switched = train.Batches(str(tmp_path), hyper, "tokens_s.npz", train.read_tokens_start(str(tmp_path)))
    for k in range(5):
        np.testing.assert_array_equal(switched.batch(700 + k)[0], plain.batch(k)[0])
    assert not np.array_equal(switched.batch(700)[0], plain.batch(700)[0])   # what it would read unset
