"""Structured extraction: a record schema becomes the single tool of a one-turn agent.

    python examples/extraction.py [--model model.cact]
"""
import argparse
import json

from needle_cy import extract

CONTACT = {
    "title": "contact",
    "description": "A person's contact details mentioned in the text.",
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 60},
        "phone": {"type": "string", "pattern": "^[0-9 +()-]{6,20}$"},
        "city": {"type": "string", "maxLength": 40},
    },
    "required": ["name"],
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None)
    parser.add_argument("--backend", default="cython", choices=["cython", "numpy"])
    parser.add_argument("text", nargs="?", default="Call Ada Lovelace on +44 20 7946 0958, she lives in London.")
    args = parser.parse_args()
    record = extract(args.text, CONTACT, model=args.model, backend=args.backend, max_new_tokens=80)
    print(json.dumps(record, indent=2) if record is not None else "(nothing extracted)")

    try:  # the same with a pydantic model, when pydantic is installed
        from pydantic import BaseModel
    except ImportError:
        return

    class Contact(BaseModel):
        """A person's contact details mentioned in the text."""
        name: str
        city: str = ""

    print(repr(extract(args.text, Contact, model=args.model, backend=args.backend, max_new_tokens=80)))


if __name__ == "__main__":
    main()
