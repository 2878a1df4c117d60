"""Thread policies side by side: fixed 1 and 2 threads under each OpenMP wait policy and the
automatic choice (needle_cy.threads.ThreadTuner), each in fresh processes, interleaved.

    python benchmarks/thread_policy.py ROUNDS [ARCHIVE] [--hogs N]   (default archive: the
        2-bit full-size random archive bench_model.py writes under $TMPDIR/needle_cy_bench/;
        --hogs N keeps N busy-loop processes running beside it: a loaded machine)

Each process loads the model, prefills 256 tokens and decodes 96 steps; the medians over
ROUNDS are printed with the tuner's own figures.  Wait policies are environment settings
read when OpenMP starts, hence one process per setting.
"""
import subprocess, sys, json, os
CODE = r'''
import sys, time, json
import numpy as np
from needle_cy.model import Model
thr = sys.argv[1]; path = sys.argv[2]
m = Model.load(path, threads=None if thr == "auto" else int(thr))
ids = np.random.default_rng(0).integers(4, min(16000, m.vocab_size), size=400)
m.prefill(ids[:16]); m.reset()
t0 = time.perf_counter(); m.prefill(ids[:256]); tp = time.perf_counter() - t0
t0 = time.perf_counter()
for i in range(96): m.step(int(ids[256 + i]))
td = time.perf_counter() - t0
print(json.dumps({"prefill": 256 / tp, "decode": 96 / td,
                  "tuner": m.thread_tuner.summary() if m.thread_tuner else None}))
'''
configs = {
    "1 thread": ("1", {}),
    "2 passive": ("2", {"OMP_WAIT_POLICY": "passive"}),
    "2 spin20k": ("2", {"GOMP_SPINCOUNT": "20000"}),
    "2 active": ("2", {"OMP_WAIT_POLICY": "active"}),
    "auto spin20k": ("auto", {"GOMP_SPINCOUNT": "20000"}),
}
import tempfile
args = sys.argv[1:]
hogs = 0
if "--hogs" in args:
    i = args.index("--hogs")
    hogs = int(args[i + 1])
    del args[i:i + 2]
path = args[1] if len(args) > 1 else os.path.join(tempfile.gettempdir(), "needle_cy_bench", "full2.cact")
hog_procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(hogs)]
res = {k: [] for k in configs}
try:
    for r in range(int(args[0])):
        for name, (thr, env) in configs.items():
            e = dict(os.environ)
            for var in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "NEEDLE_CY_THREADS"):
                e.pop(var, None)
            e.update(env)
            out = subprocess.run([sys.executable, "-c", CODE, thr, path], env=e, capture_output=True, text=True)
            try:
                res[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
            except Exception:
                print(out.stderr[-2000:])
                raise
finally:
    for h in hog_procs:
        h.kill()
for name, rows in res.items():
    p = sorted(x["prefill"] for x in rows); d = sorted(x["decode"] for x in rows)
    print(f"{name:14s} prefill256 median {p[len(p)//2]:.0f} tok/s  decode median {d[len(d)//2]:.1f} tok/s  (decode {', '.join(f'{x:.0f}' for x in d)})", rows[-1]["tuner"] or "")
