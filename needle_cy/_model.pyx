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
on a throw-away state.

Three units
-----------
The engine is the forward math, its buffers and its thread schedule, kept apart so
that each can be read and changed without the others:

* this file: the weights' C views (``_bind``), the interface, and the forward math
  (``_run_chunk``, ``_chunk_blocks``, ``_step_blocks`` and the per-token operations
  they call), which reads the buffers and the plan and decides neither;
* ``_engine_buffers.pxi``: ``EngineScratch``, the pointers into the scratch that
  ``make_scratch`` allocates once per engine (sized for a full chunk and the most
  threads), and ``EngineState``, the state ``new_state`` allocates (KV cache,
  histories, pools): nothing is allocated per token;
* ``_engine_schedule.pxi``: ``StepPlan``, who computes what, planned once per engine
  for every team size 1..threads (each thread's rows of every product, how a chunk's
  product lists are cut, who runs the Monarch MLP, the probe pools and the engram
  sites), with the ``NEEDLE_CY_*`` knobs that tune it read once, and the decode step's
  prefetch streams, planned again only when ``run_threads`` changes.  A plan changes
  which thread computes a value and when, never the value.

Threads: in a chunk the CQ products split rows across ``threads`` OpenMP threads
(the products that share a rotated input, q/k/v/gate and the three Φ, as one list
of rows, or by tokens where the list is too short), and the per-token work
(norms, conv, RoPE, attention, MLP, mHC mixing, the probe pools) is split across
tokens.  A step (a chunk of one token) runs every block and the head in one
parallel region (``_step_blocks``): the threads meet at a barrier between
dependent operations, each product is cut into one contiguous share of rows per
thread, the KV heads of the attention and the rows of the Monarch MLP's Kronecker
factors are split, the probe pools run on the last thread beside thread 0's start
of the next block, and the small per-token operations run on thread 0 (all of it
as the plan of the team says).  Every
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


cdef inline float* fptr(cnp.ndarray a):
    return <float*>cnp.PyArray_DATA(a)


cdef inline int64_t* iptr(cnp.ndarray a):
    return <int64_t*>cnp.PyArray_DATA(a)


cdef extern from "csrc/prefetch_stream.h":
    void _prefetch_floats "nc_prefetch_floats"(const float* p, Py_ssize_t n) noexcept nogil


include "_engine_buffers.pxi"
include "_engine_schedule.pxi"


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
    # the scratch (make_scratch, _engine_buffers.pxi) and the thread schedule (plan_steps,
    # _engine_schedule.pxi), both made once per engine
    cdef EngineScratch buf
    cdef list _scratch_mem
    cdef StepPlan plan
    cdef list _plan_mem

    @property
    def sites_late(self):
        """Whether a decode step of a team smaller than mlp_team_min() runs the engram
        sites on its last thread, beside thread 0's Monarch MLP (plan_sites,
        sites_late_mode)."""
        return bool(self.plan.sites_late)

    @property
    def site_plan(self):
        """(site_order, site_upto) of plan_sites: the sites by the first layer that reads
        them, and per window of the last thread (2l: block l's start, 2l + 1: its MLP)
        the engram site units done by its end."""
        S, L = self.n_sites, self.L
        return (tuple(self.plan.site_order[i] for i in range(S)),
                tuple(self.plan.site_upto[w] for w in range(2 * L)))

    def plan_rows(self, nt):
        """The schedule's rows of every product for a team of nt threads (plan_steps):
        int32 [nt, products, 2], (r0, r1) of thread tid's rows of product p, r0 == r1
        where it has none.  Products are numbered per layer (Φ pre, post, res, q, k, v,
        gate, out), then per engram site (key, value), then the head."""
        if not 1 <= nt <= self.threads:
            raise ValueError(f"plan_rows: a team of 1..{self.threads} threads (the engine's threads), got {nt!r}")
        cdef const TeamPlan* team = &self.plan.teams[<int>nt]
        cdef Py_ssize_t P = self.plan.n_products, tid, p
        out = np.zeros((nt, P, 2), np.int32)
        for tid in range(nt):
            for p in range(P):
                out[tid, p, 0] = team.thread[tid].rows[p].r0
                out[tid, p, 1] = team.thread[tid].rows[p].r1
        return out

    @property
    def run_threads(self):
        """Threads the next prefill/step/forward uses: 1..``threads`` (the thread
        policy in ``needle_cy.threads`` moves it between calls).  Every team size is
        planned with the engine; setting a new one plans the decode step's prefetch
        streams for it (plan_streams)."""
        return self._run_threads

    @run_threads.setter
    def run_threads(self, value):
        cdef int n = int(value)
        if n < 1 or n > self.threads:
            raise ValueError(f"run_threads must lie in [1, {self.threads}] (the engine's threads), got {value!r}")
        self._run_threads = n
        plan_streams(&self.plan, n)     # (a step of n threads reads their prefetch streams)

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
        self._scratch_mem = make_scratch(
            &self.buf, threads=self.threads, d=self.d, n=self.n, H=self.H, K=self.K, dq=self.dq,
            dv=self.dv, nq4=self.nq4, N=self.N, R_cond=self.R_cond, e_width=self.NT * self.sub,
            n_sites=self.n_sites, cap=self.cap, n_tok_hist=self.n_tok_hist, layers=self.layers,
            L=self.L, sites=self.sites, emb=&self.emb, emb_out=&self.emb_out)
        self._plan_mem = plan_steps(
            &self.plan, layers=self.layers, L=self.L, sites=self.sites, S=self.n_sites,
            head=&self.emb_out, heads=self.heads_c, n_heads=self.n_heads, d=self.d, N=self.N,
            R_cond=self.R_cond, ba=self.ba, bb=self.bb, threads=self.threads)
        plan_streams(&self.plan, self._run_threads)
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

    cdef EngineState _fresh_state(self):
        return new_state(id(self), self.kv_int8, self.L, self.K, self.H, self.dq, self.dv, self.nq4,
                         self.cap, self.C, self.n_sites, self.n_vhist, self.d, self.n_tok_hist,
                         self.heads_c, self.n_heads, self.R_cells)

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
        return snapshot_state(self.state, self.cap)

    def restore(self, snap):
        if not isinstance(snap, EngineState) or snap.owner != id(self):
            raise ModelStateError("restore: the snapshot was not taken from this engine")
        cdef EngineState st = self._fresh_state()
        restore_state(st, snap)
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
        cdef ChunkRun run = chunk_run(self._run_threads, T, cells != NULL, self.L)   # (the schedule)
        cdef int ntok = run.ntok, cq_threads = run.cq_threads
        cdef bint stepped = run.stepped, teamed = run.teamed
        cdef float* cqw = self.buf.cq_work                 # CQ kernel workspace
        cdef LayerC* lc
        cdef SiteC* sc
        cdef float* conv_q = fptr(st.conv_q)
        cdef float* conv_k = fptr(st.conv_k)
        cdef float* conv_v = fptr(st.conv_v)
        cdef KVCache kv
        cdef float* vhist = fptr(st.value_hist)
        cdef int64_t* tokhist = iptr(st.tokens)
        cdef bint quant = self.quant
        cdef float* lanes = self.buf.lanes
        cdef float* nx = self.buf.nx
        cdef float* phi = self.buf.phi
        cdef Py_ssize_t nth = self.n_tok_hist, NT = self.NT, sub = self.sub
        cdef Py_ssize_t R_cells = self.R_cells, L = self.L
        cdef float* pmax[MAX_HEADS]
        cdef float* pden[MAX_HEADS]
        cdef float* psum[MAX_HEADS]
        cdef Py_ssize_t n_heads = self.n_heads if pool else 0
        cdef float* hid = self.buf.hid
        cdef Py_ssize_t first
        cdef const CQView* ws[4]
        cdef float* ys[4]
        cdef Py_ssize_t ystr[4]

        state_views(st, self.kv_int8, &kv, n_heads, pmax, pden, psum)

        with nogil:
            # ---- embedding: x0 = E[tok]·sqrt(d); every lane starts as x0 (spec §4.3, §4.5)
            for t in range(T):
                cq_dequantize_row(&self.emb, ids[t], self.buf.x0 + t * d, self.buf.row)
                for c in range(d):
                    self.buf.x0[t * d + c] = self.buf.x0[t * d + c] * self.emb_scale
                for m in range(n):
                    memcpy(lanes + t * nd + m * d, self.buf.x0 + t * d, d * sizeof(float))
                if cells != NULL:
                    memcpy(cells + t * R_cells * d, self.buf.x0 + t * d, d * sizeof(float))
            self._pool_chunk(0, self.buf.x0, ids, T, n_heads, pmax, pden, psum, ntok)

            # ---- engram memory of every site (spec §4.4): keys and conv'd values of the chunk
            if self.n_sites > 0:
                for i in range(nth):
                    self.buf.ctx[i] = tokhist[i]
                for t in range(T):
                    self.buf.ctx[nth + t] = ids[t]
                if T == 1:
                    self._prefetch_engram_rows(pos0)
                # (a decode step on several threads runs the sites in _step_blocks' region)
                for s in range(0 if stepped else self.n_sites):
                    sc = &self.sites[s]
                    self._engram_input(sc, T, pos0, self.buf.row)
                    # keys and values read the same input: one rotation when their CQ layouts agree
                    cq_rotate(&sc.key_proj, self.buf.e, T, NT * sub, cqw, cq_threads)
                    _project_shared(&sc.key_proj, &sc.key_proj, self.buf.e, T, NT * sub,
                                    self.buf.ekey + s * CHUNK_MAX * d, d, cqw, cq_threads)
                    _project_shared(&sc.key_proj, &sc.value_proj, self.buf.e, T, NT * sub, self.buf.evraw, d, cqw, cq_threads)
                    self._engram_values(s, sc, T, pos0, vhist)
                if nth > 0:
                    for i in range(nth):
                        tokhist[i] = self.buf.ctx[T + i]

            # ---- the blocks
            if stepped:
                with parallel(num_threads=cq_threads):
                    self._step_blocks(threadid(), nc_team_size(), pos0, ids, conv_q, conv_k, conv_v,
                                      &kv, vhist, n_heads, pmax, pden, psum, logits)
            # a chunk of several tokens on several threads: the blocks in one region too
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
                    self._group_products(ws, ys, nphi, 3, T, l * PR_LAYER + PR_PHI)
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
                cq_rotate(&lc.q_proj, self.buf.a, T, d, cqw, cq_threads)
                if lc.qkvg_shared and T > 1:
                    # the four products as one list of rows, cut into one share per thread
                    self._qkvg_list(lc, ws, ys)
                    ystr[0] = qw
                    ystr[1] = kw
                    ystr[2] = vw
                    ystr[3] = gw
                    self._group_products_strided(ws, ys, ystr, 4, T, l * PR_LAYER + PR_QKVG)
                else:
                    _project_shared(&lc.q_proj, &lc.q_proj, self.buf.a, T, d, self.buf.q, qw, cqw, cq_threads)
                    if not cq_same_rotation(&lc.q_proj, &lc.k_proj):
                        cq_rotate(&lc.q_proj, self.buf.a, T, d, cqw, cq_threads)
                    _project_shared(&lc.q_proj, &lc.k_proj, self.buf.a, T, d, self.buf.k, kw, cqw, cq_threads)
                    if not cq_same_rotation(&lc.q_proj, &lc.k_proj):
                        cq_rotate(&lc.q_proj, self.buf.a, T, d, cqw, cq_threads)
                    _project_shared(&lc.q_proj, &lc.v_proj, self.buf.a, T, d, self.buf.v, vw, cqw, cq_threads)
                    if not cq_same_rotation(&lc.q_proj, &lc.v_proj):
                        cq_rotate(&lc.q_proj, self.buf.a, T, d, cqw, cq_threads)
                    _project_shared(&lc.q_proj, &lc.gate_proj, self.buf.a, T, d, self.buf.g, gw, cqw, cq_threads)
                # conv, QK norm, RoPE, quantizers; k and v go into the cache (steps 2–6)
                if ntok > 1:
                    for t in prange(T, num_threads=ntok, schedule="static"):
                        self._qkv_token(lc, l, t, pos0, conv_q, conv_k, conv_v, &kv)
                else:
                    for t in range(T):
                        self._qkv_token(lc, l, t, pos0, conv_q, conv_k, conv_v, &kv)
                if hist > 0:
                    self._shift_history(conv_q + l * hist * qw, hist, self.buf.q, T, qw)
                    self._shift_history(conv_k + l * hist * kw, hist, self.buf.k, T, kw)
                    self._shift_history(conv_v + l * hist * vw, hist, self.buf.v, T, vw)
                # GQA attention over the visible cache slots (steps 7–8), gate, A8 (step 9):
                # a chunk's tokens in parallel (a step's KV heads: _step_blocks)
                if ntok > 1:
                    # (dynamic: a token's cost grows with the slots it sees)
                    for t in prange(T, num_threads=ntok, schedule="dynamic", chunksize=4):
                        self._attend_token(lc, l, t, pos0, &kv)
                else:
                    for t in range(T):
                        self._attend_token(lc, l, t, pos0, &kv)
                _project(&lc.out_proj, self.buf.o, T, gw, self.buf.ao, d, cqw, cq_threads)
                # rest of the block, y = Block(u) − u, lane update, cell (spec §4.5–§4.8)
                if ntok > 1:
                    for t in prange(T, num_threads=ntok, schedule="static"):
                        self._block_out(lc, t)
                else:
                    for t in range(T):
                        self._block_out(lc, t)
                if cells != NULL:
                    for t in range(T):
                        memcpy(cells + (t * R_cells + l + 1) * d, self.buf.cell + t * d, d * sizeof(float))
                self._pool_chunk(l + 1, self.buf.cell, ids, T, n_heads, pmax, pden, psum, ntok)

            # ---- output: final norm, A8, tied head (spec §4.9); only the rows asked for
            if logits != NULL and not stepped:
                if L == 0:
                    memcpy(self.buf.cell, self.buf.x0, T * d * sizeof(float))
                first = 0 if all_rows else T - 1
                for t in range(first, T):
                    zc_rmsnorm_c(self.buf.cell + t * d, self.final_norm, hid + (t - first) * d, d)
                    if quant:
                        a8_inplace(hid + (t - first) * d, d, A8_QMAX)
                _project(&self.emb_out, hid, T - first, d, logits, self.V_out, cqw, cq_threads)
        st.position += T

    cdef void _engram_input(self, SiteC* sc, Py_ssize_t T, Py_ssize_t pos0, float* row) noexcept nogil:
        """Site sc's input for the chunk's T tokens into buf.e (spec §4.4): per token, the
        table row of each (order, head) n-gram hash that fits in the window (zeros
        otherwise), A8 when quantized.  Reads the token context buf.ctx; row: the calling
        thread's dequantization scratch (its part of buf.row)."""
        cdef Py_ssize_t NT = self.NT, sub = self.sub, t
        cdef int oi, e
        cdef float* ptr
        cdef int64_t row_id
        for t in range(T):
            for oi in range(self.n_orders):
                for e in range(self.E):
                    ptr = self.buf.e + t * NT * sub + (oi * self.E + e) * sub
                    if self._engram_row(oi, e, t, pos0, &row_id):
                        cq_dequantize_row(&sc.tables, row_id, ptr, row)
                    else:
                        memset(ptr, 0, sub * sizeof(float))
            if self.quant:
                a8_inplace(self.buf.e + t * NT * sub, NT * sub, A8_QMAX)

    cdef inline bint _engram_row(self, int oi, int e, Py_ssize_t t, Py_ssize_t pos0,
                                 int64_t* row_id) noexcept nogil:
        """The table row of (order oi, head e) for chunk token t (spec §4.4): its n-gram
        hash over the token context buf.ctx; 0 where the n-gram does not fit the window.
        Every site hashes the same context with the same seeds (only the tables differ)."""
        cdef int order = self.orders[oi]
        cdef uint32_t seed
        if not _visible(pos0 + t, pos0 + t - (order - 1), self.recent, self.sinks, -1):
            return 0
        seed = <uint32_t>0x9E3779B9u * <uint32_t>(oi * self.stride + e + 1)
        row_id[0] = (oi * self.E + e) * self.slots + \
            <int64_t>(engram_hash_c(self.buf.ctx, self.n_tok_hist + t, order, seed) % <uint32_t>self.slots)
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
        """Site s's values of the chunk: the dilated causal conv over v' (buf.evraw; taps
        at t, t-dil, t-2·dil, ..., the value history first) into buf.eval, then the
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
                    hptr[j] = self.buf.evraw + src * d
                else:
                    hptr[j] = vhist + (s * vh + vh + src) * d
            conv_step_c(sc.taps, e_taps, d, d, hptr, self.buf.eval + (s * CHUNK_MAX + t) * d)
        self._shift_history(vhist + s * vh * d, vh, self.buf.evraw, T, d)

    cdef void _chunk_blocks(self, int tid, int nt, Py_ssize_t T, Py_ssize_t pos0, const int64_t* ids,
                            float* conv_q, float* conv_k, float* conv_v, KVCache* kv,
                            Py_ssize_t n_heads, float** pmax, float** pden, float** psum) noexcept nogil:
        """Every block of a chunk of T ≥ 2 tokens, run by each of the nt threads of the
        caller's parallel region (thread tid): _run_chunk's block loop in one region
        instead of about twelve per block (their fork and join showed in a 2-thread prefill's profile).

        The per-token steps go to the threads by contiguous token ranges (token_range), so
        a token's lanes, cell and conv inputs stay with one thread from block to block; the
        rotations by the same ranges (cq_rotate_tokens); the products as the plan cuts them
        (_group_share); the attention by tokens dealt round the team (a token's cost grows
        with its position); the probe pools by (head, probe), dealt alike.  Threads meet at
        the team barrier between dependent steps; every value is the one _run_chunk's loop
        makes."""
        cdef Py_ssize_t d = self.d, n = self.n, nd = self.n * self.d, H = self.H, K = self.K
        cdef Py_ssize_t qw = H * self.dq, kw = K * self.dq, vw = K * self.dv, gw = H * self.dv
        cdef Py_ssize_t nphi = 2 * n + n * n
        cdef Py_ssize_t hist = self.C - 1 if self.C > 0 else 0
        cdef Py_ssize_t t0, t1, t, l, i, p
        cdef const ThreadPlan* me = &self.plan.teams[nt].thread[tid]
        cdef Py_ssize_t n_pools = self.plan.n_pools if n_heads > 0 else 0
        cdef LayerC* lc
        cdef const CQView* ws[4]
        cdef float* ys[4]
        cdef Py_ssize_t ystr[4]
        cdef float* cqw = self.buf.cq_work
        cdef nc_barrier* bar = &self.buf.team_bar
        cdef float* kf = cq_decode_scratch()     # this thread's scratch for the rotations
        token_range(T, tid, nt, &t0, &t1)
        if tid == 0:
            nc_barrier_init(bar, nt)
        nc_team_barrier()
        for l in range(self.L):
            lc = &self.layers[l]
            p = l * PR_LAYER
            # mHC router input, its rotation and the three Φ (spec §4.5)
            for t in range(t0, t1):
                self._router_input(t)
            self._rotate_chunk(&lc.phi_pre, self.buf.nx, T, nd, tid, nt, kf, bar)
            if lc.phi_shared:
                self._phi_list(lc, ws, ys)
                for i in range(3):
                    ystr[i] = nphi
                self._group_share(ws, ys, ystr, 3, T, p + PR_PHI, tid, nt)
            elif tid == 0:
                _project_shared(&lc.phi_pre, &lc.phi_pre, self.buf.nx, T, nd, self.buf.phi, nphi, cqw, 1)
                _project(&lc.phi_post, self.buf.nx, T, nd, self.buf.phi + n, nphi, cqw, 1)
                _project(&lc.phi_res, self.buf.nx, T, nd, self.buf.phi + 2 * n, nphi, cqw, 1)
            nc_barrier_wait(bar)
            # router weights, block input, a = A8(ZCRMS(x)), the attention products
            for t in range(t0, t1):
                self._mhc_in(lc, t)
                self._block_in(lc, t)
            self._rotate_chunk(&lc.q_proj, self.buf.a, T, d, tid, nt, kf, bar)
            if lc.qkvg_shared:
                self._qkvg_list(lc, ws, ys)
                ystr[0] = qw
                ystr[1] = kw
                ystr[2] = vw
                ystr[3] = gw
                self._group_share(ws, ys, ystr, 4, T, p + PR_QKVG, tid, nt)
            elif tid == 0:
                _project_shared(&lc.q_proj, &lc.q_proj, self.buf.a, T, d, self.buf.q, qw, cqw, 1)
                _project(&lc.k_proj, self.buf.a, T, d, self.buf.k, kw, cqw, 1)
                _project(&lc.v_proj, self.buf.a, T, d, self.buf.v, vw, cqw, 1)
                _project(&lc.gate_proj, self.buf.a, T, d, self.buf.g, gw, cqw, 1)
            nc_barrier_wait(bar)
            # conv, QK norm, RoPE, quantizers; k and v into the cache (steps 2–6)
            for t in range(t0, t1):
                self._qkv_token(lc, l, t, pos0, conv_q, conv_k, conv_v, kv)
            nc_barrier_wait(bar)
            # the conv histories (thread 0) beside the attention, gate and A8 (steps 7–9)
            if tid == 0 and hist > 0:
                self._shift_history(conv_q + l * hist * qw, hist, self.buf.q, T, qw)
                self._shift_history(conv_k + l * hist * kw, hist, self.buf.k, T, kw)
                self._shift_history(conv_v + l * hist * vw, hist, self.buf.v, T, vw)
            t = me.deal_first
            while t < T:
                self._attend_token(lc, l, t, pos0, kv)
                t = t + me.deal_step
            nc_barrier_wait(bar)       # (the rotation reads other threads' tokens' outputs)
            self._rotate_chunk(&lc.out_proj, self.buf.o, T, gw, tid, nt, kf, bar)
            ws[0] = &lc.out_proj
            ys[0] = self.buf.ao
            ystr[0] = d
            self._group_share(ws, ys, ystr, 1, T, p + PR_OUT, tid, nt)
            nc_barrier_wait(bar)
            # rest of the block, lanes, cell (spec §4.5–§4.8), then the cell's pools
            for t in range(t0, t1):
                self._block_out(lc, t)
            nc_barrier_wait(bar)
            self._pool_tasks(l + 1, self.buf.cell, ids, T, n_heads, pmax, pden, psum, me.deal_first, n_pools,
                             me.deal_step)
        cq_free_decode_scratch(kf)

    cdef inline void _rotate_chunk(self, const CQView* w, const float* X, Py_ssize_t T, Py_ssize_t x_stride,
                                   int tid, int nt, float* kf, nc_barrier* bar) noexcept nogil:
        """T tokens of X (each written by the thread of its token range, or before the
        region) rotated into the shared workspace by the team, ready for every thread on
        return: each thread its tokens (cq_rotate_tokens), one meeting; where that does
        not apply, thread 0 rotates them all (the float form, or a token that is not an
        A8 vector after all), one more."""
        cdef bint shared = cq_rotate_tokens(w, X, T, x_stride, self.buf.cq_work, tid, nt, kf,
                                            cq_decode_scratch_floats() if kf != NULL else 0)
        nc_barrier_wait(bar)
        if shared and cq_rotate_tokens_ok(w, self.buf.cq_work, T):
            return
        nc_barrier_wait(bar)       # (every thread has read the verdict before thread 0 rewrites it)
        if tid == 0:
            cq_rotate(w, X, T, x_stride, self.buf.cq_work, 1)
        nc_barrier_wait(bar)

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
        thread rotates each product input into its own workspace (_rotate_team).  Who
        does what is the plan of this team (StepPlan, _engine_schedule.pxi): each thread
        computes its rows of the engram and block CQ products (_products; the three short
        mHC Φ run on thread 0), the KV heads dealt to it, the Monarch MLP and the columns
        of the lane update that follows it split by rows (monarch_mlp_c's team form) where
        the team splits the MLP, else on thread 0, and the other per-token operations run
        on thread 0; every value is computed as on one thread, so the logits are the same
        bits at any thread count.
        The probe pools of block l's cell run on the aside thread beside thread 0's serial
        start of block l + 1 (router input, Φ, router weights, block input; the cell is
        next written by block l + 1's lane update); the last cell's pools run after the
        head's products, shared by the team."""
        cdef Py_ssize_t d = self.d, n = self.n, nd = self.n * self.d, K = self.K
        cdef Py_ssize_t gw = self.H * self.dv
        cdef float* og               # this thread's gated attention output (_gate_into)
        cdef Py_ssize_t l, kh, hd, s, p
        cdef SiteC* sc
        cdef Py_ssize_t rng[12]
        cdef int n_rng = 0, unit = 0
        cdef const TeamPlan* team = &self.plan.teams[nt]
        cdef const ThreadPlan* me = &team.thread[tid]
        cdef const RowShare* whole = whole_rows(&self.plan)
        # the (head, probe) pools of a cell: all of them beside thread 0's serial start of
        # the next block, which is long enough since the Φ run there (they had been cut
        # in four parts beside four serial steps, with a meeting between each)
        cdef Py_ssize_t n_pools = self.plan.n_pools if n_heads > 0 else 0
        # the engram sites in the aside thread's waits through thread 0's MLP (plan_sites)
        cdef bint late = team.sites_late
        cdef float* cqw = self.buf.cq_work
        cdef float* phi = self.buf.phi
        cdef LayerC* lc
        cdef const CQView* ws[4]
        cdef float* ys[4]
        cdef nc_barrier* bar = &self.buf.team_bar
        # this thread's own rotations: made where they are read, no table or code crosses
        # to another core (_rotate_team)
        cdef float* mine = self.buf.step_work + tid * self.buf.step_work_len
        # this thread's prefetch stream (plan_streams), pumped while it waits at the
        # meetings; ph numbers the reads of the plan (each product list, each MLP)
        cdef nc_pf_stream* pf = step_stream(&self.plan, tid, nt)
        cdef int ph = 0
        # the team's own barrier (no system call per meeting, unlike OpenMP's): set up
        # by thread 0 for the team's real size, behind one OpenMP barrier
        if tid == 0:
            nc_barrier_init(bar, nt)
        nc_team_barrier()
        nc_prof_begin(tid)       # (the opt-in meeting profile: barrier_profile)
        # engram sites (spec §4.4): input on thread 0, the key and value
        # products split by rows, the value conv on the aside thread beside thread 0's
        # input of the next site (the conv reads buf.evraw, which the next site's products
        # write only after the meeting of its rotation; its output is read by thread 0's
        # _block_in, several meetings later, or after one meeting more in block 0)
        for s in range(0 if late else self.n_sites):
            sc = &self.sites[s]
            if tid == 0:
                self._engram_input(sc, 1, pos0, self.buf.row)
            self._rotate_team(mine, pf, &sc.key_proj, self.buf.e, tid, nt, bar)
            ws[0] = &sc.key_proj
            ys[0] = self.buf.ekey + s * CHUNK_MAX * d
            ws[1] = &sc.value_proj
            ys[1] = self.buf.evraw
            p = site_product(&self.plan, s)
            if cq_same_rotation(&sc.key_proj, &sc.value_proj):
                self._products(mine, ws, ys, 2, me.rows + p)
            else:
                self._products(mine, ws, ys, 1, me.rows + p)
                nc_pf_done(pf, ph)
                ph += 1
                cq_rotate(&sc.value_proj, self.buf.e, 1, sc.value_proj.cols, mine, 1)
                self._products(mine, ws + 1, ys + 1, 1, me.rows + p + 1)
            nc_pf_done(pf, ph)
            ph += 1
            nc_barrier_wait_pf(bar, pf)
            if tid == team.aside:
                self._engram_values(s, sc, 1, pos0, vhist)
        for l in range(self.L):
            lc = &self.layers[l]
            p = l * PR_LAYER
            # mHC router input and the three Φ products on thread 0 (spec §4.5): 24 rows at
            # full size, where a thread's share of 12 took less time than the rotation of
            # their 3072-wide input each thread made for it, and a meeting between (split
            # by rows, the 2-thread decode was slower); then the router weights and
            # the block input, a = A8(ZCRMS(x)), with no meeting between: every one of them
            # reads only what thread 0 wrote.  The previous cell's pools beside them.
            if tid == 0:
                self._router_input(0)
                if lc.phi_shared:
                    cq_rotate(&lc.phi_pre, self.buf.nx, 1, lc.phi_pre.cols, mine, 1)
                    self._phi_list(lc, ws, ys)
                    self._products(mine, ws, ys, 3, whole + p + PR_PHI)
                else:
                    _project_shared(&lc.phi_pre, &lc.phi_pre, self.buf.nx, 1, nd, phi, 0, mine, 1)
                    _project(&lc.phi_post, self.buf.nx, 1, nd, phi + n, 0, cqw, 1)
                    _project(&lc.phi_res, self.buf.nx, 1, nd, phi + 2 * n, 0, cqw, 1)
            if l == 0 and lc.site >= 0:
                # the last site's value conv (last thread, after the sites' meetings) may be
                # the one the first block's _block_in reads
                nc_barrier_wait_pf(bar, pf)
            if tid == 0:
                self._mhc_in(lc, 0)
                self._block_in(lc, 0)
            if tid == team.aside and l > 0:
                self._pool_tasks(l, self.buf.cell, ids, 1, n_heads, pmax, pden, psum, 0, n_pools, 1)
            if late and tid == team.aside:
                while unit < self.plan.site_upto[2 * l]:        # engram site units (plan_sites)
                    self._site_unit(unit, mine, self.buf.row + tid * self.buf.row_len, pos0, vhist, ws, ys)
                    unit += 1
            nc_pf_done(pf, ph)
            ph += 1
            self._rotate_team(mine, pf, &lc.q_proj, self.buf.a, tid, nt, bar)
            if lc.qkvg_shared:
                self._qkvg_list(lc, ws, ys)
                self._products(mine, ws, ys, 4, me.rows + p + PR_QKVG)
            elif tid == 0:
                _project_shared(&lc.q_proj, &lc.q_proj, self.buf.a, 1, d, self.buf.q, 0, mine, 1)
                _project(&lc.k_proj, self.buf.a, 1, d, self.buf.k, 0, cqw, 1)
                _project(&lc.v_proj, self.buf.a, 1, d, self.buf.v, 0, cqw, 1)
                _project(&lc.gate_proj, self.buf.a, 1, d, self.buf.g, 0, cqw, 1)
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
                if me.mlp_reads:
                    prefetch_mlp(&self.plan, lc, me)
                if tid == 0 and l + 1 < self.L and self.layers[l + 1].phi_shared:   # thread 0's
                    self._phi_list(&self.layers[l + 1], ws, ys)
                    prefetch_rows(ws, 3, whole + p + PR_LAYER + PR_PHI)
            kh = me.deal_first
            while kh < K:
                self._group_step(lc, l, kh, pos0, conv_q, conv_k, conv_v, kv, rng, n_rng)
                kh = kh + me.deal_step
            nc_barrier_wait_pf(bar, pf)
            # o ⊙ σ(g) and A8 by every thread into its own copy, then rotated there: no
            # meeting between (on thread 0 alone the team met again to read its output)
            og = self.buf.gate_own + tid * self.buf.gate_own_len
            memcpy(og, self.buf.o, gw * sizeof(float))
            self._gate_into(og, self.buf.g)
            cq_rotate(&lc.out_proj, og, 1, lc.out_proj.cols, mine, 1)
            ws[0] = &lc.out_proj
            ys[0] = self.buf.ao
            self._products(mine, ws, ys, 1, me.rows + p + PR_OUT)
            nc_pf_done(pf, ph)
            ph += 1
            nc_barrier_wait_pf(bar, pf)
            # rest of the block: the Monarch MLP (split between the threads of a team of
            # mlp_team or more, after a meeting that shows them its input; else on thread 0
            # alone, right after it); lanes, cell
            if tid == 0:
                self._mlp_input(lc, 0)
            if team.mlp_split:
                nc_barrier_wait_pf(bar, pf)
                monarch_mlp_c(self.buf.a, d, self.N, self.R_cond, lc.d1, lc.d2, lc.b2, lc.d3, lc.d4,
                              lc.w1a, lc.w1b, lc.w2a, lc.w2b, lc.w3a, lc.w3b, self.ba, self.bb,
                              lc.cond_v, lc.cond_u, self.p1, self.p2, self.buf.mlp_work,
                              self.buf.mlp_work + tid * self.buf.mlp_work_len + 4 * self.N, self.buf.ao,
                              tid, nt, bar, pf)
                # the lane update of the MLP output's columns this thread wrote (team_cols)
                self._lane_update_cols(lc, 0, me.lane_c0, me.lane_c1)
            elif tid == 0:
                monarch_mlp_c(self.buf.a, d, self.N, self.R_cond, lc.d1, lc.d2, lc.b2, lc.d3, lc.d4,
                              lc.w1a, lc.w1b, lc.w2a, lc.w2b, lc.w3a, lc.w3b, self.ba, self.bb,
                              lc.cond_v, lc.cond_u, self.p1, self.p2, self.buf.mlp_work,
                              self.buf.mlp_work + 4 * self.N, self.buf.ao, 0, 1, NULL, pf)
                self._lane_update_cols(lc, 0, 0, d)
            elif late and tid == team.aside:
                # engram site units (plan_sites), where this thread would wait
                while unit < self.plan.site_upto[2 * l + 1]:
                    self._site_unit(unit, mine, self.buf.row + tid * self.buf.row_len, pos0, vhist, ws, ys)
                    unit += 1
            nc_pf_done(pf, ph)
            ph += 1
            nc_barrier_wait_pf(bar, pf)
        # the last cell's pools, shared by the team (every pool is its own): after the
        # head's products when there is a head (before it, the head's rotation waited for
        # them; on the aside thread alone, after its share of the head, they
        # kept thread 0 waiting at the region's end)
        if logits == NULL:
            self._pool_tasks(self.L, self.buf.cell, ids, 1, n_heads, pmax, pden, psum, me.deal_first, n_pools,
                             me.deal_step)
        # output: final norm, A8, tied head (spec §4.9)
        if logits != NULL:
            if tid == 0:
                zc_rmsnorm_c(self.buf.cell, self.final_norm, self.buf.hid, d)
                if self.quant:
                    a8_inplace(self.buf.hid, d, A8_QMAX)
            self._rotate_team(mine, pf, &self.emb_out, self.buf.hid, tid, nt, bar)
            ws[0] = &self.emb_out
            ys[0] = logits
            self._products(mine, ws, ys, 1, me.rows + head_product(&self.plan))
            # the last cell's pools (the cell is no longer written)
            self._pool_tasks(self.L, self.buf.cell, ids, 1, n_heads, pmax, pden, psum, me.deal_first, n_pools,
                             me.deal_step)
        nc_prof_end()

    cdef void _site_unit(self, int unit, float* mine, float* row, Py_ssize_t pos0, float* vhist,
                         const CQView** ws, float** ys) noexcept nogil:
        """Unit `unit` of a one-token step's engram sites, on one thread (plan_sites):
        units 4i … 4i + 3 of site site_order[i] are its input, its key product, its value
        product (the input rotated for each product: the thread's workspace holds other
        products' inputs between) and its value conv.  The same values as the sites'
        own phases."""
        cdef Py_ssize_t s = self.plan.site_order[unit // 4]
        cdef SiteC* sc = &self.sites[s]
        cdef int kind = unit % 4
        cdef const RowShare* whole = whole_rows(&self.plan)
        if kind == 0:
            self._engram_input(sc, 1, pos0, row)
        elif kind == 3:
            self._engram_values(s, sc, 1, pos0, vhist)
        else:
            ws[0] = &sc.key_proj if kind == 1 else &sc.value_proj
            ys[0] = self.buf.ekey + s * CHUNK_MAX * self.d if kind == 1 else self.buf.evraw
            cq_rotate(ws[0], self.buf.e, 1, ws[0].cols, mine, 1)
            self._products(mine, ws, ys, 1, whole + site_product(&self.plan, s) + kind - 1)

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
        """The three mHC Φ products of a layer as a list (outputs: hpre, hpost, P in buf.phi)."""
        ws[0] = &lc.phi_pre
        ws[1] = &lc.phi_post
        ws[2] = &lc.phi_res
        ys[0] = self.buf.phi
        ys[1] = self.buf.phi + self.n
        ys[2] = self.buf.phi + 2 * self.n

    cdef inline void _qkvg_list(self, LayerC* lc, const CQView** ws, float** ys) noexcept nogil:
        """The q, k, v and gate products of a layer as a list."""
        ws[0] = &lc.q_proj
        ws[1] = &lc.k_proj
        ws[2] = &lc.v_proj
        ws[3] = &lc.gate_proj
        ys[0] = self.buf.q
        ys[1] = self.buf.k
        ys[2] = self.buf.v
        ys[3] = self.buf.g

    cdef void _products(self, float* work, const CQView** ws, float** ys, int count,
                        const RowShare* rows) noexcept nogil:
        """One thread's part of y_i = W_i·x for `count` matrices whose input cq_rotate
        left in the CQ workspace `work`: rows[i] of matrix i (the plan's share of the
        list, one contiguous range per matrix it touches)."""
        cdef int i
        for i in range(count):
            if rows[i].r1 > rows[i].r0:
                cq_matvec_rotated_rows(ws[i], work, ys[i], rows[i].r0, rows[i].r1)

    cdef void _group_products(self, const CQView** ws, float** ys, Py_ssize_t y_stride, int count,
                              Py_ssize_t T, Py_ssize_t first) noexcept nogil:
        """_group_products_strided with one output row stride for every matrix."""
        cdef Py_ssize_t ystr[4]
        cdef int i
        for i in range(count):
            ystr[i] = y_stride
        self._group_products_strided(ws, ys, ystr, count, T, first)

    cdef void _group_products_strided(self, const CQView** ws, float** ys, const Py_ssize_t* ystr,
                                      int count, Py_ssize_t T, Py_ssize_t first) noexcept nogil:
        """Y_i = X·W_iᵀ for T tokens and count ≤ 4 matrices whose input cq_rotate left in
        the CQ workspace, in one parallel region, each thread its part of the list of
        products numbered from `first` (_group_share).  Same bits at any split
        (cq_matmul_rotated_rows)."""
        cdef int nthr = self._run_threads
        cdef float* wdec
        if nthr == 1:
            # one call for the list: the lookup kernel makes each token tile's tables once
            wdec = cq_decode_scratch()
            self._group_rows(ws, ys, ystr, count, T, whole_rows(&self.plan) + first, wdec)
            cq_free_decode_scratch(wdec)
            return
        with parallel(num_threads=nthr):
            self._group_share(ws, ys, ystr, count, T, first, threadid(), nc_team_size())

    cdef void _group_share(self, const CQView** ws, float** ys, const Py_ssize_t* ystr, int count,
                           Py_ssize_t T, Py_ssize_t first, int tid, int nt) noexcept nogil:
        """Thread tid's part of a chunk's list of products numbered from `first`, as the
        plan of its team cuts it: its rows of each matrix, or its tokens of all of them
        (its own function, so that its locals are the thread's own: a Cython parallel
        block shares any variable it only writes through a pointer)."""
        cdef const TeamPlan* team = &self.plan.teams[nt]
        cdef float* wdec = cq_decode_scratch()
        cdef Py_ssize_t t0, t1
        cdef int i
        if team.by_rows[first]:
            self._group_rows(ws, ys, ystr, count, T, team.thread[tid].rows + first, wdec)
        else:
            token_range(T, tid, nt, &t0, &t1)
            for i in range(count):
                cq_matmul_rotated_rows(ws[i], self.buf.cq_work, T, t0, t1, ys[i], ystr[i], 0, ws[i].rows, wdec)
        cq_free_decode_scratch(wdec)

    cdef inline void _group_rows(self, const CQView** ws, float** ys, const Py_ssize_t* ystr, int count,
                                 Py_ssize_t T, const RowShare* rows, float* wdec) noexcept nogil:
        """rows[i] of matrix i of a list of products, for all T tokens, in one call."""
        cdef Py_ssize_t r0[4]
        cdef Py_ssize_t r1[4]
        cdef int i
        for i in range(count):
            r0[i], r1[i] = rows[i].r0, rows[i].r1
        cq_matmul_rotated_rows_list(ws, count, self.buf.cq_work, T, r0, r1, ys, ystr, wdec)

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
        rms_unit_c(self.buf.lanes + t * nd, self.buf.nx + t * nd, nd)
        if self.quant:
            a8_inplace(self.buf.nx + t * nd, nd, A8_QMAX)

    cdef void _block_in(self, LayerC* lc, Py_ssize_t t) noexcept nogil:
        """Block input of token t after the engram gate (spec §4.6), then
        a = A8(ZCRMS(x; norm_in)), the attention input (§4.7 step 1)."""
        cdef Py_ssize_t d = self.d, c
        cdef float alpha
        cdef const float* v
        if lc.site >= 0:
            alpha = engram_alpha_c(self.buf.u + t * d, self.buf.ekey + (lc.site * CHUNK_MAX + t) * d, d)
            v = self.buf.eval + (lc.site * CHUNK_MAX + t) * d
            for c in range(d):
                self.buf.x[t * d + c] = self.buf.u[t * d + c] + alpha * v[c]
        else:
            memcpy(self.buf.x + t * d, self.buf.u + t * d, d * sizeof(float))
        zc_rmsnorm_c(self.buf.x + t * d, lc.norm_in, self.buf.a + t * d, d)
        if self.quant:
            a8_inplace(self.buf.a + t * d, d, A8_QMAX)

    cdef void _mhc_in(self, LayerC* lc, Py_ssize_t t) noexcept nogil:
        """Router weights of token t: hpre, hpost (into buf.phi) and P (Sinkhorn, in place);
        block input u = Σ_m hpre[m]·X[m]."""
        cdef Py_ssize_t n = self.n, d = self.d, nd = self.n * self.d, m, i, c
        cdef float* ph = self.buf.phi + t * (2 * n + n * n)
        cdef float* X = self.buf.lanes + t * nd
        cdef float* u = self.buf.u + t * d
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
        storage keeps the A8 codes and scales (of q too, in buf.qcode/buf.qscale) instead."""
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
            self._conv_token(lc.q_taps, self.buf.q, conv_q + l * hist * qw, qw, t, pos0, lc.band,
                             self.buf.qc + t * qw, q0, q1)
            self._conv_token(lc.k_taps, self.buf.k, conv_k + l * hist * kw, kw, t, pos0, lc.band,
                             self.buf.kc + t * kw, k0, k1)
            self._conv_token(lc.v_taps, self.buf.v, conv_v + l * hist * vw, vw, t, pos0, lc.band,
                             self.buf.vc + t * vw, v0, v1)
        else:
            memcpy(self.buf.qc + t * qw + q0, self.buf.q + t * qw + q0, (q1 - q0) * sizeof(float))
            memcpy(self.buf.kc + t * kw + k0, self.buf.k + t * kw + k0, (k1 - k0) * sizeof(float))
            memcpy(self.buf.vc + t * vw + v0, self.buf.v + t * vw + v0, (v1 - v0) * sizeof(float))

    cdef void _q_head(self, LayerC* lc, Py_ssize_t t, Py_ssize_t pos0, Py_ssize_t h) noexcept nogil:
        """Query head h of chunk token t after the conv: QK norm, RoPE, A8 (or its codes)."""
        cdef Py_ssize_t dq = self.dq, p = pos0 + t
        cdef float* q = self.buf.qc + t * self.H * dq + h * dq
        zc_rmsnorm_c(q, lc.q_norm, q, dq)
        rope_c(q, dq, self.rope_cos + p * (dq // 2), self.rope_sin + p * (dq // 2))
        if self.kv_int8:
            self.buf.qscale[t * self.H + h] = a8_codes_c(q, dq, A8_QMAX,
                                                       self.buf.qcode + t * self.H * 4 * self.nq4 + h * 4 * self.nq4)
        elif self.quant:
            a8_inplace(q, dq, A8_QMAX)

    cdef void _kv_head(self, LayerC* lc, Py_ssize_t l, Py_ssize_t t, Py_ssize_t pos0, Py_ssize_t h,
                       KVCache* kv) noexcept nogil:
        """KV head h of chunk token t after the conv: key norm, RoPE, quantizers, and both
        into the cache slot of its position."""
        cdef Py_ssize_t K = self.K, dq = self.dq, dv = self.dv, i, p = pos0 + t
        cdef Py_ssize_t cap = self.cap, slot = self._slot(p), kv_row = (l * K + h) * cap + slot
        cdef float* k = self.buf.kc + t * K * dq + h * dq
        cdef float* v = self.buf.vc + t * K * dv + h * dv
        cdef int8_t* kcode = self.buf.kcode + t * K * dq + h * dq
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
            _shift_history_cols(conv_q + l * hist * qw, hist, self.buf.q, qw, q0, q1)
            _shift_history_cols(conv_k + l * hist * kw, hist, self.buf.k, kw, kh * dq, (kh + 1) * dq)
            _shift_history_cols(conv_v + l * hist * vw, hist, self.buf.v, vw, kh * dv, (kh + 1) * dv)
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
        (scores in the calling thread's row of buf.scores); writes o[kh·G·dv :]."""
        cdef Py_ssize_t H = self.H, K = self.K, dq = self.dq, dv = self.dv, G = self.H // self.K
        cdef Py_ssize_t cap = self.cap, head = l * K + kh
        cdef float* scores = self.buf.scores + threadid() * G * cap
        cdef float* o = self.buf.o + t * H * dv + kh * G * dv
        cdef Py_ssize_t q4 = 4 * self.nq4
        if self.kv_int8:
            attend_group_i8_c(self.buf.qcode + (t * H + kh * G) * q4, q4, self.buf.qscale + t * H + kh * G, G,
                              kv.k_codes + head * self.nq4 * cap * 4, cap, kv.k_scale + head * cap,
                              kv.v_codes + head * cap * dv, kv.v_scale + head * cap,
                              dq, dv, self.attn_scale, rng, n_rng, scores, cap, o, dv)
        else:
            attend_group_c(self.buf.qc + t * H * dq + kh * G * dq, dq, G,
                           kv.k + head * dq * cap, cap, kv.v + head * cap * dv,
                           dq, dv, self.attn_scale, rng, n_rng, scores, cap, o, dv)

    cdef void _attend_gate(self, Py_ssize_t t) noexcept nogil:
        """o ⊙ σ(g), then A8 (spec §4.7 step 9) for chunk token t."""
        cdef Py_ssize_t gw = self.H * self.dv
        self._gate_into(self.buf.o + t * gw, self.buf.g + t * gw)

    cdef void _gate_into(self, float* o, const float* g) noexcept nogil:
        """o ⊙ σ(g), then A8, in place on one token's attention output o (buf.o's row, or a
        thread's own copy of it in a decode step)."""
        mul_sigmoid_c(o, g, self.H * self.dv)
        if self.quant:
            a8_inplace(o, self.H * self.dv, A8_QMAX)

    cdef void _block_out(self, LayerC* lc, Py_ssize_t t) noexcept nogil:
        """Rest of Block_l for token t (post-norm, gated residual, Monarch MLP), then
        y = Block(u) − u, lanes' = P·lanes + hpost·y and the cell (lane mean)."""
        cdef float* work = self.buf.mlp_work + threadid() * self.buf.mlp_work_len
        self._mlp_input(lc, t)
        monarch_mlp_c(self.buf.a + t * self.d, self.d, self.N, self.R_cond, lc.d1, lc.d2, lc.b2, lc.d3,
                      lc.d4, lc.w1a, lc.w1b, lc.w2a, lc.w2b, lc.w3a, lc.w3b, self.ba, self.bb,
                      lc.cond_v, lc.cond_u, self.p1, self.p2, work, work + 4 * self.N,
                      self.buf.ao + t * self.d, 0, 1, NULL, NULL)
        self._lane_update(lc, t)

    cdef void _mlp_input(self, LayerC* lc, Py_ssize_t t) noexcept nogil:
        """Post-norm of the attention output, the gated residual x += g·a, and the MLP
        input m = ZCRMS(x; pre_hada) (into buf.a) for token t."""
        cdef Py_ssize_t d = self.d, c
        cdef float* x = self.buf.x + t * d
        cdef float* a = self.buf.ao + t * d
        cdef float gate = lc.attn_gate
        zc_rmsnorm_c(a, lc.post_norm, a, d)
        for c in range(d):
            x[c] = x[c] + gate * a[c]
        zc_rmsnorm_c(x, lc.pre_hada, self.buf.a + t * d, d)

    cdef void _lane_update(self, LayerC* lc, Py_ssize_t t) noexcept nogil:
        """y = x + MLP − u (= Block(u) − u), lanes' = P·lanes + hpost·y, cell = lane mean."""
        self._lane_update_cols(lc, t, 0, self.d)

    cdef void _lane_update_cols(self, LayerC* lc, Py_ssize_t t, Py_ssize_t c0, Py_ssize_t c1) noexcept nogil:
        """_lane_update for columns [c0, c1) of token t: every operation is per column,
        so threads that split the columns compute the one-thread bits."""
        cdef Py_ssize_t d = self.d, n = self.n, nd = self.n * self.d, c, i, j
        cdef float* x = self.buf.x + t * d
        cdef float* a = self.buf.ao + t * d
        cdef float* u = self.buf.u + t * d
        cdef float* X = self.buf.lanes + t * nd
        cdef float* Xn = self.buf.nx + t * nd
        cdef float* ph = self.buf.phi + t * (2 * n + n * n)
        cdef float* P = ph + 2 * n
        cdef float* cell = self.buf.cell + t * d
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
        cdef Py_ssize_t task, hd, j, kmax = self.plan.pool_kmax
        if nthr <= 1 or n_heads * kmax < 2:
            for hd in range(n_heads):
                self._pool_row(hd, r, rows, ids, T, pmax[hd], pden[hd], psum[hd])
            return
        for task in prange(n_heads * kmax, num_threads=nthr, schedule="dynamic"):
            hd = task // kmax
            j = task % kmax
            if j < self.heads_c[hd].k:
                self._pool_probe(hd, r, j, rows, ids, T, pmax[hd], pden[hd], psum[hd])
