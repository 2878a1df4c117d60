"""The benchmark report: every benchmark in one run, as Markdown with PNG plots.

    python benchmarks/report.py            # full run: a few minutes on an idle 2-core machine
    python benchmarks/report.py --quick    # fewer contexts and rounds, short suites (about 1 min)
    python benchmarks/report.py --tiny --archive 2=small.cact --suites none --no-perf --out DIR
                                           # the test's mode: seconds, on a small archive
    python benchmarks/report.py --replot   # redraw the PNGs from report.json (no measuring)
    python benchmarks/report.py --update-committed    # write the committed report instead

It writes ``REPORT.md`` and ``report.json`` into ``build/benchmark-report/`` (``--out``
another folder), which git ignores, so a run never changes a tracked file.
``--update-committed`` writes ``benchmarks/report/`` instead, the report the repository
keeps (do that on purpose, with the commit of the code measured).  Where matplotlib is
installed (``pip install ".[bench]"``) the PNGs are written beside it; without it the
Markdown says the plots were skipped.  Sections:

1. the machine: CPU model, its class (AVX-512, AVX2 without AVX-512, NEON: the kernels
   differ by class, so the first lines name it and the CQ kernel chosen) and the flags
   the kernels use, cores, load, OpenMP;
2. the roofline, measured in this run by native probes (``needle_cy._roofline``): read
   bandwidth from DRAM (1 and all threads), L3- and L2-sized buffers, float32 FMA,
   int8 and int16 dot-product peaks;
3. the archive's cost model: bytes streamed and multiply-accumulates (MACs) per token,
   from its CQ records and the KV cache geometry (``cost_model``);
4. tokens/s against context: decode after several context lengths and prefill of
   several prompt lengths, at each width and thread setting, each as a share of its
   roofline — decode: min(bandwidth / bytes per token, FMA peak / MACs per token);
   prefill: FMA peak / MACs per token (and the int8 peak's share beside it);
5. the per-operator breakdown of decode and prefill (``benchmarks/profile_model.py``
   under Linux ``perf``, grouped into operator classes);
6. the grammar, tokenizer and agent suites (pytest-benchmark, ``--benchmark-json``).

Earlier measurements are not repeated here: they live in ``benchmarks/history/``, dated
and with the CPU named.

Archives: bench_model.py's random full-size models (``needle_cy.testing.make_random_archive``,
20 layers, d 768, vocab 16384) at 2 and 4 bits, cached in the temp dir; ``--archive
BITS=PATH`` names others.  Decode and prefill are timed in wall clock (threads 2 and
auto need it); single-thread runs also report tokens per CPU-second, the figure that
holds on a shared machine.  Load average is recorded at the start and the end.
"""
import argparse
import datetime
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO), str(HERE)]

from needle_cy import _cq, _parallel, _roofline  # noqa: E402
from needle_cy.archive import DTYPE_CQ, Archive  # noqa: E402
from needle_cy.model import Model  # noqa: E402
from needle_cy.threads import physical_cores  # noqa: E402

DEFAULT_OUT = REPO / "build" / "benchmark-report"   # untracked (.gitignore: build/)
COMMITTED_OUT = HERE / "report"                      # the report the repository keeps
# flags the kernels (or kernels one could write) depend on, x86 and Arm
KERNEL_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512bw", "avx512vl",
                "avx512_vnni", "avx512_bf16", "avx512vbmi", "avx512_vbmi2", "avx512ifma", "avx_vnni",
                "amx_tile", "amx_int8", "amx_bf16", "asimd", "asimddp", "i8mm", "sve", "sve2", "bf16")
# perf symbol -> operator class, first match wins (symbol names in profile_model.py's docstring)
OPERATOR_CLASSES = [
    ("rotations (A8 codes, FWHT, gathers, lookup tables)", r"a8_codes|fwht|pack_codes|rotate|cql_tables|cql_tile_tables|cql_token_scale"),
    ("CQ products (matvec / matmul)", r"nc_cqi|nc_cql|nc_cq_|cq_mat|matmul|matvec|_cq_|dot_tiles"),
    ("attention (scores, softmax, P·V)", r"attend|i8_scores|i8_pv|softmax|_attn"),
    ("Monarch MLP", r"kron|monarch"),
    ("exp", r"exp"),
    ("OpenMP runtime (fork/join, waits)", r"gomp|omp_|GOMP|kmp"),
    ("kernel: page clearing, copies", r"^\[k\]|clear_page|memcpy|memset|memmove"),
    ("row lookups (embedding, engram tables)", r"dequantize_row"),
    ("probe-head pools", r"pool"),
    ("other engine ops (norms, conv, mHC, RoPE, A8)", r"^_ops\.|^_model\.|rmsnorm|sinkhorn|rope|conv"),
    ("Python interpreter and NumPy", r"Py|_Py|PyArray|npy_|ufunc|lookdict"),
]

MODES = {
    # decode contexts, prefill lengths, decode steps per round, rounds, probe seconds,
    # DRAM buffer MB, perf runs, suites
    "full": dict(contexts=[16, 128, 512, 1024, 2048, 3072], prefill=[16, 64, 256, 600, 2048],
                 steps=16, rounds=4, prefill_rounds=2, probe_s=0.25, dram_mb=512,
                 perf=[("decode", 64, 100), ("decode", 1024, 100), ("prefill", 600, 3)]),
    "quick": dict(contexts=[64, 600], prefill=[64, 600], steps=16, rounds=3, prefill_rounds=2,
                  probe_s=0.1, dram_mb=256, perf=[("decode", 600, 60), ("prefill", 600, 2)]),
    "tiny": dict(contexts=[4, 16], prefill=[8, 16], steps=4, rounds=1, prefill_rounds=1,
                 probe_s=0.01, dram_mb=8, perf=[("decode", 16, 8)]),
}


# ---------------------------------------------------------------------------------------
# machine

def cpu_info():
    """Model name, flags the kernels care about, logical CPUs, physical cores, caches."""
    info = {"model": platform.processor() or platform.machine(), "flags": [], "caches": {}}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    fields = {}
    for line in out.splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            fields[k.strip()] = v.strip()
    info["model"] = fields.get("Model name", info["model"])
    flags = set(fields.get("Flags", "").split())
    if not flags and Path("/proc/cpuinfo").exists():
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                flags = set(line.split(":", 1)[1].split())
                break
    info["flags"] = [f for f in KERNEL_FLAGS if f in flags]
    for key in ("L1d cache", "L2 cache", "L3 cache", "Hypervisor vendor", "CPU family", "Model",
                "Thread(s) per core", "Architecture"):
        if key in fields:
            if "cache" in key:
                info["caches"][key] = fields[key]
            else:
                info[key] = fields[key]
    info["logical"] = os.cpu_count() or 1
    info["physical"] = physical_cores()
    return info


def isa_class(flags):
    """The class of CPU a run measured, from its kernel-relevant flags.  The engine runs
    different kernels by class (AVX-512: the integer and lookup CQ kernels; AVX2 without
    AVX-512: the AVX2 lookups and the float AVX2 kernel), so figures of two classes do
    not compare."""
    f = set(flags)
    if {"avx512f", "avx512bw", "avx512vl"} <= f:
        extra = [name for name, flag in (("VNNI", "avx512_vnni"), ("VBMI", "avx512vbmi"), ("AMX", "amx_int8"))
                 if flag in f]
        return "AVX-512" + (f" (+{', '.join(extra)})" if extra else "")
    if {"avx2", "fma"} <= f:
        return "AVX2+FMA, no AVX-512" + (" (+AVX-VNNI)" if "avx_vnni" in f else "")
    if "asimd" in f:
        return "aarch64 NEON" + (" (+dot product)" if "asimddp" in f else "")
    return "no AVX2+FMA or NEON (portable kernels)"


def kernel_choice():
    """The CQ kernels this run measures: for A8 inputs (deploy numerics) and for float
    inputs, and whether NEEDLE_CY_CQ_KERNEL forced them."""
    forced = os.environ.get("NEEDLE_CY_CQ_KERNEL", "").strip()
    return {"a8": _cq.kernel_name(a8=True), "float": _cq.kernel_name(a8=False),
            "forced": forced if forced and forced != "auto" else None}


def _cache_bytes(text, default):
    """'2 MiB (2 instances)' -> bytes per instance."""
    m = re.match(r"([\d.]+)\s*([KMG]i?B)(?:\s*\((\d+) instances?\))?", text or "")
    if not m:
        return default
    size = float(m.group(1)) * {"K": 2**10, "M": 2**20, "G": 2**30}[m.group(2)[0]]
    return int(size / int(m.group(3) or 1))


def load_average():
    try:
        return os.getloadavg()
    except OSError:
        return (float("nan"),) * 3


def extension_origin():
    """Where the compiled modules load from, and whether the grammar runs on its C runtime
    (a checkout that was not built would silently time another tree's build, or the pure-
    Python grammar fallback)."""
    from needle_cy.grammar import runtime
    here = Path(_cq.__file__).resolve().parent
    grammar_c = runtime._runtime_module() is not None
    return here, grammar_c


def git_commit():
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return out.stdout.strip() + (" (uncommitted changes)" if dirty else "") if out.returncode == 0 else "?"
    except (OSError, subprocess.TimeoutExpired):
        return "?"


# ---------------------------------------------------------------------------------------
# roofline probes

def _aligned(n_bytes):
    raw = np.ones(n_bytes + 64, np.uint8)             # written: every page is resident
    off = (-raw.ctypes.data) % 64
    return raw[off:off + n_bytes]


def measure_roofline(cpu, threads_all, seconds, dram_mb):
    """Peaks and bandwidths, each at 1 and all threads: {name: {threads: value}} (per second)."""
    l2 = _cache_bytes(cpu["caches"].get("L2 cache"), 512 << 10)
    l3 = _cache_bytes(cpu["caches"].get("L3 cache"), 8 << 20)
    sizes = {"L2": max(64 << 10, l2 // 4), "L3": max(1 << 20, l3 // 4), "DRAM": max(dram_mb << 20, 8 * l3)}
    if dram_mb < 64:                                   # the tiny mode: a small buffer, not DRAM
        sizes["DRAM"] = dram_mb << 20
    out = {"sizes": sizes, "isa": {k: _roofline.compute_isa(k) for k in ("fma", "int8", "int16")}}
    counts = sorted({1, threads_all})
    for kind in ("fma", "int8", "int16"):
        out[kind] = {t: _roofline.compute_peak(kind, t, seconds) for t in counts}
        out[kind + "_wall"] = {t: _roofline.compute_peak(kind, t, seconds, timer="wall") for t in counts}
    for level, size in sizes.items():
        per_thread = level == "L2"                     # private: a buffer per thread; L3/DRAM: one in all
        buf = _aligned(size * (threads_all if per_thread else 1))
        out[level] = {}
        for t in counts:
            view = buf if t == threads_all or not per_thread else buf[:size]
            out[level][t] = _roofline.read_bandwidth(view, t, seconds)
        del buf
    return out


# ---------------------------------------------------------------------------------------
# cost model

def _streamed(role, cfg):
    """Fraction of a CQ record read in full by every token (1), or 0 for a lookup table."""
    if role == "embedding":
        return cfg.out_rows / cfg.vocab              # the tied head reads its first out_rows rows
    if re.match(r"layers\.\d+\.(q|k|v|gate|out)_proj$", role) or role.startswith("mhc_phi_"):
        return 1.0
    if re.match(r"engram\.\d+\.(key|value)_proj$", role):
        return 1.0
    return 0.0                                        # engram tables: a few rows; probe heads: float32 copies


def cost_model(path, kv_storage="int8", chunk=64):
    """Bytes and MACs per token of an archive, from its CQ records and KV geometry."""
    with Archive.open(path) as a:
        cfg = a.config
        weight_bytes = head_bytes = body_macs = head_macs = 0.0
        for r in a.records:
            if r.dtype != DTYPE_CQ:
                continue
            f = _streamed(r.role, cfg)
            if not f:
                continue
            rows, cols = r.shape
            if r.role == "embedding":
                head_bytes += r.nbytes * f
                head_macs += cfg.out_rows * cols
            else:
                weight_bytes += r.nbytes
                body_macs += rows * cols
        bits = sorted({r.bits for r in a.records if r.dtype == DTYPE_CQ})
    H, K, dq, dv = cfg.num_heads, cfg.num_kv_heads, cfg.qk_head_dim, cfg.v_head_dim
    if kv_storage == "int8":
        kv_slot = K * (4 * math.ceil(dq / 4) + dv + 8)     # codes + two float32 scales per KV head
    else:
        kv_slot = K * 4 * (dq + dv)
    global_layers = [cfg.is_global(layer) for layer in range(cfg.num_layers)]
    return dict(config=cfg, bits=bits, weight_bytes=weight_bytes, head_bytes=head_bytes,
                body_macs=body_macs, head_macs=head_macs, kv_slot_bytes=kv_slot,
                attn_macs_per_key=H * (dq + dv), global_layers=global_layers,
                sliding_window=cfg.sliding_window, chunk=chunk)


def visible_keys(cost, context):
    """Keys a token at position `context` attends to, summed over layers."""
    return sum(context + 1 if g else min(context + 1, cost["sliding_window"]) for g in cost["global_layers"])


def decode_cost(cost, context):
    keys = visible_keys(cost, context)
    return dict(bytes=cost["weight_bytes"] + cost["head_bytes"] + keys * cost["kv_slot_bytes"],
                macs=cost["body_macs"] + cost["head_macs"] + keys * cost["attn_macs_per_key"])


def prefill_macs_per_token(cost, length):
    attn = sum(visible_keys(cost, t) for t in range(length)) * cost["attn_macs_per_key"]
    heads = math.ceil(length / cost["chunk"]) * cost["head_macs"]      # logits once per chunk
    return cost["body_macs"] + (attn + heads) / length


# ---------------------------------------------------------------------------------------
# model speed

def measure_model(path, threads, mode, log):
    """{"decode": {ctx: {"wall": tok/s, "cpu": tok/s}}, "prefill": {len: ...}} for one setting."""
    m = Model.load(path, threads=threads)
    room = m.max_seq_len - mode["steps"] - 1
    contexts = [c for c in mode["contexts"] if c <= room]
    lengths = [n for n in mode["prefill"] if n <= room]
    ids = np.random.default_rng(0).integers(4, min(16000, m.vocab_size), size=room + mode["steps"])
    m.prefill(ids[:min(64, room)])                   # warm-up (first touch, tuner's first samples)
    m.reset()
    res = {"decode": {}, "prefill": {}, "kv_storage": getattr(m.engine, "kv_storage", "float32"),
           "chunk": getattr(m.engine, "chunk", 64)}
    nthreads = 1 if threads == 1 else None
    for n in lengths:
        best_w = best_c = float("inf")
        for _ in range(mode["prefill_rounds"]):
            m.reset()
            c0, w0 = time.process_time(), time.perf_counter()
            m.prefill(ids[:n])
            best_w = min(best_w, time.perf_counter() - w0)
            best_c = min(best_c, time.process_time() - c0)
        res["prefill"][n] = {"wall": n / best_w, "cpu": n / best_c if nthreads else None}
    m.reset()
    pos = 0
    for c in contexts:
        if c > pos:
            m.prefill(ids[pos:c])
            pos = c
        snap = m.snapshot()
        steps = [int(t) for t in ids[c:c + mode["steps"]]]
        best_w = best_c = float("inf")
        for _ in range(mode["rounds"]):
            m.restore(snap)
            c0, w0 = time.process_time(), time.perf_counter()
            for t in steps:
                m.step(t)
            best_w = min(best_w, time.perf_counter() - w0)
            best_c = min(best_c, time.process_time() - c0)
        m.restore(snap)
        res["decode"][c] = {"wall": len(steps) / best_w, "cpu": len(steps) / best_c if nthreads else None}
    if m.thread_tuner is not None:
        res["tuner"] = m.thread_tuner.summary()
    log(f"  {threads} threads: prefill " + ", ".join(f"{n}: {v['wall']:.0f}" for n, v in res["prefill"].items())
        + " | decode " + ", ".join(f"{c}: {v['wall']:.0f}" for c, v in res["decode"].items()) + " tok/s")
    return res


# ---------------------------------------------------------------------------------------
# per-operator profile (perf)

def demangle_cython(sym):
    """``__pyx_f_9needle_cy_4_ops_a8_inplace`` -> ``_ops.a8_inplace`` (other names unchanged)."""
    m = re.match(r"__pyx_[a-z]+_(\d.*)$", sym)
    if not m:
        return sym
    rest, parts = m.group(1), []
    while rest and rest[0].isdigit():                  # "<len><name>" components joined by "_"
        n = re.match(r"\d+", rest).group(0)
        parts.append(rest[len(n):len(n) + int(n)])
        rest = rest[len(n) + int(n):]
        if rest[:1] == "_" and rest[1:2].isdigit():
            rest = rest[1:]
    if not parts or not rest.startswith("_"):
        return sym
    return ".".join(p for p in parts if p != "needle_cy") + "." + rest[1:]


def parse_perf_report(text):
    """[(percent, symbol)] from `perf report --no-children --sort symbol --stdio`."""
    rows = []
    for line in text.splitlines():
        m = re.match(r"^\s*([\d.]+)%\s+(\[[.k]\])\s+(\S.*)$", line)
        if m:
            sym = demangle_cython(re.split(r"\s{2,}", m.group(3).strip())[0])   # drop IPC columns
            rows.append((float(m.group(1)), ("[k] " if m.group(2) == "[k]" else "") + sym))
    return rows


def group_operators(rows):
    """{operator class: percent} (classes of OPERATOR_CLASSES, then "other")."""
    out = {name: 0.0 for name, _ in OPERATOR_CLASSES}
    out["other"] = 0.0
    for pct, sym in rows:
        for name, pattern in OPERATOR_CLASSES:
            if re.search(pattern, sym):
                out[name] += pct
                break
        else:
            out["other"] += pct
    return out


def run_perf(kind, bits, n, reps, archive, log):
    """Profile one run of profile_model.py; None (with the reason logged) where perf fails."""
    from shutil import which
    if which("perf") is None:
        log("  perf not found: per-operator breakdown skipped")
        return None
    with tempfile.TemporaryDirectory() as tmp:
        ctl, ack, data = Path(tmp) / "perf.ctl", Path(tmp) / "perf.ack", Path(tmp) / "perf.data"
        os.mkfifo(ctl)
        os.mkfifo(ack)
        env = dict(os.environ, PERF_CTL=str(ctl), PERF_CTL_ACK=str(ack), NEEDLE_CY_THREADS="1")
        cmd = ["perf", "record", "-F", "2000", "-o", str(data), "--control", f"fifo:{ctl},{ack}", "-D", "-1",
               "--", sys.executable, str(HERE / "profile_model.py"), kind, str(bits), str(n), str(reps), str(archive)]
        rec = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if rec.returncode != 0 or not data.exists():
            log(f"  perf record failed ({rec.returncode}): {rec.stderr.strip()[-300:]}")
            return None
        rep = subprocess.run(["perf", "report", "-i", str(data), "--no-children", "--sort", "symbol", "--stdio"],
                             capture_output=True, text=True, timeout=300)
        rows = parse_perf_report(rep.stdout)
        if not rows:
            log(f"  perf report gave no rows: {rep.stderr.strip()[-300:]}")
            return None
        speed = [line for line in rec.stdout.splitlines() if "tok/s" in line]
        return {"rows": rows, "groups": group_operators(rows), "speed": speed[-1] if speed else ""}


# ---------------------------------------------------------------------------------------
# pytest-benchmark suites

SUITES = {
    # name: (file, extra pytest args for full, for quick, environment)
    "grammar": ("bench_grammar.py", ["-k", "not cold"], ["-k", "not cold and not llguidance and (16k or compile)"], {}),
    "tokenizer": ("bench_tokenizer.py", [], [], {"NEEDLE_CY_BENCH_MB": "2"}),
    "agent": ("bench_agent.py", [], [], {}),
}


def run_suite(name, quick, log):
    """pytest-benchmark JSON of one suite, or None."""
    file, full_args, quick_args, env_extra = SUITES[name]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / f"{name}.json"
        env = dict(os.environ, NEEDLE_CY_THREADS="1", **env_extra)
        if quick:
            env["NEEDLE_CY_BENCH_MB"] = "0.5"
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(HERE), env.get("PYTHONPATH", "")])
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE / file),
               f"--benchmark-json={out}", "--benchmark-timer=time.process_time",
               "--benchmark-min-time=0.02" if quick else "--benchmark-min-time=0.05",
               "--benchmark-max-time=0.3" if quick else "--benchmark-max-time=1.0"]
        cmd += quick_args if quick else full_args
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=env, cwd=str(REPO), capture_output=True, text=True, timeout=3600)
        log(f"  {name}: pytest exit {proc.returncode} in {time.perf_counter() - t0:.0f} s")
        if not out.exists():
            log("  " + (proc.stdout + proc.stderr).strip()[-500:])
            return None
        data = json.loads(out.read_text())
        data["_exit"] = proc.returncode
        data["_summary"] = [ln for ln in proc.stdout.splitlines() if re.search(r"\d+ (passed|failed|skipped)", ln)][-1:]
        return data


def _fmt_time(s):
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def _fmt_value(v):
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_fmt_value(x) for x in v[:4]) + (", …" if len(v) > 4 else "") + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_fmt_value(x)}" for k, x in list(v.items())[:4]) + "}"
    return str(v)


def suite_table(data):
    lines = ["| benchmark | min | median | rounds | extra |", "|---|---:|---:|---:|---|"]
    for b in data.get("benchmarks", []):
        st = b["stats"]
        extra = "; ".join(f"{k} {_fmt_value(v)}" for k, v in list(b.get("extra_info", {}).items())[:5])
        lines.append(f"| `{b['name']}` | {_fmt_time(st['min'])} | {_fmt_time(st['median'])} | {st['rounds']} | "
                     f"{extra.replace('|', '/')} |")
    return lines


# ---------------------------------------------------------------------------------------
# plots

def plot_all(out_dir, speeds, rooflines, profiles):
    """Write the PNGs; returns their file names, or None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    files = []
    bits_list = sorted(speeds)
    for kind, xlabel in (("decode", "context (tokens before the step)"), ("prefill", "prompt length (tokens)")):
        fig, axes = plt.subplots(1, len(bits_list), figsize=(4.2 * len(bits_list), 3.2), squeeze=False)
        for ax, bits in zip(axes[0], bits_list):
            for thr, res in speeds[bits].items():
                xs = sorted(res[kind])
                line, = ax.plot(xs, [res[kind][x]["wall"] for x in xs], marker="o", ms=3, label=f"{thr} thr")
                if all(res[kind][x].get("cpu") for x in xs):
                    ax.plot(xs, [res[kind][x]["cpu"] for x in xs], marker=".", ms=3, ls=":",
                            color=line.get_color(), label=f"{thr} thr, CPU time")
                roof = rooflines[bits][thr][kind]
                ax.plot(xs, [roof[x]["tok_s"] for x in xs], ls="--", lw=1, color=line.get_color())
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_title(f"{kind}, {bits}-bit (dashed: roofline)", fontsize=9)
            ax.set_xlabel(xlabel, fontsize=8)
            ax.set_ylabel("tokens/s", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(True, which="both", lw=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        name = f"{kind}_tok_s.png"
        fig.savefig(out_dir / name, dpi=80)
        plt.close(fig)
        files.append(name)
    fig, axes = plt.subplots(1, 2, figsize=(8.4, 3.2))
    for ax, kind in zip(axes, ("decode", "prefill")):
        for bits in bits_list:
            for thr, res in speeds[bits].items():
                xs = sorted(res[kind])
                ax.plot(xs, [100 * res[kind][x]["wall"] / rooflines[bits][thr][kind][x]["tok_s"] for x in xs],
                        marker="o", ms=3, label=f"{bits}-bit {thr} thr")
        ax.set_xscale("log")
        ax.set_title(f"{kind}: % of roofline", fontsize=9)
        ax.set_ylim(0, 100)
        ax.tick_params(labelsize=7)
        ax.grid(True, lw=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out_dir / "roofline_share.png", dpi=80)
    plt.close(fig)
    files.append("roofline_share.png")
    if profiles:
        labels = list(profiles)
        classes = [c for c, _ in OPERATOR_CLASSES] + ["other"]
        fig, ax = plt.subplots(figsize=(8.4, 0.5 + 0.45 * len(labels)))
        left = np.zeros(len(labels))
        colors = plt.get_cmap("tab20").colors
        for i, cls in enumerate(classes):
            vals = np.array([profiles[lb]["groups"].get(cls, 0.0) for lb in labels])
            if vals.sum() == 0:
                continue
            ax.barh(labels, vals, left=left, label=cls.split(" (")[0], color=colors[i % len(colors)])
            left += vals
        ax.set_xlabel("% of CPU samples", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.35 if len(labels) > 1 else -0.6))
        fig.tight_layout()
        fig.savefig(out_dir / "operators.png", dpi=80, bbox_inches="tight")
        plt.close(fig)
        files.append("operators.png")
    return files


# ---------------------------------------------------------------------------------------
# the report

def _g(x, unit=1e9):
    return f"{x / unit:,.1f}"


def rooflines_for(cost, roof, threads, kind_points, chunk):
    """Roofline tok/s per point of one setting: decode min(bandwidth, compute) and prefill compute."""
    t = 1 if threads == 1 else max(k for k in roof["fma"])
    bw, fma, i8 = roof["DRAM"][t], roof["fma"][t], roof["int8"][t]
    out = {"decode": {}, "prefill": {}}
    for c in kind_points["decode"]:
        dc = decode_cost(cost, c)
        mem, comp = bw / dc["bytes"], fma / dc["macs"]
        out["decode"][c] = {"tok_s": min(mem, comp), "bound": "DRAM" if mem <= comp else "FMA",
                            "bw_tok_s": mem, "fma_tok_s": comp, "int8_tok_s": i8 / dc["macs"],
                            "bytes": dc["bytes"], "macs": dc["macs"]}
    for n in kind_points["prefill"]:
        macs = prefill_macs_per_token(dict(cost, chunk=chunk), n)
        out["prefill"][n] = {"tok_s": fma / macs, "bound": "FMA", "bw_tok_s": None, "fma_tok_s": fma / macs,
                             "int8_tok_s": i8 / macs, "macs": macs}
    return out


def build_report(args, log=print):
    mode = dict(MODES[args.mode])
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    load0 = load_average()
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    commit = git_commit()                              # the code measured: before anything else runs
    ext_dir, grammar_c = extension_origin()
    cpu = cpu_info()
    cls = isa_class(cpu["flags"])
    kern = kernel_choice()
    n_all = max(1, cpu["physical"]) if _parallel.openmp_enabled() else 1
    threads_list = [t if t == "auto" else int(t) for t in args.threads.split(",")]
    if not _parallel.openmp_enabled():
        threads_list = [1]

    log("roofline probes ...")
    roof = measure_roofline(cpu, n_all, mode["probe_s"], mode["dram_mb"])

    archives = {}
    if args.archive:
        for spec in args.archive:
            bits, _, path = spec.partition("=")
            archives[int(bits)] = Path(path)
    else:
        from bench_model import archive_path
        for bits in (int(b) for b in args.bits.split(",")):
            log(f"archive {bits}-bit ...")
            archives[bits] = archive_path(bits)

    speeds, costs, rooflines = {}, {}, {}
    for bits, path in sorted(archives.items()):
        log(f"model {bits}-bit ({path.name}) ...")
        speeds[bits] = {}
        for thr in threads_list:
            speeds[bits][thr] = measure_model(path, thr, mode, log)
        first = next(iter(speeds[bits].values()))
        costs[bits] = cost_model(path, kv_storage=first["kv_storage"], chunk=first["chunk"])
        rooflines[bits] = {}
        for thr, res in speeds[bits].items():
            points = {"decode": list(res["decode"]), "prefill": list(res["prefill"])}
            rooflines[bits][thr] = rooflines_for(costs[bits], roof, thr, points, res["chunk"])

    profiles = {}
    if not args.no_perf:
        log("per-operator profiles (perf) ...")
        for bits, path in sorted(archives.items()):
            for kind, n, reps in mode["perf"]:
                label = f"{bits}-bit {kind} " + (f"after {n}" if kind == "decode" else f"{n} tokens")
                prof = run_perf(kind, bits, n, reps, path, log)
                if prof:
                    profiles[label] = prof

    suites = {}
    for name in ([] if args.suites == "none" else args.suites.split(",")):
        log(f"suite {name} ...")
        suites[name] = run_suite(name, args.mode != "full", log)

    load1 = load_average()
    elapsed = time.perf_counter() - t_start
    plots = plot_all(out_dir, speeds, rooflines, profiles) if not args.no_plots else None

    L = []
    w = L.append
    w("# needle_cy benchmark report")
    w("")
    w(f"Generated by `python benchmarks/report.py{' --' + args.mode if args.mode != 'full' else ''}` on {started} "
      f"(commit {commit}), {elapsed / 60:.1f} min.  Load average (1/5/15 min) "
      f"{load0[0]:.2f} / {load0[1]:.2f} / {load0[2]:.2f} at the start, "
      f"{load1[0]:.2f} / {load1[1]:.2f} / {load1[2]:.2f} at the end"
      f"{' — **a shared machine: wall-clock figures include other tenants**' if max(load0[0], load1[0]) > 0.5 else ''}.")
    w("")
    w(f"**CPU class: {cls}.  CQ kernel: `{kern['a8']}` for A8 inputs (deploy numerics), `{kern['float']}` "
      f"for float inputs" + (f" (forced: NEEDLE_CY_CQ_KERNEL={kern['forced']})" if kern["forced"] else "")
      + ".**  Figures of another CPU class or kernel do not compare with these.")
    w("")
    if plots is None:
        w("*Plots skipped: matplotlib is not installed (`pip install \".[bench]\"`)." if not args.no_plots
          else "*Plots skipped (--no-plots).*")
        if not args.no_plots:
            L[-1] += "*"
        w("")
    # machine ------------------------------------------------------------------------
    w("## Machine")
    w("")
    w("| | |")
    w("|---|---|")
    w(f"| CPU | {cpu['model']} ({cpu.get('Architecture', platform.machine())}"
      + (f", family {cpu['CPU family']} model {cpu['Model']}" if "CPU family" in cpu else "")
      + (f", {cpu['Hypervisor vendor']} guest" if "Hypervisor vendor" in cpu else "") + ") |")
    w(f"| cores | {cpu['physical']} physical, {cpu['logical']} logical |")
    w(f"| caches | {', '.join(f'{k.split()[0]} {v}' for k, v in cpu['caches'].items()) or '?'} |")
    w(f"| CPU class | {cls} |")
    w(f"| kernel-relevant flags | {' '.join(cpu['flags']) or '(none found)'} |")
    w(f"| CQ kernels available | {', '.join(_cq.available_kernels())} |")
    w(f"| CQ kernel chosen | `{_cq.kernel_name(a8=True)}` for A8 inputs (deploy numerics), "
      f"`{_cq.kernel_name(a8=False)}` for float inputs |")
    same_tree = ext_dir == (REPO / "needle_cy").resolve()
    w(f"| compiled modules | `{ext_dir}`" + ("" if same_tree else " — **not this checkout's build**")
      + "; grammar runtime: " + ("C (`needle_cy.grammar._runtime`)" if grammar_c
                                  else "**pure-Python fallback (the extension is not built)**") + " |")
    w(f"| OpenMP | {'yes' if _parallel.openmp_enabled() else 'no (single-threaded build)'}, "
      f"GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT', '?')}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')} |")
    w(f"| software | Python {platform.python_version()}, NumPy {np.__version__}, {platform.system()} {platform.release()} |")
    w("")
    # roofline -----------------------------------------------------------------------
    counts = sorted(roof["fma"])
    w("## Roofline (measured in this run)")
    w("")
    w("Native probes in `needle_cy._roofline` (built with the engine's flags): compute loops of one "
      "instruction on independent accumulators, and a read of a buffer of the given size summed as "
      "64-bit words, each thread its own share.  Figures are per CPU-second of each thread "
      "(an idle core's rate); the wall-clock compute figures beside them show what this run got.")
    w("")
    w("| ceiling | instruction / buffer | " + " | ".join(f"{t} thread{'s' if t > 1 else ''}" for t in counts) + " |")
    w("|---|---|" + "---:|" * len(counts))
    for kind, label in (("fma", "float32 FMA"), ("int8", "int8 dot product"), ("int16", "int16 dot product")):
        w(f"| {label}, GMAC/s (wall) | {roof['isa'][kind]} | "
          + " | ".join(f"{_g(roof[kind][t])} ({_g(roof[kind + '_wall'][t])})" for t in counts) + " |")
    for level in ("L2", "L3", "DRAM"):
        size = roof["sizes"][level]
        what = f"{size / 2**20:.2f} MiB" + (" per thread" if level == "L2" else " in all")
        w(f"| {level} read, GB/s | {what} | " + " | ".join(_g(roof[level][t]) for t in counts) + " |")
    w("")
    w("One MAC = one product added into an accumulator lane.  The engine's exact integer CQ kernels "
      "multiply int16 codes by int16 activations (two int16 products per weight at 2–4 bits), so "
      "their ceiling is about the int16 figure / 2 — the same as the float32 FMA peak on this "
      "kind of core; an 8-bit scheme would have the int8 figure.")
    w("")
    # cost model ---------------------------------------------------------------------
    w("## Cost per token (from the archives)")
    w("")
    w("Bytes: every CQ record a token reads in full (q/k/v/gate/out per layer, the mHC Φ, the engram "
      "key/value projections, the tied head's rows), as packed in the file with group norms, plus the "
      "KV cache read by attention; engram tables and the embedding are lookups (a few rows) and left out, "
      "as are the float32 copies (norms, Monarch factors, probe heads: under 1 MB).  MACs: rows × columns "
      "of the same records plus attention (H·(dq+dv) per visible key; sliding-window layers see at most "
      f"`sliding_window` keys).  Prefill computes the head once per chunk.")
    w("")
    w("| archive | CQ weights read per token | of which head | KV per visible key (all layers: per layer × layers) "
      "| MACs per token (body + head) |")
    w("|---|---:|---:|---:|---:|")
    for bits, c in sorted(costs.items()):
        cfg = c["config"]
        w(f"| {bits}-bit, {cfg.num_layers} layers, d {cfg.d_model}, vocab {cfg.vocab} | "
          f"{(c['weight_bytes'] + c['head_bytes']) / 1e6:.2f} MB | {c['head_bytes'] / 1e6:.2f} MB | "
          f"{c['kv_slot_bytes']} B | {(c['body_macs'] + c['head_macs']) / 1e6:.1f} M |")
    w("")
    # speeds -------------------------------------------------------------------------
    w("## Tokens/s against context length")
    w("")
    w(f"Decode: {mode['steps']} `step` calls after a prompt of the given length (state restored from a "
      f"snapshot before each round), best of {mode['rounds']}; prefill: a prompt of the given length on a "
      f"fresh state, best of {mode['prefill_rounds']}.  Wall clock; `cpu` = tokens per CPU-second "
      "(1 thread only).  Rooflines in tok/s at the thread count's bandwidth and peaks (auto: all cores): "
      "DRAM = read bandwidth / bytes per token (decode only: prefill reads each matrix once per chunk), "
      "FMA = float32 FMA peak / MACs per token (the engine's exact int16 kernels have the same ceiling), "
      "int8 = int8 dot-product peak / MACs per token (what an 8-bit kernel could reach).  The share is of "
      "the lower of DRAM and FMA; `% of roofline, cpu tok/s` is the same for the CPU-time figure, which is "
      "the one that holds on a loaded machine.")
    w("")
    w(f"CPU class {cls}; CQ kernel `{kern['a8']}` (A8 inputs), `{kern['float']}` (float inputs).")
    w("")
    if plots:
        w("![decode tokens/s](decode_tok_s.png)")
        w("")
        w("![prefill tokens/s](prefill_tok_s.png)")
        w("")
        w("![share of the roofline](roofline_share.png)")
        w("")
    for kind in ("decode", "prefill"):
        head = "context" if kind == "decode" else "prompt"
        w(f"### {kind.capitalize()}")
        w("")
        w(f"| width | threads | {head} | tok/s | cpu tok/s | DRAM roofline | FMA roofline | int8 roofline "
          f"| % of roofline (min) | % of roofline, cpu tok/s | % of int8 roofline |")
        w("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for bits in sorted(speeds):
            for thr, res in speeds[bits].items():
                for x, v in sorted(res[kind].items()):
                    r = rooflines[bits][thr][kind][x]
                    cpu_s = f"{v['cpu']:,.1f}" if v.get("cpu") else "–"
                    cpu_share = f"{100 * v['cpu'] / r['tok_s']:.1f} %" if v.get("cpu") else "–"
                    bw = f"{r['bw_tok_s']:,.0f}" if r["bw_tok_s"] else "–"
                    w(f"| {bits}-bit | {thr} | {x} | {v['wall']:,.1f} | {cpu_s} | {bw} | {r['fma_tok_s']:,.0f} | "
                      f"{r['int8_tok_s']:,.0f} | {100 * v['wall'] / r['tok_s']:.1f} % ({r['bound']}) | {cpu_share} | "
                      f"{100 * v['wall'] / r['int8_tok_s']:.1f} % |")
        w("")
    tuners = [(bits, res["tuner"]) for bits in speeds for thr, res in speeds[bits].items() if res.get("tuner")]
    for bits, summary in tuners:
        w(f"Thread tuner after the {bits}-bit auto run: `{summary}`")
        w("")
    # operators ----------------------------------------------------------------------
    w("## Per-operator breakdown")
    w("")
    if not profiles:
        w("*Skipped* (" + ("--no-perf" if args.no_perf else "perf unavailable or failed; see the log") + ").  "
          "By hand: the command in `benchmarks/profile_model.py`'s docstring.")
        w("")
    else:
        w("`perf record -F 2000` around the timed loop of `benchmarks/profile_model.py` only (1 thread; "
          "model load and context prefill left out), samples grouped by symbol into operator classes.  "
          "Each operator's share of the measured tok/s is its share of the time.")
        w("")
        if plots:
            w("![per-operator breakdown](operators.png)")
            w("")
        classes = [c for c, _ in OPERATOR_CLASSES] + ["other"]
        labels = list(profiles)
        w("| operator class | " + " | ".join(labels) + " |")
        w("|---|" + "---:|" * len(labels))
        for cls in classes:
            vals = [profiles[lb]["groups"].get(cls, 0.0) for lb in labels]
            if any(v >= 0.05 for v in vals):
                w(f"| {cls} | " + " | ".join(f"{v:.1f} %" for v in vals) + " |")
        w("| measured | " + " | ".join(profiles[lb]["speed"].split(": ", 1)[-1] for lb in labels) + " |")
        w("")
        w("Top symbols:")
        w("")
        for lb in labels:
            top = ", ".join(f"`{s}` {p:.1f} %" for p, s in profiles[lb]["rows"][:8])
            w(f"* {lb}: {top}")
        w("")
    # suites -------------------------------------------------------------------------
    w("## Grammar, tokenizer and agent suites")
    w("")
    if not suites:
        w("*Not run* (`--suites none`).")
        w("")
    for name, data in suites.items():
        file = SUITES[name][0]
        w(f"### {name} (`benchmarks/{file}`)")
        w("")
        if data is None:
            w("*Failed to produce results; see the log.*")
            w("")
            continue
        mi = data.get("machine_info", {})
        w(f"pytest-benchmark {data.get('version', '?')}, timer `time.process_time` (CPU time, 1 thread), "
          f"{' '.join(data.get('_summary', []))}, exit {data['_exit']}; "
          f"Python {mi.get('python_version', '?')}.")
        w("")
        L.extend(suite_table(data))
        w("")
    w("Earlier measurements, each dated and with its CPU named: `benchmarks/history/`. Figures of "
      "AVX-512 CPUs and of CPUs with AVX2 and no AVX-512 measure different kernels and do not compare.")
    report = out_dir / "REPORT.md"
    report.write_text("\n".join(L) + "\n")
    raw = {"machine": {"cpu": cpu["model"], "isa_class": cls, "flags": cpu["flags"],
                       "kernels_available": _cq.available_kernels(), "kernel": kern},
           "roofline": {k: v for k, v in roof.items()}, "speeds": speeds,
           "rooflines": rooflines, "profiles": {k: v["groups"] for k, v in profiles.items()}}
    (out_dir / "report.json").write_text(json.dumps(raw, indent=1, default=str))
    log(f"wrote {report} ({elapsed / 60:.1f} min)")
    return report


def replot(out_dir):
    """Redraw the PNGs from a run's report.json (no measuring): for a change of plot style."""
    raw = json.loads((Path(out_dir) / "report.json").read_text())

    def keys(d, depth):
        if depth == 0 or not isinstance(d, dict):
            return d
        conv = {}
        for k, v in d.items():
            kk = int(k) if k.lstrip("-").isdigit() else k
            conv[kk] = keys(v, depth - 1)
        return conv
    speeds = keys(raw["speeds"], 4)           # bits -> threads -> kind -> point
    rooflines = keys(raw["rooflines"], 4)
    profiles = {label: {"groups": groups} for label, groups in raw["profiles"].items()}
    return plot_all(Path(out_dir), speeds, rooflines, profiles)


def main(argv=None):
    p = argparse.ArgumentParser(description="Run every benchmark and write a Markdown report with plots "
                                            f"(default folder: {DEFAULT_OUT.relative_to(REPO)}/, untracked).")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--quick", dest="mode", action="store_const", const="quick", help="a few minutes")
    g.add_argument("--tiny", dest="mode", action="store_const", const="tiny", help="seconds (tests)")
    p.set_defaults(mode="full")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--out", default=None,
                     help=f"output folder (default {DEFAULT_OUT.relative_to(REPO)}, which git ignores)")
    out.add_argument("--update-committed", action="store_true",
                     help="write the committed report, benchmarks/report/ (tracked files)")
    p.add_argument("--bits", default="2,4", help="widths of the random full-size archives")
    p.add_argument("--archive", action="append", metavar="BITS=PATH", help="use this archive (repeatable)")
    p.add_argument("--threads", default="1,2,auto", help="thread settings (numbers or auto)")
    p.add_argument("--suites", default="grammar,tokenizer,agent", help="pytest-benchmark suites, or none")
    p.add_argument("--no-perf", action="store_true", help="skip the perf per-operator profiles")
    p.add_argument("--no-plots", action="store_true", help="Markdown only")
    p.add_argument("--replot", action="store_true", help="only redraw the PNGs from --out's report.json")
    args = p.parse_args(argv)
    args.out = str(COMMITTED_OUT if args.update_committed else args.out or DEFAULT_OUT)
    if args.replot:
        print(replot(args.out) or "matplotlib is not installed")
        return
    build_report(args, log=lambda s: print(s, flush=True))


if __name__ == "__main__":
    main()
