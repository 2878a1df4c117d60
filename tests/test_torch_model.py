"""The PyTorch training model (needle_cy.training.torch_model) ≡ the engine.

Each random model is exported with needle_cy.archive.write_archive (CQ 4 or 2 bits),
loaded back into PyTorch from the archive's dequantized tensors, and its float logits
are compared with ``Model.load(..., numerics="float")`` on the same archive.  The
shipped model is loaded into PyTorch and compared the same way.  Error measure:
``max |torch - engine| / max |engine|`` over all positions and vocabulary rows.
"""
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is a training-only dependency (pip install '.[train]')")

from needle_cy.archive import Archive, write_archive  # noqa: E402
from needle_cy.model import Model  # noqa: E402
from needle_cy.testing.make_random_archive import random_config, random_tensors  # noqa: E402
from needle_cy.training.torch_model import NeedleTorch, cq_fake_quant  # noqa: E402

MODELS = Path(__file__).resolve().parent.parent / "needle_cy" / "models"
DEFAULT = MODELS / "default.cact"
TOL = 1e-4

# (name, geometry, heads, bits): 1 and 2 KV heads, taps on/off, engram on/off, local
# layers whose band is shorter than the sequence, all-global, 2 and 4 lanes
CONFIGS = [
    ("kv1_taps_engram_4bit", dict(num_kv_heads=1, qkv_conv_taps=3, engram_sites=(0, 2), sliding_window=8,
                                  global_layers=(1, 3)), ("confidence",), 4),
    ("kv2_notaps_noengram_2bit", dict(num_kv_heads=2, qkv_conv_taps=0, engram_sites=(), sliding_window=8,
                                      global_layers=(3,)), (), 2),
    ("kv2_taps_engram_2bit_heads", dict(num_kv_heads=2, qkv_conv_taps=3, engram_sites=(1, 3), sliding_window=6,
                                        global_layers=(2,), mhc_lanes=2, out_vocab=250),
     ("embedding", "confidence", "router"), 2),
    ("kv1_notaps_engram_allglobal_4bit", dict(num_kv_heads=1, qkv_conv_taps=0, engram_sites=(3,),
                                              sliding_window=0, global_layers=()), ("router",), 4),
]
BASE = dict(layers=4, d_model=64, vocab=300, num_heads=4, qk_head_dim=16, v_head_dim=16, max_seq_len=64,
            engram_slots=97)
GROUP = 64
IDS = np.concatenate([[2], np.random.default_rng(7).integers(4, 300, size=39)])


def rel_err(got, ref):
    return float(np.abs(np.asarray(got, np.float64) - ref).max() / np.abs(ref).max())


def _random_model(geometry, heads, bits, seed=3):
    cfg = random_config(**dict(BASE, **geometry))
    model = NeedleTorch(cfg, heads={h: (4, 4) for h in heads}, bits=bits, group_size=GROUP)
    model.load_archive_tensors({role: make() for role, make in random_tensors(cfg, seed=seed, heads=heads).items()})
    return model


@pytest.fixture(scope="module", params=CONFIGS, ids=[c[0] for c in CONFIGS])
def exported(request, tmp_path_factory):
    name, geometry, heads, bits = request.param
    model = _random_model(geometry, heads, bits)
    path = tmp_path_factory.mktemp("torch") / f"{name}.cact"
    model.export(path)
    return model, path


def test_float_logits_match_engine(exported):
    model, path = exported
    loaded, _ = NeedleTorch.from_archive(path)
    engine = Model.load(path, numerics="float")
    ref = engine.forward(IDS)
    with torch.no_grad():
        got = loaded(torch.tensor(IDS)[None])[0].numpy()
    assert got.shape == ref.shape == (len(IDS), model.cfg.out_rows)
    assert rel_err(got, ref) < TOL
    # the float (unquantized) model is NOT the archive: the check above can fail
    with torch.no_grad():
        unquantized = model(torch.tensor(IDS)[None])[0].numpy()
    assert rel_err(unquantized, ref) > 100 * TOL


def test_qat_forward_is_the_archive(exported):
    """``cq=True`` (QAT numerics) on the float parameters computes what the written archive computes."""
    model, path = exported
    ref = Model.load(path, numerics="float").forward(IDS)
    with torch.no_grad():
        got = model(torch.tensor(IDS)[None], cq=True)[0].numpy()
    assert rel_err(got, ref) < TOL


def test_heads_match_engine(exported):
    model, path = exported
    loaded, _ = NeedleTorch.from_archive(path)
    engine = Model.load(path, numerics="float")
    assert set(loaded.heads) == set(engine.heads) == set(model.heads)     # none exported when none exist
    if not model.heads:
        return
    ref = engine.engine.head_outputs_for(IDS)
    with torch.no_grad():
        got = loaded.head_outputs(torch.tensor(IDS)[None])
    assert set(got) == set(ref) == set(model.heads)
    for name in ref:
        r = np.atleast_1d(np.asarray(ref[name], np.float64))
        g = got[name][0].numpy()
        assert np.abs(g - r).max() <= TOL * max(1.0, np.abs(r).max()), name


def test_numpy_reference_agrees(exported):
    """The executable specification (NumPy reference engine) gives the same logits."""
    model, path = exported
    loaded, _ = NeedleTorch.from_archive(path)
    ref = Model.load(path, backend="numpy", numerics="float").forward(IDS)
    with torch.no_grad():
        got = loaded(torch.tensor(IDS)[None])[0].numpy()
    assert rel_err(got, ref) < TOL


def test_batched_rows_are_independent(exported):
    """A batch of two different sequences gives each its own single-sequence logits."""
    _, path = exported
    loaded, _ = NeedleTorch.from_archive(path)
    other = np.concatenate([[2], np.random.default_rng(8).integers(4, 300, size=39)])
    with torch.no_grad():
        both = loaded(torch.tensor(np.stack([IDS, other])))
        one = loaded(torch.tensor(other)[None])
    np.testing.assert_allclose(both[1].numpy(), one[0].numpy(), rtol=1e-5, atol=1e-5 * float(one.abs().max()))


def test_archive_round_trip(exported):
    """Tensors of a model loaded from an archive are that archive's dequantized values;
    exporting it again unchanged writes the same records (same logits); a changed tensor
    is re-encoded."""
    _, path = exported
    loaded, _ = NeedleTorch.from_archive(path)
    with Archive.open(path) as arch:
        for role, value in loaded.archive_tensors().items():
            np.testing.assert_array_equal(value.reshape(-1), arch.dequantize(role).reshape(-1), err_msg=role)
    again = path.with_name(path.stem + "_again.cact")
    loaded.export(again)
    a = Model.load(path, numerics="float").forward(IDS)
    b = Model.load(again, numerics="float").forward(IDS)
    np.testing.assert_array_equal(a, b)
    with torch.no_grad():
        loaded.layers[0].q_proj.mul_(0.5)
    changed = path.with_name(path.stem + "_changed.cact")
    loaded.export(changed)
    with Archive.open(changed) as arch, Archive.open(path) as orig:
        assert not np.array_equal(arch.dequantize("layers.0.q_proj"), orig.dequantize("layers.0.q_proj"))
        np.testing.assert_array_equal(arch.dequantize("layers.0.k_proj"), orig.dequantize("layers.0.k_proj"))


def test_cq_fake_quant_equals_writer():
    """The QAT quantizer gives the writer's dequantized matrix at widths 2, 3, 4 (ties lower, FP16 norms)."""
    from needle_cy.reference.cq import codebook, dequantize, quantize

    w = np.random.default_rng(0).standard_normal((37, 200)).astype(np.float32)
    for bits in (2, 3, 4):
        cb = torch.tensor(codebook(bits, 128))
        got = cq_fake_quant(torch.tensor(w), cb, 128).numpy()
        np.testing.assert_allclose(got, dequantize(quantize(w, bits, 128)), rtol=0, atol=1e-6)


def test_deploy_numerics_close_to_engine(exported):
    """``quant=True`` (A8 + KV quantizer) tracks the engine's deploy numerics.  Rounding
    flips make this a tolerance, not an identity: the engine's own two backends differ."""
    _, path = exported
    loaded, _ = NeedleTorch.from_archive(path)
    ref = Model.load(path, backend="numpy", numerics="deploy").forward(IDS)
    with torch.no_grad():
        got = loaded(torch.tensor(IDS)[None], quant=True)[0].numpy()
        flt = loaded(torch.tensor(IDS)[None])[0].numpy()
    assert rel_err(got, ref) < 0.05
    assert rel_err(got, ref) < rel_err(flt, ref)


# ------------------------------------------------------------------ shipped model
def _prompts():
    from needle_cy.prompt import first_query_text, prefix_text, render_tools_json
    from needle_cy.tokenizer import Tokenizer

    tok = Tokenizer.from_archive(str(DEFAULT))
    tools = render_tools_json(json.loads((MODELS / "home_tools.json").read_text())[:4])   # fits max_seq_len
    out = []
    for query in ("Lock the back door", "Set a timer for 10 minutes", "What's the capital of France?"):
        out.append(np.asarray([2] + tok.encode(prefix_text("", tools) + first_query_text(query),
                                               allowed_special="all"), np.int64))
    return out


@pytest.mark.skipif(not DEFAULT.exists(), reason=f"no shipped default model at {DEFAULT}")
def test_shipped_model_matches_engine():
    model, tok_bytes = NeedleTorch.from_archive(DEFAULT)
    with Archive.open(DEFAULT) as arch:
        assert tok_bytes == arch.tokenizer_bytes
        assert model.cfg == arch.config
    engine = Model.load(DEFAULT, numerics="float")
    for ids in _prompts():
        ref = engine.forward(ids)
        with torch.no_grad():
            got = model(torch.tensor(ids)[None])[0].numpy()
        assert rel_err(got, ref) < TOL
        assert int(got[-1].argmax()) == int(ref[-1].argmax())
        heads = engine.engine.head_outputs_for(ids)
        with torch.no_grad():
            th = model.head_outputs(torch.tensor(ids)[None])
        assert abs(float(th["confidence"][0, 0]) - heads["confidence"]) < TOL * max(1.0, abs(heads["confidence"]))


def test_official_reader_decodes_the_export(exported):
    """The official cactus-needle reader (an oracle, where installed) reads the exported
    archive: same geometry, and every tensor decodes to what needle_cy's reader decodes."""
    official = pytest.importorskip("needle.model.export", reason="cactus-needle is not installed (optional oracle)")
    model, path = exported
    meta, tensors = official.read_export(str(path))
    cfg = model.cfg
    assert (meta["d_model"], meta["num_layers"], meta["num_kv_heads"], meta["qkv_conv_taps"]) == \
        (cfg.d_model, cfg.num_layers, cfg.num_kv_heads, cfg.qkv_conv_taps)
    assert tuple(meta["engram_layers"]) == cfg.engram_sites and tuple(meta["global_layers"]) == cfg.global_layers
    with Archive.open(path) as arch:
        assert meta["num_tensors"] == len(arch.records) == len(tensors)
        for rec, value in zip(arch.records, tensors):
            if rec.dtype_name != "RAW":
                np.testing.assert_allclose(np.asarray(value, np.float32), arch.dequantize(rec.index),
                                           rtol=0, atol=1e-6, err_msg=rec.role)


@pytest.mark.skipif(not DEFAULT.exists(), reason=f"no shipped default model at {DEFAULT}")
def test_bf16_autocast_tracks_float32():
    """Under ``torch.autocast(bfloat16)`` the products run in bf16; the logits stay close to float32."""
    model, _ = NeedleTorch.from_archive(DEFAULT)
    ids = torch.tensor(_prompts()[0][:120])[None]
    with torch.no_grad():
        ref = model(ids)[0].numpy()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = model(ids)[0].float().numpy()
    err = rel_err(low, ref)
    assert 1e-6 < err < 0.05                       # really bf16, and still the same model
    assert (low.argmax(-1) == ref.argmax(-1)).mean() > 0.9


@pytest.mark.parametrize("T,band,chunk", [(300, 100, 128), (1000, 256, 128), (64, 8, 16), (50, 8, 128)])
def test_banded_attention_is_the_whole_mask(monkeypatch, T, band, chunk):
    """Sliding-window attention in query chunks gives the outputs and gradients of one call
    with the whole [T, T] mask (chunks shorter, equal and longer than the window)."""
    from needle_cy.training import torch_model
    monkeypatch.setattr(torch_model, "BAND_CHUNK", chunk)
    F = torch.nn.functional
    gen = torch.Generator().manual_seed(T)
    q, k, v = (torch.randn(2, 3, T, 16, generator=gen, requires_grad=True) for _ in range(3))
    t = torch.arange(T)
    diff = t[:, None] - t[None, :]
    mask = torch.zeros(T, T).masked_fill(~((diff >= 0) & (diff < band)), float("-inf"))
    whole = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.25)
    grads_whole = torch.autograd.grad(whole.square().sum(), (q, k, v))
    chunked = torch_model._banded_attention(q, k, v, mask, band, 0.25)
    grads_chunked = torch.autograd.grad(chunked.square().sum(), (q, k, v))
    assert chunked.shape == whole.shape
    torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads_chunked, grads_whole):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_float_logits_match_engine_with_window_chunks(monkeypatch, tmp_path):
    """A window shorter than the sequence, attended in chunks shorter than the window: the
    engine's logits still."""
    from needle_cy.training import torch_model
    monkeypatch.setattr(torch_model, "BAND_CHUNK", 4)
    model = _random_model(dict(num_kv_heads=2, qkv_conv_taps=3, engram_sites=(0,), sliding_window=6,
                               global_layers=(1,)), (), 4)
    path = tmp_path / "chunks.cact"
    model.export(path)
    loaded, _ = NeedleTorch.from_archive(path)
    ref = Model.load(path, numerics="float").forward(IDS)
    with torch.no_grad():
        got = loaded(torch.tensor(IDS)[None])[0].numpy()
    assert len(IDS) > 6 and rel_err(got, ref) < TOL
