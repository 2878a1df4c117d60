"""The ``.cact`` container (spec §2): memory-mapped reader with full validation, and writer.

Layout::

    [header 196 B][codebook 28 × f32][directory num_tensors × 44 B][pad to 64]
    [blob 0][pad to 64][blob 1] ... [last blob]

Tensors carry no names: a record's role follows from its position and the header
geometry (§2.5–§2.8).  ``Archive.open`` validates everything — header geometry,
every record against the role expected at its position, offsets, alignment,
overlaps, the probe-head walk, the tokenizer record's structure, the MLP
permutations, finite values and norms — before any array is handed out, because the Cython kernels index
those arrays without bounds checks.  Any inconsistency raises
``CactFormatError`` naming the field or record, what was expected and what was
found.
"""
from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass, fields as dc_fields
from pathlib import Path

import numpy as np

from .cq_format import LLOYD_MAX_LEVELS, TERNARY_BITS, CQMatrix, codebook, cq_nbytes, field_bits_of  # noqa: F401 (re-exported)
from .errors import CactFormatError, TokenizerError
from .tokenizer_record import parse_tokenizer_record


TAG_NEEDLE3 = 0x05E12A84
TAG_NEEDLE2 = 0x05E12A83
HEADER_BYTES = 196
RECORD_BYTES = 44
CODEBOOK_LEN = 28          # cb2[4] | cb3[8] | cb4[16]
ALIGN = 64
DTYPE_FP16, DTYPE_FP32, DTYPE_CQ, DTYPE_RAW = 1, 2, 3, 4
DTYPE_NAMES = {DTYPE_FP16: "FP16", DTYPE_FP32: "FP32", DTYPE_CQ: "CQ", DTYPE_RAW: "RAW"}
COND_RANK = 8              # rank R of the MLP conditioning (spec §1.2)
HEAD_CODES = {1: "embedding", 2: "confidence", 3: "router"}
HEAD_NAMES = tuple(HEAD_CODES.values())
HEAD_OUT = {"confidence": 1, "router": 3}   # the embedding head's width is free (128 shipped)
HEAD_BITS = 4              # probe-head matrices are CQ 4-bit (spec §2.7)

# Sanity limits checked before anything is sized from the header: far above any
# Needle model, far below what would make a shape product or allocation absurd.
LIMITS = {
    "vocab": 1 << 24, "out_vocab": 1 << 24, "d_model": 1 << 16, "num_heads": 1024,
    "num_kv_heads": 1024, "num_layers": 64, "qk_head_dim": 1 << 12, "v_head_dim": 1 << 12,
    "max_seq_len": 1 << 24, "mhc_lanes": 64, "sliding_window": 1 << 24, "qkv_conv_taps": 64,
    "engram_slots": 1 << 26, "engram_sub_dim": 1 << 16, "num_engram_tables": 256,
    "engram_conv_taps": 64, "engram_conv_dilation": 64, "engram_seed_heads": 1 << 16,
    "kv_window": 1 << 24,
}
MAX_GROUP_SIZE = 1 << 16
MAX_ENGRAM_ORDER = LIMITS["engram_conv_dilation"]   # n-gram order (spec: dilation = max(orders))

# The header is 48 u32 then one f32 (spec §2.2): the scalars named below, then
# engram_orders[4], num_engram_sites, engram_sites[16], rope_theta.
_HEADER_STRUCT = struct.Struct("<48If")
_HEADER_SCALARS = (
    "tag", "num_tensors", "codebook_len", "kv_window", "kv_bits", "vocab", "out_vocab",
    "d_model", "num_heads", "num_kv_heads", "num_layers", "qk_head_dim", "v_head_dim",
    "max_seq_len", "hada_n", "mhc_lanes", "sliding_window", "global_mask_lo",
    "global_mask_hi", "qkv_conv_taps", "engram_slots", "engram_sub_dim",
    "num_engram_tables", "engram_conv_taps", "engram_conv_dilation", "engram_seed_heads",
    "num_engram_orders",
)
# struct layout of one directory record (spec §2.4)
_RECORD_STRUCT = struct.Struct("<BBH4IQQII")

LAYER_TENSORS = (
    "norm_in", "q_proj", "k_proj", "v_proj", "q_taps", "k_taps", "v_taps", "q_norm", "k_norm",
    "gate_proj", "out_proj", "post_norm", "attn_gate", "pre_hada", "d1", "d2", "b2", "d3", "d4",
    "w1a", "w1b", "w2a", "w2b", "w3a", "w3b", "cond_v", "cond_u",
)
MHC_TENSORS = ("mhc_a_pre", "mhc_a_post", "mhc_a_res", "mhc_b_pre", "mhc_b_post", "mhc_b_res",
               "mhc_phi_pre", "mhc_phi_post", "mhc_phi_res", "hada_p1", "hada_p2")
ENGRAM_TENSORS = ("tables", "key_proj", "value_proj", "taps")
HEAD_TENSORS = ("probes", "gain", "query", "row_bias", "proj", "bias", "calibration")


# ---------------------------------------------------------------------------------------
# Configuration


def _bit_length(x):
    return int(x).bit_length()


@dataclass(frozen=True)
class NeedleConfig:
    """Every header field by its spec name (§2.2), plus derived geometry (§1.2)."""

    vocab: int = 16384
    out_vocab: int = 0
    d_model: int = 768
    num_heads: int = 12
    num_kv_heads: int = 2
    num_layers: int = 20
    qk_head_dim: int = 48
    v_head_dim: int = 64
    max_seq_len: int = 4096
    hada_n: int = 1024
    mhc_lanes: int = 4
    sliding_window: int = 1024
    global_layers: tuple = (4, 9, 14, 19)
    qkv_conv_taps: int = 3
    engram_slots: int = 18432
    engram_sub_dim: int = 128
    num_engram_tables: int = 6
    engram_conv_taps: int = 4
    engram_conv_dilation: int = 3
    engram_seed_heads: int = 0
    engram_orders: tuple = (2, 3)
    engram_sites: tuple = (3, 7, 11, 15, 19)
    rope_theta: float = 100000.0
    kv_window: int = 0
    kv_bits: int = 8

    @classmethod
    def build(cls, vocab=16384, out_vocab=0, d_model=768, num_heads=12, num_kv_heads=2,
              num_layers=20, qk_head_dim=48, v_head_dim=64, max_seq_len=4096, mhc_lanes=4,
              sliding_window=1024, global_layers=(4, 9, 14, 19), qkv_conv_taps=3,
              engram_slots=18432, engram_orders=(2, 3), engram_heads=0, engram_seed_heads=0,
              engram_sites=(3, 7, 11, 15, 19), rope_theta=100000.0, kv_window=0, kv_bits=8):
        """A config from the model's training fields (§1.1), deriving the header's rest (§1.2)."""
        orders = tuple(int(o) for o in engram_orders)
        heads_per_order = engram_heads or max(1, d_model // (max(1, len(orders)) * 128))
        tables = len(orders) * heads_per_order
        return cls(
            vocab=vocab, out_vocab=out_vocab, d_model=d_model, num_heads=num_heads,
            num_kv_heads=num_kv_heads, num_layers=num_layers, qk_head_dim=qk_head_dim,
            v_head_dim=v_head_dim, max_seq_len=max_seq_len,
            hada_n=1 << _bit_length(d_model - 1), mhc_lanes=mhc_lanes,
            sliding_window=sliding_window, global_layers=tuple(sorted(global_layers)),
            qkv_conv_taps=qkv_conv_taps, engram_slots=engram_slots,
            engram_sub_dim=d_model // tables if tables else 0, num_engram_tables=tables,
            engram_conv_taps=4, engram_conv_dilation=max(orders) if orders else 0,
            engram_seed_heads=engram_seed_heads, engram_orders=orders,
            engram_sites=tuple(sorted(engram_sites)), rope_theta=float(rope_theta),
            kv_window=kv_window, kv_bits=kv_bits or 8,
        )

    # derived geometry ------------------------------------------------------------------
    @property
    def out_rows(self):
        """Rows of the embedding used as the output head."""
        return self.out_vocab or self.vocab

    @property
    def kv_groups(self):
        """Query heads per KV head (G = H/K)."""
        return self.num_heads // self.num_kv_heads

    @property
    def engram_heads(self):
        """Hash heads per order E = NT / len(orders)."""
        return self.num_engram_tables // max(1, len(self.engram_orders))

    @property
    def num_engram_sites(self):
        return len(self.engram_sites)

    @property
    def monarch_sizes(self):
        """(ba, bb) of the Monarch factors: ba = 1 << (bit_length(N−1)//2), bb = N/ba."""
        ba = 1 << (_bit_length(self.hada_n - 1) // 2)
        return ba, self.hada_n // ba

    @property
    def cond_rank(self):
        return COND_RANK

    @property
    def probe_rows(self):
        """Cell rows of the probe heads: input embedding + one per block."""
        return self.num_layers + 1

    @property
    def tensors_per_layer(self):
        return 24 + (3 if self.qkv_conv_taps > 0 else 0)

    @property
    def tensors_through_final_norm(self):
        """Records from the embedding to final_norm (spec §2.6)."""
        return 1 + self.num_layers * self.tensors_per_layer + 11 + 4 * self.num_engram_sites + 1

    @property
    def global_mask(self):
        mask = 0
        for layer in self.global_layers:
            mask |= 1 << layer
        return mask

    def is_global(self, layer: int) -> bool:
        """A layer attends over the whole context (no sliding band)."""
        return self.sliding_window == 0 or layer in self.global_layers

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dc_fields(self)}


def _check_config(cfg, fail):
    """Consistency of the header geometry; ``fail(field, msg)`` raises."""
    for name, limit in LIMITS.items():
        value = getattr(cfg, name)
        if value > limit:
            fail(name, f"expected at most {limit}, found {value}")
    for name in ("vocab", "d_model", "num_heads", "num_kv_heads", "num_layers", "qk_head_dim",
                 "v_head_dim", "max_seq_len", "mhc_lanes"):
        if getattr(cfg, name) < 1:
            fail(name, f"expected >= 1, found {getattr(cfg, name)}")
    if cfg.out_vocab > cfg.vocab:
        fail("out_vocab", f"expected <= vocab ({cfg.vocab}), found {cfg.out_vocab}")
    if cfg.num_heads % cfg.num_kv_heads:
        fail("num_kv_heads", f"expected a divisor of num_heads ({cfg.num_heads}), found {cfg.num_kv_heads}")
    if cfg.qk_head_dim % 2:
        fail("qk_head_dim", f"expected an even width (RoPE rotates pairs), found {cfg.qk_head_dim}")
    expect_n = 1 << _bit_length(cfg.d_model - 1)
    if cfg.hada_n != expect_n:
        fail("hada_n", f"expected {expect_n} (smallest power of two >= d_model {cfg.d_model}), found {cfg.hada_n}")
    if cfg.kv_bits not in (2, 3, 4, 8):
        fail("kv_bits", f"expected 2, 3, 4 or 8, found {cfg.kv_bits}")
    if not (math.isfinite(cfg.rope_theta) and cfg.rope_theta > 0):
        fail("rope_theta", f"expected a finite positive value, found {cfg.rope_theta}")
    if any(layer >= cfg.num_layers for layer in cfg.global_layers):
        fail("global_mask", f"global layer {max(cfg.global_layers)} >= num_layers {cfg.num_layers}")
    orders = cfg.engram_orders
    if any(o < 1 for o in orders):
        fail("engram_orders", f"expected orders >= 1, found {orders}")
    if any(o > MAX_ENGRAM_ORDER for o in orders):
        # an n-gram order sizes the token history every prefill keeps; the spec's conv dilation
        # is max(orders) and is itself bounded by LIMITS["engram_conv_dilation"]
        fail("engram_orders", f"expected orders <= {MAX_ENGRAM_ORDER}, found {orders}")
    sites = cfg.engram_sites
    if list(sites) != sorted(set(sites)):
        fail("engram_sites", f"expected strictly ascending layer indices, found {sites}")
    if sites and sites[-1] >= cfg.num_layers:
        fail("engram_sites", f"site layer {sites[-1]} >= num_layers {cfg.num_layers}")
    if sites:
        if not orders:
            fail("num_engram_orders", "engram sites present but no engram orders")
        if cfg.num_engram_tables < 1 or cfg.num_engram_tables % len(orders):
            fail("num_engram_tables", f"expected a positive multiple of {len(orders)} orders, found {cfg.num_engram_tables}")
        for name in ("engram_slots", "engram_sub_dim", "engram_conv_taps", "engram_conv_dilation"):
            if getattr(cfg, name) < 1:
                fail(name, f"expected >= 1 when engram sites are present, found {getattr(cfg, name)}")
        if cfg.num_engram_tables * cfg.engram_sub_dim > cfg.d_model:
            fail("engram_sub_dim", f"tables × sub_dim ({cfg.num_engram_tables} × {cfg.engram_sub_dim}) exceeds d_model {cfg.d_model}")


# ---------------------------------------------------------------------------------------
# Expected layout (shared by reader and writer)


@dataclass(frozen=True)
class Slot:
    """What the record at one position must be: role, dtype code, shape."""

    role: str
    dtype: int
    shape: tuple


def body_layout(cfg):
    """Records from the embedding through final_norm, in file order (spec §2.5)."""
    d, L, n, N = cfg.d_model, cfg.num_layers, cfg.mhc_lanes, cfg.hada_n
    H, K, dq, dv, taps = cfg.num_heads, cfg.num_kv_heads, cfg.qk_head_dim, cfg.v_head_dim, cfg.qkv_conv_taps
    ba, bb = cfg.monarch_sizes
    R = COND_RANK
    out = [Slot("embedding", DTYPE_CQ, (cfg.vocab, d))]
    per_layer = {
        "norm_in": (DTYPE_FP16, (d,)), "q_proj": (DTYPE_CQ, (H * dq, d)),
        "k_proj": (DTYPE_CQ, (K * dq, d)), "v_proj": (DTYPE_CQ, (K * dv, d)),
        "q_taps": (DTYPE_FP16, (taps, H * dq)), "k_taps": (DTYPE_FP16, (taps, K * dq)),
        "v_taps": (DTYPE_FP16, (taps, K * dv)), "q_norm": (DTYPE_FP16, (dq,)),
        "k_norm": (DTYPE_FP16, (dq,)), "gate_proj": (DTYPE_CQ, (H * dv, d)),
        "out_proj": (DTYPE_CQ, (d, H * dv)), "post_norm": (DTYPE_FP16, (d,)),
        "attn_gate": (DTYPE_FP16, (1,)), "pre_hada": (DTYPE_FP16, (d,)),
        "d1": (DTYPE_FP16, (N,)), "d2": (DTYPE_FP16, (N,)), "b2": (DTYPE_FP16, (N,)),
        "d3": (DTYPE_FP16, (N,)), "d4": (DTYPE_FP16, (N,)),
        "w1a": (DTYPE_FP16, (ba, ba)), "w1b": (DTYPE_FP16, (bb, bb)),
        "w2a": (DTYPE_FP16, (ba, ba)), "w2b": (DTYPE_FP16, (bb, bb)),
        "w3a": (DTYPE_FP16, (ba, ba)), "w3b": (DTYPE_FP16, (bb, bb)),
        "cond_v": (DTYPE_FP16, (d, R)), "cond_u": (DTYPE_FP16, (R, N)),
    }
    for i in range(L):
        for name in LAYER_TENSORS:
            if name.endswith("_taps") and taps == 0:
                continue
            dtype, shape = per_layer[name]
            out.append(Slot(f"layers.{i}.{name}", dtype, shape))
    out += [
        Slot("mhc_a_pre", DTYPE_FP16, (L,)), Slot("mhc_a_post", DTYPE_FP16, (L,)),
        Slot("mhc_a_res", DTYPE_FP16, (L,)), Slot("mhc_b_pre", DTYPE_FP16, (L, n)),
        Slot("mhc_b_post", DTYPE_FP16, (L, n)), Slot("mhc_b_res", DTYPE_FP16, (L, n, n)),
        Slot("mhc_phi_pre", DTYPE_CQ, (L * n, n * d)), Slot("mhc_phi_post", DTYPE_CQ, (L * n, n * d)),
        Slot("mhc_phi_res", DTYPE_CQ, (L * n * n, n * d)),
        Slot("hada_p1", DTYPE_FP32, (N,)), Slot("hada_p2", DTYPE_FP32, (N,)),
    ]
    NT, sub = cfg.num_engram_tables, cfg.engram_sub_dim
    for s in range(cfg.num_engram_sites):
        out += [
            Slot(f"engram.{s}.tables", DTYPE_CQ, (NT * cfg.engram_slots, sub)),
            Slot(f"engram.{s}.key_proj", DTYPE_CQ, (d, NT * sub)),
            Slot(f"engram.{s}.value_proj", DTYPE_CQ, (d, NT * sub)),
            Slot(f"engram.{s}.taps", DTYPE_FP16, (cfg.engram_conv_taps, d)),
        ]
    out.append(Slot("final_norm", DTYPE_FP16, (d,)))
    return out


def head_layout(cfg, head, k, q, out_dim, layout="cq"):
    """The records of one probe head (spec §2.7); layout "cq" (current) or "fp16" (older)."""
    rows, d = cfg.probe_rows, cfg.d_model
    mat = DTYPE_CQ if layout == "cq" else DTYPE_FP16
    probes_shape = (rows * k, d) if layout == "cq" else (rows, k, d)
    slots = [
        Slot(f"heads.{head}.probes", mat, probes_shape),
        Slot(f"heads.{head}.gain", DTYPE_FP16, (rows, k)),
        Slot(f"heads.{head}.query", mat, (q, d)),
        Slot(f"heads.{head}.row_bias", DTYPE_FP16, (q, rows, k)),
        Slot(f"heads.{head}.proj", mat, (out_dim, q * d)),
        Slot(f"heads.{head}.bias", DTYPE_FP16, (out_dim,)),
    ]
    if head == "router":
        slots.append(Slot(f"heads.{head}.calibration", DTYPE_FP16, (3,)))
    return slots


@dataclass(frozen=True)
class HeadInfo:
    """Geometry of a probe head found in the archive."""

    name: str
    probes: int       # k, probes per cell row
    queries: int      # q
    out: int          # output width
    layout: str       # "cq" ((L+1)·k, d) CQ matrices, or "fp16" (L+1, k, d) older layout


# ---------------------------------------------------------------------------------------
# Records


@dataclass(frozen=True)
class Record:
    """One directory record (spec §2.4) and the role its position gives it."""

    index: int
    dtype: int
    ndim: int
    shape: tuple
    offset: int
    nbytes: int
    group_size: int
    bits: int
    role: str = ""

    @property
    def dtype_name(self):
        return DTYPE_NAMES.get(self.dtype, f"?{self.dtype}")

    @property
    def numel(self):
        return math.prod(self.shape) if self.shape else 0


def _dtype_nbytes(dtype, shape, group_size=0, bits=0):
    if dtype == DTYPE_FP16:
        return 2 * math.prod(shape)
    if dtype == DTYPE_FP32:
        return 4 * math.prod(shape)
    if dtype == DTYPE_CQ:
        return cq_nbytes(shape[0], shape[1], bits, group_size)
    return None


# ---------------------------------------------------------------------------------------
# Reader


# What to do about a malformed archive, appended to every CactFormatError of the reader.
CUT_SHORT = ("the file is cut short (an interrupted download or copy?): download or copy it "
             "again in full")
DAMAGED = ("the file is damaged or was not written as a Needle 3 .cact archive: download it "
           "or export it again")


class _Fail:
    """Builds CactFormatError messages with a consistent 'where: what; what to do' shape."""

    def __init__(self, source):
        self.source = source

    def header(self, name, msg, fix=DAMAGED):
        raise CactFormatError(f"{self.source}: header field {name}: {msg}; {fix}")

    def record(self, rec_index, role, msg, fix=DAMAGED):
        where = f"record {rec_index}" + (f" ({role})" if role else "")
        raise CactFormatError(f"{self.source}: {where}: {msg}; {fix}")

    def file(self, msg, fix=DAMAGED):
        raise CactFormatError(f"{self.source}: {msg}; {fix}")


def _codebook_group(cb4):
    """Group size whose Lloyd–Max 4-bit codebook the file's cb4 is (128 if none fits)."""
    levels = np.array(LLOYD_MAX_LEVELS[4])
    best, best_err = 128, np.inf
    for p in range(3, 17):
        g = 1 << p
        err = np.max(np.abs(cb4 - levels / math.sqrt(g))) / (levels[-1] / math.sqrt(g))
        if err < best_err:
            best, best_err = g, err
    return best if best_err < 1e-3 else 128


class Archive:
    """A validated, memory-mapped ``.cact`` archive.

    Use ``Archive.open(path)`` (or ``Archive.from_bytes(data)``); close with
    ``close()`` or a ``with`` block.  Attributes: ``config`` (NeedleConfig),
    ``records`` (list of Record), ``roles`` (role → record index), ``heads``
    (names in manifest order), ``head_info`` (name → HeadInfo),
    ``tokenizer_bytes`` (bytes or None), ``tokenizer_record`` (its parsed, validated
    ``TokenizerRecord``, or None), ``codebooks`` (bits → file codebook),
    ``path``, ``file_size``.
    """

    def __init__(self, data, source="<bytes>", path=None):
        self._data = data
        self.path = path
        self.source = source
        self._cache = {}
        self._closed = False
        try:
            self._parse()
        except CactFormatError:
            raise
        except (struct.error, IndexError, KeyError, ValueError, TypeError, OverflowError) as exc:
            # Safety net: every check above should have caught the problem with a precise
            # message; if one slipped through, still report a format error, never a crash.
            raise CactFormatError(f"{source}: malformed archive (safety net): {type(exc).__name__} "
                                  f"while validating the file: {exc}; {DAMAGED}") from exc

    # construction ------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike) -> "Archive":
        """Memory-map and validate an archive file."""
        path = Path(path)
        size = path.stat().st_size
        if size < HEADER_BYTES:
            raise CactFormatError(
                f"{path}: file is {size} bytes, shorter than the {HEADER_BYTES}-byte header; {CUT_SHORT}")
        # copy-on-write mapping: views are writable for Cython memoryviews, the file is never touched
        data = np.memmap(path, dtype=np.uint8, mode="c")
        return cls(data.view(np.ndarray), source=str(path), path=path)

    @classmethod
    def from_bytes(cls, data: bytes, source: str = "<bytes>") -> "Archive":
        """Validate an archive held in memory (tests, embedded models)."""
        buf = np.frombuffer(bytes(data), dtype=np.uint8).copy()
        if buf.size < HEADER_BYTES:
            raise CactFormatError(
                f"{source}: archive is {buf.size} bytes, shorter than the {HEADER_BYTES}-byte header; "
                f"{CUT_SHORT}")
        return cls(buf, source=source)

    def close(self) -> None:
        """Drop the mapping (released by the OS once no returned view is alive)."""
        self._data = None
        self._cache = {}
        self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def file_size(self):
        return self._size

    def __repr__(self):
        c = self.config
        return (f"<Archive {self.source}: {len(self.records)} tensors, {c.num_layers} layers, "
                f"d_model {c.d_model}, vocab {c.vocab}, heads {list(self.heads)}>")

    # parsing -----------------------------------------------------------------------
    def _parse(self):
        fail = _Fail(self.source)
        data = self._data
        size = self._size = int(data.size)
        if size < HEADER_BYTES:
            fail.file(f"file is {size} bytes, shorter than the {HEADER_BYTES}-byte header", CUT_SHORT)
        values = _HEADER_STRUCT.unpack_from(data, 0)
        hdr = dict(zip(_HEADER_SCALARS, values[: len(_HEADER_SCALARS)]))
        self.header = hdr
        if hdr["tag"] != TAG_NEEDLE3:
            if hdr["tag"] == TAG_NEEDLE2:
                fail.header("tag", "Needle 2 archive (0x05E12A83); only Needle 3 (0x05E12A84) is supported",
                            "export the model again in the Needle 3 format")
            fail.header("tag", f"expected 0x{TAG_NEEDLE3:08X} (Needle 3), found 0x{hdr['tag']:08X}",
                        "this is not a Needle 3 .cact archive (or its start is damaged): pass the "
                        "path of one")
        if hdr["codebook_len"] != CODEBOOK_LEN:
            fail.header("codebook_len", f"expected {CODEBOOK_LEN}, found {hdr['codebook_len']}")
        n_tensors = hdr["num_tensors"]
        dir_start = HEADER_BYTES + 4 * CODEBOOK_LEN
        if n_tensors < 1:
            fail.header("num_tensors", f"expected >= 1, found {n_tensors}")
        dir_end = dir_start + RECORD_BYTES * n_tensors
        if dir_end > size:
            fail.header("num_tensors", f"directory of {n_tensors} records needs {dir_end} bytes, file has {size}",
                        CUT_SHORT)

        rest = values[len(_HEADER_SCALARS):]
        orders_raw, n_sites, sites_raw, theta = rest[0:4], rest[4], rest[5:21], rest[21]
        n_orders = hdr["num_engram_orders"]
        if n_orders > 4:
            fail.header("num_engram_orders", f"expected <= 4, found {n_orders}")
        if any(orders_raw[n_orders:]):
            fail.header("engram_orders", f"unused entries must be 0, found {orders_raw}")
        if n_sites > 16:
            fail.header("num_engram_sites", f"expected <= 16, found {n_sites}")
        if any(sites_raw[n_sites:]):
            fail.header("engram_sites", f"unused entries must be 0, found {sites_raw}")
        mask = (hdr["global_mask_hi"] << 32) | hdr["global_mask_lo"]
        cfg = NeedleConfig(
            vocab=hdr["vocab"], out_vocab=hdr["out_vocab"], d_model=hdr["d_model"],
            num_heads=hdr["num_heads"], num_kv_heads=hdr["num_kv_heads"],
            num_layers=hdr["num_layers"], qk_head_dim=hdr["qk_head_dim"],
            v_head_dim=hdr["v_head_dim"], max_seq_len=hdr["max_seq_len"], hada_n=hdr["hada_n"],
            mhc_lanes=hdr["mhc_lanes"], sliding_window=hdr["sliding_window"],
            global_layers=tuple(i for i in range(64) if mask >> i & 1),
            qkv_conv_taps=hdr["qkv_conv_taps"], engram_slots=hdr["engram_slots"],
            engram_sub_dim=hdr["engram_sub_dim"], num_engram_tables=hdr["num_engram_tables"],
            engram_conv_taps=hdr["engram_conv_taps"],
            engram_conv_dilation=hdr["engram_conv_dilation"],
            engram_seed_heads=hdr["engram_seed_heads"], engram_orders=tuple(orders_raw[:n_orders]),
            engram_sites=tuple(sites_raw[:n_sites]), rope_theta=float(theta),
            kv_window=hdr["kv_window"], kv_bits=hdr["kv_bits"],
        )
        _check_config(cfg, fail.header)
        self.config = cfg

        # codebook block
        cb = np.frombuffer(data, dtype="<f4", count=CODEBOOK_LEN, offset=HEADER_BYTES).astype(np.float32)
        self.codebooks = {}
        start = 0
        for bits in (2, 3, 4):
            part = cb[start: start + (1 << bits)]
            start += 1 << bits
            if not np.isfinite(part).all() or np.any(np.diff(part) <= 0):
                fail.file(f"codebook block: the {bits}-bit codebook must be finite and strictly ascending, found {part.tolist()}")
            self.codebooks[bits] = part
        self.codebook_group = _codebook_group(self.codebooks[4])

        # directory
        records = []
        for i in range(n_tensors):
            (dtype, ndim, pad, s0, s1, s2, s3, offset, nbytes, group, bits) = _RECORD_STRUCT.unpack_from(
                data, dir_start + RECORD_BYTES * i)
            shape4 = (s0, s1, s2, s3)
            if dtype not in DTYPE_NAMES:
                fail.record(i, "", f"dtype expected 1 (FP16), 2 (FP32), 3 (CQ) or 4 (RAW), found {dtype}")
            if ndim > 4:
                fail.record(i, "", f"ndim expected 0..4, found {ndim}")
            if pad:
                fail.record(i, "", f"padding field expected 0, found {pad}")
            if any(shape4[ndim:]):
                fail.record(i, "", f"unused shape entries must be 0, found shape {list(shape4)} with ndim {ndim}")
            if offset % ALIGN:
                fail.record(i, "", f"offset {offset} is not a multiple of {ALIGN}")
            if offset < dir_end:
                fail.record(i, "", f"offset {offset} lies inside the header/directory (ends at {dir_end})")
            if offset + nbytes > size:
                needed = max(sum(_RECORD_STRUCT.unpack_from(data, dir_start + RECORD_BYTES * j)[7:9])
                             for j in range(n_tensors))
                fail.record(i, "", f"blob [{offset}, {offset + nbytes}) runs past the end of the file "
                            f"({size} bytes; its directory's blobs end at byte {needed})", CUT_SHORT)
            records.append(Record(i, dtype, ndim, tuple(shape4[:ndim]), offset, nbytes, group, bits))

        # blobs must not overlap (order by offset; empty blobs take no space)
        spans = sorted((r.offset, r.offset + r.nbytes, r.index) for r in records if r.nbytes)
        for (a0, a1, ia), (b0, b1, ib) in zip(spans, spans[1:]):
            if b0 < a1:
                fail.record(ib, "", f"blob [{b0}, {b1}) overlaps record {ia}'s blob [{a0}, {a1})")

        # roles by position
        slots = body_layout(cfg)
        has_tokenizer = records[-1].dtype == DTYPE_RAW
        through = len(slots)
        extra = n_tensors - through - int(has_tokenizer)
        if extra < 0:
            fail.header("num_tensors", f"expected at least {through + int(has_tokenizer)} records for this geometry "
                        f"({through} through final_norm{' + tokenizer' if has_tokenizer else ''}), found {n_tensors}")
        roles = [None] * n_tensors
        for slot, rec in zip(slots, records):
            self._check_slot(rec, slot, fail)
            roles[rec.index] = slot.role
        self.head_info = {}
        self._walk_heads(records, through, extra, roles, fail)
        if has_tokenizer:
            roles[-1] = "tokenizer"
            self._check_slot(records[-1], Slot("tokenizer", DTYPE_RAW, ()), fail)
        self.records = [Record(r.index, r.dtype, r.ndim, r.shape, r.offset, r.nbytes, r.group_size, r.bits, role)
                        for r, role in zip(records, roles)]
        self.roles = {r.role: r.index for r in self.records}
        self.heads = tuple(self.head_info)

        self._check_values(fail)
        self._check_permutation("hada_p1", fail)
        self._check_permutation("hada_p2", fail)
        self.tokenizer_bytes = None
        self.tokenizer_record = None
        if has_tokenizer:
            rec = self.records[-1]
            self.tokenizer_bytes = bytes(data[rec.offset: rec.offset + rec.nbytes])
            self._check_tokenizer(rec, fail)

    def _check_slot(self, rec, slot, fail):
        if rec.dtype != slot.dtype:
            if rec.dtype == DTYPE_RAW:
                fail.record(rec.index, slot.role, f"expected {DTYPE_NAMES[slot.dtype]} {slot.shape}, found a RAW record "
                            "(tensor count inconsistent with the header geometry?)")
            fail.record(rec.index, slot.role,
                        f"dtype expected {DTYPE_NAMES[slot.dtype]}, found {rec.dtype_name}")
        self._check_shape(rec, slot.role, slot.shape, fail)

    def _check_shape(self, rec, role, shape, fail):
        if rec.shape != tuple(shape):
            fail.record(rec.index, role, f"shape expected {tuple(shape)}, found {rec.shape}")
        if rec.dtype == DTYPE_CQ:
            if rec.bits not in (1, 2, 3, 4, TERNARY_BITS):
                fail.record(rec.index, role, f"CQ bits expected 1, 2, 3, 4 or 5 (ternary), found {rec.bits}")
            g = rec.group_size
            if g < 8 or g > MAX_GROUP_SIZE or g & (g - 1):
                fail.record(rec.index, role, f"CQ group_size expected a power of two in [8, {MAX_GROUP_SIZE}], found {g}")
            if rec.ndim != 2 or min(rec.shape) < 1:
                fail.record(rec.index, role, f"CQ shape expected (out, in) with out, in >= 1, found {rec.shape}")
        else:
            if rec.group_size or rec.bits:
                fail.record(rec.index, role, f"group_size/bits expected 0 for {rec.dtype_name}, "
                            f"found {rec.group_size}/{rec.bits}")
        expect = _dtype_nbytes(rec.dtype, rec.shape, rec.group_size, rec.bits)
        if expect is not None and rec.nbytes != expect:
            fail.record(rec.index, role, f"nbytes expected {expect} for {rec.dtype_name} {rec.shape}"
                        + (f" ({rec.bits}-bit, group {rec.group_size})" if rec.dtype == DTYPE_CQ else "")
                        + f", found {rec.nbytes}")

    def _walk_heads(self, records, through, extra, roles, fail):
        """Probe-head section by the manifest (spec §2.7); audio is detected and refused."""
        cfg = self.config
        if extra == 0:
            return
        pos = through
        manifest = records[pos]
        if manifest.dtype == DTYPE_FP32:
            fail.record(pos, "audio.manifest", "audio (Whistle) archives are not supported by this text engine")
        hh = manifest.shape[0] if manifest.ndim == 1 else 0
        if manifest.dtype != DTYPE_FP16 or manifest.ndim != 1 or not 1 <= hh <= len(HEAD_CODES):
            fail.record(pos, "heads.manifest", f"expected FP16 (Hh,) with 1 <= Hh <= 3 after final_norm, "
                        f"found {manifest.dtype_name} {manifest.shape}")
        self._check_shape(manifest, "heads.manifest", (hh,), fail)
        roles[pos] = "heads.manifest"
        codes = self._fp16(manifest)
        names = []
        for c in codes:
            if float(c) not in (1.0, 2.0, 3.0):
                fail.record(pos, "heads.manifest", f"head codes expected 1.0, 2.0 or 3.0, found {codes.tolist()}")
            names.append(HEAD_CODES[int(c)])
        if [n for n in HEAD_NAMES if n in names] != names or len(set(names)) != len(names):
            fail.record(pos, "heads.manifest", f"head codes must be distinct and ascending, found {codes.tolist()}")
        pos += 1
        end = through + extra
        L1, d = cfg.probe_rows, cfg.d_model
        for name in names:
            need = 7 if name == "router" else 6
            # Tolerated: a router written without its calibration triple (it is the last
            # head; the engine then uses the documented default 0.90, 0.00, 0.60).
            without_calibration = name == "router" and end - pos == 6
            if without_calibration:
                need = 6
            if pos + need > end:
                if pos < end and records[pos].dtype == DTYPE_FP32:
                    fail.record(pos, "audio", "audio (Whistle) archives are not supported by this text engine")
                fail.record(pos, f"heads.{name}", f"head needs {need} records, only {end - pos} remain before the "
                            f"{'tokenizer' if end < len(records) else 'end of the directory'}")
            probes = records[pos]
            if probes.dtype == DTYPE_CQ and probes.ndim == 2:
                layout = "cq"
                if probes.shape[0] % L1 or probes.shape[0] == 0:
                    fail.record(pos, f"heads.{name}.probes", f"rows expected a positive multiple of L+1 = {L1}, "
                                f"found shape {probes.shape}")
                k = probes.shape[0] // L1
            elif probes.dtype == DTYPE_FP16 and probes.ndim == 3:
                layout = "fp16"
                k = probes.shape[1]
            else:
                fail.record(pos, f"heads.{name}.probes", f"expected CQ ((L+1)·k, d) or FP16 (L+1, k, d), "
                            f"found {probes.dtype_name} {probes.shape}")
            query = records[pos + 2]
            q = query.shape[0] if query.ndim >= 1 else 0
            proj = records[pos + 4]
            out = HEAD_OUT.get(name, proj.shape[0] if proj.ndim >= 1 else 0)
            if k < 1 or q < 1 or out < 1:
                fail.record(pos, f"heads.{name}", f"probes k = {k}, queries q = {q}, out = {out}: expected all >= 1")
            for slot in head_layout(cfg, name, k, q, out, layout)[:need]:
                self._check_slot(records[pos], slot, fail)
                roles[pos] = slot.role
                pos += 1
            self.head_info[name] = HeadInfo(name, k, q, out, layout)
        if pos < end:
            if records[pos].dtype == DTYPE_FP32:
                fail.record(pos, "audio.manifest", "audio (Whistle) archives are not supported by this text engine")
            fail.record(pos, "", f"unexpected record after the probe heads: the manifest lists {names}, "
                        f"{end - pos} record(s) left over before the tokenizer")

    def _check_values(self, fail):
        """Every FP16/FP32 value finite and every CQ group norm finite and >= 0.

        Cheap (the norms are 1/64 of a 4-bit archive) and it keeps a corrupted blob from
        turning into NaN logits far from the cause.
        """
        data = self._data
        for rec in self.records:
            if rec.dtype == DTYPE_FP16:
                values = np.frombuffer(data, "<f2", rec.numel, rec.offset)
            elif rec.dtype == DTYPE_FP32:
                values = np.frombuffer(data, "<f4", rec.numel, rec.offset)
            elif rec.dtype == DTYPE_CQ:
                rows, cols = rec.shape
                n_groups = -(-cols // rec.group_size)
                values = np.frombuffer(data, "<f2", rows * n_groups, rec.offset + rec.nbytes - rows * n_groups * 2)
                if (values < 0).any():
                    fail.record(rec.index, rec.role, "a CQ group norm is negative")
            else:
                continue
            if not np.isfinite(values).all():
                what = "a CQ group norm" if rec.dtype == DTYPE_CQ else "a value"
                fail.record(rec.index, rec.role, f"{what} is NaN or infinite")

    def _check_permutation(self, role, fail):
        idx = self.roles[role]
        values = self.tensor(idx)
        n = values.size
        ok = np.isfinite(values).all() and np.array_equal(np.sort(values), np.arange(n, dtype=np.float32))
        if not ok:
            fail.record(idx, role, f"expected a permutation of 0..{n - 1} stored as floats")

    def _check_tokenizer(self, rec, fail):
        """Structure of the tokenizer attachment (spec §2.9); its meaning is the tokenizer's job."""
        blob = self.tokenizer_bytes
        where = (rec.index, "tokenizer")
        if len(blob) < 24:
            fail.record(*where, f"tokenizer header needs 24 bytes, record has {len(blob)}")
        n_pieces, pad_id, eos_id, bos_id, unk_id, _prefix, _fallback, zero = struct.unpack_from("<5IBBH", blob, 0)
        if not 1 <= n_pieces <= self.config.vocab:
            fail.record(*where, f"n_pieces expected 1..vocab ({self.config.vocab}), found {n_pieces}")
        for name, value in (("pad_id", pad_id), ("eos_id", eos_id), ("bos_id", bos_id), ("unk_id", unk_id)):
            if value >= n_pieces:
                fail.record(*where, f"{name} expected < n_pieces ({n_pieces}), found {value}")
        pos = 24
        for piece in range(n_pieces):
            if pos + 7 > len(blob):
                fail.record(*where, f"piece {piece} header at byte {pos} overruns the record ({len(blob)} bytes)")
            _score, ptype, length = struct.unpack_from("<fBH", blob, pos)
            if ptype > 4:
                fail.record(*where, f"piece {piece} type expected 0..4, found {ptype}")
            pos += 7
            if pos + length > len(blob):
                fail.record(*where, f"piece {piece} surface of {length} bytes at byte {pos} overruns the record "
                            f"({len(blob)} bytes)")
            pos += length
        if pos != len(blob):
            fail.record(*where, f"{len(blob) - pos} trailing bytes after the last of {n_pieces} pieces")
        # the pieces themselves (UTF-8 surfaces, <0xHH> byte pieces, flag bytes, scores):
        # the spec's validation rule covers the whole record, so a bad one fails here, at open
        try:
            self.tokenizer_record = parse_tokenizer_record(blob, vocab=self.config.vocab)
        except TokenizerError as exc:
            fail.record(*where, str(exc))

    # access ------------------------------------------------------------------------
    def _record(self, role_or_index):
        if self._closed:
            raise ValueError("archive is closed")
        if isinstance(role_or_index, (int, np.integer)):
            i = int(role_or_index)
            if not -len(self.records) <= i < len(self.records):
                raise KeyError(f"record index {i} out of range (archive has {len(self.records)} records)")
            return self.records[i]
        try:
            return self.records[self.roles[role_or_index]]
        except KeyError:
            raise KeyError(f"no tensor with role {role_or_index!r} in {self.source}") from None

    def _fp16(self, rec):
        return np.frombuffer(self._data, dtype="<f2", count=rec.numel, offset=rec.offset).astype(np.float32)

    def codebook_for(self, bits: int, group_size: int) -> np.ndarray:
        """Lookup table of a record: the file's codebook where it applies, else §3.2's."""
        if bits in self.codebooks and group_size == self.codebook_group:
            return self.codebooks[bits].copy()
        return codebook(bits, group_size)

    def tensor(self, role_or_index: str | int) -> np.ndarray | CQMatrix | bytes:
        """float32 array for FP16/FP32 records, CQMatrix for CQ, bytes for RAW."""
        rec = self._record(role_or_index)
        if rec.index in self._cache:
            return self._cache[rec.index]
        if rec.dtype == DTYPE_RAW:
            value = bytes(self._data[rec.offset: rec.offset + rec.nbytes])
        elif rec.dtype == DTYPE_FP16:
            value = self._fp16(rec).reshape(rec.shape)
        elif rec.dtype == DTYPE_FP32:
            value = self._data[rec.offset: rec.offset + rec.nbytes].view("<f4").astype(np.float32).reshape(rec.shape)
        else:
            rows, cols = rec.shape
            field_bits = 2 if rec.bits == TERNARY_BITS else rec.bits
            n_groups = -(-cols // rec.group_size)
            row_bytes = n_groups * rec.group_size * field_bits // 8
            packed_end = rec.offset + rows * row_bytes
            packed = self._data[rec.offset: packed_end].reshape(rows, row_bytes)
            norms = self._data[packed_end: rec.offset + rec.nbytes].view(np.float16).reshape(rows, n_groups)
            value = CQMatrix(rows, cols, rec.bits, rec.group_size, packed, norms,
                             self.codebook_for(rec.bits, rec.group_size))
        self._cache[rec.index] = value
        return value

    def dequantize(self, role_or_index: str | int) -> np.ndarray:
        """float32 values of any numeric record (CQ decoded per spec §3.5)."""
        value = self.tensor(role_or_index)
        if isinstance(value, CQMatrix):
            # a whole-matrix float32 decode is for inspection, not the forward pass (the
            # kernels multiply packed rows): the readable decoder of the reference does it
            from .reference.cq import dequantize

            return dequantize(value)
        if isinstance(value, bytes):
            raise TypeError(f"record {self._record(role_or_index).index} is RAW bytes, not a tensor")
        return value.copy()

    def layer(self, i: int) -> dict:
        """Dict name → tensor of layer i (taps only when present)."""
        prefix = f"layers.{i}."
        return {role[len(prefix):]: self.tensor(idx) for role, idx in self.roles.items() if role.startswith(prefix)}

    @property
    def parameter_count(self) -> int:
        """Logical parameters (weights) of every numeric record."""
        return sum(r.numel for r in self.records if r.dtype != DTYPE_RAW)

    @property
    def weight_bytes(self) -> int:
        return sum(r.nbytes for r in self.records if r.dtype != DTYPE_RAW)


# ---------------------------------------------------------------------------------------
# describe (needle-cy inspect)


def _fmt_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024


def describe(archive: "Archive") -> str:
    """Human-readable summary: header, tensor table, sizes, bits per weight."""
    c = archive.config
    lines = [f"{archive.source}: Needle 3 .cact, {_fmt_bytes(archive.file_size)} ({archive.file_size} bytes)", "", "header:"]
    for f in dc_fields(c):
        lines.append(f"  {f.name:<22} {getattr(c, f.name)}")
    lines.append(f"  {'(derived)':<22} hada_n {c.hada_n}, monarch {c.monarch_sizes}, engram heads/order "
                 f"{c.engram_heads}, kv groups {c.kv_groups}, tensors/layer {c.tensors_per_layer}")
    lines.append(f"  {'heads':<22} " + (", ".join(
        f"{h.name} (k={h.probes}, q={h.queries}, out={h.out}, {h.layout})" for h in archive.head_info.values()) or "none"))
    lines.append(f"  {'tokenizer':<22} " + (f"{len(archive.tokenizer_bytes)} bytes" if archive.tokenizer_bytes else "none"))
    lines += ["", f"{'idx':>4}  {'role':<28} {'dtype':<5} {'shape':<18} {'bits':>4} {'group':>5} {'bytes':>10}"]
    cq_weights = cq_bytes = 0
    by_bits = {}
    for r in archive.records:
        bits = ("t" if r.bits == TERNARY_BITS else str(r.bits)) if r.dtype == DTYPE_CQ else "-"
        group = str(r.group_size) if r.dtype == DTYPE_CQ else "-"
        shape = "x".join(map(str, r.shape)) or "()"
        lines.append(f"{r.index:>4}  {r.role:<28} {r.dtype_name:<5} {shape:<18} {bits:>4} {group:>5} {r.nbytes:>10}")
        if r.dtype == DTYPE_CQ:
            cq_weights += r.numel
            cq_bytes += r.nbytes
            by_bits[bits] = by_bits.get(bits, 0) + r.numel
    total_w = archive.parameter_count
    lines += ["", f"tensors: {len(archive.records)}   parameters: {total_w:,}   file: {archive.file_size:,} bytes"]
    if cq_weights:
        lines.append(f"CQ: {cq_weights:,} weights in {cq_bytes:,} bytes = {8 * cq_bytes / cq_weights:.3f} bits/weight "
                     f"(incl. FP16 group norms); widths " + ", ".join(f"{b}: {n:,}" for b, n in sorted(by_bits.items())))
    if total_w:
        lines.append(f"all weights: {8 * archive.weight_bytes / total_w:.3f} bits/weight (tensor blobs, no padding)")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# Writer


def _as_bits(spec, role, default):
    if isinstance(spec, dict):
        return spec.get(role, spec.get("default", default))
    return spec


def _pad_to(n, align=ALIGN):
    return -(-n // align) * align


def write_archive(path: str | os.PathLike, config: NeedleConfig, tensors: dict, bits: int = 4,
                  group_size: int = 128, tokenizer_bytes: bytes | None = None,
                  head_layout_kind: str = "cq") -> str | os.PathLike:
    """Write a .cact archive; returns the path.

    ``tensors``: role → float array of the role's logical shape (CQ roles are
    quantized here with reference.cq.quantize; FP16 roles rounded).  A value may
    also be a zero-argument callable returning the array, so large archives are
    produced one tensor at a time, or an already-encoded CQMatrix for a CQ role
    (written as it is, with its own width and group size).  Probe heads are written when
    ``heads.{name}.probes`` etc. are present; the manifest is derived from them
    (canonical order) unless ``heads.manifest`` is given.  Probes may be given as
    (L+1, k, d) or ((L+1)·k, d).  Head matrices (probes/query/proj) are CQ 4-bit
    at the model group size (``head_layout_kind="fp16"`` writes the older
    all-FP16 layout).  ``bits``/``group_size``: an int, or a dict role → value
    with an optional "default".  ``tokenizer_bytes`` is attached as the last RAW
    record.  The header codebook is the one of the default group size.
    """
    # writing quantizes with the reference's quantizer (the spec's encoder; not an inference path)
    from .reference.cq import quantize

    cfg = config

    def bad_config(name, msg):
        raise ValueError(f"config.{name}: {msg}")

    _check_config(cfg, bad_config)
    tensors = dict(tensors)

    def value_of(role):
        value = tensors.pop(role)
        if callable(value):
            value = value()
        if isinstance(value, CQMatrix):
            return value
        return np.asarray(value, dtype=np.float32)

    def shape_of(value):
        return value.shape if isinstance(value, CQMatrix) else np.shape(value)

    slots = list(body_layout(cfg))
    head_names = [h for h in HEAD_NAMES if f"heads.{h}.probes" in tensors]
    if head_names:
        slots.append(Slot("heads.manifest", DTYPE_FP16, (len(head_names),)))
        L1, d = cfg.probe_rows, cfg.d_model
        for h in head_names:
            for part in ("probes", "query", "proj"):
                if callable(tensors.get(f"heads.{h}.{part}")):
                    tensors[f"heads.{h}.{part}"] = tensors[f"heads.{h}.{part}"]()
            pshape = shape_of(tensors[f"heads.{h}.probes"])
            if len(pshape) == 3:
                k = pshape[1]
            elif len(pshape) == 2 and pshape[0] % L1 == 0:
                k = pshape[0] // L1
            else:
                raise ValueError(f"heads.{h}.probes: expected (L+1, k, d) or ((L+1)·k, d), found {pshape}")
            q = shape_of(tensors[f"heads.{h}.query"])[0]
            out = HEAD_OUT.get(h, shape_of(tensors[f"heads.{h}.proj"])[0])
            slots += head_layout(cfg, h, k, q, out, head_layout_kind)
    unknown = sorted(set(tensors) - {s.role for s in slots})
    if unknown:
        raise ValueError(f"write_archive: unknown roles {unknown[:5]}{'...' if len(unknown) > 5 else ''}")
    missing = [s.role for s in slots if s.role not in tensors and s.role != "heads.manifest"]
    if missing:
        raise ValueError(f"write_archive: missing tensors {missing[:5]}{'...' if len(missing) > 5 else ''}")

    # pass 1: the directory (every size follows from shape, dtype, width and group)
    plan = []  # (slot, bits, group, nbytes)
    for slot in slots:
        if slot.dtype == DTYPE_CQ:
            given = tensors.get(slot.role)
            if isinstance(given, CQMatrix):        # already encoded: written as it is
                b, g = given.bits, given.group_size
            else:
                b = HEAD_BITS if slot.role.startswith("heads.") else int(_as_bits(bits, slot.role, 4))
                g = int(_as_bits(group_size, slot.role, 128))
            field_bits_of(b)
            if g < 8 or g & (g - 1):
                raise ValueError(f"write_archive: {slot.role}: group size must be a power of two >= 8, got {g}")
            plan.append((slot, b, g, cq_nbytes(slot.shape[0], slot.shape[1], b, g)))
        else:
            plan.append((slot, 0, 0, _dtype_nbytes(slot.dtype, slot.shape)))
    if tokenizer_bytes is not None:
        tokenizer_bytes = bytes(tokenizer_bytes)
        n_pieces = struct.unpack_from("<I", tokenizer_bytes, 0)[0] if len(tokenizer_bytes) >= 24 else None
        if n_pieces is None or not 1 <= n_pieces <= cfg.vocab:
            raise ValueError(f"write_archive: tokenizer record has {n_pieces} pieces; expected 1..vocab ({cfg.vocab})")
        plan.append((Slot("tokenizer", DTYPE_RAW, ()), 0, 0, len(tokenizer_bytes)))

    n = len(plan)
    dir_start = HEADER_BYTES + 4 * CODEBOOK_LEN
    pos = _pad_to(dir_start + RECORD_BYTES * n)
    directory = bytearray()
    offsets = []
    for slot, b, g, nbytes in plan:
        offsets.append(pos)
        dims = list(slot.shape) + [0] * (4 - len(slot.shape))
        directory += _RECORD_STRUCT.pack(slot.dtype, len(slot.shape), 0, *dims, pos, nbytes, g, b)
        pos = _pad_to(pos + nbytes)
    orders = list(cfg.engram_orders) + [0] * (4 - len(cfg.engram_orders))
    sites = list(cfg.engram_sites) + [0] * (16 - len(cfg.engram_sites))
    mask = cfg.global_mask
    header = _HEADER_STRUCT.pack(
        TAG_NEEDLE3, n, CODEBOOK_LEN, cfg.kv_window, cfg.kv_bits or 8, cfg.vocab, cfg.out_vocab,
        cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.num_layers, cfg.qk_head_dim,
        cfg.v_head_dim, cfg.max_seq_len, cfg.hada_n, cfg.mhc_lanes, cfg.sliding_window,
        mask & 0xFFFFFFFF, mask >> 32, cfg.qkv_conv_taps, cfg.engram_slots, cfg.engram_sub_dim,
        cfg.num_engram_tables, cfg.engram_conv_taps, cfg.engram_conv_dilation,
        cfg.engram_seed_heads, len(cfg.engram_orders), *orders, len(cfg.engram_sites), *sites,
        cfg.rope_theta)
    codebook_group = int(_as_bits(group_size, "default", 128))
    cb = np.concatenate([codebook(b, codebook_group) for b in (2, 3, 4)]).astype("<f4").tobytes()

    # pass 2: the blobs, one tensor at a time
    path = Path(path)
    with open(path, "wb") as fh:
        fh.write(header + cb + bytes(directory))
        written = dir_start + len(directory)
        for off, (slot, b, g, nbytes) in zip(offsets, plan):
            role = slot.role
            if slot.dtype == DTYPE_RAW:
                payload = tokenizer_bytes
            else:
                if role == "heads.manifest" and role not in tensors:
                    value = np.array([c for c, name in HEAD_CODES.items() if name in head_names], np.float32)
                else:
                    value = value_of(role)
                if isinstance(value, CQMatrix) and slot.dtype != DTYPE_CQ:
                    raise ValueError(f"write_archive: {role} is stored {DTYPE_NAMES[slot.dtype]}, got a CQMatrix")
                if role.endswith(".probes") and not isinstance(value, CQMatrix) and value.size == math.prod(slot.shape):
                    value = value.reshape(slot.shape)
                if value.shape != slot.shape:
                    raise ValueError(f"write_archive: {role} expected shape {slot.shape}, found {value.shape}")
                if slot.dtype == DTYPE_CQ:
                    cqm = value if isinstance(value, CQMatrix) else quantize(value, b, g)
                    payload = cqm.packed.tobytes() + cqm.norms.astype("<f2").tobytes()
                elif slot.dtype == DTYPE_FP16:
                    if not np.isfinite(value).all():
                        raise ValueError(f"write_archive: {role} contains NaN or infinity")
                    if value.size and np.abs(value).max() > np.finfo(np.float16).max:
                        raise ValueError(f"write_archive: {role} has values outside the float16 range")
                    half = value.astype("<f2")
                    payload = half.tobytes()
                else:
                    payload = value.astype("<f4").tobytes()
            assert len(payload) == nbytes, (role, len(payload), nbytes)
            fh.write(b"\0" * (off - written))
            fh.write(payload)
            written = off + nbytes
    return path
