"""Reproduce the shipped default model from scratch, with fixed seeds.

    python -m needle_cy.training.train_default --out needle_cy/models/default.cact \\
        [--run-dir DIR] [--steps N]

Generates the data (seed 0), trains the tokenizer, trains the model for the number
of steps the shipped archive was trained for (``SHIPPED_STEPS``; see
``needle_cy/models/MODEL_CARD.md``) and exports it with the official exporter
(CQ 4-bit). Needs ``pip install "cactus-needle[train]==3.2.8"`` (jax, flax, optax,
sentencepiece). A run folder that already holds a state resumes where it stopped.
On 2 shared CPU cores this takes hours; the card records the measured time.

Note: float32 XLA reductions on CPU are not bit-identical across thread counts,
so a rerun reproduces the recipe and the data exactly and the weights closely.
"""
import argparse
import json
import os
import time

from . import train

# The schedule behind the shipped archive, batches of 4 × 512 tokens: phase 1 warms up
# over 50 steps, holds the peak LR, then decays linearly over its last steps; phase 2
# re-warms to the peak at once and decays linearly to its end, and so do phases 3 and 4.
# (end, decay_steps):
SHIPPED_PHASES = ((460, 120), (700, 240), (960, 260), (1200, 240))


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m needle_cy.training.train_default")
    parser.add_argument("--out", required=True)
    parser.add_argument("--run-dir", default=os.path.join(os.getcwd(), "needle_default_run"))
    parser.add_argument("--phases", default=",".join(f"{e}:{d}" for e, d in SHIPPED_PHASES),
                        help="END:DECAY[,END:DECAY...] schedule phases (default: the shipped one)")
    args = parser.parse_args(argv)
    phases = [tuple(int(x) for x in p.split(":")) for p in args.phases.split(",")]
    t0 = time.time()
    if not os.path.exists(os.path.join(args.run_dir, "tokens.npz")):
        train.prepare(args.run_dir)
    control = os.path.join(args.run_dir, "control.json")
    for end, decay in phases:
        state = train.load_state(args.run_dir)
        if state is not None and state["step"] >= end:
            continue
        with open(control, "w") as handle:
            json.dump({"end": end, "decay_steps": decay}, handle)
        train.fit(args.run_dir, until_step=end)
    train.export(args.run_dir, args.out, bits=4)
    print(f"done in {(time.time() - t0) / 3600:.2f} h")


if __name__ == "__main__":
    main()
