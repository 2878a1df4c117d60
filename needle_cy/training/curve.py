"""The learning curve of a training run: every weight snapshot scored on case sets.

    python -m needle_cy.training.curve RUN --set NAME=cases.jsonl [--set ...]
        [--tools tools.json] [--bits 4] [--limit N] [--out DIR] [--every K] [--components]

A run of ``torch_train`` with ``hyper["snapshot_every"]`` writes ``RUN/snapshots/step_N.pt``
(float16 weights).  Each snapshot not yet in ``DIR/curve.csv`` is exported to a
temporary archive at ``--bits`` and scored with ``needle_cy.eval`` on every named set;
the row (step, tokens seen, the run's logged target cross-entropy near that step, each
set's accuracy and its per-category and refusal figures) is appended to the CSV and
the plot ``DIR/curve.png`` is drawn again (when matplotlib is installed).  Re-running
the command scores only the new snapshots, so it can follow a live run.

The sets are whatever the caller names: a held-out generated set
(``python -m needle_cy.training.mix --eval-cases``), ``../shared/eval/unseen_dev.jsonl``,
``home_dev.jsonl``.  Scores on the evaluation sets are read, never trained or tuned on.
"""
import argparse
import csv
import json
import os
import sys
import tempfile
from pathlib import Path

from .. import eval as evaluation

FIXED = ["step", "tokens", "target_ce", "seconds"]


def snapshots(run_dir):
    """(step, path) of the run's snapshots, oldest first."""
    folder = Path(run_dir) / "snapshots"
    if not folder.is_dir():
        return []
    out = []
    for path in folder.glob("step_*.pt"):
        try:
            out.append((int(path.stem.split("_")[1]), path))
        except (IndexError, ValueError):
            continue
    return sorted(out)


def logged_target_ce(run_dir, step, window=5):
    """Mean ``target_ce`` of the log lines in (step - window·log_every, step]."""
    path = Path(run_dir) / "log.jsonl"
    if not path.exists():
        return None
    rows = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "target_ce" in rec and rec.get("step", -1) <= step:
            rows.append(rec)
    rows = [r for r in rows if r["step"] > step - 5 * window] or rows[-1:]
    if not rows:
        return None
    return round(sum(r["target_ce"] for r in rows) / len(rows), 4)


def score_sets(model_path, sets, tools, limit=None, components=False, tools_per_clause=None):
    """{column: value} for one archive on every named set (``tools_per_clause``: the
    agent's selection, as ``needle_cy.eval`` takes it)."""
    row = {}
    for name, path in sets:
        cases = evaluation.load_cases(path)[:limit] if limit else evaluation.load_cases(path)
        kwargs = {"model": str(model_path), "threads": 1}
        if tools_per_clause is not None:
            kwargs["tools_per_clause"] = tools_per_clause
        if components:
            kwargs["components"] = True
        try:
            records = evaluation.run_cases(cases, tools, **kwargs)
        except TypeError:           # an eval without components
            kwargs.pop("components", None)
            records = evaluation.run_cases(cases, tools, **kwargs)
        summary = evaluation.summarize(records)
        row[f"{name}"] = round(summary["accuracy"], 4)
        for cat, figures in sorted(summary["categories"].items()):
            row[f"{name}:{cat}"] = f"{figures['correct']}/{figures['cases']}"
        if summary.get("refusal_accuracy") is not None:
            row[f"{name}:refusals"] = round(summary["refusal_accuracy"], 4)
        row[f"{name}:schema_valid"] = round(summary["schema_valid"], 4)
        for key, value in (summary.get("components") or {}).items():
            if isinstance(value, (int, float, str)):
                row[f"{name}:{key}"] = value
    return row


def read_rows(csv_path):
    if not csv_path.exists():
        return []
    with open(csv_path, newline="") as handle:
        return list(csv.DictReader(handle))


def write_rows(csv_path, rows):
    columns = list(FIXED)
    for row in rows:
        for key in row:
            if key not in columns:
                columns.append(key)
    tmp = csv_path.with_suffix(".tmp")
    with open(tmp, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        for row in sorted(rows, key=lambda r: int(r["step"])):
            writer.writerow(row)
    os.replace(tmp, csv_path)


def plot(csv_path, png_path, set_names, title=None):
    """Accuracy per set and target cross-entropy against tokens seen; False without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = read_rows(csv_path)
    if not rows:
        return False
    tokens = [int(r["tokens"]) / 1e6 for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name in set_names:
        ys = [float(r[name]) * 100 if r.get(name) not in (None, "") else None for r in rows]
        pts = [(x, y) for x, y in zip(tokens, ys) if y is not None]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=name)
    ax.set_xlabel("tokens seen (M)")
    ax.set_ylabel("exact calls (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ce = [(x, float(r["target_ce"])) for x, r in zip(tokens, rows) if r.get("target_ce") not in (None, "")]
    if ce:
        ax2 = ax.twinx()
        ax2.plot(*zip(*ce), color="grey", linestyle="--", label="target CE")
        ax2.set_ylabel("target cross-entropy (nats)")
        ax2.set_ylim(bottom=0)
    ax.legend(loc="upper left", fontsize=8)
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return True


def update(run_dir, sets, out_dir, tools=None, bits=4, limit=None, every=1, components=False, title=None,
           tools_per_clause=None):
    """Score the snapshots not yet in ``out_dir/curve.csv``; returns the rows added."""
    from .torch_train import export

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / "curve.csv"
    rows = read_rows(csv_path)
    done = {int(r["step"]) for r in rows}
    todo = [(s, p) for i, (s, p) in enumerate(snapshots(run_dir)) if s not in done and i % every == 0]
    added = []
    for step, path in todo:
        import torch
        meta = torch.load(path, map_location="cpu", weights_only=False)
        with tempfile.TemporaryDirectory() as tmp:
            model_path = Path(tmp) / f"step_{step}.cact"
            export(run_dir, model_path, bits=bits, weights=str(path))
            row = {"step": step, "tokens": int(meta["tokens"]), "seconds": round(float(meta["seconds"])),
                   "target_ce": logged_target_ce(run_dir, step)}
            row.update(score_sets(model_path, sets, tools, limit, components, tools_per_clause))
        rows.append(row)
        added.append(row)
        write_rows(csv_path, rows)
        plot(csv_path, out_dir / "curve.png", [n for n, _ in sets], title)
        print(json.dumps(row), flush=True)
    return added


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m needle_cy.training.curve", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="a torch_train run folder with snapshots/")
    parser.add_argument("--set", action="append", required=True, metavar="NAME=CASES.jsonl",
                        help="a case set to score (repeatable)")
    parser.add_argument("--tools", default=str(evaluation.DEFAULT_TOOLS),
                        help="catalogue for cases without their own tools (default: the smart-home one)")
    parser.add_argument("--bits", type=int, default=4, help="export width of the scored archives")
    parser.add_argument("--limit", type=int, help="only the first N cases of each set")
    parser.add_argument("--every", type=int, default=1, help="score every K-th snapshot")
    parser.add_argument("--components", action="store_true", help="also the eval's component figures")
    parser.add_argument("--tools-per-clause", type=int,
                        help="the agent's selection: the best N tools of each clause (0: off, the default)")
    parser.add_argument("--title", help="plot title")
    parser.add_argument("--out", required=True, help="folder of curve.csv and curve.png")
    args = parser.parse_args(argv)
    sets = []
    for item in args.set:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            parser.error(f"--set wants NAME=PATH, got {item!r}")
        if not os.path.exists(path):
            parser.error(f"--set {name}: {path} does not exist")
        sets.append((name, path))
    with open(args.tools) as handle:
        tools = json.load(handle)
    update(args.run_dir, sets, args.out, tools, args.bits, args.limit, args.every, args.components, args.title,
           args.tools_per_clause)
    return 0


if __name__ == "__main__":
    sys.exit(main())
