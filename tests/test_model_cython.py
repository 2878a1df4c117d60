"""needle_cy._model.CythonEngine against the NumPy ReferenceEngine (same numerics).

* Whole-model agreement ≤ 1e-5 relative (max |Δ| over max |logit|) on both official
  fixtures and on random archives of random geometry: every CQ width (1, 2, 3, 4,
  5 = ternary), QKV taps on/off, kv_bits 8/2/3/4, with and without probe heads,
  odd widths (d not a multiple of the group), out_vocab < vocab.
* prefill + step ≡ forward; chunked prefill longer than one chunk; snapshot/restore;
  reset; ladder rungs; the wrapped KV window with and without sinks; PAD tokens
  left out of the head pools; head outputs ≡ the reference's.
* the int8 KV cache (deploy, kv_bits 8) holds exactly the float cache's values as
  codes·scale.
* 1, 2 and 3 threads give identical bits (decode and prefill split rows, tokens and
  KV heads between threads), on every CQ kernel this CPU runs (cq_kernel).
"""
import numpy as np
import pytest

from conftest import available_fixture_models, fixture_path

from needle_cy.errors import ContextOverflowError, ModelStateError
from needle_cy.model import Model
from needle_cy.testing.make_random_archive import make_random_archive

pytest.importorskip("needle_cy._model")
from needle_cy import _cq  # noqa: E402  (after the skip: a tree without built extensions)

# Every CQ kernel this CPU runs (an AVX-512 CPU also runs avx2int, avx2 and scalar): the
# thread-identity tests below hold for each of them, not only for the one 'auto' picks.
CQ_KERNELS = _cq.available_kernels()

RTOL = 1e-5
DEPLOY_FIRST_RTOL = 2e-4   # the lookups' int16 tables (avx512lut): measured up to 1.8e-4 at 4 bits
SMALL = dict(d_model=32, vocab=300, group_size=32, num_heads=4, num_kv_heads=2, qk_head_dim=8,
             v_head_dim=12, max_seq_len=160, engram_slots=97)
_ARCHIVES = {}


def rel_err(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))


def assert_close(got, want, rtol=RTOL):
    err = rel_err(got, want)
    assert err <= rtol, f"relative error {err:.3g} > {rtol}"


def assert_deploy_agrees(got, want, first_row_is_position_0=True):
    """Deploy numerics on long sequences: A8/KV rounding is a step function, so a
    last-bit difference in a matmul (CQ kernel vs dense NumPy) can flip one rounded
    value and the difference then lives on in the KV cache.  Hold the two engines to
    the official fixtures' bar for two correct float32 programs: mean |Δlogit| ≤ 0.01
    and the same greedy token wherever the top-2 margin exceeds 0.1."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.ndim == 2 and first_row_is_position_0:
        # the first position: no history to carry a flip (the lookups' int16 tables,
        # avx512lut, round each lookup by up to 2^-16 of the token's largest entry: the
        # 2-bit matrices, and the head at 4 bits)
        assert_close(got[0], want[0], rtol=DEPLOY_FIRST_RTOL)
    assert np.abs(got - want).mean() <= 0.01
    top2 = np.sort(want, axis=-1)[..., -2:]
    sure = (top2[..., 1] - top2[..., 0]) > 0.1
    assert np.array_equal(got.argmax(-1)[sure], want.argmax(-1)[sure])


@pytest.fixture(scope="module")
def archive_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cy_archives")


def archive(archive_dir, key, **kw):
    if key not in _ARCHIVES:
        args = dict(SMALL, layers=5, sliding_window=8, global_layers=(2, 4), engram_sites=(1, 3), seed=3)
        args.update(kw)
        _ARCHIVES[key] = make_random_archive(archive_dir / f"{key}.cact", **args)
    return _ARCHIVES[key]


def pair(path, numerics="deploy", **kw):
    return (Model.load(path, backend="cython", numerics=numerics, threads=2, **kw),
            Model.load(path, backend="numpy", numerics=numerics, **kw))


@pytest.fixture(params=CQ_KERNELS)
def cq_kernel(request):
    """Force one CQ kernel for the engines a test loads (set_kernel before Model.load:
    the engine lays its matrices out for the kernel in force)."""
    previous = _cq.set_kernel(request.param)
    assert _cq.kernel_name() == request.param
    yield request.param
    _cq.set_kernel(previous)


def ids_for(vocab, n, seed=5):
    return np.random.default_rng(seed).integers(1, vocab, size=n)


# ----------------------------------------------------------------- official fixtures
@pytest.mark.parametrize("name", ["needle3_tiny_a", "needle3_tiny_b"])
@pytest.mark.parametrize("numerics", ["float", "deploy"])
def test_fixture_archives_match_reference(name, numerics):
    path = fixture_path(name, "model.cact")
    cases = np.load(fixture_path(name, "cases.npz"))
    cy, ref = pair(path, numerics)
    case_names = sorted({k.split(".")[0] for k in cases.files})
    for case in case_names[:2]:
        ids = cases[f"{case}.ids"][:120]
        got, want = cy.forward(ids), ref.forward(ids)
        if numerics == "float":
            assert_close(got, want)
        else:
            assert_deploy_agrees(got, want)
    # the official logits with the quantizers off (continuous: hold to 1e-4)
    if numerics == "float":
        with_cqw = [c for c in case_names if f"{c}.logits_cqw" in cases.files]
        assert with_cqw
        case = min(with_cqw, key=lambda c: len(cases[f"{c}.ids"]))
        official = cases[f"{case}.logits_cqw"].astype(np.float32)
        assert rel_err(cy.forward(cases[f"{case}.ids"]), official) <= 1e-4


@pytest.mark.parametrize("name", ["needle3_tiny_a"])
def test_fixture_heads_and_cells(name):
    path = fixture_path(name, "model.cact")
    cases = np.load(fixture_path(name, "cases.npz"))
    ids = cases[sorted({k.split(".")[0] for k in cases.files})[0] + ".ids"]
    cy, ref = pair(path, "float")
    cy.prefill(ids[:70])
    ref.prefill(ids[:70])
    for t in ids[70:90]:
        cy.step(int(t))
        ref.step(int(t))
    hc, hr = cy.head_outputs(), ref.head_outputs()
    assert set(hc) == set(hr) == {"embedding", "confidence", "router"}
    assert_close(hc["embedding"], hr["embedding"], 1e-4)
    assert abs(hc["confidence"] - hr["confidence"]) <= 1e-4 * max(1.0, abs(hr["confidence"]))
    assert_close(hc["router"], hr["router"], 1e-4)
    lc, cc = cy.engine.forward_cells(ids[:50])
    lr, cr = ref.engine.forward_cells(ids[:50])
    assert_close(cc, cr)
    assert_close(lc, lr)


# --------------------------------------------------------------- random archives
GEOMETRIES = {
    # name: (archive kwargs, numerics)
    "w4_kv8": (dict(bits=4), "deploy"),
    "w2_kv2": (dict(bits=2, kv_bits=2), "deploy"),
    "w3_kv3_notaps": (dict(bits=3, kv_bits=3, qkv_conv_taps=0), "deploy"),
    "w1_kv4_noheads": (dict(bits=1, kv_bits=4, heads=False), "deploy"),
    "ternary_float": (dict(bits=5, out_vocab=250), "float"),
    "mixed_bits_odd_d": (dict(bits={"embedding": 2, "layers.0.q_proj": 1, "layers.1.out_proj": 5},
                              d_model=40, num_heads=2, num_kv_heads=1, qk_head_dim=10, v_head_dim=6,
                              mhc_lanes=2, engram_orders=(2,), kv_bits=8), "deploy"),
    # the shipped attention geometry (12/2 heads, dq 48, dv 64) on the int8 KV cache
    "gqa6_kv8_dv64": (dict(bits=2, d_model=96, num_heads=12, num_kv_heads=2, qk_head_dim=48,
                           v_head_dim=64, layers=3, engram_sites=(1,), global_layers=(2,)), "deploy"),
    # 6 query heads per KV head and value width 16 (the register-blocked AVX2 path)
    "gqa6_float": (dict(bits=2, d_model=96, num_heads=12, num_kv_heads=2, qk_head_dim=16,
                        v_head_dim=16, layers=3, engram_sites=(1,), global_layers=(2,)), "float"),
    "wide_heads_kv2": (dict(bits=4, d_model=64, num_heads=6, num_kv_heads=3, qk_head_dim=16,
                            v_head_dim=24, mhc_lanes=3, layers=3, engram_sites=(0, 2),
                            global_layers=(1,), sliding_window=5, kv_bits=2, qkv_conv_taps=4,
                            heads=("router",)), "deploy"),
}


@pytest.mark.parametrize("key", list(GEOMETRIES))
def test_random_archives_match_reference(archive_dir, key):
    kw, numerics = GEOMETRIES[key]
    path = archive(archive_dir, key, **kw)
    cy, ref = pair(path, numerics)
    ids = ids_for(cy.vocab_size, 90)
    full_c = cy.forward(ids)
    assert full_c.shape == (90, cy.out_vocab) and full_c.dtype == np.float32
    full_r = ref.forward(ids)
    if numerics == "float":
        assert_close(full_c, full_r)
    else:
        assert_deploy_agrees(full_c, full_r)
        # the same geometry with the quantizers off must agree tightly everywhere
        cf, rf = pair(path, "float")
        assert_close(cf.forward(ids), rf.forward(ids))
    # incremental: prefill (more than one chunk) + steps ≡ forward of the same engine
    # (chunks of 64 and single steps take other kernels than one batched forward,
    # so deploy rounding may flip here too)
    got = {69: cy.prefill(ids[:70])}
    for t in range(70, 90):
        got[t] = cy.step(int(ids[t]))
    rows = np.stack([got[t] for t in sorted(got)])
    if numerics == "float":
        assert_close(rows, full_c[sorted(got)])
    else:
        assert_deploy_agrees(rows, full_c[sorted(got)])
    assert cy.position == 90
    if cy.heads:
        ref.prefill(ids)
        hc, hr = cy.head_outputs(), ref.head_outputs()
        for name in hr:
            if numerics == "float":
                assert_close(np.atleast_1d(hc[name]), np.atleast_1d(hr[name]), 1e-4)
            else:
                assert np.allclose(hc[name], hr[name], rtol=0.02, atol=0.02)
    else:
        assert cy.head_outputs() == {}


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_threads_do_not_change_results(archive_dir, cq_kernel, threads):
    path = archive(archive_dir, "w4_kv8", bits=4)
    ids = ids_for(300, 40)
    one = Model.load(path, backend="cython", threads=1).forward(ids)
    other = Model.load(path, backend="cython", threads=threads).forward(ids)
    np.testing.assert_array_equal(other, one)


def _cache_values(engine):
    """The state's KV cache as float32 values [L, K, slot, dq] and [L, K, slot, dv]."""
    st = engine.state
    if engine.kv_storage == "float32":
        return st.k_cache.transpose(0, 1, 3, 2), st.v_cache
    L, K, nq4, cap, _ = st.k_cache.shape
    codes = (st.k_cache.astype(np.int16) - 128).transpose(0, 1, 3, 2, 4).reshape(L, K, cap, 4 * nq4)
    dq = engine.w.qk_head_dim
    k = (codes[..., :dq] * st.k_scale[..., None]).astype(np.float32)
    return k, (st.v_cache * st.v_scale[..., None]).astype(np.float32)


@pytest.mark.parametrize("key", ["w4_kv8", "gqa6_kv8_dv64"])
def test_int8_kv_cache_holds_the_float_cache_values(archive_dir, key):
    """Deploy at kv_bits 8 stores A8 codes + scales; decoded they are the former float
    cache bit for bit.  Layer 0's keys and values do not depend on attention, so the
    two storages must agree exactly there, at every position of a wrapped ring; deeper
    layers see scores rounded one way or the other (exact int32 sums vs float FMAs),
    which may flip a rounded activation, so there the logits meet the deploy bar."""
    from needle_cy._model import CythonEngine
    path = archive(archive_dir, key, **GEOMETRIES[key][0])
    w = Model.load(path, backend="cython").weights
    i8 = CythonEngine(w, "deploy", window=24, sinks=2, threads=1)
    f32 = CythonEngine(w, "deploy", window=24, sinks=2, threads=1, kv_storage="float32")
    assert i8.kv_storage == "int8" and f32.kv_storage == "float32"
    assert i8.state.k_cache.dtype == np.uint8 and i8.state.v_cache.dtype == np.int8
    ids = ids_for(w.vocab, 100, seed=2)
    rows_i8, rows_f32 = [i8.prefill(ids[:70])], [f32.prefill(ids[:70])]
    for t in ids[70:]:                       # past the window: the ring wraps
        rows_i8.append(i8.step(int(t)))
        rows_f32.append(f32.step(int(t)))
    ki, vi = _cache_values(i8)
    kf, vf = _cache_values(f32)
    np.testing.assert_array_equal(ki[0], kf[0])
    np.testing.assert_array_equal(vi[0], vf[0])
    # (rows[0] is a 70-token prefill's last position: it has history, and the integer
    # CQ matmul feeds both storages the same A8 inputs, so any flip is attention's)
    assert_deploy_agrees(np.stack(rows_i8), np.stack(rows_f32), first_row_is_position_0=False)
    # a quarter of the bytes (plus two float32 scales per slot and head)
    assert i8.state.nbytes < f32.state.nbytes
    snap = i8.snapshot()
    assert snap.k_scale.shape[2] == snap.v_cache.shape[2] == i8.capacity


def test_kv_storage_choice(archive_dir):
    from needle_cy._model import CythonEngine
    w8 = Model.load(archive(archive_dir, "w4_kv8", bits=4), backend="cython").weights
    w2 = Model.load(archive(archive_dir, "w2_kv2", bits=2, kv_bits=2), backend="cython").weights
    assert CythonEngine(w8, "deploy").kv_storage == "int8"
    assert CythonEngine(w8, "float").kv_storage == "float32"
    assert CythonEngine(w2, "deploy").kv_storage == "float32"     # CQ fake-quant: no int8 grid
    for weights, numerics in ((w8, "float"), (w2, "deploy")):
        with pytest.raises(ValueError):
            CythonEngine(weights, numerics, kv_storage="int8")
    with pytest.raises(ValueError):
        CythonEngine(w8, "deploy", kv_storage="int4")


@pytest.mark.parametrize("key", list(GEOMETRIES))
def test_decode_is_bit_identical_across_thread_counts(archive_dir, cq_kernel, key):
    """A step on several threads is one parallel region (CythonEngine._step_blocks: row
    blocks of every product split, KV heads split, the Monarch MLP split by rows,
    the probe pools on the last thread); so is a prefill chunk's block loop
    (_chunk_blocks: token ranges, rotations by token, row or token shares of the
    products, interleaved attention, pools by probe).  None of it may change
    a bit of the logits or of the pooled head outputs, in every geometry (shared and
    unshared rotations) and at more threads than KV heads, on every CQ kernel this CPU
    runs (cq_kernel: the float kernels' matmul sums a token alike in any share of the
    chunk's tokens, one token included)."""
    kw, numerics = GEOMETRIES[key]
    path = archive(archive_dir, key, **kw)
    ids = ids_for(300, 110, seed=4)
    out, heads = {}, {}
    for threads in (1, 2, 3):
        m = Model.load(path, backend="cython", numerics=numerics, threads=threads, kv_window=40, sink_tokens=3)
        rows = [m.prefill(ids[:70])]
        snap = m.snapshot()
        rows += [m.step(int(t)) for t in ids[70:]]
        heads[threads] = m.head_outputs()
        m.restore(snap)
        rows.append(m.step(int(ids[70])))
        out[threads] = np.stack(rows)
    for threads in (2, 3):
        np.testing.assert_array_equal(out[threads], out[1])
        assert heads[threads].keys() == heads[1].keys()
        for name in heads[1]:
            np.testing.assert_array_equal(np.asarray(heads[threads][name]), np.asarray(heads[1][name]))
    np.testing.assert_array_equal(out[1][-1], out[1][1])     # restore replays the same step


def test_prefill_row_shares_are_bit_identical_across_thread_counts(archive_dir, cq_kernel):
    """A geometry whose q/k/v/gate list is long enough to be cut by rows between the
    threads of one parallel region (_list_share; the small geometries above are cut by
    tokens), over three chunks: the shares must cover every row once, so 2 and 3
    threads give the 1-thread logits bit for bit."""
    path = archive(archive_dir, "rows_d256", bits=2, d_model=256, num_heads=8, num_kv_heads=2,
                   qk_head_dim=32, v_head_dim=32, layers=2, engram_sites=(1,), global_layers=(1,))
    ids = ids_for(300, 150, seed=6)         # three chunks (64 + 64 + 22) within max_seq_len 160
    one = Model.load(path, backend="cython", threads=1).forward(ids)
    for threads in (2, 3, 2, 3):
        np.testing.assert_array_equal(Model.load(path, backend="cython", threads=threads).forward(ids), one)


def test_the_schedule_gives_every_row_to_one_thread(archive_dir):
    """plan_steps plans every team size once per engine: for each team the threads'
    shares of every product are contiguous, in thread order, and cover its rows once
    (a team of one has them all)."""
    path = archive(archive_dir, "rows_d256", bits=2, d_model=256, num_heads=8, num_kv_heads=2,
                   qk_head_dim=32, v_head_dim=32, layers=2, engram_sites=(1,), global_layers=(1,))
    engine = Model.load(path, backend="cython", threads=3).engine
    whole = engine.plan_rows(1)[0]
    assert whole.shape == (8 * 2 + 2 * 1 + 1, 2)
    assert (whole[:, 0] == 0).all() and (whole[:, 1] > 0).all()
    assert whole[-1, 1] == engine.w.out_vocab                  # the head: the tied embedding's first rows
    for nt in (2, 3):
        rows = engine.plan_rows(nt)
        for p in range(whole.shape[0]):
            got = [tuple(r) for r in rows[:, p] if r[1] > r[0]]
            assert got[0][0] == 0 and got[-1][1] == whole[p, 1]
            assert all(a[1] == b[0] for a, b in zip(got, got[1:]))
    with pytest.raises(ValueError, match="plan_rows"):
        engine.plan_rows(4)


def _assert_steps_equal_across_threads(path, ids, prompt=40):
    """A prefill of ids[:prompt], then a step per later id: the logits of 2 and 3
    threads are the 1-thread logits bit for bit."""
    out = {}
    for threads in (1, 2, 3):
        m = Model.load(path, backend="cython", threads=threads)
        rows = [m.prefill(ids[:prompt])] + [m.step(int(t)) for t in ids[prompt:]]
        out[threads] = np.stack(rows)
    np.testing.assert_array_equal(out[2], out[1])
    np.testing.assert_array_equal(out[3], out[1])


@pytest.mark.parametrize("ahead", ["0", "64", "100000000"])
def test_prefetch_streams_do_not_change_a_decode_step(archive_dir, monkeypatch, cq_kernel, ahead):
    """A step's waiting threads prefetch their next rows (plan_streams in _engine_schedule.pxi,
    NEEDLE_CY_PF_AHEAD bytes ahead; 0: no streams, and the old prefetch calls instead):
    timing only, so 2- and 3-thread decode gives the 1-thread logits bit for bit with
    no budget, a line, and the whole plan."""
    path = archive(archive_dir, "rows_d256", bits=2, d_model=256, num_heads=8, num_kv_heads=2,
                   qk_head_dim=32, v_head_dim=32, layers=2, engram_sites=(1,), global_layers=(1,))
    ids = ids_for(300, 90, seed=8)
    monkeypatch.setenv("NEEDLE_CY_PF_AHEAD", ahead)
    _assert_steps_equal_across_threads(path, ids)


@pytest.mark.parametrize("team", ["2", "3", "4"])
def test_mlp_on_thread_zero_or_the_team_gives_the_same_step(archive_dir, monkeypatch, cq_kernel, team):
    """A decode step's Monarch MLP is split between the threads of a team of at least
    NEEDLE_CY_MLP_TEAM (mlp_team_min) and runs on thread 0 alone in a smaller one: 2- and
    3-thread decode give the 1-thread logits bit for bit on either side of the bound."""
    path = archive(archive_dir, "rows_d256", bits=2, d_model=256, num_heads=8, num_kv_heads=2,
                   qk_head_dim=32, v_head_dim=32, layers=2, engram_sites=(1,), global_layers=(1,))
    ids = ids_for(300, 80, seed=9)
    monkeypatch.setenv("NEEDLE_CY_MLP_TEAM", team)
    _assert_steps_equal_across_threads(path, ids)


def test_a_site_at_block_zero_steps_the_same_on_every_thread_count(archive_dir, cq_kernel):
    """Block 0's input reads the last engram site's values, which the last thread convolves
    after the sites' meetings: a meeting more there (_step_blocks), so 2 and 3 threads
    still give the 1-thread logits bit for bit."""
    path = archive(archive_dir, "site0_d256", bits=2, d_model=256, num_heads=8, num_kv_heads=2,
                   qk_head_dim=32, v_head_dim=32, layers=2, engram_sites=(0,), global_layers=(1,))
    _assert_steps_equal_across_threads(path, ids_for(300, 80, seed=10))


@pytest.mark.parametrize("sites", [(1,), (1, 2), (2, 3), (3,)])
def test_engram_sites_beside_the_mlp_step_the_same(archive_dir, monkeypatch, cq_kernel, sites):
    """A 2-thread decode step runs the engram sites on its last thread while thread 0
    runs each block's Monarch MLP and serial start (plan_sites: a site's input, key
    product, value product and conv, all done by the block before the first layer that
    reads it; 3 threads split the MLP and keep the sites' own phases): the 1-thread logits
    bit for bit, for sites soon after one another, far apart and at the last layer."""
    path = archive(archive_dir, "sites_" + "_".join(map(str, sites)), bits=2, d_model=256, num_heads=8,
                   num_kv_heads=2, qk_head_dim=32, v_head_dim=32, layers=4, engram_sites=sites,
                   global_layers=(1,))
    monkeypatch.setenv("NEEDLE_CY_SITES_LATE", "1")      # on any CPU (auto: lookup products only)
    m = Model.load(path, backend="cython", threads=2)
    engine = m.engine
    assert engine.sites_late
    layer_of = {}
    for l, layer in enumerate(m.weights.layers):
        if layer.engram_site is not None:
            layer_of.setdefault(layer.engram_site, l)
    order, upto = engine.site_plan
    assert order == tuple(sorted(layer_of, key=lambda s: (layer_of[s], s)))
    assert len(upto) == 2 * 4 and list(upto) == sorted(upto) and upto[-1] == 4 * len(sites)
    for i, s in enumerate(order):          # a site's four units by the MLP before its layer
        assert upto[2 * layer_of[s] - 1] >= 4 * (i + 1)
    if sites == (3,):                      # time enough: each unit in the first window of its kind
        assert upto == (1, 2, 2, 3, 4, 4, 4, 4)
    _assert_steps_equal_across_threads(path, ids_for(300, 70, seed=11))


def test_a_site_at_block_zero_keeps_the_sites_phases(archive_dir, monkeypatch):
    """Block 0 reading a site leaves no block before it for the last thread's units."""
    path = archive(archive_dir, "site0_d256", bits=2, d_model=256, num_heads=8, num_kv_heads=2,
                   qk_head_dim=32, v_head_dim=32, layers=2, engram_sites=(0,), global_layers=(1,))
    monkeypatch.setenv("NEEDLE_CY_SITES_LATE", "1")
    assert not Model.load(path, backend="cython", threads=2).engine.sites_late


def test_sites_late_follows_the_environment_and_the_kernel(archive_dir, monkeypatch):
    """NEEDLE_CY_SITES_LATE: 0 never, 1 wherever the archive allows, auto (default) only
    where the site products run by table lookup (avx512lut, avx2lut); a bad value is named."""
    from needle_cy import _cq
    from needle_cy._model import sites_late_mode
    path = archive(archive_dir, "rows_d256", bits=2, d_model=256, num_heads=8, num_kv_heads=2,
                   qk_head_dim=32, v_head_dim=32, layers=2, engram_sites=(1,), global_layers=(1,))
    monkeypatch.delenv("NEEDLE_CY_SITES_LATE", raising=False)
    assert sites_late_mode() == "auto"
    lut = _cq.kernel_name() in _cq.LUT_KERNELS
    assert Model.load(path, backend="cython", threads=2).engine.sites_late == lut
    path4 = archive(archive_dir, "rows4_d256", bits=4, d_model=256, num_heads=8, num_kv_heads=2,
                    qk_head_dim=32, v_head_dim=32, layers=2, engram_sites=(1,), global_layers=(1,))
    assert not Model.load(path4, backend="cython", threads=2).engine.sites_late   # 4-bit: integer kernel
    monkeypatch.setenv("NEEDLE_CY_SITES_LATE", "0")
    assert not Model.load(path, backend="cython", threads=2).engine.sites_late
    _assert_steps_equal_across_threads(path, ids_for(300, 60, seed=12))
    monkeypatch.setenv("NEEDLE_CY_SITES_LATE", "1")
    assert Model.load(path4, backend="cython", threads=2).engine.sites_late
    _assert_steps_equal_across_threads(path4, ids_for(300, 60, seed=12))
    for bad in ("yes", "2", ""):
        monkeypatch.setenv("NEEDLE_CY_SITES_LATE", bad)
        with pytest.raises(ValueError, match="NEEDLE_CY_SITES_LATE"):
            sites_late_mode()


def _need_lut_kernel(name):
    if name not in _cq.available_kernels():
        pytest.skip(f"CPU lacks {'AVX-512 F/BW/VL' if name == 'avx512lut' else 'AVX2+FMA'}: "
                    f"the {name} kernel cannot run here")


def _lut_d256(archive_dir):
    return archive(archive_dir, "rows_d256", bits=2, d_model=256, num_heads=8, num_kv_heads=2,
                   qk_head_dim=32, v_head_dim=32, layers=2, engram_sites=(1,), global_layers=(1,))


@pytest.mark.parametrize("lut_kernel", _cq.LUT_KERNELS)
def test_lut_kernel_in_the_model(archive_dir, lut_kernel):
    """Deploy numerics run the 2-bit matrices of >= LUT_MIN_ROWS rows by table lookup
    (avx512lut on AVX-512 CPUs, avx2lut forced by name on AVX2 ones).  The logits are
    the same bits at 1, 2 and 3 threads and stay within float rounding of the base
    kernel's (avx512lut: the two-product integer kernel; avx2lut: the float kernels):
    the 8-bit activation roundings they feed may flip on a near tie, so the comparison
    is the fixtures' (mean |Δ|, greedy where the margin is clear)."""
    from needle_cy import _cq
    _need_lut_kernel(lut_kernel)
    path = _lut_d256(archive_dir)
    ids = ids_for(300, 100, seed=8)
    runs = {}
    base = _cq.lut_base_kernel(lut_kernel)
    for kernel, threads in ((lut_kernel, 1), (lut_kernel, 2), (lut_kernel, 3), (base, 1)):
        previous = _cq.set_kernel(kernel)
        try:
            m = Model.load(path, backend="cython", threads=threads)
            assert _cq.prepare(m.weights.layers[0].q_proj).lut_layout == (kernel == lut_kernel)
            rows = [m.prefill(ids[:70])] + [m.step(int(t)) for t in ids[70:]]
            runs[kernel, threads] = np.stack(rows)
        finally:
            _cq.set_kernel(previous)
    lut = runs[lut_kernel, 1]
    for threads in (2, 3):
        np.testing.assert_array_equal(runs[lut_kernel, threads], lut)
    other = runs[base, 1]
    assert not np.array_equal(lut, other)            # the lookups did run
    assert np.abs(lut - other).mean() <= 0.01 * np.abs(other).mean()
    top = np.sort(other, axis=-1)
    sure = top[:, -1] - top[:, -2] > 0.1
    assert np.array_equal(lut.argmax(-1)[sure], other.argmax(-1)[sure])


@pytest.mark.parametrize("lut_kernel", _cq.LUT_KERNELS)
def test_lut_kernel_runs_only_the_head_at_4_bits(archive_dir, lut_kernel):
    """At 4 bits the engine gives the lookup layout to the head alone (its outputs are
    the logits; a body product's table rounding would be amplified by the A8 roundings
    after it).  The body's products are then those of the base kernel, bit for bit, so
    the last hidden state is too, and the logits are within the tables' rounding."""
    from needle_cy import _cq
    _need_lut_kernel(lut_kernel)
    path = archive(archive_dir, "w4_kv8", bits=4)
    ids = ids_for(300, 20, seed=9)
    runs = {}
    base = _cq.lut_base_kernel(lut_kernel)
    for kernel in (lut_kernel, base):
        previous = _cq.set_kernel(kernel)
        try:
            m = Model.load(path, backend="cython", threads=2)
            layer = m.weights.layers[0]
            assert _cq.prepare(m.weights.embedding).lut_layout == (kernel == lut_kernel)
            for W in (layer.q_proj, layer.gate_proj, layer.out_proj):
                assert not _cq.prepare(W).lut_layout
            runs[kernel] = np.stack([m.prefill(ids[:12])] + [m.step(int(t)) for t in ids[12:]])
        finally:
            _cq.set_kernel(previous)
    lut, other = runs[lut_kernel], runs[base]
    assert not np.array_equal(lut, other)            # the head's lookups did run
    assert_close(lut, other, rtol=DEPLOY_FIRST_RTOL)  # and nothing before them moved


def test_lut_kernels_give_the_same_logits(archive_dir):
    """avx2lut and avx512lut compute reference.cq.matmul_lut's numbers bit for bit, so a
    2-bit model's prefill and steps are the same bits under either (AVX-512 CPUs, where
    both run; avx2lut's base is then set to the integer numerics of avx512lut's)."""
    from needle_cy import _cq
    _need_lut_kernel("avx512lut")
    _need_lut_kernel("avx2lut")
    path = _lut_d256(archive_dir)
    ids = ids_for(300, 90, seed=10)
    runs = {}
    base = _cq.set_avx2lut_base("avx2int")
    amx = _cq.set_amx("off")      # (the tiles would take avx512lut's 4-bit and short matrices)
    try:
        for kernel in _cq.LUT_KERNELS:
            previous = _cq.set_kernel(kernel)
            try:
                m = Model.load(path, backend="cython", threads=2)
                assert _cq.prepare(m.weights.layers[0].q_proj).lut_kernel == kernel
                runs[kernel] = np.stack([m.prefill(ids[:70])] + [m.step(int(t)) for t in ids[70:]])
            finally:
                _cq.set_kernel(previous)
    finally:
        _cq.set_amx(amx)
        _cq.set_avx2lut_base(base)
    np.testing.assert_array_equal(runs["avx2lut"], runs["avx512lut"])


def test_snapshot_restore_reset(archive_dir):
    path = archive(archive_dir, "w4_kv8", bits=4)
    m = Model.load(path, backend="cython", threads=2)
    ids = ids_for(300, 30)
    m.prefill(ids[:20])
    snap = m.snapshot()
    a = m.step(7)
    heads_a = m.head_outputs()
    m.step(9)
    m.restore(snap)
    assert m.position == 20
    np.testing.assert_array_equal(m.step(7), a)
    np.testing.assert_array_equal(m.head_outputs()["embedding"], heads_a["embedding"])
    m.reset()
    assert m.position == 0
    with pytest.raises(ModelStateError):
        m.head_outputs()
    assert_close(m.prefill(ids[:20]), m.forward(ids[:20])[-1])
    other = Model.load(path, backend="cython")
    with pytest.raises(ModelStateError):
        other.restore(snap)


def test_pad_tokens_left_out_of_pools(archive_dir):
    path = archive(archive_dir, "w4_kv8", bits=4)
    cy, ref = pair(path)
    ids = ids_for(300, 25)
    ids[[0, 7, 8]] = 0
    cy.prefill(ids)
    ref.prefill(ids)
    for name, want in ref.head_outputs().items():
        assert_close(np.atleast_1d(cy.head_outputs()[name]), np.atleast_1d(want), 1e-4)


@pytest.mark.parametrize("depth", [2, 4])
def test_ladder_rung_matches_reference(archive_dir, depth):
    path = archive(archive_dir, "w4_kv8", bits=4)
    cy, ref = pair(path, depth=depth)
    assert cy.weights.num_layers == depth
    ids = ids_for(300, 30)
    # deploy numerics: the body's products are exact to float32 at 4 bits; the head takes
    # the lookups where the CPU has them (int16 tables, DEPLOY_FIRST_RTOL)
    assert_close(cy.forward(ids), ref.forward(ids), rtol=DEPLOY_FIRST_RTOL)


@pytest.mark.parametrize("sinks", [0, 3])
@pytest.mark.parametrize("numerics", ["float", "deploy"])
def test_window_wrap_matches_reference(archive_dir, sinks, numerics):
    """Beyond the KV window the ring buffer (sinks + recent) sees what the reference sees."""
    path = archive(archive_dir, "w4_kv8", bits=4)
    cy, ref = pair(path, numerics, kv_window=12, sink_tokens=sinks)
    ids = ids_for(300, 110, seed=11)
    check = assert_close if numerics == "float" else assert_deploy_agrees
    # one long prefill (several chunks, each wrapping the ring) then steps
    rows_c, rows_r = [cy.prefill(ids[:100])], [ref.prefill(ids[:100])]
    for t in ids[100:]:
        rows_c.append(cy.step(int(t)))
        rows_r.append(ref.step(int(t)))
    check(np.stack(rows_c), np.stack(rows_r))
    # a wrapped stateless forward equals the reference's too
    check(cy.forward(ids), ref.forward(ids))


def test_set_sinks_and_overflow(archive_dir):
    path = archive(archive_dir, "w4_kv8", bits=4)
    cy, ref = pair(path, "float", kv_window=12, sink_tokens=0)
    cy.set_sink_tokens(4)
    ref.set_sink_tokens(4)
    ids = ids_for(300, 40)
    assert_close(cy.prefill(ids), ref.prefill(ids))
    with pytest.raises(ModelStateError):
        cy.set_sink_tokens(2)
    with pytest.raises(ContextOverflowError):
        cy.prefill(ids_for(300, 160 - 40 + 1))
    assert cy.position == 40
    # the engine itself refuses too (direct use without Model)
    with pytest.raises(ContextOverflowError):
        cy.engine.prefill(ids_for(300, 121))


@pytest.mark.parametrize("seed,numerics", [(0, "float"), (1, "float"), (2, "float"), (3, "deploy"), (4, "deploy")])
def test_random_operation_sequences_match_reference(archive_dir, seed, numerics):
    """Fuzz the engine's state handling: random interleavings of chunked prefills, steps,
    snapshots, restores of older snapshots, resets and forwards, past the KV window,
    against the reference after every operation (float numerics: exact to 1e-5; deploy,
    i.e. the int8 KV cache: the deploy bar)."""
    path = archive(archive_dir, "w4_kv8", bits=4)
    cy, ref = pair(path, numerics, kv_window=24, sink_tokens=2)
    if numerics == "deploy":
        assert cy.engine.kv_storage == "int8"
    check = assert_close if numerics == "float" else assert_deploy_agrees
    rng = np.random.default_rng(seed)
    snaps = []
    for _ in range(40):
        op = rng.choice(["prefill", "step", "snapshot", "restore", "reset", "forward", "heads"],
                        p=[0.25, 0.3, 0.1, 0.1, 0.05, 0.1, 0.1])
        if op in ("prefill", "step"):
            ids = rng.integers(1, 300, size=int(rng.integers(1, 70)) if op == "prefill" else 1)
            if cy.position + len(ids) > 160:       # max_seq_len: refused, state untouched
                before = cy.position
                for m in (cy, ref):
                    with pytest.raises(ContextOverflowError):
                        m.prefill(ids) if op == "prefill" else m.step(int(ids[0]))
                assert cy.position == ref.position == before
            elif op == "prefill":
                check(cy.prefill(ids), ref.prefill(ids))
            else:
                check(cy.step(int(ids[0])), ref.step(int(ids[0])))
        elif op == "snapshot":
            snaps.append((cy.snapshot(), ref.snapshot(), cy.position))
        elif op == "restore" and snaps:
            sc, sr, pos = snaps[int(rng.integers(0, len(snaps)))]
            cy.restore(sc)
            ref.restore(sr)
            assert cy.position == ref.position == pos
        elif op == "reset":
            cy.reset()
            ref.reset()
        elif op == "forward":
            ids = rng.integers(0, 300, size=int(rng.integers(1, 50)))
            check(cy.forward(ids), ref.forward(ids))
        elif op == "heads" and cy.position:
            for name, want in ref.head_outputs().items():
                got = np.atleast_1d(cy.head_outputs()[name])
                if numerics == "float":
                    assert_close(got, np.atleast_1d(want), 1e-4)
                else:
                    assert np.allclose(got, want, rtol=0.02, atol=0.02)
        assert cy.position == ref.position
