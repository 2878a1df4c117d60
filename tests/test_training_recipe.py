"""The one-command recipe (needle_cy.training.recipe) end to end on a tiny
configuration: a tokenizer and a model from scratch, a schema-general token file, a
phase of training, the export, the confidence head, and the engine running the result.
Needs the ``train`` extra (jax, cactus-needle, sentencepiece); skips, saying why,
without it."""
import json

import pytest

pytest.importorskip("jax", reason="the train extra (jax, cactus-needle) is not installed")
pytest.importorskip("needle.model.architecture", reason="cactus-needle[train] is not installed")
pytest.importorskip("sentencepiece", reason="sentencepiece (train extra) is not installed")

from conftest import shared_path

TINY = {
    "start": "scratch",
    "model": {"d_model": 64, "num_heads": 2, "num_kv_heads": 1, "num_layers": 2, "qk_head_dim": 16,
              "v_head_dim": 16, "global_layers": [1], "engram_layers": [0], "engram_slots": 61,
              "sliding_window": 64, "embedding_dim": 32},
    "hyper": {"examples": 40, "seed": 3, "vocab_size": 512, "tokenizer_examples": 300,
              "tokens_per_batch": 1024, "buckets": [1024], "checkpoint_every": 2, "log_every": 1},
    "data": [{"name": "tiny", "generator": "mix", "examples": 12, "seed": 5}],
    "phases": [[2, 4, 2, "tokens.npz"], [4, 4, 2, "tokens_tiny.npz"]],
    "confidence": {"n": 4, "seed": 7, "mix_share": 0.5, "steps": 2},
    "export": {"bits": 4},
}


@pytest.mark.slow
def test_tiny_recipe_runs_end_to_end(tmp_path, monkeypatch):
    from needle_cy import Needle
    from needle_cy.archive import Archive
    from needle_cy.training import corpus, recipe, train

    monkeypatch.setenv(corpus.CORPUS_ENV, str(shared_path("data", "tool_corpus")))
    config_path = tmp_path / "tiny.json"
    config_path.write_text(json.dumps(TINY))
    out = tmp_path / "tiny.cact"
    recipe.main(["--run-dir", str(tmp_path / "run"), "--out", str(out), "--config", str(config_path)])
    state = train.load_state(str(tmp_path / "run"))
    assert state["step"] == 4
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert {r.get("tokens_file") for r in log if r.get("event") == "start"} == {"tokens.npz", "tokens_tiny.npz"}
    with Archive.open(str(out)) as archive:
        assert archive.config.d_model == 64 and "heads.confidence.probes" in archive.roles
    agent = Needle(str(out), tools=[{"name": "lock_door", "description": "Lock a door",
                                     "parameters": {"type": "object", "properties": {}}}])
    response = agent.complete("lock the door")
    assert isinstance(response["function_calls"], list)
    # a second run resumes: nothing left to train
    recipe.main(["--run-dir", str(tmp_path / "run"), "--out", str(out), "--config", str(config_path)])
    assert train.load_state(str(tmp_path / "run"))["step"] == 4


def test_tiny_recipe_with_the_torch_trainer_warm_starts_from_an_archive(tmp_path, monkeypatch):
    """``"trainer": "torch"``: a warm start from an archive (the folder only; the PyTorch
    trainer reads the archive itself), a schema-general token file, two phases, the
    export, and the engine running it."""
    pytest.importorskip("torch", reason="torch (train extra) is not installed")
    from needle_cy import Needle
    from needle_cy.archive import Archive
    from needle_cy.testing import make_random_archive
    from needle_cy.training import corpus, recipe, torch_train, train

    monkeypatch.setenv(corpus.CORPUS_ENV, str(shared_path("data", "tool_corpus")))
    base = tmp_path / "base.cact"
    with Archive.open(str(recipe_base_archive())) as shipped:
        tokenizer = shipped.tokenizer_bytes
    make_random_archive(base, layers=2, d_model=64, vocab=4096, bits=4, engram_slots=7, heads=False,
                        tokenizer_from=str(recipe_base_archive()))
    with Archive.open(str(base)) as archive:
        cfg = archive.config
    config = {"start": "warm", "trainer": "torch", "torch_options": {"threads": 1},
              "model": {}, "hyper": {"tokens_per_batch": 1024, "buckets": [1024], "checkpoint_every": 2,
                                     "log_every": 1, "seed": 3},
              "data": [{"name": "tiny", "generator": "mix", "examples": 8, "seed": 5}],
              "phases": [[2, 4, 2, "tokens_tiny.npz"], [4, 4, 2, "tokens_tiny.npz"]],
              "confidence": None, "export": {"bits": 4}}
    config_path = tmp_path / "tiny.json"
    config_path.write_text(json.dumps(config))
    out = tmp_path / "tuned.cact"
    recipe.main(["--run-dir", str(tmp_path / "run"), "--out", str(out), "--config", str(config_path),
                 "--base", str(base)])
    assert torch_train.load_checkpoint(str(tmp_path / "run"))["step"] == 4
    assert train.load_state(str(tmp_path / "run")) is None          # no JAX state was made
    with Archive.open(str(out)) as archive:
        assert archive.config.d_model == cfg.d_model and archive.tokenizer_bytes == tokenizer
    agent = Needle(str(out), tools=[{"name": "lock_door", "description": "Lock a door",
                                     "parameters": {"type": "object", "properties": {}}}])
    assert isinstance(agent.complete("lock the door")["function_calls"], list)


def recipe_base_archive():
    from pathlib import Path
    return Path(__file__).resolve().parent.parent / "needle_cy" / "models" / "default.cact"


def test_auto_trainer_measures_once_and_keeps_its_choice(tmp_path, monkeypatch):
    """``"trainer": "auto"``: the candidates train a few steps of the run on a copy, the
    fastest is kept in trainer.json and trains the run; a rerun reuses the choice."""
    pytest.importorskip("torch", reason="torch (train extra) is not installed")
    from needle_cy.testing import make_random_archive
    from needle_cy.training import corpus, recipe, torch_train

    monkeypatch.setenv(corpus.CORPUS_ENV, str(shared_path("data", "tool_corpus")))
    base = tmp_path / "base.cact"
    make_random_archive(base, layers=1, d_model=32, vocab=4096, bits=4, engram_slots=7, heads=False,
                        tokenizer_from=str(recipe_base_archive()))
    measured = []
    real = recipe.measure_trainers

    def two_torch_candidates(run_dir, tokens, candidates=None):
        out = real(run_dir, tokens, [("torch", {"precision": "fp32", "threads": 1}),
                                     ("torch", {"precision": "bf16", "threads": 1})], steps=4)
        measured.append(out)
        return out

    monkeypatch.setattr(recipe, "measure_trainers", two_torch_candidates)
    config = {"start": "warm", "trainer": "auto", "model": {},
              "hyper": {"tokens_per_batch": 1024, "buckets": [1024], "checkpoint_every": 2, "log_every": 1,
                        "seed": 3},
              "data": [{"name": "tiny", "generator": "mix", "examples": 8, "seed": 5}],
              "phases": [[3, 3, 1, "tokens_tiny.npz"]], "confidence": None, "export": {"bits": 4}}
    config_path = tmp_path / "auto.json"
    config_path.write_text(json.dumps(config))
    args = ["--run-dir", str(tmp_path / "run"), "--out", str(tmp_path / "m.cact"), "--config",
            str(config_path), "--base", str(base)]
    recipe.main(args)
    choice = json.loads((tmp_path / "run" / "trainer.json").read_text())
    speeds = [r["tok_per_s"] for r in choice["measured"]]
    assert len(speeds) == 2 and all(s > 0 for s in speeds)
    assert choice["trainer"] == "torch"
    assert choice["options"] == choice["measured"][speeds.index(max(speeds))]["options"]
    assert torch_train.load_checkpoint(str(tmp_path / "run"))["step"] == 3
    assert (tmp_path / "m.cact").exists()
    recipe.main(args)                                   # resumes: no second measurement
    assert len(measured) == 1
