# cython: language_level=3, wraparound=True
"""The Needle 3 forward pass in Cython: ``CythonEngine`` (spec §4, §5, §9).

Same interface and semantics as ``needle_cy.reference.model.ReferenceEngine``
(read that module's docstring first); this is its fast twin.

How it runs
-----------
``_run_chunk`` is the whole forward pass for a chunk of up to ``CHUNK`` new
tokens against the state, top to bottom in one function, llama2.c style:

    embedding rows (CQ row decode) · sqrt(d)
    engram keys/values of every site (hash → table rows → A8 → 2 CQ matmuls → dilated conv)
    for each block:  mHC router (RMS-unit, A8, 3 CQ matmuls, σ, Sinkhorn)
                     u = Σ hpre·lanes;  engram gate;  ZC-RMSNorm;  A8
                     q/k/v/gate CQ matmuls;  causal conv;  QK norm;  RoPE;  A8 / KV quant
                     write k, v into the ring-buffer KV cache;  GQA attention
                     σ(gate) ⊙ o;  A8;  out-proj;  post-norm;  Monarch MLP
                     lanes' = P·lanes + hpost·(Block(u) − u);  cell = lane mean
                     fold the cell into the online probe pools
    final norm, A8, tied head (only the rows that are asked for)

``prefill`` feeds its ids in chunks (batched CQ *matmul* kernels for every
projection), ``step`` is a chunk of one (CQ *matvec*), ``forward`` runs chunks
on a throw-away state.  Every buffer is allocated once per engine (scratch)
or per state (KV cache, histories, pools): nothing is allocated per token.
Threads: in a chunk the CQ products split rows across ``threads`` OpenMP threads
(the products that share a rotated input, q/k/v/gate and the three Φ, as one list
of rows, or by tokens where the list is too short), and the per-token work
(norms, conv, RoPE, attention, MLP, mHC mixing, the probe pools) is split across
tokens.  A step (a chunk of one token) runs every block and the head in one
parallel region (``_step_blocks``): the threads meet at a barrier between
dependent operations, each product is cut into one contiguous share of rows per
thread, the KV heads of the attention and the rows of the Monarch MLP's Kronecker
factors are split, the probe pools run on the last thread beside thread 0's start
of the next block, and the small per-token operations run on thread 0.  Every
value is computed as on one thread, so the results are the same bits at any
thread count (tested).

KV cache layout
---------------
Two storages, chosen once per engine (``kv_storage``):

* ``"int8"`` — deploy numerics at kv_bits ≥ 8 (spec §3.9: A8 per head vector).
  The cache holds the quantizer's own codes and scales: values
  ``v_cache [layer, kv_head, slot, dv]`` int8 and ``v_scale [layer, kv_head, slot]``
  float32; keys in quads of dimensions, ``k_cache [layer, kv_head, ⌈dq/4⌉, slot, 4]``
  uint8 holding code + 128 (offset binary: the unsigned operand of the VNNI
  dot product), and ``k_scale [layer, kv_head, slot]``.  The values attended,
  code·scale, are bit for bit the fake-quant floats the reference attends to
  (a −0 becomes +0).  Scores are exact int32 sums of query codes × key codes (the
  query is A8'd at that point, §4.7 step 6) times the two scales, so they do not
  depend on the kernel path; the weighted sum over values is Σ (p·scale)·code.
  120 bytes per slot and KV head at dq 48 / dv 64 instead of 448, and the 16
  slots of one 64-byte key vector are consecutive, so the scores of consecutive
  slots still stream (the float layout's idea, four dimensions per lane).
* ``"float32"`` — everything else (``numerics="float"``; kv_bits 2/3/4, whose CQ
  fake-quant values are not a small integer grid per vector): float32 values
  *after* the KV quantizer, ``[layer, kv_head, slot, dv]``; keys transposed,
  ``[layer, kv_head, dq, slot]``, so the scores of consecutive slots come from
  streaming multiply–adds.  ``k_scale``/``v_scale`` are None.

Slot of absolute position p: p itself below the sink count S, else
``S + (p − S) mod (capacity − S)`` — a ring buffer.  Capacity is the window
W plus one chunk, so writing a chunk never overwrites a key an earlier query of
the same chunk still sees; without a window the capacity is ``max_seq_len`` and
slot = position.  The arrays live on anonymous mappings (untouched pages cost no
memory, and no transparent huge pages), so resident memory grows with the
context actually used.
"""
import os

import numpy as np
cimport numpy as cnp
from cython.parallel cimport prange, threadid, parallel
from libc.math cimport sqrtf, expf, INFINITY
from libc.stdint cimport int64_t, uint32_t, int8_t, uint8_t
from libc.string cimport memcpy, memset, memmove

from needle_cy._cq cimport (CQWeight, CQView, cq_work_floats, cq_matvec, cq_matmul, cq_dequantize_row,
                            cq_same_rotation, cq_rotate, cq_matvec_rotated, cq_prefetch_rows, cq_row_bytes, cq_matmul_rotated,
                            cq_matvec_rotated_rows, cq_matmul_rotated_rows, cq_matmul_rotated_rows_list,
                            cq_rotate_tokens, cq_rotate_tokens_ok,
                            cq_decode_scratch, cq_decode_scratch_floats,
                            cq_free_decode_scratch)
from needle_cy._parallel cimport (nc_team_barrier, nc_team_size, nc_barrier, nc_barrier_init, nc_barrier_wait,
                                  nc_barrier_wait_pf, nc_pf_stream, nc_pf_clear, nc_pf_add, nc_pf_rewind, nc_pf_done,
                                  nc_prof_begin, nc_prof_end, nc_prof_read, NC_PROF_THREADS, NC_PROF_MEETINGS)
from needle_cy._ops cimport (a8_inplace, a8_codes_c, kv_cq_inplace, zc_rmsnorm_c, rms_unit_c, rope_c,
                             conv_step_c, attend_group_c, attend_group_i8_c, sigmoid_c, mul_sigmoid_c, engram_hash_c, engram_alpha_c,
                             sinkhorn_c, monarch_mlp_c, team_cols, pool_update_c, dot_c)

from needle_cy._cq import LUT_KERNELS, LutArena, kernel_name, prepare
from needle_cy.cq_format import field_bits_of
from needle_cy import _ops as ops
from needle_cy.errors import ContextOverflowError, ModelStateError

cnp.import_array()

NUMERICS = ("deploy", "float")
KV_STORAGES = ("int8", "float32")
PAD_ID = 0
DEF PAD_ID_C = 0
DEF CHUNK_MAX = 64           # tokens per batched chunk (prefill / forward)
CHUNK = CHUNK_MAX            # the same, for Python callers that feed chunk by chunk
DEF MAX_TAPS = 16
DEF MAX_LANES = 16
DEF MAX_HEADS = 4            # probe heads
DEF STEP_BLOCK_ROWS = 32     # split granularity of a decode step's products (_products)
cdef float A8_QMAX = 127.0
cdef int SINKHORN_ITERS = 20


ctypedef struct LayerC:
    CQView q_proj
    CQView k_proj
    CQView v_proj
    CQView gate_proj
    CQView out_proj
    CQView phi_pre
    CQView phi_post
    CQView phi_res
    const float* norm_in
    const float* post_norm
    const float* pre_hada
    const float* q_taps          # [C, H·dq] or NULL
    const float* k_taps
    const float* v_taps
    const float* q_norm
    const float* k_norm
    float attn_gate              # σ(raw gate logit)
    float a_pre
    float a_post
    float a_res
    const float* b_pre
    const float* b_post
    const float* b_res
    const float* d1
    const float* d2
    const float* b2
    const float* d3
    const float* d4
    const float* w1a
    const float* w1b
    const float* w2a
    const float* w2b
    const float* w3a
    const float* w3b
    const float* cond_v
    const float* cond_u
    int lane
    bint phi_shared              # the three Φ take one rotation of their input (cq_same_rotation)
    bint qkvg_shared             # so do q, k, v and gate
    Py_ssize_t band              # sliding band, -1 for global layers
    int site                     # engram site index or -1


ctypedef struct SiteC:
    CQView tables
    CQView key_proj
    CQView value_proj
    const float* taps            # [n_taps, d]


ctypedef struct KVCache:
    # the state's cache arrays (the pointers of one storage are set, the others NULL)
    float* k                     # float32 [L, K, dq, cap]  keys transposed
    float* v                     # float32 [L, K, cap, dv]
    uint8_t* k_codes             # int8 storage: [L, K, ⌈dq/4⌉, cap, 4]  code + 128
    int8_t* v_codes              # [L, K, cap, dv]
    float* k_scale               # [L, K, cap]
    float* v_scale               # [L, K, cap]


ctypedef struct HeadC:
    const float* probes          # dense [R, k, d]
    Py_ssize_t k


def lazy_empty(shape, dtype=np.float32):
    """Array on a fresh anonymous mapping: pages cost memory only once
    written.  (NumPy asks for transparent huge pages on large arrays, which would
    make a whole 2 MB of KV cache resident at the first token.)"""
    import mmap
    dtype = np.dtype(dtype)
    count = int(np.prod(shape))
    flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_ANONYMOUS", getattr(mmap, "MAP_ANON", 0x20))
    buf = mmap.mmap(-1, max(count, 1) * dtype.itemsize, flags=flags)
    return np.frombuffer(buf, dtype=dtype, count=count).reshape(shape)


cdef inline float* fptr(cnp.ndarray a):
    return <float*>cnp.PyArray_DATA(a)


cdef inline int64_t* iptr(cnp.ndarray a):
    return <int64_t*>cnp.PyArray_DATA(a)


cdef extern from "csrc/prefetch_stream.h":
    void _prefetch_floats "nc_prefetch_floats"(const float* p, Py_ssize_t n) noexcept nogil


cdef inline void _pf_add_share(nc_pf_stream* s, const float* p, Py_ssize_t n, int tid, int nt,
                               int phase) noexcept nogil:
    """Thread tid's share (team_cols) of the n floats at p onto its prefetch stream."""
    cdef Py_ssize_t a, b
    team_cols(n, tid, nt, &a, &b)
    if b > a:
        nc_pf_add(s, p + a, (b - a) * sizeof(float), phase)


cdef inline void _prefetch_share(const float* p, Py_ssize_t n, int tid, int nt) noexcept nogil:
    """Thread tid's share of _prefetch_floats(p, n) among nt (team_cols: whole lines)."""
    cdef Py_ssize_t a, b
    team_cols(n, tid, nt, &a, &b)
    if b > a:
        _prefetch_floats(p + a, b - a)


cdef extern from "csrc/model_avx2.h":
    int nc_lane_update_avx2(float* x, const float* a, const float* u, float* X,
                            const float* ph, Py_ssize_t n, Py_ssize_t d, float* cell,
                            Py_ssize_t c0, Py_ssize_t c1) noexcept nogil


cdef inline bint _visible(Py_ssize_t t, Py_ssize_t j, Py_ssize_t recent, Py_ssize_t sinks,
                          Py_ssize_t band) noexcept nogil:
    """Spec §9.2: key j visible from t (recent/band < 0 = unlimited)."""
    if j < 0 or j > t:
        return 0
    if recent >= 0 and not (t - j < recent or j < sinks):
        return 0
    if band >= 0 and t - j >= band:
        return 0
    return 1


cdef inline void _project_shared(const CQView* first, const CQView* w, const float* X, Py_ssize_t T,
                                 Py_ssize_t xs, float* Y, Py_ssize_t ys, float* work,
                                 int threads) noexcept nogil:
    """Y = X·Wᵀ reusing the rotation of X that cq_rotate(first, ...) left in work
    (when w rotates its input like first; otherwise a full product)."""
    if not cq_same_rotation(first, w):
        _project(w, X, T, xs, Y, ys, work, threads)   # clobbers work: caller re-rotates
    elif T == 1:
        cq_matvec_rotated(w, work, Y, threads)
    else:
        cq_matmul_rotated(w, work, T, Y, ys, threads)


cdef inline void _project(const CQView* w, const float* X, Py_ssize_t T, Py_ssize_t xs,
                          float* Y, Py_ssize_t ys, float* work, int threads) noexcept nogil:
    """Y[t] = W·X[t] for T tokens: matvec for one token, the batched matmul otherwise."""
    if T == 1:
        cq_matvec(w, X, Y, work, threads)
    else:
        cq_matmul(w, X, T, xs, Y, ys, work, threads)


cdef inline void _shift_history_cols(float* hist, Py_ssize_t nh, const float* row, Py_ssize_t width,
                                     Py_ssize_t c0, Py_ssize_t c1) noexcept nogil:
    """Columns [c0, c1) of hist ← the last nh rows of [hist; row] (one new row, oldest
    first): the per-channel share of _shift_history for a one-token chunk."""
    cdef Py_ssize_t r
    if nh <= 0:
        return
    for r in range(nh - 1):
        memcpy(hist + r * width + c0, hist + (r + 1) * width + c0, (c1 - c0) * sizeof(float))
    memcpy(hist + (nh - 1) * width + c0, row + c0, (c1 - c0) * sizeof(float))


cdef inline bint _list_share(const CQView** ws, int count, int i, int tid, int nt,
                             Py_ssize_t* r0, Py_ssize_t* r1) noexcept nogil:
    """Rows [r0, r1) of matrix i of a list of `count` products that thread tid of nt
    computes (False: none): the list's blocks of STEP_BLOCK_ROWS rows, numbered one
    matrix after another, cut into nt contiguous even shares.  A list too short for
    a few blocks per thread (the three mHC Φ: 4 + 4 + 16 rows) is cut in blocks of 4
    rows (the kernels' row tile) instead: in blocks of 32 one thread had 4 rows of it
    and the other 20."""
    cdef Py_ssize_t total = 0, first = 0, lo, hi, a, b, rows = 0, blk = STEP_BLOCK_ROWS
    cdef int j
    for j in range(count):
        rows += ws[j].rows
    if rows < 4 * STEP_BLOCK_ROWS * nt:
        blk = 4
    for j in range(count):
        if j == i:
            first = total
        total += (ws[j].rows + blk - 1) // blk
    lo = total * tid // nt
    hi = total * (tid + 1) // nt
    a = max(lo, first) - first
    b = min(hi, first + (ws[i].rows + blk - 1) // blk) - first
    if a >= b:
        return False
    r0[0] = a * blk
    r1[0] = min(b * blk, ws[i].rows)
    return True


def _env_count(name, minimum, what):
    """The integer in environment variable `name` (None when unset or blank); anything
    else than an integer >= minimum is a ValueError naming the variable."""
    env = os.environ.get(name)
    if env is None or env.strip() == "":
        return None
    try:
        n = int(env)
    except ValueError:
        n = minimum - 1
    if n < minimum:
        raise ValueError(f"{name} must be {what} >= {minimum}, got {env!r}")
    return n


def prefetch_ahead_bytes():
    """How far a decode step's waiting thread may prefetch beyond what it has read
    (prefetch_stream.h): ``NEEDLE_CY_PF_AHEAD`` bytes (0 turns the streams off), else
    half of this core's L2 (sysfs; 256 KB where it is not known), so that what it
    brings is still in L2 when read beside the step's other data.  On a core with a
    2 MB L2, 0.5, 1 and 1.5 MB measured alike (benchmarks/history/model.md)."""
    n = _env_count("NEEDLE_CY_PF_AHEAD", 0, "a byte count")
    if n is not None:
        return n
    l2 = 0
    try:
        base = "/sys/devices/system/cpu/cpu0/cache"
        for entry in sorted(os.listdir(base)):
            if not entry.startswith("index"):
                continue
            with open(f"{base}/{entry}/level") as f:
                level = f.read().strip()
            with open(f"{base}/{entry}/type") as f:
                kind = f.read().strip()
            if level == "2" and kind in ("Unified", "Data"):
                with open(f"{base}/{entry}/size") as f:
                    size = f.read().strip().upper()
                scale = {"K": 1 << 10, "M": 1 << 20}.get(size[-1:], 1)
                l2 = int(size.rstrip("KM")) * scale
                break
    except (OSError, ValueError):
        l2 = 0
    return l2 // 2 if l2 > 0 else 256 << 10


def mlp_team_min():
    """The smallest team that splits a decode step's Monarch MLP between its threads
    (``NEEDLE_CY_MLP_TEAM``, default 3); a smaller team runs the MLP and its lane update
    on thread 0 while the others wait.  The split MLP meets six times and each of its
    three Kronecker products reads the vector the whole team wrote, lines that cross
    between the cores: with 2 threads the split took longer than thread 0 alone, and the
    decode was faster without it (benchmarks/history/model.md).  Three or more threads
    are not measured (the split stays there).
    The values are the same bits either way."""
    n = _env_count("NEEDLE_CY_MLP_TEAM", 1, "a thread count")
    return 3 if n is None else n


def sites_late_mode():
    """Whether a decode step of a team smaller than mlp_team_min() runs the engram sites
    on its last thread beside thread 0's Monarch MLPs (CythonEngine._plan_sites):
    ``NEEDLE_CY_SITES_LATE`` "1" where the archive allows it (no site read by block 0),
    "0" never, "auto" (default) where moreover every site product has the lookup layout
    (avx512lut): a 768×768 lookup product fits in the time of thread 0's MLP, where the
    4-bit integer kernel's product, about three times as long, kept thread 0 waiting
    (4-bit decode was slower with it; figures in benchmarks/history/model.md)."""
    v = os.environ.get("NEEDLE_CY_SITES_LATE", "auto").strip().lower()
    if v not in ("auto", "0", "1"):
        raise ValueError(f"NEEDLE_CY_SITES_LATE: expected auto, 0 or 1, got {v!r}")
    return v


def barrier_profile():
    """The meeting profile of the one-region decode steps (_step_blocks) run since the
    last call, then reset: ``(ns, steps)`` with ns int64 [NC_PROF_THREADS, NC_PROF_MEETINGS,
    2], per thread and meeting the nanoseconds worked before it ([..., 0]) and waited in
    it ([..., 1]), summed over ``steps`` steps.  Only in a build made with
    ``CFLAGS=-DNC_BARRIER_PROFILE`` (parallel_barrier.h); benchmarks/profile_step.py
    names the meetings."""
    out = np.zeros((NC_PROF_THREADS, NC_PROF_MEETINGS, 2), np.int64)
    cdef long long n = nc_prof_read(<long long*>cnp.PyArray_DATA(out))
    if n < 0:
        raise RuntimeError("barrier_profile: needle_cy._model was built without the meeting profile; "
                           "rebuild it with CFLAGS=-DNC_BARRIER_PROFILE (touch needle_cy/_model.pyx first)")
    return out, int(n)


cdef class EngineState:
    """Everything the next token depends on (spec §4.10); copied by snapshot()."""
    cdef public Py_ssize_t position
    cdef public object owner
    cdef public cnp.ndarray k_cache      # float32 [L, K, dq, cap] | uint8 [L, K, ⌈dq/4⌉, cap, 4] (module docstring)
    cdef public cnp.ndarray v_cache      # float32 | int8 [L, K, cap, dv]
    cdef public object k_scale           # int8 storage: float32 [L, K, cap]; else None
    cdef public object v_scale
    cdef public cnp.ndarray conv_q       # [L, C-1, H·dq] raw projections, oldest first
    cdef public cnp.ndarray conv_k
    cdef public cnp.ndarray conv_v
    cdef public cnp.ndarray value_hist   # [S, (taps-1)·dil, d] engram v' history
    cdef public cnp.ndarray tokens       # [max(order)-1] last tokens
    cdef public list pools               # per head: (max [R,k], denom [R,k], weighted [R,k,d])

    @property
    def nbytes(self):
        """Bytes its arrays hold (a snapshot holds only the KV slots in use)."""
        arrays = [self.k_cache, self.v_cache, self.k_scale, self.v_scale, self.conv_q, self.conv_k,
                  self.conv_v, self.value_hist, self.tokens] + [a for pool in self.pools for a in pool]
        return sum(a.nbytes for a in arrays if a is not None)


cdef class CythonEngine:
    """Fast Needle 3 engine; interface of ``needle_cy.reference.model.ReferenceEngine``."""

    # configuration
    cdef public object w
    cdef public str numerics
    cdef public object window
    cdef public int sinks
    cdef readonly int threads        # most threads a call may use (scratch is sized for it)
    cdef int _run_threads            # threads the next calls use, 1..threads (run_threads)
    cdef public object state
    cdef public str kv_storage       # "int8" | "float32" (module docstring, KV cache layout)
    cdef bint quant
    cdef bint kv_int8
    cdef Py_ssize_t nq4              # key dimension quads of the int8 cache, ⌈dq/4⌉
    cdef Py_ssize_t recent           # -1 = unlimited
    cdef Py_ssize_t cap              # KV slots per (layer, kv head)
    cdef Py_ssize_t d, n, H, K, dq, dv, L, N, R_cond, ba, bb, C, nd
    cdef Py_ssize_t V, V_out, max_seq
    cdef Py_ssize_t n_sites, NT, sub, slots, n_orders, E, stride, e_taps, e_dil, n_tok_hist, n_vhist
    cdef int orders[8]
    cdef int kv_bits
    cdef float emb_scale, attn_scale
    cdef Py_ssize_t n_heads, R_cells
    cdef HeadC heads_c[MAX_HEADS]
    # C views of the weights (the Python objects stay alive in self._keep)
    cdef LayerC* layers
    cdef SiteC* sites
    cdef CQView emb
    cdef CQView emb_out
    cdef const float* final_norm
    cdef const int64_t* p1
    cdef const int64_t* p2
    cdef const float* kv_levels
    cdef int n_kv_levels
    cdef const float* rope_cos
    cdef const float* rope_sin
    cdef list _keep
    cdef object _lut_arena        # the lookup layouts of this engine's 2-bit matrices and head (deploy)
    cdef bytes _layers_buf
    cdef bytes _sites_buf
    cdef object _head_names
    cdef dict _head_dense
    # scratch (per engine; [CHUNK, ...] or [threads, ...])
    cdef cnp.ndarray _scratch
    cdef float* s_lanes      # [CH, n·d]
    cdef float* s_nx         # [CH, n·d]  router input, then the new lanes
    cdef float* s_phi        # [CH, 2n + n²]
    cdef float* s_u          # [CH, d]
    cdef float* s_x          # [CH, d]
    cdef float* s_a          # [CH, d]
    cdef float* s_q          # [CH, H·dq] raw, then conv'd/normed
    cdef float* s_k          # [CH, K·dq]
    cdef float* s_v          # [CH, K·dv]
    cdef float* s_qc         # [CH, H·dq]
    cdef float* s_kc         # [CH, K·dq]
    cdef float* s_vc         # [CH, K·dv]
    cdef float* s_g          # [CH, H·dv]
    cdef float* s_o          # [CH, H·dv]
    cdef float* s_gate_own   # [threads, H·dv]: each thread's gated copy of a step's s_o
    cdef float* s_ao         # [CH, d]
    cdef float* s_cell       # [CH, d]
    cdef float* s_x0         # [CH, d]
    cdef float* s_e          # [CH, NT·sub]
    cdef float* s_ekey       # [n_sites, CH, d]
    cdef float* s_evraw      # [CH, d]
    cdef float* s_eval       # [n_sites, CH, d]
    cdef float* s_hid        # [CH, d]  final normed hidden
    cdef float* s_mlp_work   # [threads, 4N + 8 + R]
    cdef float* s_scores     # [threads, G·cap]
    cdef float* s_qscale     # [CH, H]  int8 cache: A8 scale of each query head
    cdef int8_t* s_qcode     # [CH, H·4·nq4]  its codes, zero-padded to whole quads
    cdef int8_t* s_kcode     # [CH, K·dq]  the keys' codes before they go into the cache
    cdef cnp.ndarray _scratch_i8
    cdef float* s_row        # [threads, group]
    cdef float* s_cq_work    # CQ kernel workspace
    cdef float* s_step_work  # [threads, step_work_len]: each thread's own one-token CQ workspace (_step_blocks)
    cdef Py_ssize_t step_work_len
    cdef nc_barrier team_bar   # the barrier of _step_blocks' team (parallel_barrier.h)
    cdef cnp.ndarray _pf_arr
    cdef nc_pf_stream* pf_streams   # [threads]: each thread's prefetch stream of a decode step (_plan_prefetch)
    cdef int* pf_planned            # [threads]: the team size its stream was planned for (0: not yet)
    cdef long long pf_ahead         # bytes a waiter may ask for beyond what it has read (0: no streams)
    cdef int mlp_team               # smallest team that splits a step's Monarch MLP (mlp_team_min)
    cdef cnp.ndarray _site_plan_arr
    cdef int* site_order            # [n_sites]: the sites by the first layer that reads them
    cdef int* site_upto             # [2L]: site units (_site_unit) done by the end of window w
    cdef bint sites_late            # the last thread runs the engram sites in its waits (_plan_sites)
    cdef Py_ssize_t mlp_work_len, row_len, gate_own_len
    cdef int64_t* s_ctx      # [n_tok_hist + CH] token context
    cdef cnp.ndarray _ctx_arr

    @property
    def sites_late(self):
        """Whether a decode step of a team smaller than mlp_team_min() runs the engram
        sites on its last thread, beside thread 0's Monarch MLP (_plan_sites,
        sites_late_mode)."""
        return bool(self.sites_late)

    @property
    def site_plan(self):
        """(site_order, site_upto) of _plan_sites: the sites by the first layer that reads
        them, and per window of the last thread (2l: block l's start, 2l + 1: its MLP)
        the engram site units done by its end."""
        S, L = self.n_sites, self.L
        return (tuple(self.site_order[i] for i in range(S)), tuple(self.site_upto[w] for w in range(2 * L)))

    @property
    def run_threads(self):
        """Threads the next prefill/step/forward uses: 1..``threads`` (the thread
        policy in ``needle_cy.threads`` moves it between calls)."""
        return self._run_threads

    @run_threads.setter
    def run_threads(self, value):
        cdef int n = int(value)
        if n < 1 or n > self.threads:
            raise ValueError(f"run_threads must lie in [1, {self.threads}] (the engine's threads), got {value!r}")
        self._run_threads = n

    @property
    def chunk(self):
        """Tokens per batched chunk: prefill(ids) runs len(ids)/chunk forward passes."""
        return CHUNK_MAX

    def __init__(self, weights, numerics="deploy", window=None, sinks=0, threads=None, kv_storage=None):
        """kv_storage: None picks "int8" where the KV quantizer is A8 (deploy numerics,
        kv_bits ≥ 8) and "float32" elsewhere; "float32" can be forced (the former
        cache, for comparisons); "int8" is refused where it would not be exact."""
        from needle_cy.threads import get_num_threads
        if numerics not in NUMERICS:
            raise ValueError(f"numerics must be one of {NUMERICS}, got {numerics!r}")
        if kv_storage is not None and kv_storage not in KV_STORAGES:
            raise ValueError(f"kv_storage must be one of {KV_STORAGES} or None, got {kv_storage!r}")
        if window is not None and window < 1:
            raise ValueError(f"window must be >= 1 or None, got {window}")
        if sinks < 0 or (window is not None and sinks >= window):
            raise ValueError(f"sinks must lie in [0, window) = [0, {window}), got {sinks}")
        w = weights
        self.w = w
        self.numerics = numerics
        self.quant = numerics == "deploy"
        self.window = window
        self.sinks = int(sinks) if window is not None else 0
        self.recent = -1 if window is None else int(window) - self.sinks
        self.threads = int(get_num_threads(threads))
        self._run_threads = self.threads
        self._keep = []
        self._lut_arena = None
        self._head_dense = {}

        # geometry
        self.d, self.n, self.H, self.K = w.d_model, w.mhc_lanes, w.num_heads, w.num_kv_heads
        self.dq, self.dv, self.L, self.N = w.qk_head_dim, w.v_head_dim, w.num_layers, w.hada_n
        self.C = w.qkv_conv_taps
        self.V, self.V_out, self.max_seq = w.vocab, w.out_vocab, w.max_seq_len
        if self.n > MAX_LANES or self.C > MAX_TAPS or w.engram_conv_taps > MAX_TAPS:
            raise ValueError(f"CythonEngine supports at most {MAX_LANES} lanes and {MAX_TAPS} taps")
        if self.H // max(self.K, 1) > 64:
            raise ValueError(f"CythonEngine supports at most 64 query heads per KV head")
        if self.H % self.K:
            raise ValueError(f"num_heads {self.H} is not a multiple of num_kv_heads {self.K}")
        if self.dq % 2:
            raise ValueError(f"qk_head_dim {self.dq} must be even (RoPE rotates halves)")
        if len(w.engram_orders) > 8:
            raise ValueError("CythonEngine supports at most 8 engram orders")
        self.kv_bits = int(w.kv_bits)
        int8_exact = self.quant and self.kv_bits >= 8
        if kv_storage == "int8" and not int8_exact:
            raise ValueError("kv_storage='int8' needs deploy numerics and kv_bits >= 8 "
                             "(the A8 KV quantizer); this engine quantizes KV otherwise")
        self.kv_storage = kv_storage or ("int8" if int8_exact else "float32")
        self.kv_int8 = self.kv_storage == "int8"
        self.nq4 = (self.dq + 3) // 4
        self.emb_scale = np.float32(np.sqrt(self.d))
        self.attn_scale = np.float32(1.0) / np.float32(np.sqrt(self.dq))
        if window is None:
            self.cap = self.max_seq
        else:
            self.cap = min(int(window), self.max_seq) + CHUNK_MAX

        # engram
        self.n_sites = len(w.engram_sites)
        self.n_orders = len(w.engram_orders)
        for i, o in enumerate(w.engram_orders):
            self.orders[i] = int(o)
        self.E = w.engram_heads
        self.stride = w.engram_seed_stride
        self.NT = self.n_orders * self.E
        self.sub = w.engram_sub_dim
        self.slots = w.engram_slots
        self.e_taps = w.engram_conv_taps
        self.e_dil = w.engram_conv_dilation
        self.n_tok_hist = max(w.engram_orders, default=1) - 1
        self.n_vhist = (self.e_taps - 1) * self.e_dil

        self._bind(w)
        self._alloc_scratch()
        self.state = self._fresh_state()

    # ------------------------------------------------------------------ binding
    cdef const float* _f32(self, arr):
        a = np.ascontiguousarray(np.asarray(arr, dtype=np.float32))
        self._keep.append(a)
        return fptr(a)

    cdef CQView _view(self, W, bint products=True, bint head=False):
        """The kernels' view of CQ matrix W; products=False for one whose rows are only
        gathered (the engram tables: no lookup layout, 17 MB at 2 bits); head=True for
        the tied embedding, whose products are the logits."""
        cdef CQWeight cw = prepare(W)
        self._keep.append(cw)
        if products and self.quant and kernel_name() in LUT_KERNELS and (head or field_bits_of(W.bits) == 2):
            # the lookup layout of the lookup kernel in force (avx512lut, avx2lut: one
            # arena per engine, on huge pages); not made when another kernel was forced.  2-bit fields (2 bits,
            # ternary) take it everywhere; 3- and 4-bit ones only for the head.  At 4
            # bits a table entry is one codeword times one code, rounded to int16: about
            # 1e-4 of a row's value, where the two-product kernel is exact to float32.
            # Every body output is A8-quantized again downstream, and those roundings
            # amplify it: the official 4-bit fixtures' deploy logits moved from mean |Δ|
            # 0.002–0.007 to 0.010–0.011 (the bar is 0.01; the gate projection alone
            # took a 6-token case from 0.0002 to 0.005).  The head's outputs are the
            # logits themselves (no A8 after them): there it moved nothing measurable.
            # The head is a quarter of a 4-bit decode step's multiply-adds; its lookup
            # matvec is a little faster (DRAM-bound), the whole step's gain within noise.
            if self._lut_arena is None:
                self._lut_arena = LutArena()
            cw.enable_lut(self._lut_arena)
        cdef CQView v = cw.view
        v.a8_input = 1 if self.quant else 0   # deploy: every CQ input is an A8 vector (integer kernel)
        return v

    cdef _bind(self, w):
        cdef LayerC* lc
        cdef SiteC* sc
        cdef Py_ssize_t i
        self._layers_buf = b"\0" * (sizeof(LayerC) * max(1, self.L))
        self.layers = <LayerC*><char*>self._layers_buf
        self._sites_buf = b"\0" * (sizeof(SiteC) * max(1, self.n_sites))
        self.sites = <SiteC*><char*>self._sites_buf
        self.emb = self._view(w.embedding, True, True)   # (products, head)
        self.emb_out = self.emb
        self.emb_out.rows = self.V_out          # the tied head uses the first out_vocab rows
        self.final_norm = self._f32(w.final_norm)
        p1 = np.ascontiguousarray(np.asarray(w.hada_p1, np.int64))
        p2 = np.ascontiguousarray(np.asarray(w.hada_p2, np.int64))
        if p1.shape != (self.N,) or p2.shape != (self.N,) or p1.min() < 0 or p2.min() < 0 \
                or p1.max() >= self.N or p2.max() >= self.N:
            raise ValueError(f"hada_p1/hada_p2 must be {self.N} indices in [0, {self.N})")
        self._keep += [p1, p2]
        self.p1, self.p2 = iptr(p1), iptr(p2)
        if self.L:
            self.ba, self.bb = w.layers[0].mlp.w1a.shape[0], w.layers[0].mlp.w1b.shape[0]
            self.R_cond = w.layers[0].mlp.cond_u.shape[0]
        for i, layer in enumerate(w.layers):
            lc = &self.layers[i]
            m = ops.MonarchArrays(layer.mlp)       # validates shapes
            if (m.ba, m.bb, m.R, m.N, m.d) != (self.ba, self.bb, self.R_cond, self.N, self.d):
                raise ValueError(f"layer {i}: Monarch MLP shapes differ from layer 0")
            lc.q_proj = self._view(layer.q_proj)
            lc.k_proj = self._view(layer.k_proj)
            lc.v_proj = self._view(layer.v_proj)
            lc.gate_proj = self._view(layer.gate_proj)
            lc.out_proj = self._view(layer.out_proj)
            lc.phi_pre = self._view(layer.mhc.phi_pre)
            lc.phi_post = self._view(layer.mhc.phi_post)
            lc.phi_res = self._view(layer.mhc.phi_res)
            self._check_view(lc.q_proj, self.H * self.dq, self.d, f"layer {i} q_proj")
            self._check_view(lc.k_proj, self.K * self.dq, self.d, f"layer {i} k_proj")
            self._check_view(lc.v_proj, self.K * self.dv, self.d, f"layer {i} v_proj")
            self._check_view(lc.gate_proj, self.H * self.dv, self.d, f"layer {i} gate_proj")
            self._check_view(lc.out_proj, self.d, self.H * self.dv, f"layer {i} out_proj")
            self._check_view(lc.phi_pre, self.n, self.n * self.d, f"layer {i} phi_pre")
            self._check_view(lc.phi_post, self.n, self.n * self.d, f"layer {i} phi_post")
            self._check_view(lc.phi_res, self.n * self.n, self.n * self.d, f"layer {i} phi_res")
            lc.phi_shared = cq_same_rotation(&lc.phi_pre, &lc.phi_post) and cq_same_rotation(&lc.phi_pre, &lc.phi_res)
            lc.qkvg_shared = (cq_same_rotation(&lc.q_proj, &lc.k_proj) and cq_same_rotation(&lc.q_proj, &lc.v_proj)
                              and cq_same_rotation(&lc.q_proj, &lc.gate_proj))
            lc.norm_in = self._f32(layer.norm_in)
            lc.post_norm = self._f32(layer.post_norm)
            lc.pre_hada = self._f32(layer.pre_hada)
            lc.q_norm = self._f32(layer.q_norm)
            lc.k_norm = self._f32(layer.k_norm)
            if self.C:
                lc.q_taps = self._f32(np.asarray(layer.q_taps).reshape(self.C, self.H * self.dq))
                lc.k_taps = self._f32(np.asarray(layer.k_taps).reshape(self.C, self.K * self.dq))
                lc.v_taps = self._f32(np.asarray(layer.v_taps).reshape(self.C, self.K * self.dv))
            else:
                lc.q_taps = lc.k_taps = lc.v_taps = NULL
            lc.attn_gate = float(ops.sigmoid(np.float32(layer.attn_gate)))
            lc.a_pre, lc.a_post, lc.a_res = layer.mhc.a_pre, layer.mhc.a_post, layer.mhc.a_res
            lc.b_pre = self._f32(np.asarray(layer.mhc.b_pre).reshape(self.n))
            lc.b_post = self._f32(np.asarray(layer.mhc.b_post).reshape(self.n))
            lc.b_res = self._f32(np.asarray(layer.mhc.b_res).reshape(self.n * self.n))
            lc.d1, lc.d2, lc.b2, lc.d3, lc.d4 = (self._f32(m.d1), self._f32(m.d2), self._f32(m.b2),
                                                 self._f32(m.d3), self._f32(m.d4))
            lc.w1a, lc.w1b, lc.w2a = self._f32(m.w1a), self._f32(m.w1b), self._f32(m.w2a)
            lc.w2b, lc.w3a, lc.w3b = self._f32(m.w2b), self._f32(m.w3a), self._f32(m.w3b)
            lc.cond_v, lc.cond_u = self._f32(m.cond_v), self._f32(m.cond_u)
            lc.lane = layer.lane
            lc.band = -1 if (layer.is_global or w.sliding_window <= 0) else int(w.sliding_window)
            lc.site = -1 if layer.engram_site is None else int(layer.engram_site)
        for i, site in enumerate(w.engram_sites):
            sc = &self.sites[i]
            sc.tables = self._view(site.tables, False)
            sc.key_proj = self._view(site.key_proj)
            sc.value_proj = self._view(site.value_proj)
            self._check_view(sc.tables, self.NT * self.slots, self.sub, f"engram site {i} tables")
            self._check_view(sc.key_proj, self.d, self.NT * self.sub, f"engram site {i} key_proj")
            self._check_view(sc.value_proj, self.d, self.NT * self.sub, f"engram site {i} value_proj")
            sc.taps = self._f32(np.asarray(site.taps).reshape(self.e_taps, self.d))
        self._plan_sites(w)
        self._check_view(self.emb, self.V, self.d, "embedding")
        if self.V_out > self.V:
            raise ValueError(f"out_vocab {self.V_out} exceeds vocab {self.V}")
        if self.kv_bits < 8:
            lv = ops.kv_codebook(self.kv_bits)
            self.kv_levels = self._f32(lv)
            self.n_kv_levels = lv.shape[0]
        cos_t, sin_t = ops.rope_tables(self.max_seq, self.dq, w.rope_theta)
        self.rope_cos, self.rope_sin = self._f32(cos_t), self._f32(sin_t)
        # probe heads: probes decoded once to float32 [R, k, d]
        self.R_cells = self.L + 1
        self._head_names = tuple(w.heads)
        if len(self._head_names) > MAX_HEADS:
            raise ValueError(f"at most {MAX_HEADS} probe heads are supported")
        self.n_heads = len(self._head_names)
        for i, name in enumerate(self._head_names):
            head = w.heads[name]
            probes = self._dense(head.probes).reshape(self.R_cells, head.probes_per_row, self.d)
            self.heads_c[i].probes = self._f32(probes)
            self.heads_c[i].k = head.probes_per_row

    cdef _check_view(self, CQView v, Py_ssize_t rows, Py_ssize_t cols, what):
        if v.rows != rows or v.cols != cols:
            raise ValueError(f"{what}: expected a [{rows}, {cols}] CQ matrix, got [{v.rows}, {v.cols}]")

    def _dense(self, W):
        """float32 copy of a CQ matrix (decoded by the CQ kernels) or of a dense array."""
        key = id(W)
        hit = self._head_dense.get(key)
        if hit is None or hit[0] is not W:
            if hasattr(W, "packed"):
                from needle_cy._cq import dequantize
                dense = dequantize(W)
            else:
                dense = np.asarray(W, np.float32)
            hit = (W, np.ascontiguousarray(dense, dtype=np.float32))
            self._head_dense[key] = hit
        return hit[1]

    cdef _alloc_scratch(self):
        cdef Py_ssize_t CH = CHUNK_MAX, d = self.d, n = self.n, T = self.threads
        cdef Py_ssize_t nd = n * d, work = 0, i, step = 0
        self.gate_own_len = (self.H * self.dv + 15) // 16 * 16   # whole cache lines a thread
        sizes = [("lanes", CH * nd), ("nx", CH * nd), ("phi", CH * (2 * n + n * n)),
                 ("u", CH * d), ("x", CH * d), ("a", CH * d),
                 ("q", CH * self.H * self.dq), ("k", CH * self.K * self.dq), ("v", CH * self.K * self.dv),
                 ("qc", CH * self.H * self.dq), ("kc", CH * self.K * self.dq), ("vc", CH * self.K * self.dv),
                 ("g", CH * self.H * self.dv), ("o", CH * self.H * self.dv),
                 ("gate_own", T * self.gate_own_len), ("ao", CH * d),
                 ("cell", CH * d), ("x0", CH * d), ("e", CH * max(1, self.NT * self.sub)),
                 ("ekey", max(1, self.n_sites) * CH * d), ("evraw", CH * d),
                 ("eval", max(1, self.n_sites) * CH * d), ("hid", CH * d)]
        self.mlp_work_len = 4 * self.N + self.R_cond + 16
        sizes.append(("mlp", T * self.mlp_work_len))
        sizes.append(("scores", T * (self.H // self.K) * self.cap))
        sizes.append(("qscale", CH * self.H))
        self.row_len = 1024
        sizes.append(("row", T * self.row_len + 1024))
        # CQ workspace: enough for the widest matrix at a full chunk
        # (and each thread's one-token workspace for the matrices of a decode step)
        cdef LayerC* lc
        work = self._need(&self.emb_out, work)
        step = self._need_step(&self.emb_out, step)
        for i in range(self.L):
            lc = &self.layers[i]
            work = self._need(&lc.q_proj, work)
            work = self._need(&lc.k_proj, work)
            work = self._need(&lc.v_proj, work)
            work = self._need(&lc.gate_proj, work)
            work = self._need(&lc.out_proj, work)
            work = self._need(&lc.phi_pre, work)
            work = self._need(&lc.phi_post, work)
            work = self._need(&lc.phi_res, work)
            step = self._need_step(&lc.q_proj, step)
            step = self._need_step(&lc.k_proj, step)
            step = self._need_step(&lc.v_proj, step)
            step = self._need_step(&lc.gate_proj, step)
            step = self._need_step(&lc.out_proj, step)
            step = self._need_step(&lc.phi_pre, step)
            step = self._need_step(&lc.phi_post, step)
            step = self._need_step(&lc.phi_res, step)
        for i in range(self.n_sites):
            work = self._need(&self.sites[i].key_proj, work)
            work = self._need(&self.sites[i].value_proj, work)
            work = self._need(&self.sites[i].tables, work)
            step = self._need_step(&self.sites[i].key_proj, step)
            step = self._need_step(&self.sites[i].value_proj, step)
        work = self._need(&self.emb, work)
        sizes[-1] = ("row", T * self.row_len + 1024)
        sizes.append(("cq", work + 64))
        # whole cache lines apart, so that no two threads write one
        self.step_work_len = (step + 15) // 16 * 16
        sizes.append(("step", T * self.step_work_len + 16))
        total = sum(s for _, s in sizes) + 16 * len(sizes)
        self._scratch = np.zeros(total, np.float32)
        cdef float* base = fptr(self._scratch)
        cdef Py_ssize_t off = 0
        ptrs = {}
        for name, size in sizes:
            ptrs[name] = off
            off += size + 16                # keep each buffer 64-byte aligned-ish apart
        self.s_lanes = base + <Py_ssize_t>ptrs["lanes"]
        self.s_nx = base + <Py_ssize_t>ptrs["nx"]
        self.s_phi = base + <Py_ssize_t>ptrs["phi"]
        self.s_u = base + <Py_ssize_t>ptrs["u"]
        self.s_x = base + <Py_ssize_t>ptrs["x"]
        self.s_a = base + <Py_ssize_t>ptrs["a"]
        self.s_q = base + <Py_ssize_t>ptrs["q"]
        self.s_k = base + <Py_ssize_t>ptrs["k"]
        self.s_v = base + <Py_ssize_t>ptrs["v"]
        self.s_qc = base + <Py_ssize_t>ptrs["qc"]
        self.s_kc = base + <Py_ssize_t>ptrs["kc"]
        self.s_vc = base + <Py_ssize_t>ptrs["vc"]
        self.s_g = base + <Py_ssize_t>ptrs["g"]
        self.s_o = base + <Py_ssize_t>ptrs["o"]
        self.s_gate_own = base + <Py_ssize_t>ptrs["gate_own"]
        self.s_ao = base + <Py_ssize_t>ptrs["ao"]
        self.s_cell = base + <Py_ssize_t>ptrs["cell"]
        self.s_x0 = base + <Py_ssize_t>ptrs["x0"]
        self.s_e = base + <Py_ssize_t>ptrs["e"]
        self.s_ekey = base + <Py_ssize_t>ptrs["ekey"]
        self.s_evraw = base + <Py_ssize_t>ptrs["evraw"]
        self.s_eval = base + <Py_ssize_t>ptrs["eval"]
        self.s_hid = base + <Py_ssize_t>ptrs["hid"]
        self.s_mlp_work = base + <Py_ssize_t>ptrs["mlp"]
        self.s_scores = base + <Py_ssize_t>ptrs["scores"]
        self.s_qscale = base + <Py_ssize_t>ptrs["qscale"]
        # int8 codes of the chunk's queries (zero padding stays zero: only dq codes are written)
        cdef Py_ssize_t n_qcode = CH * self.H * 4 * self.nq4
        self._scratch_i8 = np.zeros(n_qcode + CH * self.K * self.dq + 128, np.int8)
        self.s_qcode = <int8_t*>cnp.PyArray_DATA(self._scratch_i8)
        self.s_kcode = self.s_qcode + n_qcode + 64
        self.s_row = base + <Py_ssize_t>ptrs["row"]
        self.s_cq_work = base + <Py_ssize_t>ptrs["cq"]
        self.s_step_work = base + (<Py_ssize_t>ptrs["step"] + 15) // 16 * 16   # (the array is 64-byte aligned)
        self._ctx_arr = np.zeros(self.n_tok_hist + CH, np.int64)
        self.s_ctx = iptr(self._ctx_arr)
        # each thread's prefetch stream, on its own lines, planned at its first step
        cdef Py_ssize_t pf_bytes = sizeof(nc_pf_stream)     # (a multiple of 64)
        self._pf_arr = np.zeros(T * pf_bytes + T * 64 + 128, np.uint8)
        cdef char* pf_base = <char*>cnp.PyArray_DATA(self._pf_arr)
        pf_base = pf_base + (64 - (<Py_ssize_t>pf_base) % 64) % 64
        self.pf_streams = <nc_pf_stream*>pf_base
        self.pf_planned = <int*>(pf_base + T * pf_bytes)
        self.pf_ahead = prefetch_ahead_bytes()
        self.mlp_team = mlp_team_min()

    cdef _plan_sites(self, w):
        """When a decode step's team leaves the Monarch MLP to thread 0 (smaller than
        mlp_team_min), the last thread waits in two places of every block: through
        thread 0's serial start (router input, Φ, block input; beside the pools) and
        through its MLP.  It runs the engram sites there instead of in phases of their
        own before block 0 (_step_blocks).  A site is four units (_site_unit): its input
        and its value conv (short: in a block's start), its key product and its value
        product (one per MLP).  The units go in the order of the first layer that reads
        each site and in the first window of their kind, except that all of a site's
        units left run in the MLP of the block before that layer, its deadline:
        site_upto[w] units by the end of window w (2l: block l's start, 2l + 1: its MLP).
        sites_late: every site is read after block 0 (a site read by block 0 keeps the
        phases before it), and sites_late_mode() agrees (by default: every site
        product runs by table lookup, fast enough to fit the MLP)."""
        cdef Py_ssize_t L = self.L, S = self.n_sites, i, win
        first = {}
        for l, layer in enumerate(w.layers):
            if layer.engram_site is not None:
                first.setdefault(int(layer.engram_site), l)
        order = sorted(range(S), key=lambda site: (first.get(site, L), site))   # never read: by the end
        deadline = [2 * first.get(site, L) - 1 for site in order]               # its reader's last MLP
        self._site_plan_arr = np.zeros(max(1, S) + max(1, 2 * L), np.int32)
        self.site_order = <int*>cnp.PyArray_DATA(self._site_plan_arr)
        self.site_upto = self.site_order + max(1, S)
        for i in range(S):
            self.site_order[i] = order[i]
        unit = 0
        for win in range(2 * L):
            mlp = win % 2 == 1
            if mlp and unit < 4 * S and unit % 4 in (1, 2):
                unit += 1                                  # a product in an MLP
            elif not mlp:
                while unit < 4 * S and unit % 4 in (0, 3):
                    unit += 1                              # inputs and convs in a block's start
            while unit < 4 * S and deadline[unit // 4] <= win:
                unit += 1                                  # what is due
            self.site_upto[win] = unit
        mode = sites_late_mode()
        lut = True
        for i in range(S):
            lut = lut and self.sites[i].key_proj.lut_bits != NULL and self.sites[i].value_proj.lut_bits != NULL
        self.sites_late = (S > 0 and L > 0 and min(deadline) >= 1 and mode != "0"
                           and (mode == "1" or lut))

    cdef Py_ssize_t _need_step(self, const CQView* v, Py_ssize_t work):
        """Grow a thread's one-token step workspace to fit matrix v."""
        cdef Py_ssize_t need = cq_work_floats(v, 1, 1)
        return need if need > work else work

    cdef Py_ssize_t _need(self, const CQView* v, Py_ssize_t work):
        """Grow the CQ workspace / row scratch sizes to fit matrix v at a full chunk."""
        cdef Py_ssize_t need = cq_work_floats(v, CHUNK_MAX, self.threads)
        if v.group_size > self.row_len:
            self.row_len = v.group_size
        return need if need > work else work

    cdef EngineState _fresh_state(self):
        cdef EngineState st = EngineState()
        hist = max(self.C - 1, 0)
        st.position = 0
        st.owner = id(self)
        if self.kv_int8:
            st.k_cache = lazy_empty((self.L, self.K, self.nq4, self.cap, 4), np.uint8)
            st.v_cache = lazy_empty((self.L, self.K, self.cap, self.dv), np.int8)
            st.k_scale = lazy_empty((self.L, self.K, self.cap))
            st.v_scale = lazy_empty((self.L, self.K, self.cap))
        else:
            st.k_cache = lazy_empty((self.L, self.K, self.dq, self.cap))   # keys transposed
            st.v_cache = lazy_empty((self.L, self.K, self.cap, self.dv))
            st.k_scale = st.v_scale = None
        st.conv_q = np.zeros((self.L, hist, self.H * self.dq), np.float32)
        st.conv_k = np.zeros((self.L, hist, self.K * self.dq), np.float32)
        st.conv_v = np.zeros((self.L, hist, self.K * self.dv), np.float32)
        st.value_hist = np.zeros((max(1, self.n_sites), max(1, self.n_vhist), self.d), np.float32)
        st.tokens = np.zeros(max(1, self.n_tok_hist), np.int64)
        st.pools = []
        for i in range(self.n_heads):
            k = self.heads_c[i].k
            st.pools.append((np.full((self.R_cells, k), -np.inf, np.float32),
                             np.zeros((self.R_cells, k), np.float32),
                             np.zeros((self.R_cells, k, self.d), np.float32)))
        return st

    # ---------------------------------------------------------------- interface
    @property
    def position(self):
        return self.state.position

    @property
    def capacity(self):
        """KV slots per layer and KV head."""
        return self.cap

    def reset(self):
        self.state = self._fresh_state()

    def set_sinks(self, sinks):
        """Change the pinned sink count; only valid while nothing was evicted (position < window)."""
        if self.window is None:
            return
        if not 0 <= sinks < self.window:
            raise ValueError(f"sinks must lie in [0, window) = [0, {self.window}), got {sinks}")
        if self.state.position >= self.window:
            raise ModelStateError("set_sinks: the window has already wrapped")
        # slots equal positions until the window first wraps, so the ring needs no remapping
        self.sinks = int(sinks)
        self.recent = int(self.window) - self.sinks

    def snapshot(self):
        """A copy of the state (only the KV slots in use are copied)."""
        cdef EngineState st = self.state
        cdef EngineState c = EngineState()
        used = min(st.position, self.cap)
        c.position = st.position
        c.owner = st.owner
        c.k_cache = np.ascontiguousarray(st.k_cache[:, :, :, :used])    # slot axis 3 in both layouts
        c.v_cache = np.ascontiguousarray(st.v_cache[:, :, :used])
        if st.k_scale is not None:
            c.k_scale = np.ascontiguousarray(st.k_scale[:, :, :used])
            c.v_scale = np.ascontiguousarray(st.v_scale[:, :, :used])
        c.conv_q, c.conv_k, c.conv_v = st.conv_q.copy(), st.conv_k.copy(), st.conv_v.copy()
        c.value_hist, c.tokens = st.value_hist.copy(), st.tokens.copy()
        c.pools = [tuple(a.copy() for a in p) for p in st.pools]
        return c

    def restore(self, snap):
        if not isinstance(snap, EngineState) or snap.owner != id(self):
            raise ModelStateError("restore: the snapshot was not taken from this engine")
        cdef EngineState s = snap
        cdef EngineState st = self._fresh_state()
        used = s.v_cache.shape[2]
        st.position = s.position
        st.k_cache[:, :, :, :used] = s.k_cache
        st.v_cache[:, :, :used] = s.v_cache
        if st.k_scale is not None:
            st.k_scale[:, :, :used] = s.k_scale
            st.v_scale[:, :, :used] = s.v_scale
        st.conv_q, st.conv_k, st.conv_v = s.conv_q.copy(), s.conv_k.copy(), s.conv_v.copy()
        st.value_hist, st.tokens = s.value_hist.copy(), s.tokens.copy()
        st.pools = [tuple(a.copy() for a in p) for p in s.pools]
        self.state = st

    def forward(self, ids):
        """Logits [T, out_vocab] of a fresh sequence at every position (state untouched)."""
        return self.forward_cells(ids, cells=False)[0]

    def forward_cells(self, ids, cells=True):
        """(logits [T, out_vocab], cells [T, D+1, d] or None) of a fresh sequence."""
        ids = self._check_ids(ids)
        cdef EngineState st = self._fresh_state()
        T = ids.shape[0]
        logits = np.empty((T, self.V_out), np.float32)
        cell_out = np.empty((T, self.R_cells, self.d), np.float32) if cells else None
        self._run(st, ids, logits, cell_out, True, False)
        return logits, cell_out

    def prefill(self, ids):
        """Append ids to the state (batched chunks); logits of the last position."""
        ids = self._check_ids(ids)
        logits = np.empty((1, self.V_out), np.float32)
        self._run(self.state, ids, logits, None, False, True)
        return logits[0]

    def step(self, token):
        """Append one token; its logits [out_vocab]."""
        cdef int64_t tok = token
        if tok < 0 or tok >= self.V:
            raise ValueError(f"token ids must lie in [0, {self.V})")
        ids = np.empty(1, np.int64)
        (<int64_t*>cnp.PyArray_DATA(ids))[0] = tok
        logits = np.empty((1, self.V_out), np.float32)
        self._run(self.state, ids, logits, None, False, True)
        return logits[0]

    def head_outputs(self):
        return self._heads_from_pools(self.state)

    def head_outputs_for(self, ids):
        ids = self._check_ids(ids)
        cdef EngineState st = self._fresh_state()
        self._run(st, ids, None, None, False, True)
        return self._heads_from_pools(st)

    def heads_from_cells(self, cells, ids=None):
        """Head outputs from whole-sequence cells [T, D+1, d] (non-online pooling, for tests)."""
        keep = None if ids is None else np.asarray(ids) != PAD_ID
        out = {}
        for i, name in enumerate(self._head_names):
            head = self.w.heads[name]
            probes = self._dense(head.probes).reshape(self.R_cells, head.probes_per_row, self.d)
            z = ops.probe_pool(cells, probes, head.gain, self._dense(head.query), head.row_bias, keep)
            out[name] = ops.HEAD_POST[name](ops.probe_head_output(z, self._dense(head.proj), head.bias))
        return out

    def _heads_from_pools(self, EngineState st):
        out = {}
        for i, name in enumerate(self._head_names):
            head = self.w.heads[name]
            mx, den, weighted = st.pools[i]
            if bool(np.all(np.isneginf(mx))):
                raise ModelStateError("head_outputs: no (non-PAD) token has been fed since reset")
            pooled = (weighted / den[..., None]).astype(np.float32)
            z = ops.probe_pool_rows(pooled, head.gain, self._dense(head.query), head.row_bias)
            out[name] = ops.HEAD_POST[name](ops.probe_head_output(z, self._dense(head.proj), head.bias))
        return out

    def _check_ids(self, ids):
        arr = np.ascontiguousarray(np.asarray(ids, dtype=np.int64).reshape(-1))
        if arr.size == 0:
            raise ValueError("empty token sequence")
        if arr.min() < 0 or arr.max() >= self.V:
            raise ValueError(f"token ids must lie in [0, {self.V})")
        return arr

    # ------------------------------------------------------------ forward pass
    def _run(self, EngineState st, cnp.ndarray ids, logits, cells, bint all_logits, bint pool):
        """Feed ids chunk by chunk; logits rows for every token (all_logits) or the last."""
        cdef Py_ssize_t T = ids.shape[0], t0, nt
        if st.position + T > self.max_seq or (self.window is None and st.position + T > self.cap):
            raise ContextOverflowError(
                f"{T} token(s) at position {st.position} would exceed max_seq_len {self.max_seq}")
        cdef float* lp
        cdef float* cp
        t0 = 0
        while t0 < T:
            nt = min(CHUNK_MAX, T - t0)
            if logits is None:
                lp = NULL
            elif all_logits:
                lp = fptr(logits) + t0 * self.V_out
            elif t0 + nt == T:
                lp = fptr(logits)
            else:
                lp = NULL
            cp = NULL if cells is None else fptr(cells) + t0 * self.R_cells * self.d
            self._run_chunk(st, iptr(ids) + t0, nt, lp, all_logits, cp, pool)
            t0 += nt

    cdef void _slot_ranges(self, Py_ssize_t t, Py_ssize_t band, Py_ssize_t* rng, int* n_rng) noexcept nogil:
        """Cache slots visible from position t, as half-open ranges (spec §9.2)."""
        cdef Py_ssize_t band_lo = 0, lo, s_end, a, b, S = self.sinks, ring = self.cap - S
        cdef int k = 0
        if band >= 0 and t - band + 1 > 0:
            band_lo = t - band + 1
        lo = band_lo
        if self.recent >= 0 and t - self.recent + 1 > lo:
            lo = t - self.recent + 1
        # sinks that the band still shows: positions [band_lo, min(S, lo))
        s_end = S if S < lo else lo
        if self.recent >= 0 and band_lo < s_end:
            rng[0] = band_lo
            rng[1] = s_end
            k = 1
        if self.window is None:
            rng[2 * k] = lo
            rng[2 * k + 1] = t + 1
            n_rng[0] = k + 1
            return
        # recent positions [lo, t]: below S they sit at their own slot, above it in the ring
        if lo < S:
            b = t + 1 if t + 1 < S else S
            rng[2 * k] = lo
            rng[2 * k + 1] = b
            k += 1
            lo = S
        if lo <= t:
            a = S + (lo - S) % ring
            b = S + (t - S) % ring
            if a <= b:
                rng[2 * k] = a
                rng[2 * k + 1] = b + 1
                k += 1
            else:
                rng[2 * k] = a
                rng[2 * k + 1] = self.cap
                rng[2 * k + 2] = S
                rng[2 * k + 3] = b + 1
                k += 2
        n_rng[0] = k

    cdef inline Py_ssize_t _slot(self, Py_ssize_t p) noexcept nogil:
        if self.window is None or p < self.sinks:
            return p
        return self.sinks + (p - self.sinks) % (self.cap - self.sinks)

    cdef _run_chunk(self, EngineState st, const int64_t* ids, Py_ssize_t T, float* logits,
                    bint all_rows, float* cells, bint pool):
        """Advance st by T ≤ CHUNK_MAX tokens: the forward pass of spec §4, top to bottom.

        logits: NULL, or [T, out_vocab] (all_logits) / [1, out_vocab] (last token only).
        cells: NULL or [T, D+1, d].  pool: fold the cells into the online probe pools."""
        cdef Py_ssize_t d = self.d, n = self.n, nd = self.n * self.d, H = self.H, K = self.K
        cdef Py_ssize_t dq = self.dq, dv = self.dv
        cdef Py_ssize_t qw = H * dq, kw = K * dq, vw = K * dv, gw = H * dv
        cdef Py_ssize_t nphi = 2 * n + n * n
        cdef Py_ssize_t pos0 = st.position, t, i, m, c, l, s, hd
        cdef Py_ssize_t hist = self.C - 1 if self.C > 0 else 0
        cdef int ntok = <int>(T if T < self._run_threads else self._run_threads)
        cdef int cq_threads = self._run_threads
        cdef float* cqw = self.s_cq_work                 # CQ kernel workspace
        cdef LayerC* lc
        cdef SiteC* sc
        cdef float* conv_q = fptr(st.conv_q)
        cdef float* conv_k = fptr(st.conv_k)
        cdef float* conv_v = fptr(st.conv_v)
        cdef KVCache kv
        cdef float* vhist = fptr(st.value_hist)
        cdef int64_t* tokhist = iptr(st.tokens)
        cdef bint quant = self.quant
        cdef float* lanes = self.s_lanes
        cdef float* nx = self.s_nx
        cdef float* phi = self.s_phi
        cdef Py_ssize_t nth = self.n_tok_hist, NT = self.NT, sub = self.sub
        cdef Py_ssize_t R_cells = self.R_cells, L = self.L
        cdef float* pmax[MAX_HEADS]
        cdef float* pden[MAX_HEADS]
        cdef float* psum[MAX_HEADS]
        cdef Py_ssize_t n_heads = self.n_heads if pool else 0
        cdef float* hid = self.s_hid
        cdef Py_ssize_t first
        cdef bint stepped, teamed
        cdef const CQView* ws[4]
        cdef float* ys[4]
        cdef Py_ssize_t ystr[4]

        memset(&kv, 0, sizeof(KVCache))
        if self.kv_int8:
            kv.k_codes = <uint8_t*>cnp.PyArray_DATA(st.k_cache)
            kv.v_codes = <int8_t*>cnp.PyArray_DATA(st.v_cache)
            kv.k_scale = fptr(st.k_scale)
            kv.v_scale = fptr(st.v_scale)
        else:
            kv.k = fptr(st.k_cache)
            kv.v = fptr(st.v_cache)
        for hd in range(n_heads):
            pmax[hd] = fptr(st.pools[hd][0])
            pden[hd] = fptr(st.pools[hd][1])
            psum[hd] = fptr(st.pools[hd][2])

        with nogil:
            # ---- embedding: x0 = E[tok]·sqrt(d); every lane starts as x0 (spec §4.3, §4.5)
            for t in range(T):
                cq_dequantize_row(&self.emb, ids[t], self.s_x0 + t * d, self.s_row)
                for c in range(d):
                    self.s_x0[t * d + c] = self.s_x0[t * d + c] * self.emb_scale
                for m in range(n):
                    memcpy(lanes + t * nd + m * d, self.s_x0 + t * d, d * sizeof(float))
                if cells != NULL:
                    memcpy(cells + t * R_cells * d, self.s_x0 + t * d, d * sizeof(float))
            self._pool_chunk(0, self.s_x0, ids, T, n_heads, pmax, pden, psum, ntok)

            # a decode step on several threads: one parallel region for the engram
            # products and all blocks (_step_blocks)
            stepped = T == 1 and self._run_threads > 1 and cells == NULL and L > 0

            # ---- engram memory of every site (spec §4.4): keys and conv'd values of the chunk
            if self.n_sites > 0:
                for i in range(nth):
                    self.s_ctx[i] = tokhist[i]
                for t in range(T):
                    self.s_ctx[nth + t] = ids[t]
                if T == 1:
                    self._prefetch_engram_rows(pos0)
                # (a decode step on several threads runs the sites in _step_blocks' region)
                for s in range(0 if stepped else self.n_sites):
                    sc = &self.sites[s]
                    self._engram_input(sc, T, pos0, self.s_row)
                    # keys and values read the same input: one rotation when their CQ layouts agree
                    cq_rotate(&sc.key_proj, self.s_e, T, NT * sub, cqw, cq_threads)
                    _project_shared(&sc.key_proj, &sc.key_proj, self.s_e, T, NT * sub,
                                    self.s_ekey + s * CHUNK_MAX * d, d, cqw, cq_threads)
                    _project_shared(&sc.key_proj, &sc.value_proj, self.s_e, T, NT * sub, self.s_evraw, d, cqw, cq_threads)
                    self._engram_values(s, sc, T, pos0, vhist)
                if nth > 0:
                    for i in range(nth):
                        tokhist[i] = self.s_ctx[T + i]

            # ---- the blocks
            if stepped:
                with parallel(num_threads=self._run_threads):
                    self._step_blocks(threadid(), nc_team_size(), pos0, ids, conv_q, conv_k, conv_v,
                                      &kv, vhist, n_heads, pmax, pden, psum, logits)
            # a chunk of several tokens on several threads: the blocks in one region too
            teamed = T > 1 and ntok > 1 and cells == NULL and L > 0
            if teamed:
                with parallel(num_threads=ntok):
                    self._chunk_blocks(threadid(), nc_team_size(), T, pos0, ids, conv_q, conv_k, conv_v,
                                       &kv, n_heads, pmax, pden, psum)
            for l in range(0 if (stepped or teamed) else L):
                lc = &self.layers[l]
                band = lc.band
                # mHC router input nx = A8(RMSunit(flatten X))                        (spec §4.5)
                if ntok > 1:
                    for t in prange(T, num_threads=ntok, schedule="static"):
                        self._router_input(t)
                else:
                    for t in range(T):
                        self._router_input(t)
                cq_rotate(&lc.phi_pre, nx, T, nd, cqw, cq_threads)
                if lc.phi_shared and T > 1:
                    self._phi_list(lc, ws, ys)
                    self._group_products(ws, ys, nphi, 3, T)
                else:
                    _project_shared(&lc.phi_pre, &lc.phi_pre, nx, T, nd, phi, nphi, cqw, cq_threads)
                    if not cq_same_rotation(&lc.phi_pre, &lc.phi_post):
                        cq_rotate(&lc.phi_pre, nx, T, nd, cqw, cq_threads)
                    _project_shared(&lc.phi_pre, &lc.phi_post, nx, T, nd, phi + n, nphi, cqw, cq_threads)
                    if not cq_same_rotation(&lc.phi_pre, &lc.phi_post):
                        cq_rotate(&lc.phi_pre, nx, T, nd, cqw, cq_threads)
                    _project_shared(&lc.phi_pre, &lc.phi_res, nx, T, nd, phi + 2 * n, nphi, cqw, cq_threads)
                if ntok > 1:
                    for t in prange(T, num_threads=ntok, schedule="static"):
                        self._mhc_in(lc, t)
                else:
                    for t in range(T):
                        self._mhc_in(lc, t)
                # block input after the engram gate (spec §4.6), then a = A8(ZCRMS(x))
                if ntok > 1:
                    for t in prange(T, num_threads=ntok, schedule="static"):
                        self._block_in(lc, t)
                else:
                    for t in range(T):
                        self._block_in(lc, t)
                # attention projections (spec §4.7 step 1)
                # (one rotation of a shared by the four products when their CQ layouts agree)
                cq_rotate(&lc.q_proj, self.s_a, T, d, cqw, cq_threads)
                if lc.qkvg_shared and T > 1:
                    # the four products as one list of rows, cut into one share per thread
                    self._qkvg_list(lc, ws, ys)
                    ystr[0] = qw
                    ystr[1] = kw
                    ystr[2] = vw
                    ystr[3] = gw
                    self._group_products_strided(ws, ys, ystr, 4, T)
                else:
                    _project_shared(&lc.q_proj, &lc.q_proj, self.s_a, T, d, self.s_q, qw, cqw, cq_threads)
                    if not cq_same_rotation(&lc.q_proj, &lc.k_proj):
                        cq_rotate(&lc.q_proj, self.s_a, T, d, cqw, cq_threads)
                    _project_shared(&lc.q_proj, &lc.k_proj, self.s_a, T, d, self.s_k, kw, cqw, cq_threads)
                    if not cq_same_rotation(&lc.q_proj, &lc.k_proj):
                        cq_rotate(&lc.q_proj, self.s_a, T, d, cqw, cq_threads)
                    _project_shared(&lc.q_proj, &lc.v_proj, self.s_a, T, d, self.s_v, vw, cqw, cq_threads)
                    if not cq_same_rotation(&lc.q_proj, &lc.v_proj):
                        cq_rotate(&lc.q_proj, self.s_a, T, d, cqw, cq_threads)
                    _project_shared(&lc.q_proj, &lc.gate_proj, self.s_a, T, d, self.s_g, gw, cqw, cq_threads)
                # conv, QK norm, RoPE, quantizers; k and v go into the cache (steps 2–6)
                if ntok > 1:
                    for t in prange(T, num_threads=ntok, schedule="static"):
                        self._qkv_token(lc, l, t, pos0, conv_q, conv_k, conv_v, &kv)
                else:
                    for t in range(T):
                        self._qkv_token(lc, l, t, pos0, conv_q, conv_k, conv_v, &kv)
                if hist > 0:
                    self._shift_history(conv_q + l * hist * qw, hist, self.s_q, T, qw)
                    self._shift_history(conv_k + l * hist * kw, hist, self.s_k, T, kw)
                    self._shift_history(conv_v + l * hist * vw, hist, self.s_v, T, vw)
                # GQA attention over the visible cache slots (steps 7–8), gate, A8 (step 9):
                # a chunk's tokens in parallel (a step's KV heads: _step_blocks)
                if ntok > 1:
                    # (dynamic: a token's cost grows with the slots it sees)
                    for t in prange(T, num_threads=ntok, schedule="dynamic", chunksize=4):
                        self._attend_token(lc, l, t, pos0, &kv)
                else:
                    for t in range(T):
                        self._attend_token(lc, l, t, pos0, &kv)
                _project(&lc.out_proj, self.s_o, T, gw, self.s_ao, d, cqw, cq_threads)
                # rest of the block, y = Block(u) − u, lane update, cell (spec §4.5–§4.8)
                if ntok > 1:
                    for t in prange(T, num_threads=ntok, schedule="static"):
                        self._block_out(lc, t)
                else:
                    for t in range(T):
                        self._block_out(lc, t)
                if cells != NULL:
                    for t in range(T):
                        memcpy(cells + (t * R_cells + l + 1) * d, self.s_cell + t * d, d * sizeof(float))
                self._pool_chunk(l + 1, self.s_cell, ids, T, n_heads, pmax, pden, psum, ntok)

            # ---- output: final norm, A8, tied head (spec §4.9); only the rows asked for
            if logits != NULL and not stepped:
                if L == 0:
                    memcpy(self.s_cell, self.s_x0, T * d * sizeof(float))
                first = 0 if all_rows else T - 1
                for t in range(first, T):
                    zc_rmsnorm_c(self.s_cell + t * d, self.final_norm, hid + (t - first) * d, d)
                    if quant:
                        a8_inplace(hid + (t - first) * d, d, A8_QMAX)
                _project(&self.emb_out, hid, T - first, d, logits, self.V_out, cqw, cq_threads)
        st.position += T

    cdef void _engram_input(self, SiteC* sc, Py_ssize_t T, Py_ssize_t pos0, float* row) noexcept nogil:
        """Site sc's input for the chunk's T tokens into s_e (spec §4.4): per token, the
        table row of each (order, head) n-gram hash that fits in the window (zeros
        otherwise), A8 when quantized.  Reads the token context s_ctx; row: the calling
        thread's dequantization scratch (its part of s_row)."""
        cdef Py_ssize_t NT = self.NT, sub = self.sub, t
        cdef int oi, e
        cdef float* ptr
        cdef int64_t row_id
        for t in range(T):
            for oi in range(self.n_orders):
                for e in range(self.E):
                    ptr = self.s_e + t * NT * sub + (oi * self.E + e) * sub
                    if self._engram_row(oi, e, t, pos0, &row_id):
                        cq_dequantize_row(&sc.tables, row_id, ptr, row)
                    else:
                        memset(ptr, 0, sub * sizeof(float))
            if self.quant:
                a8_inplace(self.s_e + t * NT * sub, NT * sub, A8_QMAX)

    cdef inline bint _engram_row(self, int oi, int e, Py_ssize_t t, Py_ssize_t pos0,
                                 int64_t* row_id) noexcept nogil:
        """The table row of (order oi, head e) for chunk token t (spec §4.4): its n-gram
        hash over the token context s_ctx; 0 where the n-gram does not fit the window.
        Every site hashes the same context with the same seeds (only the tables differ)."""
        cdef int order = self.orders[oi]
        cdef uint32_t seed
        if not _visible(pos0 + t, pos0 + t - (order - 1), self.recent, self.sinks, -1):
            return 0
        seed = <uint32_t>0x9E3779B9u * <uint32_t>(oi * self.stride + e + 1)
        row_id[0] = (oi * self.E + e) * self.slots + \
            <int64_t>(engram_hash_c(self.s_ctx, self.n_tok_hist + t, order, seed) % <uint32_t>self.slots)
        return 1

    cdef void _prefetch_engram_rows(self, Py_ssize_t pos0) noexcept nogil:
        """Ask for the table rows every site's input of a one-token step reads (their
        packed fields and norms), before the first site needs them.  The rows are
        random lines of tables larger than the caches: read one after another they were
        one memory latency each, on thread 0 alone while the team waited; asked for
        together the latencies overlap."""
        cdef int oi, e
        cdef Py_ssize_t s
        cdef int64_t row_id
        cdef const CQView* tb
        for oi in range(self.n_orders):
            for e in range(self.E):
                if self._engram_row(oi, e, 0, pos0, &row_id):
                    for s in range(self.n_sites):
                        tb = &self.sites[s].tables
                        _prefetch_floats(<const float*>(tb.packed + row_id * tb.row_bytes), (tb.row_bytes + 3) // 4)
                        _prefetch_floats(tb.norms + row_id * tb.norm_stride, tb.n_groups)

    cdef void _engram_values(self, Py_ssize_t s, SiteC* sc, Py_ssize_t T, Py_ssize_t pos0,
                             float* vhist) noexcept nogil:
        """Site s's values of the chunk: the dilated causal conv over v' (s_evraw; taps
        at t, t-dil, t-2·dil, ..., the value history first) into s_eval, then the
        history shift."""
        cdef Py_ssize_t d = self.d, vh = self.n_vhist, t, j, src
        cdef Py_ssize_t e_taps = self.e_taps, e_dil = self.e_dil
        cdef const float* hptr[MAX_TAPS]
        for t in range(T):
            for j in range(e_taps):
                src = t - j * e_dil
                if not _visible(pos0 + t, pos0 + src, self.recent, self.sinks, -1):
                    hptr[j] = NULL
                elif src >= 0:
                    hptr[j] = self.s_evraw + src * d
                else:
                    hptr[j] = vhist + (s * vh + vh + src) * d
            conv_step_c(sc.taps, e_taps, d, d, hptr, self.s_eval + (s * CHUNK_MAX + t) * d)
        self._shift_history(vhist + s * vh * d, vh, self.s_evraw, T, d)

    cdef void _chunk_blocks(self, int tid, int nt, Py_ssize_t T, Py_ssize_t pos0, const int64_t* ids,
                            float* conv_q, float* conv_k, float* conv_v, KVCache* kv,
                            Py_ssize_t n_heads, float** pmax, float** pden, float** psum) noexcept nogil:
        """Every block of a chunk of T ≥ 2 tokens, run by each of the nt threads of the
        caller's parallel region (thread tid): _run_chunk's block loop in one region
        instead of about twelve per block (their fork and join showed in a 2-thread prefill's profile).

        The per-token steps go to the threads by contiguous token ranges, so a token's
        lanes, cell and conv inputs stay with one thread from block to block; the
        rotations by the same ranges (cq_rotate_tokens); the products as
        _group_products_strided cuts them (_group_share); the attention by interleaved
        tokens (a token's cost grows with its position); the probe pools by (head,
        probe).  Threads meet at the team barrier between dependent steps; every value
        is the one _run_chunk's loop makes."""
        cdef Py_ssize_t d = self.d, n = self.n, nd = self.n * self.d, H = self.H, K = self.K
        cdef Py_ssize_t qw = H * self.dq, kw = K * self.dq, vw = K * self.dv, gw = H * self.dv
        cdef Py_ssize_t nphi = 2 * n + n * n
        cdef Py_ssize_t hist = self.C - 1 if self.C > 0 else 0
        cdef Py_ssize_t t0 = T * tid // nt, t1 = T * (tid + 1) // nt, t, l, i
        cdef LayerC* lc
        cdef const CQView* ws[4]
        cdef float* ys[4]
        cdef Py_ssize_t ystr[4]
        cdef float* cqw = self.s_cq_work
        cdef nc_barrier* bar = &self.team_bar
        cdef float* kf = cq_decode_scratch()     # this thread's scratch for the rotations
        if tid == 0:
            nc_barrier_init(bar, nt)
        nc_team_barrier()
        for l in range(self.L):
            lc = &self.layers[l]
            # mHC router input, its rotation and the three Φ (spec §4.5)
            for t in range(t0, t1):
                self._router_input(t)
            self._rotate_chunk(&lc.phi_pre, self.s_nx, T, nd, tid, nt, kf, bar)
            if lc.phi_shared:
                self._phi_list(lc, ws, ys)
                for i in range(3):
                    ystr[i] = nphi
                self._group_share(ws, ys, ystr, 3, T, self._by_rows(ws, 3, nt), tid, nt)
            elif tid == 0:
                _project_shared(&lc.phi_pre, &lc.phi_pre, self.s_nx, T, nd, self.s_phi, nphi, cqw, 1)
                _project(&lc.phi_post, self.s_nx, T, nd, self.s_phi + n, nphi, cqw, 1)
                _project(&lc.phi_res, self.s_nx, T, nd, self.s_phi + 2 * n, nphi, cqw, 1)
            nc_barrier_wait(bar)
            # router weights, block input, a = A8(ZCRMS(x)), the attention products
            for t in range(t0, t1):
                self._mhc_in(lc, t)
                self._block_in(lc, t)
            self._rotate_chunk(&lc.q_proj, self.s_a, T, d, tid, nt, kf, bar)
            if lc.qkvg_shared:
                self._qkvg_list(lc, ws, ys)
                ystr[0] = qw
                ystr[1] = kw
                ystr[2] = vw
                ystr[3] = gw
                self._group_share(ws, ys, ystr, 4, T, self._by_rows(ws, 4, nt), tid, nt)
            elif tid == 0:
                _project_shared(&lc.q_proj, &lc.q_proj, self.s_a, T, d, self.s_q, qw, cqw, 1)
                _project(&lc.k_proj, self.s_a, T, d, self.s_k, kw, cqw, 1)
                _project(&lc.v_proj, self.s_a, T, d, self.s_v, vw, cqw, 1)
                _project(&lc.gate_proj, self.s_a, T, d, self.s_g, gw, cqw, 1)
            nc_barrier_wait(bar)
            # conv, QK norm, RoPE, quantizers; k and v into the cache (steps 2–6)
            for t in range(t0, t1):
                self._qkv_token(lc, l, t, pos0, conv_q, conv_k, conv_v, kv)
            nc_barrier_wait(bar)
            # the conv histories (thread 0) beside the attention, gate and A8 (steps 7–9)
            if tid == 0 and hist > 0:
                self._shift_history(conv_q + l * hist * qw, hist, self.s_q, T, qw)
                self._shift_history(conv_k + l * hist * kw, hist, self.s_k, T, kw)
                self._shift_history(conv_v + l * hist * vw, hist, self.s_v, T, vw)
            t = tid
            while t < T:
                self._attend_token(lc, l, t, pos0, kv)
                t = t + nt
            nc_barrier_wait(bar)       # (the rotation reads other threads' tokens' outputs)
            self._rotate_chunk(&lc.out_proj, self.s_o, T, gw, tid, nt, kf, bar)
            ws[0] = &lc.out_proj
            ys[0] = self.s_ao
            ystr[0] = d
            self._group_share(ws, ys, ystr, 1, T, self._by_rows(ws, 1, nt), tid, nt)
            nc_barrier_wait(bar)
            # rest of the block, lanes, cell (spec §4.5–§4.8), then the cell's pools
            for t in range(t0, t1):
                self._block_out(lc, t)
            nc_barrier_wait(bar)
            self._pool_tasks(l + 1, self.s_cell, ids, T, n_heads, pmax, pden, psum, tid, self._pool_count(n_heads), nt)
        cq_free_decode_scratch(kf)

    cdef inline bint _by_rows(self, const CQView** ws, int count, int nt) noexcept nogil:
        """_group_products_strided's cut: the rows when the list has 4 blocks a thread."""
        cdef Py_ssize_t total = 0
        cdef int i
        for i in range(count):
            total += (ws[i].rows + STEP_BLOCK_ROWS - 1) // STEP_BLOCK_ROWS
        return total >= 4 * nt

    cdef inline void _rotate_chunk(self, const CQView* w, const float* X, Py_ssize_t T, Py_ssize_t x_stride,
                                   int tid, int nt, float* kf, nc_barrier* bar) noexcept nogil:
        """T tokens of X (each written by the thread of its token range, or before the
        region) rotated into the shared workspace by the team, ready for every thread on
        return: each thread its tokens (cq_rotate_tokens), one meeting; where that does
        not apply, thread 0 rotates them all (the float form, or a token that is not an
        A8 vector after all), one more."""
        cdef bint shared = cq_rotate_tokens(w, X, T, x_stride, self.s_cq_work, tid, nt, kf,
                                            cq_decode_scratch_floats() if kf != NULL else 0)
        nc_barrier_wait(bar)
        if shared and cq_rotate_tokens_ok(w, self.s_cq_work, T):
            return
        nc_barrier_wait(bar)       # (every thread has read the verdict before thread 0 rewrites it)
        if tid == 0:
            cq_rotate(w, X, T, x_stride, self.s_cq_work, 1)
        nc_barrier_wait(bar)

    cdef inline Py_ssize_t _pool_count(self, Py_ssize_t n_heads) noexcept nogil:
        """How many (head, probe) pools a cell is folded into."""
        cdef Py_ssize_t hd, n = 0
        for hd in range(n_heads):
            n += self.heads_c[hd].k
        return n

    cdef void _pool_tasks(self, Py_ssize_t r, const float* rows, const int64_t* ids, Py_ssize_t T,
                          Py_ssize_t n_heads, float** pmax, float** pden, float** psum, Py_ssize_t first,
                          Py_ssize_t stop, Py_ssize_t step) noexcept nogil:
        """_pool_chunk's (head, probe) pools numbered head by head, those i with
        first ≤ i < stop and i ≡ first (mod step): a prefill chunk's thread tid of nt takes
        (tid, all, nt), a decode step's last thread consecutive parts (step 1)."""
        cdef Py_ssize_t task = 0, hd, j
        for hd in range(n_heads):
            for j in range(self.heads_c[hd].k):
                if first <= task < stop and (task - first) % step == 0:
                    self._pool_probe(hd, r, j, rows, ids, T, pmax[hd], pden[hd], psum[hd])
                task += 1

    cdef void _step_blocks(self, int tid, int nt, Py_ssize_t pos0, const int64_t* ids,
                           float* conv_q, float* conv_k, float* conv_v, KVCache* kv,
                           float* vhist, Py_ssize_t n_heads, float** pmax, float** pden,
                           float** psum, float* logits) noexcept nogil:
        """Every block of a one-token step and the output head, run by each of the nt
        threads of the caller's parallel region (thread tid): the engram sites, the
        blocks and the head as _run_chunk computes them for one token, in one region
        instead of one per product.

        Threads meet at a barrier (parallel_barrier.h) between dependent steps.  Every
        thread rotates each product input into its own workspace (_rotate_team).  The
        engram and block CQ products are split by rows (_products; the three short mHC Φ
        run on thread 0), the KV heads of the attention go to thread kh mod nt, the
        Monarch MLP and the columns of the lane update that follows it are split by rows
        (monarch_mlp_c's team form) in a team of mlp_team_min() threads or more and run
        on thread 0 in a smaller one, and the other per-token operations run on thread
        0; every value is computed as on one thread, so the logits are the same bits at
        any thread count.
        The probe pools of block l's cell run on the last thread beside thread 0's serial
        start of block l + 1 (router input, Φ, router weights, block input; the cell is
        next written by block l + 1's lane update); the last cell's pools run after the
        head's products, shared by the team."""
        cdef Py_ssize_t d = self.d, n = self.n, nd = self.n * self.d, K = self.K
        cdef Py_ssize_t gw = self.H * self.dv
        cdef float* og               # this thread's gated attention output (_gate_into)
        cdef Py_ssize_t l, kh, hd, s, c0, c1, n_pools
        cdef SiteC* sc
        cdef Py_ssize_t rng[12]
        cdef int n_rng = 0, mt, mn, unit = 0
        # the engram sites in the last thread's waits through thread 0's MLP (_plan_sites)
        cdef bint late = self.sites_late and 2 <= nt < self.mlp_team
        cdef float* cqw = self.s_cq_work
        cdef float* phi = self.s_phi
        cdef LayerC* lc
        cdef const CQView* ws[4]
        cdef float* ys[4]
        cdef nc_barrier* bar = &self.team_bar
        # this thread's own rotations: made where they are read, no table or code crosses
        # to another core (_rotate_team)
        cdef float* mine = self.s_step_work + tid * self.step_work_len
        # this thread's prefetch stream (_plan_prefetch), pumped while it waits at the
        # meetings; ph numbers the reads of the plan (each product list, each MLP)
        cdef nc_pf_stream* pf = NULL
        cdef int ph = 0
        if self.pf_ahead > 0:
            pf = self.pf_streams + tid
            if self.pf_planned[tid] != nt:
                self._plan_prefetch(pf, tid, nt)
                self.pf_planned[tid] = nt
            nc_pf_rewind(pf)
        # the team's own barrier (no system call per meeting, unlike OpenMP's): set up
        # by thread 0 for the team's real size, behind one OpenMP barrier
        if tid == 0:
            nc_barrier_init(bar, nt)
        nc_team_barrier()
        nc_prof_begin(tid)       # (the opt-in meeting profile: barrier_profile)
        # the (head, probe) pools of a cell: all of them beside thread 0's serial start of
        # the next block, which is long enough since the Φ run there (they had been cut
        # in four parts beside four serial steps, with a meeting between each)
        n_pools = self._pool_count(n_heads)
        # engram sites (spec §4.4): input on thread 0, the key and value
        # products split by rows, the value conv on the last thread beside thread 0's
        # input of the next site (the conv reads s_evraw, which the next site's products
        # write only after the meeting of its rotation; its output is read by thread 0's
        # _block_in, several meetings later, or after one meeting more in block 0)
        for s in range(0 if late else self.n_sites):
            sc = &self.sites[s]
            if tid == 0:
                self._engram_input(sc, 1, pos0, self.s_row)
            self._rotate_team(mine, pf, &sc.key_proj, self.s_e, tid, nt, bar)
            ws[0] = &sc.key_proj
            ys[0] = self.s_ekey + s * CHUNK_MAX * d
            ws[1] = &sc.value_proj
            ys[1] = self.s_evraw
            if cq_same_rotation(&sc.key_proj, &sc.value_proj):
                self._products(mine, ws, ys, 2, tid, nt)
            else:
                self._products(mine, ws, ys, 1, tid, nt)
                nc_pf_done(pf, ph)
                ph += 1
                cq_rotate(&sc.value_proj, self.s_e, 1, sc.value_proj.cols, mine, 1)
                self._products(mine, ws + 1, ys + 1, 1, tid, nt)
            nc_pf_done(pf, ph)
            ph += 1
            nc_barrier_wait_pf(bar, pf)
            if tid == nt - 1:
                self._engram_values(s, sc, 1, pos0, vhist)
        for l in range(self.L):
            lc = &self.layers[l]
            # mHC router input and the three Φ products on thread 0 (spec §4.5): 24 rows at
            # full size, where a thread's share of 12 took less time than the rotation of
            # their 3072-wide input each thread made for it, and a meeting between (split
            # by rows, the 2-thread decode was slower); then the router weights and
            # the block input, a = A8(ZCRMS(x)), with no meeting between: every one of them
            # reads only what thread 0 wrote.  The previous cell's pools beside them.
            if tid == 0:
                self._router_input(0)
                if lc.phi_shared:
                    cq_rotate(&lc.phi_pre, self.s_nx, 1, lc.phi_pre.cols, mine, 1)
                    self._phi_list(lc, ws, ys)
                    self._products(mine, ws, ys, 3, 0, 1)
                else:
                    _project_shared(&lc.phi_pre, &lc.phi_pre, self.s_nx, 1, nd, phi, 0, mine, 1)
                    _project(&lc.phi_post, self.s_nx, 1, nd, phi + n, 0, cqw, 1)
                    _project(&lc.phi_res, self.s_nx, 1, nd, phi + 2 * n, 0, cqw, 1)
            if l == 0 and lc.site >= 0:
                # the last site's value conv (last thread, after the sites' meetings) may be
                # the one the first block's _block_in reads
                nc_barrier_wait_pf(bar, pf)
            if tid == 0:
                self._mhc_in(lc, 0)
                self._block_in(lc, 0)
            if tid == nt - 1 and l > 0:
                self._pool_tasks(l, self.s_cell, ids, 1, n_heads, pmax, pden, psum, 0, n_pools, 1)
            if late and tid == nt - 1:
                while unit < self.site_upto[2 * l]:        # engram site units (_plan_sites)
                    self._site_unit(unit, mine, self.s_row + tid * self.row_len, pos0, vhist, ws, ys)
                    unit += 1
            nc_pf_done(pf, ph)
            ph += 1
            self._rotate_team(mine, pf, &lc.q_proj, self.s_a, tid, nt, bar)
            if lc.qkvg_shared:
                self._qkvg_list(lc, ws, ys)
                self._products(mine, ws, ys, 4, tid, nt)
            elif tid == 0:
                _project_shared(&lc.q_proj, &lc.q_proj, self.s_a, 1, d, self.s_q, 0, mine, 1)
                _project(&lc.k_proj, self.s_a, 1, d, self.s_k, 0, cqw, 1)
                _project(&lc.v_proj, self.s_a, 1, d, self.s_v, 0, cqw, 1)
                _project(&lc.gate_proj, self.s_a, 1, d, self.s_g, 0, cqw, 1)
            nc_pf_done(pf, ph)
            ph += 1
            nc_barrier_wait_pf(bar, pf)
            # per KV head (split between the threads): conv, QK norm, RoPE, quantizers,
            # the cache write, the conv histories, the attention
            self._slot_ranges(pos0, lc.band, rng, &n_rng)
            # without a prefetch stream, ask for the MLP and the next Φ rows here, on the
            # way into the attention (the stream asks for them while the thread waits;
            # with both, these calls cost a share of a 2-thread step for nothing)
            if pf == NULL:
                if self._mlp_share(tid, nt, &mt, &mn):
                    self._prefetch_mlp(lc, mt, mn)
                if tid == 0 and l + 1 < self.L and self.layers[l + 1].phi_shared:   # thread 0's
                    self._phi_list(&self.layers[l + 1], ws, ys)
                    self._prefetch_products(ws, 3, 0, 1)
            kh = tid
            while kh < K:
                self._group_step(lc, l, kh, pos0, conv_q, conv_k, conv_v, kv, rng, n_rng)
                kh = kh + nt
            nc_barrier_wait_pf(bar, pf)
            # o ⊙ σ(g) and A8 by every thread into its own copy, then rotated there: no
            # meeting between (on thread 0 alone the team met again to read its output)
            og = self.s_gate_own + tid * self.gate_own_len
            memcpy(og, self.s_o, gw * sizeof(float))
            self._gate_into(og, self.s_g)
            cq_rotate(&lc.out_proj, og, 1, lc.out_proj.cols, mine, 1)
            ws[0] = &lc.out_proj
            ys[0] = self.s_ao
            self._products(mine, ws, ys, 1, tid, nt)
            nc_pf_done(pf, ph)
            ph += 1
            nc_barrier_wait_pf(bar, pf)
            # rest of the block: the Monarch MLP (split between the threads of a team of
            # mlp_team or more, after a meeting that shows them its input; else on thread 0
            # alone, right after it); lanes, cell
            if tid == 0:
                self._mlp_input(lc, 0)
            if nt >= self.mlp_team:
                nc_barrier_wait_pf(bar, pf)
                monarch_mlp_c(self.s_a, d, self.N, self.R_cond, lc.d1, lc.d2, lc.b2, lc.d3, lc.d4,
                              lc.w1a, lc.w1b, lc.w2a, lc.w2b, lc.w3a, lc.w3b, self.ba, self.bb,
                              lc.cond_v, lc.cond_u, self.p1, self.p2, self.s_mlp_work,
                              self.s_mlp_work + tid * self.mlp_work_len + 4 * self.N, self.s_ao,
                              tid, nt, bar, pf)
                # the lane update of the MLP output's columns this thread wrote (team_cols)
                team_cols(d, tid, nt, &c0, &c1)
                self._lane_update_cols(lc, 0, c0, c1)
            elif tid == 0:
                monarch_mlp_c(self.s_a, d, self.N, self.R_cond, lc.d1, lc.d2, lc.b2, lc.d3, lc.d4,
                              lc.w1a, lc.w1b, lc.w2a, lc.w2b, lc.w3a, lc.w3b, self.ba, self.bb,
                              lc.cond_v, lc.cond_u, self.p1, self.p2, self.s_mlp_work,
                              self.s_mlp_work + 4 * self.N, self.s_ao, 0, 1, NULL, pf)
                self._lane_update_cols(lc, 0, 0, d)
            elif late and tid == nt - 1:
                # engram site units (_plan_sites), where this thread would wait
                while unit < self.site_upto[2 * l + 1]:
                    self._site_unit(unit, mine, self.s_row + tid * self.row_len, pos0, vhist, ws, ys)
                    unit += 1
            nc_pf_done(pf, ph)
            ph += 1
            nc_barrier_wait_pf(bar, pf)
        # the last cell's pools, shared by the team (every pool is its own): after the
        # head's products when there is a head (before it, the head's rotation waited for
        # them; on the last thread alone, after its share of the head, they
        # kept thread 0 waiting at the region's end)
        if logits == NULL:
            self._pool_tasks(self.L, self.s_cell, ids, 1, n_heads, pmax, pden, psum, tid, n_pools, nt)
        # output: final norm, A8, tied head (spec §4.9)
        if logits != NULL:
            if tid == 0:
                zc_rmsnorm_c(self.s_cell, self.final_norm, self.s_hid, d)
                if self.quant:
                    a8_inplace(self.s_hid, d, A8_QMAX)
            self._rotate_team(mine, pf, &self.emb_out, self.s_hid, tid, nt, bar)
            ws[0] = &self.emb_out
            ys[0] = logits
            self._products(mine, ws, ys, 1, tid, nt)
            # the last cell's pools (s_cell is no longer written)
            self._pool_tasks(self.L, self.s_cell, ids, 1, n_heads, pmax, pden, psum, tid, n_pools, nt)
        nc_prof_end()

    cdef void _site_unit(self, int unit, float* mine, float* row, Py_ssize_t pos0, float* vhist,
                         const CQView** ws, float** ys) noexcept nogil:
        """Unit `unit` of a one-token step's engram sites, on one thread (_plan_sites):
        units 4i … 4i + 3 of site site_order[i] are its input, its key product, its value
        product (the input rotated for each product: the thread's workspace holds other
        products' inputs between) and its value conv.  The same values as the sites'
        own phases."""
        cdef Py_ssize_t s = self.site_order[unit // 4]
        cdef SiteC* sc = &self.sites[s]
        cdef int kind = unit % 4
        if kind == 0:
            self._engram_input(sc, 1, pos0, row)
        elif kind == 3:
            self._engram_values(s, sc, 1, pos0, vhist)
        else:
            ws[0] = &sc.key_proj if kind == 1 else &sc.value_proj
            ys[0] = self.s_ekey + s * CHUNK_MAX * self.d if kind == 1 else self.s_evraw
            cq_rotate(ws[0], self.s_e, 1, ws[0].cols, mine, 1)
            self._products(mine, ws, ys, 1, 0, 1)

    cdef inline bint _mlp_share(self, int tid, int nt, int* mt, int* mn) noexcept nogil:
        """Whether thread tid of an nt-thread decode step reads the Monarch MLP's floats,
        and its share of them, part mt of mn: its own part where the team splits the MLP
        (mlp_team_min), all of them on thread 0 where it runs the MLP alone."""
        if nt >= self.mlp_team:
            mt[0], mn[0] = tid, nt
            return True
        mt[0], mn[0] = 0, 1
        return tid == 0

    cdef void _plan_prefetch(self, nc_pf_stream* s, int tid, int nt) noexcept nogil:
        """Thread tid's prefetch stream for a decode step of nt threads: the weights it
        reads, in the order _step_blocks reads them, one phase per product list and per
        MLP (the phases _step_blocks counts in `ph`; a plan that disagrees only wastes
        bandwidth).  The rows are its shares of each list (_list_share, as _products
        splits them); the Monarch MLP's floats its team_cols share of each array, as
        _prefetch_mlp asks for them (all of them on thread 0 where it runs the MLP
        alone: mlp_team_min)."""
        cdef int ph = 0, mt, mn
        cdef Py_ssize_t l, i
        cdef Py_ssize_t N = self.N, ba2 = self.ba * self.ba, bb2 = self.bb * self.bb
        cdef const CQView* ws[4]
        cdef float* ys[4]
        cdef LayerC* lc
        cdef SiteC* sc
        cdef bint late = self.sites_late and 2 <= nt < self.mlp_team
        cdef int unit = 0
        nc_pf_clear(s, self.pf_ahead)
        for i in range(0 if late else self.n_sites):
            sc = &self.sites[i]
            ws[0] = &sc.key_proj
            ws[1] = &sc.value_proj
            if cq_same_rotation(&sc.key_proj, &sc.value_proj):
                self._pf_add_list(s, ws, 2, tid, nt, ph)
            else:
                self._pf_add_list(s, ws, 1, tid, nt, ph)
                ph += 1
                self._pf_add_list(s, ws + 1, 1, tid, nt, ph)
            ph += 1
        for l in range(self.L):
            lc = &self.layers[l]
            self._phi_list(lc, ws, ys)
            if tid == 0:            # (thread 0 runs the Φ products alone)
                self._pf_add_list(s, ws, 3, 0, 1, ph)
            elif late and tid == nt - 1:
                unit = self._pf_add_site_units(s, unit, self.site_upto[2 * l], ph)
            ph += 1
            self._qkvg_list(lc, ws, ys)
            if lc.qkvg_shared:
                self._pf_add_list(s, ws, 4, tid, nt, ph)
            elif tid == 0:
                self._pf_add_list(s, ws, 4, 0, 1, ph)
            ph += 1
            ws[0] = &lc.out_proj
            self._pf_add_list(s, ws, 1, tid, nt, ph)
            ph += 1
            # the MLP's floats: this thread's share of each array (_mlp_share)
            if self._mlp_share(tid, nt, &mt, &mn):
                _pf_add_share(s, lc.cond_v, self.d * self.R_cond, mt, mn, ph)
                _pf_add_share(s, lc.cond_u, self.R_cond * N, mt, mn, ph)
                _pf_add_share(s, lc.d1, N, mt, mn, ph)
                _pf_add_share(s, lc.w1a, ba2, mt, mn, ph)
                _pf_add_share(s, lc.w1b, bb2, mt, mn, ph)
                _pf_add_share(s, lc.d2, N, mt, mn, ph)
                _pf_add_share(s, lc.b2, N, mt, mn, ph)
                _pf_add_share(s, lc.w2a, ba2, mt, mn, ph)
                _pf_add_share(s, lc.w2b, bb2, mt, mn, ph)
                _pf_add_share(s, lc.d3, N, mt, mn, ph)
                _pf_add_share(s, lc.w3a, ba2, mt, mn, ph)
                _pf_add_share(s, lc.w3b, bb2, mt, mn, ph)
                _pf_add_share(s, lc.d4, N, mt, mn, ph)
            elif late and tid == nt - 1:
                unit = self._pf_add_site_units(s, unit, self.site_upto[2 * l + 1], ph)
            ph += 1
        ws[0] = &self.emb_out
        self._pf_add_list(s, ws, 1, tid, nt, ph)

    cdef int _pf_add_site_units(self, nc_pf_stream* s, int unit, int upto, int phase) noexcept nogil:
        """The products among engram site units [unit, upto) (_site_unit) onto the last
        thread's prefetch stream; returns upto."""
        cdef const CQView* ws[1]
        cdef SiteC* sc
        while unit < upto:
            if unit % 4 in (1, 2):
                sc = &self.sites[self.site_order[unit // 4]]
                ws[0] = &sc.key_proj if unit % 4 == 1 else &sc.value_proj
                self._pf_add_list(s, ws, 1, 0, 1, phase)
            unit += 1
        return upto

    cdef void _pf_add_list(self, nc_pf_stream* s, const CQView** ws, int count, int tid, int nt,
                           int phase) noexcept nogil:
        """Thread tid's rows of a product list (_list_share) onto its prefetch stream."""
        cdef Py_ssize_t r0, r1, n0, n1
        cdef const char* at0 = NULL
        cdef const char* at1 = NULL
        cdef int i
        for i in range(count):
            if _list_share(ws, count, i, tid, nt, &r0, &r1):
                cq_row_bytes(ws[i], r0, r1, &at0, &n0, &at1, &n1)
                nc_pf_add(s, at0, n0, phase)
                nc_pf_add(s, at1, n1, phase)

    cdef void _prefetch_products(self, const CQView** ws, int count, int tid, int nt) noexcept nogil:
        """Ask for thread tid's share (_list_share) of the rows of a list of products."""
        cdef Py_ssize_t r0, r1
        cdef int i
        for i in range(count):
            if _list_share(ws, count, i, tid, nt, &r0, &r1):
                cq_prefetch_rows(ws[i], r0, r1)

    cdef void _prefetch_mlp(self, LayerC* lc, int tid, int nt) noexcept nogil:
        """Ask for block lc's Monarch MLP weights (float32, 116 KB a layer at full size)
        before the attention: the MLP runs a few stages later and read them from DRAM,
        on a critical path cut by six meetings.  Each of the nt threads asks for its
        own share of every array (_prefetch_share): each thread reads nearly all of
        them, but a line one thread brought is then an L3 hit for the other, and the
        prefetch instructions stall once the line fill buffers are full (every thread
        asking for all 116 KB stalled a 2-thread decode step visibly; with the shares
        the step was faster, the rest of that wait moving to the MLP's own reads and
        the meetings; benchmarks/history/model.md)."""
        cdef Py_ssize_t N = self.N, ba2 = self.ba * self.ba, bb2 = self.bb * self.bb
        _prefetch_share(lc.cond_v, self.d * self.R_cond, tid, nt)
        _prefetch_share(lc.cond_u, self.R_cond * N, tid, nt)
        _prefetch_share(lc.d1, N, tid, nt)
        _prefetch_share(lc.d2, N, tid, nt)
        _prefetch_share(lc.b2, N, tid, nt)
        _prefetch_share(lc.d3, N, tid, nt)
        _prefetch_share(lc.d4, N, tid, nt)
        _prefetch_share(lc.w1a, ba2, tid, nt)
        _prefetch_share(lc.w1b, bb2, tid, nt)
        _prefetch_share(lc.w2a, ba2, tid, nt)
        _prefetch_share(lc.w2b, bb2, tid, nt)
        _prefetch_share(lc.w3a, ba2, tid, nt)
        _prefetch_share(lc.w3b, bb2, tid, nt)

    cdef inline void _rotate_team(self, float* mine, nc_pf_stream* pf, const CQView* w, const float* x,
                                  int tid, int nt, nc_barrier* bar) noexcept nogil:
        """One token's input to w, which thread 0 has just written, rotated by every thread
        of the team into its own workspace `mine` (the same bits on each): one meeting.
        Thread 0 rotated it into the shared workspace, then the team made the lookup
        tables (two meetings); the codes and tables the other threads then read were
        lines of another core's cache, and the rotation and tables took thread 0 two to
        five times as long as on one thread."""
        nc_barrier_wait_pf(bar, pf)
        cq_rotate(w, x, 1, w.cols, mine, 1)

    cdef inline void _phi_list(self, LayerC* lc, const CQView** ws, float** ys) noexcept nogil:
        """The three mHC Φ products of a layer as a list (outputs: hpre, hpost, P in s_phi)."""
        ws[0] = &lc.phi_pre
        ws[1] = &lc.phi_post
        ws[2] = &lc.phi_res
        ys[0] = self.s_phi
        ys[1] = self.s_phi + self.n
        ys[2] = self.s_phi + 2 * self.n

    cdef inline void _qkvg_list(self, LayerC* lc, const CQView** ws, float** ys) noexcept nogil:
        """The q, k, v and gate products of a layer as a list."""
        ws[0] = &lc.q_proj
        ws[1] = &lc.k_proj
        ws[2] = &lc.v_proj
        ws[3] = &lc.gate_proj
        ys[0] = self.s_q
        ys[1] = self.s_k
        ys[2] = self.s_v
        ys[3] = self.s_g

    cdef void _products(self, float* work, const CQView** ws, float** ys, int count, int tid,
                        int nt) noexcept nogil:
        """Thread tid's part of y_i = W_i·x for `count` matrices whose input cq_rotate
        left in the CQ workspace `work` (_list_share: one contiguous share of the list's rows
        per thread, so each thread streams its rows in order, one kernel call per matrix
        it touches).  Handing the blocks out one at a time by an atomic ticket was
        slower (benchmarks/history/model.md): interleaved blocks defeat the kernel's and
        the hardware's prefetch of the next rows."""
        cdef Py_ssize_t r0, r1
        cdef int i
        for i in range(count):
            if _list_share(ws, count, i, tid, nt, &r0, &r1):
                cq_matvec_rotated_rows(ws[i], work, ys[i], r0, r1)

    cdef void _group_products(self, const CQView** ws, float** ys, Py_ssize_t y_stride, int count,
                              Py_ssize_t T) noexcept nogil:
        """_group_products_strided with one output row stride for every matrix."""
        cdef Py_ssize_t ystr[4]
        cdef int i
        for i in range(count):
            ystr[i] = y_stride
        self._group_products_strided(ws, ys, ystr, count, T)

    cdef void _group_products_strided(self, const CQView** ws, float** ys, const Py_ssize_t* ystr,
                                      int count, Py_ssize_t T) noexcept nogil:
        """Y_i = X·W_iᵀ for T tokens and count ≤ 4 matrices whose input cq_rotate left in
        the CQ workspace, in one parallel region: the matrices' rows as one list cut into
        contiguous shares (blocks of STEP_BLOCK_ROWS rows), or, when the list is too
        short to share (the three mHC Φ: 24 rows), the tokens cut instead.  Per matrix,
        k (96 rows) and v (128) made 3 and 4 blocks of 32 for 2 threads and Φ one, which
        one thread ran while the other waited.  Same bits at any split (cq_matmul_rotated_rows)."""
        cdef int nthr = self._run_threads, i
        cdef Py_ssize_t r0[4]
        cdef Py_ssize_t r1[4]
        cdef float* wdec
        if nthr == 1:
            # one call for the list: the lookup kernel makes each token tile's tables once
            for i in range(count):
                r0[i], r1[i] = 0, ws[i].rows
            wdec = cq_decode_scratch()
            cq_matmul_rotated_rows_list(ws, count, self.s_cq_work, T, r0, r1, ys, ystr, wdec)
            cq_free_decode_scratch(wdec)
            return
        with parallel(num_threads=nthr):
            self._group_share(ws, ys, ystr, count, T, self._by_rows(ws, count, nc_team_size()), threadid(),
                              nc_team_size())

    cdef void _group_share(self, const CQView** ws, float** ys, const Py_ssize_t* ystr, int count,
                           Py_ssize_t T, bint by_rows, int tid, int nt) noexcept nogil:
        """Thread tid's part of _group_products_strided (its own function, so that its
        locals are the thread's own: a Cython parallel block shares any variable it only
        writes through a pointer)."""
        cdef float* wdec = cq_decode_scratch()
        cdef Py_ssize_t t0 = T * tid // nt, t1 = T * (tid + 1) // nt
        cdef Py_ssize_t r0[4]
        cdef Py_ssize_t r1[4]
        cdef int i
        if by_rows:
            for i in range(count):
                if not _list_share(ws, count, i, tid, nt, &r0[i], &r1[i]):
                    r0[i] = r1[i] = 0
            cq_matmul_rotated_rows_list(ws, count, self.s_cq_work, T, r0, r1, ys, ystr, wdec)
        else:
            for i in range(count):
                cq_matmul_rotated_rows(ws[i], self.s_cq_work, T, t0, t1, ys[i], ystr[i], 0, ws[i].rows, wdec)
        cq_free_decode_scratch(wdec)

    cdef void _shift_history(self, float* hist, Py_ssize_t nh, const float* chunk, Py_ssize_t T,
                             Py_ssize_t width) noexcept nogil:
        """hist ← the last nh rows of [hist; chunk] (oldest first)."""
        cdef Py_ssize_t keep
        if nh <= 0:
            return
        if T >= nh:
            memcpy(hist, chunk + (T - nh) * width, nh * width * sizeof(float))
        else:
            keep = nh - T
            memmove(hist, hist + T * width, keep * width * sizeof(float))
            memcpy(hist + keep * width, chunk, T * width * sizeof(float))

    cdef void _router_input(self, Py_ssize_t t) noexcept nogil:
        """mHC router input of token t: nx = A8(RMSunit(flatten X)) (spec §4.5)."""
        cdef Py_ssize_t nd = self.n * self.d
        rms_unit_c(self.s_lanes + t * nd, self.s_nx + t * nd, nd)
        if self.quant:
            a8_inplace(self.s_nx + t * nd, nd, A8_QMAX)

    cdef void _block_in(self, LayerC* lc, Py_ssize_t t) noexcept nogil:
        """Block input of token t after the engram gate (spec §4.6), then
        a = A8(ZCRMS(x; norm_in)), the attention input (§4.7 step 1)."""
        cdef Py_ssize_t d = self.d, c
        cdef float alpha
        cdef const float* v
        if lc.site >= 0:
            alpha = engram_alpha_c(self.s_u + t * d, self.s_ekey + (lc.site * CHUNK_MAX + t) * d, d)
            v = self.s_eval + (lc.site * CHUNK_MAX + t) * d
            for c in range(d):
                self.s_x[t * d + c] = self.s_u[t * d + c] + alpha * v[c]
        else:
            memcpy(self.s_x + t * d, self.s_u + t * d, d * sizeof(float))
        zc_rmsnorm_c(self.s_x + t * d, lc.norm_in, self.s_a + t * d, d)
        if self.quant:
            a8_inplace(self.s_a + t * d, d, A8_QMAX)

    cdef void _mhc_in(self, LayerC* lc, Py_ssize_t t) noexcept nogil:
        """Router weights of token t: hpre, hpost (into s_phi) and P (Sinkhorn, in place);
        block input u = Σ_m hpre[m]·X[m]."""
        cdef Py_ssize_t n = self.n, d = self.d, nd = self.n * self.d, m, i, c
        cdef float* ph = self.s_phi + t * (2 * n + n * n)
        cdef float* X = self.s_lanes + t * nd
        cdef float* u = self.s_u + t * d
        cdef float off, acc
        for m in range(n):
            off = <float>4.0 if m == lc.lane else <float>-4.0
            ph[m] = sigmoid_c(lc.a_pre * ph[m] + lc.b_pre[m] + off)
            off = <float>0.0 if m == lc.lane else <float>-4.0
            ph[n + m] = <float>2.0 * sigmoid_c(lc.a_post * ph[n + m] + lc.b_post[m] + off)
        for i in range(n * n):
            ph[2 * n + i] = lc.a_res * ph[2 * n + i] + lc.b_res[i]
        sinkhorn_c(ph + 2 * n, <int>n, SINKHORN_ITERS)
        for c in range(d):
            u[c] = ph[0] * X[c]
        for m in range(1, n):
            for c in range(d):
                u[c] = u[c] + ph[m] * X[m * d + c]

    cdef void _qkv_token(self, LayerC* lc, Py_ssize_t l, Py_ssize_t t, Py_ssize_t pos0,
                         float* conv_q, float* conv_k, float* conv_v, KVCache* kv) noexcept nogil:
        """Token t of the chunk: causal conv of the raw q/k/v, QK norm, RoPE, quantizers;
        writes k̂, v̂ into the cache slot of its position (spec §4.7 steps 2–6).  The int8
        storage keeps the A8 codes and scales (of q too, in s_qcode/s_qscale) instead."""
        cdef Py_ssize_t H = self.H, K = self.K, qw = H * self.dq, kw = K * self.dq, vw = K * self.dv, h
        self._qkv_conv(lc, l, t, pos0, conv_q, conv_k, conv_v, 0, qw, 0, kw, 0, vw)
        for h in range(H):
            self._q_head(lc, t, pos0, h)
        for h in range(K):
            self._kv_head(lc, l, t, pos0, h, kv)

    cdef void _qkv_conv(self, LayerC* lc, Py_ssize_t l, Py_ssize_t t, Py_ssize_t pos0,
                        float* conv_q, float* conv_k, float* conv_v, Py_ssize_t q0, Py_ssize_t q1,
                        Py_ssize_t k0, Py_ssize_t k1, Py_ssize_t v0, Py_ssize_t v1) noexcept nogil:
        """The causal conv (or the copy, without taps) of channels [q0, q1) of q, [k0, k1)
        of k and [v0, v1) of v for chunk token t (a depthwise conv: channels apart)."""
        cdef Py_ssize_t qw = self.H * self.dq, kw = self.K * self.dq, vw = self.K * self.dv
        cdef Py_ssize_t hist = self.C - 1 if self.C > 0 else 0
        if self.C > 0:
            self._conv_token(lc.q_taps, self.s_q, conv_q + l * hist * qw, qw, t, pos0, lc.band,
                             self.s_qc + t * qw, q0, q1)
            self._conv_token(lc.k_taps, self.s_k, conv_k + l * hist * kw, kw, t, pos0, lc.band,
                             self.s_kc + t * kw, k0, k1)
            self._conv_token(lc.v_taps, self.s_v, conv_v + l * hist * vw, vw, t, pos0, lc.band,
                             self.s_vc + t * vw, v0, v1)
        else:
            memcpy(self.s_qc + t * qw + q0, self.s_q + t * qw + q0, (q1 - q0) * sizeof(float))
            memcpy(self.s_kc + t * kw + k0, self.s_k + t * kw + k0, (k1 - k0) * sizeof(float))
            memcpy(self.s_vc + t * vw + v0, self.s_v + t * vw + v0, (v1 - v0) * sizeof(float))

    cdef void _q_head(self, LayerC* lc, Py_ssize_t t, Py_ssize_t pos0, Py_ssize_t h) noexcept nogil:
        """Query head h of chunk token t after the conv: QK norm, RoPE, A8 (or its codes)."""
        cdef Py_ssize_t dq = self.dq, p = pos0 + t
        cdef float* q = self.s_qc + t * self.H * dq + h * dq
        zc_rmsnorm_c(q, lc.q_norm, q, dq)
        rope_c(q, dq, self.rope_cos + p * (dq // 2), self.rope_sin + p * (dq // 2))
        if self.kv_int8:
            self.s_qscale[t * self.H + h] = a8_codes_c(q, dq, A8_QMAX,
                                                       self.s_qcode + t * self.H * 4 * self.nq4 + h * 4 * self.nq4)
        elif self.quant:
            a8_inplace(q, dq, A8_QMAX)

    cdef void _kv_head(self, LayerC* lc, Py_ssize_t l, Py_ssize_t t, Py_ssize_t pos0, Py_ssize_t h,
                       KVCache* kv) noexcept nogil:
        """KV head h of chunk token t after the conv: key norm, RoPE, quantizers, and both
        into the cache slot of its position."""
        cdef Py_ssize_t K = self.K, dq = self.dq, dv = self.dv, i, p = pos0 + t
        cdef Py_ssize_t cap = self.cap, slot = self._slot(p), kv_row = (l * K + h) * cap + slot
        cdef float* k = self.s_kc + t * K * dq + h * dq
        cdef float* v = self.s_vc + t * K * dv + h * dv
        cdef int8_t* kcode = self.s_kcode + t * K * dq + h * dq
        cdef uint8_t* kdst
        cdef float* dst
        zc_rmsnorm_c(k, lc.k_norm, k, dq)
        rope_c(k, dq, self.rope_cos + p * (dq // 2), self.rope_sin + p * (dq // 2))
        if self.kv_int8:
            # codes + 128 into the quads of dimensions (the pad of the last quad: code 0)
            kv.k_scale[kv_row] = a8_codes_c(k, dq, A8_QMAX, kcode)
            kdst = kv.k_codes + (l * K + h) * self.nq4 * cap * 4 + slot * 4
            for i in range(4 * self.nq4):
                kdst[(i >> 2) * cap * 4 + (i & 3)] = <uint8_t>(<int>kcode[i] + 128) if i < dq else 128
            kv.v_scale[kv_row] = a8_codes_c(v, dv, A8_QMAX, kv.v_codes + kv_row * dv)
            return
        if self.quant:
            if self.kv_bits >= 8:
                a8_inplace(k, dq, A8_QMAX)
                a8_inplace(v, dv, A8_QMAX)
            else:
                kv_cq_inplace(k, dq, self.kv_levels, self.n_kv_levels)
                kv_cq_inplace(v, dv, self.kv_levels, self.n_kv_levels)
        dst = kv.k + (l * K + h) * dq * cap + slot      # keys stored transposed
        for i in range(dq):
            dst[i * cap] = k[i]
        memcpy(kv.v + kv_row * dv, v, dv * sizeof(float))

    cdef void _group_step(self, LayerC* lc, Py_ssize_t l, Py_ssize_t kh, Py_ssize_t pos0,
                          float* conv_q, float* conv_k, float* conv_v, KVCache* kv,
                          const Py_ssize_t* rng, int n_rng) noexcept nogil:
        """A step's whole attention work for KV head kh on the calling thread: the conv
        and history of its channels (its G query heads', its key's and value's), the
        query heads' norm/RoPE/codes, the key and value into the cache, then its
        attention.  The KV heads are independent here, so a step runs them on
        different threads with no barrier between the cache write and the attention."""
        cdef Py_ssize_t G = self.H // self.K, dq = self.dq, dv = self.dv, h
        cdef Py_ssize_t qw = self.H * dq, kw = self.K * dq, vw = self.K * dv
        cdef Py_ssize_t hist = self.C - 1 if self.C > 0 else 0
        cdef Py_ssize_t q0 = kh * G * dq, q1 = (kh + 1) * G * dq
        self._qkv_conv(lc, l, 0, pos0, conv_q, conv_k, conv_v, q0, q1, kh * dq, (kh + 1) * dq,
                       kh * dv, (kh + 1) * dv)
        for h in range(kh * G, (kh + 1) * G):
            self._q_head(lc, 0, pos0, h)
        self._kv_head(lc, l, 0, pos0, kh, kv)
        if hist > 0:
            _shift_history_cols(conv_q + l * hist * qw, hist, self.s_q, qw, q0, q1)
            _shift_history_cols(conv_k + l * hist * kw, hist, self.s_k, kw, kh * dq, (kh + 1) * dq)
            _shift_history_cols(conv_v + l * hist * vw, hist, self.s_v, vw, kh * dv, (kh + 1) * dv)
        self._attend_head(l, 0, kh, rng, n_rng, kv)

    cdef void _conv_token(self, const float* taps, const float* raw, const float* hist,
                          Py_ssize_t width, Py_ssize_t t, Py_ssize_t pos0, Py_ssize_t band,
                          float* out, Py_ssize_t c0, Py_ssize_t c1) noexcept nogil:
        """Causal depthwise conv of channels [c0, c1) at chunk token t: taps j read
        position t − j from the chunk's raw rows or the history (oldest first), dropped
        when not visible."""
        cdef const float* hptr[MAX_TAPS]
        cdef Py_ssize_t j, src, C = self.C, hist_n = self.C - 1
        for j in range(C):
            src = t - j
            if not _visible(pos0 + t, pos0 + src, self.recent, self.sinks, band):
                hptr[j] = NULL
            elif src >= 0:
                hptr[j] = raw + src * width + c0
            else:
                hptr[j] = hist + (hist_n + src) * width + c0
        conv_step_c(taps + c0, C, width, c1 - c0, hptr, out + c0)

    cdef void _attend_token(self, LayerC* lc, Py_ssize_t l, Py_ssize_t t, Py_ssize_t pos0,
                            KVCache* kv) noexcept nogil:
        """All query heads of token t against the visible slots (the G heads of a KV
        head together); then o ⊙ σ(g) and A8."""
        cdef Py_ssize_t kh
        cdef Py_ssize_t rng[12]
        cdef int n_rng = 0
        self._slot_ranges(pos0 + t, lc.band, rng, &n_rng)
        for kh in range(self.K):
            self._attend_head(l, t, kh, rng, n_rng, kv)
        self._attend_gate(t)

    cdef void _attend_head(self, Py_ssize_t l, Py_ssize_t t, Py_ssize_t kh, const Py_ssize_t* rng,
                           int n_rng, KVCache* kv) noexcept nogil:
        """The G query heads of KV head kh for chunk token t over the slot ranges rng
        (scores in the calling thread's row of s_scores); writes o[kh·G·dv :]."""
        cdef Py_ssize_t H = self.H, K = self.K, dq = self.dq, dv = self.dv, G = self.H // self.K
        cdef Py_ssize_t cap = self.cap, head = l * K + kh
        cdef float* scores = self.s_scores + threadid() * G * cap
        cdef float* o = self.s_o + t * H * dv + kh * G * dv
        cdef Py_ssize_t q4 = 4 * self.nq4
        if self.kv_int8:
            attend_group_i8_c(self.s_qcode + (t * H + kh * G) * q4, q4, self.s_qscale + t * H + kh * G, G,
                              kv.k_codes + head * self.nq4 * cap * 4, cap, kv.k_scale + head * cap,
                              kv.v_codes + head * cap * dv, kv.v_scale + head * cap,
                              dq, dv, self.attn_scale, rng, n_rng, scores, cap, o, dv)
        else:
            attend_group_c(self.s_qc + t * H * dq + kh * G * dq, dq, G,
                           kv.k + head * dq * cap, cap, kv.v + head * cap * dv,
                           dq, dv, self.attn_scale, rng, n_rng, scores, cap, o, dv)

    cdef void _attend_gate(self, Py_ssize_t t) noexcept nogil:
        """o ⊙ σ(g), then A8 (spec §4.7 step 9) for chunk token t."""
        cdef Py_ssize_t gw = self.H * self.dv
        self._gate_into(self.s_o + t * gw, self.s_g + t * gw)

    cdef void _gate_into(self, float* o, const float* g) noexcept nogil:
        """o ⊙ σ(g), then A8, in place on one token's attention output o (s_o's row, or a
        thread's own copy of it in a decode step)."""
        mul_sigmoid_c(o, g, self.H * self.dv)
        if self.quant:
            a8_inplace(o, self.H * self.dv, A8_QMAX)

    cdef void _block_out(self, LayerC* lc, Py_ssize_t t) noexcept nogil:
        """Rest of Block_l for token t (post-norm, gated residual, Monarch MLP), then
        y = Block(u) − u, lanes' = P·lanes + hpost·y and the cell (lane mean)."""
        cdef float* work = self.s_mlp_work + threadid() * self.mlp_work_len
        self._mlp_input(lc, t)
        monarch_mlp_c(self.s_a + t * self.d, self.d, self.N, self.R_cond, lc.d1, lc.d2, lc.b2, lc.d3,
                      lc.d4, lc.w1a, lc.w1b, lc.w2a, lc.w2b, lc.w3a, lc.w3b, self.ba, self.bb,
                      lc.cond_v, lc.cond_u, self.p1, self.p2, work, work + 4 * self.N,
                      self.s_ao + t * self.d, 0, 1, NULL, NULL)
        self._lane_update(lc, t)

    cdef void _mlp_input(self, LayerC* lc, Py_ssize_t t) noexcept nogil:
        """Post-norm of the attention output, the gated residual x += g·a, and the MLP
        input m = ZCRMS(x; pre_hada) (into s_a) for token t."""
        cdef Py_ssize_t d = self.d, c
        cdef float* x = self.s_x + t * d
        cdef float* a = self.s_ao + t * d
        cdef float gate = lc.attn_gate
        zc_rmsnorm_c(a, lc.post_norm, a, d)
        for c in range(d):
            x[c] = x[c] + gate * a[c]
        zc_rmsnorm_c(x, lc.pre_hada, self.s_a + t * d, d)

    cdef void _lane_update(self, LayerC* lc, Py_ssize_t t) noexcept nogil:
        """y = x + MLP − u (= Block(u) − u), lanes' = P·lanes + hpost·y, cell = lane mean."""
        self._lane_update_cols(lc, t, 0, self.d)

    cdef void _lane_update_cols(self, LayerC* lc, Py_ssize_t t, Py_ssize_t c0, Py_ssize_t c1) noexcept nogil:
        """_lane_update for columns [c0, c1) of token t: every operation is per column,
        so threads that split the columns compute the one-thread bits."""
        cdef Py_ssize_t d = self.d, n = self.n, nd = self.n * self.d, c, i, j
        cdef float* x = self.s_x + t * d
        cdef float* a = self.s_ao + t * d
        cdef float* u = self.s_u + t * d
        cdef float* X = self.s_lanes + t * nd
        cdef float* Xn = self.s_nx + t * nd
        cdef float* ph = self.s_phi + t * (2 * n + n * n)
        cdef float* P = ph + 2 * n
        cdef float* cell = self.s_cell + t * d
        cdef float coef
        if nc_lane_update_avx2(x, a, u, X, ph, n, d, cell, c0, c1):
            return
        for c in range(c0, c1):
            x[c] = (x[c] + a[c]) - u[c]          # y = Block(u) − u
        # (each coefficient in a local: read through its pointer, which may alias the
        # rows written, it was reloaded every element and the loops stayed scalar)
        for i in range(n):
            coef = P[i * n]
            for c in range(c0, c1):
                Xn[i * d + c] = coef * X[c]
            for j in range(1, n):
                coef = P[i * n + j]
                for c in range(c0, c1):
                    Xn[i * d + c] = Xn[i * d + c] + coef * X[j * d + c]
            coef = ph[n + i]
            for c in range(c0, c1):
                Xn[i * d + c] = Xn[i * d + c] + coef * x[c]
        for i in range(n):
            memcpy(X + i * d + c0, Xn + i * d + c0, (c1 - c0) * sizeof(float))
        memcpy(cell + c0, X + c0, (c1 - c0) * sizeof(float))
        for i in range(1, n):
            for c in range(c0, c1):
                cell[c] = cell[c] + X[i * d + c]
        for c in range(c0, c1):
            cell[c] = cell[c] / <float>n

    cdef void _pool_row(self, Py_ssize_t hd, Py_ssize_t r, const float* rows, const int64_t* ids,
                        Py_ssize_t T, float* pmax, float* pden, float* psum) noexcept nogil:
        """Fold cell row r of the chunk's tokens into head hd's online pools (spec §5.5);
        PAD tokens are left out (spec §5.1)."""
        cdef Py_ssize_t j
        for j in range(self.heads_c[hd].k):
            self._pool_probe(hd, r, j, rows, ids, T, pmax, pden, psum)

    cdef void _pool_probe(self, Py_ssize_t hd, Py_ssize_t r, Py_ssize_t j, const float* rows,
                          const int64_t* ids, Py_ssize_t T, float* pmax, float* pden,
                          float* psum) noexcept nogil:
        """_pool_row for probe j alone: each probe's pool is its own online softmax over
        the tokens, so the probes of a chunk can run on different threads."""
        cdef Py_ssize_t k = self.heads_c[hd].k, d = self.d, t
        cdef const float* probe = self.heads_c[hd].probes + (r * k + j) * d
        cdef float s, sqrt_d = sqrtf(<float>d)
        for t in range(T):
            if ids[t] == PAD_ID_C:
                continue
            s = dot_c(rows + t * d, probe, d)
            pool_update_c(rows + t * d, d, s / sqrt_d, pmax + r * k + j, pden + r * k + j,
                          psum + (r * k + j) * d)

    cdef void _pool_chunk(self, Py_ssize_t r, const float* rows, const int64_t* ids, Py_ssize_t T,
                          Py_ssize_t n_heads, float** pmax, float** pden, float** psum,
                          int nthr) noexcept nogil:
        """_pool_row of every head, the (head, probe) pools split between nthr threads
        (in prefill they ran on one thread while the other waited)."""
        cdef Py_ssize_t task, hd, j, kmax = 0
        for hd in range(n_heads):
            if self.heads_c[hd].k > kmax:
                kmax = self.heads_c[hd].k
        if nthr <= 1 or n_heads * kmax < 2:
            for hd in range(n_heads):
                self._pool_row(hd, r, rows, ids, T, pmax[hd], pden[hd], psum[hd])
            return
        for task in prange(n_heads * kmax, num_threads=nthr, schedule="dynamic"):
            hd = task // kmax
            j = task % kmax
            if j < self.heads_c[hd].k:
                self._pool_probe(hd, r, j, rows, ids, T, pmax[hd], pden[hd], psum[hd])
