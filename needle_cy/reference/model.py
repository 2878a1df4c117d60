"""The Needle 3 forward pass in plain NumPy: the reference engine (spec §4, §5, §9).

Engine interface (``needle_cy._model.CythonEngine`` implements the same one)
-----------------------------------------------------------------------------
``Engine(weights, numerics="deploy", window=None, sinks=0)``  (the Cython engine also takes ``threads=``)
    ``weights``: a :class:`needle_cy.weights.ModelWeights` (full archive or rung).
    ``numerics``: ``"deploy"`` = A8 activations/queries and KV quantization at the
    header's ``kv_bits`` (what the archives were trained for); ``"float"`` = no
    activation/KV quantizer (CQ weights only).
    ``window``: KV capacity W in positions (``None`` = unlimited).  ``sinks``: the
    first S positions stay visible forever (0 ≤ S < W).  A query at t sees key j iff
    ``j ≤ t`` and (``t − j < W − S`` or ``j < S``); local layers also need
    ``t − j < sliding_window``.  While ``position ≤ W`` this is the plain causal model.
``.position``                  tokens in the state (the next token's absolute position).
``.forward(ids) -> [T, V]``    logits of a fresh sequence at every position; does NOT
                               touch the incremental state.
``.forward_cells(ids) -> (logits [T, V], cells [T, D+1, d])``  the same plus the hidden cells.
``.prefill(ids) -> [V]``       append ids to the state (one batched chunk), return the
                               last position's logits.
``.step(token) -> [V]``        append one token.
``.reset()``                   empty state.
``.set_sinks(n)``              change the sink count (only while ``position < window``).
``.snapshot()`` / ``.restore(snap)``  copy / reinstate the whole state (prefix caching).
``.head_outputs() -> dict``    probe heads pooled (online) over every token since reset:
                               ``{"embedding": float32[e] (unit), "confidence": float,
                               "router": float32[3]}`` for the heads present.
``.head_outputs_for(ids)``     the same for a fresh sequence (stateless).

The forward pass is written once, for a chunk of new tokens against the
state (``_run_chunk``): ``forward`` runs it on a fresh state, ``prefill`` on the
engine's state, ``step`` with a chunk of one.  Everything is float32; CQ
matrices are dequantized once (cached) except the engram tables and the
embedding, whose rows are decoded on demand.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np

from . import ops
from .cq import dequantize, dequantize_rows

F32 = np.float32
NUMERICS = ("deploy", "float")
PAD_ID = 0          # cells of PAD tokens are left out of the probe pooling (spec §5.1 keep mask)


# ---------------------------------------------------------------------------
# state
# ---------------------------------------------------------------------------
@dataclass
class LayerState:
    """Per-block incremental state."""
    conv_q: np.ndarray          # raw (pre-conv) projections of the last C-1 positions, oldest first
    conv_k: np.ndarray
    conv_v: np.ndarray
    # keys (normed, RoPE'd) and values as the float32 values attended: in deploy the KV
    # quantizer's fake-quant output (the Cython engine keeps kv_bits 8 as A8 codes and
    # scales instead, ops.a8_codes: the same values, code·scale)
    k_cache: np.ndarray         # [n, K, dq]
    v_cache: np.ndarray         # [n, K, dv]
    kv_pos: np.ndarray          # [n] absolute positions of the cached entries


@dataclass
class EngineState:
    """Everything the next token depends on (copied whole by snapshot)."""
    position: int
    tokens: np.ndarray                          # last max(order)-1 tokens (0 before the start)
    value_history: list                         # per site: v' of the last (taps-1)·dil positions
    layers: list                                # LayerState per block
    pools: dict = field(default_factory=dict)   # head name → ops.ProbePoolState
    owner: int = 0                              # id of the engine that made it

    def copy(self):
        return copy.deepcopy(self)

    @property
    def nbytes(self):
        """Bytes its arrays hold."""
        arrays = [self.tokens] + list(self.value_history)
        for layer in self.layers:
            arrays += [layer.conv_q, layer.conv_k, layer.conv_v, layer.k_cache, layer.v_cache, layer.kv_pos]
        for pool in self.pools.values():
            arrays += [pool.max, pool.denom, pool.weighted]
        return sum(a.nbytes for a in arrays if a is not None)


class ReferenceEngine:
    """Readable NumPy Needle 3 engine; see the module docstring for the interface."""

    def __init__(self, weights, numerics="deploy", window=None, sinks=0):
        if numerics not in NUMERICS:
            raise ValueError(f"numerics must be one of {NUMERICS}, got {numerics!r}")
        if window is not None and window < 1:
            raise ValueError(f"window must be >= 1 or None, got {window}")
        if sinks < 0 or (window is not None and sinks >= window):
            raise ValueError(f"sinks must lie in [0, window) = [0, {window}), got {sinks}")
        self.w = weights
        self.numerics = numerics
        self.quant = numerics == "deploy"
        self.window = window
        self.sinks = int(sinks) if window is not None else 0
        # recent = how many latest positions stay visible besides the sinks
        self.recent = None if window is None else window - self.sinks
        self._dense_cache = {}
        self._head_cache = {}
        self.state = self._fresh_state()

    # ----------------------------------------------------------------- helpers
    def _dense(self, W):
        """Dequantized float32 copy of a CQ matrix (cached by identity)."""
        key = id(W)
        hit = self._dense_cache.get(key)
        if hit is None or hit[0] is not W:
            dense = dequantize(W) if hasattr(W, "packed") else np.asarray(W, F32)
            # kept as float64 (exact copies of the float32 values): ops.linear accumulates in float64
            hit = (W, np.ascontiguousarray(dense, dtype=np.float64))
            self._dense_cache[key] = hit
        return hit[1]

    def _mm(self, x, W):
        """``x @ W.T`` for a CQ (dequantized, cached) or dense matrix."""
        return ops.linear(x, self._dense(W))

    def _a8(self, x):
        return ops.a8(x) if self.quant else ops._f32(x)

    def _band(self, layer):
        """Sliding band of a local layer (None for global layers / no sliding window)."""
        if layer.is_global or self.w.sliding_window <= 0:
            return None
        return self.w.sliding_window

    def _fresh_state(self):
        w = self.w
        C = w.qkv_conv_taps
        H, K, dq, dv, d = w.num_heads, w.num_kv_heads, w.qk_head_dim, w.v_head_dim, w.d_model
        hist = max(C - 1, 0)
        layers = [LayerState(
            conv_q=np.zeros((hist, H * dq), F32), conv_k=np.zeros((hist, K * dq), F32),
            conv_v=np.zeros((hist, K * dv), F32),
            k_cache=np.zeros((0, K, dq), F32), v_cache=np.zeros((0, K, dv), F32),
            kv_pos=np.zeros(0, np.int64)) for _ in w.layers]
        n_tok = max(w.engram_orders, default=1) - 1
        v_hist = (w.engram_conv_taps - 1) * w.engram_conv_dilation
        pools = {}
        for name, head in w.heads.items():
            pools[name] = ops.ProbePoolState.empty(w.num_layers + 1, head.probes_per_row, d)
        return EngineState(position=0, tokens=np.zeros(n_tok, np.int64),
                           value_history=[np.zeros((v_hist, d), F32) for _ in w.engram_sites],
                           layers=layers, pools=pools, owner=id(self))

    # ------------------------------------------------------------- interface
    @property
    def position(self):
        return self.state.position

    def reset(self):
        self.state = self._fresh_state()

    def set_sinks(self, sinks):
        """Change the pinned sink count; only valid while nothing was evicted (position < window)."""
        if self.window is None:
            return
        if not 0 <= sinks < self.window:
            raise ValueError(f"sinks must lie in [0, window) = [0, {self.window}), got {sinks}")
        if self.state.position >= self.window:
            from ..errors import ModelStateError
            raise ModelStateError("set_sinks: the window has already wrapped")
        self.sinks = int(sinks)
        self.recent = self.window - self.sinks

    def snapshot(self):
        return self.state.copy()

    def restore(self, snap):
        if not isinstance(snap, EngineState) or snap.owner != id(self):
            from ..errors import ModelStateError
            raise ModelStateError("restore: the snapshot was not taken from this engine")
        self.state = snap.copy()

    def forward(self, ids):
        return self.forward_cells(ids)[0]

    def forward_cells(self, ids):
        state = self._fresh_state()
        logits, cells = self._run_chunk(state, ids, all_logits=True, pool=False)
        return logits, cells

    def prefill(self, ids):
        logits, _ = self._run_chunk(self.state, ids, all_logits=False)
        return logits[-1]

    def step(self, token):
        return self.prefill([token])

    def head_outputs(self):
        return self._heads_from_pools(self.state)

    def head_outputs_for(self, ids):
        state = self._fresh_state()
        self._run_chunk(state, ids, all_logits=False)
        return self._heads_from_pools(state)

    # ---------------------------------------------------------- forward pass
    def _run_chunk(self, st, ids, all_logits, pool=True):
        """Advance ``st`` by the tokens ``ids``; return (logits, cells) of the chunk."""
        w = self.w
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        T = ids.shape[0]
        d, n = w.d_model, w.mhc_lanes
        pos = st.position + np.arange(T, dtype=np.int64)

        # token embedding x0 = E[tok]·sqrt(d)      (spec §4.3)
        x0 = ops.embed_scale(dequantize_rows(w.embedding, ids), d)

        # engram memory (keys, conv'd values) for every site      (spec §4.4)
        engram = self._engram(st, ids, pos)

        # mHC lane state: n copies of x0; cells row 0 = x0       (spec §4.5, §5.1)
        lanes = np.repeat(x0[:, None, :], n, axis=1)
        cells = np.empty((T, w.num_layers + 1, d), F32)
        cells[:, 0] = x0
        for layer, lst in zip(w.layers, st.layers):
            lanes = self._advance(layer, lst, lanes, pos, engram)
            cells[:, layer.index + 1] = ops.lane_mean(lanes)

        # probe heads: fold every new token into the online pools  (spec §5.5)
        for name, head in (w.heads.items() if pool else ()):
            probes = self._head_probes(head)
            for t in range(T):
                ops.probe_pool_update(st.pools[name], cells[t], probes, keep=bool(ids[t] != PAD_ID))

        # output: final norm, A8, tied head                      (spec §4.9)
        h = cells[:, -1] if all_logits else cells[-1:, -1]
        h = ops.zc_rmsnorm(h, w.final_norm)
        logits = ops.tied_logits(self._a8(h), self._output_embedding())

        st.position += T
        return logits, cells

    def _output_embedding(self):
        if "E_out" not in self._head_cache:
            E = self._dense(self.w.embedding)
            self._head_cache["E_out"] = np.ascontiguousarray(E[: self.w.out_vocab])
        return self._head_cache["E_out"]

    def _engram(self, st, ids, pos):
        """Per site (key [T, d], conv'd value [T, d]) for the chunk; updates token / v' history."""
        w = self.w
        if not w.engram_sites:
            return {}
        T = ids.shape[0]
        n_hist = st.tokens.shape[0]
        context = np.concatenate([st.tokens, ids])        # the n-grams may reach back n_hist tokens
        slot = ops.engram_hash(context, w.engram_orders, w.engram_heads, w.engram_seed_stride,
                               w.engram_slots)[n_hist:]
        ok = ops.engram_ngram_ok(pos, w.engram_orders, w.engram_heads, self.recent, self.sinks)
        row_ids = ops.engram_row_ids(slot, w.engram_slots)  # [T, NT]
        dil, n_taps = w.engram_conv_dilation, w.engram_conv_taps
        out = {}
        for s, site in enumerate(w.engram_sites):
            rows = dequantize_rows(site.tables, row_ids.reshape(-1)).reshape(T, w.num_tables, -1)
            e = self._a8(ops.engram_fetch(rows, ok))
            key = self._mm(e, site.key_proj)
            v_raw = self._mm(e, site.value_proj)
            hist = st.value_history[s]
            seq = np.concatenate([hist, v_raw])           # rows: positions pos[0]-len(hist) ..
            tap_ok = ops.conv_tap_ok(pos, n_taps, dil, self.recent, self.sinks)
            value = ops.causal_conv(seq, site.taps, dil,
                                    np.concatenate([np.zeros((len(hist), n_taps), bool), tap_ok]))[len(hist):]
            st.value_history[s] = seq[len(seq) - len(hist):] if len(hist) else hist
            out[site.layer] = (key, value)
        if n_hist:
            st.tokens = context[len(context) - n_hist:]
        return out

    def _advance(self, layer, lst, lanes, pos, engram):
        """``advance_l``: mHC routing around Block_l (spec §4.5)."""
        mhc = layer.mhc
        nx = ops.mhc_router_input(lanes, quant=self.quant)
        hpre = ops.mhc_pre_weights(self._mm(nx, mhc.phi_pre), mhc.a_pre, mhc.b_pre, layer.lane)
        hpost = ops.mhc_post_weights(self._mm(nx, mhc.phi_post), mhc.a_post, mhc.b_post, layer.lane)
        P = ops.mhc_res_weights(self._mm(nx, mhc.phi_res), mhc.a_res, mhc.b_res)
        u = ops.mhc_collapse(lanes, hpre)
        y = self._block(layer, lst, u, pos, engram) - u
        return ops.mhc_expand(lanes, P, hpost, y)

    def _block(self, layer, lst, u, pos, engram):
        """``Block_l(u)`` (spec §4.6)."""
        x = u
        if layer.index in engram:
            key, value = engram[layer.index]
            x = ops.engram_inject(u, key, value)
        a = ops.zc_rmsnorm(x, layer.norm_in)
        a = self._attention(layer, lst, a, pos)
        a = ops.zc_rmsnorm(a, layer.post_norm)
        x = (x + ops.sigmoid(F32(layer.attn_gate)) * a).astype(F32)
        m = ops.zc_rmsnorm(x, layer.pre_hada)
        return (x + ops.monarch_mlp(m, layer.mlp)).astype(F32)

    def _conv(self, history, raw, taps, pos, band):
        """Causal depthwise conv of the chunk's raw projections against the kept history."""
        if taps is None:
            return raw, history
        C = taps.shape[0]
        seq = np.concatenate([history, raw])
        tap_ok = ops.conv_tap_ok(pos, C, 1, self.recent, self.sinks, band)
        ok = np.concatenate([np.zeros((len(history), C), bool), tap_ok])
        out = ops.causal_conv(seq, taps, 1, ok)[len(history):]
        return out, seq[len(seq) - len(history):] if len(history) else history

    def _attention(self, layer, lst, a, pos):
        """``Attention_l(a)`` against this layer's KV cache (spec §4.7)."""
        w = self.w
        H, K, dq = w.num_heads, w.num_kv_heads, w.qk_head_dim
        band = self._band(layer)
        a = self._a8(a)
        q = self._mm(a, layer.q_proj)
        k = self._mm(a, layer.k_proj)
        v = self._mm(a, layer.v_proj)
        g = self._mm(a, layer.gate_proj)
        q, lst.conv_q = self._conv(lst.conv_q, q, layer.q_taps, pos, band)
        k, lst.conv_k = self._conv(lst.conv_k, k, layer.k_taps, pos, band)
        v, lst.conv_v = self._conv(lst.conv_v, v, layer.v_taps, pos, band)
        q = ops.rope(ops.zc_rmsnorm(ops.split_heads(q, H), layer.q_norm), pos, w.rope_theta)
        k = ops.rope(ops.zc_rmsnorm(ops.split_heads(k, K), layer.k_norm), pos, w.rope_theta)
        v = ops.split_heads(v, K)
        if self.quant:
            q = ops.a8(q)
            k = ops.kv_quantize(k, w.kv_bits)
            v = ops.kv_quantize(v, w.kv_bits)
        # append to the cache, attend, then drop what no later query can see
        k_all = np.concatenate([lst.k_cache, k])
        v_all = np.concatenate([lst.v_cache, v])
        kv_pos = np.concatenate([lst.kv_pos, pos])
        mask = ops.attention_mask(pos, kv_pos, self.recent, self.sinks, band)
        o = ops.gqa_attention(q, k_all, v_all, mask)
        keep = ops.context_visible(pos[-1] + 1, kv_pos, self.recent, self.sinks, band)
        lst.k_cache, lst.v_cache, lst.kv_pos = k_all[keep], v_all[keep], kv_pos[keep]
        o = ops.output_gate(o.reshape(o.shape[0], -1), g)
        return self._mm(self._a8(o), layer.out_proj)

    # ----------------------------------------------------------------- heads
    def _head_probes(self, head):
        key = ("probes", head.name)
        if key not in self._head_cache:
            R = self.w.num_layers + 1
            P = self._dense(head.probes).reshape(R, head.probes_per_row, self.w.d_model)
            self._head_cache[key] = np.ascontiguousarray(P)
        return self._head_cache[key]

    def _heads_from_pools(self, st):
        out = {}
        for name, head in self.w.heads.items():
            pool = st.pools[name]
            if pool.count_empty:
                from ..errors import ModelStateError
                raise ModelStateError("head_outputs: no (non-PAD) token has been fed since reset")
            z = ops.probe_pool_rows(ops.probe_pool_tokens_online(pool), head.gain,
                                    self._dense(head.query), head.row_bias)
            out[name] = ops.HEAD_POST[name](ops.probe_head_output(z, self._dense(head.proj), head.bias))
        return out

    def heads_from_cells(self, cells, ids=None):
        """Head outputs from whole-sequence cells ``[T, D+1, d]`` (non-online pooling, for tests).

        ``ids`` (optional) drops the PAD positions from the pooling like the online form does.
        """
        keep = None if ids is None else np.asarray(ids) != PAD_ID
        out = {}
        for name, head in self.w.heads.items():
            z = ops.probe_pool(cells, self._head_probes(head), head.gain, self._dense(head.query),
                               head.row_bias, keep)
            out[name] = ops.HEAD_POST[name](ops.probe_head_output(z, self._dense(head.proj), head.bias))
        return out
