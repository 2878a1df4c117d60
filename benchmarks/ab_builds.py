"""Two (or more) builds of needle_cy side by side: interleaved fresh processes, medians.

On a shared VM whose speed drifts by ±20 % from minute to minute, a ratio between two
builds means something only when their runs alternate.  Each tree is a checkout with
its extensions built in place (``python setup.py build_ext --inplace``), for example a
``git worktree`` of the commit before a change:

    git worktree add /tmp/before HEAD~3 && (cd /tmp/before && python setup.py build_ext --inplace -j 2)
    python benchmarks/ab_builds.py before=/tmp/before after=. --bits 2 --threads 2 --context 64
    python benchmarks/ab_builds.py before=/tmp/before after=. --mode prefill --context 600

Every run is a fresh process importing that tree's needle_cy (``PYTHONPATH``); runs go
tree by tree in turn, ``--runs`` times.  A run is the best of ``--rounds`` rounds:
decode = 16 ``step`` calls after a ``--context``-token prompt (the state restored from a
snapshot before each round), prefill = a ``--context``-token prompt on a fresh state.
The archive is bench_model.py's random full-size model at ``--bits``.  ``--threads``:
a count or ``auto`` (the default policy, a ThreadTuner).  Prints each tree's median,
maximum and every run, and the ratio of each median to the first tree's.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
STEPS = 16


def child(args):
    """One measurement in this process (the tree is on PYTHONPATH); prints tok/s."""
    sys.path.insert(0, str(HERE))
    import numpy as np
    from bench_model import archive_path
    from needle_cy.model import Model

    threads = None if args.threads == "auto" else int(args.threads)
    m = Model.load(archive_path(args.bits), backend="cython", threads=threads)
    ids = np.random.default_rng(0).integers(4, min(16000, m.vocab_size), size=args.context + STEPS)
    best = float("inf")
    if args.mode == "decode":
        m.prefill(ids[:args.context])
        snap = m.snapshot()
        for _ in range(args.rounds):
            m.restore(snap)
            t0 = time.perf_counter()
            for t in ids[args.context:]:
                m.step(int(t))
            best = min(best, time.perf_counter() - t0)
        print(f"{STEPS / best:.2f}")
    else:
        for _ in range(args.rounds):
            m.reset()
            t0 = time.perf_counter()
            m.prefill(ids[:args.context])
            best = min(best, time.perf_counter() - t0)
        print(f"{args.context / best:.2f}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trees", nargs="*", help="NAME=PATH of a checkout with built extensions, "
                    "optionally NAME=PATH,VAR=VALUE,... (environment of that arm: the same tree "
                    "twice with NEEDLE_CY_CQ_AMX=0 and =1 compares a run-time switch)")
    ap.add_argument("--mode", choices=("decode", "prefill"), default="decode")
    ap.add_argument("--bits", type=int, default=2)
    ap.add_argument("--threads", default="2")
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    if len(args.trees) < 1 or any("=" not in t for t in args.trees):
        ap.error("give one or more NAME=PATH trees")
    trees, extra = [], {}
    for t in args.trees:
        name, rest = t.split("=", 1)
        path, *settings = rest.split(",")
        trees.append((name, path))
        extra[name] = dict(kv.split("=", 1) for kv in settings)
    for name, path in trees:
        if not (Path(path) / "needle_cy").is_dir():
            ap.error(f"{name}: {path} has no needle_cy package")
    # the archive once, before the timed runs (bench_model writes it on first use)
    subprocess.run([sys.executable, "-c", f"import sys; sys.path[:0] = [{str(HERE)!r}, {str(HERE.parent)!r}]; "
                    f"from bench_model import archive_path; archive_path({args.bits})"], check=True)
    results = {name: [] for name, _ in trees}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--mode", args.mode, "--bits",
           str(args.bits), "--threads", args.threads, "--context", str(args.context), "--rounds", str(args.rounds)]
    for _ in range(args.runs):
        for name, path in trees:
            env = dict(os.environ, PYTHONPATH=str(Path(path).resolve()), **extra[name])
            out = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"{name}: run failed\n{out.stderr}")
            results[name].append(float(out.stdout.split()[-1]))
    first = statistics.median(results[trees[0][0]])
    print(f"{args.mode}, {args.bits}-bit, threads {args.threads}, context {args.context}: "
          f"tok/s, {args.runs} interleaved runs each (best of {args.rounds} rounds)")
    for name, runs in results.items():
        med = statistics.median(runs)
        print(f"  {name:10s} median {med:8.1f}  max {max(runs):8.1f}  ratio {med / first:5.3f}  "
              f"{[round(r) for r in runs]}")


if __name__ == "__main__":
    main()
