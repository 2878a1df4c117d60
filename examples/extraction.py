"""Structured extraction: a record schema becomes the single tool of a one-turn agent.

    python examples/extraction.py [--model model.cact] ["tell the kids dinner is ready"]

With the embedded default model (trained on smart-home requests) records close to what it
knows work: the item of a shopping request, the message and recipient of a note for the
household (the record's title is the tool name the model sees).  ``extract`` returns
``None`` when the model declines.
"""
import argparse
import json

from needle_cy import extract

SHOPPING_ITEM = {
    "title": "add_to_shopping_list",
    "description": "Add an item to the shared shopping list",
    "type": "object",
    "properties": {
        "item": {"type": "string", "minLength": 1, "maxLength": 60},
        "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
    },
    "required": ["item"],
}

NOTE = {
    "title": "send_notification",
    "description": "A message to send to the phones of people in the household",
    "type": "object",
    "properties": {
        "message": {"type": "string", "minLength": 1, "maxLength": 200},
        "recipient": {"type": "string", "enum": ["everyone", "me", "partner", "kids"]},
    },
    "required": ["message"],
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None)
    parser.add_argument("--backend", default="cython", choices=["cython", "numpy"])
    parser.add_argument("text", nargs="?", default=None)
    args = parser.parse_args()
    cases = ([(args.text, NOTE)] if args.text else
             [("put two cartons of oat milk on the list", SHOPPING_ITEM),
              ("tell the kids dinner is ready", NOTE)])
    for text, schema in cases:
        record = extract(text, schema, model=args.model, backend=args.backend, max_new_tokens=80)
        print(f"{text!r} -> {schema['title']}: "
              + (json.dumps(record) if record is not None else "(nothing extracted)"))

    try:  # the same with a pydantic model, when pydantic is installed
        from pydantic import BaseModel, ConfigDict
    except ImportError:
        return

    class ShoppingItem(BaseModel):
        """Add an item to the shared shopping list"""
        model_config = ConfigDict(title="add_to_shopping_list")    # the tool's name
        item: str

    text = "add oat milk to the shopping list"
    print(f"{text!r} -> {extract(text, ShoppingItem, model=args.model, backend=args.backend, max_new_tokens=80)!r}")


if __name__ == "__main__":
    main()
