"""Random Needle 3 archives of any geometry, for tests and benchmarks.

    python -m needle_cy.testing.make_random_archive --out model.cact --bits 2
    python -m needle_cy.testing.make_random_archive --out tiny.cact --bits 4 \\
        --layers 2 --d-model 64 --vocab 512 --group-size 64

Defaults are the full-size geometry of spec §1.1 (20 layers, d_model 768, vocab
16384, 12/2 heads, dq 48, dv 64, engram orders (2, 3) with 18432 slots at sites
(3, 7, 11, 15, 19), global layers (4, 9, 14, 19), sliding window 1024, 4 mHC
lanes, max_seq_len 4096) with all three probe heads.  Weights are random with
the scales of a fresh initialisation, so a forward pass stays finite: ZC norm
scales near 0, projections N(0, 1/fan_in), Monarch factors N(0, 1/b)
(orthogonal-ish), conv taps near identity, mHC a/b small, the MLP permutations
those of the official generator (RandomState(11)/(13)).
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np

from ..archive import HEAD_NAMES, Archive, NeedleConfig, body_layout, write_archive

DEFAULT_SITES = (3, 7, 11, 15, 19)
DEFAULT_GLOBALS = (4, 9, 14, 19)


def _layer_defaults(layers, defaults, period, phase):
    """The default pattern for another depth: every ``period``-th layer from ``phase``."""
    if layers == 20:
        return defaults
    return tuple(i for i in range(layers) if i % period == phase)


def random_config(layers=20, d_model=768, vocab=16384, out_vocab=0, num_heads=12, num_kv_heads=2,
                  qk_head_dim=48, v_head_dim=64, max_seq_len=4096, mhc_lanes=4, sliding_window=1024,
                  global_layers=None, qkv_conv_taps=3, engram_slots=18432, engram_orders=(2, 3),
                  engram_heads=0, engram_seed_heads=0, engram_sites=None, rope_theta=100000.0,
                  kv_window=0, kv_bits=8):
    """NeedleConfig of the requested geometry (sites/global layers follow the default pattern)."""
    if engram_sites is None:
        engram_sites = _layer_defaults(layers, DEFAULT_SITES, 4, 3)
    if global_layers is None:
        global_layers = _layer_defaults(layers, DEFAULT_GLOBALS, 5, 4)
    return NeedleConfig.build(
        vocab=vocab, out_vocab=out_vocab, d_model=d_model, num_heads=num_heads,
        num_kv_heads=num_kv_heads, num_layers=layers, qk_head_dim=qk_head_dim,
        v_head_dim=v_head_dim, max_seq_len=max_seq_len, mhc_lanes=mhc_lanes,
        sliding_window=sliding_window, global_layers=tuple(global_layers),
        qkv_conv_taps=qkv_conv_taps, engram_slots=engram_slots, engram_orders=tuple(engram_orders),
        engram_heads=engram_heads, engram_seed_heads=engram_seed_heads,
        engram_sites=tuple(engram_sites), rope_theta=rope_theta, kv_window=kv_window, kv_bits=kv_bits)


def random_tensors(cfg, seed=0, heads=True, head_probes=4, head_queries=4, embedding_dim=128):
    """role → zero-argument callable producing a float32 array (so the writer streams them)."""
    rng = np.random.default_rng(seed)
    # One child seed per role, drawn up front: each tensor is reproducible on its own
    # and the order in which the writer asks for them does not matter.
    roles = [slot.role for slot in body_layout(cfg)]
    head_set = HEAD_NAMES if heads is True else tuple(heads or ())
    head_parts = ("probes", "gain", "query", "row_bias", "proj", "bias", "calibration")
    for h in head_set:
        if h not in HEAD_NAMES:
            raise ValueError(f"unknown probe head {h!r}; expected some of {HEAD_NAMES}")
        roles += [f"heads.{h}.{p}" for p in head_parts if p != "calibration" or h == "router"]
    seeds = dict(zip(roles, rng.integers(0, 2**63 - 1, size=len(roles))))
    shapes = {slot.role: slot.shape for slot in body_layout(cfg)}
    L1, d = cfg.probe_rows, cfg.d_model
    k, q = head_probes, head_queries
    for h in head_set:
        out = {"embedding": embedding_dim, "confidence": 1, "router": 3}[h]
        shapes.update({f"heads.{h}.probes": (L1, k, d), f"heads.{h}.gain": (L1, k),
                       f"heads.{h}.query": (q, d), f"heads.{h}.row_bias": (q, L1, k),
                       f"heads.{h}.proj": (out, q * d), f"heads.{h}.bias": (out,)})
        if h == "router":
            shapes[f"heads.{h}.calibration"] = (3,)

    def normal(role, std, mean=0.0):
        gen = np.random.default_rng(seeds[role])
        return (gen.standard_normal(shapes[role], dtype=np.float32) * np.float32(std) + np.float32(mean))

    def maker(role):
        name = role.rsplit(".", 1)[-1]
        shape = shapes[role]
        if role == "embedding":
            return normal(role, 1.0 / np.sqrt(d))
        if name in ("norm_in", "post_norm", "pre_hada", "q_norm", "k_norm", "final_norm"):
            return normal(role, 0.02)                           # ZC scale: (1 + s) ≈ 1
        if name in ("q_proj", "k_proj", "v_proj", "gate_proj", "out_proj", "key_proj", "value_proj"):
            return normal(role, 1.0 / np.sqrt(shape[1]))
        if name.endswith("taps"):                              # causal conv ≈ identity
            taps = normal(role, 0.1)
            taps[0] += 1.0
            return taps
        if name == "attn_gate":
            return normal(role, 0.5)
        if name in ("d1", "d2", "d3", "d4"):
            return normal(role, 0.1, 1.0)
        if name == "b2":
            return normal(role, 0.02)
        if name[0] == "w" and name[-1] in "ab":                # Monarch factor b×b
            return normal(role, 1.0 / np.sqrt(shape[0]))
        if name == "cond_v":
            return normal(role, 1.0 / np.sqrt(shape[0]))
        if name == "cond_u":
            return normal(role, 0.02)
        if name.startswith("mhc_a_"):
            return normal(role, 0.01, 0.05)
        if name.startswith("mhc_b_"):
            return normal(role, 0.1)
        if name.startswith("mhc_phi_"):
            return normal(role, 1.0 / np.sqrt(shape[1]))
        if name in ("hada_p1", "hada_p2"):
            state = 11 if name == "hada_p1" else 13
            return np.random.RandomState(state).permutation(cfg.hada_n).astype(np.float32)
        if name == "tables":
            return normal(role, 1.0 / np.sqrt(d))
        # probe heads
        if name == "probes" or name == "query":
            return normal(role, 1.0 / np.sqrt(d))
        if name == "gain":
            return normal(role, 0.1, 1.0)
        if name == "row_bias":
            return normal(role, 0.02)
        if name == "proj":
            return normal(role, 1.0 / np.sqrt(shape[1]))
        if name == "bias":
            return np.zeros(shape, np.float32) if role.startswith("heads.embedding") else normal(role, 0.1)
        if name == "calibration":
            return np.array([0.90, 0.00, 0.60], np.float32)
        raise KeyError(role)

    return {role: (lambda role=role: maker(role)) for role in roles}


def make_random_archive(path, layers=20, d_model=768, vocab=16384, bits=4, group_size=128, seed=0,
                        heads=True, qkv_conv_taps=3, kv_bits=8, tokenizer_from=None, head_probes=4,
                        head_queries=4, embedding_dim=128, head_layout="cq", **geometry):
    """Write a random archive and return its path.

    ``geometry`` takes any other ``random_config`` field (num_heads, num_kv_heads,
    qk_head_dim, v_head_dim, out_vocab, max_seq_len, mhc_lanes, sliding_window,
    global_layers, engram_slots, engram_orders, engram_heads, engram_seed_heads,
    engram_sites, rope_theta, kv_window).  ``heads``: True (all three), False, or
    a tuple of head names.  ``bits``: int or dict role → bits.
    ``tokenizer_from``: an archive path (or Archive) whose tokenizer record is copied.
    """
    cfg = random_config(layers=layers, d_model=d_model, vocab=vocab, qkv_conv_taps=qkv_conv_taps,
                        kv_bits=kv_bits, **geometry)
    tensors = random_tensors(cfg, seed=seed, heads=heads, head_probes=head_probes,
                             head_queries=head_queries, embedding_dim=embedding_dim)
    tokenizer_bytes = None
    if tokenizer_from is not None:
        if isinstance(tokenizer_from, Archive):
            tokenizer_bytes = tokenizer_from.tokenizer_bytes
        else:
            with Archive.open(tokenizer_from) as src:
                tokenizer_bytes = src.tokenizer_bytes
        if tokenizer_bytes is None:
            raise ValueError(f"{tokenizer_from}: archive has no tokenizer record to copy")
    return write_archive(path, cfg, tensors, bits=bits, group_size=group_size,
                         tokenizer_bytes=tokenizer_bytes, head_layout_kind=head_layout)


def _int_tuple(text):
    return tuple(int(x) for x in text.split(",") if x.strip())


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m needle_cy.testing.make_random_archive",
                                description="Write a random Needle 3 .cact archive (default: full-size geometry).")
    p.add_argument("--out", required=True, help="output .cact path")
    p.add_argument("--bits", type=int, default=4, choices=(1, 2, 3, 4, 5), help="CQ width (5 = ternary)")
    p.add_argument("--group-size", type=int, default=128)
    p.add_argument("--layers", type=int, default=20)
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--vocab", type=int, default=16384)
    p.add_argument("--out-vocab", type=int, default=0)
    p.add_argument("--num-heads", type=int, default=12)
    p.add_argument("--num-kv-heads", type=int, default=2)
    p.add_argument("--qk-head-dim", type=int, default=48)
    p.add_argument("--v-head-dim", type=int, default=64)
    p.add_argument("--max-seq-len", type=int, default=4096)
    p.add_argument("--mhc-lanes", type=int, default=4)
    p.add_argument("--sliding-window", type=int, default=1024)
    p.add_argument("--global-layers", type=_int_tuple, default=None, help="comma-separated layer indices")
    p.add_argument("--qkv-conv-taps", type=int, default=3)
    p.add_argument("--engram-slots", type=int, default=18432)
    p.add_argument("--engram-orders", type=_int_tuple, default=(2, 3))
    p.add_argument("--engram-sites", type=_int_tuple, default=None, help="comma-separated layer indices")
    p.add_argument("--kv-bits", type=int, default=8, choices=(2, 3, 4, 8))
    p.add_argument("--no-heads", action="store_true", help="omit the probe heads")
    p.add_argument("--tokenizer-from", default=None, help="copy the tokenizer record of this archive")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    path = make_random_archive(
        a.out, layers=a.layers, d_model=a.d_model, vocab=a.vocab, bits=a.bits, group_size=a.group_size,
        seed=a.seed, heads=not a.no_heads, qkv_conv_taps=a.qkv_conv_taps, kv_bits=a.kv_bits,
        tokenizer_from=a.tokenizer_from, out_vocab=a.out_vocab, num_heads=a.num_heads,
        num_kv_heads=a.num_kv_heads, qk_head_dim=a.qk_head_dim, v_head_dim=a.v_head_dim,
        max_seq_len=a.max_seq_len, mhc_lanes=a.mhc_lanes, sliding_window=a.sliding_window,
        global_layers=a.global_layers, engram_slots=a.engram_slots, engram_orders=a.engram_orders,
        engram_sites=a.engram_sites)
    size = Path(path).stat().st_size
    print(f"wrote {path}: {size:,} bytes in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
