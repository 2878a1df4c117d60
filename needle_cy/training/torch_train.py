"""Train a Needle 3 model with the PyTorch model (``torch_model.NeedleTorch``).

The same run folder, data and schedule as ``train.py`` (the official JAX trainer):
``run.json`` (model fields + hyper-parameters), ``tokens*.npz`` (ids, offsets,
prompt_lens, optional target_mask), ``control.json`` (``end``, ``decay_steps``,
``min_lr_ratio``, ``tokens``; re-read at every log), ``log.jsonl``.  The batches are
train.py's ``Batches`` (batch k is a pure function of (seed, k)), the loss the same
per-token weighted cross-entropy (prompt tokens ``prompt_weight``, targets 1.0; the
logged ``target_ce`` is over the targets only; with ``hyper["prompt_share"]`` < 1 the
head and the loss read every target and that share of the prompt positions, drawn per
step from (seed, step), each at weight / share), the optimizer AdamW (decay on the
parameters of 2+ dimensions) after global-norm clipping, the LR warmup-stable-decay
(``train.lr_at``).  The checkpoint is ``torch_state.pt`` (atomic; parameters, optimizer
state, step, token counts, the model geometry), so a run resumes where it stopped and a
JAX ``state.pkl`` in the same folder is left alone.

    python -m needle_cy.training.torch_train fit RUN [--steps N] [--until-step N]
        [--init ARCHIVE.cact] [--qat] [--precision fp32|bf16] [--device auto|cpu|cuda]
        [--threads N] [--compile] [--time-budget SECONDS]
    python -m needle_cy.training.torch_train export RUN OUT.cact [--bits 2] [--weights snapshots/step_N.pt]

``--init`` starts a run from an existing archive (its dequantized tensors, geometry and
tokenizer), e.g. ``needle_cy/models/default.cact`` to fine-tune the shipped model;
otherwise the model is built from run.json's fields and initialised with
``hyper["seed"]``.  ``--qat`` trains in deploy numerics (A8 activations, KV quantizer)
through the CQ quantizer of the export widths.  ``--precision bf16`` runs the forward
and backward under ``torch.autocast`` (bfloat16 products, float32 master weights and
optimizer state); CUDA is used when ``--device auto`` finds it.

Python API::

    from needle_cy.training import torch_train
    torch_train.fit("run", steps=200, init="needle_cy/models/default.cact", precision="bf16")
    torch_train.export("run", "tuned.cact", bits=2)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from .train import Batches, _log, load_run, lr_at, read_control, read_tokens_file, read_tokens_start

STATE = "torch_state.pt"
WEIGHTS = "weights_fp16.pt"     # the latest weights alone, float16 (see Trainer.save_weights)


def _torch():
    import torch
    return torch


def resolve_device(device="auto"):
    torch = _torch()
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def build_model(run, init=None):
    """(model, tokenizer bytes or None) for a fresh run: from ``init`` (a .cact) or run.json's fields."""
    from .torch_model import NeedleTorch, config_from_fields

    if init is not None:
        return NeedleTorch.from_archive(init)
    m = run["model"]
    cfg = config_from_fields(m, run["hyper"]["vocab_size"])
    model = NeedleTorch(cfg, heads=None, bits=int(run["hyper"].get("bits", 4)))
    model.reset_parameters(seed=run["hyper"]["seed"])
    return model, None


def make_optimizer(model, hyper):
    torch = _torch()
    decay = model.decay_mask()
    params = dict(model.named_parameters())
    groups = [
        {"params": [params[n] for n in params if decay[n]], "weight_decay": hyper["weight_decay"]},
        {"params": [params[n] for n in params if not decay[n]], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=hyper["peak_lr"], betas=(hyper["b1"], hyper["b2"]), eps=1e-8)


def loss_terms(logits, ids, weights):
    """(weighted CE, target CE): next-token CE at positions 0..T-2, weights of the targets 1..T-1."""
    torch = _torch()
    F = torch.nn.functional
    logits, targets, w = logits[:, :-1].float(), ids[:, 1:], weights[:, 1:]
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    ce = ce.reshape(targets.shape)
    tmask = (w >= 1.0).float()
    total = (ce * w).sum() / w.sum().clamp_min(1.0)
    target_ce = (ce * tmask).sum() / tmask.sum().clamp_min(1.0)
    return total, target_ce


def loss_positions(weights, prompt_share, generator=None):
    """(positions ``[B, T]`` bool, their weights ``[N]``, target flags ``[N]``) for a loss over a sample of the
    prompt: every target, and each weighted prompt position with probability
    ``prompt_share`` at ``weight / prompt_share``, so the loss keeps its expectation.
    Position t predicts token t + 1 and carries that token's weight."""
    torch = _torch()
    w = torch.zeros_like(weights)
    w[:, :-1] = weights[:, 1:]
    target = w >= 1.0
    keep = target.clone()
    if prompt_share >= 1.0:
        keep |= w > 0
        return keep, w[keep], target[keep]
    draw = torch.rand(w.shape, generator=generator, device=w.device) < prompt_share
    prompt = (w > 0) & ~target & draw
    keep |= prompt
    scaled = torch.where(prompt, w / prompt_share, w)
    return keep, scaled[keep], target[keep]


def sampled_loss_terms(logits, ids, positions, weights_kept, target_kept, weight_sum, target_count):
    """(weighted CE, target CE) of ``logits`` ``[N, V]`` computed at ``positions`` only
    (see :func:`loss_positions`), normalised by the full batch's weight sum and target
    count as :func:`loss_terms` is."""
    torch = _torch()
    F = torch.nn.functional
    nxt = torch.zeros_like(ids)
    nxt[:, :-1] = ids[:, 1:]
    ce = F.cross_entropy(logits.float(), nxt[positions], reduction="none")
    total = (ce * weights_kept).sum() / weight_sum.clamp_min(1.0)
    target_ce = (ce * target_kept).sum() / target_count.clamp_min(1.0)
    return total, target_ce


def _save(run_dir, payload):
    torch = _torch()
    path = os.path.join(run_dir, STATE)
    tmp = path + ".tmp"
    torch.save(payload, tmp)
    os.replace(tmp, path)


def load_checkpoint(run_dir, path=None):
    torch = _torch()
    path = path or os.path.join(run_dir, STATE)
    if not os.path.exists(path):
        return None
    return torch.load(path, map_location="cpu", weights_only=False)


def model_from_checkpoint(ckpt):
    from ..archive import NeedleConfig
    from .torch_model import NeedleTorch

    cfg = NeedleConfig(**ckpt["config"])
    model = NeedleTorch(cfg, heads=ckpt["heads"], bits=ckpt["bits"], group_size=ckpt["group_size"])
    model.load_state_dict(ckpt["model"])
    return model


class Trainer:
    """One training run: model, optimizer, batches, step (resumable; see the module docstring)."""

    def __init__(self, run_dir, init=None, qat=False, precision="fp32", device="auto", threads=None,
                 compile=False):
        torch = _torch()
        if precision not in ("fp32", "bf16"):
            raise ValueError(f"precision must be 'fp32' or 'bf16', got {precision!r}")
        if threads:
            torch.set_num_threads(int(threads))
        self.run_dir = run_dir
        self.run = load_run(run_dir)
        self.hyper = self.run["hyper"]
        self.qat, self.precision = bool(qat), precision
        self.device = resolve_device(device)
        torch.manual_seed(self.hyper["seed"])
        ckpt = load_checkpoint(run_dir)
        if ckpt is None and init is not None and str(init).endswith(".pt"):
            # a weights file (save_weights): the model, step and token counts go on from
            # there; the optimizer's moments start afresh
            ckpt = load_checkpoint(run_dir, path=init)
            ckpt["model"] = {k: (v.float() if v.is_floating_point() else v) for k, v in ckpt["model"].items()}
            ckpt["optimizer"] = None
            # Fresh moments take the peak LR as sign-like steps of full size on a trained
            # model: the LR warms up again over ``warmup`` steps from here.
            ckpt["rewarm_from"] = int(ckpt["step"])
        if ckpt is None:
            model, tok = build_model(self.run, init)
            record = os.path.join(run_dir, "tokenizer.record")
            if tok is None and os.path.exists(record):     # a scratch model on a given tokenizer
                with open(record, "rb") as handle:
                    tok = handle.read()
            self.state = {"step": 0, "tokens": 0, "target_tokens": 0, "seconds": 0.0,
                          "tokenizer_bytes": tok, "init": None if init is None else str(init)}
            opt_state = None
        else:
            model = model_from_checkpoint(ckpt)
            self.state = {k: ckpt[k] for k in ("step", "tokens", "target_tokens", "seconds", "tokenizer_bytes", "init")}
            if ckpt.get("rewarm_from") is not None:
                self.state["rewarm_from"] = int(ckpt["rewarm_from"])
            opt_state = ckpt["optimizer"]
        self.model = model.to(self.device)
        self.optimizer = make_optimizer(self.model, self.hyper)
        if opt_state is not None:
            self.optimizer.load_state_dict(opt_state)
        self.tokens_file = read_tokens_file(run_dir)
        self.batches = Batches(run_dir, self.hyper, self.tokens_file, read_tokens_start(run_dir))
        self._forward = self.model
        if compile:
            self._forward = torch.compile(self.model)

    # -------------------------------------------------------------- one step
    def step(self, ids, weights, lr):
        """One optimizer step on a batch (NumPy ``ids`` int ``[B, T]``, ``weights`` float ``[B, T]``)."""
        torch = _torch()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        ids_t = torch.as_tensor(np.asarray(ids, np.int64), device=self.device)
        w_t = torch.as_tensor(np.asarray(weights, np.float32), device=self.device)
        self.model.train()
        share = float(self.hyper.get("prompt_share", 1.0))
        positions = None
        if share < 1.0:
            gen = torch.Generator(device=self.device).manual_seed(
                int(self.hyper["seed"]) * 1_000_003 + int(self.state["step"]))
            positions, w_kept, t_kept = loss_positions(w_t, share, gen)
        with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16,
                            enabled=self.precision == "bf16"):
            logits = self._forward(ids_t, quant=self.qat, cq=self.qat, positions=positions)
        if positions is None:
            loss, tce = loss_terms(logits, ids_t, w_t)
        else:
            w_next = w_t[:, 1:]
            loss, tce = sampled_loss_terms(logits, ids_t, positions, w_kept, t_kept,
                                           w_next.sum(), (w_next >= 1.0).sum().float())
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.hyper["clip"])
        self.optimizer.step()
        return float(loss.detach()), float(tce.detach())

    def checkpoint(self):
        payload = dict(self.state)
        payload.update(model={k: v.detach().cpu() for k, v in self.model.state_dict().items()},
                       optimizer=self.optimizer.state_dict(), config=self.model.cfg.to_dict(),
                       heads={n: (h.k, h.q) for n, h in self.model.heads.items()},
                       bits=self.model.bits, group_size=self.model.group_size)
        _save(self.run_dir, payload)

    def fit(self, steps=None, until_step=None, time_budget=None, decay_share=0.2, calibrate=20):
        """Train to the schedule's end (control.json / run.json), ``steps`` more steps or
        ``until_step``.  With ``time_budget`` (seconds of this call) the end is set from the
        measured speed: after ``calibrate`` steps (plus a few warm-up steps that pay for
        compilation) control.json gets ``end`` = the step reachable in the budget and
        ``decay_steps`` = ``decay_share`` of it, so the LR decays fully before time runs
        out; a run that still overruns stops at the budget with a checkpoint."""
        hyper, st = self.hyper, self.state
        first = st["step"]
        t_start = time.time()
        warm_steps = 5
        t_calib = None

        def stop_at():
            sched_end, decay, ratio = read_control(self.run_dir, hyper)
            end = sched_end if until_step is None else min(until_step, sched_end)
            if steps is not None:
                end = min(end, first + steps)
            return end, sched_end, decay, ratio

        end, sched_end, decay, ratio = stop_at()
        n_params = sum(p.numel() for p in self.model.parameters())
        _log(self.run_dir, {"event": "start", "trainer": "torch", "step": st["step"], "end": end,
                            "params": n_params, "tokens_file": self.tokens_file,
                            "tokens_from_step": self.batches.first_step, "qat": self.qat,
                            "precision": self.precision, "device": str(self.device),
                            "threads": _torch().get_num_threads(), "time": time.strftime("%Y-%m-%d %H:%M:%S")})
        t_last = last_save = time.time()
        acc_loss = acc_tce = 0.0
        acc_n = acc_tok = 0
        while st["step"] < end:
            ids, weights, epoch = self.batches.batch(st["step"])
            lr = lr_at(st["step"], hyper, sched_end, decay, ratio)
            if "rewarm_from" in st:
                lr *= min(1.0, (st["step"] - st["rewarm_from"] + 1) / max(1, hyper["warmup"]))
            loss, tce = self.step(ids, weights, lr)
            st["step"] += 1
            ntok = int((ids != 0).sum())
            st["tokens"] += ntok
            st["target_tokens"] += int((weights >= 1.0).sum())
            acc_loss, acc_tce, acc_n, acc_tok = acc_loss + loss, acc_tce + tce, acc_n + 1, acc_tok + ntok
            if time_budget is not None:
                done = st["step"] - first
                if done == warm_steps:
                    t_calib = time.time()
                elif done == warm_steps + calibrate:
                    per_step = (time.time() - t_calib) / calibrate
                    left = time_budget - (time.time() - t_start)
                    new_end = st["step"] + max(1, int(0.97 * left / per_step))
                    # the decay is a share of this call's steps (a run resumed at step S
                    # decays over the last part of what it trains now, not of S + that)
                    _write_control(self.run_dir, new_end, max(1, int(decay_share * (new_end - first))),
                                   self.tokens_file)
                    _log(self.run_dir, {"event": "time_budget", "seconds": time_budget,
                                        "s_per_step": round(per_step, 5), "end": new_end})
                    end, sched_end, decay, ratio = stop_at()
                if time.time() - t_start > time_budget and st["step"] < end:
                    _log(self.run_dir, {"event": "time_budget_overrun", "step": st["step"], "end": end})
                    end = st["step"]
            if st["step"] % hyper["log_every"] == 0 or st["step"] == end:
                now = time.time()
                st["seconds"] += now - t_last
                _log(self.run_dir, {"step": st["step"], "epoch": epoch, "loss": round(acc_loss / acc_n, 4),
                                    "target_ce": round(acc_tce / acc_n, 4), "lr": round(lr, 7),
                                    "tok_per_s": round(acc_tok / max(now - t_last, 1e-9), 1),
                                    "tokens": st["tokens"], "seconds": round(st["seconds"])})
                t_last = now
                acc_loss = acc_tce = 0.0
                acc_n = acc_tok = 0
                end, sched_end, decay, ratio = stop_at()
            if (st["step"] % hyper["checkpoint_every"] == 0 or st["step"] == end
                    or time.time() - last_save > 600):
                self.checkpoint()
                last_save = time.time()
            if hyper.get("snapshot_every") and st["step"] % int(hyper["snapshot_every"]) == 0:
                self.save_weights(os.path.join(self.run_dir, "snapshots", f"step_{st['step']:06d}.pt"))
                self.save_weights(os.path.join(self.run_dir, WEIGHTS))
        if st["step"] >= end:       # the end's weights, whatever the snapshot rhythm
            self.save_weights(os.path.join(self.run_dir, WEIGHTS))
        return st

    def save_weights(self, path):
        """The model alone in float16 (a learning-curve point, or the small file a run
        commits so another machine can resume from it with a fresh optimizer)."""
        torch = _torch()
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        payload = {k: self.state[k] for k in ("step", "tokens", "target_tokens", "seconds", "tokenizer_bytes")}
        payload.update(model={k: (v.detach().cpu().half() if v.is_floating_point() else v.detach().cpu())
                              for k, v in self.model.state_dict().items()},
                       config=self.model.cfg.to_dict(),
                       heads={n: (h.k, h.q) for n, h in self.model.heads.items()},
                       bits=self.model.bits, group_size=self.model.group_size, init=None)
        tmp = path + ".tmp"
        torch.save(payload, tmp)
        os.replace(tmp, path)


def _write_control(run_dir, end, decay_steps, tokens_file):
    path = os.path.join(run_dir, "control.json")
    ctl = {}
    if os.path.exists(path):
        with open(path) as handle:
            ctl = json.load(handle)
    ctl.update(end=int(end), decay_steps=int(decay_steps), tokens=tokens_file)
    tmp = path + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(ctl, handle)
    os.replace(tmp, path)


def fit(run_dir, steps=None, until_step=None, init=None, qat=False, precision="fp32", device="auto",
        threads=None, compile=False, time_budget=None):
    """Train (or resume) the run in ``run_dir``; returns the Trainer (model, state)."""
    trainer = Trainer(run_dir, init=init, qat=qat, precision=precision, device=device, threads=threads,
                      compile=compile)
    trainer.fit(steps=steps, until_step=until_step, time_budget=time_budget)
    return trainer


def export(run_dir, out_path, bits=None, weights=None):
    """Write the run's latest parameters (or those of ``weights``, a file of
    :meth:`Trainer.save_weights`) as a .cact (needle_cy's writer) with the run's tokenizer."""
    ckpt = load_checkpoint(run_dir, path=weights)
    if ckpt is None:
        raise FileNotFoundError(f"{weights or os.path.join(run_dir, STATE)}: no checkpoint to export")
    model = model_from_checkpoint(ckpt)
    if ckpt.get("init") and os.path.exists(ckpt["init"]):
        model.remember_records(ckpt["init"])        # tensors that training left alone keep their records
    tok = ckpt.get("tokenizer_bytes")
    sp_model = os.path.join(run_dir, "tokenizer.model")
    if tok is None and os.path.exists(sp_model):
        from ..tokenizer import record_from_sentencepiece
        tok = record_from_sentencepiece(sp_model)
    path = model.export(out_path, bits=bits, tokenizer_bytes=tok)
    print(f"wrote {path} {os.path.getsize(path) / 1e6:.2f} MB at {bits or model.bits} bits "
          f"(step {ckpt['step']}, {ckpt['tokens']} tokens)")
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m needle_cy.training.torch_train")
    sub = parser.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fit")
    f.add_argument("run_dir")
    f.add_argument("--steps", type=int)
    f.add_argument("--until-step", type=int)
    f.add_argument("--init", help="start from this .cact (e.g. needle_cy/models/default.cact)")
    f.add_argument("--qat", action="store_true")
    f.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    f.add_argument("--device", default="auto")
    f.add_argument("--threads", type=int)
    f.add_argument("--compile", action="store_true", help="torch.compile the model")
    f.add_argument("--time-budget", type=float, help="seconds: set the schedule's end from the measured speed")
    e = sub.add_parser("export")
    e.add_argument("run_dir")
    e.add_argument("out")
    e.add_argument("--bits", type=int)
    e.add_argument("--weights", help="a weights file (snapshots/step_N.pt, weights_fp16.pt) instead of the run's state")
    args = parser.parse_args(argv)
    if args.cmd == "fit":
        fit(args.run_dir, args.steps, args.until_step, args.init, args.qat, args.precision, args.device,
            args.threads, args.compile, args.time_budget)
    else:
        export(args.run_dir, args.out, args.bits, args.weights)


if __name__ == "__main__":
    sys.exit(main())
