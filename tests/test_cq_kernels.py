"""needle_cy._cq (Cython CQ kernels) against its NumPy twin needle_cy.reference.cq.

Every width (1, 2, 3, 4, ternary) and group size, random shapes including
column counts that are not a multiple of the group size and single-row
matrices, 1 and 2 threads, and both inner loops (AVX2 where the CPU has it,
and the portable scalar one).  Every share of rows and tokens the engine's threads
make gives the whole product's bits, on every kernel this CPU runs.
"""
import types

import numpy as np
import pytest

from needle_cy import _cq
from needle_cy.reference import cq as ref

WIDTHS = [1, 2, 3, 4, 5]
GROUPS = [32, 64, 128, 256]
KERNELS = ["avx2", "scalar"] if _cq.simd_kernel() == "avx2" else ["scalar"]


@pytest.fixture(params=KERNELS)
def kernel(request):
    previous = _cq.set_simd(request.param == "avx2")
    assert _cq.simd_kernel() == request.param
    yield request.param
    _cq.set_simd(previous)


def rel_err(found, expected):
    """max |found − expected| relative to the largest expected magnitude."""
    scale = max(float(np.abs(expected).max()), 1e-30)
    return float(np.abs(np.asarray(found, np.float64) - expected).max()) / scale


def random_cq(rng, rows, cols, bits, g):
    W = rng.standard_normal((rows, cols)).astype(np.float32)
    W *= rng.uniform(0.1, 3.0, size=(rows, 1)).astype(np.float32)  # uneven row norms
    return ref.quantize(W, bits, g)


def shapes_for(g, rng):
    """rows × cols cases: exact groups, a partial last group, a single row, cols < g."""
    return [
        (int(rng.integers(2, 40)), 2 * g),
        (int(rng.integers(2, 40)), 3 * g + int(rng.integers(1, g))),
        (1, g + 5),
        (3, max(1, g // 2 - 3)),
    ]


@pytest.mark.parametrize("g", GROUPS)
@pytest.mark.parametrize("bits", WIDTHS)
def test_matvec_matmul_match_reference(kernel, bits, g):
    rng = np.random.default_rng(1000 * bits + g)
    for rows, cols in shapes_for(g, rng):
        W = random_cq(rng, rows, cols, bits, g)
        x = rng.standard_normal(cols).astype(np.float32)
        X = rng.standard_normal((11, cols)).astype(np.float32)  # 11 = 8 + 2 + 1 token blocks
        y_ref = ref.matvec(W, x)
        Y_ref = ref.matmul(W, X)
        for threads in (1, 2):
            y = _cq.matvec(W, x, threads=threads)
            assert y.dtype == np.float32 and y.shape == (rows,)
            assert rel_err(y, y_ref) <= 1e-5, (rows, cols, threads)
            Y = _cq.matmul(W, X, threads=threads)
            assert Y.dtype == np.float32 and Y.shape == (11, rows)
            assert rel_err(Y, Y_ref) <= 1e-5, (rows, cols, threads)


@pytest.mark.parametrize("bits", WIDTHS)
def test_small_groups_and_token_counts(kernel, bits):
    # group sizes below the SIMD lane width fall back to the scalar loop; every
    # token-block remainder (1..17 tokens) goes through the matmul blocking
    rng = np.random.default_rng(bits)
    for g in (8, 16):
        W = random_cq(rng, 7, 5 * g + 3, bits, g)
        X = rng.standard_normal((5, W.cols)).astype(np.float32)
        assert rel_err(_cq.matmul(W, X), ref.matmul(W, X)) <= 1e-5
    # groups longer than the scalar matmul's stack piece (1024 fields)
    W = random_cq(rng, 3, 2100, bits, 2048)
    X = rng.standard_normal((3, 2100)).astype(np.float32)
    assert rel_err(_cq.matmul(W, X), ref.matmul(W, X)) <= 1e-5
    assert rel_err(_cq.matvec(W, X[0]), ref.matvec(W, X[0])) <= 1e-5
    W = random_cq(rng, 21, 300, bits, 64)
    X = rng.standard_normal((17, 300)).astype(np.float32)
    Y_ref = ref.matmul(W, X)
    for T in range(1, 18):
        assert rel_err(_cq.matmul(W, X[:T]), Y_ref[:T]) <= 1e-5, T


def test_large_rows_parallel_and_thread_independent(kernel):
    # enough work for the 2-thread path to really fork; each output is summed
    # by one thread in a fixed order, so results are bitwise thread-independent
    rng = np.random.default_rng(7)
    for bits in (2, 4):
        W = random_cq(rng, 515, 384, bits, 128)
        x = rng.standard_normal(384).astype(np.float32)
        X = rng.standard_normal((9, 384)).astype(np.float32)
        y1, y2 = _cq.matvec(W, x, threads=1), _cq.matvec(W, x, threads=2)
        Y1, Y2 = _cq.matmul(W, X, threads=1), _cq.matmul(W, X, threads=2)
        np.testing.assert_array_equal(y1, y2)
        np.testing.assert_array_equal(Y1, Y2)
        assert rel_err(y1, ref.matvec(W, x)) <= 1e-5
        assert rel_err(Y1, ref.matmul(W, X)) <= 1e-5


def test_avx2_and_scalar_agree():
    if "avx2" not in KERNELS:
        pytest.skip("CPU without AVX2+FMA: only the scalar kernel exists here")
    rng = np.random.default_rng(3)
    W = random_cq(rng, 40, 1000, 3, 128)
    x = rng.standard_normal(1000).astype(np.float32)
    fast = _cq.matvec(W, x)
    previous = _cq.set_simd(False)
    try:
        slow = _cq.matvec(W, x)
    finally:
        _cq.set_simd(previous)
    assert rel_err(fast, slow) <= 1e-5


@pytest.mark.parametrize("g", [8, 32, 128, 256, 512])
@pytest.mark.parametrize("bits", WIDTHS)
def test_dequantize_rows_match_reference(bits, g):
    rng = np.random.default_rng(bits * 7 + g)
    rows, cols = 13, 2 * g + 11
    W = random_cq(rng, rows, cols, bits, g)
    ids = [0, 12, 5, 5, 1]
    D = _cq.dequantize_rows(W, ids)
    assert D.shape == (5, cols) and D.dtype == np.float32
    assert rel_err(D, ref.dequantize_rows(W, ids)) <= 1e-5
    full = _cq.dequantize(W)
    assert rel_err(full, ref.dequantize(W)) <= 1e-5
    # the matvec is the product with the decoded matrix (independent of ref.matvec)
    x = rng.standard_normal(cols).astype(np.float32)
    dense = full.astype(np.float64) @ x.astype(np.float64)
    assert rel_err(_cq.matvec(W, x), dense) <= 1e-5


def test_out_arguments_and_input_conversion():
    rng = np.random.default_rng(11)
    W = random_cq(rng, 10, 200, 4, 64)
    x64 = rng.standard_normal(200)  # float64 input is converted
    out = np.full(10, np.nan, np.float32)
    res = _cq.matvec(W, x64, out=out)
    assert res is out
    assert rel_err(out, ref.matvec(W, x64.astype(np.float32))) <= 1e-5
    X = rng.standard_normal((3, 400)).astype(np.float32)[:, ::2]  # non-contiguous view
    Yout = np.empty((3, 10), np.float32)
    assert _cq.matmul(W, X, out=Yout) is Yout
    assert rel_err(Yout, ref.matmul(W, np.ascontiguousarray(X))) <= 1e-5
    assert _cq.matmul(W, np.zeros((0, 200), np.float32)).shape == (0, 10)
    Dout = np.empty((2, 200), np.float32)
    assert _cq.dequantize_rows(W, np.array([3, 4], np.int32), out=Dout) is Dout
    assert _cq.dequantize_rows(W, []).shape == (0, 200)


def test_prepare_is_cached_and_reusable():
    rng = np.random.default_rng(5)
    W = random_cq(rng, 6, 100, 2, 32)
    cw = _cq.prepare(W)
    assert _cq.prepare(W) is cw
    assert _cq.prepare(cw) is cw
    assert (cw.rows, cw.cols, cw.bits, cw.group_size) == (6, 100, 2, 32)
    x = rng.standard_normal(100).astype(np.float32)
    np.testing.assert_array_equal(_cq.matvec(cw, x), _cq.matvec(W, x))


def test_bad_inputs_raise_named_errors():
    rng = np.random.default_rng(9)
    W = random_cq(rng, 4, 96, 4, 32)
    x = np.zeros(96, np.float32)
    with pytest.raises(ValueError, match=r"matvec x shape.*\(96,\)"):
        _cq.matvec(W, np.zeros(95, np.float32))
    with pytest.raises(ValueError, match="matvec x"):
        _cq.matvec(W, np.zeros(96, np.int32))
    with pytest.raises(ValueError, match="matvec out"):
        _cq.matvec(W, x, out=np.zeros(4, np.float64))
    with pytest.raises(ValueError, match="matvec out"):
        _cq.matvec(W, x, out=np.zeros(5, np.float32))
    with pytest.raises(ValueError, match="matmul X"):
        _cq.matmul(W, x)
    with pytest.raises(ValueError, match="matmul X shape"):
        _cq.matmul(W, np.zeros((2, 97), np.float32))
    with pytest.raises(ValueError, match="matmul out"):
        _cq.matmul(W, np.zeros((2, 96), np.float32), out=np.zeros((4, 2), np.float32))
    with pytest.raises(ValueError, match="threads"):
        _cq.matvec(W, x, threads=0)
    with pytest.raises(IndexError, match=r"\[0, 4\)"):
        _cq.dequantize_rows(W, [0, 4])
    with pytest.raises(IndexError):
        _cq.dequantize_rows(W, [-1])
    with pytest.raises(ValueError, match="integer"):
        _cq.dequantize_rows(W, [0.5])


def _fake(W, **changes):
    fields = dict(rows=W.rows, cols=W.cols, bits=W.bits, group_size=W.group_size,
                  packed=W.packed, norms=W.norms, codebook=W.codebook)
    fields.update(changes)
    return types.SimpleNamespace(**fields)


def test_inconsistent_matrices_are_refused_before_any_kernel_runs():
    rng = np.random.default_rng(2)
    W = random_cq(rng, 4, 96, 2, 32)
    x = np.zeros(96, np.float32)
    bad = {
        "bits": 6,
        "group_size": 48,
        "rows": 5,                                        # packed has 4 rows
        "cols": 200,                                      # more groups than stored
        "packed": W.packed[:, :-1],                       # short rows
        "norms": W.norms[:, :2],                          # missing a group
        "codebook": np.zeros(8, np.float32),              # wrong size for 2 bits
    }
    for field, value in bad.items():
        with pytest.raises(ValueError, match="CQ"):
            _cq.matvec(_fake(W, **{field: value}), x)
    with pytest.raises(ValueError, match="CQ packed"):
        _cq.matvec(_fake(W, packed=np.zeros((24, 4), np.uint8).T), x)  # right shape, not C order
    with pytest.raises(ValueError, match="CQ norms"):
        _cq.matvec(_fake(W, norms=np.full((4, 3), np.inf, np.float16)), x)
    with pytest.raises(ValueError, match="CQMatrix"):
        _cq.matvec(object(), x)


def test_multiply_shared_rotates_once_for_several_matrices(kernel):
    rng = np.random.default_rng(21)
    Ws = [random_cq(rng, rows, 300, bits, 64) for rows, bits in ((17, 2), (9, 5), (33, 2))]
    x = rng.standard_normal(300).astype(np.float32)
    X = rng.standard_normal((6, 300)).astype(np.float32)
    for W, y in zip(Ws, _cq.multiply_shared(Ws, x, threads=2)):
        assert rel_err(y, ref.matvec(W, x)) <= 1e-5
    for W, Y in zip(Ws, _cq.multiply_shared(Ws, X)):
        assert Y.shape == (6, W.rows)
        assert rel_err(Y, ref.matmul(W, X)) <= 1e-5
    with pytest.raises(ValueError, match="multiply_shared weights"):
        _cq.multiply_shared([Ws[0], random_cq(rng, 4, 300, 4, 64)], x)
    with pytest.raises(ValueError, match="multiply_shared weights"):
        _cq.multiply_shared([Ws[0], random_cq(rng, 4, 301, 2, 64)], x)


@pytest.mark.parametrize("name", ["needle3_tiny_a", "needle3_tiny_b"])
def test_every_cq_tensor_of_the_official_archives(name):
    # archives from the official exporter, read through the mmap reader: packed
    # rows are read-only views into the file, d = 96 leaves a partial group
    from conftest import fixture_path
    from needle_cy.archive import Archive, CQMatrix

    archive = Archive.open(fixture_path(name, "model.cact"))
    rng = np.random.default_rng(len(name))
    checked = 0
    for rec in archive.records:
        W = archive.tensor(rec.index)
        if not isinstance(W, CQMatrix):
            continue
        x = rng.standard_normal(W.cols).astype(np.float32)
        X = rng.standard_normal((3, W.cols)).astype(np.float32)
        assert rel_err(_cq.matvec(W, x), ref.matvec(W, x)) <= 1e-5, rec.index
        assert rel_err(_cq.matmul(W, X), ref.matmul(W, X)) <= 1e-5, rec.index
        ids = [0, W.rows // 2, W.rows - 1]
        assert rel_err(_cq.dequantize_rows(W, ids), ref.dequantize_rows(W, ids)) <= 1e-5, rec.index
        checked += 1
    assert checked >= 10


@pytest.mark.parametrize("bits", WIDTHS)
def test_matmul_token_tiles_wide_rows_and_huge_groups(kernel, bits):
    # the AVX2 matmul works in tiles of 64 tokens and column slices of ~768 fields,
    # each slice either decoded once per tile or multiplied from the packed bytes
    # (by width and slice size); 150 tokens = two full tiles + an odd remainder
    rng = np.random.default_rng(50 + bits)
    W = random_cq(rng, 19, 1800, bits, 128)
    X = rng.standard_normal((150, 1800)).astype(np.float32)
    Y_ref = ref.matmul(W, X)
    for threads in (1, 2):
        assert rel_err(_cq.matmul(W, X, threads=threads), Y_ref) <= 1e-5, threads
    # a group wider than the decode buffer (12288 floats): slices must stay whole groups
    W = random_cq(rng, 3, 20000, bits, 16384)
    X = rng.standard_normal((9, 20000)).astype(np.float32)
    assert rel_err(_cq.matmul(W, X), ref.matmul(W, X)) <= 1e-5


@pytest.mark.parametrize("a8_input", [False, True])
@pytest.mark.parametrize("bits", WIDTHS)
def test_row_and_token_pieces_equal_the_whole_product(kernel, bits, a8_input):
    """The engine's parallel regions split a product by rows (decode step, prefill) and
    by tokens (the mHC Φ in prefill), each piece on its own thread: every piece must be
    the whole product's values bit for bit, on the float and the integer kernels."""
    rng = np.random.default_rng(77 + bits)
    W = random_cq(rng, 80, 200, bits, 64)
    X = rng.standard_normal((13, 200)).astype(np.float32)
    if a8_input:   # A8 vectors (deploy inputs): the integer kernel where the CPU has one
        s = np.abs(X).max(axis=1, keepdims=True) / 127
        X = (np.clip(np.rint(X / s), -127, 127) * s).astype(np.float32)
    whole = _cq.matmul(W, X, threads=1, a8=a8_input)
    for row_cut, token_cut in [(0, 0), (16, 5), (32, 1), (64, 12), (80, 13)]:
        np.testing.assert_array_equal(_cq._matmul_pieces(W, X, row_cut, token_cut, a8=a8_input), whole)
    one = _cq.matvec(W, X[3], threads=1, a8=a8_input)
    for row_cut in (0, 5, 32, 79, 80):
        np.testing.assert_array_equal(_cq._matvec_pieces(W, X[3], row_cut, a8=a8_input), one)
    with pytest.raises(ValueError):
        _cq._matmul_pieces(W, X, 8, 0)


@pytest.mark.parametrize("bits", WIDTHS)
@pytest.mark.parametrize("name", _cq.available_kernels())
def test_every_token_share_gives_the_whole_products_bits(name, bits):
    """A prefill chunk's tokens are cut between the threads (T·tid // nt), so a thread's
    share may hold any number of tokens, one included.  On every kernel this CPU runs
    (set_kernel; an AVX-512 CPU runs the AVX2 ones too), at every width, with float and
    A8 inputs, and on both paths of the float matmul (rows decoded once; 1–2-bit rows
    wider than LOW_BIT_DECODE_FIELDS straight from the packed bytes, 8, 4, 2 and 1
    tokens at a time), each share gives the whole product's bits."""
    rng = np.random.default_rng(300 + bits)
    previous = _cq.set_kernel(name)
    try:
        for cols in (200, 1000):
            W = random_cq(rng, 80, cols, bits, 64)
            X = rng.standard_normal((13, cols)).astype(np.float32)
            for a8_input in (False, True):
                if a8_input:
                    s = np.abs(X).max(axis=1, keepdims=True) / 127
                    X = (np.clip(np.rint(X / s), -127, 127) * s).astype(np.float32)
                whole = _cq.matmul(W, X, threads=1, a8=a8_input)
                # (the lookups' int16 tables round each lookup: test_cq_int_kernels.rel_tol)
                assert rel_err(whole, ref.matmul(W, X)) <= (2e-3 if a8_input and name in _cq.LUT_KERNELS else 1e-5)
                for token_cut in range(len(X) + 1):           # shares of 0 … 13 tokens
                    got = _cq._matmul_pieces(W, X, 16 * (token_cut % 6), token_cut, a8=a8_input)
                    np.testing.assert_array_equal(got, whole, err_msg=f"{name} cols {cols} cut {token_cut}")
                np.testing.assert_array_equal(_cq.matmul(W, X, threads=2, a8=a8_input), whole)
    finally:
        _cq.set_kernel(previous)
