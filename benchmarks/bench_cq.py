"""CQ matvec / matmul speed, side by side in one run (pytest-benchmark).

    pytest benchmarks/bench_cq.py --benchmark-min-time=0.05 --benchmark-max-time=0.3 \
        --benchmark-min-rounds=3 --benchmark-columns=min,median,rounds
    NEEDLE_CY_BENCH_TABLE=/tmp/cq.md pytest benchmarks/bench_cq.py ...
        (also writes the GMAC/s table, computed from each benchmark's minimum)
    NEEDLE_CY_BENCH_SHAPES=768x768,96x768 pytest benchmarks/bench_cq.py ...   # a subset
    NEEDLE_CY_BENCH_THREADS=1 pytest benchmarks/bench_cq.py --benchmark-timer=time.thread_time ...
        (single-thread figures in the calling thread's CPU time: robust on a loaded machine;
        never use a CPU-time timer for 2 threads, it misses or adds the other thread)

For every projection shape of the full-size Needle 3 model, at 2 and 4 bits
(group 128) and 1 and 2 threads:

* ``matvec``: Cython ``needle_cy._cq.matvec`` vs the NumPy reference
  ``needle_cy.reference.cq.matvec`` (single-threaded Python/NumPy, run once per
  width) vs a dense float32 ``W @ x`` through NumPy's BLAS (threads limited
  with threadpoolctl) on the same shape;
* ``matmul64``: Cython ``matmul`` at 64 tokens vs dense ``X @ W.T``;
* ``matvec_kernel``: every kernel this CPU has, forced one after the other
  (``avx2`` float; ``avx512lut`` table lookups for 2-bit fields, the next AVX-512
  kernel for the rest; ``avx2lut`` the same lookups with AVX2, the float kernel for the
  rest; ``avx512bw``/``avx512vnni``/``avxvnni``/``avx2int``/``neon``/
  ``neon_dotprod`` integer on
  the A8 input), on the
  A8-quantized input the engine gives them in deploy numerics;
* ``matmul_kernel``: the same for the matmul at 4 and 64 A8 tokens.

A multiply–accumulate (MAC) is one weight times one activation: rows·cols per
token.  The minimum over rounds is used (the build machine is shared, the
minimum is the least disturbed run).  Which BLAS NumPy uses (and its kernel,
e.g. OpenBLAS "Haswell"/"Zen" and OPENBLAS_CORETYPE) is printed in the table
header.
"""
import contextlib
import os
import platform
import time

import numpy as np
import pytest

from needle_cy import _cq
from needle_cy.reference import cq as ref

try:
    from threadpoolctl import threadpool_info, threadpool_limits
except ImportError:  # pragma: no cover - optional
    threadpool_info = threadpool_limits = None

# (name, rows, cols): every CQ projection shape of the full-size model (d = 768, n·d = 3072)
ALL_SHAPES = [
    ("q/gate/out 768x768", 768, 768),
    ("576x768", 576, 768),
    ("96x768", 96, 768),
    ("128x768", 128, 768),
    ("head 16384x768", 16384, 768),
    ("mHC 80x3072", 80, 3072),
    ("mHC 320x3072", 320, 3072),
    ("768x3072", 768, 3072),
]
_only = os.environ.get("NEEDLE_CY_BENCH_SHAPES")
SHAPES = [s for s in ALL_SHAPES if not _only or f"{s[1]}x{s[2]}" in _only.split(",")]
WIDTHS = [2, 4]
THREADS = [int(t) for t in os.environ.get("NEEDLE_CY_BENCH_THREADS", "1,2").split(",")]
TOKENS = 64
GROUP = 128

_dense = {}
_quant = {}
RESULTS = []  # (kind, shape, impl, bits, threads, seconds)


def dense(rows, cols):
    key = (rows, cols)
    if key not in _dense:
        rng = np.random.default_rng(rows * 7919 + cols)
        W = rng.standard_normal((rows, cols)).astype(np.float32)
        x = rng.standard_normal(cols).astype(np.float32)
        X = rng.standard_normal((TOKENS, cols)).astype(np.float32)
        _dense[key] = (W, x, X)
    return _dense[key]


def quantized(rows, cols, bits):
    key = (rows, cols, bits)
    if key not in _quant:
        W = ref.quantize(dense(rows, cols)[0], bits, GROUP)
        _quant[key] = (W, _cq.prepare(W))
    return _quant[key]


def blas_threads(n):
    if threadpool_limits is None:
        return contextlib.nullcontext()
    return threadpool_limits(limits=n, user_api="blas")


def record(benchmark, kind, shape, impl, bits, threads):
    stats = getattr(benchmark, "stats", None)
    if stats is not None and getattr(stats, "stats", None) is not None:
        RESULTS.append((kind, shape, impl, bits, threads, stats.stats.min))


def shape_id(s):
    return f"{s[1]}x{s[2]}"


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("bits", WIDTHS)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_matvec_cython(benchmark, shape, bits, threads):
    name, rows, cols = shape
    _, cw = quantized(rows, cols, bits)
    x = dense(rows, cols)[1]
    out = np.empty(rows, np.float32)
    benchmark.group = f"matvec {name}"
    benchmark(_cq.matvec, cw, x, out=out, threads=threads)
    record(benchmark, "matvec", name, "cython", bits, threads)


def a8(x):
    """The A8 quantizer of spec §3.8: the vector every CQ product sees in deploy numerics."""
    amax = np.float32(np.abs(x).max())
    s = amax / np.float32(127) if amax > 0 else np.float32(1)
    return (np.clip(np.rint(x / s), -128, 127) * s).astype(np.float32)


# every matvec kernel this CPU has, side by side: the float ones (float input) and the
# integer ones (A8 input); NEEDLE_CY_BENCH_KERNELS=avx2,avx512vnni picks a subset
_kernels_only = os.environ.get("NEEDLE_CY_BENCH_KERNELS")
KERNELS = [k for k in _cq.available_kernels() if k != "scalar"
           and (not _kernels_only or k in _kernels_only.split(","))]


@contextlib.contextmanager
def forced_kernel(kernel):
    """Run with one CQ kernel chosen (``set_kernel``), the automatic choice back after."""
    _cq.set_kernel(kernel)
    try:
        yield
    finally:
        _cq.set_kernel("auto")


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("bits", WIDTHS)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("kernel", KERNELS)
def test_matvec_kernel(benchmark, kernel, shape, bits, threads):
    """One kernel forced with set_kernel; the input is A8-quantized for every kernel
    (the float kernel gives the same result up to rounding)."""
    name, rows, cols = shape
    _, cw = quantized(rows, cols, bits)
    x = a8(dense(rows, cols)[1])
    out = np.empty(rows, np.float32)
    integer = kernel in _cq.INT_KERNELS
    benchmark.group = f"matvec {name} {bits} bits"
    with forced_kernel(kernel):
        benchmark(_cq.matvec, cw, x, out=out, threads=threads, a8=integer)
    record(benchmark, "matvec-kernel", name, kernel, bits, threads)


KERNEL_TOKENS = [4, TOKENS]   # a short chunk (the float matmul cannot amortise its decode) and a full one


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("bits", WIDTHS)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("tokens", KERNEL_TOKENS)
@pytest.mark.parametrize("kernel", KERNELS)
def test_matmul_kernel(benchmark, kernel, tokens, shape, bits, threads):
    """The matmul with one kernel forced, on A8-quantized tokens (the prefill path)."""
    name, rows, cols = shape
    _, cw = quantized(rows, cols, bits)
    X = np.stack([a8(x) for x in dense(rows, cols)[2][:tokens]])
    out = np.empty((tokens, rows), np.float32)
    integer = kernel in _cq.INT_KERNELS
    benchmark.group = f"matmul{tokens} {name} {bits} bits"
    with forced_kernel(kernel):
        benchmark(_cq.matmul, cw, X, out=out, threads=threads, a8=integer)
    record(benchmark, f"matmul{tokens}-kernel", name, kernel, bits, threads)


@pytest.mark.parametrize("bits", WIDTHS)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_matvec_numpy_reference(benchmark, shape, bits):
    name, rows, cols = shape
    W, _ = quantized(rows, cols, bits)
    x = dense(rows, cols)[1]
    benchmark.group = f"matvec {name}"
    with blas_threads(1):
        benchmark(ref.matvec, W, x)
    record(benchmark, "matvec", name, "reference", bits, 1)


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_matvec_dense_blas(benchmark, shape, threads):
    name, rows, cols = shape
    W, x, _ = dense(rows, cols)
    out = np.empty(rows, np.float32)
    benchmark.group = f"matvec {name}"
    with blas_threads(threads):
        benchmark(np.matmul, W, x, out=out)
    record(benchmark, "matvec", name, "blas-fp32", 32, threads)


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("bits", WIDTHS)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_matmul64_cython(benchmark, shape, bits, threads):
    name, rows, cols = shape
    _, cw = quantized(rows, cols, bits)
    X = dense(rows, cols)[2]
    out = np.empty((TOKENS, rows), np.float32)
    benchmark.group = f"matmul{TOKENS} {name}"
    benchmark(_cq.matmul, cw, X, out=out, threads=threads)
    record(benchmark, "matmul", name, "cython", bits, threads)


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_matmul64_dense_blas(benchmark, shape, threads):
    name, rows, cols = shape
    W, _, X = dense(rows, cols)
    Wt = W.T
    out = np.empty((TOKENS, rows), np.float32)
    benchmark.group = f"matmul{TOKENS} {name}"
    with blas_threads(threads):
        benchmark(np.matmul, X, Wt, out=out)
    record(benchmark, "matmul", name, "blas-fp32", 32, threads)


# ---------------------------------------------------------------------------
# GMAC/s table
# ---------------------------------------------------------------------------

def environment_lines(config=None):
    lines = [f"- CPU: {platform.processor() or platform.machine()}, "
             f"{os.cpu_count()} logical CPUs; CQ inner loop: `{_cq.simd_kernel()}` (A8 inputs: `{_cq.kernel_name()}`)"]
    timer = getattr(getattr(config, "option", None), "benchmark_timer", None)
    lines.append(f"- timer: {getattr(timer, '__name__', timer) or 'perf_counter'}; "
                 f"threads {THREADS}; 1-min load average {os.getloadavg()[0]:.1f}")
    lines.append(f"- NumPy {np.__version__}; OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}")
    if threadpool_info is not None:
        for lib in threadpool_info():
            if lib.get("user_api") == "blas":
                lines.append(f"- BLAS: {lib.get('internal_api')} {lib.get('version')}, "
                             f"kernel architecture {lib.get('architecture')}")
    try:
        with open("/proc/cpuinfo") as f:
            model = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), None)
        if model:
            lines[0] = lines[0].replace(platform.processor() or platform.machine(), model, 1)
    except OSError:
        pass
    return lines


def gmacs(rows, cols, tokens, seconds):
    return rows * cols * tokens / seconds / 1e9


def render_table(config=None):
    by = {}
    for kind, shape, impl, bits, threads, sec in RESULTS:
        by[(kind, shape, impl, bits, threads)] = sec
    dims = {name: (r, c) for name, r, c in ALL_SHAPES}
    out = environment_lines(config)
    out.append("")
    out.append("| shape | bits | thr | matvec µs | matvec GMAC/s | vs fp32 BLAS matvec | vs NumPy ref | "
               "matmul64 GMAC/s | vs BLAS matmul64 | matmul64 / matvec per token |")
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    for name, rows, cols in SHAPES:
        for bits in WIDTHS:
            for threads in THREADS:
                mv = by.get(("matvec", name, "cython", bits, threads))
                blas = by.get(("matvec", name, "blas-fp32", 32, threads))
                refsec = by.get(("matvec", name, "reference", bits, 1))
                mm = by.get(("matmul", name, "cython", bits, threads))
                mmb = by.get(("matmul", name, "blas-fp32", 32, threads))

                def f(v, fmt="{:.1f}"):
                    return fmt.format(v) if v is not None else "–"
                cells = [
                    name, str(bits), str(threads),
                    f(mv * 1e6 if mv else None),
                    f(gmacs(rows, cols, 1, mv) if mv else None),
                    f(blas / mv if (mv and blas) else None, "{:.2f}×"),
                    f(refsec / mv if (mv and refsec) else None, "{:.0f}×"),
                    f(gmacs(rows, cols, TOKENS, mm) if mm else None),
                    f(mmb / mm if (mm and mmb) else None, "{:.2f}×"),
                    f((mv * TOKENS) / mm if (mv and mm) else None, "{:.1f}×"),
                ]
                out.append("| " + " | ".join(cells) + " |")
    # one table per kernel benchmark: the matvec, then the matmul at each token count
    tables = [("matvec-kernel", 1, "Matvec by kernel (A8 input; GMAC/s; forced with `_cq.set_kernel`):")]
    tables += [(f"matmul{tokens}-kernel", tokens,
                f"Matmul of {tokens} tokens by kernel (A8 inputs; GMAC/s; forced with `_cq.set_kernel`):")
               for tokens in KERNEL_TOKENS]
    for kind, tokens, title in tables:
        run = [k for k in KERNELS if any(r[0] == kind and r[2] == k for r in RESULTS)]
        if not run:
            continue
        out.append("")
        out.append(title)
        out.append("")
        out.append("| shape | bits | thr | " + " | ".join(run) + " | best integer / avx2 |")
        out.append("|---|---|---|" + "---|" * (len(run) + 1))
        for name, rows, cols in SHAPES:
            for bits in WIDTHS:
                for threads in THREADS:
                    secs = {k: by.get((kind, name, k, bits, threads)) for k in run}
                    cells = [f"{gmacs(rows, cols, tokens, v):.1f}" if v else "–" for v in secs.values()]
                    ints = [v for k, v in secs.items() if k in _cq.INT_KERNELS and v]
                    ratio = (f"{secs['avx2'] / min(ints):.2f}×" if ints and secs.get("avx2") else "–")
                    out.append(f"| {name} | {bits} | {threads} | " + " | ".join(cells) + f" | {ratio} |")
    out.append("")
    out.append("Dense baselines (GMAC/s): " + "; ".join(
        f"{name} t{t}: matvec {gmacs(r, c, 1, by[('matvec', name, 'blas-fp32', 32, t)]):.1f}, "
        f"matmul64 {gmacs(r, c, TOKENS, by[('matmul', name, 'blas-fp32', 32, t)]):.1f}"
        for name, r, c in SHAPES for t in THREADS
        if ("matvec", name, "blas-fp32", 32, t) in by and ("matmul", name, "blas-fp32", 32, t) in by))
    return "\n".join(out) + "\n"


@pytest.fixture(scope="module", autouse=True)
def gmacs_table(request):
    yield
    if not RESULTS:
        return
    table = render_table(request.config)
    print("\n" + table)
    path = os.environ.get("NEEDLE_CY_BENCH_TABLE")
    if path:
        with open(path, "w") as f:
            f.write(f"<!-- generated by benchmarks/bench_cq.py, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} -->\n")
            f.write(table)
