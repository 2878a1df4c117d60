# cython: language_level=3
"""C surface of the forward-pass operators (spec §3.8–§5), shared with _model.pyx.

Every function works on raw float32 pointers, takes no Python objects and
never allocates: callers (the Python wrappers in _ops.pyx, the engine in
_model.pyx) validate shapes first and own every buffer.
"""
from libc.stdint cimport uint32_t, int64_t, int8_t, uint8_t

# activation / KV quantizers
cdef float a8_inplace(float* x, Py_ssize_t n, float qmax) noexcept nogil
cdef float a8_codes_c(const float* x, Py_ssize_t n, float qmax, int8_t* codes) noexcept nogil
cdef float fp16_round(float x) noexcept nogil
cdef void fwht_inplace(float* x, Py_ssize_t n) noexcept nogil
cdef void kv_cq_inplace(float* x, Py_ssize_t dh, const float* levels, int n_levels) noexcept nogil

# norms
cdef void zc_rmsnorm_c(const float* x, const float* scale, float* out, Py_ssize_t n) noexcept nogil
cdef void rms_unit_c(const float* x, float* out, Py_ssize_t n) noexcept nogil

# attention pieces
cdef void rope_c(float* x, Py_ssize_t dh, const float* cos_row, const float* sin_row) noexcept nogil
cdef void conv_step_c(const float* taps, Py_ssize_t n_taps, Py_ssize_t tap_stride, Py_ssize_t channels,
                      const float* const* history, float* out) noexcept nogil
cdef void attend_group_c(const float* q, Py_ssize_t q_stride, Py_ssize_t G,
                         const float* k_cache_t, Py_ssize_t k_stride, const float* v_cache,
                         Py_ssize_t dq, Py_ssize_t dv, float scale,
                         const Py_ssize_t* ranges, int n_ranges,
                         float* scores, Py_ssize_t score_stride,
                         float* out, Py_ssize_t out_stride) noexcept nogil
cdef void attend_group_i8_c(const int8_t* q, Py_ssize_t q_stride, const float* q_scales, Py_ssize_t G,
                            const uint8_t* k_codes, Py_ssize_t k_stride, const float* k_scales,
                            const int8_t* v_codes, const float* v_scales,
                            Py_ssize_t dq, Py_ssize_t dv, float scale,
                            const Py_ssize_t* ranges, int n_ranges,
                            float* scores, Py_ssize_t score_stride,
                            float* out, Py_ssize_t out_stride) noexcept nogil
cdef float sigmoid_c(float x) noexcept nogil
cdef void mul_sigmoid_c(float* o, const float* g, Py_ssize_t n) noexcept nogil
cdef float dot_c(const float* a, const float* b, Py_ssize_t n) noexcept nogil

# engram
cdef float engram_alpha_c(const float* u, const float* key, Py_ssize_t d) noexcept nogil
cdef uint32_t engram_hash_c(const int64_t* tokens, Py_ssize_t t, int order,
                            uint32_t seed) noexcept nogil

# mHC
cdef void sinkhorn_c(float* M, int n, int iters) noexcept nogil

from needle_cy._parallel cimport nc_barrier, nc_pf_stream

# Monarch MLP
cdef void kron_apply_c(const float* z, const float* A, const float* B,
                       Py_ssize_t ba, Py_ssize_t bb, float* tmp, float* out) noexcept nogil
cdef void kron_apply_rows_c(const float* z, const float* A, const float* B, Py_ssize_t ba,
                            Py_ssize_t bb, float* tmp, float* out, Py_ssize_t k0,
                            Py_ssize_t k1) noexcept nogil
cdef void team_cols(Py_ssize_t d, int tid, int nt, Py_ssize_t* c0, Py_ssize_t* c1) noexcept nogil
cdef void monarch_mlp_c(const float* m, Py_ssize_t d, Py_ssize_t N, Py_ssize_t R,
                        const float* d1, const float* d2, const float* b2,
                        const float* d3, const float* d4,
                        const float* w1a, const float* w1b, const float* w2a,
                        const float* w2b, const float* w3a, const float* w3b,
                        Py_ssize_t ba, Py_ssize_t bb,
                        const float* cond_v, const float* cond_u,
                        const int64_t* p1, const int64_t* p2,
                        float* work, float* logit, float* out, int tid, int nt,
                        nc_barrier* bar, nc_pf_stream* pf) noexcept nogil

# probe pooling (online softmax over tokens)
cdef void pool_update_c(const float* cell, Py_ssize_t d, float score,
                        float* run_max, float* run_den, float* run_sum) noexcept nogil
