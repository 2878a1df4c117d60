"""Writer → reader round trips of the .cact container, roles, heads, describe, make_random_archive."""
import math
import struct

import numpy as np
import pytest

from needle_cy.archive import (
    DTYPE_CQ, DTYPE_FP16, DTYPE_FP32, DTYPE_RAW, HEADER_BYTES, Archive, CQMatrix, NeedleConfig,
    body_layout, describe, write_archive,
)
from needle_cy.reference import cq
from needle_cy.testing import make_random_archive, random_config, random_tensors

SMALL = dict(layers=2, d_model=72, vocab=160, num_heads=4, num_kv_heads=2, qk_head_dim=8,
             v_head_dim=12, max_seq_len=128, mhc_lanes=2, sliding_window=16, global_layers=(1,),
             engram_slots=31, engram_orders=(2, 3), engram_sites=(0, 1))


def tiny_tokenizer(n_pieces=24):
    """A structurally valid tokenizer record (spec §2.9)."""
    out = bytearray(struct.pack("<5IBBH", n_pieces, 0, 1, 2, 3, 1, 1, 0))
    for i in range(n_pieces):
        surface = ("▁" + chr(97 + i % 26) * (1 + i % 3)).encode()
        out += struct.pack("<fBH", -float(i), 2 if i < 3 else (1 if i == 3 else 0), len(surface)) + surface
    return bytes(out)


def materialise(tensors):
    return {role: np.asarray(make()) for role, make in tensors.items()}


def write_small(path, bits=4, group_size=128, heads=True, tokenizer=True, layout="cq", **over):
    geometry = dict(SMALL, **over)
    layers = geometry.pop("layers")
    cfg = random_config(layers=layers, **geometry)
    tensors = materialise(random_tensors(cfg, seed=3, heads=heads, head_probes=2, head_queries=3,
                                         embedding_dim=16))
    write_archive(path, cfg, tensors, bits=bits, group_size=group_size,
                  tokenizer_bytes=tiny_tokenizer() if tokenizer else None, head_layout_kind=layout)
    return cfg, tensors


def expected_count(cfg, heads, tokenizer):
    per_layer = 24 + (3 if cfg.qkv_conv_taps else 0)
    through = 1 + cfg.num_layers * per_layer + 11 + 4 * len(cfg.engram_sites) + 1   # spec §2.6
    head_records = (1 + sum(7 if h == "router" else 6 for h in heads)) if heads else 0
    return through + head_records + int(tokenizer)


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("group_size", [32, 64, 128, 256])
def test_round_trip_every_width_and_group(tmp_path, bits, group_size):
    path = tmp_path / "m.cact"
    cfg, tensors = write_small(path, bits=bits, group_size=group_size)
    with Archive.open(path) as arc:
        assert arc.config == cfg
        assert len(arc.records) == expected_count(cfg, ("embedding", "confidence", "router"), True)
        assert arc.heads == ("embedding", "confidence", "router")
        assert arc.tokenizer_bytes == tiny_tokenizer()
        assert arc.codebook_group == group_size
        data = path.read_bytes()
        for rec in arc.records:
            assert rec.offset % 64 == 0
            if rec.role == "tokenizer":
                assert arc.tensor(rec.index) == tiny_tokenizer()
                continue
            original = tensors.get(rec.role)
            if rec.role == "heads.manifest":
                assert arc.tensor(rec.index).tolist() == [1.0, 2.0, 3.0]
            elif rec.dtype == DTYPE_CQ:
                head = rec.role.startswith("heads.")
                want = cq.quantize(original.reshape(rec.shape), 4 if head else bits, group_size)
                got = arc.tensor(rec.role)
                assert isinstance(got, CQMatrix) and got.bits == want.bits and got.group_size == group_size
                assert np.array_equal(got.packed, want.packed)
                assert np.array_equal(got.norms.view(np.uint16), want.norms.view(np.uint16))
                assert np.array_equal(got.codebook, want.codebook)
                assert np.array_equal(arc.dequantize(rec.role), cq.dequantize(want))
                # the blob is exactly packed rows then little-endian FP16 norms
                blob = data[rec.offset: rec.offset + rec.nbytes]
                assert blob == want.packed.tobytes() + want.norms.astype("<f2").tobytes()
            elif rec.dtype == DTYPE_FP16:
                np.testing.assert_array_equal(arc.tensor(rec.role), original.astype(np.float16).astype(np.float32))
            else:
                assert rec.dtype == DTYPE_FP32
                np.testing.assert_array_equal(arc.tensor(rec.role), original)


def test_layout_blobs_are_aligned_and_in_directory_order(tmp_path):
    path = tmp_path / "m.cact"
    write_small(path)
    data = path.read_bytes()
    with Archive.open(path) as arc:
        first = arc.records[0].offset
        dir_end = HEADER_BYTES + 4 * 28 + 44 * len(arc.records)
        assert first == -(-dir_end // 64) * 64
        assert data[dir_end:first] == b"\0" * (first - dir_end)
        for a, b in zip(arc.records, arc.records[1:]):
            assert b.offset == -(-(a.offset + a.nbytes) // 64) * 64
            assert data[a.offset + a.nbytes: b.offset] == b"\0" * (b.offset - a.offset - a.nbytes)
        last = arc.records[-1]
        assert last.offset + last.nbytes == len(data)  # no trailing pad


def test_roles_follow_the_spec_order(tmp_path):
    path = tmp_path / "m.cact"
    cfg, _ = write_small(path)
    with Archive.open(path) as arc:
        roles = [r.role for r in arc.records]
    assert roles[0] == "embedding"
    assert roles[1:28] == [f"layers.0.{n}" for n in (
        "norm_in q_proj k_proj v_proj q_taps k_taps v_taps q_norm k_norm gate_proj out_proj post_norm "
        "attn_gate pre_hada d1 d2 b2 d3 d4 w1a w1b w2a w2b w3a w3b cond_v cond_u").split()]
    i = roles.index("mhc_a_pre")
    assert roles[i:i + 11] == ["mhc_a_pre", "mhc_a_post", "mhc_a_res", "mhc_b_pre", "mhc_b_post", "mhc_b_res",
                               "mhc_phi_pre", "mhc_phi_post", "mhc_phi_res", "hada_p1", "hada_p2"]
    assert roles[i + 11:i + 15] == ["engram.0.tables", "engram.0.key_proj", "engram.0.value_proj", "engram.0.taps"]
    j = roles.index("final_norm")
    assert roles[j + 1] == "heads.manifest"
    assert roles[j + 2:j + 8] == [f"heads.embedding.{p}" for p in ("probes", "gain", "query", "row_bias", "proj", "bias")]
    assert roles[-2] == "heads.router.calibration" and roles[-1] == "tokenizer"


def test_shapes_follow_the_header_geometry(tmp_path):
    path = tmp_path / "m.cact"
    cfg, _ = write_small(path, d_model=96, num_heads=6, num_kv_heads=3, qk_head_dim=16, v_head_dim=16)
    with Archive.open(path) as arc:
        c = arc.config
        shape = {r.role: r.shape for r in arc.records}
    assert c.hada_n == 128 and c.monarch_sizes == (8, 16)
    assert shape["layers.1.q_proj"] == (96, 96) and shape["layers.1.k_proj"] == (48, 96)
    assert shape["layers.1.w1a"] == (8, 8) and shape["layers.1.w1b"] == (16, 16)
    assert shape["layers.1.cond_v"] == (96, 8) and shape["layers.1.cond_u"] == (8, 128)
    assert shape["mhc_phi_res"] == (2 * 2 * 2, 2 * 96) and shape["mhc_b_res"] == (2, 2, 2)
    assert shape["engram.1.tables"] == (c.num_engram_tables * 31, c.engram_sub_dim)
    assert shape["heads.router.probes"] == (3 * 2, 96) and shape["heads.router.row_bias"] == (3, 3, 2)
    assert shape["heads.embedding.proj"] == (16, 3 * 96)


def test_full_size_default_geometry_counts():
    # spec §2.6: through_fn = 573 for the default 20-layer model; 594 with three heads + tokenizer
    cfg = NeedleConfig()
    assert cfg == NeedleConfig.build()
    assert cfg.tensors_through_final_norm == 573 == len(body_layout(cfg))
    assert expected_count(cfg, ("embedding", "confidence", "router"), True) == 594
    assert (cfg.hada_n, cfg.monarch_sizes, cfg.engram_heads, cfg.engram_sub_dim) == (1024, (32, 32), 3, 128)


@pytest.mark.parametrize("variant", ["no_taps", "no_heads", "no_tokenizer", "no_engram", "two_heads",
                                     "fp16_heads", "many_layers"])
def test_variants_open(tmp_path, variant):
    path = tmp_path / "m.cact"
    kw = {}
    heads = True
    if variant == "no_taps":
        kw["qkv_conv_taps"] = 0
    elif variant == "no_heads":
        heads = False
    elif variant == "no_engram":
        kw["engram_sites"] = ()
    elif variant == "two_heads":
        heads = ("embedding", "router")
    elif variant == "many_layers":
        kw.update(layers=34, global_layers=(0, 33), engram_sites=(5, 33))
    layout = "fp16" if variant == "fp16_heads" else "cq"
    cfg, tensors = write_small(path, heads=heads, tokenizer=variant != "no_tokenizer", layout=layout, **kw)
    names = ("embedding", "confidence", "router") if heads is True else (heads or ())
    with Archive.open(path) as arc:
        assert arc.config == cfg
        assert arc.heads == tuple(names)
        assert len(arc.records) == expected_count(cfg, names, variant != "no_tokenizer")
        assert (arc.tokenizer_bytes is None) == (variant == "no_tokenizer")
        if variant == "no_taps":
            assert "layers.0.q_taps" not in arc.roles and arc.config.tensors_per_layer == 24
        if variant == "many_layers":
            assert arc.config.global_layers == (0, 33)  # uses global_mask_hi
        if variant == "fp16_heads":
            info = arc.head_info["router"]
            assert info.layout == "fp16" and (info.probes, info.queries, info.out) == (2, 3, 3)
            probes = arc.tensor("heads.router.probes")
            assert probes.shape == (3, 2, arc.config.d_model)
            np.testing.assert_array_equal(probes, tensors["heads.router.probes"].astype(np.float16).astype(np.float32))
        for rec in arc.records:  # every record is reachable
            arc.tensor(rec.index)


def test_mixed_widths_per_role(tmp_path):
    path = tmp_path / "m.cact"
    bits = {"default": 2, "embedding": 4, "layers.0.q_proj": 5, "layers.1.out_proj": 1, "mhc_phi_res": 3}
    write_small(path, bits=bits, group_size={"default": 64, "embedding": 32})
    with Archive.open(path) as arc:
        got = {r.role: (r.bits, r.group_size) for r in arc.records if r.dtype == DTYPE_CQ}
        assert got["embedding"] == (4, 32)
        assert got["layers.0.q_proj"] == (5, 64) and got["layers.1.out_proj"] == (1, 64)
        assert got["mhc_phi_res"] == (3, 64) and got["layers.0.k_proj"] == (2, 64)
        assert got["heads.router.proj"] == (4, 64)  # heads are always 4-bit
        assert arc.codebook_group == 64
        # the file codebook (group 64) serves group-64 records; group 32 uses §3.2's
        assert np.array_equal(arc.tensor("layers.0.k_proj").codebook, cq.codebook(2, 64))
        assert np.array_equal(arc.tensor("embedding").codebook, cq.codebook(4, 32))
        assert np.array_equal(arc.tensor("layers.0.q_proj").codebook, cq.codebook(5, 64))


def test_file_codebook_is_used_for_its_group(tmp_path):
    path = tmp_path / "m.cact"
    write_small(path)
    data = bytearray(path.read_bytes())
    # nudge the 4-bit codebook (still ascending): records at group 128 must decode with it
    cb4 = np.frombuffer(bytes(data[HEADER_BYTES + 48: HEADER_BYTES + 112]), "<f4").copy()
    cb4 *= np.float32(1.001)
    data[HEADER_BYTES + 48: HEADER_BYTES + 112] = cb4.astype("<f4").tobytes()
    path.write_bytes(bytes(data))
    with Archive.open(path) as arc:
        assert arc.codebook_group == 128
        assert np.array_equal(arc.tensor("embedding").codebook, cb4)


def test_accessors_and_close(tmp_path):
    path = tmp_path / "m.cact"
    cfg, tensors = write_small(path)
    arc = Archive.open(path)
    assert arc.tensor("layers.0.q_proj") is arc.tensor(arc.roles["layers.0.q_proj"])
    layer = arc.layer(1)
    assert set(layer) == {n for n in (
        "norm_in q_proj k_proj v_proj q_taps k_taps v_taps q_norm k_norm gate_proj out_proj post_norm "
        "attn_gate pre_hada d1 d2 b2 d3 d4 w1a w1b w2a w2b w3a w3b cond_v cond_u").split()}
    with pytest.raises(KeyError):
        arc.tensor("layers.9.q_proj")
    with pytest.raises(KeyError):
        arc.tensor(10_000)
    with pytest.raises(TypeError):
        arc.dequantize("tokenizer")
    # CQ views are C-contiguous, writable (copy-on-write) and never reach the file
    W = arc.tensor("embedding")
    assert W.packed.flags.c_contiguous and W.packed.flags.writeable
    before = path.read_bytes()
    W.packed[0, 0] ^= 0xFF
    assert path.read_bytes() == before
    arc.close()
    with pytest.raises(ValueError):
        arc.tensor("embedding")
    with Archive.open(path) as again:
        assert again.config == cfg
        assert not np.array_equal(again.tensor("embedding").packed[0, :1], W.packed[0, :1])


def test_describe(tmp_path):
    path = tmp_path / "m.cact"
    write_small(path, bits=2)
    with Archive.open(path) as arc:
        text = describe(arc)
        for name in ("d_model", "num_layers", "engram_sites", "kv_bits"):
            assert name in text
        for rec in arc.records:
            assert f" {rec.role} " in text
        cq_records = [r for r in arc.records if r.dtype == DTYPE_CQ]
        weights = sum(math.prod(r.shape) for r in cq_records)
        nbytes = sum(r.nbytes for r in cq_records)
        assert f"{8 * nbytes / weights:.3f} bits/weight" in text
        assert f"{arc.file_size:,} bytes" in text


def test_writer_rejects_bad_input(tmp_path):
    cfg = random_config(**SMALL)
    tensors = materialise(random_tensors(cfg, heads=False))
    with pytest.raises(ValueError, match="missing"):
        write_archive(tmp_path / "a.cact", cfg, {k: v for k, v in tensors.items() if k != "final_norm"})
    bad = dict(tensors, **{"layers.0.q_proj": np.zeros((3, 3), np.float32)})
    with pytest.raises(ValueError, match="layers.0.q_proj"):
        write_archive(tmp_path / "a.cact", cfg, bad)
    with pytest.raises(ValueError, match="unknown"):
        write_archive(tmp_path / "a.cact", cfg, dict(tensors, bogus=np.zeros(1)))
    with pytest.raises(ValueError, match="float16"):
        write_archive(tmp_path / "a.cact", cfg, dict(tensors, final_norm=np.full(72, 1e6, np.float32)))


def test_make_random_archive_small_and_sane(tmp_path):
    path = make_random_archive(tmp_path / "r.cact", layers=3, d_model=64, vocab=256, bits=2, group_size=64,
                               seed=5, engram_slots=31, max_seq_len=256, sliding_window=32)
    with Archive.open(path) as arc:
        c = arc.config
        assert (c.num_layers, c.d_model, c.vocab, c.num_heads, c.num_kv_heads) == (3, 64, 256, 12, 2)
        assert c.engram_sites == (3 - 1,) or c.engram_sites == tuple(i for i in range(3) if i % 4 == 3)
        assert arc.heads == ("embedding", "confidence", "router")
        assert arc.tensor("embedding").bits == 2
        for rec in arc.records:
            value = arc.dequantize(rec.index) if rec.dtype != DTYPE_RAW else None
            if value is not None:
                assert np.isfinite(value).all(), rec.role
        assert abs(float(arc.tensor("layers.0.norm_in").mean())) < 0.05  # ZC scales near 0
        assert np.array_equal(np.sort(arc.tensor("hada_p1")), np.arange(c.hada_n))
        w = arc.tensor("layers.0.w1a")
        assert 0.5 < float(np.linalg.norm(w) / np.sqrt(w.shape[0])) < 1.5  # ~orthogonal scale
    # reproducible: same seed → same bytes
    again = make_random_archive(tmp_path / "r2.cact", layers=3, d_model=64, vocab=256, bits=2, group_size=64,
                                seed=5, engram_slots=31, max_seq_len=256, sliding_window=32)
    assert again.read_bytes() == path.read_bytes()


def test_make_random_archive_cli(tmp_path):
    from needle_cy.testing.make_random_archive import main

    out = tmp_path / "cli.cact"
    assert main(["--out", str(out), "--bits", "4", "--layers", "2", "--d-model", "64", "--vocab", "200",
                 "--engram-slots", "17", "--engram-sites", "0,1", "--global-layers", "1",
                 "--no-heads", "--seed", "2"]) == 0
    with Archive.open(out) as arc:
        assert arc.config.engram_sites == (0, 1) and arc.config.global_layers == (1,)
        assert arc.heads == () and arc.tokenizer_bytes is None


def test_make_random_archive_copies_fixture_tokenizer(tmp_path):
    from conftest import fixture_path

    src = fixture_path("needle3_tiny_a", "model.cact")
    path = make_random_archive(tmp_path / "t.cact", layers=2, d_model=64, vocab=2080, heads=False,
                               engram_slots=11, tokenizer_from=src)
    with Archive.open(path) as arc, Archive.open(src) as ref:
        assert arc.tokenizer_bytes == ref.tokenizer_bytes
    with pytest.raises(ValueError, match="2048 pieces"):  # more pieces than embedding rows
        make_random_archive(tmp_path / "t2.cact", layers=2, d_model=64, vocab=1000, heads=False,
                            engram_slots=11, tokenizer_from=src)


@pytest.mark.parametrize("bits,min_corr", [(2, 0.9), (4, 0.99)])
def test_round_trip_correlation_like_official_build_test(tmp_path, bits, min_corr):
    # cactus-needle's test_build: directory tensor #2 (layer-0 q_proj) decodes to the
    # [out, in] kernel with correlation > 0.9 at 2 bits
    path = tmp_path / "m.cact"
    _, tensors = write_small(path, bits=bits)
    with Archive.open(path) as arc:
        assert arc.records[2].role == "layers.0.q_proj"
        decoded = arc.dequantize(2)
    original = tensors["layers.0.q_proj"]
    assert decoded.shape == original.shape
    assert np.corrcoef(decoded.ravel(), original.ravel())[0, 1] > min_corr
