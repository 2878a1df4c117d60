"""Train the confidence probe head of an exported model, post hoc (spec §5).

The official package trains no probe heads for small local models, so the default
model's ``confidence`` would rest on token probabilities alone.  This module fits the
confidence head the way the spec describes it — "a calibrated post-hoc head that scores
the full prompt plus the call the model just produced" — on the model's own behaviour:

1. ``collect``: run the agent (grammar-constrained, exactly as at inference) on fresh
   synthetic requests (data version 2, a seed never used for training), label each turn
   1 when its calls equal the reference calls exactly (refusals included) and 0
   otherwise, and keep the hidden cells of the whole conversation ([T, L+1, d], the
   head's input, spec §5.1) computed by the Cython engine.
2. ``fit``: fit the head (probes, gains, queries, row biases, projection, bias; the spec
   §5.2 pooling, written once in JAX for autodiff) by logistic loss with AdamW and weight
   decay, early-stopped on a held-out fifth of the turns.  JAX comes with the ``train``
   extra.
3. ``attach``: write a copy of the archive with the ``heads.confidence.*`` records added
   (every other record written as it was: CQ matrices are not re-quantized), so the
   engine's online pooling returns the logit and the agent's ``confidence`` becomes
   ``min(sigmoid(head), min call-token probability)``.

    python -m needle_cy.training.confidence collect MODEL.cact cells.npz [--n 600] [--seed 99] [--mix-share 0.5]
    python -m needle_cy.training.confidence fit cells.npz head.npz
    python -m needle_cy.training.confidence attach MODEL.cact head.npz OUT.cact

The evaluation set in ``../shared/eval`` is never read here.
"""
import argparse
import json
import math
import time

import numpy as np

HEAD = "confidence"
PROBES, QUERIES = 4, 4


# ------------------------------------------------------------------ collect ---

def collect(model_path, out_path, n=600, seed=99, threads=None, progress=True, mix_share=0.0):
    """``mix_share`` of the turns come from the schema-general mix (fresh catalogues of
    the corpus's training split, ``needle_cy.training.mix``), the rest from the
    smart-home generator (data version 2)."""
    import random

    from ..agent import Needle
    from ..eval import calls_equal, predicted_calls
    from ..model import Model
    from ..tokenizer import Tokenizer
    from . import data

    model = Model.load(model_path, threads=threads)
    tok = Tokenizer.from_archive(model_path)
    gen = data.Generator(seed=seed, version=2)
    mixer, choose = None, random.Random(seed)
    if mix_share:
        from .mix import Mixer
        mixer = Mixer(seed=seed, home_share=0.0)
    cells, offsets, labels, kinds, token_probs = [], [0], [], [], []
    t0 = time.time()
    while len(labels) < n:
        ex = mixer.example() if mixer is not None and choose.random() < mix_share else gen.example()
        if ex.get("history") or ex.get("is_result"):
            continue
        agent = Needle(model=model, tools=ex["tools"], system=ex["system"] or None, tokenizer=tok,
                       retrieval="bm25")
        response = agent.complete(ex["query"])
        label = calls_equal(ex["answers"], predicted_calls(response)) and not response.get("error")
        ids = agent.conversation_ids()
        _, c = model.engine.forward_cells(np.asarray(ids, np.int64))
        cells.append(c.astype(np.float16))
        offsets.append(offsets[-1] + len(ids))
        labels.append(int(bool(label)))
        kinds.append(ex["kind"])
        p = response.get("confidence")        # no head yet: the min call-token probability
        token_probs.append(np.nan if p is None else float(p))
        if progress and len(labels) % 50 == 0:
            print(f"{len(labels)}/{n} turns, {np.mean(labels):.1%} correct, "
                  f"{time.time() - t0:.0f}s", flush=True)
    np.savez(out_path, cells=np.concatenate(cells), offsets=np.asarray(offsets, np.int64),
             labels=np.asarray(labels, np.int8), kinds=np.asarray(kinds),
             token_probs=np.asarray(token_probs, np.float32), seed=seed)
    return out_path


# ---------------------------------------------------------------------- fit ---

def _softmax(x, xp):
    x = x - xp.max(x, axis=-1, keepdims=True)
    e = xp.exp(x)
    return e / xp.sum(e, axis=-1, keepdims=True)


def pool_logit(params, cells, keep, xp=np):
    """Spec §5.2 for one padded batch: cells [B, T, R, d], keep [B, T] -> logits [B].
    ``xp`` is numpy (tests compare it with the engine) or jax.numpy (training)."""
    d = cells.shape[-1]
    score = xp.einsum("btrd,rjd->brjt", cells, params["probes"]) / math.sqrt(d)
    score = xp.where(keep[:, None, None, :], score, -1e30)
    pi = _softmax(score, xp)
    rho = xp.einsum("brjt,btrd->brjd", pi, cells)
    rho = rho / xp.sqrt(xp.mean(rho * rho, axis=-1, keepdims=True) + 1e-6)
    rho = rho * params["gain"][None, :, :, None]
    u = xp.einsum("brjd,ad->barj", rho, params["query"]) / math.sqrt(d) + params["row_bias"][None]
    b, a = u.shape[0], u.shape[1]
    omega = _softmax(u.reshape(b, a, -1), xp)
    pooled = xp.einsum("bak,bkd->bad", omega, rho.reshape(b, -1, d))
    z = pooled.reshape(b, -1)
    return z @ params["proj"][0] + params["bias"][0]


def _batch(cells, offsets, rows, max_len):
    """Padded [B, T, R, d] float32 cells (the last ``max_len`` tokens) and keep masks."""
    R, d = cells.shape[1], cells.shape[2]
    lengths = [min(int(offsets[i + 1] - offsets[i]), max_len) for i in rows]
    T = max(lengths)
    out = np.zeros((len(rows), T, R, d), np.float32)
    keep = np.zeros((len(rows), T), bool)
    for b, i in enumerate(rows):
        seg = cells[offsets[i + 1] - lengths[b]:offsets[i + 1]]
        out[b, :lengths[b]] = seg
        keep[b, :lengths[b]] = True
    return out, keep


def auc(labels, scores):
    """Area under the ROC curve (ties count half)."""
    labels = np.asarray(labels, bool)
    pos, neg = scores[labels], scores[~labels]
    if not len(pos) or not len(neg):
        return float("nan")
    greater = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(greater / (len(pos) * len(neg)))


def fit(data_path, out_path, steps=600, lr=3e-3, weight_decay=1e-2, batch=32, seed=0, verbose=True):
    import jax
    import jax.numpy as jnp
    import optax

    z = np.load(data_path)
    cells, offsets, labels = z["cells"], z["offsets"], z["labels"].astype(np.float32)
    n, R, d = len(labels), cells.shape[1], cells.shape[2]
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    n_val = max(1, n // 5)
    val, train = order[:n_val], order[n_val:]
    max_len = int(np.max(np.diff(offsets)))
    key = jax.random.PRNGKey(seed)
    k1, k2, k3 = jax.random.split(key, 3)
    base = float(np.clip(labels[train].mean(), 0.02, 0.98))
    params = {
        "probes": 0.02 * jax.random.normal(k1, (R, PROBES, d)),
        "gain": jnp.ones((R, PROBES)),
        "query": 0.02 * jax.random.normal(k2, (QUERIES, d)),
        "row_bias": jnp.zeros((QUERIES, R, PROBES)),
        "proj": 0.02 * jax.random.normal(k3, (1, QUERIES * d)),
        "bias": jnp.asarray([math.log(base / (1 - base))]),
    }
    opt = optax.adamw(lr, weight_decay=weight_decay)
    state = opt.init(params)

    def loss_fn(p, x, keep, y):
        logits = pool_logit(p, x, keep, jnp)
        return optax.sigmoid_binary_cross_entropy(logits, y).mean()

    @jax.jit
    def step(p, s, x, keep, y):
        loss, g = jax.value_and_grad(loss_fn)(p, x, keep, y)
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s, loss

    predict = jax.jit(lambda p, x, keep: pool_logit(p, x, keep, jnp))

    def evaluate(p, rows):
        scores = []
        for i in range(0, len(rows), batch):
            x, keep = _batch(cells, offsets, rows[i:i + batch], max_len)
            scores.append(np.asarray(predict(p, jnp.asarray(x), jnp.asarray(keep))))
        s = np.concatenate(scores)
        y = labels[rows]
        prob = 1 / (1 + np.exp(-s))
        nll = float(np.mean(-(y * np.log(prob + 1e-9) + (1 - y) * np.log(1 - prob + 1e-9))))
        return nll, auc(y, s), float(np.mean((prob - y) ** 2))

    best = (evaluate(params, val), jax.tree.map(np.asarray, params), 0)
    if verbose:
        print(f"{n} turns ({labels.mean():.1%} correct), {len(train)} train / {n_val} held out; "
              f"start held-out nll {best[0][0]:.4f} auc {best[0][1]:.3f}", flush=True)
    for t in range(1, steps + 1):
        rows = rng.choice(train, size=min(batch, len(train)), replace=False)
        x, keep = _batch(cells, offsets, rows, max_len)
        params, state, loss = step(params, state, jnp.asarray(x), jnp.asarray(keep),
                                   jnp.asarray(labels[rows]))
        if t % 25 == 0 or t == steps:
            metrics = evaluate(params, val)
            if metrics[0] < best[0][0]:
                best = (metrics, jax.tree.map(np.asarray, params), t)
            if verbose:
                print(f"step {t}: train loss {float(loss):.4f}, held-out nll {metrics[0]:.4f} "
                      f"auc {metrics[1]:.3f} brier {metrics[2]:.4f}", flush=True)
    (nll, roc, brier), head, best_step = best
    token_probs = z["token_probs"][val]
    seen = ~np.isnan(token_probs)
    summary = {"turns": n, "correct_rate": float(labels.mean()), "held_out": int(n_val),
               "best_step": best_step, "held_out_nll": nll, "held_out_auc": roc,
               "held_out_brier": brier,
               # the score the agent has without a head: the min call-token probability
               "held_out_auc_token_prob": auc(labels[val][seen], token_probs[seen]),
               "held_out_nll_constant": _constant_nll(labels[train].mean(), labels[val])}
    np.savez(out_path, summary=json.dumps(summary), **{k: np.asarray(v, np.float32) for k, v in head.items()})
    if verbose:
        print(json.dumps(summary), flush=True)
    return summary


def _constant_nll(p, y):
    p = float(np.clip(p, 1e-6, 1 - 1e-6))
    return float(np.mean(-(y * math.log(p) + (1 - y) * math.log(1 - p))))


# ------------------------------------------------------------------- attach ---

def attach(model_path, head_path, out_path):
    """Copy ``model_path`` to ``out_path`` with the confidence head of ``head_path``."""
    from ..archive import Archive, write_archive

    arch = Archive.open(model_path)
    if HEAD in arch.heads:
        raise ValueError(f"{model_path}: the archive already has a {HEAD} head")
    tensors = {}
    for index, record in enumerate(arch.records):
        role = record.role
        if role in ("tokenizer", "heads.manifest"):
            continue
        tensors[role] = arch.tensor(index)
    head = np.load(head_path)
    for name in ("probes", "gain", "query", "row_bias", "proj", "bias"):
        tensors[f"heads.{HEAD}.{name}"] = np.asarray(head[name], np.float32)
    return write_archive(out_path, arch.config, tensors, tokenizer_bytes=arch.tokenizer_bytes,
                         group_size=_group_size(arch))


def _group_size(arch):
    sizes = [r.group_size for r in arch.records if getattr(r, "group_size", 0)]
    return max(set(sizes), key=sizes.count) if sizes else 128


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m needle_cy.training.confidence")
    sub = parser.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect")
    c.add_argument("model")
    c.add_argument("out")
    c.add_argument("--n", type=int, default=600)
    c.add_argument("--seed", type=int, default=99)
    c.add_argument("--mix-share", type=float, default=0.0,
                   help="share of turns from the schema-general mix (the rest smart-home)")
    f = sub.add_parser("fit")
    f.add_argument("data")
    f.add_argument("out")
    f.add_argument("--steps", type=int, default=600)
    a = sub.add_parser("attach")
    a.add_argument("model")
    a.add_argument("head")
    a.add_argument("out")
    args = parser.parse_args(argv)
    if args.cmd == "collect":
        collect(args.model, args.out, args.n, args.seed, mix_share=args.mix_share)
    elif args.cmd == "fit":
        fit(args.data, args.out, steps=args.steps)
    else:
        print(attach(args.model, args.head, args.out))


if __name__ == "__main__":
    main()
