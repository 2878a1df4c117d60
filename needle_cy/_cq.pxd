# cython: language_level=3
"""C surface of the CQ kernels (spec §3.4–§3.6), cimportable by other Cython modules.

A CQ matrix is used through a prepared ``CQWeight`` (made once per matrix by the
Python-level ``needle_cy._cq.prepare(cq_matrix)``, which validates everything and
caches the result).  Its ``view`` is a plain C struct of pointers and sizes that
the nogil functions below read; they never touch Python objects, never check
their arguments (the Python wrappers and ``prepare`` did) and never allocate:
the caller owns every buffer, including the float32 workspace whose size
``cq_work_floats`` tells.  A view whose ``a8_input`` is set (the engine sets it
in deploy numerics, where every CQ input is an A8 vector) lets ``cq_rotate``
take the integer form (matvec and matmul; see _cq.pyx); leave it 0 otherwise.

Typical use from the forward pass (``_model.pyx``)::

    from needle_cy._cq cimport CQWeight, CQView, cq_work_floats, cq_matvec, cq_matmul
    from needle_cy._cq import prepare

    cdef CQWeight wq = prepare(archive.tensor("layers.0.q_proj"))   # once, at load
    cdef const CQView* q = &wq.view
    # work: at least cq_work_floats(q, T, threads) float32s = 48 + 2·T·padded_len (reusable
    # across calls and matrices; it does not depend on threads)
    cq_matvec(q, x, y, work, threads)                   # y[rows] = W · x[cols]
    cq_matmul(q, X, T, x_stride, Y, y_stride, work, threads)   # Y[T, rows] = X[T, cols] · Wᵀ
    cq_dequantize_row(emb, token_id, out, scratch)     # out[cols], scratch[group_size]

    # one input, several matrices (q/k/v/gate; the three mHC Φ): rotate once
    # (valid for every matrix b with cq_same_rotation(q, b); size work for the largest T)
    cq_rotate(q, X, T, x_stride, work, threads)
    cq_matmul_rotated(q, work, T, Yq, rows_q, threads)
    cq_matmul_rotated(k, work, T, Yk, rows_k, threads)     # T = 1: cq_matvec_rotated(k, work, yk, threads)

In a parallel region of its own (the engine's decode step): every thread calls
``cq_rotate(w, x, 1, cols, work, 1)`` into a workspace of its own (the same bits on each),
then runs ``cq_matvec_rotated_rows`` on its rows.  ``cq_matmul_rotated_rows_list`` is the matmul of
a thread's share of a list of products (q/k/v/gate) that share one rotation.

Threads: ``threads`` is an upper bound (resolve it once with
``needle_cy.threads.get_num_threads``); small products use fewer threads
because an OpenMP fork costs more than it saves below ~64 K multiply–adds per
thread.  Results do not depend on the thread count (each output is summed by
one thread in a fixed order).  Nothing here allocates or raises; inputs may not
alias work.  The functions may be called from several threads at once as long
as each uses its own work buffer.
"""
from libc.stdint cimport uint8_t, uint32_t, int8_t, int16_t


ctypedef struct CQView:
    const uint8_t* packed      # [rows, row_bytes] LSB-first fields (spec §3.4); rows contiguous
    const uint8_t* packed_end  # packed + rows·row_bytes: SIMD loads never read at or past it
    const float* norms         # float32 [rows, norm_stride]; zero past n_groups, 8 spare floats at the end
    Py_ssize_t rows
    Py_ssize_t cols
    Py_ssize_t cols_padded     # n_groups · group_size
    Py_ssize_t n_groups
    Py_ssize_t row_bytes
    Py_ssize_t norm_stride
    Py_ssize_t chunk_fields    # fields per SIMD chunk (8 lanes × fields per 32-bit lane)
    Py_ssize_t chunk_bytes     # packed bytes per SIMD chunk (32, or 24 at 3 bits)
    Py_ssize_t n_chunks        # chunks per row: ceil(cols_padded / chunk_fields)
    Py_ssize_t padded_len      # n_chunks · chunk_fields: length of one rotated activation
    int bits                   # 1, 2, 3, 4 or 5 (ternary)
    int field_bits             # bits per stored field (2 for ternary)
    int group_size
    int simd                   # 1 when the AVX2 kernels can run this matrix on this CPU
    float codebook[16]         # codeword of each raw field value (unused entries 0)
    int lane_perm[256]         # AVX2 lane order: rotated-activation position s·8 + l ← field offset in the chunk
    float simd_table[32]       # AVX2 register tables; [16:32] = 4-bit codebook byte planes (see _cq.pyx)
    # integer kernel (A8 inputs, see _cq.pyx): set by prepare, except a8_input
    int a8_input               # 1: every input is an A8 vector (deploy numerics; the engine sets it)
    int int_ok                 # 1: integer tables exist (16/int_fb <= group_size <= 256)
    int int_fb                 # field width the integer kernel reads (3-bit rows are repacked to 4)
    const uint8_t* int_packed  # packed rows in int_fb-bit fields (= packed unless repacked)
    const uint8_t* int_packed_end
    Py_ssize_t int_row_bytes
    float int_base             # B: codeword·2^E = hi·B + lo
    float int_descale          # 2^-E / sqrt(group_size)
    int16_t int_table[64]      # vpermw tables: hi [0:32], lo [32:64]
    int16_t int_perm[256]      # code lane order: chunk position i <- field offset int_perm[i]
    # lookup kernels (avx512lut, csrc/cq_lut.h; avx2lut, csrc/cq_lut_avx2.h): set by CQWeight.enable_lut
    int lut_ok                 # 1: the lookup layout exists (int_fb 2 or 4, 16 <= group_size <= 256)
    int lut_kernel             # the kernel whose layout it is: 7 (avx512lut) or 8 (avx2lut); 0 without one
    const uint32_t* lut_bits   # 7: [ceil(rows/16)][lut_n_dw][16 rows]: dword d of each row's int_packed bytes;
                               # 8: uint8 [ceil(rows/32)][4·lut_n_dw][32 rows]: byte b of each row
    const float* lut_norms     # 7: [ceil(rows/16)][n_groups][16 rows]; 8: [ceil(rows/32)][n_groups][32 lanes] float32
    Py_ssize_t lut_n_dw        # dwords (32/int_fb fields) per row: cols_padded · int_fb / 32
    float lut_descale          # float32(1/sqrt(group_size))
    # tile kernel (AMX, csrc/cq_amx.h): set by prepare
    int amx_ok                 # 1: tables exist (group_size 64, 128 or 256; reference.cq.amx_applies)
    int8_t amx_pieces[48]      # codewords C = c2·2^16 + c1·2^8 + c0: c2 [0:16], c1 [16:32], c0 [32:48]
    float amx_descale          # float32(2^-E / sqrt(group_size))


cdef class CQWeight:
    cdef CQView view
    cdef object _packed        # keeps the packed bytes (often a view of the archive mmap) alive
    cdef object _norms32       # owns view.norms
    cdef object _codebook
    cdef object _int_packed    # the 4-bit repack of a 3-bit matrix (None otherwise)
    cdef object _lut_bits      # owns view.lut_bits (None until enable_lut)
    cdef object _lut_norms     # owns view.lut_norms
    cdef object _lut_old       # layouts of another lookup kernel, replaced (views copied before still read them)


cdef Py_ssize_t cq_work_floats(const CQView* w, Py_ssize_t n_tokens, int threads) noexcept nogil
cdef int cq_effective_threads(const CQView* w, Py_ssize_t n_tokens, int threads) noexcept nogil
cdef void cq_matvec(const CQView* w, const float* x, float* y, float* work,
                    int threads) noexcept nogil
cdef void cq_matmul(const CQView* w, const float* X, Py_ssize_t n_tokens, Py_ssize_t x_stride,
                    float* Y, Py_ssize_t y_stride, float* work, int threads) noexcept nogil
# rotate once, multiply by several matrices that share the input (q/k/v/gate, the mHC Φs)
cdef bint cq_same_rotation(const CQView* a, const CQView* b) noexcept nogil
cdef void cq_rotate(const CQView* w, const float* X, Py_ssize_t n_tokens, Py_ssize_t x_stride,
                    float* work, int threads) noexcept nogil
# several tokens rotated by a team, each thread its tokens (prefill chunk; see cq_rotate_tokens)
cdef bint cq_rotate_tokens(const CQView* w, const float* X, Py_ssize_t n_tokens, Py_ssize_t x_stride,
                           float* work, int tid, int nt, float* kf, Py_ssize_t kf_floats) noexcept nogil
cdef bint cq_rotate_tokens_ok(const CQView* w, float* work, Py_ssize_t n_tokens) noexcept nogil
cdef void cq_prefetch_rows(const CQView* w, Py_ssize_t r0, Py_ssize_t r1) noexcept nogil
cdef void cq_row_bytes(const CQView* w, Py_ssize_t r0, Py_ssize_t r1, const char** at0, Py_ssize_t* n0,
                       const char** at1, Py_ssize_t* n1) noexcept nogil
cdef void cq_matvec_rotated(const CQView* w, const float* work, float* y,
                            int threads) noexcept nogil
cdef void cq_matvec_rotated_rows(const CQView* w, const float* work, float* y,
                                 Py_ssize_t r0, Py_ssize_t r1) noexcept nogil
cdef void cq_matmul_rotated_rows(const CQView* w, float* work, Py_ssize_t n_tokens,
                                 Py_ssize_t t0, Py_ssize_t t1, float* Y, Py_ssize_t y_stride,
                                 Py_ssize_t r0, Py_ssize_t r1, float* wdec) noexcept nogil
# rows r0[i] <= r < r1[i] of every token for count matrices that share work's rotation
# (the lookup form makes each token tile's tables once for all of them)
cdef void cq_matmul_rotated_rows_list(const CQView** ws, int count, float* work, Py_ssize_t n_tokens,
                                      const Py_ssize_t* r0, const Py_ssize_t* r1, float** ys,
                                      const Py_ssize_t* ystr, float* wdec) noexcept nogil
cdef Py_ssize_t cq_decode_scratch_floats() noexcept nogil
cdef float* cq_decode_scratch() noexcept nogil
cdef void cq_free_decode_scratch(float* scratch) noexcept nogil
cdef void cq_matmul_rotated(const CQView* w, float* work, Py_ssize_t n_tokens,
                            float* Y, Py_ssize_t y_stride, int threads) noexcept nogil
cdef void cq_dequantize_row(const CQView* w, Py_ssize_t row, float* out,
                            float* scratch) noexcept nogil
cdef void cq_fwht_scaled(float* v, Py_ssize_t n, float scale) noexcept nogil
