"""The AMX tile matmul (needle_cy/csrc/cq_amx.h) and its numerics.

A8 matmuls of _cq.AMX_MIN tokens or more run on int8 tiles where the CPU has AMX
(reference.cq.matmul_amx specifies them bit for bit); the same numerics run in a
portable loop on any CPU (set_amx('portable')), so the plumbing (the tile form of the
workspace, its byte planes, row and token shares) is tested everywhere and the tiles
where they exist.
"""
import numpy as np
import pytest

from needle_cy import _cq
from needle_cy.reference import cq as ref

SHAPES = [(37, 200, 9), (64, 768, 64), (16, 512, 20), (5, 256, 100), (70, 768, 8)]


def a8(x):
    x = np.asarray(x, np.float32)
    amax = np.float32(np.abs(x).max(axis=-1, keepdims=True))
    s = np.where(amax > 0, amax / np.float32(127), np.float32(1)).astype(np.float32)
    return (np.clip(np.rint(x / s), -128, 127) * s).astype(np.float32)


def random_cq(rng, rows, cols, bits, g):
    W = rng.standard_normal((rows, cols)).astype(np.float32)
    W *= rng.uniform(0.1, 3.0, size=(rows, 1)).astype(np.float32)
    return ref.quantize(W, bits, g)


def _int_kernel_for_portable():
    """An integer kernel this CPU runs (the tile form is an integer rotation)."""
    for name in ("avx512vnni", "avx512bw", "avxvnni", "avx2int", "neon_dotprod", "neon"):
        if name in _cq.available_kernels():
            return name
    return None


@pytest.fixture(params=["portable", "tiles"])
def amx_mode(request):
    if request.param == "tiles" and not _cq.amx_available():
        pytest.skip("CPU lacks AMX-TILE + AMX-INT8 (or the OS's tile state): the tile kernel cannot run here")
    # a kernel without the lookup layouts: every matrix below takes the tile form
    kernel = _int_kernel_for_portable() if request.param == "portable" else _cq.lut_base_kernel()
    if kernel is None:
        pytest.skip("no integer kernel on this CPU: the tile form is never taken")
    _cq.set_kernel(kernel)
    previous = _cq.set_amx(request.param)
    assert _cq.amx_mode() == request.param
    yield request.param
    _cq.set_amx(previous)
    _cq.set_kernel("auto")


def test_reference_is_close_to_the_float_product():
    rng = np.random.default_rng(1)
    for bits in (1, 2, 3, 4, 5):
        for g in (64, 128, 256):
            W = random_cq(rng, 40, 2 * g + 3, bits, g)
            X = a8(rng.standard_normal((5, W.cols)) * rng.uniform(0.01, 100, size=(5, 1)))
            want = ref.matmul(W, X)
            got = ref.matmul_amx(W, X)
            assert np.abs(got - want).max() <= 2e-6 * np.abs(want).max(), (bits, g)


def test_reference_tables_and_errors():
    rng = np.random.default_rng(2)
    W = random_cq(rng, 8, 128, 4, 128)
    c2, c1, c0, E = ref.amx_tables(W)
    C = np.rint(np.ldexp(np.asarray(W.codebook, np.float64), E)).astype(np.int64)
    assert np.array_equal(c2 * 65536 + c1 * 256 + c0, C)
    assert np.abs(C).max() <= ref.AMX_CODE_MAX and np.abs(C).max() > ref.AMX_CODE_MAX // 2
    for piece in (c2, c1, c0):
        assert piece.min() >= -128 and piece.max() <= 127
    hi, lo = ref.signed_bytes(np.arange(-16256, 16257))
    assert np.array_equal(hi * 256 + lo, np.arange(-16256, 16257)) and lo.min() == -128 and lo.max() == 127
    with pytest.raises(ValueError, match="tile kernel does not run"):
        ref.matmul_amx(random_cq(rng, 4, 64, 2, 32), np.zeros((1, 64), np.float32))
    with pytest.raises(ValueError, match="not an A8 vector"):
        ref.matmul_amx(W, rng.standard_normal((2, 128)).astype(np.float32))


def test_set_amx_names_its_modes():
    previous = _cq.set_amx("off")
    try:
        assert _cq.amx_mode() == "off"
        with pytest.raises(ValueError, match="set_amx takes"):
            _cq.set_amx("fast")
        if not _cq.amx_available():
            with pytest.raises(ValueError, match="AMX-TILE"):
                _cq.set_amx("tiles")
        assert _cq.amx_mode() == "off"
    finally:
        _cq.set_amx(previous)


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("g", [64, 128, 256])
def test_matmul_is_the_reference_bit_for_bit(amx_mode, bits, g):
    rng = np.random.default_rng(10 * bits + g)
    for rows, cols, T in SHAPES:
        W = random_cq(rng, rows, cols, bits, g)
        X = a8(rng.standard_normal((T, cols)) * rng.uniform(0.01, 100, size=(T, 1)))
        want = ref.matmul_amx(W, X)
        for threads in (1, 2, 3):
            np.testing.assert_array_equal(_cq.matmul(W, X, threads=threads, a8=True), want)
        np.testing.assert_array_equal(_cq.multiply_shared([W, W], X, a8=True)[1], want)


def test_few_tokens_keep_the_other_kernels(amx_mode):
    """Below AMX_MIN tokens the matmul is the matvec's numerics (each token's row bitwise)."""
    rng = np.random.default_rng(5)
    W = random_cq(rng, 70, 768, 2, 128)
    X = a8(rng.standard_normal((_cq.AMX_MIN - 1, 768)))
    per_token = np.stack([_cq.matvec(W, x, a8=True) for x in X])
    np.testing.assert_array_equal(_cq.matmul(W, X, a8=True), per_token)
    assert not np.array_equal(ref.matmul_amx(W, X), per_token)


def test_lookup_layouts_keep_the_lookups(amx_mode):
    """Under avx512lut a matrix with the lookup layout keeps the lookups' numerics
    (prefill = the step's numerics there); one without (fewer than LUT_MIN_ROWS rows;
    in the engine every 4-bit matrix but the head) takes the tiles."""
    if "avx512lut" not in _cq.available_kernels():
        pytest.skip("CPU lacks AVX-512 F/BW/VL: the avx512lut kernel cannot run here")
    _cq.set_kernel("avx512lut")
    rng = np.random.default_rng(8)
    X = a8(rng.standard_normal((20, 768)))
    W2 = random_cq(rng, 80, 768, 2, 128)
    assert _cq.prepare(W2).kernel(a8=True) == "avx512lut"
    np.testing.assert_array_equal(_cq.matmul(W2, X, a8=True), ref.matmul_lut(W2, X))
    W4 = random_cq(rng, _cq.LUT_MIN_ROWS - 16, 768, 4, 128)
    assert _cq.prepare(W4).kernel(a8=True) != "avx512lut"
    np.testing.assert_array_equal(_cq.matmul(W4, X, a8=True), ref.matmul_amx(W4, X))


def test_row_and_token_pieces_equal_the_whole(amx_mode):
    """Rows and tokens cut anywhere (the engine's thread shares; with and without a
    decode scratch): the whole product bit for bit."""
    rng = np.random.default_rng(6)
    for rows, cols, g, T in [(75, 768, 128, 40), (33, 300, 64, 17)]:
        W = random_cq(rng, rows, cols, 4, g)
        X = a8(rng.standard_normal((T, cols)) * rng.uniform(0.01, 100, size=(T, 1)))
        whole = _cq.matmul(W, X, a8=True)
        np.testing.assert_array_equal(whole, ref.matmul_amx(W, X))
        for row_cut, token_cut in ((16, 3), (48, 5), (64, 1), (0, 7), (32, 16)):
            if row_cut > rows:
                continue
            for scratch in (True, False):
                got = _cq._matmul_pieces(W, X, row_cut, token_cut, a8=True, scratch=scratch)
                np.testing.assert_array_equal(got, whole)
        for nt in (2, 3):
            got, stood = _cq._matmul_token_shares(W, X, nt)
            assert stood
            np.testing.assert_array_equal(got, whole)


def test_tiles_and_portable_loop_agree_in_the_model(tmp_path):
    """A whole prefill (every matrix, the engine's chunk region on 2 threads) on the tiles
    gives the portable loop's bits; against the other kernels it agrees within the
    fixtures' deploy bars."""
    if not _cq.amx_available():
        pytest.skip("CPU lacks AMX-TILE + AMX-INT8 (or the OS's tile state): the tile kernel cannot run here")
    from needle_cy.model import Model
    from needle_cy.testing.make_random_archive import make_random_archive
    path = tmp_path / "m.cact"
    make_random_archive(path, bits=4, d_model=256, num_heads=8, num_kv_heads=2, qk_head_dim=32,
                        v_head_dim=32, layers=2, vocab=300, group_size=128)
    ids = np.random.default_rng(3).integers(4, 300, size=70)
    runs = {}
    previous = _cq.amx_mode()
    try:
        for mode in ("tiles", "portable", "off"):
            _cq.set_amx(mode)
            m = Model.load(path, backend="cython", threads=2)
            runs[mode] = m.prefill(ids)
    finally:
        _cq.set_amx(previous)
    np.testing.assert_array_equal(runs["tiles"], runs["portable"])
    assert not np.array_equal(runs["tiles"], runs["off"])
    assert np.abs(runs["tiles"] - runs["off"]).mean() <= 0.01 * np.abs(runs["off"]).mean()
