"""Agent latency: time to the calls and whole-turn latency, split by phase.

    python benchmarks/bench_agent.py [--full] [--backend cython|numpy] [--turns 3]
    pytest benchmarks/bench_agent.py --benchmark-min-time=0.05      # pytest-benchmark

Archives: the tiny_a fixture, and with ``--full`` (or NEEDLE_CY_BENCH_FULL=1 under pytest)
the full-size random archive from ``needle_cy.testing.make_random_archive`` (20 layers,
d = 768, vocab 16384; written once to NEEDLE_CY_BENCH_ARCHIVE, default in the temp dir).
Tool sets: the first 5 smart-home tools, and all 20 (rendered in full, and retrieved down
to the default 5).

Random weights rarely write ``<tool_call>`` by themselves, so the benchmark turns use
``force_call=True`` with a short reasoning cap: every turn then runs the same phases as a
real one — prefill, greedy reasoning, constrained decoding — on realistic token counts.

Columns: cold = first turn of a conversation (includes prefilling the BOS+system+tools
prefix once); warm = after ``reset()`` (the prefix comes from the snapshot cache).
"to 1st call" = start of the turn until the first ``toolcall_end`` event (the first call is
known and could be executed);
"turn" = until ``done``; "turn CPU" = process CPU time of the turn (all threads), which
is steadier than wall time on a shared machine.  prefill / reasoning / constrained are the engine phases, and
"grammar" is the part of constrained decoding spent in ``Grammar.best_allowed``.
"""
import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(os.environ.get("NEEDLE_CY_FIXTURES", REPO.parent / "shared" / "fixtures"))
SHARED = FIXTURES.parent
TINY = FIXTURES / "needle3_tiny_a" / "model.cact"
FULL = Path(os.environ.get("NEEDLE_CY_BENCH_ARCHIVE",
                           Path(tempfile.gettempdir()) / "needle_cy_bench_full.cact"))
QUERIES = ["turn on the kitchen light and set the heating to 21 degrees",
           "lock the front door", "play some jazz in the living room"]


def home_tools():
    with open(SHARED / "eval" / "home_tools.json", encoding="utf-8") as f:
        return json.load(f)


def full_archive():
    if not FULL.exists():
        from needle_cy.testing.make_random_archive import make_random_archive
        print(f"writing the full-size random archive to {FULL} (once) ...", file=sys.stderr)
        make_random_archive(str(FULL), tokenizer_from=str(TINY))
    return FULL


def pick_backend(requested=None):
    if requested:
        return requested
    try:
        from needle_cy import _model  # noqa: F401
        return "cython"
    except ImportError:
        return "numpy"


class WritesCalls:
    """Model proxy: random weights would close the call array at once (``[]``); a large
    negative logit on "]" for the first call token makes them write a call instead, so
    the constrained phase runs on realistic token counts.  Pieces with a backslash are
    pushed down (a trained model rarely writes escapes; the grammar currently dead-ends on
    some of them).  The cost of each step is unchanged; everything else passes through."""

    def __init__(self, model, tokenizer):
        import numpy as np
        self._model = model
        self._tool_call = tokenizer.marker_id("<tool_call>")
        table = tokenizer.piece_table(size=model.out_vocab)
        self._close = np.array([i for i, p in enumerate(table) if p and p.lstrip(b"[").startswith(b"]")])
        # JSON escapes lead the current grammar into dead ends (reported); keep them away.
        self._escape = np.array([i for i, p in enumerate(table) if p and b"\\" in p])
        self._last = None

    def __getattr__(self, name):
        return getattr(self._model, name)

    def _fix(self, logits, fed):
        recent = ([self._last] if self._last is not None else []) + [int(t) for t in fed]
        self._last = recent[-1]
        if len(self._escape):
            logits = logits.copy()
            logits[self._escape] -= 30.0
        if self._tool_call in recent[-2:] and len(self._close):
            logits = logits.copy()
            logits[self._close] = -1e9
        return logits

    def prefill(self, ids):
        ids = list(ids)
        return self._fix(self._model.prefill(ids), ids)

    def step(self, token):
        return self._fix(self._model.step(token), [token])


def make_agent(path, n_tools, backend, render_all, max_new_tokens=192, reasoning_limit=8):
    from needle_cy import Needle
    tools = home_tools()[:n_tools]
    agent = Needle(str(path), tools=tools, backend=backend, force_call=True,
                   reasoning_limit=reasoning_limit, max_new_tokens=max_new_tokens,
                   retrieval="bm25", max_retrieved_tools=None if render_all else 5,
                   string_token_cap=16, max_calls_per_turn=2)
    agent.model = WritesCalls(agent.model, agent.tokenizer)
    return agent


def measure_turn(agent, query):
    c0 = time.process_time()
    t0 = time.perf_counter()
    to_calls = None
    response = None
    for event in agent.stream(query):
        if event["type"] == "toolcall_end" and to_calls is None:
            to_calls = time.perf_counter() - t0
        elif event["type"] in ("done", "error"):
            response = event["response"]
    total = time.perf_counter() - t0
    cpu = time.process_time() - c0
    if response["error_code"] == "ContextOverflowError":
        return {"overflow": response["error"]}
    t = response.get("timings", {})
    return {"to_calls": to_calls if to_calls is not None else float("nan"), "turn": total, "cpu": cpu,
            "prefill": t.get("prefill_s", 0.0) + t.get("prefix_s", 0.0),
            "reasoning": t.get("reasoning_s", 0.0), "constrained": t.get("constrained_s", 0.0),
            "grammar": t.get("grammar_s", 0.0), "n_prefill": t.get("n_prefill", 0),
            "n_prefix": len(agent._prefixes[tuple(response["tools"])].conversation.prefix_ids)
            if response.get("tools") else 0,
            "n_constrained": t.get("n_constrained", 0), "ok": response["success"]}


def run_suite(path, backend, turns=3):
    rows = []
    for label, n_tools, render_all in (("5 tools", 5, True), ("20 tools, all rendered", 20, True),
                                       ("20 tools, retrieve 5", 20, False)):
        agent = make_agent(path, n_tools, backend, render_all)
        cold = measure_turn(agent, QUERIES[0])
        if "overflow" in cold:
            rows.append((label, cold, []))
            continue
        warm = []
        for i in range(turns):
            agent.reset()
            warm.append(measure_turn(agent, QUERIES[i % len(QUERIES)]))
        rows.append((label, cold, warm))
    return rows


def _mean(rows, key):
    vals = [r[key] for r in rows if r[key] == r[key]]      # NaN (no calls) left out
    return sum(vals) / len(vals) if vals else float("nan")


def format_table(name, backend, rows):
    lines = [f"### {name} (backend={backend})", "",
             "| tools | prefix tok | cold to 1st call s | cold turn s | warm to 1st call s | warm turn s "
             "| warm turn CPU s "
             "| warm prefill s | reasoning s | constrained s | call tok | grammar s | grammar / constrained | ok |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, cold, warm in rows:
        if "overflow" in cold:
            lines.append(f"| {label} | does not fit the context: {cold['overflow'][:90]} |")
            continue
        c = _mean(warm, "constrained")
        g = _mean(warm, "grammar")
        lines.append(
            f"| {label} | {cold['n_prefix']} | {cold['to_calls']:.3f} | {cold['turn']:.3f} | "
            f"{_mean(warm, 'to_calls'):.3f} | {_mean(warm, 'turn'):.3f} | {_mean(warm, 'cpu'):.3f} | "
            f"{_mean(warm, 'prefill'):.3f} | "
            f"{_mean(warm, 'reasoning'):.3f} | {c:.3f} | {_mean(warm, 'n_constrained'):.0f} | {g:.4f} | "
            f"{100 * g / c if c else 0:.1f}% | {sum(w['ok'] for w in warm + [cold])}/{len(warm) + 1} |")
    return "\n".join(lines)


# ------------------------------------------------------------------ pytest-benchmark

def _bench(benchmark, path, n_tools, render_all):
    pytest = __import__("pytest")
    if not Path(path).exists():
        pytest.skip(f"archive missing: {path}")
    agent = make_agent(path, n_tools, pick_backend(), render_all)
    measure_turn(agent, QUERIES[0])           # prefix snapshot built outside the timing

    def turn():
        agent.reset()
        return measure_turn(agent, QUERIES[1])
    if "overflow" in measure_turn(agent, QUERIES[1]):
        pytest.skip("the prompt does not fit this archive's context")
    stats = benchmark.pedantic(turn, rounds=3, iterations=1)
    benchmark.extra_info.update({k: v for k, v in stats.items() if isinstance(v, (int, float))})


def test_turn_tiny_5_tools(benchmark):
    _bench(benchmark, TINY, 5, True)


def test_turn_tiny_20_tools(benchmark):
    _bench(benchmark, TINY, 20, True)


def test_turn_full_5_tools(benchmark):
    if not os.environ.get("NEEDLE_CY_BENCH_FULL"):
        __import__("pytest").skip("set NEEDLE_CY_BENCH_FULL=1 for the full-size archive")
    _bench(benchmark, full_archive(), 5, True)


def test_turn_full_20_tools(benchmark):
    if not os.environ.get("NEEDLE_CY_BENCH_FULL"):
        __import__("pytest").skip("set NEEDLE_CY_BENCH_FULL=1 for the full-size archive")
    _bench(benchmark, full_archive(), 20, True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["cython", "numpy"], default=None)
    parser.add_argument("--full", action="store_true", help="also the full-size random archive")
    parser.add_argument("--turns", type=int, default=3)
    args = parser.parse_args(argv)
    backend = pick_backend(args.backend)
    print(format_table("tiny_a fixture (d=64, 4 layers)", backend, run_suite(TINY, backend, args.turns)))
    if args.full:
        print()
        print(format_table("full-size random archive (d=768, 20 layers, vocab 16384)", backend,
                           run_suite(full_archive(), backend, args.turns)))


if __name__ == "__main__":
    main()
