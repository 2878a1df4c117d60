# The step schedule of CythonEngine (included by _model.pyx, after the LayerC, SiteC and
# HeadC structs): how the work of a prefill chunk and of a decode step is split between the
# threads of a team.
#
# plan_steps reads the knobs (NEEDLE_CY_MLP_TEAM, NEEDLE_CY_SITES_LATE, NEEDLE_CY_PF_AHEAD)
# once and plans every team size the engine can run, 1..threads, into a StepPlan: each
# thread's rows of every product, whether a chunk's product list is cut by rows or by
# tokens, who runs the Monarch MLP, which thread runs the probe pools and the engram sites
# beside thread 0, and the order of the engram site units.  A region may come out smaller
# than asked for (OpenMP's thread limits), so every size is planned, not only the one in
# use.  plan_streams fills the prefetch streams of one team size, when the engine is made and
# when run_threads changes.  The forward pass (_run_chunk, _chunk_blocks, _step_blocks)
# only reads the plan.
#
# Nothing here computes a model value: another plan changes which thread computes what and
# when, never a bit of the result (every value is computed as on one thread).

DEF STEP_BLOCK_ROWS = 32     # split granularity of a team's product lists (_list_share)

# The products a plan shares out, numbered: per layer its three Φ, q, k, v, gate and the
# out-projection; then per engram site its key and value products; then the head.  A list
# of products that share a rotated input is consecutive, and is named by its first product.
cdef enum:
    PR_PHI = 0               # phi_pre, phi_post, phi_res
    PR_QKVG = 3              # q, k, v, gate
    PR_OUT = 7
    PR_LAYER = 8             # products per layer
    PR_SITE = 2              # per site: key, value


ctypedef struct RowShare:
    int r0                   # rows [r0, r1) of one matrix; r0 == r1: none (rows fit an int)
    int r1


ctypedef struct ThreadPlan:
    RowShare* rows           # [n_products]: this thread's rows of every product (_list_share)
    int deal_first           # the items dealt round the team (a step's KV heads, the probe
    int deal_step            # pools, a chunk's attention tokens): deal_first, + deal_step, ...
    bint mlp_reads           # whether it reads the Monarch MLP's weights (its prefetch)
    int mlp_part             # its part of them: part mlp_part of mlp_parts (team_cols)
    int mlp_parts
    Py_ssize_t lane_c0       # its columns [lane_c0, lane_c1) of the lane update after a split MLP
    Py_ssize_t lane_c1


ctypedef struct TeamPlan:
    int nt                   # threads in the team
    int aside                # the thread beside thread 0's serial work: the probe pools of a
                             # step, the engram value convs and site units (the last thread)
    bint mlp_split           # a step's Monarch MLP split by rows (nt >= mlp_team), else thread 0's
    bint sites_late          # a step's engram sites in the aside thread's waits (plan_sites)
    char* by_rows            # [n_products]: a chunk's list (by its first product) cut by rows, else by tokens
    ThreadPlan* thread       # [nt]


ctypedef struct StepPlan:
    int threads              # team sizes planned: 1..threads
    Py_ssize_t n_products    # PR_LAYER·L + PR_SITE·S + 1
    TeamPlan* teams          # [threads + 1]: teams[nt] (teams[1]: every row on one thread)
    # the knobs, read once
    int mlp_team             # smallest team that splits a step's Monarch MLP (mlp_team_min)
    long long pf_ahead       # how far a waiting thread prefetches (prefetch_ahead_bytes; 0: no streams)
    # engram sites beside thread 0's serial work (plan_sites)
    bint sites_late          # the archive and sites_late_mode() allow it
    int* site_order          # [S]: the sites by the first layer that reads them
    int* site_upto           # [2L]: site units done by the end of window w (2l: block l's start, 2l + 1: its MLP)
    # the probe pools, (head, probe) pairs numbered head by head
    Py_ssize_t n_pools
    Py_ssize_t pool_kmax     # most probes of one head (_pool_chunk's task grid)
    # a decode step's prefetch streams (plan_streams), one per thread
    nc_pf_stream* streams    # [threads], each on its own lines
    int streams_nt           # the team size they are planned for (0: none)
    # what is planned: the engine's views (they outlive the plan) and MLP sizes
    const LayerC* layers
    Py_ssize_t L
    const SiteC* sites
    Py_ssize_t S
    const CQView* head
    Py_ssize_t d, N, R_cond, ba, bb


# ------------------------------------------------------------------ knobs

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
    on its last thread beside thread 0's Monarch MLPs (plan_sites):
    ``NEEDLE_CY_SITES_LATE`` "1" where the archive allows it (no site read by block 0),
    "0" never, "auto" (default) where moreover every site product has the lookup layout
    (avx512lut): a 768×768 lookup product fits in the time of thread 0's MLP, where the
    4-bit integer kernel's product, about three times as long, kept thread 0 waiting
    (4-bit decode was slower with it; figures in benchmarks/history/model.md)."""
    v = os.environ.get("NEEDLE_CY_SITES_LATE", "auto").strip().lower()
    if v not in ("auto", "0", "1"):
        raise ValueError(f"NEEDLE_CY_SITES_LATE: expected auto, 0 or 1, got {v!r}")
    return v


# ------------------------------------------------------------------ the rules

cdef inline bint _list_share(const CQView** ws, int count, int i, int tid, int nt,
                             Py_ssize_t* r0, Py_ssize_t* r1) noexcept nogil:
    """Rows [r0, r1) of matrix i of a list of `count` products that thread tid of nt
    computes (False: none): the list's blocks of STEP_BLOCK_ROWS rows, numbered one
    matrix after another, cut into nt contiguous even shares.  A list too short for
    a few blocks per thread (the three mHC Φ: 4 + 4 + 16 rows) is cut in blocks of 4
    rows (the kernels' row tile) instead: in blocks of 32 one thread had 4 rows of it
    and the other 20.  Contiguous shares let each thread stream its rows in order, one
    kernel call per matrix it touches; handing the blocks out one at a time by an atomic
    ticket was slower (benchmarks/history/model.md): interleaved blocks defeat the
    kernel's and the hardware's prefetch of the next rows."""
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


cdef inline bint _by_rows(const CQView** ws, int count, int nt) noexcept nogil:
    """How a chunk's list of products is cut: by rows where the list has 4 blocks of
    STEP_BLOCK_ROWS rows a thread, else by tokens.  Per matrix, k (96 rows) and v (128)
    made 3 and 4 blocks of 32 for 2 threads and Φ one, which one thread ran while the
    other waited."""
    cdef Py_ssize_t total = 0
    cdef int i
    for i in range(count):
        total += (ws[i].rows + STEP_BLOCK_ROWS - 1) // STEP_BLOCK_ROWS
    return total >= 4 * nt


cdef inline void token_range(Py_ssize_t T, int tid, int nt, Py_ssize_t* t0, Py_ssize_t* t1) noexcept nogil:
    """Thread tid's contiguous range of a chunk's T tokens: a token's lanes, cell and conv
    inputs stay with one thread from block to block."""
    t0[0] = T * tid // nt
    t1[0] = T * (tid + 1) // nt


cdef inline Py_ssize_t site_product(const StepPlan* p, Py_ssize_t s) noexcept nogil:
    """The number of site s's key product (its value product is the next)."""
    return PR_LAYER * p.L + PR_SITE * s


cdef inline Py_ssize_t head_product(const StepPlan* p) noexcept nogil:
    return PR_LAYER * p.L + PR_SITE * p.S


cdef inline const RowShare* whole_rows(const StepPlan* p) noexcept nogil:
    """Every row of every product: the plan of a team of one, for a product one thread
    runs alone (the Φ of a step, the site units, an unshared list on thread 0)."""
    return p.teams[1].thread[0].rows


# ------------------------------------------------------------------ planning

cdef void _plan_list(const CQView** ws, int count, int tid, int nt, RowShare* out) noexcept nogil:
    """Thread tid's rows of each matrix of a list (_list_share) into out[0 .. count)."""
    cdef Py_ssize_t r0, r1
    cdef int i
    for i in range(count):
        if _list_share(ws, count, i, tid, nt, &r0, &r1):
            out[i].r0 = <int>r0
            out[i].r1 = <int>r1
        else:
            out[i].r0 = out[i].r1 = 0


cdef void _plan_team(StepPlan* p, TeamPlan* team, int nt) noexcept nogil:
    """Every thread's part of a team of nt threads."""
    cdef const CQView* ws[4]
    cdef const LayerC* lc
    cdef const SiteC* sc
    cdef ThreadPlan* me
    cdef Py_ssize_t l, s, base
    cdef int tid
    team.nt = nt
    team.aside = nt - 1
    team.mlp_split = nt >= p.mlp_team
    team.sites_late = p.sites_late and 2 <= nt < p.mlp_team
    for l in range(p.L):
        lc = &p.layers[l]
        base = l * PR_LAYER
        ws[0], ws[1], ws[2] = &lc.phi_pre, &lc.phi_post, &lc.phi_res
        team.by_rows[base + PR_PHI] = _by_rows(ws, 3, nt)
        ws[0], ws[1], ws[2], ws[3] = &lc.q_proj, &lc.k_proj, &lc.v_proj, &lc.gate_proj
        team.by_rows[base + PR_QKVG] = _by_rows(ws, 4, nt)
        ws[0] = &lc.out_proj
        team.by_rows[base + PR_OUT] = _by_rows(ws, 1, nt)
    for tid in range(nt):
        me = &team.thread[tid]
        for l in range(p.L):
            lc = &p.layers[l]
            base = l * PR_LAYER
            ws[0], ws[1], ws[2] = &lc.phi_pre, &lc.phi_post, &lc.phi_res
            _plan_list(ws, 3, tid, nt, me.rows + base + PR_PHI)
            ws[0], ws[1], ws[2], ws[3] = &lc.q_proj, &lc.k_proj, &lc.v_proj, &lc.gate_proj
            _plan_list(ws, 4, tid, nt, me.rows + base + PR_QKVG)
            ws[0] = &lc.out_proj
            _plan_list(ws, 1, tid, nt, me.rows + base + PR_OUT)
        for s in range(p.S):
            # key and value as one list where they share the rotation of their input
            sc = &p.sites[s]
            base = site_product(p, s)
            ws[0], ws[1] = &sc.key_proj, &sc.value_proj
            if cq_same_rotation(&sc.key_proj, &sc.value_proj):
                _plan_list(ws, 2, tid, nt, me.rows + base)
            else:
                _plan_list(ws, 1, tid, nt, me.rows + base)
                _plan_list(ws + 1, 1, tid, nt, me.rows + base + 1)
        ws[0] = p.head
        _plan_list(ws, 1, tid, nt, me.rows + head_product(p))
        me.deal_first = tid
        me.deal_step = nt
        # the MLP: each thread its part where the team splits it, else all on thread 0
        if team.mlp_split:
            me.mlp_reads, me.mlp_part, me.mlp_parts = True, tid, nt
        else:
            me.mlp_reads, me.mlp_part, me.mlp_parts = tid == 0, 0, 1
        team_cols(p.d, tid, nt, &me.lane_c0, &me.lane_c1)


cdef char* _plan_block(list keep, Py_ssize_t nbytes):
    """nbytes of zeroed plan memory, kept alive by `keep`."""
    a = np.zeros(max(1, nbytes), np.uint8)
    keep.append(a)
    return <char*>cnp.PyArray_DATA(a)


cdef list plan_steps(StepPlan* p, const LayerC* layers, Py_ssize_t L, const SiteC* sites, Py_ssize_t S,
                     const CQView* head, const HeadC* heads, Py_ssize_t n_heads, Py_ssize_t d,
                     Py_ssize_t N, Py_ssize_t R_cond, Py_ssize_t ba, Py_ssize_t bb, int threads):
    """Plan every team size 1..threads of the engine whose views these are into p, and the
    engram site units (plan_sites); the streams stay unplanned (plan_streams).  Returns the
    arrays that hold the plan: the caller keeps them alive."""
    cdef Py_ssize_t P = PR_LAYER * L + PR_SITE * S + 1, hd
    cdef Py_ssize_t n_threads = <Py_ssize_t>threads * (threads + 1) // 2     # ThreadPlans of all teams
    cdef Py_ssize_t used = 0
    cdef int nt
    cdef TeamPlan* team
    cdef list keep = []
    memset(p, 0, sizeof(StepPlan))
    p.layers, p.L, p.sites, p.S, p.head = layers, L, sites, S, head
    p.d, p.N, p.R_cond, p.ba, p.bb = d, N, R_cond, ba, bb
    p.threads = threads
    p.n_products = P
    p.mlp_team = mlp_team_min()
    p.pf_ahead = prefetch_ahead_bytes()
    for hd in range(n_heads):
        p.n_pools += heads[hd].k
        if heads[hd].k > p.pool_kmax:
            p.pool_kmax = heads[hd].k
    keep.append(plan_sites(p, sites_late_mode()))
    p.teams = <TeamPlan*>_plan_block(keep, (threads + 1) * sizeof(TeamPlan))
    cdef ThreadPlan* thread_mem = <ThreadPlan*>_plan_block(keep, n_threads * sizeof(ThreadPlan))
    cdef RowShare* rows_mem = <RowShare*>_plan_block(keep, n_threads * P * sizeof(RowShare))
    cdef char* by_rows_mem = _plan_block(keep, (threads + 1) * P)
    for nt in range(1, threads + 1):
        team = &p.teams[nt]
        team.thread = thread_mem + used
        for hd in range(nt):
            team.thread[hd].rows = rows_mem + (used + hd) * P
        team.by_rows = by_rows_mem + nt * P
        used += nt
        _plan_team(p, team, nt)
    # each thread's prefetch stream on its own lines
    cdef Py_ssize_t pf_bytes = sizeof(nc_pf_stream)     # (a multiple of 64)
    cdef char* pf_base = _plan_block(keep, threads * pf_bytes + 128)
    p.streams = <nc_pf_stream*>(pf_base + (64 - (<Py_ssize_t>pf_base) % 64) % 64)
    p.streams_nt = 0
    return keep


cdef object plan_sites(StepPlan* p, str mode):
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
    phases before it), and `mode` (sites_late_mode()) agrees (by default: every site
    product runs by table lookup, fast enough to fit the MLP).  Returns the array that
    holds site_order and site_upto."""
    cdef Py_ssize_t L = p.L, S = p.S, i, win
    first = {}
    for i in range(L):
        if p.layers[i].site >= 0:
            first.setdefault(int(p.layers[i].site), i)
    order = sorted(range(S), key=lambda site: (first.get(site, L), site))   # never read: by the end
    deadline = [2 * first.get(site, L) - 1 for site in order]               # its reader's last MLP
    arr = np.zeros(max(1, S) + max(1, 2 * L), np.int32)
    p.site_order = <int*>cnp.PyArray_DATA(arr)
    p.site_upto = p.site_order + max(1, S)
    for i in range(S):
        p.site_order[i] = order[i]
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
        p.site_upto[win] = unit
    lut = True
    for i in range(S):
        lut = lut and p.sites[i].key_proj.lut_bits != NULL and p.sites[i].value_proj.lut_bits != NULL
    p.sites_late = (S > 0 and L > 0 and min(deadline) >= 1 and mode != "0"
                    and (mode == "1" or lut))
    return arr


# ------------------------------------------------------------------ prefetch streams

cdef void plan_streams(StepPlan* p, int nt) noexcept nogil:
    """The prefetch streams of a decode step of nt threads (none without a prefetch
    distance, or for one thread, which runs no step region)."""
    cdef int tid
    if p.pf_ahead <= 0 or nt < 2 or nt > p.threads or nt == p.streams_nt:
        return
    for tid in range(nt):
        _plan_stream(p, p.streams + tid, tid, nt)
    p.streams_nt = nt


cdef inline nc_pf_stream* step_stream(StepPlan* p, int tid, int nt) noexcept nogil:
    """Thread tid's prefetch stream for a step of nt threads, rewound; NULL where none is
    planned for that team (no prefetch distance, or a team smaller than run_threads):
    the step then asks for its next weights with plain prefetches."""
    cdef nc_pf_stream* s
    if p.pf_ahead <= 0 or p.streams_nt != nt:
        return NULL
    s = p.streams + tid
    nc_pf_rewind(s)
    return s


cdef void _plan_stream(StepPlan* p, nc_pf_stream* s, int tid, int nt) noexcept nogil:
    """Thread tid's prefetch stream for a decode step of nt threads: the weights it
    reads, in the order _step_blocks reads them, one phase per product list and per
    MLP (the phases _step_blocks counts in `ph`; a plan that disagrees only wastes
    bandwidth).  The rows are its shares of each list, the Monarch MLP's floats its
    team_cols share of each array (all of them on thread 0 where it runs the MLP
    alone: mlp_team_min)."""
    cdef const TeamPlan* team = &p.teams[nt]
    cdef const ThreadPlan* me = &team.thread[tid]
    cdef const RowShare* whole = whole_rows(p)
    cdef int ph = 0, unit = 0, mt = me.mlp_part, mn = me.mlp_parts
    cdef Py_ssize_t l, i, base, N = p.N, ba2 = p.ba * p.ba, bb2 = p.bb * p.bb
    cdef const LayerC* lc
    cdef const SiteC* sc
    nc_pf_clear(s, p.pf_ahead)
    for i in range(0 if team.sites_late else p.S):
        sc = &p.sites[i]
        base = site_product(p, i)
        _pf_add_rows(s, &sc.key_proj, me.rows[base], ph)
        if not cq_same_rotation(&sc.key_proj, &sc.value_proj):
            ph += 1
        _pf_add_rows(s, &sc.value_proj, me.rows[base + 1], ph)
        ph += 1
    for l in range(p.L):
        lc = &p.layers[l]
        base = l * PR_LAYER
        if tid == 0:            # (thread 0 runs the Φ products alone)
            _pf_add_rows(s, &lc.phi_pre, whole[base + PR_PHI], ph)
            _pf_add_rows(s, &lc.phi_post, whole[base + PR_PHI + 1], ph)
            _pf_add_rows(s, &lc.phi_res, whole[base + PR_PHI + 2], ph)
        elif team.sites_late and tid == team.aside:
            unit = _pf_add_site_units(p, s, unit, p.site_upto[2 * l], ph)
        ph += 1
        if lc.qkvg_shared:
            _pf_add_qkvg(s, lc, me.rows + base + PR_QKVG, ph)
        elif tid == 0:          # (unshared: thread 0 runs the four alone)
            _pf_add_qkvg(s, lc, whole + base + PR_QKVG, ph)
        ph += 1
        _pf_add_rows(s, &lc.out_proj, me.rows[base + PR_OUT], ph)
        ph += 1
        # the MLP's floats: this thread's share of each array
        if me.mlp_reads:
            _pf_add_share(s, lc.cond_v, p.d * p.R_cond, mt, mn, ph)
            _pf_add_share(s, lc.cond_u, p.R_cond * N, mt, mn, ph)
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
        elif team.sites_late and tid == team.aside:
            unit = _pf_add_site_units(p, s, unit, p.site_upto[2 * l + 1], ph)
        ph += 1
    _pf_add_rows(s, p.head, me.rows[head_product(p)], ph)


cdef inline void _pf_add_qkvg(nc_pf_stream* s, const LayerC* lc, const RowShare* rows, int phase) noexcept nogil:
    _pf_add_rows(s, &lc.q_proj, rows[0], phase)
    _pf_add_rows(s, &lc.k_proj, rows[1], phase)
    _pf_add_rows(s, &lc.v_proj, rows[2], phase)
    _pf_add_rows(s, &lc.gate_proj, rows[3], phase)


cdef int _pf_add_site_units(const StepPlan* p, nc_pf_stream* s, int unit, int upto, int phase) noexcept nogil:
    """The products among engram site units [unit, upto) (_site_unit) onto the aside
    thread's prefetch stream; returns upto."""
    cdef const SiteC* sc
    cdef Py_ssize_t base
    cdef const RowShare* whole = whole_rows(p)
    while unit < upto:
        if unit % 4 in (1, 2):
            sc = &p.sites[p.site_order[unit // 4]]
            base = site_product(p, p.site_order[unit // 4])
            if unit % 4 == 1:
                _pf_add_rows(s, &sc.key_proj, whole[base], phase)
            else:
                _pf_add_rows(s, &sc.value_proj, whole[base + 1], phase)
        unit += 1
    return upto


cdef inline void _pf_add_rows(nc_pf_stream* s, const CQView* w, RowShare r, int phase) noexcept nogil:
    """Rows [r.r0, r.r1) of w (their packed bytes and norms) onto a prefetch stream."""
    cdef Py_ssize_t n0, n1
    cdef const char* at0 = NULL
    cdef const char* at1 = NULL
    if r.r1 > r.r0:
        cq_row_bytes(w, r.r0, r.r1, &at0, &n0, &at1, &n1)
        nc_pf_add(s, at0, n0, phase)
        nc_pf_add(s, at1, n1, phase)


cdef inline void _pf_add_share(nc_pf_stream* s, const float* p, Py_ssize_t n, int tid, int nt,
                               int phase) noexcept nogil:
    """Thread tid's share (team_cols) of the n floats at p onto its prefetch stream."""
    cdef Py_ssize_t a, b
    team_cols(n, tid, nt, &a, &b)
    if b > a:
        nc_pf_add(s, p + a, (b - a) * sizeof(float), phase)


# ------------------------------------------------------------------ plain prefetches

cdef inline void _prefetch_share(const float* p, Py_ssize_t n, int tid, int nt) noexcept nogil:
    """Thread tid's share of _prefetch_floats(p, n) among nt (team_cols: whole lines)."""
    cdef Py_ssize_t a, b
    team_cols(n, tid, nt, &a, &b)
    if b > a:
        _prefetch_floats(p + a, b - a)


cdef void prefetch_rows(const CQView** ws, int count, const RowShare* rows) noexcept nogil:
    """Ask for a thread's rows of a list of products (the step's way without a stream)."""
    cdef int i
    for i in range(count):
        if rows[i].r1 > rows[i].r0:
            cq_prefetch_rows(ws[i], rows[i].r0, rows[i].r1)


cdef void prefetch_mlp(const StepPlan* p, const LayerC* lc, const ThreadPlan* me) noexcept nogil:
    """Ask for block lc's Monarch MLP weights (float32, 116 KB a layer at full size)
    before the attention: the MLP runs a few stages later and read them from DRAM,
    on a critical path cut by six meetings.  Each thread that reads them asks for its
    own part of every array (ThreadPlan.mlp_part): each thread reads nearly all of
    them, but a line one thread brought is then an L3 hit for the other, and the
    prefetch instructions stall once the line fill buffers are full (every thread
    asking for all 116 KB stalled a 2-thread decode step visibly; with the shares
    the step was faster, the rest of that wait moving to the MLP's own reads and
    the meetings; benchmarks/history/model.md)."""
    cdef Py_ssize_t N = p.N, ba2 = p.ba * p.ba, bb2 = p.bb * p.bb
    cdef int tid = me.mlp_part, nt = me.mlp_parts
    _prefetch_share(lc.cond_v, p.d * p.R_cond, tid, nt)
    _prefetch_share(lc.cond_u, p.R_cond * N, tid, nt)
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


# ------------------------------------------------------------------ a call

ctypedef struct ChunkRun:
    int ntok                 # threads of the chunk's per-token work (one token each at least)
    int cq_threads           # threads of its products (the call's run_threads)
    bint stepped             # a decode step on several threads: the engram sites, the blocks and
                             # the head in one parallel region (_step_blocks)
    bint teamed              # a chunk of several tokens on several threads: the blocks in one
                             # region (_chunk_blocks)


cdef inline ChunkRun chunk_run(int run_threads, Py_ssize_t T, bint cells, Py_ssize_t L) noexcept nogil:
    """How _run_chunk runs T tokens on run_threads threads (cells: it writes the cells of
    every block, which only its own loop does)."""
    cdef ChunkRun r
    r.ntok = <int>(T if T < run_threads else run_threads)
    r.cq_threads = run_threads
    r.stepped = T == 1 and run_threads > 1 and not cells and L > 0
    r.teamed = T > 1 and r.ntok > 1 and not cells and L > 0
    return r
