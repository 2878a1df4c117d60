"""Every operator of the Needle 3 forward pass, in plain float32 NumPy.

This is the executable specification of spec §3.8–§5 (and the masks of §9.2).
``needle_cy._ops`` mirrors these functions one to one (same names, same
semantics) and is tested against them.

Conventions
-----------
* Everything is float32 in and float32 out; integer inputs are token ids or
  absolute positions.
* Functions that work "per vector" act on the LAST axis and broadcast over any
  leading axes, so the same function serves a whole sequence ``[T, ...]`` and a
  single decode step ``[...]``.
* Dense weights are float32 ``[out, in]`` arrays (the container's orientation),
  i.e. ``y = x @ W.T``.  CQ matrices are dequantized by the caller (the model),
  so operators stay free of the container format.
* Masks are boolean, True = visible.
* Positions are absolute (0 = BOS).  The context policy of §9.2 is expressed by
  two numbers: ``recent`` (how many of the most recent positions, the current
  one included, are visible; ``None`` = unlimited) and ``sinks`` (how many of the
  first positions stay visible regardless).  Local (sliding-window) layers
  additionally require ``t - j < band``; sinks do not bypass the band.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cq_format import LLOYD_MAX_LEVELS  # the Gaussian levels of every CQ codebook (spec §3.2)
from ..weights import MonarchParams  # noqa: F401 (the bound weights' structure; tests build it here)

F32 = np.float32

# ---------------------------------------------------------------------------
# constants (spec §10.2)
# ---------------------------------------------------------------------------
RMS_EPS = 1e-6
CQ_NORM_FLOOR = 1e-12
L2_EPS = 1e-12
SINKHORN_ITERS = 20
ENGRAM_SEED = 0x9E3779B9
ENGRAM_PRIME = 0x01000193
ENGRAM_SHIFT = 15
MHC_PRE_OWN, MHC_PRE_OTHER = 4.0, -4.0
MHC_POST_OWN, MHC_POST_OTHER = 0.0, -4.0
KV_CQ_GROUP = 64


def _f32(x):
    return np.asarray(x, dtype=F32)


def sigmoid(x):
    """σ(x) = 1 / (1 + e^-x), float32."""
    x = _f32(x)
    return (F32(1.0) / (F32(1.0) + np.exp(-x))).astype(F32)


def silu(x):
    """silu(x) = x · σ(x), float32."""
    x = _f32(x)
    return x * sigmoid(x)


def softmax(x, axis=-1):
    """Numerically stable softmax (exp(x - max) / sum), float32; -inf entries get 0."""
    x = _f32(x)
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return (e / np.sum(e, axis=axis, keepdims=True)).astype(F32)


# ---------------------------------------------------------------------------
# quantizers (spec §3.8, §3.9)
# ---------------------------------------------------------------------------
def a8(x, bits=8):
    """Symmetric per-vector activation fake-quant "A8" over the last axis (§3.8).

    ``s = max|x| / 127`` (1 when the vector is all zeros),
    ``x̂ = clip(round_half_even(x / s), -128, 127) · s`` with true float32 division.
    """
    codes, scale = a8_codes(x, bits)
    return (codes * scale[..., None]).astype(F32)


def a8_codes(x, bits=8):
    """The integer form of :func:`a8`: ``(codes int8 [..., n], scales float32 [...])``,
    ``k_j`` and ``s`` of §3.8, so ``a8(x) = codes · scales[..., None]``."""
    if not 2 <= int(bits) <= 8:
        raise ValueError(f"a8_codes: bits must lie in [2, 8], got {bits}")
    x = _f32(x)
    qmax = F32(2 ** (bits - 1) - 1)
    amax = np.max(np.abs(x), axis=-1, keepdims=True) if x.shape[-1] else np.zeros(x.shape[:-1] + (1,), F32)
    scale = np.where(amax > 0, amax / qmax, F32(1.0)).astype(F32)
    k = np.clip(np.rint(x / scale), -qmax - 1, qmax)
    return k.astype(np.int8), scale[..., 0]


def hadamard(g):
    """Orthonormal Sylvester-Hadamard matrix H_g (float32 entries ±1/sqrt(g))."""
    if g < 1 or g & (g - 1):
        raise ValueError(f"hadamard: size must be a power of two, got {g}")
    h = np.ones((1, 1), dtype=np.float64)
    while h.shape[0] < g:
        h = np.block([[h, h], [h, -h]])
    return (h * F32(1.0 / np.sqrt(g))).astype(F32) if g > 1 else h.astype(F32)


def kv_codebook(bits, group=KV_CQ_GROUP):
    """KV-cache CQ codebook ``float32(level / sqrt(group))`` for widths 2, 3, 4 (§3.9)."""
    if bits not in LLOYD_MAX_LEVELS:
        raise ValueError(f"kv_codebook: KV CQ width must be 2, 3 or 4, got {bits}")
    return np.array([lv / np.sqrt(group) for lv in LLOYD_MAX_LEVELS[bits]], dtype=np.float64).astype(F32)


def nearest_codeword(u, codebook):
    """Index of the nearest codebook entry per element; ties go to the LOWER index.

    Left bisection, candidate pair clamped to ``[pos-1, pos]``, left wins when
    ``|u - left| <= |u - right|`` (spec §3.3 step 5).
    """
    u = _f32(u)
    cb = _f32(codebook)
    pos = np.searchsorted(cb, u, side="left")
    right = np.clip(pos, 1, len(cb) - 1)
    left = right - 1
    pick_left = np.abs(u - cb[left]) <= np.abs(u - cb[right])
    return np.where(pick_left, left, right).astype(np.int64)


def kv_quant_int8(x):
    """KV quantizer at kv_bits ≥ 8: A8 per head vector (last axis)."""
    return a8(x)


def kv_quant_cq(x, bits, group=KV_CQ_GROUP):
    """KV quantizer at kv_bits ∈ {2, 3, 4}: CQ fake-quant over groups of 64 (§3.9).

    Zero-pad the head vector (last axis) to a multiple of ``group``, rotate each
    group with H_group, ``ν = ||r||``, ``u = r / max(ν, 1e-12)``, snap to the
    nearest codeword (ties lower), rebuild with ν rounded to FP16, rotate back,
    drop the padding.
    """
    x = _f32(x)
    dh = x.shape[-1]
    ng = -(-dh // group)
    pad = ng * group - dh
    xp = np.concatenate([x, np.zeros(x.shape[:-1] + (pad,), F32)], axis=-1) if pad else x
    xg = xp.reshape(x.shape[:-1] + (ng, group))
    h = hadamard(group)
    r = (xg @ h).astype(F32)
    nu = np.sqrt(np.sum(r * r, axis=-1, keepdims=True, dtype=F32)).astype(F32)
    u = (r / np.maximum(nu, F32(CQ_NORM_FLOOR))).astype(F32)
    cb = kv_codebook(bits, group)
    q = cb[nearest_codeword(u, cb)]
    nu16 = nu.astype(np.float16).astype(F32)
    w = ((nu16 * q).astype(F32) @ h).astype(F32)
    return w.reshape(x.shape[:-1] + (ng * group,))[..., :dh].astype(F32)


def kv_quantize(x, kv_bits):
    """Dispatch: int8 A8 for kv_bits ≥ 8, CQ group-64 for 2/3/4."""
    if kv_bits >= 8:
        return kv_quant_int8(x)
    return kv_quant_cq(x, kv_bits)


# ---------------------------------------------------------------------------
# norms (spec §4.2)
# ---------------------------------------------------------------------------
def rms_unit(x):
    """RMS-unit over the last axis: ``x · rsqrt(mean(x²) + 1e-6)`` (no scale)."""
    x = _f32(x)
    ms = np.mean(x * x, axis=-1, keepdims=True, dtype=F32)
    return (x * (F32(1.0) / np.sqrt(ms + F32(RMS_EPS)))).astype(F32)


def zc_rmsnorm(x, scale):
    """Zero-centred RMSNorm over the last axis: ``(1 + scale) ⊙ x / sqrt(mean(x²) + 1e-6)``."""
    return (rms_unit(x) * (F32(1.0) + _f32(scale))).astype(F32)


# ---------------------------------------------------------------------------
# embedding and output (spec §4.3, §4.9)
# ---------------------------------------------------------------------------
def embed_scale(rows, d_model):
    """Scaled input embedding ``E[tok] · sqrt(d)`` given the dequantized rows ``[..., d]``."""
    return (_f32(rows) * F32(np.sqrt(d_model))).astype(F32)


def linear(x, w):
    """Dense product ``y = x @ W.T`` with W float32 ``[out, in]`` (a dequantized CQ matrix)."""
    # float64 accumulation, one rounding to float32: the result does not depend on
    # how many rows are multiplied at once (batched prefill ≡ step by step).
    return (np.asarray(x, np.float64) @ np.asarray(w, np.float64).T).astype(F32)


def tied_logits(h, embedding):
    """Output logits ``h · E[:out_vocab]ᵀ`` (h already final-normed and, in deploy, A8'd)."""
    return linear(h, embedding)


def lane_mean(lanes):
    """Mean over the lane axis (``[..., n, d]`` → ``[..., d]``): the hidden cell / pre-final-norm state."""
    return np.mean(_f32(lanes), axis=-2, dtype=F32).astype(F32)


# ---------------------------------------------------------------------------
# context visibility (spec §9.2)
# ---------------------------------------------------------------------------
def context_visible(t, j, recent=None, sinks=0, band=None):
    """Whether key position ``j`` is visible from query position ``t`` (broadcasts).

    ``0 <= j <= t`` and (``t - j < recent`` or ``j < sinks``) and, for local layers,
    ``t - j < band`` (sinks do not bypass the band).  ``recent``/``band`` None = no limit.
    """
    t = np.asarray(t, dtype=np.int64)
    j = np.asarray(j, dtype=np.int64)
    ok = (j >= 0) & (j <= t)
    if recent is not None:
        ok &= ((t - j) < recent) | (j < sinks)
    if band is not None:
        ok &= (t - j) < band
    return ok


def attention_mask(q_pos, k_pos, recent=None, sinks=0, band=None):
    """Boolean ``[Tq, Tk]`` mask for query positions ``q_pos`` against key positions ``k_pos``."""
    q_pos = np.asarray(q_pos, dtype=np.int64)[:, None]
    k_pos = np.asarray(k_pos, dtype=np.int64)[None, :]
    return context_visible(q_pos, k_pos, recent, sinks, band)


def conv_tap_ok(positions, n_taps, dilation=1, recent=None, sinks=0, band=None):
    """``[T, n_taps]`` mask: tap j of position t is used iff ``t - j·dilation`` is visible from t."""
    t = np.asarray(positions, dtype=np.int64)[:, None]
    j = t - dilation * np.arange(n_taps, dtype=np.int64)[None, :]
    return context_visible(t, j, recent, sinks, band)


# ---------------------------------------------------------------------------
# causal depthwise convolutions (spec §4.7 step 2, §4.4)
# ---------------------------------------------------------------------------
def causal_conv(x, taps, dilation=1, tap_ok=None):
    """Causal depthwise conv over a sequence: ``y[t] = Σ_j taps[j] ⊙ x[t - j·dil] · ok[t, j]``.

    ``x`` ``[T, C]`` (row t = position t of this sequence), ``taps`` ``[n_taps, C]``,
    ``tap_ok`` ``[T, n_taps]`` bool (default: the source position exists).
    Used with dilation 1 for the Q/K/V taps and dilation ``max(orders)`` for engram values.
    """
    x = _f32(x)
    taps = _f32(taps)
    T = x.shape[0]
    n_taps = taps.shape[0]
    if tap_ok is None:
        tap_ok = conv_tap_ok(np.arange(T), n_taps, dilation)
    y = np.zeros_like(x)
    for j in range(n_taps):
        off = j * dilation
        if off >= T:
            break
        src = np.zeros_like(x)
        src[off:] = x[:T - off]
        y += taps[j] * src * tap_ok[:, j:j + 1].astype(F32)
    return y.astype(F32)


def causal_conv_step(history, taps, tap_ok=None):
    """One position of :func:`causal_conv`: ``history[j]`` = x at ``t - j·dilation`` (``[n_taps, C]``).

    ``tap_ok`` ``[n_taps]`` bool (rows of the history that do not exist must be masked).
    """
    history = _f32(history)
    taps = _f32(taps)
    ok = np.ones(taps.shape[0], F32) if tap_ok is None else np.asarray(tap_ok, F32)
    return np.sum(taps * history * ok[:, None], axis=0, dtype=F32).astype(F32)


# ---------------------------------------------------------------------------
# RoPE (spec §4.7 step 5)
# ---------------------------------------------------------------------------
def rope_frequencies(head_dim, theta):
    """``f_i = 1 / θ^(2i/dq)``, i = 0..dq/2-1, float32."""
    i2 = np.arange(0, head_dim, 2, dtype=F32)
    return (F32(1.0) / (F32(theta) ** (i2 / F32(head_dim)))).astype(F32)


def rope(x, positions, theta):
    """Rotate-half ("NeoX") RoPE on the last axis at absolute ``positions``.

    ``x`` ``[T, heads, dh]`` with ``positions`` ``[T]`` (or ``[heads, dh]`` with a scalar
    position).  ``out[i] = x[i]c - x[i+h]s``, ``out[i+h] = x[i+h]c + x[i]s``.
    """
    x = _f32(x)
    dh = x.shape[-1]
    half = dh // 2
    freqs = rope_frequencies(dh, theta)
    pos = np.asarray(positions, dtype=F32)
    ang = (pos[..., None] * freqs).astype(F32)  # [T, half] or [half]
    if ang.ndim == 2:
        ang = ang[:, None, :]                    # broadcast over heads
    c = np.cos(ang).astype(F32)
    s = np.sin(ang).astype(F32)
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1).astype(F32)


# ---------------------------------------------------------------------------
# attention (spec §4.7)
# ---------------------------------------------------------------------------
def split_heads(x, n_heads):
    """``[..., n_heads·dh]`` → ``[..., n_heads, dh]`` (head h = channels h·dh … h·dh+dh-1)."""
    x = _f32(x)
    return x.reshape(x.shape[:-1] + (n_heads, x.shape[-1] // n_heads))


def gqa_attention(q, k, v, mask):
    """Grouped-query softmax attention.

    ``q`` ``[Tq, H, dq]``, ``k`` ``[Tk, K, dq]``, ``v`` ``[Tk, K, dv]``, ``mask`` ``[Tq, Tk]``
    bool.  Query head h reads KV head ``h // (H/K)``; scores ``q·k / sqrt(dq)``,
    float32 softmax over visible keys.  Returns ``[Tq, H, dv]``.
    """
    q, k, v = _f32(q), _f32(k), _f32(v)
    H, dq = q.shape[1], q.shape[2]
    K = k.shape[1]
    G = H // K
    # float64 accumulation, rounded once: the result does not depend on how many
    # (masked) keys take part, so a chunked prefill equals stepping token by token.
    qh = q.transpose(1, 0, 2).astype(np.float64)                         # [H, Tq, dq]
    kh = np.repeat(k, G, axis=1).transpose(1, 2, 0).astype(np.float64)   # [H, dq, Tk]
    vh = np.repeat(v, G, axis=1).transpose(1, 0, 2).astype(np.float64)   # [H, Tk, dv]
    scores = (qh @ kh).astype(F32) / F32(np.sqrt(dq))                    # [H, Tq, Tk]
    scores = np.where(mask[None, :, :], scores, F32(-np.inf))
    e = np.exp(scores - np.max(scores, axis=-1, keepdims=True))
    p = e / np.sum(e, axis=-1, keepdims=True, dtype=np.float64)
    return (p @ vh).transpose(1, 0, 2).astype(F32)                       # [Tq, H, dv]


def gqa_attention_int8(q_codes, q_scales, k_codes, k_scales, v_codes, v_scales, mask):
    """:func:`gqa_attention` of A8 codes and their scales (``q̂ = q_codes · q_scales[..., None]``,
    likewise k̂ and v̂): the values attended are the quantizer's, whatever form a cache keeps."""
    def deq(codes, scales):
        return (np.asarray(codes, np.float32) * _f32(scales)[..., None]).astype(F32)
    return gqa_attention(deq(q_codes, q_scales), deq(k_codes, k_scales), deq(v_codes, v_scales), mask)


def output_gate(o, g):
    """Gated attention output ``o ⊙ σ(g)`` (both ``[..., H·dv]``)."""
    return (_f32(o) * sigmoid(g)).astype(F32)


# ---------------------------------------------------------------------------
# engram memory (spec §4.4)
# ---------------------------------------------------------------------------
def engram_hash(tokens, orders, heads, seed_stride, slots):
    """Slot of every (position, table) for the n-grams ending at each position.

    ``tokens`` ``[T]`` ids (positions before the first are treated as token 0),
    tables ordered order-major (``table = oi·heads + h``).  uint32 arithmetic
    modulo 2³² (spec §4.4).  Returns int64 ``[T, len(orders)·heads]``.
    """
    tok = np.asarray(tokens, dtype=np.int64).astype(np.uint32)
    T = tok.shape[0]
    stride = seed_stride or heads
    out = np.zeros((T, len(orders) * heads), dtype=np.int64)
    prime = np.uint32(ENGRAM_PRIME)
    with np.errstate(over="ignore"):
        for oi, o in enumerate(orders):
            for h in range(heads):
                seed = (ENGRAM_SEED * (oi * stride + h + 1)) & 0xFFFFFFFF
                acc = np.full(T, seed, dtype=np.uint32)
                for j in range(o):
                    prev = np.zeros(T, dtype=np.uint32)
                    if j < T:
                        prev[j:] = tok[:T - j]
                    acc = (acc ^ prev) * prime
                acc = acc ^ (acc >> np.uint32(ENGRAM_SHIFT))
                out[:, oi * heads + h] = (acc % np.uint32(slots)).astype(np.int64)
    return out


def engram_row_ids(slot_ids, slots):
    """Table row of each (position, table): ``table·slots + slot``."""
    slot_ids = np.asarray(slot_ids, dtype=np.int64)
    n_tables = slot_ids.shape[-1]
    return slot_ids + np.arange(n_tables, dtype=np.int64) * slots


def engram_ngram_ok(positions, orders, heads, recent=None, sinks=0):
    """``[T, NT]`` float32 validity: the n-gram's earliest position ``t-(o-1)`` exists and is visible."""
    t = np.asarray(positions, dtype=np.int64)[:, None]
    first = t - (np.repeat(np.asarray(orders, dtype=np.int64), heads)[None, :] - 1)
    return context_visible(t, first, recent, sinks).astype(F32)


def engram_fetch(rows, ngram_ok):
    """Concatenate fetched table rows ``[..., NT, sub]`` masked by ``ngram_ok`` ``[..., NT]`` → ``[..., NT·sub]``."""
    rows = _f32(rows) * _f32(ngram_ok)[..., None]
    return rows.reshape(rows.shape[:-2] + (rows.shape[-2] * rows.shape[-1],)).astype(F32)


def engram_inject(u, key, value):
    """Engram gate inside the block: ``u + σ(Σ RMSunit(u)·RMSunit(key) / sqrt(d)) · value``."""
    u = _f32(u)
    d = u.shape[-1]
    alpha = sigmoid(np.sum(rms_unit(u) * rms_unit(key), axis=-1, keepdims=True, dtype=F32) / F32(np.sqrt(d)))
    return (u + alpha * _f32(value)).astype(F32)


# ---------------------------------------------------------------------------
# multi-lane hyper-connection (spec §4.5)
# ---------------------------------------------------------------------------
def mhc_router_input(lanes, quant=True):
    """Router input ``nx = A8(RMSunit(flatten(X)))`` of the lane state ``[..., n, d]`` → ``[..., n·d]``."""
    lanes = _f32(lanes)
    flat = lanes.reshape(lanes.shape[:-2] + (lanes.shape[-2] * lanes.shape[-1],))
    nx = rms_unit(flat)
    return a8(nx) if quant else nx


def mhc_offsets(n_lanes, lane):
    """(pre_off, post_off) ``[n]``: +4/-4 and 0/-4 for own/other lanes."""
    own = np.arange(n_lanes) == lane
    pre = np.where(own, MHC_PRE_OWN, MHC_PRE_OTHER).astype(F32)
    post = np.where(own, MHC_POST_OWN, MHC_POST_OTHER).astype(F32)
    return pre, post


def mhc_pre_weights(phi_x, a, b, lane):
    """``hpre = σ(a·(Φpre·nx) + b + pre_off)``; ``phi_x`` ``[..., n]`` = Φpre_l · nx."""
    phi_x = _f32(phi_x)
    pre_off, _ = mhc_offsets(phi_x.shape[-1], lane)
    return sigmoid(F32(a) * phi_x + _f32(b) + pre_off)


def mhc_post_weights(phi_x, a, b, lane):
    """``hpost = 2·σ(a·(Φpost·nx) + b + post_off)``."""
    phi_x = _f32(phi_x)
    _, post_off = mhc_offsets(phi_x.shape[-1], lane)
    return (F32(2.0) * sigmoid(F32(a) * phi_x + _f32(b) + post_off)).astype(F32)


def logsumexp(x, axis):
    """``max + log Σ exp(x - max)`` along ``axis`` (keepdims), float32."""
    m = np.max(x, axis=axis, keepdims=True)
    return (m + np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True))).astype(F32)


def sinkhorn(z, iters=SINKHORN_ITERS):
    """Log-domain Sinkhorn on ``[..., n, n]``: alternate row and column log-normalisation, then exp."""
    m = _f32(z).copy()
    for _ in range(iters):
        m = (m - logsumexp(m, axis=-1)).astype(F32)
        m = (m - logsumexp(m, axis=-2)).astype(F32)
    return np.exp(m).astype(F32)


def mhc_res_weights(phi_x, a, b):
    """``P = Sinkhorn(a·reshape(Φres·nx) + b)``; ``phi_x`` ``[..., n²]`` (row i·n+j), ``b`` ``[n, n]``."""
    phi_x = _f32(phi_x)
    n = int(round(np.sqrt(phi_x.shape[-1])))
    z = F32(a) * phi_x.reshape(phi_x.shape[:-1] + (n, n)) + _f32(b)
    return sinkhorn(z)


def mhc_collapse(lanes, hpre):
    """Block input ``u = Σ_m hpre[m] · X[m]`` (``[..., n, d]``, ``[..., n]`` → ``[..., d]``)."""
    return np.sum(_f32(hpre)[..., None] * _f32(lanes), axis=-2, dtype=F32).astype(F32)


def mhc_expand(lanes, P, hpost, y):
    """New lanes ``X'[i] = Σ_j P[i,j] X[j] + hpost[i] · y``."""
    mixed = np.einsum("...ij,...jd->...id", _f32(P).astype(np.float64), _f32(lanes)).astype(F32)
    return (mixed + _f32(hpost)[..., None] * _f32(y)[..., None, :]).astype(F32)


# ---------------------------------------------------------------------------
# Monarch Hadamard MLP (spec §4.8)
# ---------------------------------------------------------------------------
def monarch_factor_sizes(n):
    """``(ba, bb)`` with ``ba = 1 << (bit_length(N-1) // 2)``, ``bb = N / ba``."""
    ba = 1 << ((n - 1).bit_length() // 2)
    return ba, n // ba


def kron_apply(z, a, b):
    """``K(z; A, B)``: view z ``[..., N]`` as ``Z [ba, bb]`` and return ``flatten(Aᵀ Z B)``."""
    z = _f32(z)
    ba, bb = _f32(a).shape[0], _f32(b).shape[0]
    zz = z.reshape(z.shape[:-1] + (ba, bb))
    # (Aᵀ Z) B with float64 accumulation (rounded once, independent of the batch shape)
    out = ((np.asarray(a, np.float64).T @ zz.astype(np.float64)) @ np.asarray(b, np.float64)).astype(F32)
    return out.reshape(z.shape).astype(F32)


def monarch_condition(m, cond_v, cond_u):
    """``c = 1 + softmax(m · cond_v) · cond_u`` (softmax over the rank R)."""
    w = softmax(linear(m, np.asarray(cond_v).T), axis=-1)
    return (F32(1.0) + linear(w, np.asarray(cond_u).T)).astype(F32)


def monarch_mlp(m, p: MonarchParams):
    """Monarch Hadamard MLP of ``m`` ``[..., d]`` → ``[..., d]`` (spec §4.8)."""
    m = _f32(m)
    d = m.shape[-1]
    n = p.d1.shape[0]
    c = monarch_condition(m, p.cond_v, p.cond_u)
    z = np.zeros(m.shape[:-1] + (n,), F32)
    z[..., :d] = m
    z = kron_apply(p.d1 * z, p.w1a, p.w1b)[..., p.p1]
    z = kron_apply(silu(p.d2 * c * z + p.b2), p.w2a, p.w2b)[..., p.p2]
    z = kron_apply(p.d3 * z, p.w3a, p.w3b)
    return (p.d4 * z)[..., :d].astype(F32)


# ---------------------------------------------------------------------------
# probe heads (spec §5)
# ---------------------------------------------------------------------------
def probe_scores(cells, probes):
    """``score[..., r, j] = cells[..., r, :] · P[r, j, :] / sqrt(d)``; cells ``[..., R, d]``, probes ``[R, k, d]``."""
    cells = _f32(cells)
    d = cells.shape[-1]
    return (np.einsum("...rd,rjd->...rj", cells, _f32(probes)) / F32(np.sqrt(d))).astype(F32)


def probe_pool_tokens(cells, probes, keep=None):
    """Token pooling (the softmax over t) for a whole sequence.

    ``cells`` ``[T, R, d]``, ``probes`` ``[R, k, d]``, ``keep`` ``[T]`` bool (False = PAD).
    Returns the attention-pooled cells ``Σ_t π[r,j,t] cells[t,r]`` ``[R, k, d]``.
    """
    cells = _f32(cells)
    s = probe_scores(cells, probes)                      # [T, R, k]
    if keep is not None:
        s = np.where(np.asarray(keep, bool)[:, None, None], s, F32(-np.inf))
    pi = softmax(s, axis=0)                              # over t
    return np.einsum("trj,trd->rjd", pi, cells).astype(F32)


@dataclass
class ProbePoolState:
    """Online token pooling (spec §5.5): per (row, probe) running max, denominator, weighted sum.

    ``max`` ``[R, k]`` (−inf before any token), ``denom`` ``[R, k]``, ``weighted`` ``[R, k, d]``.
    Memory is ``R·k·(d+2)`` floats however long the sequence grows.
    """
    max: np.ndarray
    denom: np.ndarray
    weighted: np.ndarray

    @classmethod
    def empty(cls, rows, probes_per_row, d):
        return cls(np.full((rows, probes_per_row), -np.inf, F32),
                   np.zeros((rows, probes_per_row), F32),
                   np.zeros((rows, probes_per_row, d), F32))

    def copy(self):
        return ProbePoolState(self.max.copy(), self.denom.copy(), self.weighted.copy())

    @property
    def count_empty(self):
        return bool(np.all(np.isneginf(self.max)))


def probe_pool_update(state: ProbePoolState, cells_t, probes, keep=True):
    """Fold one token's cells ``[R, d]`` into the online pool (in place; returns ``state``)."""
    if not keep:
        return state
    cells_t = _f32(cells_t)
    s = probe_scores(cells_t, probes)                    # [R, k]
    new_max = np.maximum(state.max, s)
    old_scale = np.exp(state.max - new_max).astype(F32)  # exp(-inf) = 0 for the first token
    w_t = np.exp(s - new_max).astype(F32)
    state.denom[...] = state.denom * old_scale + w_t
    state.weighted[...] = state.weighted * old_scale[..., None] + w_t[..., None] * cells_t[:, None, :]
    state.max[...] = new_max
    return state


def probe_pool_tokens_online(state: ProbePoolState):
    """The pooled cells ``[R, k, d]`` of an online state (weighted / denom)."""
    return (state.weighted / state.denom[..., None]).astype(F32)


def probe_pool_rows(token_pooled, gain, query, row_bias):
    """Row/probe pooling after the token pooling (spec §5.2) → ``z`` ``[q·d]``.

    ``token_pooled`` ``[R, k, d]``, ``gain`` ``[R, k]``, ``query`` ``[q, d]``,
    ``row_bias`` ``[q, R, k]``.
    """
    rho = (rms_unit(token_pooled) * _f32(gain)[..., None]).astype(F32)   # [R, k, d]
    R, k, d = rho.shape
    flat = rho.reshape(R * k, d)
    u = (_f32(query) @ flat.T) / F32(np.sqrt(d)) + _f32(row_bias).reshape(-1, R * k)   # [q, R·k]
    omega = softmax(u.astype(F32), axis=-1)
    pooled = (omega @ flat).astype(F32)                  # [q, d]
    return pooled.reshape(-1).astype(F32)


def probe_pool(cells, probes, gain, query, row_bias, keep=None):
    """Whole-sequence probe pooling (spec §5.2): cells ``[T, R, d]`` → ``z`` ``[q·d]``."""
    return probe_pool_rows(probe_pool_tokens(cells, probes, keep), gain, query, row_bias)


def probe_head_output(z, proj, bias):
    """``out = Wproj · z + bias`` (proj dequantized ``[out, q·d]``)."""
    return (linear(z, proj) + _f32(bias)).astype(F32)


def embedding_head_post(out):
    """Embedding head: L2-normalise ``p / sqrt(Σp² + 1e-12)`` → float32 ``[out]``."""
    out = _f32(out)
    return (out / np.sqrt(np.sum(out * out, dtype=F32) + F32(L2_EPS))).astype(F32)


def confidence_head_post(out):
    """Confidence head: the raw logit ``out[0]`` as a Python float."""
    return float(_f32(out).reshape(-1)[0])


def router_head_post(out):
    """Router head: the 3 raw logits, float32."""
    return _f32(out).copy()


HEAD_POST = {
    "embedding": embedding_head_post,
    "confidence": confidence_head_post,
    "router": router_head_post,
}
