"""xgrammar, measured on the inputs of bench_grammar.py (a separate run and process).

xgrammar's wheel needs torch, which is not a dependency of this project, so it runs from
a side environment in two steps:

    # 1. export the 16k vocabulary, the token streams of the first 40 dev calls and the
    #    tool-set schemas exactly as bench_grammar.py builds them (project venv)
    python benchmarks/peer_xgrammar.py --export /tmp/xgrammar_inputs.json
    # 2. measure with xgrammar (any environment where `import xgrammar` works)
    /tmp/xgv/bin/python benchmarks/peer_xgrammar.py /tmp/xgrammar_inputs.json

Measured (2 compiler threads: the benchmark machine's cores): compile_json_schema for the 20-tool call schema and for 5-tool subsets (cache
disabled, so every compile is new; and with the cache, the same set again), and per step
`fill_next_token_bitmask` + `accept_token` while following the reference tokens (the
same loop bench_grammar.py times for llguidance).  Compact JSON: no whitespace, ","/":".
"""
import json
import sys
import time


def export(path):
    import random
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_grammar as B
    sp, table = B._vocab("16k")
    tools = json.loads(B.TOOLS_PATH.read_text())
    streams = [ids for ids in (B._encode(sp, table, text) for text in B._calls()[:40]) if ids is not None]
    rng = random.Random(0)
    subsets = [B._calls_schema(rng.sample(tools, 5)) for _ in range(20)]
    data = {"vocab": [(p or b"").hex() for p in table], "eos": sp.eos_id() if sp.eos_id() >= 0 else 0,
            "streams": streams, "schema20": B._calls_schema(tools), "schemas5": subsets}
    Path(path).write_text(json.dumps(data))
    print(f"wrote {path}: vocab {len(table)}, {len(streams)} calls, {sum(map(len, streams))} tokens")


def measure(path, threads=2):
    import numpy as np
    import xgrammar as xgr
    data = json.loads(open(path).read())
    vocab = [bytes.fromhex(h) for h in data["vocab"]]
    info = xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, vocab_size=len(vocab), stop_token_ids=[data["eos"]])
    # strict_mode=True (xgrammar's default) refuses properties a schema does not list even
    # without additionalProperties: false - a smaller language than JSON Schema's, and the
    # one xgrammar users get; strict_mode=False is JSON Schema's meaning (measured once)
    opts = dict(any_whitespace=False, separators=(",", ":"), strict_mode=True)

    def timed(fn, rounds):
        ts = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        ts = np.asarray(ts) * 1e3
        return f"median {np.median(ts):.2f} ms, min {ts.min():.2f} ms, mean {ts.mean():.2f} ms ({rounds} rounds)"

    fresh = xgr.GrammarCompiler(info, max_threads=threads, cache_enabled=False)
    s20 = json.dumps(data["schema20"])
    fresh.compile_json_schema(s20, **opts)                      # warm the library itself
    print(f"xgrammar compile, 20-tool set, no cache: {timed(lambda: fresh.compile_json_schema(s20, **opts), 20)}")
    loose = dict(opts, strict_mode=False)
    print(f"xgrammar compile, 20-tool set, no cache, strict_mode=False: "
          f"{timed(lambda: fresh.compile_json_schema(s20, **loose), 5)}")
    subs = [json.dumps(s) for s in data["schemas5"]]
    it = iter(range(10 ** 9))
    print(f"xgrammar compile, 5-tool subsets, no cache: "
          f"{timed(lambda: fresh.compile_json_schema(subs[next(it) % len(subs)], **opts), 40)}")
    cached = xgr.GrammarCompiler(info, max_threads=threads, cache_enabled=True)
    cached.compile_json_schema(s20, **opts)
    print(f"xgrammar compile, same 20-tool set again (its cache): "
          f"{timed(lambda: cached.compile_json_schema(s20, **opts), 50)}")

    compiled = cached.compile_json_schema(s20, **opts)
    bitmask = xgr.allocate_token_bitmask(1, len(vocab))

    def run():
        steps = []
        for ids in data["streams"]:
            m = xgr.GrammarMatcher(compiled)
            for ref in ids:
                t0 = time.perf_counter_ns()
                m.fill_next_token_bitmask(bitmask, 0)
                ok = m.accept_token(ref)
                steps.append((time.perf_counter_ns() - t0) * 1e-9)
                if not ok:
                    raise AssertionError("xgrammar refused a reference token")
        return np.asarray(steps)

    runs = [run() for _ in range(3)]
    steps = np.min(np.stack(runs), axis=0)       # best of 3 per step, as bench_grammar.py
    print(f"xgrammar per step (mask + accept), vocab {len(vocab)}, {len(steps)} steps, best-of-3 per step: "
          f"mean {steps.mean() * 1e6:.1f} us, p50 {np.median(steps) * 1e6:.1f} us, "
          f"p99 {np.percentile(steps, 99) * 1e6:.1f} us | single run mean {runs[0].mean() * 1e6:.1f} us, "
          f"p99 {np.percentile(runs[0], 99) * 1e6:.1f} us")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--export":
        export(sys.argv[2])
    elif len(sys.argv) == 2:
        measure(sys.argv[1])
    else:
        sys.exit(__doc__)
