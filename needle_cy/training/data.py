"""Synthetic training conversations for the smart-home Needle model.

Pure Python and deterministic for a given seed: ``generate(n, seed)`` yields
examples ``{"system", "tools", "query", "reasoning", "answers", "history"}`` and
``render(example)`` turns one into the ``(prompt, target)`` strings of the
Needle training template (spec §7.1; multi-turn per §7.3).

What the model must learn, and where each part comes from:

* the 20-tool catalogue (``needle_cy/models/home_tools.json``) with many
  phrasings per tool — imperative, polite, indirect, typos, numbers as words,
  units — labelled by the argument conventions of the evaluation README
  (enum strings verbatim, blinds open/close/half → 100/0/50, hours → minutes,
  24-hour alarm times, minimal free strings ...);
* multi-call requests (2–3 calls, in the order said, no tool twice);
* refusals (``[]``): chit-chat, general questions, devices, rooms and actions
  that no tool covers, including near misses of catalogue tools;
* the tool rendering the agent uses at inference: a retrieved subset of at
  most five tools, the needed ones plus distractors, in random order;
* invented tools with random names and schemas whose values are copied from
  the request, so the model reads schemas rather than memorising names;
* a follow-up turn after ``<tool_result>`` (answered by ``[]`` or a new call).

The evaluation set in ``../shared/eval`` is never read here; only the catalogue.
"""
import json
import random
import re
from pathlib import Path

CATALOGUE_PATH = Path(__file__).resolve().parent.parent / "models" / "home_tools.json"

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
THINK_START, THINK_END = "<think>", "</think>"
TOOLS_START, TOOLS_END = "<tools>", "</tools>"
CALL_START, CALL_END = "<tool_call>", "</tool_call>"
RESULT_START, RESULT_END = "<tool_result>", "</tool_result>"
CHAT_MARKERS = [
    "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tools>", "</tools>",
    "<tool_call>", "</tool_call>", "<tool_result>", "</tool_result>",
    "<context>", "</context>", "<extract>", "</extract>", "<schema>", "</schema>",
]
MAX_RENDERED_TOOLS = 5
WORDS_PATH = Path(__file__).resolve().parent / "value_words.json"


def load_catalogue(path=None):
    with open(path or CATALOGUE_PATH, encoding="utf-8") as handle:
        return json.load(handle)


def compact(value):
    """The template's JSON: compact separators, UTF-8 kept (spec §7.1)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# ---------------------------------------------------------------- numbers ---

_ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight",
         "nine", "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen",
         "sixteen", "seventeen", "eighteen", "nineteen"]
_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy",
         "eighty", "ninety"]


def number_words(n):
    """English words for 0 <= n < 10000 ("forty-five", "one hundred and five")."""
    if n < 20:
        return _ONES[n]
    if n < 100:
        tens, ones = divmod(n, 10)
        return _TENS[tens] + ("-" + _ONES[ones] if ones else "")
    if n < 1000:
        hundreds, rest = divmod(n, 100)
        head = _ONES[hundreds] + " hundred"
        return head + (" and " + number_words(rest) if rest else "")
    thousands, rest = divmod(n, 1000)
    head = number_words(thousands) + " thousand"
    return head + (" " + number_words(rest) if rest else "")


def say_int(rng, n, words_p=0.3):
    return number_words(n) if rng.random() < words_p else str(n)


def json_number(x):
    """21.0 → 21 (an int), 21.5 stays a float: the label form of a number."""
    return int(x) if float(x).is_integer() else float(x)


# ------------------------------------------------------------- vocabulary ---

ROOMS = ["living room", "kitchen", "bedroom", "bathroom", "office", "hallway",
         "dining room", "kids room", "garage", "garden"]
# How people say a room → the catalogue's enum string.
ROOM_SAYINGS = {
    "living room": ["living room", "living room", "lounge", "living-room", "sitting room"],
    "kitchen": ["kitchen"],
    "bedroom": ["bedroom", "bedroom", "master bedroom"],
    "bathroom": ["bathroom", "bathroom", "bath room"],
    "office": ["office", "office", "study", "home office"],
    "hallway": ["hallway", "hallway", "hall"],
    "dining room": ["dining room", "dining room"],
    "kids room": ["kids room", "kids' room", "kids room", "children's room", "kid's room"],
    "garage": ["garage"],
    "garden": ["garden", "garden"],
}
NOT_ROOMS = ["attic", "basement", "cellar", "porch", "laundry room", "guest room",
             "balcony", "loft", "conservatory", "pantry", "shed", "nursery",
             "utility room", "walk-in closet", "terrace", "gym"]
DOORS = ["front door", "back door", "garage door", "patio door"]
DOOR_SAYINGS = {
    "front door": ["front door", "front door", "main door"],
    "back door": ["back door", "back door", "rear door"],
    "garage door": ["garage door"],
    "patio door": ["patio door", "patio door", "sliding patio door"],
}
NOT_DOORS = ["window", "shed door", "cellar door", "car", "gate", "safe", "mailbox",
             "bedroom window", "cat flap"]
COLORS = ["warm white", "cool white", "red", "orange", "yellow", "green", "blue",
          "purple", "pink"]
NOT_COLORS = ["turquoise", "magenta", "gold", "brown", "teal", "cyan"]
SCENES = ["movie night", "dinner", "good night", "good morning", "away", "party",
          "reading"]
NOT_SCENES = ["romantic", "workout", "gaming", "relax", "study", "christmas"]
SENSORS = ["temperature", "humidity", "air quality", "motion"]
FAN_SPEEDS = ["off", "low", "medium", "high"]
HVAC_MODES = ["heat", "cool", "auto", "eco", "off"]
ZONES = ["front lawn", "back lawn", "vegetable bed", "flower bed"]
NOT_ZONES = ["houseplants", "hedge", "orchard", "window boxes", "greenhouse"]
RECIPIENTS = ["everyone", "me", "partner", "kids"]
DAYS = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
DAY_NAMES = {"mon": "Monday", "tue": "Tuesday", "wed": "Wednesday", "thu": "Thursday",
             "fri": "Friday", "sat": "Saturday", "sun": "Sunday"}

GENRES = ["jazz", "rock", "classical", "blues", "hip hop", "country", "reggae", "pop",
          "techno", "folk", "metal", "soul", "funk", "disco", "lo-fi", "ambient",
          "punk", "opera", "salsa", "k-pop", "indie", "house", "bossa nova", "gospel"]
ARTISTS = ["Miles Davis", "Taylor Swift", "The Beatles", "Adele", "Queen", "Beyonce",
           "Nina Simone", "Coldplay", "Bob Marley", "Daft Punk", "Radiohead", "Drake",
           "Ed Sheeran", "Fleetwood Mac", "ABBA", "Johnny Cash", "Billie Eilish",
           "Frank Sinatra", "Norah Jones", "Pink Floyd", "Dolly Parton", "Bach",
           "Mozart", "Kendrick Lamar", "The Rolling Stones", "Ella Fitzgerald",
           "Arctic Monkeys", "Stevie Wonder", "Lady Gaga", "Bruno Mars", "Metallica",
           "Elton John", "Aretha Franklin", "Chopin", "Vivaldi", "Shakira", "Sade"]
ALBUMS = ["Kind of Blue", "Abbey Road", "Thriller", "Rumours", "Back in Black",
          "Blue Train", "Nevermind", "Random Access Memories", "Dark Side of the Moon",
          "21", "Lemonade", "1989", "Hotel California", "Graceland", "Blue"]
PLAYLIST_NAMES = ["workout", "chill", "party", "road trip", "morning", "dinner party",
                  "focus", "sleep", "summer hits", "throwbacks", "study", "relax",
                  "running", "cooking", "sunday", "rainy day", "dance", "acoustic"]
ITEMS = ["milk", "eggs", "bread", "butter", "apples", "bananas", "coffee", "tea",
         "rice", "pasta", "cheese", "tomatoes", "onions", "potatoes", "chicken",
         "yogurt", "orange juice", "toilet paper", "dish soap", "olive oil", "sugar",
         "flour", "carrots", "lemons", "cereal", "peanut butter", "batteries",
         "paper towels", "shampoo", "toothpaste", "oat milk", "garlic", "salmon",
         "cat food", "dog food", "lettuce", "avocados", "strawberries", "beer",
         "sparkling water", "crisps", "chocolate", "honey", "jam", "ketchup"]
CONTAINERS = ["cartons of", "bottles of", "packs of", "bags of", "boxes of", "jars of",
              "loaves of", "tins of", "cans of", "rolls of"]
MESSAGES = ["dinner is ready", "I'll be home late", "the laundry is done",
            "the package has arrived", "time for bed", "don't forget your keys",
            "the front door is open", "I'm on my way", "lunch is on the table",
            "the movie starts in ten minutes", "please take the bins out",
            "the dishwasher needs emptying", "grandma is coming over at six",
            "we're out of milk", "homework before games", "the car is ready",
            "walk the dog", "meeting ran long", "pizza is here", "call me back",
            "the heating is fixed", "it's raining so bring an umbrella",
            "practice is cancelled today", "I love you", "the plumber is here"]
# Version 4: messages as people type them (contractions, no "that").
MESSAGES_V4 = ["it's bath time", "the taxi's here", "I'm running late", "we're leaving soon",
               "the food's getting cold", "the kettle's on", "tea's ready", "it's your turn to cook",
               "the film's starting", "I've fed the cat", "don't wait up", "we're nearly home",
               "the bins go out tonight", "your lift's outside", "breakfast's on the table"]
# Version 4: what people say before the request (neutral, or a reason fitting the tool).
PREFACES = ["quick one, ", "before I forget, ", "right, ", "ok so ", "hey, ", "one more thing, ",
            "while you're at it, ", "oh and ", "actually, ", "so, "]
REASONS = {
    "set_light": ["it's too dark in here, ", "I can't see a thing, ", "it's way too bright, "],
    "set_thermostat": ["it's chilly, ", "it's cold in here, ", "it's boiling in here, ",
                       "I'm too warm, "],
    "set_hvac_mode": ["it's stuffy in here, ", "I'm cold, "],
    "stop_music": ["I'm on a call, ", "the baby is asleep, "],
    "set_volume": ["I can't hear it, ", "it's too loud, "],
    "stop_vacuum": ["I'm on the phone, ", "the noise is driving me mad, "],
    "lock_door": ["we're going to bed, ", "I'm heading out, "],
    "set_blinds": ["the sun is in my eyes, ", "it's getting dark, "],
    "activate_scene": ["guests are arriving, ", "we're heading out, "],
}
LABELS = ["roast", "eggs", "pasta", "laundry", "tea", "pizza", "bread", "nap",
          "homework", "cake", "rice", "workout", "meditation", "gym", "school",
          "meeting", "medicine", "pickup", "yoga", "work", "flight", "dog walk"]

# ------------------------------------------------------------ generators ---
# Each returns (clause, call, reasoning_bits) where clause is a lower-case
# imperative-ish fragment that can be wrapped ("please ...") or joined with
# another clause, call = {"name", "arguments"} with keys in schema order, and
# reasoning_bits = short notes deriving each argument.


class _VersionedRandom(random.Random):
    """``random.Random`` carrying the data version's knobs.  Version 1 draws through a
    plain ``Random``: its stream (and so the shipped recipe's data) is unchanged."""
    diverse = 0.0
    more_phrasings = False
    vocab_values = False
    wider_requests = False
    phrase_values = False


def _v4(rng, p):
    """Whether to use one of data version 4's extra phrasings (probability ``p``).  The
    draw happens only when the version-4 knob is on, so earlier versions draw nothing
    more and their streams stay byte-identical."""
    return getattr(rng, "more_phrasings", False) and rng.random() < p


def _v5(rng, p):
    """Data version 5's knob, drawn the same way as ``_v4``: more copied strings, words
    from the tokenizer's pieces."""
    return getattr(rng, "vocab_values", False) and rng.random() < p


def _v7(rng, p):
    """Data version 7's knob, drawn the same way as ``_v4``: wider phrasings (the volume
    of "the music", a vacuum "going in" rooms) and refusals that carry argument-like words
    (a time, a label, an item) or close the conversation."""
    return getattr(rng, "wider_requests", False) and rng.random() < p


_WORDS = None


def _value_words():
    global _WORDS
    if _WORDS is None:
        with open(WORDS_PATH, encoding="utf-8") as handle:
            _WORDS = json.load(handle)
    return _WORDS


def _word(rng, words):
    """One open-pool word; with data version 5, 60 % of them come from the tokenizer's
    word pieces (``vocab_words``).  A value's first word is written without the space
    it has in the request ("classical" after ``"query":"``, "▁classical" in "play some
    classical"), so the model must learn each piece's two forms apart: a piece it never
    wrote at a string's start it cannot copy there (the model card's copy probe measured
    it: random vocabulary words were copied far less often than open-pool words).  The pieces
    exclude the generator's own request words: drawn as values, "Please" or "some" made
    the model copy them (an earlier cut of version 5)."""
    if _v5(rng, 0.6):
        return rng.choice(_value_words()["vocab_words"])
    return rng.choice(words)


def _diverse_value(rng, kind):
    """A free-string value from a large open pool (~950 words, 1,690 names; version 5
    adds 1,226 tokenizer word pieces), so that the model can only get it right by
    copying it from the request, never by recalling a short list."""
    w = _value_words()
    words, first, last = w["words"], w["first_names"], w["last_names"]
    if kind == "item":
        return " ".join(_word(rng, words) for _ in range(rng.choice([1, 1, 2])))
    if kind == "message":
        return " ".join(_word(rng, words) for _ in range(rng.randint(2, 6)))
    if kind == "artist":
        return rng.choice(first) + " " + rng.choice(last) if rng.random() < 0.7 else \
            "The " + _word(rng, words).capitalize() + "s"
    if kind == "title":
        return " ".join(_word(rng, words).capitalize() for _ in range(rng.randint(1, 3)))
    return _word(rng, words)          # "label", "genre", "playlist"


def _value(rng, pool, kind):
    """A value for a free-string argument: from ``pool``, or (data version 2, with
    probability ``rng.diverse``) from the open pool."""
    diverse = getattr(rng, "diverse", 0.0)
    if diverse and rng.random() < diverse:
        return _diverse_value(rng, kind)
    return _pick(rng, pool)


def _pick(rng, seq):
    return seq[rng.randrange(len(seq))]


def _room(rng):
    room = _pick(rng, ROOMS)
    return room, _pick(rng, ROOM_SAYINGS[room])


def _the(rng, phrase):
    return ("the " if rng.random() < 0.85 else "") + phrase


def _pct(rng, n):
    unit = _pick(rng, ["%", " percent", " percent", "", " per cent"])
    return say_int(rng, n) + unit


def gen_set_light(rng):
    room, said = _room(rng)
    lights = _pick(rng, ["lights", "light", "lamps", "lighting", "lights"])
    r = rng.random()
    if r >= 0.78 and _v4(rng, 0.45):
        r = rng.random() * 0.44      # version 4: a colour only in ~12 %, not 22 %
    args = {"room": room}
    notes = [f'room = "{room}" from "{said}"']
    if r < 0.22:
        verb = _pick(rng, ["turn on", "switch on", "put on"])
        clause = _pick(rng, [f"{verb} {_the(rng, said)} {lights}",
                             f"{verb} {_the(rng, lights)} in the {said}",
                             f"{verb.split()[0]} the {said} {lights} {verb.split()[1]}",
                             f"lights on in the {said}"])
        if _v4(rng, 0.35):
            clause = _pick(rng, [f"{said} {lights} on", f"can I have the {said} {lights} on",
                                 f"get the {lights} on in the {said}",
                                 f"{lights} on in the {said}"])
        args["on"] = True
        notes.append('on = true from "on"')
    elif r < 0.44:
        verb = _pick(rng, ["turn off", "switch off", "shut off", "kill"])
        clause = _pick(rng, [f"{verb} {_the(rng, said)} {lights}",
                             f"{verb} {_the(rng, lights)} in the {said}",
                             f"lights off in the {said}"])
        if _v4(rng, 0.35):
            clause = _pick(rng, [f"{said} {lights} off", f"get the {lights} off in the {said}",
                                 f"nobody's in the {said}, {lights} off"])
        args["on"] = False
        notes.append('on = false from "off"')
    elif r < 0.66:
        n = rng.choice([5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 60, rng.randint(1, 99)])
        verb = _pick(rng, ["dim", "dim", "lower", "turn down"])
        said_n = _pct(rng, n)
        clause = _pick(rng, [f"{verb} {_the(rng, said)} {lights} to {said_n}",
                             f"{verb} the {said} to {said_n}",
                             f"{verb} the {lights} in the {said} to {said_n}"])
        args["on"] = True
        args["brightness"] = n
        notes += [f'on = true from "{verb}"', f"brightness = {n} from \"{said_n}\""]
    elif r < 0.78:
        n = rng.choice([50, 60, 70, 75, 80, 90, 100, rng.randint(1, 100)])
        if n == 100 and rng.random() < 0.5:
            said_n = "full brightness"
            clause = _pick(rng, [f"{_pick(rng, ['set', 'put', 'turn'])} the {said} {lights} to full brightness",
                                 f"turn the {said} {lights} up to full brightness",
                                 f"{said} {lights} on full brightness"])
            if _v4(rng, 0.5):
                said_n = _pick(rng, ["full brightness", "max brightness", "maximum brightness"])
                clause = _pick(rng, [f"{said} {lights} to {said_n}", f"{said_n} in the {said}",
                                     f"{lights} in the {said} to {said_n}"])
        else:
            said_n = _pct(rng, n)
            verb = _pick(rng, ["brighten", "brighten", "turn up", "raise"])
            clause = _pick(rng, [f"{verb} {_the(rng, said)} {lights} to {said_n}",
                                 f"{verb} the {said} to {said_n}",
                                 f"set the {said} {lights} to {said_n} brightness",
                                 f"set the {said} {lights} to {said_n}"])
            if _v4(rng, 0.3):
                clause = _pick(rng, [f"{said} {lights} to {said_n}", f"{said} {lights} at {said_n}"])
        args["on"] = True
        args["brightness"] = n
        notes += ['on = true (brightness set)', f'brightness = {n} from "{said_n}"']
    else:
        color = _pick(rng, COLORS)
        args["on"] = True
        clause = _pick(rng, [f"turn on the {said} {lights} in {color}",
                             f"switch the {said} {lights} on and make them {color}",
                             f"turn the {said} {lights} on, {color} please",
                             f"put the {lights} on in the {said}, {color}"])
        if rng.random() < 0.35:
            n = rng.choice([30, 40, 50, 60, 80, rng.randint(1, 100)])
            said_n = _pct(rng, n)
            clause += f" at {said_n}"
            args["brightness"] = n
            notes += ['on = true from "on"', f'brightness = {n} from "{said_n}"']
        else:
            notes.append('on = true from "on"')
        args["color"] = color
        notes.append(f'color = "{color}"')
    return clause, {"name": "set_light", "arguments": args}, notes


def _temperature(rng):
    whole = rng.randint(15, 26) if rng.random() < 0.85 else rng.randint(5, 29)
    half = rng.random() < 0.3
    value = whole + (0.5 if half else 0.0)
    if half:
        said = _pick(rng, [f"{whole}.5", f"{whole} and a half", f"{number_words(whole)} and a half",
                           f"{whole}.5"])
    else:
        said = say_int(rng, whole, 0.25)
    unit = _pick(rng, [" degrees", " degrees", "°C", " °C", " degrees celsius", " C", "", " degrees C"])
    return json_number(value), said + unit


def gen_set_thermostat(rng):
    value, said_t = _temperature(rng)
    args = {"temperature": value}
    notes = [f'temperature = {value} from "{said_t}"']
    with_room = rng.random() < 0.45
    if with_room:
        room, said = _room(rng)
        clause = _pick(rng, [f"set the {said} thermostat to {said_t}",
                             f"heat the {said} to {said_t}",
                             f"make it {said_t} in the {said}",
                             f"set the temperature in the {said} to {said_t}",
                             f"set the heating in the {said} to {said_t}",
                             f"warm the {said} up to {said_t}"])
        if _v4(rng, 0.35):
            clause = _pick(rng, [f"set the {said} to {said_t}", f"turn the {said} heating up to {said_t}",
                                 f"{said} to {said_t}", f"get the {said} to {said_t}"])
        args["room"] = room
        notes.append(f'room = "{room}" from "{said}"')
    else:
        clause = _pick(rng, [f"set the thermostat to {said_t}",
                             f"set the heating to {said_t}",
                             f"make it {said_t}",
                             f"change the temperature to {said_t}",
                             f"put the heat up to {said_t}",
                             f"turn the heating down to {said_t}",
                             f"I want it at {said_t}",
                             f"thermostat to {said_t}",
                             f"set the temperature to {said_t}"])
    return clause, {"name": "set_thermostat", "arguments": args}, notes


def gen_set_hvac_mode(rng):
    mode = _pick(rng, HVAC_MODES)
    sayings = {
        "heat": ["switch the hvac to heat", "put the climate system on heating mode",
                 "set the hvac mode to heat", "switch the heating mode on",
                 "change the climate to heat mode", "set the system to heat"],
        "cool": ["switch the air conditioning to cool", "put the AC on cooling",
                 "set the hvac to cool mode", "turn on the air conditioning",
                 "switch to cooling mode", "set the climate mode to cool"],
        "auto": ["set the hvac to auto", "put the climate control on automatic",
                 "switch the heating and cooling to auto mode", "set the AC mode to auto"],
        "eco": ["put the heating in eco mode", "switch the hvac to eco",
                "set the climate to eco mode", "use the energy saving eco mode for the hvac"],
        "off": ["turn off the hvac", "switch the air conditioning off",
                "set the hvac mode to off", "turn the climate system off",
                "switch off the heating and cooling"],
    }
    clause = _pick(rng, sayings[mode])
    return clause, {"name": "set_hvac_mode", "arguments": {"mode": mode}}, [f'mode = "{mode}"']


def _door(rng):
    door = _pick(rng, DOORS)
    return door, _pick(rng, DOOR_SAYINGS[door])


def gen_lock_door(rng):
    door, said = _door(rng)
    clause = _pick(rng, [f"lock the {said}", f"lock up the {said}", f"make sure the {said} is locked",
                         f"secure the {said}", f"lock the {said} please", f"{said}, lock it"])
    if _v4(rng, 0.3):
        clause = _pick(rng, [f"I left the {said} unlocked, lock it",
                             f"the {said} is still unlocked, can you lock it",
                             f"is the {said} locked? if not, lock it"])
    return clause, {"name": "lock_door", "arguments": {"door": door}}, [f'door = "{door}" from "{said}"']


def gen_unlock_door(rng):
    door, said = _door(rng)
    args = {"door": door}
    notes = [f'door = "{door}" from "{said}"']
    clause = _pick(rng, [f"unlock the {said}", f"open the lock on the {said}",
                         f"let me in through the {said}, unlock it", f"unlock the {said} for me"])
    if rng.random() < 0.45:
        code = "".join(str(rng.randint(0, 9)) for _ in range(4))
        said_code = code if rng.random() < 0.7 else " ".join(_ONES[int(c)] for c in code)
        clause += _pick(rng, [f" with code {said_code}", f" using the code {said_code}",
                              f", the code is {said_code}", f" with {said_code}"])
        args["code"] = code
        notes.append(f'code = "{code}" from "{said_code}"')
    return clause, {"name": "unlock_door", "arguments": args}, notes


def gen_set_blinds(rng):
    room, said = _room(rng)
    blinds = _pick(rng, ["blinds", "blinds", "shades", "blind"])
    r = rng.random()
    if r < 0.3:
        pos, how = 100, "open"
        clause = _pick(rng, [f"open the {said} {blinds}", f"open the {blinds} in the {said}",
                             f"raise the {blinds} in the {said} all the way",
                             f"open up the {said} {blinds}"])
    elif r < 0.6:
        pos, how = 0, "close"
        clause = _pick(rng, [f"close the {said} {blinds}", f"close the {blinds} in the {said}",
                             f"shut the {said} {blinds}", f"lower the {blinds} in the {said} all the way"])
    elif r < 0.78:
        pos, how = 50, _pick(rng, ["half open", "halfway"])
        clause = _pick(rng, [f"open the {said} {blinds} halfway", f"set the {said} {blinds} half open",
                             f"put the {blinds} in the {said} halfway",
                             f"half open the {blinds} in the {said}"])
    else:
        pos = rng.choice([10, 20, 25, 30, 40, 60, 70, 75, 80, 90, rng.randint(1, 99)])
        how = _pct(rng, pos)
        clause = _pick(rng, [f"set the {said} {blinds} to {how}", f"open the {said} {blinds} to {how}",
                             f"set the {blinds} in the {said} to {how} open",
                             f"move the {said} {blinds} to {how}"])
    notes = [f'room = "{room}" from "{said}"', f'position = {pos} from "{how}"']
    return clause, {"name": "set_blinds", "arguments": {"room": room, "position": pos}}, notes


def _music_query(rng):
    kind = rng.random()
    if kind < 0.35:
        q = _value(rng, GENRES, "genre")
        said = _pick(rng, [f"some {q}", f"{q}", f"some {q} music", f"{q} music"])
    elif kind < 0.65:
        q = _value(rng, ARTISTS, "artist")
        said = _pick(rng, [q, f"some {q}", f"music by {q}", f"songs by {q}"])
    elif kind < 0.8:
        q = _value(rng, ALBUMS, "title")
        said = _pick(rng, [f"the album {q}", q, f"{q} album"])
    else:
        q = _value(rng, PLAYLIST_NAMES, "playlist")
        said = _pick(rng, [f"my {q} playlist", f"the {q} playlist", f"{q} playlist"])
    return q, said


def gen_play_music(rng):
    q, said = _music_query(rng)
    args = {"query": q}
    notes = [f'query = "{q}" from "{said}"']
    verb = _pick(rng, ["play", "play", "put on", "start playing", "queue up", "stream"])
    clause = f"{verb} {said}"
    if _v4(rng, 0.35):
        verb = _pick(rng, ["put", "I want to hear", "throw on", "can you play", "let's hear"])
        clause = f"{verb} {said}" + (" on" if verb == "put" else "")
    if rng.random() < 0.35:
        room, rsaid = _room(rng)
        clause += _pick(rng, [f" in the {rsaid}", f" in the {rsaid}", f" on the {rsaid} speaker"])
        args["room"] = room
        notes.append(f'room = "{room}" from "{rsaid}"')
    if rng.random() < 0.2:
        if rng.random() < 0.5:
            clause = f"shuffle {said}" + clause[len(f'{verb} {said}'):]
        else:
            clause += _pick(rng, [" on shuffle", " shuffled", " with shuffle on"])
        args["shuffle"] = True
        notes.append('shuffle = true from "shuffle"')
    return clause, {"name": "play_music", "arguments": args}, notes


def gen_stop_music(rng):
    args, notes = {}, []
    clause = _pick(rng, ["stop the music", "pause the music", "stop playing music",
                         "turn the music off", "kill the music", "pause the song",
                         "stop the song", "music off"])
    if rng.random() < 0.4:
        room, said = _room(rng)
        clause += f" in the {said}"
        args["room"] = room
        notes.append(f'room = "{room}" from "{said}"')
    else:
        notes.append("no room named")
    return clause, {"name": "stop_music", "arguments": args}, notes


def gen_set_volume(rng):
    args, notes = {}, []
    if rng.random() < 0.15:
        level = 0
        clause = _pick(rng, ["mute the speakers", "mute the music", "mute", "mute the sound"])
        notes.append('level = 0 from "mute"')
    else:
        level = rng.choice([10, 20, 25, 30, 40, 50, 60, 70, 75, 80, 90, rng.randint(1, 100)])
        said = _pct(rng, level)
        clause = _pick(rng, [f"set the volume to {said}", f"volume to {said}",
                             f"turn the volume up to {said}", f"turn the volume down to {said}",
                             f"change the speaker volume to {said}", f"put the volume at {said}"])
        if _v7(rng, 0.35):
            clause = _pick(rng, [f"turn the music down to {said}", f"turn the music up to {said}",
                                 f"music volume to {said}", f"turn it down to {said}",
                                 f"lower the volume to {said}", f"bring the music down to {said}",
                                 f"make the music quieter, {said}", f"turn the sound up to {said}",
                                 f"the music is too loud, put it at {said}"])
        notes.append(f'level = {level} from "{said}"')
    args["level"] = level
    if level and _v4(rng, 0.3):
        room, rsaid = _room(rng)
        clause = _pick(rng, [f"set the {rsaid} volume to {said}", f"{rsaid} volume to {said}",
                             f"turn the {rsaid} speaker to {said}"])
        args["room"] = room
        notes.append(f'room = "{room}" from "{rsaid}"')
        return clause, {"name": "set_volume", "arguments": args}, notes
    if rng.random() < 0.35:
        room, rsaid = _room(rng)
        clause += f" in the {rsaid}"
        args["room"] = room
        notes.append(f'room = "{room}" from "{rsaid}"')
    return clause, {"name": "set_volume", "arguments": args}, notes


def _duration(rng, max_minutes=1440):
    r = rng.random()
    if r < 0.55:
        m = rng.choice([1, 2, 3, 5, 7, 8, 10, 12, 15, 20, 25, 30, 40, 45, 50, 60, 90,
                        rng.randint(1, 120)])
        unit = "minute" if m == 1 else "minutes"
        said = f"{say_int(rng, m)} {_pick(rng, [unit, unit, 'min' if m == 1 else 'mins'])}"
    elif r < 0.7:
        h = rng.randint(1, 5)
        m = 60 * h
        said = _pick(rng, [f"{say_int(rng, h)} hour{'s' if h > 1 else ''}",
                           "an hour" if h == 1 else f"{number_words(h)} hours"])
    elif r < 0.82:
        m, said = _pick(rng, [(90, "an hour and a half"), (30, "half an hour"),
                              (15, "a quarter of an hour"), (90, "one and a half hours"),
                              (150, "two and a half hours"), (45, "three quarters of an hour"),
                              (75, "an hour and fifteen minutes")])
    else:
        h = rng.randint(1, 3)
        extra = rng.choice([5, 10, 15, 20, 30, 40, 45])
        m = 60 * h + extra
        said = f"{say_int(rng, h)} hour{'s' if h > 1 else ''} and {say_int(rng, extra)} minutes"
    return min(m, max_minutes), said


def gen_set_timer(rng):
    minutes, said = _duration(rng)
    args = {"minutes": minutes}
    notes = [f'minutes = {minutes} from "{said}"']
    clause = _pick(rng, [f"set a timer for {said}", f"start a {said} timer",
                         f"timer for {said}", f"start a timer for {said}",
                         f"count down {said}", f"set a {said} timer"])
    if _v4(rng, 0.4):
        # "a two hour timer", "a 25 minute pasta timer": the duration as an adjective
        adj = _adjectival(said)
        a = "" if adj.startswith(("a ", "an ")) else "a "
        if rng.random() < 0.5:
            label = _value(rng, LABELS, "label")
            clause = _pick(rng, [f"start {a}{adj} {label} timer", f"set {a}{adj} {label} timer",
                                 f"set a {label} timer for {said}", f"{label} timer for {said}",
                                 f"{a}{adj} timer for the {label}"])
            args["label"] = label
            notes.append(f'label = "{label}"')
        else:
            clause = _pick(rng, [f"set {a}{adj} timer", f"start {a}{adj} timer", f"{a}{adj} timer please"])
        return clause, {"name": "set_timer", "arguments": args}, notes
    if rng.random() < 0.4:
        label = _value(rng, LABELS, "label")
        clause += _pick(rng, [f" for the {label}", f" called {label}", f" labelled {label}",
                              f" for {label}", f" named {label}"])
        args["label"] = label
        notes.append(f'label = "{label}"')
    return clause, {"name": "set_timer", "arguments": args}, notes


def _adjectival(said):
    """A duration as it stands before a noun: "two hours" → "two hour", "an hour" → "one hour"."""
    if said == "an hour":
        return "one hour"
    return said.replace(" minutes", " minute").replace(" hours", " hour").replace(" mins", " min")


def _clock(rng):
    """A spoken time of day and its 24-hour HH:MM form."""
    if _v4(rng, 0.25):
        return _clock_relative(rng)
    r = rng.random()
    hour12 = rng.randint(1, 12)
    minute = rng.choice([0, 0, 0, 15, 30, 45, 5, 10, 20, 40, 50, rng.randint(0, 59)])
    pm = rng.random() < 0.4
    h24 = (hour12 % 12) + (12 if pm else 0)
    if r < 0.45:
        ampm = _pick(rng, ["pm", " pm", " p.m.", "PM"]) if pm else _pick(rng, ["am", " am", " a.m.", "AM"])
        said = (f"{hour12}:{minute:02d}" if minute else f"{hour12}") + ampm
    elif r < 0.6:
        said = f"{h24:02d}:{minute:02d}" if rng.random() < 0.6 else f"{h24}:{minute:02d}"
    elif r < 0.75:
        part = "in the evening" if pm and h24 >= 17 else ("in the afternoon" if pm else "in the morning")
        if minute == 30:
            said = f"half past {number_words(hour12)} {part}"
        elif minute == 15:
            said = f"quarter past {number_words(hour12)} {part}"
        elif minute == 0:
            said = f"{number_words(hour12)} o'clock {part}"
        else:
            said = f"{hour12}:{minute:02d} {part}"
    else:
        if minute == 0:
            said = f"{number_words(hour12)} {'pm' if pm else 'am'}"
        else:
            said = f"{hour12}:{minute:02d} {'pm' if pm else 'am'}"
    return f"{h24:02d}:{minute:02d}", said


def _clock_relative(rng):
    """Version 4: "quarter to eight in the morning", "ten past six pm" (minutes to or past
    the hour, so "to" counts back from the hour said)."""
    hour12 = rng.randint(1, 12)
    pm = rng.random() < 0.4
    h24 = (hour12 % 12) + (12 if pm else 0)
    how, offset = _pick(rng, [("quarter to", -15), ("quarter past", 15), ("half past", 30),
                              ("ten to", -10), ("twenty to", -20), ("five to", -5),
                              ("ten past", 10), ("twenty past", 20), ("five past", 5),
                              ("twenty-five past", 25)])
    total = (h24 * 60 + offset) % 1440
    if pm:
        part = _pick(rng, ["in the evening" if h24 >= 17 else "in the afternoon", "pm", "p.m."])
    else:
        part = _pick(rng, ["in the morning", "am", "a.m."])
    said = f"{how} {number_words(hour12) if rng.random() < 0.7 else hour12} {part}"
    return f"{total // 60:02d}:{total % 60:02d}", said


def gen_set_alarm(rng):
    time, said = _clock(rng)
    args = {"time": time}
    notes = [f'time = "{time}" from "{said}"']
    clause = _pick(rng, [f"set an alarm for {said}", f"wake me up at {said}",
                         f"alarm at {said}", f"set my alarm for {said}",
                         f"I need to get up at {said}", f"set a wake-up alarm at {said}"])
    r = rng.random()
    if r < 0.4:
        choice = rng.random()
        if choice < 0.35:
            days, dsaid = DAYS[:5], _pick(rng, ["on weekdays", "every weekday", "on week days"])
        elif choice < 0.5:
            days, dsaid = DAYS[5:], _pick(rng, ["on weekends", "at the weekend", "every weekend"])
        elif choice < 0.6:
            days, dsaid = list(DAYS), _pick(rng, ["every day", "daily"])
        else:
            k = rng.randint(1, 3)
            days = sorted(rng.sample(DAYS, k), key=DAYS.index)
            names = [DAY_NAMES[d] + ("s" if rng.random() < 0.5 else "") for d in days]
            joined = names[0] if k == 1 else ", ".join(names[:-1]) + " and " + names[-1]
            dsaid = _pick(rng, [f"on {joined}", f"every {joined}"])
        clause += " " + dsaid
        args["days"] = days
        notes.append(f"days = {compact(days)} from \"{dsaid}\"")
    if rng.random() < 0.3:
        label = _value(rng, LABELS, "label")
        clause += _pick(rng, [f" called {label}", f" labelled {label}", f" for {label}"])
        args["label"] = label
        notes.append(f'label = "{label}"')
    # schema key order: time, days, label
    ordered = {k: args[k] for k in ("time", "days", "label") if k in args}
    return clause, {"name": "set_alarm", "arguments": ordered}, notes


def gen_start_vacuum(rng):
    if rng.random() < 0.45:
        clause = _pick(rng, ["start the vacuum", "run the robot vacuum", "vacuum everywhere",
                             "start the robot vacuum cleaner", "vacuum the whole house",
                             "hoover the house", "get the vacuum going", "start cleaning the floors"])
        return clause, {"name": "start_vacuum", "arguments": {}}, ["no rooms: everywhere"]
    k = rng.choice([1, 1, 2, 2, 3])
    rooms = rng.sample(ROOMS, k)
    said = [_pick(rng, ROOM_SAYINGS[r]) for r in rooms]
    joined = said[0] if k == 1 else ", the ".join(said[:-1]) + " and the " + said[-1]
    clause = _pick(rng, [f"vacuum the {joined}", f"run the vacuum in the {joined}",
                         f"start the robot vacuum in the {joined}", f"hoover the {joined}",
                         f"clean the floor in the {joined}"])
    if _v7(rng, 0.3):
        clause = _pick(rng, [f"get the robot vacuum going in the {joined}",
                             f"get the vacuum going in the {joined}",
                             f"send the robot vacuum to the {joined}",
                             f"have the hoover do the {joined}",
                             f"the {joined} floor needs cleaning, start the vacuum"])
    return clause, {"name": "start_vacuum", "arguments": {"rooms": rooms}}, [f"rooms = {compact(rooms)}"]


def gen_stop_vacuum(rng):
    clause = _pick(rng, ["stop the vacuum", "send the robot vacuum back to its dock",
                         "stop the robot vacuum", "dock the vacuum", "stop vacuuming",
                         "tell the vacuum to go home", "stop the hoover",
                         "send the vacuum cleaner back to the dock"])
    if _v4(rng, 0.3):
        vac = _pick(rng, ["vacuum", "hoover", "robot vacuum", "vacuum cleaner"])
        clause = _pick(rng, [f"the {vac} is too noisy, stop it",
                             f"the {vac} keeps bumping into things, send it back to the dock",
                             f"the {vac} is stuck, stop it"])
    return clause, {"name": "stop_vacuum", "arguments": {}}, ["no arguments"]


def gen_activate_scene(rng):
    scene = _pick(rng, SCENES)
    sayings = [f"activate the {scene} scene", f"switch to {scene} mode", f"set the {scene} scene",
               f"start {scene} mode", f"{scene} scene please", f"turn on the {scene} scene",
               f"run the {scene} scene"]
    special = {"good night": ["say good night to the house", "good night, set the house for bed"],
               "movie night": ["get the house ready for movie night", "it's movie night, set the scene"],
               "away": ["we're leaving, activate away mode", "set the house to away"],
               "party": ["party time, activate the party scene"],
               "reading": ["set up the reading scene"],
               "dinner": ["set the dinner scene"],
               "good morning": ["good morning scene please", "run good morning"]}
    if rng.random() < 0.3:
        clause = _pick(rng, special[scene])
    else:
        clause = _pick(rng, sayings)
    return clause, {"name": "activate_scene", "arguments": {"scene": scene}}, [f'scene = "{scene}"']


def gen_get_sensor_reading(rng):
    sensor = _pick(rng, SENSORS)
    args = {"sensor": sensor}
    notes = [f'sensor = "{sensor}"']
    with_room = rng.random() < 0.6
    room, said = _room(rng)
    where = f" in the {said}" if with_room else ""
    forms = {
        "temperature": [f"what's the temperature{where}", f"how warm is it{where}",
                        f"read the temperature sensor{where}", f"check the temperature{where}"],
        "humidity": [f"what's the humidity{where}", f"how humid is it{where}",
                     f"check the humidity{where}", f"read the humidity sensor{where}"],
        "air quality": [f"how's the air quality{where}", f"check the air quality{where}",
                        f"what is the air quality{where}", f"read the air quality sensor{where}"],
        "motion": [f"is there any motion{where}", f"check the motion sensor{where}",
                   f"has there been movement{where}", f"read the motion sensor{where}"],
    }
    clause = _pick(rng, forms[sensor])
    if with_room:
        args["room"] = room
        notes.append(f'room = "{room}" from "{said}"')
    return clause, {"name": "get_sensor_reading", "arguments": args}, notes


def gen_set_fan(rng):
    room, said = _room(rng)
    speed = _pick(rng, FAN_SPEEDS)
    fan = _pick(rng, ["fan", "ceiling fan", "fan"])
    if speed == "off":
        clause = _pick(rng, [f"turn off the {said} {fan}", f"switch the {fan} in the {said} off",
                             f"stop the {fan} in the {said}", f"set the {said} {fan} to off"])
    else:
        clause = _pick(rng, [f"set the {said} {fan} to {speed}", f"turn the {fan} in the {said} to {speed}",
                             f"put the {said} {fan} on {speed}", f"{speed} speed on the {said} {fan}",
                             f"run the {fan} in the {said} on {speed}"])
    notes = [f'room = "{room}" from "{said}"', f'speed = "{speed}"']
    return clause, {"name": "set_fan", "arguments": {"room": room, "speed": speed}}, notes


def gen_operate_garage(rng):
    action = _pick(rng, ["open", "close"])
    if action == "open":
        clause = _pick(rng, ["open the garage", "open the garage door", "raise the garage door",
                             "open up the garage"])
    else:
        clause = _pick(rng, ["close the garage", "close the garage door", "shut the garage door",
                             "lower the garage door", "shut the garage"])
    return clause, {"name": "operate_garage", "arguments": {"action": action}}, [f'action = "{action}"']


def gen_add_to_shopping_list(rng):
    item = _value(rng, ITEMS, "item")
    args = {"item": item}
    notes = [f'item = "{item}"']
    lst = _pick(rng, ["the shopping list", "my shopping list", "the shopping list", "the list",
                      "the grocery list"])
    if rng.random() < 0.4:
        q = rng.randint(2, 12)
        container = _pick(rng, CONTAINERS) + " " if rng.random() < 0.4 else ""
        said = f"{say_int(rng, q, 0.5)} {container}{item}"
        args["quantity"] = q
        notes.append(f'quantity = {q}')
    else:
        said = _pick(rng, [item, f"some {item}", item])
    clause = _pick(rng, [f"add {said} to {lst}", f"put {said} on {lst}",
                         f"we need {said}, add it to {lst}", f"add {said} to {lst} please"])
    return clause, {"name": "add_to_shopping_list", "arguments": args}, notes


def gen_send_notification(rng):
    if _v4(rng, 0.25):
        message = _pick(rng, MESSAGES_V4)
    else:
        message = _value(rng, MESSAGES, "message")
    args = {"message": message}
    notes = [f'message = "{message}"']
    r = rng.random()
    if r < 0.75:
        recipient = _pick(rng, RECIPIENTS)
        who = {"everyone": ["everyone", "everybody", "the whole family", "everyone"],
               "me": ["me"], "partner": ["my partner", "my partner"],
               "kids": ["the kids", "the children", "the kids"]}[recipient]
        who_said = _pick(rng, who)
        if recipient == "me":
            clause = _pick(rng, [f"send me a notification that {message}",
                                 f"notify me that {message}",
                                 f"send a message to me saying {message}"])
        else:
            clause = _pick(rng, [f"tell {who_said} that {message}", f"notify {who_said} that {message}",
                                 f"send a message to {who_said} saying {message}",
                                 f"let {who_said} know that {message}",
                                 f"message {who_said}: {message}"])
            if _v4(rng, 0.4):
                clause = _pick(rng, [f"let {who_said} know {message}", f"tell {who_said} {message}",
                                     f"text {who_said}: {message}", f"ping {who_said} that {message}"])
        args["recipient"] = recipient
        notes.append(f'recipient = "{recipient}" from "{who_said}"')
    else:
        clause = _pick(rng, [f"send a notification saying {message}",
                             f"send a message: {message}", f"broadcast a notification that {message}"])
    return clause, {"name": "send_notification", "arguments": args}, notes


def gen_water_garden(rng):
    zone = _pick(rng, ZONES)
    minutes = rng.choice([5, 10, 15, 20, 25, 30, 45, 60, rng.randint(1, 120)])
    said_m = f"{say_int(rng, minutes)} minutes" if minutes != 60 or rng.random() < 0.5 else "an hour"
    clause = _pick(rng, [f"water the {zone} for {said_m}", f"run the sprinklers on the {zone} for {said_m}",
                         f"turn on the sprinklers for the {zone} for {said_m}",
                         f"water the {zone} {said_m}", f"give the {zone} {said_m} of water"])
    notes = [f'zone = "{zone}"', f'minutes = {minutes} from "{said_m}"']
    return clause, {"name": "water_garden", "arguments": {"zone": zone, "minutes": minutes}}, notes


GENERATORS = {
    "set_light": gen_set_light, "set_thermostat": gen_set_thermostat,
    "set_hvac_mode": gen_set_hvac_mode, "lock_door": gen_lock_door,
    "unlock_door": gen_unlock_door, "set_blinds": gen_set_blinds,
    "play_music": gen_play_music, "stop_music": gen_stop_music,
    "set_volume": gen_set_volume, "set_timer": gen_set_timer, "set_alarm": gen_set_alarm,
    "start_vacuum": gen_start_vacuum, "stop_vacuum": gen_stop_vacuum,
    "activate_scene": gen_activate_scene, "get_sensor_reading": gen_get_sensor_reading,
    "set_fan": gen_set_fan, "operate_garage": gen_operate_garage,
    "add_to_shopping_list": gen_add_to_shopping_list,
    "send_notification": gen_send_notification, "water_garden": gen_water_garden,
}
# Tools whose free strings are copied from the request (data version 5 draws them more).
COPY_TOOLS = ("add_to_shopping_list", "send_notification", "play_music")

# ------------------------------------------------------------- refusals ---

CHITCHAT = [
    "what's the capital of France", "tell me a joke", "how are you today", "who won the game last night",
    "what's the meaning of life", "how tall is Mount Everest", "what is two plus two",
    "can you sing me a song", "what's your name", "who wrote Hamlet", "thanks, that's all",
    "good job", "I'm bored", "how do I make pancakes", "translate hello into Spanish",
    "what's the weather going to be tomorrow", "will it rain today", "what time is it",
    "what's today's date", "how many days until Christmas", "spell necessary",
    "what does photosynthesis mean", "recommend a good book", "who is the president",
    "explain quantum physics simply", "how far is the moon", "is a tomato a fruit",
    "what's a good name for a cat", "tell me a bedtime story", "define serendipity",
    "how many ounces are in a pound", "what's the square root of 144",
    "do you like me", "never mind", "hello", "hi there", "ok thanks", "cool",
    "what can you do", "what's the population of Japan", "convert 10 miles to kilometres",
]
REFUSAL_ACTIONS = [
    "turn on the TV", "switch off the television", "start the dishwasher", "run the washing machine",
    "preheat the oven to 200 degrees", "turn on the oven", "brew a coffee", "make me a cup of tea",
    "order a pizza", "call mom", "call my partner", "book a taxi to the airport",
    "order more dog food online", "read my emails", "send an email to my boss",
    "check my calendar", "add a meeting to my calendar", "what's on my calendar tomorrow",
    "open the fridge", "set the fridge to 4 degrees", "turn on the kettle", "start the dryer",
    "lock the car", "open the window", "close the bedroom window", "unlock the window",
    "feed the cat", "walk the dog", "turn on the hot tub", "heat the pool",
    "turn on the electric blanket", "start the car", "charge the car",
    "take a picture with the doorbell camera", "show me the front door camera",
    "record a video", "play the news", "read me the news headlines", "turn on the radio",
    "remove milk from the shopping list", "read me the shopping list", "clear the shopping list",
    "cancel the timer", "how much time is left on the timer", "snooze the alarm",
    "delete my alarms", "turn off the alarm", "skip this song", "what song is playing",
    "like this song", "arm the security system", "disarm the alarm system",
    "turn on the sprinkler in the houseplants", "mow the lawn", "empty the vacuum bin",
    "order groceries", "pay the electricity bill", "what's my energy usage",
    "set the water heater to 60", "turn on the humidifier", "turn on the dehumidifier",
    "turn on the air purifier", "open the curtains in the car", "ring the doorbell",
    "make the bed", "do the laundry", "iron my shirt", "clean the windows",
]


# Version 7: ways a conversation closes (none of them asks for anything).
CLOSINGS = [
    "thanks, that's all", "thank you, that'll be all", "that's it, thanks", "no, that's all for now",
    "great, thanks", "perfect, thank you", "cheers", "all done, thanks", "nothing else, thanks",
    "ok, that's everything I needed", "thanks a lot", "brilliant, cheers", "that's all, bye",
    "thank you so much", "lovely, thanks", "that'll do, thanks", "no thanks, I'm done",
    "ok thank you, that's everything for today", "good night, thanks", "you're a star, thanks",
]


# Version 7's near misses about a named timer or a list item: (the tools they sound like,
# the words said, the requests around one of them).
_NEAR_MISS_NAMED = (
    (["set_timer"], ["pasta", "laundry", "roast", "tea", "nap", "pizza", "bread", "eggs"],
     ["cancel the {} timer", "stop the {} timer", "how long is left on the {} timer",
      "pause the {} timer", "delete my {} timer", "add five minutes to the {} timer"]),
    (["add_to_shopping_list"], ["milk", "eggs", "bread", "butter", "apples", "coffee", "rice", "cheese"],
     ["take {} off the shopping list", "remove the {} from my list", "is {} on the shopping list",
      "did I already add {} to the list", "cross {} off the list"]),
)


def _near_miss_v7(rng):
    """Version 7: a request about an alarm, a timer, the list or the music that no tool
    serves, carrying words a call would use (a time, a label, an item)."""
    r = rng.randrange(4)
    if r == 0:
        _, said = _clock(rng)
        verb = _pick(rng, ["cancel", "delete", "remove", "turn off", "switch off", "snooze",
                           "disable", "get rid of", "skip"])
        q = _pick(rng, [f"{verb} my {said} alarm", f"{verb} the alarm for {said}",
                        f"{verb} the {said} alarm", f"please {verb} my alarm at {said}"])
        return q, ["set_alarm"]
    if r < 3:
        near, words, requests = _NEAR_MISS_NAMED[r - 1]
        word = _pick(rng, words)
        return _pick(rng, [t.format(word) for t in requests]), near
    q = _pick(rng, ["what's this song called", "who sings this", "skip to the next song",
                    "go back to the previous track", "add this song to my favourites",
                    "turn up the TV", "what's playing in the kitchen"])
    return q, ["play_music", "set_volume", "stop_music"]


def _refusal_near_miss(rng):
    """A request that sounds like a catalogue tool but cannot be served by it."""
    if _v7(rng, 0.35):
        return _near_miss_v7(rng)
    r = rng.randrange(9)
    if r == 0:
        room = _pick(rng, NOT_ROOMS)
        q = _pick(rng, [f"turn on the {room} lights", f"switch off the light in the {room}",
                        f"dim the {room} lights to 30%"])
        near = ["set_light"]
    elif r == 1:
        room = _pick(rng, NOT_ROOMS)
        q = _pick(rng, [f"close the blinds in the {room}", f"set the {room} fan to high",
                        f"what's the humidity in the {room}", f"vacuum the {room}"])
        near = ["set_blinds", "set_fan", "get_sensor_reading", "start_vacuum"]
    elif r == 2:
        thing = _pick(rng, NOT_DOORS)
        q = _pick(rng, [f"lock the {thing}", f"unlock the {thing}", f"open the {thing}"])
        near = ["lock_door", "unlock_door"]
    elif r == 3:
        scene = _pick(rng, NOT_SCENES)
        q = _pick(rng, [f"activate the {scene} scene", f"switch to {scene} mode"])
        near = ["activate_scene"]
    elif r == 4:
        zone = _pick(rng, NOT_ZONES)
        q = f"water the {zone} for {rng.randint(5, 30)} minutes"
        near = ["water_garden"]
    elif r == 5:
        q = _pick(rng, ["set the oven to 180 degrees", "set the fridge to 3 degrees",
                        "make the water heater 55 degrees", "set the freezer to minus 18",
                        "warm up the car to 21 degrees"])
        near = ["set_thermostat"]
    elif r == 6:
        q = _pick(rng, ["turn up the TV volume", "mute the TV", "set the doorbell volume to 50",
                        "play the next episode", "play a podcast about history", "rewind the song"])
        near = ["set_volume", "play_music", "stop_music"]
    elif r == 7:
        q = _pick(rng, ["remove eggs from the shopping list", "what's on the shopping list",
                        "cancel my alarm", "stop the timer", "what time is my alarm",
                        "is the front door locked", "is the garage open", "is the vacuum running"])
        near = ["add_to_shopping_list", "set_alarm", "set_timer", "lock_door", "operate_garage",
                "start_vacuum"]
    else:
        q = _pick(rng, ["turn on the lights in the car", "open the car boot", "start the lawnmower",
                        "turn on the christmas tree lights", "call the kids", "text my partner"])
        near = ["set_light", "operate_garage", "send_notification"]
    return q, near


# -------------------------------------------------------- invented tools ---
# A few generic domains; names, parameter names and descriptions are drawn at
# random so that the schema, not the name, tells the model what to emit.

FIRST_NAMES = ["Alice", "Bob", "Carmen", "Dmitri", "Emma", "Farid", "Grace", "Hiro", "Ines",
               "Jonas", "Kemi", "Liam", "Maya", "Noah", "Olga", "Pedro", "Quinn", "Rosa",
               "Sam", "Tara", "Umar", "Vera", "Wen", "Yusuf", "Zoe"]
CITIES = ["Paris", "Berlin", "Tokyo", "Lagos", "Lima", "Oslo", "Cairo", "Toronto", "Madrid",
          "Seoul", "Nairobi", "Dublin", "Austin", "Lisbon", "Mumbai", "Sydney", "Prague"]
CUISINES = ["Italian", "Thai", "Mexican", "Indian", "Japanese", "Greek", "Lebanese", "Korean"]
TOPICS = ["the budget", "the school trip", "the garden party", "our holiday", "the new car",
          "the quarterly report", "football practice", "the birthday cake", "the house move"]
LANGS = ["Spanish", "French", "German", "Italian", "Japanese", "Portuguese", "Dutch"]
PHRASES = ["good morning", "where is the station", "thank you very much", "how much is this",
           "I am lost", "see you tomorrow", "the bill please"]
WORDS = ["ephemeral", "ubiquitous", "serendipity", "quixotic", "laconic", "gregarious"]
STOCKS = ["AAPL", "TSLA", "MSFT", "AMZN", "NVDA", "GOOG"]
APPLIANCES = ["dishwasher", "washing machine", "dryer", "oven", "kettle", "coffee machine"]
PROGRAMS = ["eco", "quick", "intensive", "delicate", "normal"]


def _name_variant(rng, options):
    return _pick(rng, options)


def _invent_tool(rng):
    """One invented tool, its query, and the call, built together."""
    kind = rng.randrange(10)
    if kind == 0:
        name = _name_variant(rng, ["get_weather", "weather_forecast", "check_weather", "fetch_forecast"])
        loc_key = _pick(rng, ["city", "location", "place"])
        day_key = _pick(rng, ["day", "when"])
        days = ["today", "tomorrow", "saturday", "sunday", "monday"]
        props = {loc_key: {"type": "string"}, day_key: {"type": "string", "enum": days}}
        tool = {"name": name, "description": _pick(rng, ["Get the weather forecast for a city",
                                                         "Weather forecast for a place and day"]),
                "parameters": {"type": "object", "properties": props, "required": [loc_key]}}
        city = _pick(rng, CITIES)
        args = {loc_key: city}
        if rng.random() < 0.5:
            day = _pick(rng, days)
            args[day_key] = day
            query = _pick(rng, [f"what's the weather in {city} {day}", f"will it rain in {city} {day}",
                                f"forecast for {city} {day}"])
        else:
            query = _pick(rng, [f"what's the weather like in {city}", f"weather in {city}",
                                f"how hot is it in {city}"])
    elif kind == 1:
        name = _name_variant(rng, ["send_email", "email_contact", "compose_email", "write_email"])
        to_key = _pick(rng, ["to", "recipient", "contact"])
        subj_key = _pick(rng, ["subject", "topic", "title"])
        tool = {"name": name, "description": "Send an email to a contact",
                "parameters": {"type": "object", "properties": {
                    to_key: {"type": "string"}, subj_key: {"type": "string"},
                    "body": {"type": "string"}}, "required": [to_key, subj_key]}}
        who = _pick(rng, FIRST_NAMES)
        topic = _pick(rng, TOPICS)
        args = {to_key: who, subj_key: topic}
        query = _pick(rng, [f"email {who} about {topic}", f"send an email to {who} about {topic}",
                            f"write to {who} with the subject {topic}"])
    elif kind == 2:
        name = _name_variant(rng, ["book_table", "reserve_restaurant", "make_reservation"])
        n_key = _pick(rng, ["people", "party_size", "guests"])
        tool = {"name": name, "description": "Reserve a restaurant table",
                "parameters": {"type": "object", "properties": {
                    "cuisine": {"type": "string", "enum": CUISINES},
                    n_key: {"type": "integer", "minimum": 1, "maximum": 20},
                    "time": {"type": "string", "description": "HH:MM"}},
                    "required": ["cuisine", n_key]}}
        cuisine = _pick(rng, CUISINES)
        n = rng.randint(1, 12)
        args = {"cuisine": cuisine, n_key: n}
        query = _pick(rng, [f"book a table for {say_int(rng, n, 0.5)} at a {cuisine} place",
                            f"reserve {cuisine} for {say_int(rng, n, 0.5)} people",
                            f"find us a {cuisine} restaurant table for {n}"])
        if rng.random() < 0.4:
            time, said = _clock(rng)
            args["time"] = time
            query += f" at {said}"
    elif kind == 3:
        name = _name_variant(rng, ["translate_text", "translate", "translate_phrase"])
        text_key = _pick(rng, ["text", "phrase"])
        lang_key = _pick(rng, ["target_language", "language", "to"])
        tool = {"name": name, "description": "Translate text into another language",
                "parameters": {"type": "object", "properties": {
                    text_key: {"type": "string"}, lang_key: {"type": "string", "enum": LANGS}},
                    "required": [text_key, lang_key]}}
        phrase = _pick(rng, PHRASES)
        lang = _pick(rng, LANGS)
        args = {text_key: phrase, lang_key: lang}
        query = _pick(rng, [f"translate {phrase} into {lang}", f"how do you say {phrase} in {lang}",
                            f"say {phrase} in {lang}"])
    elif kind == 4:
        name = _name_variant(rng, ["get_stock_price", "stock_quote", "check_stock"])
        key = _pick(rng, ["ticker", "symbol"])
        tool = {"name": name, "description": "Look up the latest price of a stock",
                "parameters": {"type": "object", "properties": {key: {"type": "string"}},
                               "required": [key]}}
        sym = _pick(rng, STOCKS)
        args = {key: sym}
        query = _pick(rng, [f"what's {sym} trading at", f"stock price of {sym}", f"check {sym}"])
    elif kind == 5:
        name = _name_variant(rng, ["start_appliance", "run_appliance", "appliance_start"])
        dev_key = _pick(rng, ["appliance", "device"])
        tool = {"name": name, "description": "Start a kitchen or laundry appliance with a program",
                "parameters": {"type": "object", "properties": {
                    dev_key: {"type": "string", "enum": APPLIANCES},
                    "program": {"type": "string", "enum": PROGRAMS},
                    "delay_minutes": {"type": "integer", "minimum": 0, "maximum": 600}},
                    "required": [dev_key]}}
        dev = _pick(rng, APPLIANCES)
        args = {dev_key: dev}
        query = f"start the {dev}"
        if rng.random() < 0.5:
            prog = _pick(rng, PROGRAMS)
            args["program"] = prog
            query += f" on the {prog} program"
        if rng.random() < 0.3:
            m = rng.choice([10, 30, 60, 90, 120])
            args["delay_minutes"] = m
            query += f" in {m} minutes"
        args = {k: args[k] for k in (dev_key, "program", "delay_minutes") if k in args}
    elif kind == 6:
        name = _name_variant(rng, ["define_word", "lookup_definition", "dictionary"])
        tool = {"name": name, "description": "Look up the definition of a word",
                "parameters": {"type": "object", "properties": {"word": {"type": "string"}},
                               "required": ["word"]}}
        w = _pick(rng, WORDS)
        args = {"word": w}
        query = _pick(rng, [f"define {w}", f"what does {w} mean", f"look up {w} in the dictionary"])
    elif kind == 7:
        name = _name_variant(rng, ["call_contact", "phone_call", "make_call", "dial"])
        key = _pick(rng, ["name", "contact"])
        tool = {"name": name, "description": "Call a contact on the phone",
                "parameters": {"type": "object", "properties": {
                    key: {"type": "string"}, "speaker": {"type": "boolean"}}, "required": [key]}}
        who = _pick(rng, FIRST_NAMES)
        args = {key: who}
        query = _pick(rng, [f"call {who}", f"ring {who}", f"phone {who}"])
        if rng.random() < 0.3:
            args["speaker"] = True
            query += " on speaker"
    elif kind == 8:
        name = _name_variant(rng, ["set_reminder", "create_reminder", "remind_me"])
        text_key = _pick(rng, ["text", "task", "what"])
        tool = {"name": name, "description": "Create a reminder",
                "parameters": {"type": "object", "properties": {
                    text_key: {"type": "string"}, "time": {"type": "string", "description": "24-hour HH:MM"}},
                    "required": [text_key, "time"]}}
        task = _pick(rng, ["take the medicine", "call the dentist", "water the plants",
                           "pick up the kids", "pay the rent", "buy flowers"])
        time, said = _clock(rng)
        args = {text_key: task, "time": time}
        query = _pick(rng, [f"remind me to {task} at {said}", f"at {said} remind me to {task}"])
    else:
        name = _name_variant(rng, ["navigate_to", "get_directions", "route_to"])
        dest_key = _pick(rng, ["destination", "address", "place"])
        mode_key = _pick(rng, ["mode", "travel_mode"])
        modes = ["driving", "walking", "cycling", "transit"]
        tool = {"name": name, "description": "Get directions to a place",
                "parameters": {"type": "object", "properties": {
                    dest_key: {"type": "string"}, mode_key: {"type": "string", "enum": modes}},
                    "required": [dest_key]}}
        dest = _pick(rng, CITIES + ["the airport", "the station", "the hospital", "the beach"])
        args = {dest_key: dest}
        query = f"directions to {dest}"
        if rng.random() < 0.5:
            mode = _pick(rng, modes)
            args[mode_key] = mode
            query = _pick(rng, [f"{query} by {mode}", f"{mode} directions to {dest}"])
    # arguments in schema property order
    order = list(tool["parameters"]["properties"])
    args = {k: args[k] for k in order if k in args}
    notes = [f"{k} = {compact(v)}" for k, v in args.items()]
    return tool, query, {"name": name, "arguments": args}, notes


def _invented_refusal_tool(rng):
    """An invented tool plus an unrelated request: the answer is []."""
    tool, _, _, _ = _invent_tool(rng)
    return tool


# ------------------------------------------------------------- wrapping ---

POLITE = [
    "{c}", "{c}", "{c}", "{C}.", "please {c}", "{c}, please", "{c} please", "could you {c}?",
    "can you {c}?", "can you {c} please?", "would you {c}?", "hey, {c}", "I'd like you to {c}",
    "I want you to {c}", "go ahead and {c}", "{C}!", "quick, {c}", "Please {c}.",
    "Could you please {c}?", "hey needle, {c}", "ok, {c}", "I need you to {c}",
    "{C}, thanks.", "would you {c}, please?",
]
JOINERS = [" and ", " and ", ", then ", " and then ", ", and also ", ". Also ", ", ", ", and ",
           ". Then ", " then "]


def _wrap(rng, clause):
    t = _pick(rng, POLITE)
    return t.replace("{c}", clause).replace("{C}", clause[:1].upper() + clause[1:])


def _capitalise(rng, text):
    if rng.random() < 0.6:
        return text[:1].upper() + text[1:]
    return text


def _typos(rng, text, protected, rate):
    """Character slips in unprotected words (never in copied free strings or digits)."""
    words = text.split(" ")
    keep = set()
    # Phrase values (mix version 4) carry punctuation ("proposal: urban heat"); their words
    # are kept as the request's words are compared, stripped.  Earlier versions keep their
    # comparison so that their data streams stay byte-identical.
    edge = ".,!?:;'\"" if getattr(rng, "phrase_values", False) else ""
    for value in protected:
        for w in value.split():
            keep.add(w.strip(edge).lower())
    out = []
    for w in words:
        core = w.strip(".,!?:;'\"")
        if (len(core) > 3 and core.isalpha() and core.lower() not in keep
                and rng.random() < rate):
            i = rng.randrange(1, len(core) - 1)
            kind = rng.randrange(3)
            if kind == 0:
                core2 = core[:i] + core[i + 1] + core[i] + core[i + 2:]
            elif kind == 1:
                core2 = core[:i] + core[i + 1:]
            else:
                core2 = core[:i] + core[i] + core[i:]
            w = w.replace(core, core2, 1)
        out.append(w)
    return " ".join(out)


def _free_strings(calls, tools_by_name):
    """Argument values that are copied text (free strings): typos must not touch them."""
    out = []
    for call in calls:
        props = tools_by_name[call["name"]]["parameters"].get("properties", {})
        for k, v in call["arguments"].items():
            if isinstance(v, str) and "enum" not in props.get(k, {}):
                out.append(v)
    return out


SYSTEM_FACTS = ["locale: en-GB", "device: kitchen speaker", "user: Sam", "assistant: Needle",
                "location: Leeds", "network: wifi", "locale: en-US", "device: hallway panel"]
_WEEKDAYS = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]


def packed_example(turns, **fields):
    """One training example from the turns of a packed conversation (each a dict with
    ``query``, ``reasoning``, ``answers``, ``kind`` and, after calls, perhaps
    ``results``): every turn but the last is history; a conversation that ends on tool
    results ends with them as the query and ``[]`` as the answer.  ``fields`` (source,
    system, tools, …) go in as given."""
    last = turns[-1]
    ex = {"kind": last["kind"] if len(turns) == 1 else turns[0]["kind"]}
    ex.update(fields)
    ex.update(history=[{k: t[k] for k in ("query", "reasoning", "answers", "results") if k in t}
                       for t in turns[:-1]],
              query=last["query"], reasoning=last["reasoning"], answers=last["answers"])
    if last.get("results"):
        ex["history"].append({k: last[k] for k in ("query", "reasoning", "answers")})
        ex.update(query=last["results"], is_result=True, answers=[], reasoning="")
    if len(turns) > 1:
        ex["packed"] = len(turns)
    return ex


def _system(rng):
    """The facts string the agent sends: usually the auto-added date (spec §8.4)."""
    r = rng.random()
    if r < 0.2:
        return ""
    date = (f"date: 20{rng.randint(24, 30)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} "
            f"{_pick(rng, _WEEKDAYS)} {rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}")
    if r < 0.85:
        return date
    extra = "; ".join(rng.sample(SYSTEM_FACTS, rng.randint(1, 2)))
    return date + "; " + extra


def _render_tools(rng, needed, pool, k=None, ranked=None):
    """The needed tools plus distractors from pool, at most 5, shuffled.  Distractors are
    random, or (data version 2, half the time) the tools the agent's BM25 retrieval ranks
    highest for the request (``ranked``: pool names in that order): the look-alikes the
    model must tell apart at inference."""
    k = k or (MAX_RENDERED_TOOLS if rng.random() < 0.85 else rng.randint(max(1, len(needed)), MAX_RENDERED_TOOLS))
    k = max(k, len(needed))
    names = {t["name"] for t in needed}
    others = [t for t in pool if t["name"] not in names]
    if ranked is not None and rng.random() < 0.5:
        by_name = {t["name"]: t for t in others}
        hard = [by_name[n] for n in ranked if n in by_name]
        chosen = list(needed) + hard[:max(0, k - len(needed))]
    else:
        chosen = list(needed) + rng.sample(others, min(len(others), k - len(needed)))
    rng.shuffle(chosen)
    return chosen


_VALUE_FROM = re.compile(r'^([A-Za-z_]\w*) = (.*) from "([^"]*)"$')


def _source_first(note):
    """Data version 6's note order: ``query from "some jazz" = "jazz"`` for ``query =
    "jazz" from "some jazz"``, so the model quotes the words it reads a value from before
    it writes the value (and note grounding can hold the value to that quote)."""
    return _VALUE_FROM.sub(r'\1 from "\3" = \2', note)


def _reasoning(calls, notes, source_first=False):
    if not calls:
        return notes[0] if notes else ""
    parts = []
    for call, n in zip(calls, notes):
        if source_first:
            n = [_source_first(x) for x in n]
        parts.append(call["name"] + ": " + ("; ".join(n) if n else "no arguments"))
    return "\n".join(parts)


class Generator:
    """Draws training examples; all randomness comes from one seeded Random."""

    def __init__(self, seed=0, catalogue=None, think_rate=None, typo_rate=0.04, version=1):
        """``version`` 1 is the shipped model's first data; 2 adds open-pool free-string
        values (half of them), retrieval-ranked distractors (half of the tool lists) and
        tool results serialised as the agent sends them (``json.dumps`` defaults); 3 is
        version 2 with follow-up requests packed after the first (``_pack``); 4 is
        version 3 with more phrasings (``_v4``: durations as adjectives, labels before
        "timer", "quarter to eight", verbless and pronoun requests, prefaces, messages
        with contractions, fewer unasked light colours) and more three-call requests;
        5 is version 4 with more open-pool values (80 %), 60 % of their words drawn from
        the tokenizer's word pieces (``_word``), and more requests for the tools whose
        strings are copied (``COPY_TOOLS``); 6 is version 5 (the same draws) with its
        reasoning notes written source first (``_source_first``) and on every turn
        (``think_rate`` 1.0 instead of 0.5: notes the model always writes are notes the
        decoder's note grounding can always hold to what was said); 7 is version 5 (its
        draws and its notes: version 6's notes cost the model multi-call accuracy) with
        wider requests (``_v7``: the volume of "the music", a vacuum "going in" rooms,
        refusals that carry a time, a label or an item, and conversation closings)."""
        if version not in (1, 2, 3, 4, 5, 6, 7):
            raise ValueError(f"data version must be 1 to 7, got {version!r}")
        self.version = version
        if version == 1:
            self.rng = random.Random(seed)
        else:
            self.rng = _VersionedRandom(seed)
            self.rng.diverse = 0.8 if version >= 5 else 0.5
            self.rng.more_phrasings = version >= 4
            self.rng.vocab_values = version >= 5
            self.rng.wider_requests = version >= 7
        self.catalogue = catalogue or load_catalogue()
        self.by_name = {t["name"]: t for t in self.catalogue}
        self.think_rate = (1.0 if version == 6 else 0.5) if think_rate is None else think_rate
        self.typo_rate = typo_rate
        self._specs = None

    def _ranked(self, query):
        """Catalogue tool names in the agent's BM25 order for ``query`` (version 2)."""
        if self.version < 2:
            return None
        from needle_cy.retrieval import bm25_index, rank_bm25
        from needle_cy.toolspec import normalize_tools
        if self._specs is None:
            self._specs = normalize_tools(self.catalogue)
            self._index = bm25_index(self._specs)
        return [self._specs[i].name for i in rank_bm25(query, self._specs, self._index)]

    def _results(self, results):
        return json.dumps(results) if self.version >= 2 else results

    # one call / several calls on the catalogue
    def _home_calls(self, n_calls, names=None):
        rng = self.rng
        if names is None:
            names = rng.sample(list(GENERATORS), n_calls)
            if _v5(rng, 0.5):
                copy = _pick(rng, COPY_TOOLS)       # version 5: more strings to copy
                if copy not in names:
                    names[rng.randrange(n_calls)] = copy
        clauses, calls, notes = [], [], []
        for name in names:
            clause, call, note = GENERATORS[name](rng)
            clauses.append(clause)
            calls.append(call)
            notes.append(note)
        if n_calls == 1:
            query = _wrap(rng, clauses[0])
            if _v4(rng, 0.15):
                reasons = REASONS.get(names[0], [])
                lead = _pick(rng, reasons) if reasons and rng.random() < 0.5 else _pick(rng, PREFACES)
                query = lead + query
        else:
            text = clauses[0]
            for c in clauses[1:]:
                j = _pick(rng, JOINERS)
                if j.startswith(". "):
                    c = c[:1].upper() + c[1:]
                text += j + c
            query = _wrap(rng, text) if rng.random() < 0.5 else text
        return query, calls, notes

    def example(self):
        example = self._example()
        return self._pack(example) if self.version >= 3 else example

    def _pack(self, example):
        """Version 3: one to three more requests follow the first in the same conversation
        (as a user does with a running agent: the prompt's tool list stays), each on the
        rendered catalogue tools or a request no tool covers.  Every assistant turn is a
        training target (the tokenizer weights them all and drops trailing turns that do
        not fit the context), so the ~370 tokens of the tool list teach several answers
        instead of one."""
        rng = self.rng
        if example.get("history"):
            return example
        names = [t["name"] for t in example["tools"]
                 if t["name"] in GENERATORS and self.by_name.get(t["name"]) == t]
        turns = [{"query": example["query"], "reasoning": example["reasoning"],
                  "answers": example["answers"]}]
        copy = [n for n in names if n in COPY_TOOLS]
        for _ in range(rng.choice([1, 2, 3, 3])):
            r = rng.random()
            if names and r < 0.55:
                if copy and _v5(rng, 0.5):
                    query, calls, notes = self._home_calls(1, [rng.choice(copy)])
                else:
                    query, calls, notes = self._home_calls(1, [rng.choice(names)])
            elif len(names) >= 2 and r < 0.7:
                query, calls, notes = self._home_calls(2, rng.sample(names, 2))
            else:
                query, calls, notes = _wrap(rng, _pick(rng, CHITCHAT + REFUSAL_ACTIONS)), [], []
            by_name = dict(self.by_name)
            by_name.update({t["name"]: t for t in example["tools"]})
            if self.typo_rate and rng.random() < 0.35:
                query = _typos(rng, query, _free_strings(calls, by_name), self.typo_rate * 4)
            query = _capitalise(rng, query)
            reasoning = (_reasoning(calls, notes, self.version == 6) if calls
                         else "no tool covers this request")
            turns.append({"query": query, "answers": calls,
                          "reasoning": reasoning if rng.random() < self.think_rate else ""})
        packed = dict(example, history=turns[:-1], packed=len(turns))   # kind: the first turn's
        packed.update(turns[-1])
        return packed

    def _example(self):
        rng = self.rng
        r = rng.random()
        tools_pool = self.catalogue
        if r < 0.50:
            query, calls, notes = self._home_calls(1)
            kind = "single"
        elif r < 0.68:
            query, calls, notes = self._home_calls(rng.choice([2, 2, 3] if self.version < 4 else [2, 2, 3, 3]))
            kind = "multi"
        elif r < 0.84:
            kind = "refuse"
            calls, notes = [], []
            if rng.random() < 0.5:
                query, near = _refusal_near_miss(rng)
                needed = [self.by_name[n] for n in near if rng.random() < 0.7][:MAX_RENDERED_TOOLS]
                query = _wrap(rng, query)
                tools = _render_tools(rng, needed, tools_pool, ranked=self._ranked(query))
                reasoning = "no tool covers this request"
                return self._finish(kind, query, tools, calls, [reasoning])
            if _v7(rng, 0.25):
                query = _pick(rng, CLOSINGS)
            else:
                query = _wrap(rng, _pick(rng, CHITCHAT + REFUSAL_ACTIONS))
        elif r < 0.95:
            kind = "invented"
            tool, query, call, note = _invent_tool(rng)
            query = _wrap(rng, query)
            pool = [t for t in tools_pool] + [_invented_refusal_tool(rng) for _ in range(3)]
            pool = [t for t in pool if t["name"] != tool["name"]]
            if self.version >= 2:   # two invented tools may share a name (version 1 kept both)
                pool = list({t["name"]: t for t in pool}.values())
            tools = _render_tools(rng, [tool], pool)
            return self._finish(kind, query, tools, [call], [note])
        else:
            kind = "invented_refuse"
            tool = _invented_refusal_tool(rng)
            query = _wrap(rng, _pick(rng, CHITCHAT + REFUSAL_ACTIONS))
            tools = [tool] + ([] if rng.random() < 0.5 else rng.sample(tools_pool, rng.randint(1, 4)))
            rng.shuffle(tools)
            return self._finish(kind, query, tools, [], ["no tool covers this request"])
        needed = [self.by_name[c["name"]] for c in calls]
        tools = _render_tools(rng, needed, tools_pool, ranked=self._ranked(query))
        if kind == "refuse":
            notes = ["no tool covers this request"]
        return self._finish(kind, query, tools, calls, notes)

    def _finish(self, kind, query, tools, calls, notes):
        rng = self.rng
        by_name = dict(self.by_name)
        by_name.update({t["name"]: t for t in tools})
        if self.typo_rate and rng.random() < 0.35:
            query = _typos(rng, query, _free_strings(calls, by_name), self.typo_rate * 4)
        query = _capitalise(rng, query)
        if calls:
            reasoning = _reasoning(calls, notes, self.version == 6)
        else:
            reasoning = notes[0] if notes else ""
        example = {"kind": kind, "system": _system(rng), "tools": tools, "query": query,
                   "reasoning": reasoning if rng.random() < self.think_rate else "",
                   "answers": calls, "history": []}
        # a previous turn and its tool results, sometimes
        if calls and rng.random() < 0.08:
            example = self._follow_up(example)
        return example

    def _follow_up(self, example):
        """Turn the example into a second-turn case: after the results come back the
        answer is [] (done), or a new request is answered with its calls."""
        rng = self.rng
        results = [{"name": c["name"], "result": _pick(rng, ["ok", "done", {"status": "ok"}, {"ok": True}])}
                   for c in example["answers"]]
        if rng.random() < 0.6:
            example["history"] = [{"query": example["query"], "reasoning": "",
                                   "answers": example["answers"]}]
            example["query"] = compact(results) if self.version < 2 else json.dumps(results)
            example["is_result"] = True
            example["answers"] = []
            example["reasoning"] = ""
            example["kind"] = "result"
            return example
        first_query, first_calls, _ = self._home_calls(1)
        example["history"] = [{"query": first_query, "reasoning": "", "answers": first_calls,
                               "results": self._results([{"name": c["name"], "result": "ok"}
                                                         for c in first_calls])}]
        needed = []
        for c in first_calls + example["answers"]:
            tool = {t["name"]: t for t in example["tools"]}.get(c["name"]) or self.by_name[c["name"]]
            if tool not in needed:
                needed.append(tool)
        if len(needed) <= MAX_RENDERED_TOOLS:
            example["tools"] = _render_tools(rng, needed, self.catalogue)
        else:
            example["history"] = []
        return example


def drop_last_turn(example):
    """The conversation without its final request (its last history turn becomes the
    final one), or None when it has a single turn."""
    history = example.get("history") or []
    if not history or history[-1].get("results") is not None:
        return None
    out = dict(example, history=history[:-1])
    out.update({k: history[-1][k] for k in ("query", "reasoning", "answers")})
    out.pop("is_result", None)
    return out


def generate(n, seed=0, **kwargs):
    """``n`` examples; keyword arguments go to ``Generator`` (e.g. ``version=2``)."""
    gen = Generator(seed=seed, **kwargs)
    return [gen.example() for _ in range(n)]


def render(example):
    """(prompt, target) strings of the Needle template (spec §7.1, §7.3)."""
    parts, target = render_parts(example)
    return "".join(parts), target


def render_parts(example):
    """(prompt parts, target) of ``render``: plain ``str`` parts are the template, and
    ``prompt.OutsideText`` parts the text that comes from outside it at inference (system
    facts, the tools JSON, requests, tool results), which ``prompt.encode_template``
    encodes with marker spellings as text, as the agent does."""
    from needle_cy.prompt import OutsideText

    system = (example.get("system") or "").strip()
    parts = [f"{IM_START}system\n", OutsideText(system), f"{IM_END}\n"] if system else []
    parts += [f"{IM_START}user\n{TOOLS_START}", OutsideText(compact(example["tools"])), f"{TOOLS_END}\n"]
    history = example.get("history") or []
    for i, turn in enumerate(history):
        if i:
            parts.append(f"{IM_START}user\n")
        parts += [OutsideText(turn["query"]), f"{IM_END}\n{IM_START}assistant\n",
                  _target(turn.get("reasoning", ""), turn["answers"]) + "\n"]
        if turn.get("results") is not None:
            results = turn["results"]     # a string is inserted verbatim, as the agent does
            results = results if isinstance(results, str) else compact(results)
            parts += [f"{IM_START}user\n{RESULT_START}", OutsideText(results),
                      f"{RESULT_END}{IM_END}\n{IM_START}assistant\n{CALL_START}[]{CALL_END}{IM_END}\n"]
    if history:
        parts.append(f"{IM_START}user\n")
    if example.get("is_result"):
        parts += [RESULT_START, OutsideText(example["query"]), RESULT_END]
    else:
        parts.append(OutsideText(example["query"]))
    parts.append(f"{IM_END}\n{IM_START}assistant\n")
    return parts, _target(example.get("reasoning", ""), example["answers"])


def has_marker_text(example):
    """Whether a marker's spelling occurs in the example's outside text (then its prompt
    must be encoded by parts: a plain encode would turn the spelling into the marker)."""
    from needle_cy.prompt import OutsideText

    parts, _ = render_parts(example)
    return any(m in part for part in parts if isinstance(part, OutsideText) for m in CHAT_MARKERS)


def _target(reasoning, answers):
    reasoning = (reasoning or "").strip()
    think = f"{THINK_START}\n{reasoning}\n{THINK_END}\n" if reasoning else ""
    return f"{think}{CALL_START}{compact(answers)}{CALL_END}{IM_END}"


def write_jsonl(path, n, seed=0, **kwargs):
    with open(path, "w", encoding="utf-8") as handle:
        for ex in generate(n, seed=seed, **kwargs):
            handle.write(json.dumps(ex, ensure_ascii=False) + "\n")


_EVAL_CATEGORY = {"single": "single", "multi": "multi", "refuse": "refuse",
                  "invented": "single", "invented_refuse": "refuse"}


def eval_cases(n, seed, version=2):
    """Single-turn examples as ``needle_cy.eval`` cases: a held-out synthetic test set
    (use a seed no training run used; from a packed conversation, its first request).
    Catalogue cases carry no tools (the evaluation declares the whole catalogue and the
    agent retrieves, as at inference); cases on invented tools carry the tool list the
    example was drawn with."""
    out = []
    for i, ex in enumerate(generate(n, seed=seed, version=version)):
        if ex.get("packed"):     # versions 3+: the first request of the packed conversation
            ex = dict(ex, history=[], query=ex["history"][0]["query"], answers=ex["history"][0]["answers"])
        if ex.get("history") or ex["kind"] not in _EVAL_CATEGORY:
            continue
        case = {"id": f"s{seed}-{i}", "category": _EVAL_CATEGORY[ex["kind"]],
                "query": ex["query"], "answers": ex["answers"]}
        if ex["kind"].startswith("invented"):
            case["tools"] = ex["tools"]
        out.append(case)
    return out


COPY_PROBE_TEMPLATES = (("Add {} to the shopping list", "add_to_shopping_list", "item"),
                        ("Play some {}", "play_music", "query"),
                        ("Set a 10 minute timer called {}", "set_timer", "label"))


def copy_probe_cases(n_words=40, seed=5):
    """A probe of copying one word into a free string: ``n_words`` lower-case words of
    the open pool and ``n_words`` of the tokenizer's word pieces outside it, each in
    every template of ``COPY_PROBE_TEMPLATES`` (categories ``copy_pool`` and
    ``copy_piece``).  A word that is one piece is written at a string's start as a
    piece the request never shows (no leading space), which a model learns per piece."""
    words = _value_words()
    rng = random.Random(seed)
    pool_words = set(words["words"])
    pool = sorted(w for w in pool_words if w.isalpha() and w.islower())
    pieces = sorted(w for w in words["vocab_words"] if w.islower() and w not in pool_words)
    out = []
    for group, sample in (("pool", rng.sample(pool, n_words)), ("piece", rng.sample(pieces, n_words))):
        for template, tool, key in COPY_PROBE_TEMPLATES:
            for word in sample:
                call = {"name": tool, "arguments": {key: word}}
                if tool == "set_timer":
                    call["arguments"] = {"minutes": 10, key: word}
                out.append({"id": f"copy-{group}-{tool}-{word}", "category": f"copy_{group}",
                            "query": template.format(word), "answers": [call]})
    return out


def main(argv=None):
    import argparse
    parser = argparse.ArgumentParser(description="Generate synthetic Needle training data (JSONL).")
    parser.add_argument("--out", required=True)
    parser.add_argument("-n", type=int, default=10000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--version", type=int, default=1, choices=(1, 2, 3, 4, 5, 6, 7))
    parser.add_argument("--eval-cases", action="store_true",
                        help="write single-turn cases in the needle_cy.eval format instead")
    parser.add_argument("--copy-probe", action="store_true",
                        help="write the copy probe's cases (copy_probe_cases; -n words per group)")
    args = parser.parse_args(argv)
    if args.copy_probe or args.eval_cases:
        cases = copy_probe_cases(args.n, args.seed) if args.copy_probe else \
            eval_cases(args.n, args.seed, args.version)
        with open(args.out, "w", encoding="utf-8") as handle:
            for case in cases:
                handle.write(json.dumps(case, ensure_ascii=False) + "\n")
        return
    write_jsonl(args.out, args.n, seed=args.seed, version=args.version)


if __name__ == "__main__":
    main()


# ------------------------------------------------------------ token roles ---

def token_roles(target, answers):
    """The role of every character of ``target`` (an assistant turn as ``data.render``
    writes it) given its ``answers``: the calls' names, keys and values in the
    ``<tool_call>`` JSON, names and quoted values in the ``<think>`` note."""
    roles = ["struct"] * len(target)
    a, b = target.find("<think>"), target.find("</think>")
    if 0 <= a < b:
        for i in range(a + len("<think>"), b):
            roles[i] = "think"
        note = target[:b]
        for call in answers:
            _mark(roles, note, call["name"], "name", a)
            for v in call["arguments"].values():
                if isinstance(v, str) and v:
                    _mark(roles, note, '"' + v + '"', "value", a, inner=True)
    pos = max(0, target.find("<tool_call>"))
    for call in answers:
        head = '"name":' + json.dumps(call["name"], ensure_ascii=False)
        j = target.find(head, pos)
        if j < 0:
            continue
        for i in range(j + len('"name":"'), j + len(head) - 1):
            roles[i] = "name"
        pos = j + len(head)
        for key, value in call["arguments"].items():
            k = json.dumps(key, ensure_ascii=False) + ":"
            j = target.find(k, pos)
            if j < 0:
                continue
            for i in range(j + 1, j + len(k) - 2):
                roles[i] = "key"
            v = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
            j += len(k)
            if target.startswith(v, j):
                for i in range(j, j + len(v)):
                    roles[i] = "value"
                j += len(v)
            pos = j
    return roles


def _mark(roles, text, needle, role, start, inner=False):
    j = text.find(needle, start)
    if j >= 0:
        lo, hi = (j + 1, j + len(needle) - 1) if inner else (j, j + len(needle))
        for i in range(lo, hi):
            roles[i] = role
