"""``needle_cy.Model``: a Needle 3 archive ready to run, token by token.

    from needle_cy import Model
    model = Model.load("model.cact")                 # Cython engine, deploy numerics
    logits = model.prefill(ids)                      # appends ids, logits of the last one
    logits = model.step(next_id)
    heads = model.head_outputs()                     # {"embedding", "confidence", "router"}

``Model`` is thin: it checks arguments and token ids, owns the context policy
(below) and delegates the arithmetic to an engine — ``backend="cython"``
(``needle_cy._model.CythonEngine``) or ``backend="numpy"``
(:class:`needle_cy.reference.model.ReferenceEngine`, the readable oracle).
Both implement the interface documented in ``needle_cy/reference/model.py``.

Numerics
--------
``numerics="deploy"`` (default) runs what every archive was trained for: CQ
weights, 8-bit "A8" fake-quant of the activations at the sites of spec §3.8
(router input, attention input, queries, attention output, engram input,
logit-head input) and the KV cache quantized at the header's ``kv_bits``
(int8 per head vector, or CQ over groups of 64 at 2/3/4 bits).
``numerics="float"`` switches the activation and KV quantizers off (CQ weights
only): a smooth function, useful to compare engines tightly.

Context and what the model sees when the window wraps
-----------------------------------------------------
* ``max_seq_len`` (header) is the hard limit: a call that would take the state
  past it raises :class:`needle_cy.errors.ContextOverflowError` and leaves the
  state untouched.  ``reset()`` (or ``restore()`` of a shorter snapshot) frees it.
* The KV window ``W`` is the header's ``kv_window``; when that is 0 it is sized
  by the official memory budget (spec §9.1).  ``kv_window=`` overrides it.
* Up to ``W`` tokens the model is exactly the causal model of spec §4.
* Beyond ``W`` the window wraps: the first ``sink_tokens`` positions stay pinned
  as attention sinks and every layer sees those plus the most recent
  ``W - sink_tokens`` positions (the current one included).  Local
  (sliding-window) layers still see at most the last ``sliding_window``
  positions: sinks do not bypass that band (spec §9.2).  Tokens that fall out of the window
  are forgotten for attention; their effect lives on only through what later
  tokens computed from them.  RoPE positions stay absolute (the model saw
  position ``t`` as ``t`` during training, so nothing is renumbered).  Engram
  n-grams and the Q/K/V / engram conv taps only reach a few positions back and
  follow the same visibility.  ``sink_tokens=0`` gives a plain sliding window.
  The recommended use (spec §9.2) is to pin the fixed prompt prefix (BOS +
  system + tools): call ``set_sink_tokens(len(prefix_ids))`` any time before the
  window first wraps.
* The probe heads pool (online, spec §5.5) over every token since ``reset()``,
  each token's cells computed under the windowed attention above.  PAD (id 0)
  positions are left out of the pooling (spec §5.1); the blocks see a PAD like
  any other token (encoded text never contains one).
"""
from __future__ import annotations

import os
import time
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import numpy as np

from .errors import ContextOverflowError, ModelStateError, TokenizerError
from .threads import ThreadTuner, free_cpus_from, get_num_threads, machine_load, threads_automatic
from .weights import bind_weights

BACKENDS = ("cython", "numpy")
NUMERICS = ("deploy", "float")
DEFAULT_SINK_TOKENS = 4

KV_BUDGET_BYTES = 11 * 2 ** 20 + 2 ** 19     # 12 058 624 (spec §9.1)
KV_MIN_WINDOW = 160


def kv_budget_window(num_layers, global_layers, engram_sites, d_model, num_kv_heads,
                     qk_head_dim, v_head_dim, sliding_window, max_seq_len, budget=KV_BUDGET_BYTES):
    """Context window from the official KV memory budget (spec §9.1, used when kv_window = 0)."""
    kd = num_kv_heads * qk_head_dim
    vd = num_kv_heads * v_head_dim
    per_layer = kd + vd + 4 * (kd // 32 + vd // 32)
    per_site = d_model + 4 * (d_model // 32)
    n_global = len(global_layers)
    n_sites = len(engram_sites)
    if sliding_window > 0:
        local = min(sliding_window, max_seq_len)
        fixed = ((num_layers - n_global) * per_layer + n_sites * per_site) * local
        if n_global == 0:
            return max_seq_len if fixed <= budget else max(KV_MIN_WINDOW, local)
        return max(KV_MIN_WINDOW, min(((budget - fixed) // (n_global * per_layer)) // 32 * 32, max_seq_len))
    return max(KV_MIN_WINDOW,
               min((budget // (num_layers * per_layer + n_sites * per_site)) // 32 * 32, max_seq_len))


def effective_kv_window(weights):
    """The model's KV window: the header's ``kv_window``, or the §9.1 budget when it is 0."""
    if weights.kv_window > 0:
        return min(weights.kv_window, weights.max_seq_len)
    budget = kv_budget_window(weights.num_layers, weights.global_layers, weights.engram_layers,
                              weights.d_model, weights.num_kv_heads, weights.qk_head_dim,
                              weights.v_head_dim, weights.sliding_window, weights.max_seq_len)
    return min(budget, weights.max_seq_len)     # the 160-position floor can exceed a tiny max_seq_len


def _make_engine(backend, weights, numerics, window, sinks, threads):
    if backend == "numpy":
        from .reference.model import ReferenceEngine
        return ReferenceEngine(weights, numerics=numerics, window=window, sinks=sinks)
    try:
        from ._model import CythonEngine
    except ImportError as exc:
        raise ImportError(
            "backend='cython' needs the compiled engine needle_cy._model, which could not be "
            f"imported ({exc}); build it with `python setup.py build_ext --inplace` or pass "
            "backend='numpy' for the (slow) NumPy reference engine") from exc
    return CythonEngine(weights, numerics=numerics, window=window, sinks=sinks, threads=threads)


class Model:
    """A loaded Needle 3 model with incremental state; see the module docstring."""

    def __init__(self, weights: Any, engine: Any, archive: Any, backend: str, numerics: str,
                 kv_window: int, sink_tokens: int, threads: int) -> None:
        self.weights = weights
        self.archive = archive
        self.backend = backend
        self.numerics = numerics
        self.kv_window = kv_window
        self.sink_tokens = sink_tokens
        self.threads = threads
        self._engine = engine
        # automatic thread count (no threads= / NEEDLE_CY_THREADS given): a tuner
        # picks 1..threads per call from measured times (needle_cy.threads)
        self.thread_tuner: Optional[ThreadTuner] = None

    # ------------------------------------------------------------------ load
    @classmethod
    def load(cls, path_or_archive: Union[str, "os.PathLike[str]", Any], backend: str = "cython",
             numerics: str = "deploy", threads: Optional[int] = None, depth: Optional[int] = None,
             sink_tokens: Optional[int] = None, layers: Optional[Sequence[int]] = None,
             kv_window: Optional[int] = None, sinks: Optional[int] = None) -> "Model":
        """Open an archive (path or :class:`needle_cy.archive.Archive`) and build an engine.

        backend      "cython" (fast, default) or "numpy" (the reference).
        numerics     "deploy" (A8 + quantized KV, default) or "float" (quantizers off).
        threads      worker threads of the Cython engine.  None (or "auto"): NEEDLE_CY_THREADS,
                     else automatic — the engine is built for every physical core and
                     ``thread_tuner`` picks 1..cores per call from measured times.
        depth        run the ladder rung of that many blocks (spec §4.11, bisection order of the
                     archive's own num_layers — meant for a parent archive; for an archive that is
                     already a slice pass ``layers``, an explicit ascending block list).
        sink_tokens  first positions pinned when the KV window wraps (0 = plain sliding window);
                     ``sinks`` is an alias.  Default: ``DEFAULT_SINK_TOKENS`` (4), lowered to
                     W - 1 when the KV window W is smaller, so every valid archive loads
                     with defaults; an explicit value must be smaller than W.
        kv_window    override of the KV window W (default: header, or the §9.1 budget).
        """
        if backend not in BACKENDS:
            raise ValueError(f"Model.load: backend must be one of {BACKENDS}, got {backend!r}")
        if numerics not in NUMERICS:
            raise ValueError(f"Model.load: numerics must be one of {NUMERICS}, got {numerics!r}")
        if sinks is not None:
            sink_tokens = sinks
        n_threads = get_num_threads(threads)
        if isinstance(path_or_archive, (str, bytes)) or hasattr(path_or_archive, "__fspath__"):
            from .archive import Archive
            archive = Archive.open(path_or_archive)
        else:
            archive = path_or_archive
        weights = bind_weights(archive, depth=depth, layers=layers)
        window = effective_kv_window(weights)
        if kv_window is not None:
            if not isinstance(kv_window, (int, np.integer)) or isinstance(kv_window, bool) or kv_window < 1:
                raise ValueError(f"Model.load: kv_window must be a positive integer, got {kv_window!r}")
            window = min(int(kv_window), weights.max_seq_len)
        if sink_tokens is None:
            sink_tokens = min(DEFAULT_SINK_TOKENS, window - 1)
        sink_tokens = cls._check_sinks(sink_tokens, window)
        engine = _make_engine(backend, weights, numerics, window, sink_tokens, n_threads)
        model = cls(weights, engine, archive, backend, numerics, window, sink_tokens, n_threads)
        if n_threads > 1 and threads_automatic(threads) and hasattr(engine, "run_threads"):
            load = machine_load()
            # Where the machine's load can be read, a busy core is seen before each call,
            # so timing need not find it: re-trying a slower count 4x less often than
            # with timing alone keeps the tries' cost small (a one-thread step now and
            # then in a full-size decode).
            model.thread_tuner = (ThreadTuner(n_threads, explore_every=128, free_cpus=free_cpus_from(load))
                                  if load else ThreadTuner(n_threads))
        return model

    @staticmethod
    def _check_sinks(sink_tokens, window):
        if not isinstance(sink_tokens, (int, np.integer)) or isinstance(sink_tokens, bool) or sink_tokens < 0:
            raise ValueError(f"sink_tokens must be a non-negative integer, got {sink_tokens!r}")
        if sink_tokens >= window:
            raise ValueError(f"sink_tokens ({sink_tokens}) must be smaller than the KV window ({window})")
        return int(sink_tokens)

    # ------------------------------------------------------------ properties
    @property
    def config(self) -> Any:
        """The archive configuration of the model as run (a rung has its own layers/sites)."""
        return self.weights.config

    @property
    def position(self) -> int:
        """Tokens in the state (the absolute position of the next token)."""
        return self._engine.position

    @property
    def max_seq_len(self) -> int:
        return self.weights.max_seq_len

    @property
    def vocab_size(self) -> int:
        """Valid input ids: 0 .. vocab_size-1."""
        return self.weights.vocab

    @property
    def out_vocab(self) -> int:
        """Width of the logits."""
        return self.weights.out_vocab

    @property
    def heads(self) -> Tuple[str, ...]:
        """Names of the probe heads present, in manifest order."""
        return tuple(self.weights.heads)

    @property
    def engine(self) -> Any:
        return self._engine

    # ---------------------------------------------------------------- checks
    def _ids(self, ids, what):
        try:
            arr = np.asarray(ids)
        except (ValueError, TypeError) as exc:   # ragged nesting, unconvertible objects
            raise TokenizerError(f"{what}: token ids must be a 1-D sequence of integers ({exc})") from None
        if arr.ndim == 0:
            arr = arr.reshape(1)
        if arr.ndim != 1:
            raise TokenizerError(f"{what}: token ids must be a 1-D sequence, got shape {arr.shape}")
        if arr.size == 0:
            raise TokenizerError(f"{what}: empty token sequence")
        if arr.dtype.kind not in "iu":
            if arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
                arr = arr.astype(np.int64)
            else:
                raise TokenizerError(f"{what}: token ids must be integers, got dtype {arr.dtype}")
        arr = arr.astype(np.int64)
        bad = np.flatnonzero((arr < 0) | (arr >= self.weights.vocab))
        if bad.size:
            i = int(bad[0])
            raise TokenizerError(
                f"{what}: token id {int(arr[i])} at index {i} is outside [0, {self.weights.vocab}) "
                f"(the archive's vocab)")
        return arr

    def _room(self, n, what, start=None):
        start = self.position if start is None else start
        if start + n > self.weights.max_seq_len:
            raise ContextOverflowError(
                f"{what}: {n} token(s) at position {start} would exceed max_seq_len "
                f"{self.weights.max_seq_len}; call reset() or restore() a shorter snapshot")

    # ------------------------------------------------------------- interface
    def forward(self, ids: Sequence[int]) -> np.ndarray:
        """Logits ``[T, out_vocab]`` of a fresh sequence at every position (state untouched)."""
        ids = self._ids(ids, "forward")
        self._room(len(ids), "forward", start=0)
        return self._timed("forward", self._engine.forward, ids, len(ids))

    def prefill(self, ids: Sequence[int]) -> np.ndarray:
        """Append ``ids`` to the state (batched) and return the last position's logits."""
        ids = self._ids(ids, "prefill")
        self._room(len(ids), "prefill")
        if self.thread_tuner is None:
            return self._engine.prefill(ids)
        # chunk by chunk (as the engine itself would), so every chunk is a sample
        chunk = getattr(self._engine, "chunk", 64)
        for t0 in range(0, len(ids), chunk):
            part = ids[t0:t0 + chunk]
            logits = self._timed("prefill", self._engine.prefill, part, len(part))
        return logits

    def step(self, token: int) -> np.ndarray:
        """Append one token and return its logits ``[out_vocab]``."""
        if type(token) is int and 0 <= token < self.weights.vocab:
            # the decode loop's case, without the array checks (~20 µs a step)
            self._room(1, "step")
            return self._timed("step", self._engine.step, token, 1)
        ids = self._ids(token, "step")
        if ids.size != 1:
            raise TokenizerError(f"step: expects one token id, got {ids.size}")
        self._room(1, "step")
        return self._timed("step", self._engine.step, int(ids[0]), 1)

    def _timed(self, kind, call, arg, tokens):
        tuner = self.thread_tuner
        if tuner is None:
            return call(arg)
        n = tuner.pick(kind)
        self._engine.run_threads = n
        t0 = time.perf_counter()
        out = call(arg)
        tuner.record(kind, n, time.perf_counter() - t0, tokens)
        return out

    def reset(self) -> None:
        """Forget every token (empty state, position 0)."""
        self._engine.reset()

    def snapshot(self) -> Any:
        """An opaque copy of the whole state (KV cache, histories, head pools, position)."""
        return self._engine.snapshot()

    def restore(self, snapshot: Any) -> None:
        """Reinstate a snapshot taken from this model."""
        self._engine.restore(snapshot)

    def set_sink_tokens(self, n: int) -> None:
        """Pin the first ``n`` positions as sinks; allowed until the window first wraps."""
        n = self._check_sinks(n, self.kv_window)
        if self.position >= self.kv_window:
            raise ModelStateError(
                f"set_sink_tokens: the window ({self.kv_window}) has already wrapped at position "
                f"{self.position}; call it before, or after reset()")
        self._engine.set_sinks(n)
        self.sink_tokens = n

    def head_outputs(self) -> Dict[str, Any]:
        """Probe-head outputs pooled over every token since reset (dict over present heads)."""
        if self.position == 0:
            raise ModelStateError("head_outputs: the state holds no token (prefill first)")
        return self._engine.head_outputs()

    def __repr__(self):
        return (f"Model(layers={self.weights.num_layers}, d_model={self.weights.d_model}, "
                f"backend={self.backend!r}, numerics={self.numerics!r}, kv_window={self.kv_window}, "
                f"sink_tokens={self.sink_tokens}, position={self.position})")
