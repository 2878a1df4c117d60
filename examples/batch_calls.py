"""call-me-maybe style batch: function definitions + prompts → every call of each prompt.

    python examples/batch_calls.py [--model model.cact] [--functions-definition F.json]

Without ``--functions-definition`` the embedded model's smart-home catalogue is used (the
tools it was trained on).  Each record keeps the call-me-maybe fields (``prompt``, and the
``name`` and ``parameters`` of the first call) and adds ``calls`` (all of them) and
``held_back`` (calls the agent did not make: low confidence or a negated request).

The same with the CLI:
    needle-cy batch --functions-definition functions.json --input prompts.json --output out.json
"""
import argparse
import json
import tempfile
from pathlib import Path

from needle_cy import Needle
from needle_cy.cli import batch_record, load_tools

PROMPTS = [{"prompt": "dim the kitchen to 30 and lock the front door"},
           {"prompt": "add tahini to the shopping list"},
           {"prompt": "set a timer for ten minutes"},
           {"prompt": "don't open the garage"}]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None)
    parser.add_argument("--functions-definition", default=None,
                        help="call-me-maybe function definitions (default: the embedded catalogue)")
    parser.add_argument("--backend", default="cython", choices=["cython", "numpy"])
    args = parser.parse_args()

    agent = Needle(args.model, tools=load_tools(args.functions_definition), backend=args.backend,
                   max_new_tokens=96)
    rows = []
    for item in PROMPTS:
        agent.reset()                       # every prompt is its own conversation
        rows.append(batch_record(item["prompt"], agent.complete(item["prompt"])))
    for row in rows:
        calls = "; ".join(f"{c['name']}({json.dumps(c['parameters'])})" for c in row["calls"]) or "(no call)"
        held = "".join(f"  [held back, {h['reason']}: {h['name']}]" for h in row["held_back"])
        print(f"{row['prompt']!r}: {calls}{held}")
    out = Path(tempfile.gettempdir()) / "needle_cy_batch_out.json"
    out.write_text(json.dumps(rows, indent=2))
    print(f"records written to {out}")


if __name__ == "__main__":
    main()
