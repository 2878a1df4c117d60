"""The integer CQ kernels (A8 inputs, needle_cy/csrc/cq_int_avx512_tmpl.h on x86-64,
needle_cy/csrc/cq_neon_tmpl.h on aarch64) against the NumPy reference.

Every integer kernel this CPU has (each forced with set_kernel; the others skip
with the instruction set they need: avxvnni needs AVX-VNNI, which AVX-512 CPUs
such as Zen 4 lack, so there it is only compiled and its selection tested), every width (1, 2, 3, 4, ternary), group
sizes 16–256, column counts that are not a multiple of the group, row counts that
are not a multiple of the 4-row block or of the 32-row parallel block, 1 and 2
threads; the matmul (several tokens, the prefill path) at token counts 2..64 that
are not multiples of its 6-token tile, bitwise equal to the matvec of each token.
Inputs are A8 vectors as the engine makes them (deploy numerics); an input that
is not one must take the float kernel and give its exact result (for the matmul:
one such token sends the whole chunk to the float kernel).  Every kernel gives
the reference's integer numerics (reference.cq.matmul_int) bit for bit, so the
kernels of one CPU agree with each other (the 256-bit ones mirror the AVX-512
lanes and float steps), and the run-time choice follows pick_int_kernel.  The
exception is the table lookups (avx512lut, avx2lut), which run the matrices of 2- and
4-bit fields (reference.cq.lut_applies) in their own numerics, reference.cq.matmul_lut,
also bit for bit; avx512lut's other matrices take the next AVX-512 kernel, avx2lut's
the float kernels (here avx2int, set_avx2lut_base, so that they have integer numerics
to compare; the float base has tests of its own below).
"""
import os
import subprocess
import sys

import numpy as np
import pytest

from needle_cy import _cq
from needle_cy.reference import cq as ref

INT_KERNELS = list(_cq.INT_KERNELS)
NEEDS = {"avx512lut": "AVX-512 F/BW/VL", "avx512vnni": "AVX-512 F/BW/VL + VNNI", "avx512bw": "AVX-512 F/BW/VL",
         "avxvnni": "AVX2+FMA + AVX-VNNI", "avx2lut": "AVX2+FMA", "avx2int": "AVX2+FMA",
         "neon_dotprod": "aarch64 NEON + the dot product extension (asimddp)", "neon": "aarch64 NEON"}


@pytest.fixture(params=INT_KERNELS)
def int_kernel(request):
    name = request.param
    if name not in _cq.available_kernels():
        pytest.skip(f"CPU lacks {NEEDS[name]}: the {name} kernel cannot run here")
    previous = _cq.set_kernel(name)
    assert _cq.kernel_name() == name
    min_rows = _cq.LUT_MIN_ROWS
    _cq.LUT_MIN_ROWS = 1      # every shape below through the lookups (the engine keeps them for >= 64 rows)
    amx = _cq.set_amx("off")  # these are the kernels' own numerics (the AMX tile matmul: test_cq_amx.py)
    base = _cq.set_avx2lut_base("avx2int") if "avx2lut" in _cq.available_kernels() else None
    yield name
    if base is not None:
        _cq.set_avx2lut_base(base)
    _cq.set_amx(amx)
    _cq.LUT_MIN_ROWS = min_rows
    _cq.set_kernel("auto")
    assert _cq.kernel_name() == previous or previous not in _cq.available_kernels()


def a8(x):
    """The A8 quantizer of spec §3.8 (float32, as needle_cy._ops.a8_inplace)."""
    x = np.asarray(x, np.float32)
    amax = np.float32(np.abs(x).max(axis=-1, keepdims=True))
    s = np.where(amax > 0, amax / np.float32(127), np.float32(1)).astype(np.float32)
    return (np.clip(np.rint(x / s), -128, 127) * s).astype(np.float32)


def rel_err(found, expected):
    scale = max(float(np.abs(expected).max()), 1e-30)
    return float(np.abs(np.asarray(found, np.float64) - expected).max()) / scale


def rel_tol(kernel, W):
    """How far this kernel may be from the float reference: float32 rounding for the
    integer numerics; the lookups' int16 tables add a rounding of up to 2^-16 of the
    token's largest entry to every lookup: about 1e-4 of a row's value (2e-4 at 4 bits,
    where one entry is one product), up to 1.3e-3 of a lone row whose sum cancels (1
    row, 37 4-bit inputs in groups of 32; 3e-4 for 133 ternary inputs)."""
    return 2e-3 if runs_lut(kernel, W) else 1e-5


def runs_lut(kernel, W):
    """Whether this kernel runs W with the table lookups (else with the integer numerics)."""
    return kernel in _cq.LUT_KERNELS and ref.lut_applies(W.bits, W.group_size) and W.rows >= _cq.LUT_MIN_ROWS


def exact_numerics(kernel, W, X):
    """The reference of what this kernel computes for W, bit for bit."""
    return ref.matmul_lut(W, X) if runs_lut(kernel, W) else ref.matmul_int(W, X)


def kernel_of(kernel, W):
    """The name CQWeight.kernel(a8=True) reports for W under this kernel."""
    if kernel in _cq.LUT_KERNELS and not runs_lut(kernel, W):
        return _cq.lut_base_kernel(kernel)
    return kernel


def random_cq(rng, rows, cols, bits, g):
    W = rng.standard_normal((rows, cols)).astype(np.float32)
    W *= rng.uniform(0.1, 3.0, size=(rows, 1)).astype(np.float32)
    return ref.quantize(W, bits, g)


@pytest.mark.parametrize("g", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5])
def test_int_matvec_matches_reference(int_kernel, bits, g):
    rng = np.random.default_rng(100 * bits + g)
    for rows, cols in [(37, 2 * g), (5, 3 * g + 7), (1, g + 5), (3, max(1, g // 2 - 3)), (70, 768)]:
        W = random_cq(rng, rows, cols, bits, g)
        cw = _cq.prepare(W)
        assert cw.int_tables and cw.kernel(a8=True) == kernel_of(int_kernel, W)
        x = a8(rng.standard_normal(cols) * rng.uniform(0.01, 100))
        want = ref.matvec(W, x)
        exact = exact_numerics(int_kernel, W, x[None])[0]
        for threads in (1, 2):
            got = _cq.matvec(W, x, threads=threads, a8=True)
            assert got.dtype == np.float32 and got.shape == (rows,)
            assert rel_err(got, want) <= rel_tol(int_kernel, W), (rows, cols, threads)
            # the integer (or lookup) numerics of the reference, bit for bit (every kernel, every ISA)
            np.testing.assert_array_equal(got, exact)
        # one token through matmul and multiply_shared takes the same kernel
        np.testing.assert_array_equal(_cq.matmul(W, x[None], a8=True)[0], got)
        np.testing.assert_array_equal(_cq.multiply_shared([W, W], x, a8=True)[1], got)


@pytest.mark.parametrize("g", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5])
def test_int_matmul_matches_reference_and_matvec(int_kernel, bits, g):
    rng = np.random.default_rng(1000 + 100 * bits + g)
    shapes = [(37, 2 * g), (5, 3 * g + 7), (1, g + 5), (3, max(1, g // 2 - 3)), (70, 768)]
    for (rows, cols), T in zip(shapes, [2, 3, 5, 13, 64]):
        W = random_cq(rng, rows, cols, bits, g)
        X = a8(rng.standard_normal((T, cols)) * rng.uniform(0.01, 100, size=(T, 1)))
        want = ref.matmul(W, X)
        per_token = np.stack([_cq.matvec(W, x, a8=True) for x in X])
        for threads in (1, 2):
            got = _cq.matmul(W, X, threads=threads, a8=True)
            assert got.dtype == np.float32 and got.shape == (T, rows)
            assert rel_err(got, want) <= rel_tol(int_kernel, W), (rows, cols, T, threads)
            # each token's row sums are the matvec's, bit for bit
            np.testing.assert_array_equal(got, per_token)
        np.testing.assert_array_equal(per_token, exact_numerics(int_kernel, W, X))
        np.testing.assert_array_equal(_cq.multiply_shared([W, W], X, a8=True)[1], per_token)


@pytest.mark.parametrize("T", list(range(2, 12)) + [31, 33, 63, 64])
def test_int_matmul_token_counts(int_kernel, T):
    rng = np.random.default_rng(T)
    for bits in (2, 4):
        W = random_cq(rng, 33, 300, bits, 128)
        X = a8(rng.standard_normal((T, 300)))
        got = _cq.matmul(W, X, a8=True)
        assert rel_err(got, ref.matmul(W, X)) <= rel_tol(int_kernel, W), (bits, T)
        np.testing.assert_array_equal(got, np.stack([_cq.matvec(W, x, a8=True) for x in X]))


def test_int_matmul_with_one_float_token_takes_the_float_kernel(int_kernel):
    rng = np.random.default_rng(5)
    W = random_cq(rng, 40, 500, 4, 128)
    X = a8(rng.standard_normal((9, 500)))
    X[6] = rng.standard_normal(500).astype(np.float32)   # not k·s for int8 k
    np.testing.assert_array_equal(_cq.matmul(W, X, a8=True), _cq.matmul(W, X))
    X = a8(rng.standard_normal((9, 500)))
    X[2, 3] = np.nan
    assert np.isnan(_cq.matmul(W, X, a8=True)[2]).all()


def test_token_shares_of_a_rotation_equal_the_whole(int_kernel):
    """A prefill chunk's team rotates each thread's tokens (cq_rotate_tokens): for any
    team size the same bits as matmul, integer and lookup forms; a token that is not an
    A8 vector, or no scratch for the int16 form, fails the verdict and thread 0's
    rotation (the float form there) gives matmul's result again."""
    rng = np.random.default_rng(31)
    for bits, g, rows, cols in [(2, 64, 70, 768), (4, 32, 33, 200), (5, 128, 65, 300), (3, 64, 20, 130)]:
        W = random_cq(rng, rows, cols, bits, g)
        X = a8(rng.standard_normal((9, cols)) * rng.uniform(0.01, 100, size=(9, 1)))
        want = _cq.matmul(W, X, a8=True)
        for nt in (1, 2, 3, 9, 12):
            got, stood = _cq._matmul_token_shares(W, X, nt)
            assert stood, (bits, nt)
            np.testing.assert_array_equal(got, want)
        bad = X.copy()
        bad[4, 3] += np.float32(0.37) * np.abs(bad[4]).max() / 127     # row 4 is no longer A8
        got, stood = _cq._matmul_token_shares(W, bad, 2)
        assert not stood
        np.testing.assert_array_equal(got, _cq.matmul(W, bad, a8=True))
        got, stood = _cq._matmul_token_shares(W, X, 2, scratch=False)
        assert stood == runs_lut(int_kernel, W)      # the lookup form keeps its codes in place
        np.testing.assert_array_equal(got, want)


def test_int_extreme_codes_do_not_overflow(int_kernel):
    # |k| = 127 everywhere, signs aligned with the rotation: the largest rotated
    # codes (127·g) meet the largest codewords
    rng = np.random.default_rng(9)
    for g in (128, 256):
        for bits in (1, 2, 4):
            W = random_cq(rng, 9, 2 * g, bits, g)
            X = a8(np.stack([np.full(2 * g, 3.5, np.float32), np.tile(ref.hadamard_matrix(g)[5] > 0, 2) * 2.0 - 1.0]))
            for x in X:
                assert rel_err(_cq.matvec(W, x, a8=True), ref.matvec(W, x)) <= rel_tol(int_kernel, W), (g, bits)
            assert rel_err(_cq.matmul(W, X, a8=True), ref.matmul(W, X)) <= rel_tol(int_kernel, W), (g, bits)


def test_zero_input(int_kernel):
    W = random_cq(np.random.default_rng(1), 6, 300, 4, 128)
    np.testing.assert_array_equal(_cq.matvec(W, np.zeros(300, np.float32), a8=True), np.zeros(6, np.float32))


def test_not_an_a8_vector_takes_the_float_kernel(int_kernel):
    rng = np.random.default_rng(2)
    W = random_cq(rng, 40, 500, 4, 128)
    x = rng.standard_normal(500).astype(np.float32)          # not k·s for int8 k
    np.testing.assert_array_equal(_cq.matvec(W, x, a8=True), _cq.matvec(W, x))
    x = a8(x)
    x[7] = np.nan
    assert np.isnan(_cq.matvec(W, x, a8=True)).all()


def test_groups_without_tables_take_the_float_kernel(int_kernel):
    rng = np.random.default_rng(3)
    for bits, g in ((1, 8), (4, 512)):
        W = random_cq(rng, 5, 2 * g + 3, bits, g)
        cw = _cq.prepare(W)
        assert not cw.int_tables and cw.kernel(a8=True) in ("avx2", "scalar")
        x = a8(rng.standard_normal(W.cols))
        np.testing.assert_array_equal(_cq.matvec(W, x, a8=True), _cq.matvec(W, x))


def test_kernel_selection_and_environment_override():
    assert _cq.available_kernels()[-1] == "scalar"
    assert _cq.kernel_name(a8=False) in ("avx2", "scalar")
    with pytest.raises(ValueError, match="one of"):
        _cq.set_kernel("neon-lut")
    missing = [k for k in _cq.KERNELS if k not in _cq.available_kernels()]
    if missing:
        with pytest.raises(ValueError, match="lacks"):
            _cq.set_kernel(missing[0])
    code = "from needle_cy import _cq; print(_cq.kernel_name(), _cq.kernel_name(a8=False))"
    env = dict(os.environ, NEEDLE_CY_CQ_KERNEL="scalar",
               PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(_cq.__file__))] + sys.path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["scalar", "scalar"]


def test_deploy_fixture_with_each_kernel(int_kernel):
    """The whole model in deploy numerics with this kernel: the official fixtures' bar."""
    from conftest import fixture_path
    from needle_cy.model import Model
    cases = np.load(fixture_path("needle3_tiny_a", "cases.npz"))
    m = Model.load(fixture_path("needle3_tiny_a", "model.cact"), threads=1)
    case = "single_call"
    ids = cases[f"{case}.ids"]
    rows = [m.prefill(ids[:1])] + [m.step(int(t)) for t in ids[1:60]]   # steps: the integer matvec
    got = np.stack(rows)
    want = cases[f"{case}.logits_deploy"].astype(np.float32)[:60]
    assert np.abs(got - want).mean() <= 0.01
    margin = cases[f"{case}.margin_deploy"][:60]
    sure = margin > 0.1
    assert np.array_equal(got.argmax(-1)[sure], want.argmax(-1)[sure])
    # the same through the integer matmul: forward runs chunks of tokens (prefill path)
    full = m.forward(ids[:60])
    assert np.abs(full - want).mean() <= 0.01
    assert np.array_equal(full.argmax(-1)[sure], want.argmax(-1)[sure])
    m.reset()
    last = m.prefill(ids[:37])      # a chunk that is not a multiple of the 6-token tile
    assert np.abs(last - want[36]).mean() <= 0.01


# odd shapes for the bitwise comparison: rows not a multiple of the 2- and 4-row
# blocks, columns with partial groups and chunks, the last chunk of the matrix short
AGREE_SHAPES = [(37, 2), (5, 3), (1, 1), (3, 0), (70, 6), (33, 5)]


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5])
def test_int_kernels_agree_bitwise(int_kernel, bits):
    """This kernel and every other integer kernel this CPU has: the same bits, matvec
    and matmul (token counts that are not multiples of the 4- and 6-token tiles)."""
    others = [k for k in INT_KERNELS if k != int_kernel and k in _cq.available_kernels()]
    if not others:
        pytest.skip("no other integer kernel on this CPU to compare with")
    rng = np.random.default_rng(50 + bits)
    for g in (16, 32, 64, 128, 256):
        for rows, groups in AGREE_SHAPES:
            cols = groups * g + (g // 2 + 3 if groups < 4 else 0)
            W = random_cq(rng, rows, cols, bits, g)
            X = a8(rng.standard_normal((7, cols)) * rng.uniform(0.01, 100, size=(7, 1)))
            X[3] = a8(np.full(cols, -2.0, np.float32))   # the largest codes of one sign
            got = {}
            for k in [int_kernel] + others:
                _cq.set_kernel(k)
                got[k] = [_cq.matvec(W, X[0], a8=True, threads=1), _cq.matvec(W, X[3], a8=True, threads=2),
                          _cq.matmul(W, X, a8=True, threads=1), _cq.matmul(W, X[:5], a8=True, threads=2)]
            _cq.set_kernel(int_kernel)
            for k in others:
                if runs_lut(int_kernel, W) != runs_lut(k, W):
                    continue    # the lookups and the integer products: two numerics (each tested above)
                for a, b in zip(got[int_kernel], got[k]):
                    np.testing.assert_array_equal(a, b, err_msg=f"{int_kernel} vs {k}, g={g}, {rows}x{cols}")
            assert rel_err(got[int_kernel][2], ref.matmul(W, X)) <= rel_tol(int_kernel, W), (g, rows, cols)


def test_int_kernel_selection_rule():
    def pick(**features):
        return _cq.pick_int_kernel(int256=True, **features)
    assert pick() is None                                         # no AVX2: float (scalar) kernels
    assert pick(avx2=True) == "avx2lut"                           # Zen 3, Intel client before Alder Lake
    assert pick(avx2=True, avxvnni=True) == "avxvnni"             # Alder Lake and later client cores
    assert pick(avxvnni=True) is None                             # (AVX-VNNI is VEX: needs AVX2 too)
    # AVX-512: the 2-bit lookups (their other matrices on avx512vnni, else avx512bw)
    assert pick(avx2=True, avx512bw=True) == "avx512lut"          # Skylake-SP
    assert pick(avx2=True, avx512bw=True, avx512vnni=True) == "avx512lut"    # Cascade Lake, Zen 4
    assert pick(avx2=True, avx512bw=True, avx512vnni=True, avxvnni=True) == "avx512lut"  # Sapphire Rapids
    # without int256 (the default while the 256-bit integer kernels are unmeasured or
    # slower than the float ones) AVX2 CPUs take the AVX2 lookups, AVX-VNNI ones too;
    # AVX-512 CPUs are not affected
    off = dict(int256=False)
    assert _cq.pick_int_kernel(avx2=True, **off) == "avx2lut"
    assert _cq.pick_int_kernel(avx2=True, avxvnni=True, **off) == "avx2lut"
    assert _cq.pick_int_kernel(**off) is None
    assert _cq.pick_int_kernel(avx2=True, avx512bw=True, avxvnni=True, **off) == "avx512lut"
    assert _cq.pick_int_kernel(avx2=True, avx512bw=True, avx512vnni=True, **off) == "avx512lut"
    assert _cq.pick_int_kernel(avx2=True) == _cq.pick_int_kernel(avx2=True, int256=_cq.AUTO_INT256)
    # this CPU: 'auto' is the rule applied to what it has
    have = set(_cq.available_kernels())
    flags = dict(avx512bw="avx512bw" in have, avx512vnni="avx512vnni" in have,
                 avxvnni="avxvnni" in have, avx2="avx2" in have)
    previous = _cq.set_kernel("auto")
    try:
        if "neon" in have:      # aarch64: NEON, with dotprod where the CPU reports it
            expected = "neon_dotprod" if "neon_dotprod" in have else "neon"
        else:
            expected = _cq.pick_int_kernel(**flags) or _cq.simd_kernel()
        assert _cq.kernel_name() == expected
    finally:
        _cq.set_kernel(previous if previous in have else "auto")
    # the integer kernels a CPU can run are the ones its features allow
    assert ("avx2int" in have) == ("avx2" in have)
    assert "avxvnni" not in have or "avx2" in have
    assert "avx512vnni" not in have or "avx512bw" in have
    assert ("avx512lut" in have) == ("avx512bw" in have)
    assert ("avx2lut" in have) == ("avx2" in have)
    if "avx512lut" in have:   # the kernel of the matrices the lookups do not run
        assert _cq.lut_base_kernel() == ("avx512vnni" if "avx512vnni" in have else "avx512bw")
    if "avx2lut" in have:
        assert _cq.lut_base_kernel("avx2lut") == "avx2"


@pytest.mark.parametrize("name", ["avx2int", "avxvnni", "avx2lut"])
def test_environment_forces_a_256_bit_kernel(name):
    code = "from needle_cy import _cq; print(_cq.kernel_name(), _cq.kernel_name(a8=False))"
    env = dict(os.environ, NEEDLE_CY_CQ_KERNEL=name,
               PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(_cq.__file__))] + sys.path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    if name in _cq.available_kernels():
        assert out.stdout.split() == [name, "avx2"]
    else:   # ignored with a warning, the best kernel instead
        assert "NEEDLE_CY_CQ_KERNEL ignored" in out.stderr
        assert out.stdout.split() == [_cq.kernel_name(), _cq.kernel_name(a8=False)]


def test_neon_kernels_match_the_integer_reference_bitwise():
    """aarch64: neon (int16 halves, vmlal) and neon_dotprod (int8 planes, sdot) give the
    reference's integer numerics bit for bit (so each other's and the x86 kernels'),
    on random shapes: row counts that are odd and not multiples of the 32-row block,
    column tails, token counts that are not multiples of the matmul's 2-token tile."""
    kernels = [k for k in ("neon_dotprod", "neon") if k in _cq.available_kernels()]
    if not kernels:
        pytest.skip(f"CPU lacks {NEEDS['neon']}: the NEON kernels cannot run here")
    rng = np.random.default_rng(77)
    try:
        for trial in range(40):
            bits = int(rng.choice([1, 2, 3, 4, 5]))
            g = int(rng.choice([16, 32, 64, 128, 256]))
            rows = int(rng.integers(1, 80)) | 1
            cols = int(rng.integers(1, 4 * g))
            T = int(rng.integers(1, 12))
            W = random_cq(rng, rows, cols, bits, g)
            X = a8(rng.standard_normal((T, cols)) * rng.uniform(0.01, 100, size=(T, 1)))
            want = ref.matmul_int(W, X)
            for name in kernels:
                _cq.set_kernel(name)
                assert _cq.prepare(W).kernel(a8=True) == name
                np.testing.assert_array_equal(_cq.matmul(W, X, a8=True), want, err_msg=f"{name} {trial}")
                for t in range(min(T, 3)):
                    np.testing.assert_array_equal(_cq.matvec(W, X[t], a8=True), want[t],
                                                  err_msg=f"{name} matvec {trial}")
    finally:
        _cq.set_kernel("auto")


def test_neon_dotprod_detection_and_override():
    """aarch64: the automatic choice follows the CPU's asimddp flag (HWCAP); neon can be forced."""
    if "neon" not in _cq.available_kernels():
        pytest.skip(f"CPU lacks {NEEDS['neon']}: the NEON kernels cannot run here")
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        pass
    has_dp = "neon_dotprod" in _cq.available_kernels()
    if "Features" in flags:
        assert has_dp == (" asimddp" in flags), flags[:400]
    assert _cq.kernel_name() == ("neon_dotprod" if has_dp else "neon")
    code = "from needle_cy import _cq; print(_cq.kernel_name(), _cq.kernel_name(a8=False))"
    env = dict(os.environ, NEEDLE_CY_CQ_KERNEL="neon",
               PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(_cq.__file__))] + sys.path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["neon", "scalar"]


# ---------------------------------------------------------------------------
# the table lookups of 2- and 4-bit matrices: avx512lut (csrc/cq_lut.h) and
# avx2lut (csrc/cq_lut_avx2.h), each against reference.cq.matmul_lut
# ---------------------------------------------------------------------------

def _need_lut(name="avx512lut"):
    if name not in _cq.available_kernels():
        pytest.skip(f"CPU lacks {NEEDS[name]}: the {name} kernel cannot run here")


@pytest.fixture(params=list(_cq.LUT_KERNELS))
def lut_kernel(request):
    _need_lut(request.param)
    previous = _cq.set_kernel(request.param)
    amx = _cq.set_amx("off")   # the lookups' own numerics, also for the matmul
    yield request.param
    _cq.set_amx(amx)
    _cq.set_kernel(previous if previous in _cq.available_kernels() else "auto")


@pytest.fixture
def avx512_lut_kernel():
    _need_lut("avx512lut")
    previous = _cq.set_kernel("avx512lut")
    amx = _cq.set_amx("off")
    yield "avx512lut"
    _cq.set_amx(amx)
    _cq.set_kernel(previous if previous in _cq.available_kernels() else "auto")


@pytest.mark.parametrize("bits", [2, 5, 4])
def test_lut_row_and_token_pieces_equal_the_whole(lut_kernel, bits):
    """Rows cut anywhere (a 16- or 32-row block computed by both sides of the cut, each
    storing its own lanes) and tokens cut anywhere: the whole product bit for bit."""
    rng = np.random.default_rng(70 + bits)
    for rows, cols, g in [(75, 768, 128), (64, 300, 32), (100, 96, 16), (70, 520, 256)]:
        W = random_cq(rng, rows, cols, bits, g)
        X = a8(rng.standard_normal((11, cols)) * rng.uniform(0.01, 100, size=(11, 1)))
        assert _cq.prepare(W).kernel(a8=True) == lut_kernel
        whole = _cq.matmul(W, X, a8=True)
        np.testing.assert_array_equal(whole, ref.matmul_lut(W, X))
        for cut in (0, 5, 16, 37, rows):
            np.testing.assert_array_equal(_cq._matvec_pieces(W, X[4], cut, a8=True), whole[4])
        for row_cut, token_cut in ((16, 3), (48, 5), (64, 1), (0, 7)):
            np.testing.assert_array_equal(_cq._matmul_pieces(W, X, row_cut, token_cut, a8=True), whole)
        # without a thread scratch for the tiles' tables (a failed malloc): each group's
        # tables on the stack, the same bits
        np.testing.assert_array_equal(_cq._matmul_pieces(W, X, 16, 4, a8=True, scratch=False), whole)
        for threads in (2, 3):
            np.testing.assert_array_equal(_cq.matmul(W, X, a8=True, threads=threads), whole)


def test_lut_layout_where_it_applies(lut_kernel):
    """The layout is made for 2- and 4-bit fields (2, 3, 4 bits, ternary) in groups of
    16 … 256 with at least LUT_MIN_ROWS rows, on the first A8 product (not for float
    inputs); other matrices keep the integer kernel and its numerics."""
    rng = np.random.default_rng(80)
    x = a8(rng.standard_normal(256))
    W = random_cq(rng, _cq.LUT_MIN_ROWS, 256, 2, 128)
    cw = _cq.prepare(W)
    _cq.matvec(W, x)                               # float input: no layout
    assert not cw.lut_layout and cw.kernel(a8=True) == lut_kernel
    np.testing.assert_array_equal(_cq.matvec(W, x, a8=True), ref.matmul_lut(W, x[None])[0])
    assert cw.lut_layout and cw.lut_kernel == lut_kernel and cw.enable_lut()
    for bits, g in [(4, 128), (3, 64), (5, 16)]:
        W = random_cq(rng, 80, 2 * g + 5, bits, g)
        cw = _cq.prepare(W)
        xg = a8(rng.standard_normal(2 * g + 5))
        np.testing.assert_array_equal(_cq.matvec(W, xg, a8=True), ref.matmul_lut(W, xg[None])[0])
        assert cw.lut_layout and cw.kernel(a8=True) == lut_kernel, (bits, g)
    for rows, bits, g in [(_cq.LUT_MIN_ROWS - 1, 2, 128), (_cq.LUT_MIN_ROWS - 1, 4, 128), (80, 1, 128),
                          (80, 2, 8), (80, 4, 8)]:
        W = random_cq(rng, rows, 2 * g, bits, g)
        cw = _cq.prepare(W)
        xg = a8(rng.standard_normal(2 * g))
        got = _cq.matvec(W, xg, a8=True)
        assert not cw.lut_layout, (rows, bits, g)
        if cw.int_tables:
            base = _cq.lut_base_kernel(lut_kernel)
            if base == "avx2":      # avx2lut's base: the float kernels, the float input's bits
                assert cw.kernel(a8=True) == cw.kernel(a8=False)
                np.testing.assert_array_equal(got, _cq.matvec(W, xg))
            else:
                assert cw.kernel(a8=True) == base
                np.testing.assert_array_equal(got, ref.matmul_int(W, xg[None])[0])


def test_lut_and_integer_views_share_an_input(lut_kernel):
    """multiply_shared over a lookup matrix, a 2-bit matrix too short for the lookups and
    a ternary one (other codewords in its tables): each gets its own kernel's result
    (the input is rotated again between them)."""
    rng = np.random.default_rng(81)
    big, small = random_cq(rng, 96, 384, 2, 128), random_cq(rng, 8, 384, 2, 128)
    trits = random_cq(rng, 80, 384, 5, 128)      # 2-bit fields too, other codewords: other tables
    X = a8(rng.standard_normal((5, 384)))
    for inputs in (X, X[2]):
        got = _cq.multiply_shared([big, small, big, trits, big], inputs, a8=True)
        for W, y in zip([big, small, big, trits, big], got):
            np.testing.assert_array_equal(y, _cq.matvec(W, inputs, a8=True) if inputs.ndim == 1
                                          else _cq.matmul(W, inputs, a8=True))


@pytest.mark.parametrize("dot", ["vbmi", "vnni", "bw"])
def test_lut_dot_instantiations_give_the_reference_bits(avx512_lut_kernel, dot):
    """The three row loops of the lookups (byte tables with vpermb + vpdpbusd; int16
    tables with vpdpwssd, or vpmaddwd + vpaddd without VNNI) sum exact integers: the
    same bits as matmul_lut, matvec and matmul, 2 bits, ternary and 4 bits."""
    if dot == "vnni" and "avx512vnni" not in _cq.available_kernels():
        pytest.skip("CPU lacks AVX-512 VNNI: the vnni row loops cannot run here")
    if dot == "vbmi" and not _cq.lut_dot_available("vbmi"):
        pytest.skip("CPU lacks AVX-512 VBMI + VNNI: the vbmi row loops cannot run here")
    previous = _cq.lut_dot(dot)
    try:
        assert _cq.lut_dot() == dot
        rng = np.random.default_rng(77)
        for bits, g, rows, cols, T in [(2, 64, 70, 768, 9), (5, 32, 65, 200, 5), (2, 256, 80, 600, 1),
                                       (4, 32, 96, 384, 6), (2, 16, 64, 96, 3)]:
            W = random_cq(rng, rows, cols, bits, g)
            X = a8(rng.standard_normal((T, cols)) * rng.uniform(0.01, 100, size=(T, 1)))
            want = ref.matmul_lut(W, X)
            np.testing.assert_array_equal(_cq.matmul(W, X, a8=True), want)
            np.testing.assert_array_equal(_cq.matvec(W, X[0], a8=True), want[0])
    finally:
        _cq.lut_dot(previous)
    with pytest.raises(ValueError, match="lut_dot"):
        _cq.lut_dot("sse2")


def test_lut_arena_pieces_are_aligned_and_zeroed():
    arena = _cq.LutArena(block=1 << 20)
    pieces = [arena.zeros(n, dt) for n, dt in ((5, np.uint32), (17, np.float32), (3 << 20, np.uint8), (1, np.float32))]
    for p, (n, dt) in zip(pieces, ((5, np.uint32), (17, np.float32), (3 << 20, np.uint8), (1, np.float32))):
        assert p.shape == (n,) and p.dtype == dt and p.ctypes.data % 64 == 0 and not p.any()
        p[:] = 1
    assert pieces[0].sum() == 5 and pieces[1].sum() == 17     # no overlap


# ---------------------------------------------------------------------------
# avx2lut (csrc/cq_lut_avx2.h): vpshufb on byte tables, 32-row blocks
# ---------------------------------------------------------------------------

@pytest.fixture
def avx2_lut_kernel():
    _need_lut("avx2lut")
    previous = _cq.set_kernel("avx2lut")
    min_rows = _cq.LUT_MIN_ROWS
    _cq.LUT_MIN_ROWS = 1
    yield "avx2lut"
    _cq.LUT_MIN_ROWS = min_rows
    _cq.set_kernel(previous if previous in _cq.available_kernels() else "auto")


def test_avx2lut_random_shapes_give_the_reference_bits(avx2_lut_kernel):
    """Random shapes (rows that are not multiples of the 32-row block, columns with
    partial groups, groups of 16 … 256 at 2, 3, 4 bits and ternary: one or two int16
    chunks a group), matvec and matmul (token counts around the 4-token tile), 1 to 3
    threads, and the pieces a parallel region cuts: reference.cq.matmul_lut bit for bit."""
    rng = np.random.default_rng(2024)
    for trial in range(36):
        bits = (2, 3, 4, 5)[trial % 4]
        g = (16, 32, 64, 128, 256)[trial % 5]
        rows = int(rng.integers(1, 110))
        cols = int(rng.integers(1, 4 * g + 1))
        T = int(rng.integers(1, 11))
        W = random_cq(rng, rows, cols, bits, g)
        X = a8(rng.standard_normal((T, cols)) * rng.uniform(0.01, 100, size=(T, 1)))
        want = ref.matmul_lut(W, X)
        assert _cq.prepare(W).kernel(a8=True) == "avx2lut"
        for threads in (1, 2, 3):
            np.testing.assert_array_equal(_cq.matmul(W, X, a8=True, threads=threads), want,
                                          err_msg=f"trial {trial}: {rows}x{cols} {bits} bits g {g} T {T}")
            np.testing.assert_array_equal(_cq.matvec(W, X[-1], a8=True, threads=threads), want[-1])
        cut = 16 * int(rng.integers(0, rows // 16 + 1))
        np.testing.assert_array_equal(_cq._matmul_pieces(W, X, cut, T // 2, a8=True), want)
        np.testing.assert_array_equal(_cq._matvec_pieces(W, X[0], int(rng.integers(0, rows + 1)), a8=True), want[0])


def test_avx2lut_extreme_codes_give_the_reference_bits(avx2_lut_kernel):
    """The largest rotated codes (|k| = 127 with the signs of a Hadamard row) make table
    entries near ±32767, high bytes at both ends: the sums stay exact."""
    rng = np.random.default_rng(12)
    for g in (16, 128, 256):
        for bits in (2, 4, 5):
            W = random_cq(rng, 45, 2 * g, bits, g)
            X = a8(np.stack([np.full(2 * g, 3.5, np.float32), np.tile(ref.hadamard_matrix(g)[5] > 0, 2) * 2.0 - 1.0,
                             np.tile(ref.hadamard_matrix(g)[3] > 0, 2) * -3.0 + 1.0]))
            want = ref.matmul_lut(W, X)
            np.testing.assert_array_equal(_cq.matmul(W, X, a8=True), want, err_msg=f"g {g} bits {bits}")
            for t in range(3):
                np.testing.assert_array_equal(_cq.matvec(W, X[t], a8=True), want[t])


def test_avx2lut_other_matrices_take_the_float_kernels():
    """avx2lut's base (the default, set_avx2lut_base('avx2')): a matrix without its layout
    (1-bit fields, fewer than LUT_MIN_ROWS rows) gives the float kernel's bits on the same
    input; a list of products that mixes them with lookup matrices gives each its own."""
    _need_lut("avx2lut")
    previous = _cq.set_kernel("avx2lut")
    try:
        assert _cq.lut_base_kernel("avx2lut") == "avx2"
        rng = np.random.default_rng(13)
        big, small = random_cq(rng, 96, 384, 2, 128), random_cq(rng, 8, 384, 2, 128)
        one = random_cq(rng, 80, 384, 1, 128)
        X = a8(rng.standard_normal((5, 384)))
        for W in (small, one):
            assert _cq.prepare(W).kernel(a8=True) == "avx2"
            np.testing.assert_array_equal(_cq.matvec(W, X[1], a8=True), _cq.matvec(W, X[1]))
            np.testing.assert_array_equal(_cq.matmul(W, X, a8=True), _cq.matmul(W, X))
        assert _cq.prepare(big).kernel(a8=True) == "avx2lut"
        np.testing.assert_array_equal(_cq.matmul(big, X, a8=True), ref.matmul_lut(big, X))
        for inputs in (X, X[2]):
            got = _cq.multiply_shared([big, small, big], inputs, a8=True)
            for W, y in zip([big, small, big], got):
                np.testing.assert_array_equal(y, _cq.matvec(W, inputs, a8=True) if inputs.ndim == 1
                                              else _cq.matmul(W, inputs, a8=True))
        # the integer base on request: those matrices take avx2int's numerics
        assert _cq.set_avx2lut_base("avx2int") == "avx2"
        try:
            assert _cq.prepare(one).kernel(a8=True) == "avx2int"
            np.testing.assert_array_equal(_cq.matmul(one, X, a8=True), ref.matmul_int(one, X))
        finally:
            _cq.set_avx2lut_base("avx2")
        with pytest.raises(ValueError, match="set_avx2lut_base"):
            _cq.set_avx2lut_base("scalar")
    finally:
        _cq.set_kernel(previous if previous in _cq.available_kernels() else "auto")


def test_lut_layouts_of_both_kernels_on_one_matrix():
    """A matrix whose avx512lut layout is replaced by avx2lut's (or the reverse) keeps
    the old one alive for the views copied before, and each kernel gives matmul_lut's
    bits from its own layout (AVX-512 CPUs: both kernels)."""
    _need_lut("avx512lut")
    _need_lut("avx2lut")
    rng = np.random.default_rng(14)
    W = random_cq(rng, 100, 300, 2, 64)
    X = a8(rng.standard_normal((6, 300)))
    want = ref.matmul_lut(W, X)
    previous = _cq.set_kernel("avx512lut")
    try:
        for name in ("avx512lut", "avx2lut", "avx512lut"):
            _cq.set_kernel(name)
            np.testing.assert_array_equal(_cq.matmul(W, X, a8=True), want, err_msg=name)
            np.testing.assert_array_equal(_cq.matvec(W, X[2], a8=True), want[2], err_msg=name)
            assert _cq.prepare(W).lut_kernel == name
    finally:
        _cq.set_kernel(previous if previous in _cq.available_kernels() else "auto")
