"""needle_cy.model.Model with the NumPy reference engine, and needle_cy.weights (ladder).

Small random archives from needle_cy.testing.make_random_archive; the official
fixtures are covered by tests/conformance/test_fixture_logits.py.
"""
import numpy as np
import pytest

from needle_cy.archive import Archive, NeedleConfig, body_layout, write_archive
from needle_cy.errors import ContextOverflowError, LadderError, ModelStateError, TokenizerError
from needle_cy.model import Model, kv_budget_window
from needle_cy.testing.make_random_archive import make_random_archive, random_config, random_tensors
from needle_cy.weights import bind_weights, ladder_layers, ladder_order

SMALL = dict(d_model=32, vocab=300, group_size=32, num_heads=4, num_kv_heads=2, qk_head_dim=8,
             v_head_dim=12, max_seq_len=64, engram_slots=97)
IDS = np.random.default_rng(5).integers(2, 300, size=40)

_ARCHIVES = {}


@pytest.fixture(scope="module")
def archive_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("ref_archives")


def small_archive(archive_dir, key="base", **kw):
    """A cached random archive: 6 layers, global (2, 5), sites (1, 3), window 8 by default."""
    if key not in _ARCHIVES:
        args = dict(SMALL, layers=6, sliding_window=8, global_layers=(2, 5), engram_sites=(1, 3), seed=3)
        args.update(kw)
        _ARCHIVES[key] = make_random_archive(archive_dir / f"{key}.cact", **args)
    return _ARCHIVES[key]


# ------------------------------------------------------------------ incremental ≡ full
@pytest.mark.parametrize("numerics,kv_bits", [("float", 8), ("deploy", 8), ("deploy", 2), ("deploy", 3), ("deploy", 4)])
def test_prefill_step_equals_forward(archive_dir, numerics, kv_bits):
    path = small_archive(archive_dir, f"kv{kv_bits}", kv_bits=kv_bits)
    m = Model.load(path, backend="numpy", numerics=numerics)
    assert m.weights.kv_bits == kv_bits
    full = m.forward(IDS)
    assert full.shape == (len(IDS), 300) and full.dtype == np.float32
    got = {9: m.prefill(IDS[:10]), 16: m.prefill(IDS[10:17])}
    for t in range(17, len(IDS)):
        got[t] = m.step(int(IDS[t]))
    assert m.position == len(IDS)
    for t, row in got.items():
        np.testing.assert_allclose(row, full[t], rtol=1e-5, atol=1e-5 * np.abs(full).max())


def test_numerics_differ_and_kv_bits_matter(archive_dir):
    f = Model.load(small_archive(archive_dir, "kv8", kv_bits=8), backend="numpy", numerics="float").forward(IDS)
    d8 = Model.load(small_archive(archive_dir, "kv8", kv_bits=8), backend="numpy").forward(IDS)
    d2 = Model.load(small_archive(archive_dir, "kv2", kv_bits=2), backend="numpy").forward(IDS)
    assert 0 < np.abs(f - d8).max() < 0.5 * np.abs(f).max()
    assert np.abs(d2 - d8).mean() > np.abs(f - d8).mean()        # 2-bit KV is coarser than int8


def test_snapshot_restore(archive_dir):
    m = Model.load(small_archive(archive_dir), backend="numpy")
    m.prefill(IDS[:20])
    snap = m.snapshot()
    a = m.step(7)
    m.step(9)
    m.restore(snap)
    assert m.position == 20
    np.testing.assert_array_equal(m.step(7), a)
    m.reset()
    assert m.position == 0
    other = Model.load(small_archive(archive_dir), backend="numpy")
    with pytest.raises(ModelStateError):
        other.restore(snap)


def test_head_outputs_online_equals_whole_sequence(archive_dir):
    m = Model.load(small_archive(archive_dir), backend="numpy")
    with pytest.raises(ModelStateError):
        m.head_outputs()
    m.prefill(IDS[:25])
    for t in IDS[25:30]:
        m.step(int(t))
    online = m.head_outputs()
    _, cells = m.engine.forward_cells(IDS[:30])
    whole = m.engine.heads_from_cells(cells)
    assert set(online) == {"embedding", "confidence", "router"}
    assert online["embedding"].shape == (128,)
    np.testing.assert_allclose(np.linalg.norm(online["embedding"]), 1.0, rtol=1e-5)
    assert isinstance(online["confidence"], float)
    assert online["router"].shape == (3,)
    for k in online:
        np.testing.assert_allclose(online[k], whole[k], rtol=1e-5, atol=1e-6)


def test_archive_without_heads(archive_dir):
    m = Model.load(small_archive(archive_dir, "noheads", heads=False), backend="numpy")
    m.prefill(IDS[:5])
    assert m.heads == () and m.head_outputs() == {}


# ------------------------------------------------------------------ ids and arguments
def test_ids_validation(archive_dir):
    m = Model.load(small_archive(archive_dir), backend="numpy")
    for bad in ([1, 300], [-1], [[1, 2]], [], [1.5]):
        with pytest.raises(TokenizerError):
            m.prefill(bad)
    with pytest.raises(TokenizerError, match="300"):
        m.step(300)
    assert m.position == 0
    m.prefill(np.array([1, 2, 3], dtype=np.int32))
    assert m.position == 3


def test_load_arguments(archive_dir):
    path = small_archive(archive_dir)
    with pytest.raises(ValueError):
        Model.load(path, backend="torch")
    with pytest.raises(ValueError):
        Model.load(path, backend="numpy", numerics="bf16")
    with pytest.raises(ValueError):
        Model.load(path, backend="numpy", kv_window=10, sink_tokens=10)
    with pytest.raises(LadderError):
        Model.load(path, backend="numpy", depth=7)
    with pytest.raises(LadderError):
        Model.load(path, backend="numpy", depth=0)
    with pytest.raises(LadderError):
        Model.load(path, backend="numpy", layers=[0, 3, 2])
    with Archive.open(path) as arch:
        m = Model.load(arch, backend="numpy")
        assert m.config.num_layers == 6 and m.out_vocab == 300


def test_cython_backend_missing_is_a_clear_error(archive_dir, monkeypatch):
    # Simulate a source tree whose extensions were never compiled: a None entry in
    # sys.modules makes `import needle_cy._model` raise ImportError.
    import sys

    monkeypatch.setitem(sys.modules, "needle_cy._model", None)
    with pytest.raises(ImportError, match="backend='numpy'"):
        Model.load(small_archive(archive_dir), backend="cython")


# ------------------------------------------------------------------ ladder
def test_ladder_order_and_rungs_of_spec():
    assert ladder_order(20) == [0, 19, 9, 14, 4, 6, 11, 16, 2, 7, 12, 17, 1, 3, 5, 8, 10, 13, 15, 18]
    assert ladder_layers(20, 8) == [0, 4, 6, 9, 11, 14, 16, 19]
    assert ladder_layers(20, 16) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 14, 16, 17, 19]
    assert sorted(ladder_order(7)) == list(range(7))


def test_rung_remapping_of_spec(archive_dir):
    """Spec §4.11 figures for the 20-layer parent: D=16 and D=8 global layers and sites."""
    path = small_archive(archive_dir, "twenty", layers=20, global_layers=(4, 9, 14, 19),
                         engram_sites=(3, 7, 11, 15, 19), heads=("router",))
    with Archive.open(path) as arch:
        w16 = bind_weights(arch, depth=16)
        w8 = bind_weights(arch, depth=8)
        assert w16.global_layers == (4, 9, 12, 15) and w16.engram_layers == (3, 7, 10, 15)
        assert w8.global_layers == (1, 3, 5, 7) and w8.engram_layers == (4, 7)
        assert [b.lane for b in w8.layers] == [0, 1, 2, 3, 0, 1, 2, 3]
        assert w8.source_layers == (0, 4, 6, 9, 11, 14, 16, 19)
        assert w8.config.num_layers == 8 and w8.heads["router"].gain.shape[0] == 9
        assert kv_budget_window(16, w16.global_layers, w16.engram_layers, 768, 2, 48, 64, 1024, 4096) == 4096


def test_kv_budget_window_default_model():
    cfg = NeedleConfig.build()
    assert kv_budget_window(cfg.num_layers, cfg.global_layers, cfg.engram_sites, cfg.d_model,
                            cfg.num_kv_heads, cfg.qk_head_dim, cfg.v_head_dim, cfg.sliding_window,
                            cfg.max_seq_len) == 3456


def _sliced_tensors(full, parent, selected):
    """The parent's float tensors restricted to ``selected`` layers, named as a D-layer archive."""
    n = parent.mhc_lanes
    L = parent.num_layers
    kept_sites = [s for s, layer in enumerate(parent.engram_sites) if layer in selected]
    rows = [0] + [1 + s for s in selected]
    out = {}
    for role, value in full.items():
        parts = role.split(".")
        if parts[0] == "layers":
            src = int(parts[1])
            if src in selected:
                out[f"layers.{selected.index(src)}.{parts[2]}"] = value
        elif parts[0] == "engram":
            s = int(parts[1])
            if s in kept_sites:
                out[f"engram.{kept_sites.index(s)}.{parts[2]}"] = value
        elif role in ("mhc_a_pre", "mhc_a_post", "mhc_a_res", "mhc_b_pre", "mhc_b_post", "mhc_b_res"):
            out[role] = value[selected]
        elif role in ("mhc_phi_pre", "mhc_phi_post"):
            out[role] = value.reshape(L, n, -1)[selected].reshape(len(selected) * n, -1)
        elif role == "mhc_phi_res":
            out[role] = value.reshape(L, n * n, -1)[selected].reshape(len(selected) * n * n, -1)
        elif parts[0] == "heads" and parts[2] in ("probes", "gain"):
            out[role] = value[rows]
        elif parts[0] == "heads" and parts[2] == "row_bias":
            out[role] = value[:, rows]
        else:
            out[role] = value
    return out


@pytest.mark.parametrize("numerics", ["float", "deploy"])
def test_depth_equals_sliced_archive(archive_dir, numerics):
    """depth=4 of a 6-layer archive ≡ an archive written with only those 4 layers (spec §4.11)."""
    parent_cfg = random_config(layers=6, sliding_window=8, global_layers=(2, 5), engram_sites=(1, 3),
                               **{k: v for k, v in SMALL.items() if k != "group_size"})
    full = {role: make() for role, make in random_tensors(parent_cfg, seed=11).items()}
    parent = write_archive(archive_dir / "parent.cact", parent_cfg, dict(full), group_size=32)
    selected = ladder_layers(6, 4)
    assert selected == [0, 2, 3, 5]
    rung_cfg = random_config(layers=4, sliding_window=8, global_layers=(1, 3), engram_sites=(2,),
                             **{k: v for k, v in SMALL.items() if k != "group_size"})
    assert {s.role for s in body_layout(rung_cfg)} <= set(_sliced_tensors(full, parent_cfg, selected))
    rung = write_archive(archive_dir / "rung.cact", rung_cfg, _sliced_tensors(full, parent_cfg, selected),
                         group_size=32)
    a = Model.load(parent, backend="numpy", numerics=numerics, depth=4)
    b = Model.load(rung, backend="numpy", numerics=numerics)
    c = Model.load(parent, backend="numpy", numerics=numerics, layers=selected)
    whole = Model.load(parent, backend="numpy", numerics=numerics)
    la, lb, lc = a.forward(IDS), b.forward(IDS), c.forward(IDS)
    np.testing.assert_allclose(la, lb, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(la, lc)
    assert np.abs(whole.forward(IDS) - la).max() > 1e-2      # the rung is a different model
    for m in (a, b):
        m.prefill(IDS[:12])
    ha, hb = a.head_outputs(), b.head_outputs()
    for k in ha:
        np.testing.assert_allclose(ha[k], hb[k], rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ context
def test_context_overflow(archive_dir):
    m = Model.load(small_archive(archive_dir), backend="numpy")   # max_seq_len 64
    m.prefill(np.arange(2, 62))
    with pytest.raises(ContextOverflowError):
        m.prefill([5, 6, 7, 8, 9])
    assert m.position == 60
    for t in range(4):
        m.step(5 + t)
    with pytest.raises(ContextOverflowError):
        m.step(5)
    assert m.position == 64
    with pytest.raises(ContextOverflowError):
        m.forward(np.full(65, 5))
    m.reset()
    m.step(5)


@pytest.mark.parametrize("sinks", [0, 3])
def test_window_wrap_incremental_and_exact_before_wrap(archive_dir, sinks):
    path = small_archive(archive_dir)
    wide = Model.load(path, backend="numpy", numerics="float")
    m = Model.load(path, backend="numpy", numerics="float", kv_window=12, sink_tokens=sinks)
    assert m.kv_window == 12 and m.sink_tokens == sinks
    full_wide = wide.forward(IDS)
    full = m.forward(IDS)
    # up to W tokens the windowed model is the causal model
    np.testing.assert_array_equal(full[:12], full_wide[:12])
    assert np.abs(full[20:] - full_wide[20:]).max() > 1e-3
    # wrapping incrementally (ring of sinks + recent) ≡ the windowed full-sequence pass
    m.prefill(IDS[:5])
    rows = [m.step(int(t)) for t in IDS[5:]]
    np.testing.assert_allclose(np.stack(rows), full[5:], rtol=1e-5, atol=1e-5)
    # the global layers hold at most W entries, the local ones at most the band
    for layer, st in zip(m.weights.layers, m.engine.state.layers):
        assert len(st.kv_pos) <= (11 if layer.is_global else 7)
        if layer.is_global and sinks:
            assert set(range(sinks)) <= set(st.kv_pos.tolist())


def _one_layer(archive_dir, key, **kw):
    return small_archive(archive_dir, key, layers=1, engram_sites=(), qkv_conv_taps=0, heads=False, **kw)


@pytest.mark.parametrize("sinks", [0, 3])
def test_what_a_wrapped_global_layer_sees(archive_dir, sinks):
    """One global layer, no engram, no taps: logits at t depend only on sinks + last W-S tokens."""
    m = Model.load(_one_layer(archive_dir, "one_global", sliding_window=0, global_layers=(0,)),
                   backend="numpy", numerics="float", kv_window=10, sink_tokens=sinks)
    t = 30
    base = m.forward(IDS[:t + 1])[t]
    recent_start = t - (10 - sinks) + 1

    def changed(j):
        ids = IDS[:t + 1].copy()
        ids[j] = 1 if ids[j] != 1 else 2
        return np.abs(m.forward(ids)[t] - base).max() > 1e-6

    assert changed(t) and changed(recent_start)
    assert not changed(recent_start - 1) and not changed(sinks + 1)
    assert changed(0) == (sinks > 0) and changed(sinks - 1 if sinks else 0) == (sinks > 0)


def test_what_a_local_layer_sees(archive_dir):
    """Sinks never bypass the sliding band of a local layer."""
    m = Model.load(_one_layer(archive_dir, "one_local", sliding_window=4, global_layers=()),
                   backend="numpy", numerics="float", kv_window=10, sink_tokens=3)
    t = 30
    base = m.forward(IDS[:t + 1])[t]
    for j, expect in [(t - 3, True), (t - 4, False), (0, False)]:
        ids = IDS[:t + 1].copy()
        ids[j] = 1
        assert (np.abs(m.forward(ids)[t] - base).max() > 1e-6) == expect, j


def test_set_sink_tokens(archive_dir):
    path = small_archive(archive_dir)
    a = Model.load(path, backend="numpy", numerics="float", kv_window=12, sink_tokens=0)
    b = Model.load(path, backend="numpy", numerics="float", kv_window=12, sink_tokens=5)
    a.prefill(IDS[:8])
    a.set_sink_tokens(5)                  # before the first wrap: same as loading with 5
    b.prefill(IDS[:8])
    np.testing.assert_array_equal(a.prefill(IDS[8:30]), b.prefill(IDS[8:30]))
    with pytest.raises(ModelStateError):
        a.set_sink_tokens(2)
    with pytest.raises(ValueError):
        b.set_sink_tokens(12)


def test_fp16_head_layout_and_rung_heads(archive_dir):
    """Older archives store the head matrices as FP16 (probes (L+1, k, d)); rungs slice their rows."""
    path = small_archive(archive_dir, "fp16heads", head_layout="fp16")
    for depth in (None, 3):
        m = Model.load(path, backend="numpy", depth=depth)
        assert not hasattr(m.weights.heads["router"].probes, "packed")
        assert m.weights.heads["router"].probes.shape[0] == m.weights.num_layers + 1
        m.prefill(IDS[:15])
        online = m.head_outputs()
        whole = m.engine.heads_from_cells(m.engine.forward_cells(IDS[:15])[1])
        for k in online:
            np.testing.assert_allclose(online[k], whole[k], rtol=1e-5, atol=1e-6)


def test_pad_tokens_are_left_out_of_head_pooling(archive_dir):
    m = Model.load(small_archive(archive_dir), backend="numpy")
    ids = IDS[:12].copy()
    ids[[3, 7]] = 0                                   # PAD (spec §5.1: keep[t] = tok[t] != PAD)
    m.prefill(ids)
    cells = m.engine.forward_cells(ids)[1]
    masked = m.engine.heads_from_cells(cells, ids)
    unmasked = m.engine.heads_from_cells(cells)
    online = m.head_outputs()
    np.testing.assert_allclose(online["router"], masked["router"], rtol=1e-5, atol=1e-6)
    assert np.abs(online["router"] - unmasked["router"]).max() > 1e-4
