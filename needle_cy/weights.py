"""Bind an archive's tensors into the structure the forward pass walks (shared by both backends).

``bind_weights(archive, depth=None, layers=None)`` returns a :class:`ModelWeights`:
per layer its CQ projections (``CQMatrix``, still packed), float32 norms, taps
and Monarch MLP parameters, its mHC rows (``a``/``b`` scalars and vectors, the
``Φ`` rows as CQ row slices), its engram site if any; the embedding; the engram
sites; the probe heads.  Nothing is dequantized here: each backend decides how
it multiplies CQ matrices.

Ladder rungs (spec §4.11): ``depth=D`` selects ``sorted(first D of the bisection
order)`` of the archive's layers; ``layers=[...]`` selects an explicit ascending
list.  The selected blocks are renumbered 0..D-1, the lane of block i becomes
``i mod n``, global layers and engram sites are the selected ones renumbered
(sites on dropped layers are dropped), mHC rows are taken for the selected
layers, and each probe head keeps cell row 0 plus rows ``1 + layer`` of the
selected layers.  Embedding, final norm, permutations and tokenizer are shared.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Optional

import numpy as np

from .errors import LadderError

HEAD_NAMES = ("embedding", "confidence", "router")


def ladder_order(num_layers):
    """Block selection order of the ladder (spec §4.11): bisection from ``[0, L-1]``.

    Repeatedly split the widest gap between adjacent chosen blocks (ties: the
    smallest left end) at its midpoint.  ``ladder_order(20)`` =
    0, 19, 9, 14, 4, 6, 11, 16, 2, 7, 12, 17, 1, 3, 5, 8, 10, 13, 15, 18.
    """
    if num_layers < 1:
        raise LadderError(f"ladder_order: num_layers must be >= 1, got {num_layers}")
    if num_layers == 1:
        return [0]
    order = [0, num_layers - 1]
    while len(order) < num_layers:
        chosen = sorted(order)
        best = None
        for a, b in zip(chosen, chosen[1:]):
            if b - a > 1 and (best is None or b - a > best[1] - best[0]):
                best = (a, b)
        order.append((best[0] + best[1]) // 2)
    return order


def ladder_layers(num_layers, depth):
    """The archive layers of the depth-``depth`` rung, ascending."""
    if not isinstance(depth, (int, np.integer)) or isinstance(depth, bool):
        raise LadderError(f"depth must be an integer, got {depth!r}")
    if not 1 <= depth <= num_layers:
        raise LadderError(f"depth must lie in [1, {num_layers}] (the archive has {num_layers} layers), got {depth}")
    return sorted(ladder_order(num_layers)[:depth])


def _check_layer_list(layers, num_layers):
    layers = list(layers)
    if not layers:
        raise LadderError("layers: the explicit layer list is empty")
    for x in layers:
        if not isinstance(x, (int, np.integer)) or isinstance(x, bool):
            raise LadderError(f"layers: entries must be integers, got {x!r}")
        if not 0 <= x < num_layers:
            raise LadderError(f"layers: layer {x} is outside [0, {num_layers}) of this archive")
    if any(b <= a for a, b in zip(layers, layers[1:])):
        raise LadderError(f"layers: must be strictly ascending without repeats, got {layers}")
    return [int(x) for x in layers]


def cq_row_slice(W, rows):
    """A CQ matrix made of selected rows of ``W`` (a view for a contiguous range, else a copy)."""
    from .archive import CQMatrix

    if isinstance(rows, slice):
        packed, norms = W.packed[rows], W.norms[rows]
    else:
        idx = np.asarray(rows, dtype=np.int64)
        packed, norms = W.packed[idx], W.norms[idx]
    return CQMatrix(rows=int(packed.shape[0]), cols=W.cols, bits=W.bits, group_size=W.group_size,
                    packed=np.ascontiguousarray(packed), norms=np.ascontiguousarray(norms),
                    codebook=W.codebook)


@dataclass
class MonarchParams:
    """One layer's Monarch MLP parameters (all float32): what reference.ops.monarch_mlp and _ops read."""
    d1: np.ndarray
    d2: np.ndarray
    b2: np.ndarray
    d3: np.ndarray
    d4: np.ndarray
    w1a: np.ndarray
    w1b: np.ndarray
    w2a: np.ndarray
    w2b: np.ndarray
    w3a: np.ndarray
    w3b: np.ndarray
    cond_v: np.ndarray   # [d, R]
    cond_u: np.ndarray   # [R, N]
    p1: np.ndarray       # int64 [N]
    p2: np.ndarray       # int64 [N]


@dataclass
class MhcWeights:
    """One layer's multi-lane hyper-connection parameters (spec §4.5)."""
    a_pre: float
    a_post: float
    a_res: float
    b_pre: np.ndarray        # [n]
    b_post: np.ndarray       # [n]
    b_res: np.ndarray        # [n, n]
    phi_pre: object          # CQMatrix [n, n·d]
    phi_post: object         # CQMatrix [n, n·d]
    phi_res: object          # CQMatrix [n², n·d]


@dataclass
class EngramSiteWeights:
    """One engram site (spec §4.4): the block (renumbered) it feeds and its tensors."""
    layer: int               # block index in this (possibly sliced) model
    source_site: int         # site index in the archive
    tables: object           # CQMatrix [NT·slots, sub_dim]
    key_proj: object         # CQMatrix [d, NT·sub_dim]
    value_proj: object       # CQMatrix [d, NT·sub_dim]
    taps: np.ndarray         # [4, d]


@dataclass
class LayerWeights:
    """One block (spec §4.6–§4.8) of the model as run."""
    index: int               # block index in this model (0..D-1)
    source_layer: int        # layer index in the archive
    lane: int                # mHC lane: index mod n
    is_global: bool          # full attention (else sliding window)
    engram_site: Optional[int]   # index into ModelWeights.engram_sites, or None
    norm_in: np.ndarray
    q_proj: object
    k_proj: object
    v_proj: object
    q_taps: Optional[np.ndarray]   # [C, H·dq] or None when qkv_conv_taps == 0
    k_taps: Optional[np.ndarray]
    v_taps: Optional[np.ndarray]
    q_norm: np.ndarray
    k_norm: np.ndarray
    gate_proj: object
    out_proj: object
    post_norm: np.ndarray
    attn_gate: float         # raw logit; the block uses σ(attn_gate)
    pre_hada: np.ndarray
    mlp: MonarchParams
    mhc: MhcWeights


@dataclass
class HeadWeights:
    """One probe head (spec §2.7, §5) restricted to the rows of the model as run."""
    name: str                # "embedding" | "confidence" | "router"
    probes: object           # CQMatrix [(D+1)·k, d] (row r·k + j) or float32 [D+1, k, d]
    gain: np.ndarray         # [D+1, k]
    query: object            # CQMatrix [q, d] or float32 [q, d]
    row_bias: np.ndarray     # [q, D+1, k]
    proj: object             # CQMatrix [out, q·d] or float32
    bias: np.ndarray         # [out]
    calibration: Optional[np.ndarray] = None   # router only
    probes_per_row: int = 0
    queries: int = 0


@dataclass
class ModelWeights:
    """Everything the forward pass needs, for the full archive or one ladder rung."""
    config: object                 # archive config with num_layers/global_layers/engram_sites of this model
    archive_config: object         # the archive header as read
    source_layers: tuple           # archive layer of each block
    d_model: int
    num_heads: int
    num_kv_heads: int
    qk_head_dim: int
    v_head_dim: int
    num_layers: int
    mhc_lanes: int
    hada_n: int
    sliding_window: int
    qkv_conv_taps: int
    rope_theta: float
    vocab: int
    out_vocab: int                 # rows of the output head (header 0 → vocab)
    max_seq_len: int
    kv_window: int                 # header value (0 = from the budget)
    kv_bits: int
    engram_orders: tuple
    engram_heads: int              # hash heads per order
    engram_seed_stride: int
    engram_slots: int
    engram_sub_dim: int
    engram_conv_taps: int
    engram_conv_dilation: int
    global_layers: tuple           # renumbered
    engram_layers: tuple           # renumbered block index of each kept site
    embedding: object              # CQMatrix [V, d]
    final_norm: np.ndarray
    hada_p1: np.ndarray            # int64 [N]
    hada_p2: np.ndarray
    layers: list = field(default_factory=list)
    engram_sites: list = field(default_factory=list)
    heads: dict = field(default_factory=dict)    # name → HeadWeights, manifest order

    @property
    def num_tables(self):
        return len(self.engram_orders) * self.engram_heads


def _replace_config(config, **changes):
    if dataclasses.is_dataclass(config):
        try:
            return dataclasses.replace(config, **changes)
        except (TypeError, ValueError):
            pass
    ns = SimpleNamespace(**{k: getattr(config, k) for k in dir(config)
                            if not k.startswith("_") and not callable(getattr(config, k))})
    for k, v in changes.items():
        setattr(ns, k, v)
    return ns


def _f32(x):
    return np.ascontiguousarray(np.asarray(x, dtype=np.float32))


def bind_weights(archive, depth=None, layers=None):
    """Structured weights of ``archive`` (a :class:`needle_cy.archive.Archive`), optionally a rung.

    ``depth`` (int) selects the ladder rung of that depth; ``layers`` (ascending ints)
    an explicit block list; not both.  See the module docstring for the remapping.
    """
    cfg = archive.config
    L = int(cfg.num_layers)
    if depth is not None and layers is not None:
        raise LadderError("give either depth= or layers=, not both")
    if layers is not None:
        selected = _check_layer_list(layers, L)
    elif depth is not None:
        selected = ladder_layers(L, depth)
    else:
        selected = list(range(L))

    d = int(cfg.d_model)
    n = int(cfg.mhc_lanes)
    taps = int(cfg.qkv_conv_taps)
    orders = tuple(int(o) for o in cfg.engram_orders)
    n_tables = int(cfg.num_engram_tables)
    heads_per_order = n_tables // len(orders) if orders else 0
    archive_sites = tuple(int(s) for s in cfg.engram_sites)
    archive_global = set(int(g) for g in cfg.global_layers)
    renumber = {src: i for i, src in enumerate(selected)}
    t = archive.tensor

    # engram sites whose layer is kept
    engram_sites = []
    site_of_block = {}
    for s, src_layer in enumerate(archive_sites):
        if src_layer not in renumber:
            continue
        site_of_block[renumber[src_layer]] = len(engram_sites)
        engram_sites.append(EngramSiteWeights(
            layer=renumber[src_layer], source_site=s,
            tables=t(f"engram.{s}.tables"), key_proj=t(f"engram.{s}.key_proj"),
            value_proj=t(f"engram.{s}.value_proj"), taps=_f32(t(f"engram.{s}.taps"))))

    a_pre, a_post, a_res = (_f32(t(r)).reshape(-1) for r in ("mhc_a_pre", "mhc_a_post", "mhc_a_res"))
    b_pre, b_post = _f32(t("mhc_b_pre")).reshape(L, n), _f32(t("mhc_b_post")).reshape(L, n)
    b_res = _f32(t("mhc_b_res")).reshape(L, n, n)
    phi_pre, phi_post, phi_res = t("mhc_phi_pre"), t("mhc_phi_post"), t("mhc_phi_res")
    p1 = np.asarray(t("hada_p1")).reshape(-1).astype(np.int64)
    p2 = np.asarray(t("hada_p2")).reshape(-1).astype(np.int64)

    blocks = []
    for i, src in enumerate(selected):
        def lt(name, src=src):
            return t(f"layers.{src}.{name}")
        mlp = MonarchParams(
            d1=_f32(lt("d1")), d2=_f32(lt("d2")), b2=_f32(lt("b2")), d3=_f32(lt("d3")), d4=_f32(lt("d4")),
            w1a=_f32(lt("w1a")), w1b=_f32(lt("w1b")), w2a=_f32(lt("w2a")), w2b=_f32(lt("w2b")),
            w3a=_f32(lt("w3a")), w3b=_f32(lt("w3b")),
            cond_v=_f32(lt("cond_v")), cond_u=_f32(lt("cond_u")), p1=p1, p2=p2)
        mhc = MhcWeights(
            a_pre=float(a_pre[src]), a_post=float(a_post[src]), a_res=float(a_res[src]),
            b_pre=b_pre[src].copy(), b_post=b_post[src].copy(), b_res=b_res[src].copy(),
            phi_pre=cq_row_slice(phi_pre, slice(src * n, (src + 1) * n)),
            phi_post=cq_row_slice(phi_post, slice(src * n, (src + 1) * n)),
            phi_res=cq_row_slice(phi_res, slice(src * n * n, (src + 1) * n * n)))
        blocks.append(LayerWeights(
            index=i, source_layer=src, lane=i % n, is_global=src in archive_global,
            engram_site=site_of_block.get(i),
            norm_in=_f32(lt("norm_in")), q_proj=lt("q_proj"), k_proj=lt("k_proj"), v_proj=lt("v_proj"),
            q_taps=_f32(lt("q_taps")) if taps else None,
            k_taps=_f32(lt("k_taps")) if taps else None,
            v_taps=_f32(lt("v_taps")) if taps else None,
            q_norm=_f32(lt("q_norm")), k_norm=_f32(lt("k_norm")),
            gate_proj=lt("gate_proj"), out_proj=lt("out_proj"), post_norm=_f32(lt("post_norm")),
            attn_gate=float(np.asarray(lt("attn_gate")).reshape(-1)[0]), pre_hada=_f32(lt("pre_hada")),
            mlp=mlp, mhc=mhc))

    # probe heads: keep cell row 0 and rows 1 + layer of the selected layers
    rows_kept = [0] + [1 + s for s in selected]
    heads = {}
    for name in getattr(archive, "heads", ()):
        probes = t(f"heads.{name}.probes")
        gain = _f32(t(f"heads.{name}.gain"))
        k = gain.shape[1]
        if hasattr(probes, "packed"):      # CQ [(L+1)·k, d]
            probe_rows = [r * k + j for r in rows_kept for j in range(k)]
            probes = probes if len(rows_kept) == L + 1 else cq_row_slice(probes, probe_rows)
        else:                              # older FP16 archives: (L+1, k, d)
            probes = _f32(np.asarray(probes).reshape(L + 1, k, d)[rows_kept])
        query = t(f"heads.{name}.query")
        row_bias = _f32(t(f"heads.{name}.row_bias"))
        q = row_bias.shape[0]
        calibration = None
        if f"heads.{name}.calibration" in archive.roles:
            calibration = _f32(t(f"heads.{name}.calibration"))
        heads[name] = HeadWeights(
            name=name, probes=probes, gain=_f32(gain[rows_kept]), query=query,
            row_bias=_f32(row_bias[:, rows_kept, :]), proj=t(f"heads.{name}.proj"),
            bias=_f32(t(f"heads.{name}.bias")).reshape(-1), calibration=calibration,
            probes_per_row=k, queries=q)

    global_layers = tuple(renumber[g] for g in sorted(archive_global) if g in renumber)
    engram_layers = tuple(s.layer for s in engram_sites)
    vocab = int(cfg.vocab)
    out_vocab = int(cfg.out_vocab) or vocab
    config = _replace_config(cfg, num_layers=len(selected), global_layers=global_layers,
                             engram_sites=engram_layers)
    return ModelWeights(
        config=config, archive_config=cfg, source_layers=tuple(selected),
        d_model=d, num_heads=int(cfg.num_heads), num_kv_heads=int(cfg.num_kv_heads),
        qk_head_dim=int(cfg.qk_head_dim), v_head_dim=int(cfg.v_head_dim),
        num_layers=len(selected), mhc_lanes=n, hada_n=int(cfg.hada_n),
        sliding_window=int(cfg.sliding_window), qkv_conv_taps=taps, rope_theta=float(cfg.rope_theta),
        vocab=vocab, out_vocab=out_vocab, max_seq_len=int(cfg.max_seq_len),
        kv_window=int(cfg.kv_window), kv_bits=int(cfg.kv_bits),
        engram_orders=orders, engram_heads=heads_per_order,
        engram_seed_stride=int(cfg.engram_seed_heads) or heads_per_order,
        engram_slots=int(cfg.engram_slots), engram_sub_dim=int(cfg.engram_sub_dim),
        engram_conv_taps=int(cfg.engram_conv_taps), engram_conv_dilation=int(cfg.engram_conv_dilation),
        global_layers=global_layers, engram_layers=engram_layers,
        embedding=t("embedding"), final_norm=_f32(t("final_norm")), hada_p1=p1, hada_p2=p2,
        layers=blocks, engram_sites=engram_sites, heads=heads)
