"""Reproduce the shipped default model from scratch, with fixed seeds.

    python -m needle_cy.training.train_default --out needle_cy/models/default.cact \\
        [--run-dir DIR]

Generates the data (version 1, seed 0), trains the tokenizer, trains the model through
the phases the shipped archive was trained with (``SHIPPED_PHASES``; see
``needle_cy/models/MODEL_CARD.md``), adding the version-2 data (seed 1, tokenized with
the same tokenizer) where the recipe switched to it (and versions 3, 4 and 5 likewise), exports it with the official
exporter (CQ 4-bit) and fits and attaches the confidence head
(``needle_cy.training.confidence``), and writes the retrieval's query-expansion table
(``needle_cy.training.query_expansion``) beside the archive. Needs ``pip install "cactus-needle[train]==3.2.8"`` (jax, flax,
optax, sentencepiece). A run folder that already holds a state resumes where it stopped.
On 2 shared CPU cores this takes hours; the card records the measured time.

Note: float32 XLA reductions on CPU are not bit-identical across thread counts (and the
first 1,875 steps of the shipped run used the exporter's blockwise "flash" attention,
the rest plain attention: the same function, summed in another order), so a rerun
reproduces the recipe and the data exactly and the weights closely.
"""
import argparse
import json
import os
import time

from . import confidence, query_expansion, train

# The schedule behind the shipped archive, batches of 4 × 512 tokens.  Each phase writes
# control.json (the LR schedule's end and decay length, the token file) and trains until
# its step: warmup over 50 steps to the peak LR, the peak, then a linear decay to
# 0.1 × peak over the last ``decay`` steps before ``end``.  Phases 1–4 decay to their
# own ends; phase 5 holds the peak; phases 6–10 run one long decay to step 4300 (its
# length was moved as the available time allowed, keeping the LR continuous at the last
# two changes), the batches coming from the version-2 data from phase 7.  Phase 11
# (later) restarts at the peak LR (a warm restart from 2e-4) and holds it; from
# phase 12 the batches come from the version-3 data (follow-up requests packed after
# the first, every answer a target) and the LR decays linearly over the last 2,000 steps.
# Phases 13–14 (next) fine-tune on the version-4 data (more phrasings): a
# mild restart to 6.5e-4 decaying linearly (the decay's end moved from 10,200 to 10,000
# at step 9045, keeping the LR continuous).  Phases 15–17 (after that): a restart
# to 5e-4 decaying slowly on version-4 data (its end moved at step 10500), then from step
# 10675 version-5 data (more copied strings, words from the tokenizer's pieces) with the
# decay reaching 2e-4 at step 12000, the LR continuous at each change.  Phases 18–21
# (last), all on version-5 data: a restart to 3e-4 decaying to 2e-4 at step
# 13200 (its end moved at step 12280), 2e-4 held to step 13975, then a final linear
# anneal to 2e-5 (0.01 × peak, below the run's 0.1 floor) at step 15475.
# (until_step, schedule_end, decay_steps, token file[, min_lr_ratio])
SHIPPED_PHASES = (
    (460, 460, 120, "tokens.npz"),
    (700, 700, 240, "tokens.npz"),
    (960, 960, 260, "tokens.npz"),
    (1200, 1200, 240, "tokens.npz"),
    (1570, 3000, 400, "tokens.npz"),
    (1950, 4300, 2750, "tokens.npz"),
    (2005, 4800, 3250, "tokens_v2.npz"),
    (2825, 3800, 2250, "tokens_v2.npz"),
    (3670, 4500, 3847, "tokens_v2.npz"),
    (4300, 4300, 2928, "tokens_v2.npz"),
    (5000, 8200, 2000, "tokens_v2.npz"),
    (8200, 8200, 2000, "tokens_v3.npz"),
    (9045, 10200, 8000, "tokens_v4.npz"),
    (10000, 10000, 6627, "tokens_v4.npz"),
    (10500, 14000, 24000, "tokens_v4.npz"),
    (10675, 12800, 15750, "tokens_v4.npz"),
    (12000, 12000, 9815, "tokens_v5.npz"),
    (12280, 13500, 27000, "tokens_v5.npz"),
    (13200, 13200, 20390, "tokens_v5.npz"),
    (13975, 16000, 1000000000, "tokens_v5.npz"),
    (15475, 15475, 16500, "tokens_v5.npz", 0.01),
)
EXTRA_DATA = {"tokens_v2.npz": dict(name="v2", examples=60000, seed=1, version=2),
              "tokens_v3.npz": dict(name="v3", examples=30000, seed=3, version=3),
              "tokens_v4.npz": dict(name="v4", examples=20000, seed=6, version=4),
              "tokens_v5.npz": dict(name="v5", examples=20000, seed=7, version=5)}
CONFIDENCE_DATA = dict(n=1600, seed=99)
CONFIDENCE_FIT = dict(steps=450, seed=0)


def phase_control(phase):
    """control.json of one ``SHIPPED_PHASES`` entry (a fifth field: the LR floor's ratio
    to the peak for that phase, when it anneals below the run's own floor)."""
    until, end, decay, tokens = phase[:4]
    control = {"end": end, "decay_steps": decay, "tokens": tokens}
    if len(phase) > 4:
        control["min_lr_ratio"] = phase[4]
    return control


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m needle_cy.training.train_default")
    parser.add_argument("--out", required=True)
    parser.add_argument("--run-dir", default=os.path.join(os.getcwd(), "needle_default_run"))
    args = parser.parse_args(argv)
    t0 = time.time()
    if not os.path.exists(os.path.join(args.run_dir, "tokens.npz")):
        train.prepare(args.run_dir)
    control = os.path.join(args.run_dir, "control.json")
    for phase in SHIPPED_PHASES:
        until, end, decay, tokens = phase[:4]
        state = train.load_state(args.run_dir)
        if state is not None and state["step"] >= until:
            continue
        if tokens != "tokens.npz" and not os.path.exists(os.path.join(args.run_dir, tokens)):
            train.add_data(args.run_dir, **EXTRA_DATA[tokens])
        with open(control, "w") as handle:
            json.dump(phase_control(phase), handle)
        train.fit(args.run_dir, until_step=until)
    bare = os.path.join(args.run_dir, "model_no_head.cact")
    train.export(args.run_dir, bare, bits=4)
    # the post-hoc confidence head, fitted on the exported model's own turns
    cells = os.path.join(args.run_dir, "confidence_cells.npz")
    head = os.path.join(args.run_dir, "confidence_head.npz")
    confidence.collect(bare, cells, **CONFIDENCE_DATA)
    confidence.fit(cells, head, **CONFIDENCE_FIT)
    confidence.attach(bare, head, args.out)
    # the retrieval's query-expansion table ships beside the archive (counted from the
    # data generator alone, so it does not depend on the run)
    query_expansion.write(query_expansion.learn(),
                          os.path.join(os.path.dirname(os.path.abspath(args.out)), "query_expansion.json"))
    print(f"done in {(time.time() - t0) / 3600:.2f} h")


if __name__ == "__main__":
    main()
