"""Is a model reading its tools or remembering them?  Cross-entropy by token role.

A checkpoint is scored, teacher-forced, on fresh conversations drawn by the training mix
twice: over the corpus's training tools and over its held-out tools (the same generator,
only the tools differ).  Each target token gets a role: the tool ``name``, an argument
``key``, an argument ``value`` (in the call, or quoted in the ``<think>`` note), the rest
of the note (``think``) or JSON ``struct``ure.  The first name token and the first value
token of an answer are where the model decides; their cross-entropy over held-out tools
against training tools says how much of what it knows is tied to tools it has seen.  A
model that reads its list costs the same on both; one that remembers its training tools
costs more on the held-out ones.

    python -m needle_cy.training.probe RUN_DIR --weights RUN_DIR/snapshots/step_002040.pt -n 100
"""
import json
import math
import sys

from .data import token_roles

ROLES = ("name", "key", "value", "think", "struct")


def piece_roles(pieces, target, answers):
    """The role of each token of ``target`` encoded as ``pieces`` (their texts, "▁" for a
    space; a byte piece counts one character): the first non-structure role among the
    characters it covers."""
    roles = token_roles(target, answers)
    text = "".join(pieces)
    skip = 1 if text[:1] == " " and target[:1] != " " else 0    # the dummy-prefix space
    out, c = [], -skip
    for p in pieces:
        span = roles[max(c, 0):max(c + len(p), 0)]
        out.append(next((r for r in span if r != "struct"), "struct"))
        c += len(p)
    return out


class RoleLoss:
    """Sums of cross-entropy per role, and at each answer's first name and value token."""

    def __init__(self):
        self.sum = {r: 0.0 for r in ROLES + ("first name", "first value")}
        self.count = dict.fromkeys(self.sum, 0)

    def add(self, role, ce):
        self.sum[role] += ce
        self.count[role] += 1

    def mean(self, role):
        return self.sum[role] / self.count[role] if self.count[role] else math.nan


def score(model, sp, text_tok, examples, max_len=1024):
    """A ``RoleLoss`` of ``model`` (a ``NeedleTorch``) on the final turn of each example."""
    import torch

    from . import data, train

    def piece(i):
        p = sp.id_to_piece(i)
        return "?" if p.startswith("<0x") and p.endswith(">") else p.replace("\u2581", " ")

    out = RoleLoss()
    for ex in examples:
        prompt, target = data.render(ex)
        p = train._encode_prompt(sp, text_tok, ex, prompt)
        t = sp.encode(target)
        if len(p) + len(t) + 2 > max_len:
            continue
        ids = torch.tensor([[2] + p + t + [1]])
        with torch.no_grad():
            logits = model(ids)
        logits = logits[0] if isinstance(logits, tuple) else logits
        logp = torch.log_softmax(logits[0, :-1].float(), -1)
        ce = -logp.gather(1, ids[0, 1:, None])[:, 0]
        firsts = set()
        for k, role in enumerate(piece_roles([piece(i) for i in t], target, ex["answers"])):
            v = float(ce[len(p) + k])       # predicts target token k
            out.add(role, v)
            if role in ("name", "value") and role not in firsts:
                firsts.add(role)
                out.add("first " + role, v)
    return out


def probe(run_dir, weights, n=100, seed=7771):
    """{"train": RoleLoss, "heldout": RoleLoss} of the checkpoint ``weights`` on ``n``
    corpus conversations over training tools and ``n`` over held-out tools."""
    import torch

    from . import corpus, mix, torch_train, train

    ckpt = torch.load(weights, map_location="cpu", weights_only=False)
    ckpt["model"] = {k: (v.float() if v.is_floating_point() else v) for k, v in ckpt["model"].items()}
    model = torch_train.model_from_checkpoint(ckpt).eval()
    sp = train.run_tokenizer(run_dir)
    text_tok = train.text_tokenizer(run_dir, sp)
    got = {}
    for split in ("train", "heldout"):
        mixer = mix.Mixer(seed=seed, tools=corpus.load(split), home_share=0.0, catalogue_share=0.0,
                          marker_share=0.0, version=2)
        got[split] = score(model, sp, text_tok, [mixer.example() for _ in range(n)])
    return ckpt.get("step"), got


def main(argv=None):
    import argparse

    parser = argparse.ArgumentParser(prog="python -m needle_cy.training.probe", description=__doc__.split("\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--weights", required=True, help="a snapshot or weights file of the run")
    parser.add_argument("-n", type=int, default=100, help="conversations per tool split")
    parser.add_argument("--seed", type=int, default=7771)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: beside a training run)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    step, got = probe(args.run_dir, args.weights, args.n, args.seed)
    rows = {role: {split: round(got[split].mean(role), 4) for split in got} for role in got["train"].sum}
    if args.json:
        print(json.dumps({"step": step, "n": args.n, "ce": rows}))
        return
    print(f"step {step}: target cross-entropy by role, {args.n} conversations per split")
    print(f"{'role':12s} {'train tools':>11s} {'held-out':>9s} {'ratio':>6s}")
    for role, r in rows.items():
        print(f"{role:12s} {r['train']:11.3f} {r['heldout']:9.3f} {r['heldout'] / r['train']:6.2f}")


if __name__ == "__main__":
    sys.exit(main())
