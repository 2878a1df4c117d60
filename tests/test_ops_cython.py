"""needle_cy._ops (Cython) against its NumPy twin needle_cy.reference.ops, operator by operator.

Every function of the reference is called with the same random inputs on both
sides; results must agree to 1e-5 relative to the output's scale (quantizers
exactly, except for documented float-rounding boundary cases).
"""
import numpy as np
import pytest

ref = pytest.importorskip("needle_cy.reference.ops")
cy = pytest.importorskip("needle_cy._ops")

RTOL = 1e-5


def close(got, want, rtol=RTOL):
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    scale = max(float(np.max(np.abs(want))) if want.size else 0.0, 1e-30)
    err = float(np.max(np.abs(got - want))) if want.size else 0.0
    assert err <= rtol * scale, f"max |Δ| = {err:.3g} > {rtol} × {scale:.3g}"


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def test_every_reference_operator_has_a_cython_twin():
    public = [n for n in dir(ref) if not n.startswith("_") and callable(getattr(ref, n))
              and getattr(getattr(ref, n), "__module__", "") == ref.__name__]
    missing = [n for n in public if not hasattr(cy, n) and n != "MonarchParams"]
    assert not missing, f"operators without a Cython twin: {missing}"


def test_elementwise(rng):
    x = rng.normal(size=(7, 33)).astype(np.float32) * 4
    close(cy.sigmoid(x), ref.sigmoid(x))
    close(cy.silu(x), ref.silu(x))
    close(cy.softmax(x), ref.softmax(x))
    close(cy.softmax(x, axis=0), ref.softmax(x, axis=0))
    m = x.copy()
    m[:, :5] = -np.inf
    close(cy.softmax(m), ref.softmax(m))
    close(cy.logsumexp(x, axis=-1), ref.logsumexp(x, axis=-1))


@pytest.mark.parametrize("bits", [8, 4])
def test_a8_exact(rng, bits):
    x = rng.normal(size=(50, 96)).astype(np.float32) * rng.uniform(0.01, 30, size=(50, 1)).astype(np.float32)
    x[3] = 0.0                                   # all-zero vector: scale 1
    x[4, 7] = 1e6                                # one outlier
    got, want = cy.a8(x, bits), ref.a8(x, bits)
    np.testing.assert_array_equal(got, want)
    assert np.all(got[3] == 0)
    # the quantized values sit on an integer grid of 2^(bits-1)-1 steps per max
    s = np.max(np.abs(x[0])) / (2 ** (bits - 1) - 1)
    assert np.allclose(got[0] / s, np.rint(got[0] / s), atol=1e-3)


def test_a8_ties_signs_and_tails(rng):
    """The vector loop and its scalar tail (widths not a multiple of 8): ties round to
    even, -0 stays -0, the clip at -qmax-1 and qmax, the same bits as the reference."""
    for n in (1, 7, 8, 13, 101):
        x = np.zeros((4, n), np.float32)
        x[0, 0] = 127.0                               # scale 1: the ties below are exact
        x[0, 1:] = (rng.integers(-126, 126, size=n - 1) + 0.5).astype(np.float32)
        x[1] = -0.0
        x[1, 0] = -1.0
        x[2] = rng.normal(size=n).astype(np.float32) * 1e-3
        x[3] = rng.normal(size=n).astype(np.float32) * 1e4
        got, want = cy.a8(x, 8), ref.a8(x, 8)
        np.testing.assert_array_equal(got, want)
        assert np.array_equal(np.signbit(got[1]), np.signbit(x[1]))
        assert np.all(got[0, 1:] == np.rint(x[0, 1:]))   # half to even


def test_fp16_rounding_matches_numpy(rng):
    x = np.concatenate([rng.normal(size=2000) * 10.0 ** rng.integers(-9, 5, size=2000),
                        [0.0, 65504.0, 65519.0, 65520.0, 1e-8, 6.1e-5, 5.96e-8, 2.9e-8]]).astype(np.float32)
    x = np.abs(x)
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(cy.fp16_round_array(x), want)


def test_small_helpers(rng):
    np.testing.assert_array_equal(cy.hadamard(64), ref.hadamard(64))
    for b in (2, 3, 4):
        np.testing.assert_array_equal(cy.kv_codebook(b), ref.kv_codebook(b))
        cb = ref.kv_codebook(b)
        u = np.concatenate([rng.normal(size=500).astype(np.float32) * 0.2,
                            ((cb[1:] + cb[:-1]) / 2).astype(np.float32), cb]).astype(np.float32)
        np.testing.assert_array_equal(cy.nearest_codeword(u, cb), ref.nearest_codeword(u, cb))
    assert cy.monarch_factor_sizes(1024) == ref.monarch_factor_sizes(1024)
    assert cy.monarch_factor_sizes(128) == ref.monarch_factor_sizes(128)
    for lane in range(4):
        for a, b in zip(cy.mhc_offsets(4, lane), ref.mhc_offsets(4, lane)):
            np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(cy.rope_frequencies(48, 1e5), ref.rope_frequencies(48, 1e5))


@pytest.mark.parametrize("bits", [2, 3, 4])
@pytest.mark.parametrize("dh", [48, 64, 96])
def test_kv_quant_cq(rng, bits, dh):
    x = rng.normal(size=(40, 3, dh)).astype(np.float32) * 2
    got, want = cy.kv_quant_cq(x, bits), ref.kv_quant_cq(x, bits)
    # the rotation runs as butterflies here and as a matmul there: the last bit of
    # a rotated value can differ, which may move an element across a codeword
    # boundary; demand agreement on all but a tiny fraction of vectors
    per_vec = np.max(np.abs(got - want), axis=-1) <= 1e-5 * np.max(np.abs(want), axis=-1)
    assert per_vec.mean() >= 0.99
    close(cy.kv_quantize(x, bits)[per_vec], ref.kv_quantize(x, bits)[per_vec])
    np.testing.assert_array_equal(cy.kv_quant_int8(x), ref.kv_quant_int8(x))
    np.testing.assert_array_equal(cy.kv_quantize(x, 8), ref.kv_quantize(x, 8))


def test_norms(rng):
    for d in (64, 96, 768, 3072):
        x = rng.normal(size=(5, d)).astype(np.float32) * 3
        s = rng.normal(size=d).astype(np.float32) * 0.1
        close(cy.rms_unit(x), ref.rms_unit(x))
        close(cy.zc_rmsnorm(x, s), ref.zc_rmsnorm(x, s))
    with pytest.raises(ValueError):
        cy.zc_rmsnorm(np.ones((2, 8), np.float32), np.ones(7, np.float32))


def test_embedding_output_helpers(rng):
    rows = rng.normal(size=(4, 6, 64)).astype(np.float32)
    close(cy.embed_scale(rows, 64), ref.embed_scale(rows, 64))
    w = rng.normal(size=(30, 64)).astype(np.float32)
    close(cy.linear(rows, w), ref.linear(rows, w))
    close(cy.tied_logits(rows[0], w), ref.tied_logits(rows[0], w))
    lanes = rng.normal(size=(5, 4, 64)).astype(np.float32)
    close(cy.lane_mean(lanes), ref.lane_mean(lanes))
    close(cy.lane_mean(lanes[0]), ref.lane_mean(lanes[0]))


def test_masks():
    for kw in ({}, {"recent": 5}, {"recent": 5, "sinks": 2}, {"band": 3}, {"recent": 6, "sinks": 3, "band": 4}):
        np.testing.assert_array_equal(cy.attention_mask(np.arange(12), np.arange(12), **kw),
                                      ref.attention_mask(np.arange(12), np.arange(12), **kw))
        np.testing.assert_array_equal(cy.conv_tap_ok(np.arange(12), 4, 3, **kw),
                                      ref.conv_tap_ok(np.arange(12), 4, 3, **kw))
        np.testing.assert_array_equal(cy.engram_ngram_ok(np.arange(12), (2, 3), 2, kw.get("recent"), kw.get("sinks", 0)),
                                      ref.engram_ngram_ok(np.arange(12), (2, 3), 2, kw.get("recent"), kw.get("sinks", 0)))


def test_causal_conv(rng):
    x = rng.normal(size=(20, 24)).astype(np.float32)
    taps = rng.normal(size=(4, 24)).astype(np.float32)
    for dil in (1, 3):
        close(cy.causal_conv(x, taps, dil), ref.causal_conv(x, taps, dil))
        ok = ref.conv_tap_ok(np.arange(20), 4, dil, recent=7, sinks=1)
        close(cy.causal_conv(x, taps, dil, ok), ref.causal_conv(x, taps, dil, ok))
    hist = rng.normal(size=(3, 24)).astype(np.float32)
    close(cy.causal_conv_step(hist, taps[:3]), ref.causal_conv_step(hist, taps[:3]))
    okv = np.array([True, False, True])
    close(cy.causal_conv_step(hist, taps[:3], okv), ref.causal_conv_step(hist, taps[:3], okv))


def test_rope(rng):
    x = rng.normal(size=(9, 3, 48)).astype(np.float32)
    pos = np.array([0, 1, 2, 5, 100, 1000, 2047, 4095, 3], np.int64)
    close(cy.rope(x, pos, 100000.0), ref.rope(x, pos, 100000.0))
    close(cy.rope(x[0], 17, 10000.0), ref.rope(x[0], 17, 10000.0))
    cos_t, sin_t = cy.rope_tables(4096, 48, 100000.0)
    freqs = ref.rope_frequencies(48, 100000.0)
    ang = (np.float32(4095) * freqs).astype(np.float32)
    np.testing.assert_array_equal(cos_t[4095], np.cos(ang))
    np.testing.assert_array_equal(sin_t[4095], np.sin(ang))


@pytest.mark.parametrize("bits", [8, 4])
def test_a8_codes_exact(rng, bits):
    x = rng.normal(size=(20, 48)).astype(np.float32) * rng.uniform(0.01, 30, size=(20, 1)).astype(np.float32)
    x[3] = 0.0
    codes, scales = cy.a8_codes(x, bits)
    want_codes, want_scales = ref.a8_codes(x, bits)
    assert codes.dtype == np.int8 and scales.shape == (20,)
    np.testing.assert_array_equal(codes, want_codes)
    np.testing.assert_array_equal(scales, want_scales)
    # the integer form is the fake-quant bit for bit: what the int8 KV cache relies on
    np.testing.assert_array_equal(codes * scales[:, None], cy.a8(x, bits))
    with pytest.raises(ValueError):
        cy.a8_codes(x, 9)


@pytest.mark.parametrize("n", [1, 7, 8, 13, 64, 100])
def test_a8_codes_vector_loop_and_tail_round_ties_to_even(rng, n):
    """a8_codes runs eight values at a time, then a scalar tail: every length gives the
    reference's codes, ties (k + 0.5 steps) round to even, the clip holds at both ends."""
    x = rng.normal(size=(6, n)).astype(np.float32) * 5
    x[0, 0] = 127.0                                          # scale 1: the steps are exact
    x[0, 1:] = (np.arange(1, n) % 9 - 4.5).astype(np.float32)   # ties: -4.5 .. 3.5
    x[1] = -x[1]
    codes, scales = cy.a8_codes(x)
    want_codes, want_scales = ref.a8_codes(x)
    np.testing.assert_array_equal(codes, want_codes)
    np.testing.assert_array_equal(scales, want_scales)
    if n > 1:
        assert codes[0, 0] == 127 and codes[0, 1] == -4     # -3.5 rounds to -4
    np.testing.assert_array_equal(codes * scales[:, None], cy.a8(x))


# (6, 3, 48, 64) and (12, 2, 48, 64): the vector paths (dv a multiple of 16, G ≤ 6 / > 6 heads
# per block); (4, 2, 18, 24), (2, 1, 7, 12): key widths that leave a partial quad, scalar P·V;
# (7, 1, 160, 72): AVX2's blocks of fewer heads for heads over 128 dimensions (4, then 3),
# an odd count of 8-wide value vectors; (2, 1, 784, 16): heads too wide for its held query
# quads, the portable loop
@pytest.mark.parametrize("H,K,dq,dv", [(4, 2, 18, 24), (2, 1, 7, 12), (6, 3, 48, 64), (12, 2, 48, 64),
                                       (18, 1, 16, 32), (7, 1, 160, 72), (2, 1, 784, 16)])
def test_gqa_attention_int8(rng, H, K, dq, dv):
    T = 41                                     # > 16 keys: full and masked slot blocks
    qc, qs = ref.a8_codes(rng.normal(size=(T, H, dq)).astype(np.float32))
    kc, ks = ref.a8_codes(rng.normal(size=(T, K, dq)).astype(np.float32) * 3)
    vc, vs = ref.a8_codes(rng.normal(size=(T, K, dv)).astype(np.float32))
    kc[5, 0, :] = -128                         # the extreme codes survive the offset encoding
    kc[6, 0, :] = 127
    for kw in ({}, {"band": 5}, {"recent": 8, "sinks": 3}, {"recent": 20, "sinks": 2, "band": 17}):
        mask = ref.attention_mask(np.arange(T), np.arange(T), **kw)
        close(cy.gqa_attention_int8(qc, qs, kc, ks, vc, vs, mask),
              ref.gqa_attention_int8(qc, qs, kc, ks, vc, vs, mask))
    with pytest.raises(ValueError):
        cy.gqa_attention_int8(qc, qs, kc, ks[:, :1] if K > 1 else ks[:-1], vc, vs, mask)


def test_i8_attention_kernel_reported():
    import platform
    name = cy.i8_attention_kernel()
    assert name in ("avx512vnni", "avx2", "neon_dotprod", "portable")
    if platform.machine() not in ("aarch64", "arm64"):
        assert name != "neon_dotprod"
        assert cy._set_i8_dot(True) is False and cy.i8_attention_kernel() == name   # no such kernel here


@pytest.mark.parametrize("H,K,dq,dv", [(4, 2, 18, 24), (6, 3, 48, 64), (12, 2, 48, 64)])
def test_gqa_attention_int8_dot_kernel_is_the_portable_one_bitwise(rng, H, K, dq, dv):
    """aarch64 with the dot product extension: the sdot scores kernel (16 slots at a time)
    and the portable loop give the same bits (both are the exact int32 sum)."""
    was = cy._set_i8_dot(True)
    try:
        if cy.i8_attention_kernel() != "neon_dotprod":
            pytest.skip(f"CPU lacks aarch64 NEON + the dot product extension (asimddp): "
                        f"the attention scores run on {cy.i8_attention_kernel()}")
        T = 45                                 # two full blocks of 16 slots and a tail
        qc, qs = ref.a8_codes(rng.normal(size=(T, H, dq)).astype(np.float32))
        kc, ks = ref.a8_codes(rng.normal(size=(T, K, dq)).astype(np.float32) * 3)
        vc, vs = ref.a8_codes(rng.normal(size=(T, K, dv)).astype(np.float32))
        kc[5, 0, :] = -128
        kc[6, 0, :] = 127
        mask = ref.attention_mask(np.arange(T), np.arange(T), recent=20, sinks=2)
        dot = cy.gqa_attention_int8(qc, qs, kc, ks, vc, vs, mask)
        cy._set_i8_dot(False)
        assert cy.i8_attention_kernel() == "portable"
        np.testing.assert_array_equal(dot, cy.gqa_attention_int8(qc, qs, kc, ks, vc, vs, mask))
    finally:
        cy._set_i8_dot(was)


@pytest.mark.parametrize("H,K,dq,dv", [(4, 2, 16, 24), (6, 3, 48, 64), (12, 2, 48, 64)])
def test_gqa_attention(rng, H, K, dq, dv):
    T = 23
    q = rng.normal(size=(T, H, dq)).astype(np.float32)
    k = rng.normal(size=(T, K, dq)).astype(np.float32)
    v = rng.normal(size=(T, K, dv)).astype(np.float32)
    for kw in ({}, {"band": 5}, {"recent": 8, "sinks": 3}, {"recent": 9, "sinks": 2, "band": 4}):
        mask = ref.attention_mask(np.arange(T), np.arange(T), **kw)
        close(cy.gqa_attention(q, k, v, mask), ref.gqa_attention(q, k, v, mask))
    close(cy.split_heads(q.reshape(T, -1), H), ref.split_heads(q.reshape(T, -1), H))
    o = rng.normal(size=(T, H * dv)).astype(np.float32)
    g = rng.normal(size=(T, H * dv)).astype(np.float32)
    close(cy.output_gate(o, g), ref.output_gate(o, g))


def test_engram(rng):
    tokens = rng.integers(0, 70000, size=40)
    for orders, heads, stride, slots in (((2, 3), 3, 0, 18432), ((2,), 1, 5, 64), ((2, 3, 4), 2, 0, 1000)):
        got = cy.engram_hash(tokens, orders, heads, stride, slots)
        want = ref.engram_hash(tokens, orders, heads, stride, slots)
        np.testing.assert_array_equal(got, want)
        assert got.min() >= 0 and got.max() < slots
        np.testing.assert_array_equal(cy.engram_row_ids(got, slots), ref.engram_row_ids(got, slots))
    rows = rng.normal(size=(7, 6, 16)).astype(np.float32)
    ok = (rng.random((7, 6)) > 0.3).astype(np.float32)
    close(cy.engram_fetch(rows, ok), ref.engram_fetch(rows, ok))
    u, key, value = (rng.normal(size=(7, 96)).astype(np.float32) for _ in range(3))
    close(cy.engram_inject(u, key, value), ref.engram_inject(u, key, value))


def test_mhc(rng):
    n, d = 4, 64
    lanes = rng.normal(size=(6, n, d)).astype(np.float32)
    for quant in (True, False):
        close(cy.mhc_router_input(lanes, quant), ref.mhc_router_input(lanes, quant))
    phi = rng.normal(size=(6, n)).astype(np.float32)
    b = rng.normal(size=n).astype(np.float32)
    close(cy.mhc_pre_weights(phi, 0.7, b, 2), ref.mhc_pre_weights(phi, 0.7, b, 2))
    close(cy.mhc_post_weights(phi, 0.7, b, 1), ref.mhc_post_weights(phi, 0.7, b, 1))
    z = rng.normal(size=(6, n, n)).astype(np.float32) * 3
    close(cy.sinkhorn(z), ref.sinkhorn(z))
    P = cy.sinkhorn(z)
    np.testing.assert_allclose(P.sum(axis=-2), 1.0, atol=1e-5)      # columns exactly normalised
    z_wide = rng.normal(size=(6, n, n)).astype(np.float32) * 40     # span >= 60: log-domain path
    close(cy.sinkhorn(z_wide), ref.sinkhorn(z_wide))
    phr = rng.normal(size=(6, n * n)).astype(np.float32)
    bb = rng.normal(size=(n, n)).astype(np.float32)
    close(cy.mhc_res_weights(phr, 0.3, bb), ref.mhc_res_weights(phr, 0.3, bb))
    close(cy.mhc_collapse(lanes, phi), ref.mhc_collapse(lanes, phi))
    y = rng.normal(size=(6, d)).astype(np.float32)
    close(cy.mhc_expand(lanes, P, phi, y), ref.mhc_expand(lanes, P, phi, y))


@pytest.mark.parametrize("n", [3, 4, 5])
def test_sinkhorn_vector_loop_is_the_scalar_loop_bit_for_bit(rng, n):
    """At n = 4 (the mHC router of 4 lanes) the iterations run in vector registers
    (nc_sinkhorn4): the same operations element by element as the scalar loop, so the
    same bits at every iteration count, spread, and the log-domain path beyond it."""
    for scale in (0.05, 1.0, 6.0, 14.0, 40.0):
        z = (rng.normal(size=(500, n, n)) * scale).astype(np.float32)
        for iters in (0, 1, 2, 20):
            fast = cy.sinkhorn(z, iters)
            slow = cy._sinkhorn_scalar(z, iters)
            np.testing.assert_array_equal(fast.view(np.uint32), slow.view(np.uint32))
    np.testing.assert_allclose(cy.sinkhorn(z, 20).sum(axis=-2), 1.0, atol=1e-5)


def _monarch_params(rng, d, N):
    ba, bb = ref.monarch_factor_sizes(N)
    R = 8
    g = lambda *s: (rng.normal(size=s) * 0.3).astype(np.float32)
    return ref.MonarchParams(d1=g(N), d2=g(N), b2=g(N), d3=g(N), d4=g(N),
                             w1a=g(ba, ba), w1b=g(bb, bb), w2a=g(ba, ba), w2b=g(bb, bb),
                             w3a=g(ba, ba), w3b=g(bb, bb), cond_v=g(d, R), cond_u=g(R, N),
                             p1=rng.permutation(N), p2=rng.permutation(N))


@pytest.mark.parametrize("d,N", [(64, 64), (96, 128), (768, 1024)])
def test_monarch(rng, d, N):
    p = _monarch_params(rng, d, N)
    ba, bb = ref.monarch_factor_sizes(N)
    z = rng.normal(size=(3, N)).astype(np.float32)
    close(cy.kron_apply(z, p.w1a, p.w1b), ref.kron_apply(z, p.w1a, p.w1b))
    m = rng.normal(size=(5, d)).astype(np.float32)
    close(cy.monarch_condition(m, p.cond_v, p.cond_u), ref.monarch_condition(m, p.cond_v, p.cond_u))
    close(cy.monarch_mlp(m, p), ref.monarch_mlp(m, p))
    close(cy.monarch_mlp(m[0], p), ref.monarch_mlp(m[0], p))


def test_probe_pooling(rng):
    T, R, k, d, q = 13, 3, 4, 64, 2
    cells = rng.normal(size=(T, R, d)).astype(np.float32)
    probes = rng.normal(size=(R, k, d)).astype(np.float32)
    gain = rng.normal(size=(R, k)).astype(np.float32)
    query = rng.normal(size=(q, d)).astype(np.float32)
    row_bias = rng.normal(size=(q, R, k)).astype(np.float32)
    keep = np.ones(T, bool)
    keep[[0, 5]] = False
    close(cy.probe_scores(cells, probes), ref.probe_scores(cells, probes))
    close(cy.probe_pool_tokens(cells, probes, keep), ref.probe_pool_tokens(cells, probes, keep))
    # the online accumulators equal the whole-sequence softmax pooling
    st_c = cy.ProbePoolState.empty(R, k, d)
    st_r = ref.ProbePoolState.empty(R, k, d)
    assert st_c.count_empty and st_r.count_empty
    for t in range(T):
        cy.probe_pool_update(st_c, cells[t], probes, keep[t])
        ref.probe_pool_update(st_r, cells[t], probes, keep[t])
    close(cy.probe_pool_tokens_online(st_c), ref.probe_pool_tokens_online(st_r))
    close(cy.probe_pool_tokens_online(st_c), ref.probe_pool_tokens(cells, probes, keep))
    tp = ref.probe_pool_tokens(cells, probes, keep)
    close(cy.probe_pool_rows(tp, gain, query, row_bias), ref.probe_pool_rows(tp, gain, query, row_bias))
    close(cy.probe_pool(cells, probes, gain, query, row_bias, keep),
          ref.probe_pool(cells, probes, gain, query, row_bias, keep))
    z = ref.probe_pool(cells, probes, gain, query, row_bias)
    proj = rng.normal(size=(5, q * d)).astype(np.float32)
    bias = rng.normal(size=5).astype(np.float32)
    out = ref.probe_head_output(z, proj, bias)
    close(cy.probe_head_output(z, proj, bias), out)
    close(cy.embedding_head_post(out), ref.embedding_head_post(out))
    assert cy.confidence_head_post(out) == ref.confidence_head_post(out)
    close(cy.router_head_post(out[:3]), ref.router_head_post(out[:3]))
    assert set(cy.HEAD_POST) == set(ref.HEAD_POST)


def test_wrappers_reject_bad_shapes():
    with pytest.raises(ValueError):
        cy.gqa_attention(np.zeros((2, 3, 4), np.float32), np.zeros((2, 2, 4), np.float32),
                         np.zeros((2, 2, 4), np.float32), np.ones((2, 2), bool))
    with pytest.raises(ValueError):
        cy.kron_apply(np.zeros(10, np.float32), np.zeros((2, 2), np.float32), np.zeros((2, 2), np.float32))
    with pytest.raises(ValueError):
        cy.causal_conv(np.zeros((4, 3), np.float32), np.zeros((2, 5), np.float32))
