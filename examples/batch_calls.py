"""call-me-maybe style batch: function definitions + prompts → one call per prompt.

    python examples/batch_calls.py [--model model.cact]

The same with the CLI:
    needle-cy batch --functions-definition functions.json --input prompts.json --output out.json
"""
import argparse
import json
import tempfile
from pathlib import Path

from needle_cy import Needle

FUNCTIONS = [
    {"name": "fn_add_numbers", "description": "Add two numbers together and return their sum.",
     "parameters": {"a": {"type": "number"}, "b": {"type": "number"}}, "returns": {"type": "number"}},
    {"name": "fn_greet", "description": "Generate a greeting message for a person by name.",
     "parameters": {"name": {"type": "string"}}, "returns": {"type": "string"}},
    {"name": "fn_reverse_string", "description": "Reverse a string and return the reversed result.",
     "parameters": {"s": {"type": "string"}}, "returns": {"type": "string"}},
]
PROMPTS = [{"prompt": "What is the sum of 2 and 3?"}, {"prompt": "Greet shrek"},
           {"prompt": "Reverse the string 'hello'"}]


def as_tool(fn):
    """call-me-maybe's typed parameter map → a JSON-Schema tool (every parameter required)."""
    return {"name": fn["name"], "description": fn["description"],
            "parameters": {"type": "object", "properties": fn["parameters"],
                           "required": list(fn["parameters"])}}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None)
    parser.add_argument("--backend", default="cython", choices=["cython", "numpy"])
    args = parser.parse_args()

    agent = Needle(args.model, tools=[as_tool(f) for f in FUNCTIONS], backend=args.backend,
                   max_calls_per_turn=1, max_new_tokens=64)
    rows = []
    for item in PROMPTS:
        agent.reset()                       # every prompt is its own conversation
        r = agent.complete(item["prompt"])
        call = r["function_calls"][0] if r["function_calls"] else None
        rows.append({"prompt": item["prompt"], "name": call and call["name"],
                     "parameters": call["arguments"] if call else {}})
    out = Path(tempfile.gettempdir()) / "needle_cy_batch_out.json"
    out.write_text(json.dumps(rows, indent=2))
    print(json.dumps(rows, indent=2))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
