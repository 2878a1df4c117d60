"""The tool corpus the schema-general generator draws catalogues from.

``../shared/data/tool_corpus/`` holds 4,621 openly licensed tool definitions (Home
Assistant services, BFCL function docs, the Needle v1 pools, DroidCall, API-Bank; see its
``README.md`` and ``LICENSES.md``).  It is reference data: read here at training time,
never copied into the package.

Two things are decided here, once, so every user of the corpus agrees:

* **What is held out from training.**  The evaluation set ``unseen_dev.jsonl`` measures
  tools of ten domains no model of ours has seen (electric car, greenhouse, 3D printer,
  hotel room, phone, navigation, office, pet care, baking, travel).  Every corpus tool
  whose name, description or domain belongs to one of them is removed
  (``HELD_OUT_DOMAINS``: word patterns per domain), so that set keeps measuring tools
  never seen.
* **A per-tool split** of what remains: a stable hash of (source, name, parameters)
  puts about one tool in ten into ``"heldout"``, the project's own fresh held-out set
  (``python -m needle_cy.training.corpus`` prints the counts).

Only tools the generator can phrase are kept (``usable``): an object-typed root, a name
and description, at most eight properties, and a rendered size the 512-token rows can
carry.
"""
import hashlib
import json
import os
import re
from pathlib import Path

CORPUS_ENV = "NEEDLE_CY_TOOL_CORPUS"
DEFAULT_CORPUS = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "tool_corpus"
CORPUS_FILES = ("home_assistant.jsonl", "bfcl.jsonl", "needle_v1_pools.jsonl",
                "droidcall.jsonl", "api_bank.jsonl")

# The domains of ../shared/eval/unseen_dev.jsonl (its README's table), as word patterns
# matched against a tool's name words, description and corpus domain.  Broad on purpose:
# a tool near one of these domains is removed rather than risk training on it.
HELD_OUT_DOMAINS = {
    "electric car": r"\b(car|cars|vehicle|vehicles|ev|tesla|charger|charging|charge limit|wallbox|"
                    r"cabin|precondition\w*|driving range|battery range)\b",
    "greenhouse": r"\b(greenhouse|allotment|garden\w*|plant\w*|soil|seed\w*|sow\w*|mist\w*|"
                  r"irrigat\w*|vent|vents|photoperiod|grow light\w*|watering)\b",
    "3d printer": r"\b(3d|printer\w*|print|prints|printing|filament|nozzle|extruder|fume\w*|"
                  r"extractor|workshop)\b",
    "hotel": r"\b(hotel\w*|housekeeping|room service|wake[ -]?up call|checkout|check-out|"
             r"late check\w*|concierge|minibar|wifi password)\b",
    "phone": r"\b(phone|call|calls|calling|dial\w*|redial\w*|sms|text message\w*|voicemail|"
             r"do not disturb|dnd|contact|contacts)\b",
    "navigation": r"\b(navigat\w*|directions?|route|routes|routing|taxi|cab|ride|rides|uber|"
                  r"lyft|parking|eta|traffic|commute|map|maps|destination)\b",
    "office": r"\b(office|desk|meeting room\w*|conference room\w*|facilities|facility|"
              r"standing desk|book(ing)? (a )?room|free rooms?)\b",
    "pet": r"\b(pet|pets|cat|cats|dog|dogs|kitten|puppy|feeder|treat\w*|groom\w*|walk reminder|"
           r"litter|vet)\b",
    "baking": r"\b(bak\w*|cook\w*|recipe\w*|ingredient\w*|kitchen timer|servings?|"
              r"substitut\w*|convert units|unit conversion|oven|cups?|tablespoons?|grams)\b",
    "travel": r"\b(travel\w*|trip|trips|flight\w*|airline\w*|airport\w*|baggage|luggage|"
              r"packing|pack list|currency|exchange rate|passport|boarding|visa)\b",
}
_HELD_OUT = {k: re.compile(v, re.I) for k, v in HELD_OUT_DOMAINS.items()}
# corpus domains removed whole (the Needle v1 vehicle pool, Home Assistant's car, phone
# and printer integrations among them: their names alone may not say so)
HELD_OUT_CORPUS_DOMAINS = {"vehicle", "navigation", "travel", "messaging", "communication",
                           "tesla_fleet", "teslemetry", "tessie", "octoprint", "prusalink",
                           "cookidoo", "mealie", "sms", "twilio_sms", "twilio_call",
                           "android_intent", "android_app"}
HELDOUT_SHARE = 10          # one tool in this many goes to the project's own held-out split
MAX_PROPERTIES = 8
MAX_RENDERED_CHARS = 700


def corpus_dir(path=None):
    path = Path(path or os.environ.get(CORPUS_ENV) or DEFAULT_CORPUS)
    if not (path / "README.md").exists():
        raise FileNotFoundError(f"tool corpus not found at {path} (set {CORPUS_ENV})")
    return path


def name_words(name):
    """'set_chargeLimit.v2' -> ['set', 'charge', 'limit', 'v2']."""
    name = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1 \2", name)
    return [w.lower() for w in re.split(r"[^A-Za-z0-9]+", name) if w]


def held_out_domain(tool):
    """The unseen_dev domain a tool belongs to, or None."""
    if str(tool.get("domain", "")).lower() in HELD_OUT_CORPUS_DOMAINS:
        return "corpus domain " + str(tool.get("domain"))
    text = " ".join([" ".join(name_words(tool["name"])), tool.get("description", ""),
                     str(tool.get("domain", "")).replace("_", " ")])
    for domain, pattern in _HELD_OUT.items():
        if pattern.search(text):
            return domain
    return None


def tool_key(tool):
    canon = json.dumps([tool.get("source"), tool["name"], tool["parameters"]], sort_keys=True)
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()


def split_of(tool):
    """"train" or "heldout", a pure function of the tool."""
    return "heldout" if int(tool_key(tool)[:8], 16) % HELDOUT_SHARE == 0 else "train"


def usable(tool):
    params = tool.get("parameters")
    if not isinstance(params, dict) or params.get("type") != "object":
        return False
    props = params.get("properties", {})
    if not tool.get("description") or len(props) > MAX_PROPERTIES:
        return False
    rendered = json.dumps({"name": tool["name"], "description": tool["description"],
                           "parameters": params}, separators=(",", ":"))
    return len(rendered) <= MAX_RENDERED_CHARS


def schema_tool(tool):
    """The {name, description, parameters} a user would declare."""
    return {"name": tool["name"], "description": tool["description"], "parameters": tool["parameters"]}


def load(split="train", path=None):
    """Usable corpus tools of ``split`` ("train", "heldout" or "all"), held-out domains
    removed, each with its corpus ``source`` and ``domain``."""
    if split not in ("train", "heldout", "all"):
        raise ValueError(f"split must be 'train', 'heldout' or 'all', got {split!r}")
    root = corpus_dir(path)
    out = []
    for name in CORPUS_FILES:
        with open(root / name, encoding="utf-8") as handle:
            for line in handle:
                tool = json.loads(line)
                if not usable(tool) or held_out_domain(tool):
                    continue
                if split == "all" or split_of(tool) == split:
                    out.append(tool)
    return out


def main(argv=None):
    import argparse
    import collections

    parser = argparse.ArgumentParser(prog="python -m needle_cy.training.corpus",
                                     description="Counts of the tool corpus splits.")
    parser.add_argument("--corpus")
    args = parser.parse_args(argv)
    root = corpus_dir(args.corpus)
    counts = collections.Counter()
    for name in CORPUS_FILES:
        with open(root / name, encoding="utf-8") as handle:
            for line in handle:
                tool = json.loads(line)
                if not usable(tool):
                    counts[(tool["source"], "unusable")] += 1
                elif held_out_domain(tool):
                    counts[(tool["source"], "held-out domain")] += 1
                else:
                    counts[(tool["source"], split_of(tool))] += 1
    for (source, what), n in sorted(counts.items()):
        print(f"{source:<16} {what:<16} {n:>5}")


if __name__ == "__main__":
    main()
