"""The PyTorch trainer (needle_cy.training.torch_train) on a tiny synthetic run.

The run folder follows train.py's conventions (run.json, tokens.npz, control.json,
log.jsonl); the data is a learnable pattern (counting sequences), so a few dozen steps
must lower the loss.  The trained model is exported with needle_cy's writer, loaded by
the engine, and both decode the same greedy tokens.
"""
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is a training-only dependency (pip install '.[train]')")

from needle_cy.model import Model  # noqa: E402
from needle_cy.training import torch_train  # noqa: E402
from needle_cy.training.torch_model import NeedleTorch  # noqa: E402

VOCAB = 64
MODEL = dict(d_model=32, num_heads=2, num_kv_heads=1, num_layers=2, qk_head_dim=8, v_head_dim=8,
             max_seq_len=64, rope_theta=10000.0, mhc_lanes=2, qkv_conv_taps=3, sliding_window=16,
             global_layers=[1], engram_orders=[2, 3], engram_heads=0, engram_slots=31,
             engram_seed_heads=0, engram_layers=[0], kv_bits=8, out_vocab=0)
HYPER = dict(vocab_size=VOCAB, seed=0, peak_lr=1e-2, min_lr_ratio=0.1, warmup=5, total_steps=60,
             decay_steps=20, weight_decay=0.05, b1=0.9, b2=0.95, clip=1.0, prompt_weight=0.1,
             tokens_per_batch=256, buckets=[32], checkpoint_every=10, log_every=5)


def _sequence(rng):
    start, step = int(rng.integers(0, 60)), int(rng.integers(1, 3))
    body = [4 + (start + step * i) % 60 for i in range(int(rng.integers(12, 30)))]
    return [2] + body + [1]


def make_run(path, n=400, seed=0):
    path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    ids, offsets, prompt_lens = [], [0], []
    for _ in range(n):
        seq = _sequence(rng)
        ids += seq
        offsets.append(len(ids))
        prompt_lens.append(3)
    np.savez(path / "tokens.npz", ids=np.asarray(ids, np.int32), offsets=np.asarray(offsets, np.int64),
             prompt_lens=np.asarray(prompt_lens, np.int32))
    (path / "run.json").write_text(json.dumps({"model": MODEL, "hyper": HYPER}))
    return path


def _log(path):
    return [json.loads(line) for line in (path / "log.jsonl").read_text().splitlines()]


def _engine_greedy(model, prompt, n):
    logits = model.prefill(prompt)
    out = []
    for _ in range(n):
        tok = int(np.argmax(logits))
        out.append(tok)
        logits = model.step(tok)
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run = make_run(tmp_path_factory.mktemp("torch_run") / "run")
    torch.set_num_threads(1)
    trainer = torch_train.fit(str(run), steps=40, qat=True, threads=1)
    return run, trainer


def test_training_lowers_the_loss(trained):
    run, trainer = trained
    steps = [r for r in _log(run) if "loss" in r]
    assert steps[-1]["step"] == 40 and trainer.state["step"] == 40
    assert steps[0]["loss"] > 3.0                         # ≈ ln(64) = 4.16 at the start
    assert steps[-1]["loss"] < 0.5 * steps[0]["loss"]
    assert steps[-1]["target_ce"] < 0.5 * steps[0]["target_ce"]
    assert (run / torch_train.STATE).exists()


def test_export_decodes_the_same_greedy_tokens(trained, tmp_path):
    run, trainer = trained
    out = torch_train.export(str(run), tmp_path / "tiny.cact", bits=4)
    prompt = [2, 10, 12, 14]
    model = trainer.model.cpu().eval()
    ours = model.greedy(prompt, 12, cq=True)                  # the QAT weight numerics = the archive's
    engine = Model.load(out, numerics="float")
    assert _engine_greedy(engine, prompt, 12) == ours
    assert ours[:4] == [16, 18, 20, 22]                       # it learned the pattern
    loaded, _ = NeedleTorch.from_archive(out)
    assert loaded.greedy(prompt, 12) == ours


def test_resume_equals_one_run(tmp_path):
    """Two fits of 6 steps (resumed from the checkpoint) give the parameters of one fit of 12."""
    a = make_run(tmp_path / "a")
    b = make_run(tmp_path / "b")
    torch_train.fit(str(a), steps=6, threads=1)
    torch_train.fit(str(a), steps=6, threads=1)
    tb = torch_train.fit(str(b), steps=12, threads=1)
    ta = torch_train.load_checkpoint(str(a))
    assert ta["step"] == 12
    for name, value in tb.model.state_dict().items():
        np.testing.assert_allclose(ta["model"][name].numpy(), value.cpu().numpy(), rtol=1e-6, atol=1e-7,
                                   err_msg=name)


def test_control_json_moves_the_end(tmp_path):
    run = make_run(tmp_path / "c")
    (run / "control.json").write_text(json.dumps({"end": 7, "decay_steps": 3}))
    trainer = torch_train.fit(str(run), threads=1)
    assert trainer.state["step"] == 7
    lrs = [r["lr"] for r in _log(run) if "lr" in r]
    # the last step (index 6) is 2 of the 3 decay steps down from the peak to peak·min_lr_ratio
    peak, floor = HYPER["peak_lr"], HYPER["peak_lr"] * HYPER["min_lr_ratio"]
    assert lrs[-1] == pytest.approx(peak + (floor - peak) * 2 / 3, rel=1e-4)
    assert lrs[0] == pytest.approx(peak)


def test_bf16_autocast_step_runs(tmp_path):
    run = make_run(tmp_path / "d")
    trainer = torch_train.fit(str(run), steps=5, precision="bf16", threads=1)
    losses = [r["loss"] for r in _log(run) if "loss" in r]
    assert trainer.state["step"] == 5 and np.isfinite(losses).all()
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())   # master weights stay fp32


def test_fine_tune_from_the_shipped_archive(tmp_path):
    """--init starts from an archive: step 0 is the archive's model; an export without
    training writes the same logits."""
    from pathlib import Path

    default = Path(__file__).resolve().parent.parent / "needle_cy" / "models" / "default.cact"
    run = make_run(tmp_path / "e")
    spec = json.loads((run / "run.json").read_text())
    spec["hyper"]["vocab_size"] = 4096
    (run / "run.json").write_text(json.dumps(spec))
    trainer = torch_train.Trainer(str(run), init=str(default), threads=1)
    assert trainer.model.cfg.d_model == 256 and "confidence" in trainer.model.heads
    trainer.checkpoint()
    out = torch_train.export(str(run), tmp_path / "same.cact")
    ids = np.array([2, 10, 300, 17, 900, 5], np.int64)
    a = Model.load(default, numerics="float").forward(ids)
    b = Model.load(out, numerics="float").forward(ids)
    np.testing.assert_array_equal(a, b)
    with open(out, "rb") as fa, open(default, "rb") as fb:
        assert fa.read()[-20000:] == fb.read()[-20000:]       # tokenizer record carried over
    trainer.fit(steps=2)
    assert trainer.state["step"] == 2


class _Clock:
    """A clock that moves a fixed tick each time it is read: the trainer's time-budget
    arithmetic, independent of how loaded the machine is."""

    def __init__(self, tick):
        self.now, self.tick = 1000.0, tick

    def time(self):
        self.now += self.tick
        return self.now

    def strftime(self, *args):
        import time
        return time.strftime(*args)


def test_time_budget_sets_an_end_that_fits(tmp_path, monkeypatch):
    """--time-budget: after calibration control.json holds the reachable end with the
    decay inside it, and the run ends within the budget (or stops at it, logged)."""
    run = make_run(tmp_path / "t")
    budget = 4.0
    clock = _Clock(0.03)
    monkeypatch.setattr(torch_train, "time", clock)
    start = clock.now
    trainer = torch_train.fit(str(run), threads=1, time_budget=budget)
    assert clock.now - start < budget * 1.2
    events = [r for r in _log(run) if r.get("event") == "time_budget"]
    assert len(events) == 1
    ctl = json.loads((run / "control.json").read_text())
    assert ctl["end"] == events[0]["end"] > 25                 # more than the calibration steps
    assert ctl["decay_steps"] == int(0.2 * ctl["end"])
    overrun = [r for r in _log(run) if r.get("event") == "time_budget_overrun"]
    assert trainer.state["step"] == ctl["end"] or overrun
    if overrun:         # the step that crossed the budget was the last one
        assert overrun[0]["step"] == trainer.state["step"] < ctl["end"]


def test_scratch_run_keeps_the_run_folders_tokenizer(tmp_path):
    run = make_run(tmp_path / "s")
    (run / "tokenizer.record").write_bytes(b"not-a-real-record")
    trainer = torch_train.fit(str(run), steps=1, threads=1)
    assert trainer.state["tokenizer_bytes"] == b"not-a-real-record"


def test_sampled_loss_at_share_one_equals_the_full_loss():
    """``prompt_share`` 1: the head over the kept positions gives the full loss exactly."""
    cfg_run = {"model": MODEL, "hyper": HYPER}
    model, _ = torch_train.build_model(cfg_run)
    rng = np.random.default_rng(3)
    ids = torch.as_tensor(rng.integers(4, VOCAB, size=(3, 20)))
    w = torch.full((3, 20), 0.1)
    w[:, 12:] = 1.0
    w[2, 16:] = 0.0                                      # padding
    full, full_t = torch_train.loss_terms(model(ids), ids, w)
    pos, wk, tk = torch_train.loss_positions(w, 1.0)
    part, part_t = torch_train.sampled_loss_terms(model(ids, positions=pos), ids, pos, wk, tk,
                                                  w[:, 1:].sum(), (w[:, 1:] >= 1).sum().float())
    assert float(part) == pytest.approx(float(full), rel=1e-6)
    assert float(part_t) == pytest.approx(float(full_t), rel=1e-6)


def test_sampled_loss_keeps_every_target_and_its_expectation():
    w = torch.full((4, 50), 0.1)
    w[:, 30:] = 1.0
    w[3, 40:] = 0.0
    pos, wk, tk = torch_train.loss_positions(w, 0.25, torch.Generator().manual_seed(0))
    nxt = torch.zeros_like(w)
    nxt[:, :-1] = w[:, 1:]
    assert bool(pos[nxt >= 1.0].all())                   # every target position is read
    assert not bool(pos[nxt == 0].any())                 # no padding position is
    assert int(tk.sum()) == int((nxt >= 1.0).sum())
    assert torch.allclose(wk[~tk], torch.tensor(0.4))    # prompt weight 0.1 / share 0.25
    # the kept prompt weight sums to the full prompt weight in expectation
    sums = [float(torch_train.loss_positions(w, 0.25, torch.Generator().manual_seed(s))[1].sum())
            for s in range(300)]
    full = float(nxt.sum())
    assert np.mean(sums) == pytest.approx(full, rel=0.02)


def test_sampled_training_lowers_the_loss_and_snapshots(tmp_path):
    run = make_run(tmp_path / "s")
    spec = json.loads((run / "run.json").read_text())
    spec["hyper"].update(prompt_share=0.3, snapshot_every=10)
    (run / "run.json").write_text(json.dumps(spec))
    trainer = torch_train.fit(str(run), steps=30, threads=1)
    steps = [r for r in _log(run) if "loss" in r]
    assert steps[-1]["target_ce"] < 0.5 * steps[0]["target_ce"]
    snaps = sorted(p.name for p in (run / "snapshots").iterdir())
    assert snaps == ["step_000010.pt", "step_000020.pt", "step_000030.pt"]
    latest = torch_train.load_checkpoint(str(run), path=str(run / torch_train.WEIGHTS))
    assert latest["step"] == 30 and all(v.dtype == torch.float16 for v in latest["model"].values()
                                        if v.is_floating_point())
    # a snapshot exports and the engine loads it
    out = torch_train.export(str(run), tmp_path / "snap.cact", bits=4, weights=str(run / "snapshots" / "step_000020.pt"))
    assert Model.load(out, numerics="float").prefill([2, 10, 12]).shape[-1] == VOCAB
    # a new run folder resumes from the float16 weights: same step, the weights it wrote
    fresh = make_run(tmp_path / "r")
    spec = json.loads((fresh / "run.json").read_text())
    spec["hyper"].update(log_every=1)
    (fresh / "run.json").write_text(json.dumps(spec))
    resumed = torch_train.Trainer(str(fresh), init=str(run / torch_train.WEIGHTS), threads=1)
    assert resumed.state["step"] == 30
    for name, value in trainer.model.state_dict().items():
        if value.is_floating_point():
            np.testing.assert_allclose(resumed.model.state_dict()[name].numpy(),
                                       value.half().float().numpy(), err_msg=name)
    resumed.fit(steps=5)
    assert resumed.state["step"] == 35
    # fresh optimizer moments: the LR warms up again from the weights' step
    lrs = [r["lr"] for r in _log(fresh) if "lr" in r]
    assert lrs == pytest.approx([HYPER["peak_lr"] * k / HYPER["warmup"] for k in range(1, 6)])
