"""The CQ format's NumPy reference (needle_cy.reference.cq) against spec §3.

Oracles: the values printed in the spec (§2.3 codebooks, §3.1 Hadamard entries,
§3.2 binary/ternary constants, §3.9 group-64 codebook), the §3.2 Lloyd–Max
generation recipe re-run here, brute-force formulas (argmin, explicit bit
streams, dense products) that share no code with the module under test.
"""
import math

import numpy as np
import pytest

from needle_cy.archive import CQMatrix
from needle_cy.reference import cq

SPEC_CB128 = {  # spec §2.3, float32, ascending
    2: [-0.13317214, -0.03990209, 0.04003528, 0.13346045],
    3: [-0.18926136, -0.11788499, -0.06614969, -0.02101346, 0.02210103, 0.06678507, 0.11826207, 0.18982603],
    4: [-0.23953155, -0.18070605, -0.14095794, -0.10901255, -0.08151297, -0.05652765, -0.03293915,
        -0.01011611, 0.01271080, 0.03570792, 0.05945826, 0.08497702, 0.11274162, 0.14469692,
        0.18423900, 0.24227370],
}
WIDTHS = (1, 2, 3, 4, 5)


def test_codebooks_match_spec_tables():
    for bits, values in SPEC_CB128.items():
        np.testing.assert_allclose(cq.codebook(bits, 128), values, rtol=0, atol=6e-9)
        assert cq.codebook(bits, 128).dtype == np.float32
    # §3.9 example: group 64, 2 bits
    np.testing.assert_allclose(cq.codebook(2, 64), [-0.18833385, -0.05643008, 0.05661844, 0.18874158], atol=6e-9)
    # §3.2: binary ±sqrt(2/π)/sqrt(g), ternary ±1.2240064/sqrt(g) in the raw-field layout [0, +c, 0, −c]
    np.testing.assert_allclose(cq.codebook(1, 128), [-0.0705237, 0.0705237], atol=1e-7)
    np.testing.assert_allclose(cq.codebook(5, 128), [0.0, 0.1081879, 0.0, -0.1081879], atol=1e-7)


def test_codebook_is_float64_level_rounded_once():
    for bits in (2, 3, 4):
        for g in (32, 64, 128, 256):
            expect = np.float32(np.array(cq.LLOYD_MAX_LEVELS[bits]) / np.sqrt(np.float64(g)))
            assert np.array_equal(cq.codebook(bits, g), expect)


def test_lloyd_max_levels_follow_the_generation_recipe():
    # §3.2 recipe: 400000 legacy RandomState(0).randn samples, sorted; centroids
    # start at sample quantiles (k+0.5)/2^b; 200 Lloyd iterations.  Samples are
    # sorted, so each cluster is a contiguous run found by bisection.
    samples = np.sort(np.random.RandomState(0).randn(400000))
    prefix = np.concatenate([[0.0], np.cumsum(samples)])
    for bits in (2, 3, 4):
        k = 1 << bits
        centroids = samples[np.floor((np.arange(k) + 0.5) / k * 400000).astype(int)]
        for _ in range(200):
            boundaries = (centroids[:-1] + centroids[1:]) / 2
            # left-bisection assignment: a sample equal to a boundary goes to the lower cluster
            cuts = np.concatenate([[0], np.searchsorted(samples, boundaries, side="right"), [400000]])
            counts = np.diff(cuts)
            sums = prefix[cuts[1:]] - prefix[cuts[:-1]]
            centroids = np.where(counts > 0, sums / np.maximum(counts, 1), centroids)
        np.testing.assert_allclose(np.sort(centroids), cq.LLOYD_MAX_LEVELS[bits], rtol=0, atol=1e-9)


def test_hadamard_matrix():
    for g in (8, 64, 128, 256):
        H = cq.hadamard_matrix(g)
        assert H.dtype == np.float32 and H.shape == (g, g)
        scale = np.float32(1 / math.sqrt(g))
        for i, j in [(0, 0), (1, 1), (3, 5), (g - 1, g - 1), (g // 2, g - 3)]:
            sign = -1 if bin(i & j).count("1") % 2 else 1
            assert H[i, j] == sign * scale
        assert np.array_equal(H, H.T)
        np.testing.assert_allclose(H.astype(np.float64) @ H, np.eye(g), atol=1e-6)
    assert cq.hadamard_matrix(128)[0, 0] == np.float32(0.088388346)
    assert cq.hadamard_matrix(64)[0, 0] == np.float32(0.125)


def test_fwht_equals_hadamard_product():
    rng = np.random.default_rng(0)
    for n in (1, 2, 8, 64, 128, 512):
        x = rng.standard_normal((3, 5, n)).astype(np.float32)
        y = cq.fwht(x)
        assert y.dtype == np.float32 and y.shape == x.shape
        np.testing.assert_allclose(y, x.astype(np.float64) @ cq.hadamard_matrix(n).astype(np.float64), atol=2e-6)
        np.testing.assert_allclose(cq.fwht(y), x, atol=2e-6)  # its own inverse
    with pytest.raises(ValueError):
        cq.fwht(np.ones(12))


def _bitstream_fields(packed, fb):
    """Independent decoder: the row as one LSB-first bit stream."""
    bits = np.unpackbits(packed, axis=1, bitorder="little")
    n = bits.shape[1] // fb
    return (bits[:, : n * fb].reshape(len(packed), n, fb) * (1 << np.arange(fb))).sum(axis=2)


@pytest.mark.parametrize("bits", WIDTHS)
def test_pack_unpack_against_bit_stream(bits):
    fb = cq.field_bits_of(bits)
    rng = np.random.default_rng(bits)
    fields = rng.integers(0, 1 << fb, size=(6, 256)).astype(np.uint8)
    packed = cq.pack_indices(fields, bits)
    assert packed.shape == (6, 256 * fb // 8) and packed.dtype == np.uint8
    assert np.array_equal(_bitstream_fields(packed, fb), fields)
    assert np.array_equal(cq.unpack_indices(packed, bits), fields)
    assert np.array_equal(cq.unpack_indices(packed, bits, 100), fields[:, :100])


def test_packing_examples_from_spec():
    # b = 4: low nibble = even column
    assert cq.pack_indices(np.array([[0x1, 0xF] + [0] * 6]), 4)[0, 0] == 0xF1
    # b = 2: index 4m in bits 0–1 of byte m
    assert cq.pack_indices(np.array([[1, 2, 3, 0, 3, 0, 0, 0]]), 2).tolist() == [[0b00111001, 0b00000011]]
    # b = 1: index k is bit k
    assert cq.pack_indices(np.array([[1, 0, 0, 0, 0, 0, 0, 1]]), 1).tolist() == [[0b10000001]]
    # ternary: sorted index 0 (−c) → code 3, 1 (0) → code 0, 2 (+c) → code 1
    assert cq.trits_to_fields([0, 1, 2]).tolist() == [3, 0, 1]
    cb = cq.codebook(5, 128)
    c = cq.sorted_levels(5, 128)[2]
    assert cb[3] == -c and cb[0] == 0 and cb[1] == c and cb[2] == 0


def test_pack_rejects_out_of_range_fields():
    with pytest.raises(ValueError):
        cq.pack_indices(np.full((1, 8), 4), 2)
    with pytest.raises(ValueError):
        cq.pack_indices(np.zeros((1, 12)), 4)


@pytest.mark.parametrize("bits", WIDTHS)
def test_nearest_index_ties_to_lower(bits):
    levels = cq.sorted_levels(bits, 128)
    mids = (levels[:-1] + levels[1:]) / 2
    x = np.concatenate([levels, mids, np.nextafter(mids, 1), np.nextafter(mids, -1),
                        [-1, 1, 0, levels[0] - 1e-3, levels[-1] + 1e-3],
                        np.random.default_rng(0).uniform(-0.4, 0.4, 2000)]).astype(np.float32)
    dist = np.abs(x[:, None] - levels[None, :])
    expect = np.argmin(dist, axis=1)  # argmin returns the first (lower) index on a tie
    assert np.array_equal(cq.nearest_index(x, levels), expect)


def _direct_quantize(W, bits, g):
    """§3.3 literally, group by group (float32), brute-force nearest codeword."""
    rows, cols = W.shape
    ng = -(-cols // g)
    Wp = np.zeros((rows, ng * g), np.float32)
    Wp[:, :cols] = W
    H = cq.hadamard_matrix(g)
    levels = cq.sorted_levels(bits, g)
    idx = np.zeros((rows, ng * g), np.int64)
    norms = np.zeros((rows, ng), np.float16)
    for r in range(rows):
        for k in range(ng):
            rot = Wp[r, k * g:(k + 1) * g] @ H
            nu = np.float32(np.sqrt(np.sum(rot * rot, dtype=np.float32)))
            u = rot / max(nu, np.float32(1e-12))
            idx[r, k * g:(k + 1) * g] = np.argmin(np.abs(u[:, None] - levels[None, :]), axis=1)
            norms[r, k] = np.float16(nu)
    return idx, norms


@pytest.mark.parametrize("bits", WIDTHS)
@pytest.mark.parametrize("g,cols", [(32, 70), (64, 64), (128, 200), (256, 100)])
def test_quantize_matches_direct_algorithm(bits, g, cols):
    rng = np.random.default_rng(bits * 1000 + g)
    W = rng.standard_normal((9, cols)).astype(np.float32) * 0.05
    Q = cq.quantize(W, bits, g)
    assert isinstance(Q, CQMatrix)
    assert (Q.rows, Q.cols, Q.bits, Q.group_size) == (9, cols, bits, g)
    assert Q.packed.shape == (9, Q.row_bytes) and Q.norms.shape == (9, -(-cols // g))
    idx, norms = _direct_quantize(W, bits, g)
    fields = cq.trits_to_fields(idx) if bits == 5 else idx
    assert np.array_equal(_bitstream_fields(Q.packed, Q.field_bits), fields)
    assert np.array_equal(Q.norms.view(np.uint16), norms.view(np.uint16))


def _direct_dequantize(Q):
    """§3.5 with a float64 dense Hadamard: unpack → codebook → × norm → · H."""
    fields = _bitstream_fields(Q.packed, Q.field_bits)
    u = Q.codebook[fields].astype(np.float64).reshape(Q.rows, Q.n_groups, Q.group_size)
    w = (Q.norms.astype(np.float64)[:, :, None] * u) @ cq.hadamard_matrix(Q.group_size).astype(np.float64)
    return w.reshape(Q.rows, -1)[:, : Q.cols]


@pytest.mark.parametrize("bits", WIDTHS)
@pytest.mark.parametrize("g", [32, 64, 128, 256])
def test_dequantize_and_products(bits, g):
    rng = np.random.default_rng(7 * bits + g)
    cols = g * 2 + 24  # a ragged last group
    W = rng.standard_normal((33, cols)).astype(np.float32) / np.sqrt(cols)
    Q = cq.quantize(W, bits, g)
    D = cq.dequantize(Q)
    assert D.dtype == np.float32 and D.shape == W.shape
    np.testing.assert_allclose(D, _direct_dequantize(Q), atol=1e-6)
    # reconstruction quality of a Gaussian matrix: bounded by the width's distortion
    rel = np.linalg.norm(D - W) / np.linalg.norm(W)
    assert rel < {1: 0.7, 2: 0.4, 3: 0.22, 4: 0.12, 5: 0.5}[bits]
    rows = np.array([0, 5, 32, 5])
    np.testing.assert_array_equal(cq.dequantize_rows(Q, rows), D[rows])
    x = rng.standard_normal(cols).astype(np.float32)
    X = rng.standard_normal((4, cols)).astype(np.float32)
    dense = D.astype(np.float64)
    scale = np.abs(dense @ x).max()
    np.testing.assert_allclose(cq.matvec(Q, x), dense @ x, atol=1e-5 * scale)
    Y = cq.matmul(Q, X)
    assert Y.shape == (4, 33) and Y.dtype == np.float32
    np.testing.assert_allclose(Y, X.astype(np.float64) @ dense.T, atol=1e-5 * np.abs(Y).max())


def test_zero_groups_and_padding():
    W = np.zeros((3, 40), np.float32)
    W[1, 5] = 0.25
    Q = cq.quantize(W, 4, 32)
    assert Q.norms[0].tolist() == [0, 0] and Q.norms[1, 1] == 0
    D = cq.dequantize(Q)
    assert np.all(D[0] == 0) and np.all(D[2] == 0)
    assert abs(D[1, 5] - 0.25) < 0.1


def test_quantize_rejects_bad_input():
    with pytest.raises(ValueError):
        cq.quantize(np.ones((2, 8)), 6, 32)
    with pytest.raises(ValueError):
        cq.quantize(np.ones((2, 8)), 4, 48)
    with pytest.raises(ValueError):
        cq.quantize(np.array([[np.nan] * 8]), 4, 32)
    with pytest.raises(ValueError):
        cq.quantize(np.full((1, 64), 1e5, np.float32), 4, 64)  # norm overflows float16


def test_cqmatrix_validates_its_arrays():
    Q = cq.quantize(np.ones((2, 40), np.float32), 3, 32)
    assert (Q.n_groups, Q.cols_padded, Q.field_bits, Q.row_bytes) == (2, 64, 3, 24)
    assert Q.nbytes == 2 * 24 + 2 * 2 * 2
    good = dict(rows=2, cols=40, bits=3, group_size=32, packed=Q.packed, norms=Q.norms, codebook=Q.codebook)
    for key, bad in [("packed", Q.packed[:, :-1]), ("norms", Q.norms.astype(np.float32)),
                     ("codebook", Q.codebook[:4]), ("bits", 6), ("group_size", 24), ("cols", 0),
                     ("packed", np.zeros((2, 48), np.uint8)[:, ::2])]:
        kwargs = dict(good, **{key: bad})
        with pytest.raises(ValueError):
            CQMatrix(**kwargs)
    T = cq.quantize(np.ones((1, 16), np.float32), 5, 16)
    assert (T.field_bits, T.row_bytes, T.codebook.shape) == (2, 4, (4,))
