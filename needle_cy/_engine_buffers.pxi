# The buffers of CythonEngine (included by _model.pyx, after the KVCache and HeadC
# structs): the engine's scratch and the states.
#
# make_scratch sizes the scratch for a full chunk and the engine's most threads, allocates
# it once per engine and carves it into the EngineScratch pointers; new_state allocates
# what the next token depends on (KV cache, conv and value histories, token history,
# probe pools), snapshot_state and restore_state copy it.  The forward pass only reads and
# writes through these pointers: nothing is allocated per token.


ctypedef struct EngineScratch:
    # [CH, ...]: one row per token of a chunk (CH = CHUNK_MAX); [threads, ...]: one per thread
    float* lanes             # [CH, n·d]
    float* nx                # [CH, n·d]  router input, then the new lanes
    float* phi               # [CH, 2n + n²]
    float* u                 # [CH, d]
    float* x                 # [CH, d]
    float* a                 # [CH, d]
    float* q                 # [CH, H·dq] raw, then conv'd/normed
    float* k                 # [CH, K·dq]
    float* v                 # [CH, K·dv]
    float* qc                # [CH, H·dq]
    float* kc                # [CH, K·dq]
    float* vc                # [CH, K·dv]
    float* g                 # [CH, H·dv]
    float* o                 # [CH, H·dv]
    float* gate_own          # [threads, gate_own_len]: each thread's gated copy of a step's o
    float* ao                # [CH, d]
    float* cell              # [CH, d]
    float* x0                # [CH, d]
    float* e                 # [CH, NT·sub]
    float* ekey              # [n_sites, CH, d]
    float* evraw             # [CH, d]
    float* eval              # [n_sites, CH, d]
    float* hid               # [CH, d]  final normed hidden
    float* mlp_work          # [threads, mlp_work_len]
    float* scores            # [threads, G·cap]
    float* qscale            # [CH, H]  int8 cache: A8 scale of each query head
    int8_t* qcode            # [CH, H·4·nq4]  its codes, zero-padded to whole quads
    int8_t* kcode            # [CH, K·dq]  the keys' codes before they go into the cache
    float* row               # [threads, row_len]  row dequantization scratch
    float* cq_work           # CQ kernel workspace (the widest matrix at a full chunk)
    float* step_work         # [threads, step_work_len]: each thread's own one-token CQ workspace (_step_blocks)
    int64_t* ctx             # [n_tok_hist + CH] token context
    Py_ssize_t mlp_work_len  # 4N + R + 16
    Py_ssize_t row_len       # the widest CQ group, at least 1024
    Py_ssize_t gate_own_len  # H·dv rounded up to whole cache lines
    Py_ssize_t step_work_len # whole cache lines, so that no two threads write one
    nc_barrier team_bar      # the barrier of a region's team (parallel_barrier.h)


cdef Py_ssize_t _need(const CQView* v, Py_ssize_t work, int threads, Py_ssize_t* row_len) noexcept:
    """Grow the CQ workspace / row scratch sizes to fit matrix v at a full chunk."""
    cdef Py_ssize_t need = cq_work_floats(v, CHUNK_MAX, threads)
    if v.group_size > row_len[0]:
        row_len[0] = v.group_size
    return need if need > work else work


cdef Py_ssize_t _need_step(const CQView* v, Py_ssize_t work) noexcept:
    """Grow a thread's one-token step workspace to fit matrix v."""
    cdef Py_ssize_t need = cq_work_floats(v, 1, 1)
    return need if need > work else work


cdef list make_scratch(EngineScratch* s, int threads, Py_ssize_t d, Py_ssize_t n, Py_ssize_t H,
                       Py_ssize_t K, Py_ssize_t dq, Py_ssize_t dv, Py_ssize_t nq4, Py_ssize_t N,
                       Py_ssize_t R_cond, Py_ssize_t e_width, Py_ssize_t n_sites, Py_ssize_t cap,
                       Py_ssize_t n_tok_hist, const LayerC* layers, Py_ssize_t L,
                       const SiteC* sites, const CQView* emb, const CQView* emb_out):
    """Allocate the scratch of an engine of this geometry (e_width: an engram input's
    floats, NT·sub) for chunks of CHUNK_MAX tokens and `threads` threads, and carve it
    into s.  Returns the arrays that hold it: the caller keeps them alive."""
    cdef Py_ssize_t CH = CHUNK_MAX, nd = n * d, T = threads, work = 0, step = 0, i
    cdef const LayerC* lc
    cdef const CQView* vs[8]
    cdef int j
    memset(s, 0, sizeof(EngineScratch))
    s.gate_own_len = (H * dv + 15) // 16 * 16   # whole cache lines a thread
    s.mlp_work_len = 4 * N + R_cond + 16
    s.row_len = 1024
    # CQ workspace: enough for the widest matrix at a full chunk
    # (and each thread's one-token workspace for the matrices of a decode step)
    work = _need(emb_out, work, threads, &s.row_len)
    step = _need_step(emb_out, step)
    for i in range(L):
        lc = &layers[i]
        vs[0], vs[1], vs[2], vs[3] = &lc.q_proj, &lc.k_proj, &lc.v_proj, &lc.gate_proj
        vs[4], vs[5], vs[6], vs[7] = &lc.out_proj, &lc.phi_pre, &lc.phi_post, &lc.phi_res
        for j in range(8):
            work = _need(vs[j], work, threads, &s.row_len)
            step = _need_step(vs[j], step)
    for i in range(n_sites):
        work = _need(&sites[i].key_proj, work, threads, &s.row_len)
        work = _need(&sites[i].value_proj, work, threads, &s.row_len)
        work = _need(&sites[i].tables, work, threads, &s.row_len)
        step = _need_step(&sites[i].key_proj, step)
        step = _need_step(&sites[i].value_proj, step)
    work = _need(emb, work, threads, &s.row_len)
    # whole cache lines apart, so that no two threads write one
    s.step_work_len = (step + 15) // 16 * 16
    sizes = [("lanes", CH * nd), ("nx", CH * nd), ("phi", CH * (2 * n + n * n)),
             ("u", CH * d), ("x", CH * d), ("a", CH * d),
             ("q", CH * H * dq), ("k", CH * K * dq), ("v", CH * K * dv),
             ("qc", CH * H * dq), ("kc", CH * K * dq), ("vc", CH * K * dv),
             ("g", CH * H * dv), ("o", CH * H * dv),
             ("gate_own", T * s.gate_own_len), ("ao", CH * d),
             ("cell", CH * d), ("x0", CH * d), ("e", CH * max(1, e_width)),
             ("ekey", max(1, n_sites) * CH * d), ("evraw", CH * d),
             ("eval", max(1, n_sites) * CH * d), ("hid", CH * d),
             ("mlp", T * s.mlp_work_len), ("scores", T * (H // K) * cap), ("qscale", CH * H),
             ("row", T * s.row_len + 1024), ("cq", work + 64), ("step", T * s.step_work_len + 16)]
    total = sum(size for _, size in sizes) + 16 * len(sizes)
    scratch = np.zeros(total, np.float32)
    cdef float* base = <float*>cnp.PyArray_DATA(scratch)
    cdef Py_ssize_t off = 0
    at = {}
    for name, size in sizes:
        at[name] = off
        off += size + 16                # keep each buffer 64-byte aligned-ish apart
    s.lanes = base + <Py_ssize_t>at["lanes"]
    s.nx = base + <Py_ssize_t>at["nx"]
    s.phi = base + <Py_ssize_t>at["phi"]
    s.u = base + <Py_ssize_t>at["u"]
    s.x = base + <Py_ssize_t>at["x"]
    s.a = base + <Py_ssize_t>at["a"]
    s.q = base + <Py_ssize_t>at["q"]
    s.k = base + <Py_ssize_t>at["k"]
    s.v = base + <Py_ssize_t>at["v"]
    s.qc = base + <Py_ssize_t>at["qc"]
    s.kc = base + <Py_ssize_t>at["kc"]
    s.vc = base + <Py_ssize_t>at["vc"]
    s.g = base + <Py_ssize_t>at["g"]
    s.o = base + <Py_ssize_t>at["o"]
    s.gate_own = base + <Py_ssize_t>at["gate_own"]
    s.ao = base + <Py_ssize_t>at["ao"]
    s.cell = base + <Py_ssize_t>at["cell"]
    s.x0 = base + <Py_ssize_t>at["x0"]
    s.e = base + <Py_ssize_t>at["e"]
    s.ekey = base + <Py_ssize_t>at["ekey"]
    s.evraw = base + <Py_ssize_t>at["evraw"]
    s.eval = base + <Py_ssize_t>at["eval"]
    s.hid = base + <Py_ssize_t>at["hid"]
    s.mlp_work = base + <Py_ssize_t>at["mlp"]
    s.scores = base + <Py_ssize_t>at["scores"]
    s.qscale = base + <Py_ssize_t>at["qscale"]
    s.row = base + <Py_ssize_t>at["row"]
    s.cq_work = base + <Py_ssize_t>at["cq"]
    s.step_work = base + (<Py_ssize_t>at["step"] + 15) // 16 * 16   # (the array is 64-byte aligned)
    # int8 codes of the chunk's queries (zero padding stays zero: only dq codes are written)
    cdef Py_ssize_t n_qcode = CH * H * 4 * nq4
    codes = np.zeros(n_qcode + CH * K * dq + 128, np.int8)
    s.qcode = <int8_t*>cnp.PyArray_DATA(codes)
    s.kcode = s.qcode + n_qcode + 64
    ctx = np.zeros(n_tok_hist + CH, np.int64)
    s.ctx = <int64_t*>cnp.PyArray_DATA(ctx)
    return [scratch, codes, ctx]


# ------------------------------------------------------------------ states

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


cdef EngineState new_state(object owner, bint kv_int8, Py_ssize_t L, Py_ssize_t K, Py_ssize_t H,
                           Py_ssize_t dq, Py_ssize_t dv, Py_ssize_t nq4, Py_ssize_t cap, Py_ssize_t C,
                           Py_ssize_t n_sites, Py_ssize_t n_vhist, Py_ssize_t d, Py_ssize_t n_tok_hist,
                           const HeadC* heads, Py_ssize_t n_heads, Py_ssize_t R_cells):
    """A fresh state at position 0 (the KV cache in the engine's storage, module
    docstring); owner: the id of its engine."""
    cdef EngineState st = EngineState()
    cdef Py_ssize_t i
    hist = max(C - 1, 0)
    st.position = 0
    st.owner = owner
    if kv_int8:
        st.k_cache = lazy_empty((L, K, nq4, cap, 4), np.uint8)
        st.v_cache = lazy_empty((L, K, cap, dv), np.int8)
        st.k_scale = lazy_empty((L, K, cap))
        st.v_scale = lazy_empty((L, K, cap))
    else:
        st.k_cache = lazy_empty((L, K, dq, cap))   # keys transposed
        st.v_cache = lazy_empty((L, K, cap, dv))
        st.k_scale = st.v_scale = None
    st.conv_q = np.zeros((L, hist, H * dq), np.float32)
    st.conv_k = np.zeros((L, hist, K * dq), np.float32)
    st.conv_v = np.zeros((L, hist, K * dv), np.float32)
    st.value_hist = np.zeros((max(1, n_sites), max(1, n_vhist), d), np.float32)
    st.tokens = np.zeros(max(1, n_tok_hist), np.int64)
    st.pools = []
    for i in range(n_heads):
        k = heads[i].k
        st.pools.append((np.full((R_cells, k), -np.inf, np.float32),
                         np.zeros((R_cells, k), np.float32),
                         np.zeros((R_cells, k, d), np.float32)))
    return st


cdef EngineState snapshot_state(EngineState st, Py_ssize_t cap):
    """A copy of st (only the KV slots in use are copied)."""
    cdef EngineState c = EngineState()
    used = min(st.position, cap)
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


cdef void restore_state(EngineState st, EngineState s):
    """Fresh state st ← snapshot s (its KV slots in use, the rest as they are)."""
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


cdef void state_views(EngineState st, bint kv_int8, KVCache* kv, Py_ssize_t n_heads, float** pmax,
                      float** pden, float** psum):
    """The C pointers of st's KV cache (the arrays of its storage; the others NULL) and
    of its first n_heads probe pools."""
    cdef Py_ssize_t hd
    memset(kv, 0, sizeof(KVCache))
    if kv_int8:
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
