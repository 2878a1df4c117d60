"""One declarative config and one command for the default model.

    python -m needle_cy.training.recipe --run-dir DIR --out needle_cy/models/default.cact \\
        [--config needle_cy/training/recipe.json] [--base BASE.cact]

The config (``recipe.json`` beside this file is the shipped model's) names:

* ``start``: ``"scratch"`` (a tokenizer and a model trained from nothing on the
  smart-home data, ``train.prepare``) or ``"warm"`` (the weights and tokenizer of a base
  archive, read back exactly by ``train.warm_start``).  A warm start takes ``--base``,
  else ``base_recipe``'s archive, built first when absent: ``"train_default"`` is the
  previous release's recipe (data versions 1-5, ``train_default.py``).
* ``model`` / ``hyper``: overrides of ``train.MODEL_CONFIG`` and ``train.HYPER``;
* ``data``: token files to add, each ``{"name", "generator": "mix" | "mix2" | a data version,
  "examples", "seed"}``;
* ``phases``: ``[until_step, schedule_end, decay_steps, token_file(, min_lr_ratio)]``,
  trained in order (warmup-stable-decay, ``train.lr_at``);
* ``trainer``: ``"jax"`` (the official step, ``train.fit``; the default), ``"torch"``
  (``torch_train.fit``, exact to the engine and faster on CPUs; ``"torch_options"``:
  ``precision``, ``threads``, ``device``, ``qat``) or ``"auto"``: each (JAX; PyTorch fp32
  and bf16) trains a few steps of this very run on a throw-away copy and the fastest
  trains it (``measure_trainers``; the choice and the figures stay in
  ``run_dir/trainer.json``, so a resumed run keeps its trainer);
* ``confidence``: the post-hoc head (``collect`` / ``fit`` on the model's own turns);
* ``export``: the CQ width.

Every step resumes: a run folder that holds a state, a token file or an export skips
what is done.  Seeds are fixed, so a rerun reproduces the data exactly and the weights
closely (float32 XLA sums differ across thread counts).
"""
import argparse
import json
import os
import time

from . import confidence, train

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "recipe.json")


def load_config(path=None):
    with open(path or DEFAULT_CONFIG, encoding="utf-8") as handle:
        config = json.load(handle)
    for key in ("start", "phases"):
        if key not in config:
            raise ValueError(f"recipe config {path or DEFAULT_CONFIG}: missing {key!r}")
    if config["start"] not in ("scratch", "warm"):
        raise ValueError(f"recipe config: start must be 'scratch' or 'warm', got {config['start']!r}")
    return config


def _base_archive(config, run_dir, base):
    if base:
        return base
    if config.get("base_recipe") != "train_default":
        raise ValueError("a warm start needs --base or base_recipe 'train_default'")
    path = os.path.join(run_dir, "base", "base.cact")
    if not os.path.exists(path):
        from . import train_default
        train_default.main(["--out", path, "--run-dir", os.path.join(run_dir, "base")])
    return path


TRAINERS = ("jax", "torch", "auto")
CHOICE = "trainer.json"


def _trainer(config, run_dir):
    """"jax" or "torch" for this run; for "auto" the measured choice (None until made)."""
    trainer = config.get("trainer", "jax")
    if trainer not in TRAINERS:
        raise ValueError(f"recipe config: trainer must be one of {TRAINERS}, got {trainer!r}")
    if trainer == "auto":
        path = os.path.join(run_dir, CHOICE)
        if not os.path.exists(path):
            return None
        with open(path) as handle:
            return json.load(handle)["trainer"]
    return trainer


def _step(config, run_dir):
    """The run's trained step, or None before its first state."""
    trainer = _trainer(config, run_dir)
    if trainer is None:
        return None
    if trainer == "torch":
        from . import torch_train
        ckpt = torch_train.load_checkpoint(run_dir)
        return None if ckpt is None else ckpt["step"]
    state = train.load_state(run_dir)
    return None if state is None else state["step"]


def _start(config, run_dir, base):
    """The run folder and, for a warm start, the base archive (None from scratch)."""
    hyper = config.get("hyper", {})
    if config["start"] == "warm":
        archive = _base_archive(config, run_dir, base)
        if _step(config, run_dir) is None and not os.path.exists(os.path.join(run_dir, "run.json")):
            train.warm_start(run_dir, archive, params=_trainer(config, run_dir) == "jax", **hyper)
        return archive
    if _step(config, run_dir) is not None:
        return None
    if not os.path.exists(os.path.join(run_dir, "tokens.npz")):
        more = {k: v for k, v in hyper.items() if k not in ("examples", "seed", "vocab_size")}
        train.prepare(run_dir, hyper.get("examples"), hyper.get("seed"), hyper.get("vocab_size"), **more)
    run = train.load_run(run_dir)          # the config's geometry and hyper-parameters
    run["model"] = dict(run["model"], **config.get("model", {}))
    run["hyper"] = dict(run["hyper"], **hyper)
    with open(os.path.join(run_dir, "run.json"), "w") as handle:
        json.dump(run, handle, indent=1)
    return None


def measure_trainers(run_dir, tokens, candidates=None, steps=8, log_every=2):
    """Training tokens/s of each candidate ``(trainer, torch options)`` on a throw-away
    copy of this run: its geometry, hyper-parameters and token file ``tokens``, the
    real loop (batches, loss, AdamW, schedule), ``steps`` steps; the first log window
    (compilation, warm-up) is dropped and the median of the others kept."""
    import tempfile

    if candidates is None:
        candidates = [("jax", {}), ("torch", {"precision": "fp32"}), ("torch", {"precision": "bf16"})]
    results = []
    for trainer, options in candidates:
        with tempfile.TemporaryDirectory() as tmp:
            run = train.load_run(run_dir)
            run["hyper"] = dict(run["hyper"], log_every=log_every, checkpoint_every=10 ** 9)
            with open(os.path.join(tmp, "run.json"), "w") as handle:
                json.dump(run, handle)
            for name in (tokens, "tokenizer.record"):
                if os.path.exists(os.path.join(run_dir, name)):
                    os.symlink(os.path.abspath(os.path.join(run_dir, name)), os.path.join(tmp, name))
            with open(os.path.join(tmp, "control.json"), "w") as handle:
                json.dump({"tokens": tokens}, handle)
            try:
                if trainer == "torch":
                    from . import torch_train
                    torch_train.fit(tmp, steps=steps, **options)
                else:
                    train.fit(tmp, steps=steps)
            except ImportError as exc:          # that trainer's stack is not installed
                results.append({"trainer": trainer, "options": options, "tok_per_s": None,
                                "error": str(exc)})
                continue
            with open(os.path.join(tmp, "log.jsonl")) as handle:
                logs = [json.loads(line) for line in handle]
            windows = [r["tok_per_s"] for r in logs if "tok_per_s" in r]
            speeds = sorted(windows[1:] or windows)      # the first window pays for compilation
            results.append({"trainer": trainer, "options": options,
                            "tok_per_s": speeds[len(speeds) // 2] if speeds else None})
    return results


def choose_trainer(run_dir, tokens, candidates=None):
    """The fastest trainer on this machine for this run, measured once and kept in
    run_dir/trainer.json (so a resumed run keeps its trainer)."""
    path = os.path.join(run_dir, CHOICE)
    if os.path.exists(path):
        with open(path) as handle:
            return json.load(handle)
    results = measure_trainers(run_dir, tokens, candidates)
    ok = [r for r in results if r["tok_per_s"]]
    if not ok:
        raise RuntimeError(f"no trainer could run: {results}")
    best = max(ok, key=lambda r: r["tok_per_s"])
    choice = {"trainer": best["trainer"], "options": best["options"], "measured": results,
              "cpu": _cpu_name(), "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    with open(path, "w") as handle:
        json.dump(choice, handle, indent=1)
    print(f"trainer: {best['trainer']} {best['options']} at {best['tok_per_s']} tok/s "
          f"(measured: {[(r['trainer'], r['options'], r['tok_per_s']) for r in results]})")
    return choice


def _cpu_name():
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine()


def run(config, run_dir, out, base=None, threads=None):
    t0 = time.time()
    os.makedirs(run_dir, exist_ok=True)
    init = _start(config, run_dir, base)
    for spec in config.get("data", []):
        if not os.path.exists(os.path.join(run_dir, f"tokens_{spec['name']}.npz")):
            train.add_data(run_dir, spec["name"], spec["examples"], spec["seed"], spec["generator"])
    torch_options = dict(config.get("torch_options", {}))
    if config.get("trainer") == "auto":
        choice = choose_trainer(run_dir, config["phases"][0][3])
        torch_options.update(choice["options"])
        if choice["trainer"] == "jax" and init is not None and train.load_state(run_dir) is None:
            train.warm_start(run_dir, init, params=True, **config.get("hyper", {}))
    if _trainer(config, run_dir) == "torch":
        from . import torch_train as trainer        # fit(run_dir, until_step, init, ...), export
        fit_options = dict(torch_options, init=init)
        export = trainer.export
    else:
        trainer, fit_options, export = train, {}, train.export_ours
    for phase in config["phases"]:
        until = phase[0]
        step = _step(config, run_dir)
        if step is not None and step >= until:
            continue
        control = {"end": phase[1], "decay_steps": phase[2], "tokens": phase[3]}
        if len(phase) > 4:
            control["min_lr_ratio"] = phase[4]
        with open(os.path.join(run_dir, "control.json"), "w") as handle:
            json.dump(control, handle)
        trainer.fit(run_dir, until_step=until, **fit_options)
    bare = os.path.join(run_dir, "model_no_head.cact")
    export(run_dir, bare, bits=config.get("export", {}).get("bits", 4))
    head_cfg = config.get("confidence")
    if head_cfg:
        cells = os.path.join(run_dir, "confidence_cells.npz")
        head = os.path.join(run_dir, "confidence_head.npz")
        confidence.collect(bare, cells, n=head_cfg["n"], seed=head_cfg["seed"], threads=threads,
                           mix_share=head_cfg.get("mix_share", 0.0))
        confidence.fit(cells, head, steps=head_cfg["steps"], seed=head_cfg.get("fit_seed", 0))
        confidence.attach(bare, head, out)
    else:
        os.replace(bare, out)
    print(f"recipe done in {(time.time() - t0) / 3600:.2f} h: {out}")
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m needle_cy.training.recipe")
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--config", default=None, help=f"recipe JSON (default {DEFAULT_CONFIG})")
    parser.add_argument("--base", default=None, help="base archive of a warm start")
    args = parser.parse_args(argv)
    run(load_config(args.config), args.run_dir, args.out, base=args.base)


if __name__ == "__main__":
    main()
