"""needle_cy.reference.ops against independent formulations of spec §3.8–§5, §9.2.

Each operator is checked against a second way of writing the same rule (a
pure-Python loop, a textbook identity, a hand-worked value), never against itself.
"""
import math

import numpy as np
import pytest

from needle_cy.reference import ops
from needle_cy.reference.cq import hadamard_matrix

RNG = np.random.default_rng(1234)


def randn(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


# --------------------------------------------------------------------- A8
def test_a8_round_half_even_and_scale():
    # max |x| = 127 → scale 1; x/s lands exactly on .5 ties
    x = np.array([127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -127.0], np.float32)
    np.testing.assert_array_equal(ops.a8(x), [127, 0, 2, 2, -0, -2, -127])


def test_a8_matches_python_loop():
    x = randn(7, 33, scale=3.0)
    got = ops.a8(x)
    for row, out in zip(x, got):
        a = np.float32(max(abs(float(v)) for v in row))
        s = np.float32(a / np.float32(127))
        for v, o in zip(row, out):
            k = min(127, max(-128, round(float(np.float32(v / s)))))  # Python round = half even
            assert o == np.float32(np.float32(k) * s)


def test_a8_codes_are_the_integer_form():
    x = randn(9, 48, scale=5.0)
    x[2] = 0.0
    codes, scales = ops.a8_codes(x)
    assert codes.dtype == np.int8 and scales.dtype == np.float32 and scales.shape == (9,)
    np.testing.assert_array_equal(codes * scales[:, None], ops.a8(x))
    assert scales[2] == 1.0 and not codes[2].any()
    assert np.all(np.abs(codes).max(axis=1)[[0, 1, 3]] == 127)     # the max element is ±127


def test_a8_zero_vector_and_levels():
    assert np.all(ops.a8(np.zeros(8, np.float32)) == 0)
    x = randn(100)
    q = ops.a8(x)
    s = np.abs(x).max() / np.float32(127)
    k = q / s
    np.testing.assert_allclose(k, np.round(k), atol=1e-3)   # on the integer grid
    assert np.abs(q - x).max() <= s / 2 * 1.0001


# --------------------------------------------------------------------- KV CQ
@pytest.mark.parametrize("bits", [2, 3, 4])
def test_kv_quant_cq_brute_force(bits):
    x = randn(5, 3, 48)
    got = ops.kv_quant_cq(x, bits)
    h = hadamard_matrix(64).astype(np.float64)
    levels = np.array(ops.LLOYD_MAX_LEVELS[bits]) / 8.0
    cb = levels.astype(np.float32).astype(np.float64)
    for idx in np.ndindex(x.shape[:-1]):
        v = np.zeros(64)
        v[:48] = x[idx]
        r = v @ h
        nu = np.linalg.norm(r)
        u = r / max(nu, 1e-12)
        dist = np.abs(u[:, None] - cb[None, :])
        code = np.argmin(dist, axis=1)            # argmin takes the lower index on ties
        w = (float(np.float16(nu)) * cb[code]) @ h
        np.testing.assert_allclose(got[idx], w[:48], rtol=0, atol=2e-6)


def test_kv_codebook_group64_values():
    np.testing.assert_allclose(ops.kv_codebook(2), [-0.18833385, -0.05643008, 0.05661844, 0.18874158], atol=1e-8)


def test_nearest_codeword_ties_go_lower():
    cb = np.array([-1.0, 0.0, 1.0], np.float32)
    np.testing.assert_array_equal(ops.nearest_codeword(np.array([-0.5, 0.5, 2.0, -3.0], np.float32), cb),
                                  [0, 1, 2, 0])


def test_kv_quantize_dispatch():
    x = randn(4, 16)
    np.testing.assert_array_equal(ops.kv_quantize(x, 8), ops.a8(x))
    np.testing.assert_array_equal(ops.kv_quantize(x, 3), ops.kv_quant_cq(x, 3))


# --------------------------------------------------------------------- norms
def test_norms():
    x = randn(3, 40)
    s = randn(40, scale=0.1)
    ref = x.astype(np.float64) / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(ops.rms_unit(x), ref, rtol=2e-6)
    np.testing.assert_allclose(ops.zc_rmsnorm(x, s), ref * (1 + s), rtol=2e-6, atol=1e-7)


# --------------------------------------------------------------------- RoPE
def test_rope_is_complex_rotation_and_relative():
    dh, theta = 16, 10000.0
    x = randn(5, 2, dh)
    pos = np.array([0, 1, 7, 100, 999])
    got = ops.rope(x, pos, theta)
    half = dh // 2
    f = 1.0 / theta ** (np.arange(half) * 2 / dh)
    z = x[..., :half] + 1j * x[..., half:]
    rot = z * np.exp(1j * pos[:, None, None] * f)
    np.testing.assert_allclose(got, np.concatenate([rot.real, rot.imag], -1), atol=1e-4)
    np.testing.assert_array_equal(got[0], x[0])       # position 0 is the identity
    # q·k depends on the offset only
    q, k = randn(dh), randn(dh)
    d1 = ops.rope(q[None], 5, theta) @ ops.rope(k[None], 2, theta).T
    d2 = ops.rope(q[None], 13, theta) @ ops.rope(k[None], 10, theta).T
    np.testing.assert_allclose(d1, d2, rtol=1e-4)


# --------------------------------------------------------------------- masks and conv
def test_context_visible_rules():
    # recent 4, sinks 2, no band
    vis = ops.attention_mask(np.arange(10), np.arange(10), recent=4, sinks=2)
    for t in range(10):
        for j in range(10):
            assert vis[t, j] == (j <= t and (t - j < 4 or j < 2))
    band = ops.attention_mask(np.arange(10), np.arange(10), recent=4, sinks=2, band=3)
    for t in range(10):
        for j in range(10):
            assert band[t, j] == (j <= t and t - j < 3)    # sinks never bypass the band
    plain = ops.attention_mask(np.arange(6), np.arange(6))
    np.testing.assert_array_equal(plain, np.tril(np.ones((6, 6), bool)))


@pytest.mark.parametrize("dilation", [1, 3])
def test_causal_conv_loop(dilation):
    T, C, n_taps = 12, 5, 4
    x, taps = randn(T, C), randn(n_taps, C)
    got = ops.causal_conv(x, taps, dilation)
    for t in range(T):
        want = np.zeros(C)
        for j in range(n_taps):
            if t - j * dilation >= 0:
                want += taps[j] * x[t - j * dilation]
        np.testing.assert_allclose(got[t], want, rtol=1e-5, atol=1e-6)
        hist = np.stack([x[t - j * dilation] if t - j * dilation >= 0 else np.zeros(C) for j in range(n_taps)])
        ok = [t - j * dilation >= 0 for j in range(n_taps)]
        np.testing.assert_allclose(ops.causal_conv_step(hist, taps, ok), got[t], rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------- attention
def test_gqa_attention_loop():
    Tq, H, K, dq, dv = 6, 4, 2, 8, 5
    q, k, v = randn(Tq, H, dq), randn(Tq, K, dq), randn(Tq, K, dv)
    mask = ops.attention_mask(np.arange(Tq), np.arange(Tq), band=3)
    got = ops.gqa_attention(q, k, v, mask)
    for t in range(Tq):
        for h in range(H):
            kv = h // (H // K)
            js = [j for j in range(Tq) if mask[t, j]]
            s = np.array([q[t, h] @ k[j, kv] / math.sqrt(dq) for j in js])
            p = np.exp(s - s.max())
            p /= p.sum()
            np.testing.assert_allclose(got[t, h], sum(pi * v[j, kv] for pi, j in zip(p, js)), rtol=1e-5, atol=1e-6)


def test_output_gate():
    o, g = randn(10), randn(10)
    np.testing.assert_allclose(ops.output_gate(o, g), o / (1 + np.exp(-g)), rtol=1e-6)


# --------------------------------------------------------------------- engram
def test_engram_hash_python_ints():
    tokens = [2, 1999, 5, 77, 4095, 0, 31]
    orders, heads, stride, slots = (2, 3), 3, 5, 1021
    got = ops.engram_hash(tokens, orders, heads, stride, slots)
    for t in range(len(tokens)):
        for oi, o in enumerate(orders):
            for h in range(heads):
                acc = (0x9E3779B9 * (oi * stride + h + 1)) % 2 ** 32
                for j in range(o):
                    tok = tokens[t - j] if t - j >= 0 else 0
                    acc = ((acc ^ tok) * 0x01000193) % 2 ** 32
                acc ^= acc >> 15
                assert got[t, oi * heads + h] == acc % slots
    # a seed stride of 0 means "heads per order"
    np.testing.assert_array_equal(ops.engram_hash(tokens, orders, heads, 0, slots),
                                  ops.engram_hash(tokens, orders, heads, heads, slots))


def test_engram_validity_and_rows():
    ok = ops.engram_ngram_ok(np.arange(4), (2, 3), 2)
    np.testing.assert_array_equal(ok, [[0, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1]])
    np.testing.assert_array_equal(ops.engram_row_ids(np.array([[3, 4, 5]]), 10), [[3, 14, 25]])
    rows = randn(2, 3, 4)
    e = ops.engram_fetch(rows, np.array([[1, 0, 1], [1, 1, 1]], np.float32))
    np.testing.assert_array_equal(e[0, 4:8], 0)
    np.testing.assert_array_equal(e[1], rows[1].reshape(-1))


def test_engram_inject():
    u, k, v = randn(3, 16), randn(3, 16), randn(3, 16)
    got = ops.engram_inject(u, k, v)
    for i in range(3):
        ru = u[i] / np.sqrt(np.mean(u[i].astype(np.float64) ** 2) + 1e-6)
        rk = k[i] / np.sqrt(np.mean(k[i].astype(np.float64) ** 2) + 1e-6)
        alpha = 1 / (1 + np.exp(-(ru @ rk) / 4.0))
        np.testing.assert_allclose(got[i], u[i] + alpha * v[i], rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------- mHC
def test_sinkhorn_doubly_stochastic_and_loop():
    z = randn(3, 4, 4, scale=2.0)
    p = ops.sinkhorn(z)
    np.testing.assert_allclose(p.sum(-2), 1.0, atol=1e-6)      # columns exact after the last step
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-3)
    m = z[0].astype(np.float64)
    for _ in range(20):
        m = m - np.log(np.exp(m).sum(1, keepdims=True))
        m = m - np.log(np.exp(m).sum(0, keepdims=True))
    np.testing.assert_allclose(p[0], np.exp(m), rtol=1e-4, atol=1e-6)


def test_mhc_gates_and_mixing():
    n, d = 4, 6
    lanes = randn(2, n, d)
    phi = randn(2, n)
    hpre = ops.mhc_pre_weights(phi, 0.5, np.zeros(n, np.float32), lane=1)
    want = 1 / (1 + np.exp(-(0.5 * phi + np.array([-4, 4, -4, -4]))))
    np.testing.assert_allclose(hpre, want, rtol=1e-5)
    hpost = ops.mhc_post_weights(phi, 0.5, np.zeros(n, np.float32), lane=2)
    np.testing.assert_allclose(hpost, 2 / (1 + np.exp(-(0.5 * phi + np.array([-4, -4, 0, -4])))), rtol=1e-5)
    u = ops.mhc_collapse(lanes, hpre)
    np.testing.assert_allclose(u[1], sum(hpre[1, m] * lanes[1, m] for m in range(n)), rtol=1e-5)
    P = ops.mhc_res_weights(randn(2, n * n), 0.3, randn(n, n))
    y = randn(2, d)
    new = ops.mhc_expand(lanes, P, hpost, y)
    for i in range(n):
        np.testing.assert_allclose(new[0, i], P[0, i] @ lanes[0] + hpost[0, i] * y[0], rtol=1e-5, atol=1e-6)
    nx = ops.mhc_router_input(lanes, quant=False)
    np.testing.assert_allclose(nx[0], ops.rms_unit(lanes[0].reshape(-1)), rtol=1e-6)
    assert len(np.unique(np.abs(ops.mhc_router_input(lanes, quant=True)[0]))) <= 128


# --------------------------------------------------------------------- Monarch MLP
def test_kron_apply_is_kronecker_product():
    a, b = randn(4, 4), randn(8, 8)
    z = randn(3, 32)
    np.testing.assert_allclose(ops.kron_apply(z, a, b), z @ np.kron(a, b), rtol=1e-5, atol=1e-5)


def test_monarch_mlp_written_out():
    d, n, R = 12, 16, 8
    ba, bb = ops.monarch_factor_sizes(n)
    assert (ba, bb) == (4, 4) and ops.monarch_factor_sizes(1024) == (32, 32) and ops.monarch_factor_sizes(128) == (8, 16)
    p = ops.MonarchParams(
        d1=randn(n), d2=randn(n), b2=randn(n), d3=randn(n), d4=randn(n),
        w1a=randn(ba, ba), w1b=randn(bb, bb), w2a=randn(ba, ba), w2b=randn(bb, bb),
        w3a=randn(ba, ba), w3b=randn(bb, bb), cond_v=randn(d, R), cond_u=randn(R, n, scale=0.1),
        p1=RNG.permutation(n), p2=RNG.permutation(n))
    m = randn(2, d)
    got = ops.monarch_mlp(m, p)
    for i in range(2):
        mm = m[i].astype(np.float64)
        logits = mm @ p.cond_v
        w = np.exp(logits - logits.max())
        c = 1 + (w / w.sum()) @ p.cond_u
        z = np.concatenate([mm, np.zeros(n - d)])
        z = ((p.d1 * z) @ np.kron(p.w1a, p.w1b))[p.p1]
        h = p.d2 * c * z + p.b2
        z = ((h / (1 + np.exp(-h))) @ np.kron(p.w2a, p.w2b))[p.p2]
        z = (p.d3 * z) @ np.kron(p.w3a, p.w3b)
        np.testing.assert_allclose(got[i], (p.d4 * z)[:d], rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------- probe heads
def _pool_loop(cells, probes, gain, query, row_bias, keep):
    T, R, d = cells.shape
    k = probes.shape[1]
    rho = np.zeros((R, k, d))
    for r in range(R):
        for j in range(k):
            s = np.array([cells[t, r] @ probes[r, j] / math.sqrt(d) if keep[t] else -np.inf for t in range(T)])
            pi = np.exp(s - s.max())
            pi /= pi.sum()
            v = (pi[:, None] * cells[:, r]).sum(0)
            rho[r, j] = v / np.sqrt(np.mean(v ** 2) + 1e-6) * gain[r, j]
    out = []
    for a in range(query.shape[0]):
        u = np.array([[rho[r, j] @ query[a] / math.sqrt(d) + row_bias[a, r, j] for j in range(k)] for r in range(R)])
        w = np.exp(u.reshape(-1) - u.max())
        w /= w.sum()
        out.append(w @ rho.reshape(R * k, d))
    return np.concatenate(out)


def test_probe_pool_batch_online_and_loop():
    T, R, k, q, d = 9, 3, 2, 2, 8
    cells, probes = randn(T, R, d), randn(R, k, d)
    gain, query, row_bias = randn(R, k), randn(q, d), randn(q, R, k, scale=0.1)
    keep = np.ones(T, bool)
    keep[[2, 5]] = False
    z = ops.probe_pool(cells, probes, gain, query, row_bias, keep)
    np.testing.assert_allclose(z, _pool_loop(cells, probes, gain, query, row_bias, keep), rtol=1e-4, atol=1e-5)
    st = ops.ProbePoolState.empty(R, k, d)
    assert st.count_empty
    for t in range(T):
        ops.probe_pool_update(st, cells[t], probes, keep=bool(keep[t]))
    z_online = ops.probe_pool_rows(ops.probe_pool_tokens_online(st), gain, query, row_bias)
    np.testing.assert_allclose(z_online, z, rtol=1e-5, atol=1e-6)


def test_head_post_processing():
    p = randn(16)
    e = ops.embedding_head_post(p)
    np.testing.assert_allclose(np.linalg.norm(e), 1.0, rtol=1e-6)
    np.testing.assert_allclose(e, p / np.linalg.norm(p), rtol=1e-5)
    assert ops.confidence_head_post(np.array([0.25], np.float32)) == 0.25
    np.testing.assert_array_equal(ops.router_head_post(np.array([1, 2, 3], np.float32)), [1, 2, 3])
    proj, bias, z = randn(3, 8), randn(3), randn(8)
    np.testing.assert_allclose(ops.probe_head_output(z, proj, bias), proj @ z + bias, rtol=1e-5)
