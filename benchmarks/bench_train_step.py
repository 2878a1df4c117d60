"""Training throughput, side by side: the official JAX step (train.py's ``fit``) and the
PyTorch step (torch_train's ``fit``) on the shipped configuration.

    python benchmarks/bench_train_step.py [--shapes 4x512,8x256] [--precisions fp32,bf16]
        [--threads 1,2] [--trainers jax,torch] [--log-every 3] [--windows 3] [--out results.jsonl]

Each measurement runs in its own process (thread settings cannot change inside one):
pinned to ``threads`` CPUs with ``taskset``, ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` set,
XLA's Eigen pool limited to one thread for ``threads=1``, ``torch.set_num_threads``.  Both
trainers run their real loop (``Batches``, loss, AdamW, clipping, LR schedule) on a
synthetic run folder of full-length sequences (every position is a token, so tokens per
step = batch x length), with ``log_every`` steps per log window; the first window
(JIT compile / first-step warm-up) is dropped and the others are reported.

Figures: ``tok/s`` = tokens / wall time; ``tok/CPU-s`` = tokens / process CPU time (all
threads).  On a shared machine the wall figure depends on what else runs; the CPU
figure does not count time the process was waiting for a core, which is why both are
reported (with more than one thread it includes threads' busy waiting too).

Precision: ``fp32`` is float32 everywhere; ``bf16`` is the official model's
``dtype="bfloat16"`` for JAX and ``torch.autocast(bfloat16)`` for PyTorch.
Needs jax + cactus-needle[train] for the JAX side and torch for the PyTorch side.
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def make_run(path, batch, length, precision, trainer, log_every, steps):
    import numpy as np

    from needle_cy.training.train import HYPER, MODEL_CONFIG

    path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    n = batch * (steps + 2)
    seqs = rng.integers(4, HYPER["vocab_size"], size=(n, length)).astype(np.int32)
    seqs[:, 0], seqs[:, -1] = 2, 1
    np.savez(path / "tokens.npz", ids=seqs.reshape(-1), offsets=np.arange(n + 1, dtype=np.int64) * length,
             prompt_lens=np.full(n, length // 4, np.int32))
    model = dict(MODEL_CONFIG)
    if trainer == "jax" and precision == "bf16":
        model["dtype"] = "bfloat16"
    hyper = dict(HYPER, buckets=[length], tokens_per_batch=batch * length, log_every=log_every,
                 checkpoint_every=10 ** 9, total_steps=10 ** 6, decay_steps=10)
    (path / "run.json").write_text(json.dumps({"model": model, "hyper": hyper}))
    return path


def worker(args):
    """One measurement in this process; prints one JSON line."""
    from needle_cy.training import train

    steps = args.log_every * args.windows
    with tempfile.TemporaryDirectory() as tmp:
        run = make_run(Path(tmp) / "run", args.batch, args.length, args.precision, args.trainer,
                       args.log_every, steps)
        marks = []
        original = train._log

        def mark(run_dir, record):
            t = os.times()
            if "step" in record and "loss" in record:
                marks.append((time.perf_counter(), t.user + t.system, record["tokens"], record["loss"]))

        train._log = mark
        try:
            if args.trainer == "jax":
                train.fit(str(run), steps=steps)
            else:
                from needle_cy.training import torch_train
                torch_train._log = mark
                torch_train.fit(str(run), steps=steps, precision=args.precision, threads=args.threads)
        finally:
            train._log = original
    rows = []
    for (w0, c0, k0, _), (w1, c1, k1, _) in zip(marks, marks[1:]):
        rows.append(((k1 - k0) / (w1 - w0), (k1 - k0) / max(c1 - c0, 1e-9)))
    wall = sorted(r[0] for r in rows)
    cpu = sorted(r[1] for r in rows)
    print(json.dumps({"trainer": args.trainer, "batch": args.batch, "length": args.length,
                      "precision": args.precision, "threads": args.threads,
                      "tok_s": round(wall[len(wall) // 2], 1), "tok_cpu_s": round(cpu[len(cpu) // 2], 1),
                      "windows": [[round(a, 1), round(b, 1)] for a, b in rows],
                      "losses": [m[3] for m in marks]}), flush=True)


def machine():
    info = {"python": platform.python_version(), "loadavg_start": os.getloadavg()}
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in lscpu.splitlines():
            if line.startswith(("Model name", "CPU(s):", "Vendor ID")):
                key, _, value = line.partition(":")
                info[key.strip()] = value.strip()
            if line.startswith("Flags"):
                flags = set(line.split(":", 1)[1].split())
                info["flags"] = sorted(f for f in flags if f.startswith(("avx512", "amx", "avx2", "fma")))
    except OSError:
        pass
    for mod in ("torch", "jax", "needle"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - only a report field
            info[mod] = None
    return info


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4x512,8x256")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--trainers", default="jax,torch")
    ap.add_argument("--log-every", type=int, default=3)
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--out", default=None, help="append JSON lines here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--trainer", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--length", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--precision", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        args.threads = int(args.threads)
        return worker(args)
    info = machine()
    print(json.dumps({"machine": info}), flush=True)
    out = open(args.out, "a") if args.out else None
    if out:
        out.write(json.dumps({"machine": info, "time": time.strftime("%Y-%m-%d %H:%M:%S")}) + "\n")
    results = []
    for shape in args.shapes.split(","):
        batch, length = (int(x) for x in shape.split("x"))
        for precision in args.precisions.split(","):
            for threads in (int(t) for t in args.threads.split(",")):
                for trainer in args.trainers.split(","):          # the two trainers back to back
                    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
                               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
                    if threads == 1:
                        env["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
                    cpus = ",".join(str(i) for i in range(threads))
                    cmd = ["taskset", "-c", cpus, sys.executable, __file__, "--worker", "--trainer", trainer,
                           "--batch", str(batch), "--length", str(length), "--precision", precision,
                           "--threads", str(threads), "--log-every", str(args.log_every),
                           "--windows", str(args.windows)]
                    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
                    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("{")), None)
                    if proc.returncode or line is None:
                        row = {"trainer": trainer, "batch": batch, "length": length, "precision": precision,
                               "threads": threads, "error": proc.stderr[-800:]}
                    else:
                        row = json.loads(line)
                    row["loadavg"] = os.getloadavg()
                    results.append(row)
                    print(json.dumps(row), flush=True)
                    if out:
                        out.write(json.dumps(row) + "\n")
                        out.flush()
    print("\n| shape | precision | threads | JAX tok/s | torch tok/s | JAX tok/CPU-s | torch tok/CPU-s |")
    print("|---|---|---|---|---|---|---|")
    key = {}
    for r in results:
        key[(r["batch"], r["length"], r["precision"], r["threads"], r["trainer"])] = r
    for (b, t, p, th) in sorted({k[:4] for k in key}):
        j, q = key.get((b, t, p, th, "jax"), {}), key.get((b, t, p, th, "torch"), {})
        print(f"| {b}x{t} | {p} | {th} | {j.get('tok_s', '-')} | {q.get('tok_s', '-')} | "
              f"{j.get('tok_cpu_s', '-')} | {q.get('tok_cpu_s', '-')} |")


if __name__ == "__main__":
    sys.exit(main())
