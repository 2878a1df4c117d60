"""Requests as people say them (mix version 5): the tables and the phrasing.

The schema-general generator (``tool_requests``) builds a request from the tool's own
words: its name's verb and noun, its description's first clause, its properties' names.
A request built that way shares most of its words with its tool (BM25 finds the gold tool
for nearly every one, far more often than for hand-written requests: docs/training.md),
so a model trained on it learns to match words.  People say "grab the weather in Dublin for
16 days", "what's the temp in the kitchen?", "text Anna: running late".

With ``rng.paraphrase`` (``ToolPlan.request``) a request is said from the tool's action
read apart (``Action``: verb, object, the phrases after the object):

* the verb and the object's head noun are swapped, per request, for words people use
  (``VERBS``, ``NOUNS``: hand-written tables of common consumer and developer API words),
  fillers ("current", "information", "a list of") and some modifiers are dropped, and a
  noun may be said as a clause ("how warm it is", ``CLAUSES``);
* a phrase that only points at an argument ("for the location", "at a certain distance")
  is filled with the argument's value ("the definition of a word" -> "the definition of
  opera") or left out, the value said elsewhere;
* arguments whose value shows its kind (places, people, dates, times, numbers with a
  unit, titles) are said without the property's name most of the time;
* the object goes when an argument says it ("call the contact Logan" -> "call Logan"),
  and a getter is asked as a question ("what's the weather in Dublin?"), a bare noun
  phrase ("weather in Dublin for 16 days"), a need ("I'm after …") or after the
  situation ("I'm in Dublin this week, what's it like outside?"), not only as a command.

Every draw here happens only with the knob on, so earlier versions' streams are unchanged.
Values are never touched: the phrasing only moves the words around them.
"""
import re

# How often a request says the tool's verb, the object's head noun and a property's name
# in other words, and keeps a detail phrase after the object.  Set on the BM25 figure of
# version 5's held-out cases (``python -m needle_cy.eval --naturalness``): it puts the
# gold tool first about as often as on hand-written request sets (docs/training.md).
VERB_RATE, NOUN_RATE, MENTION_RATE, KEEP_DETAIL = 0.85, 0.85, 0.7, 0.4

# ------------------------------------------------------------------ tables ---
# Hand-written.  A verb's entries are what people say for it before the same object ("get
# the forecast" -> "pull up the forecast"); a phrasal verb whose particle is already in
# the object ("turn on") is its own key.
VERBS = {
    "get": ["grab", "pull up", "get me", "give me", "find me"],
    "retrieve": ["get", "pull up", "grab", "bring up", "get me"],
    "fetch": ["get", "grab", "pull up", "bring up"],
    "obtain": ["get", "grab", "get me"],
    "show": ["show me", "let me see", "pull up", "bring up"],
    "display": ["show me", "show", "bring up", "put up"],
    "list": ["show me", "give me", "run through", "go through", "tell me"],
    "find": ["look for", "track down", "dig up", "hunt down", "find me"],
    "search": ["look up", "look for", "hunt for", "dig up"],
    "lookup": ["look up", "check", "find"],
    "look": ["check", "find"],
    "check": ["look at", "have a look at", "take a look at", "check on", "look up"],
    "view": ["see", "look at", "show me", "open"],
    "read": ["check", "show me", "read out"],
    "query": ["look up", "check", "ask about"],
    "calculate": ["work out", "figure out", "tell me", "crunch"],
    "compute": ["work out", "figure out", "tell me"],
    "determine": ["work out", "figure out", "find out"],
    "estimate": ["guess", "ballpark", "work out", "roughly work out"],
    "predict": ["guess", "forecast", "work out"],
    "measure": ["check", "tell me"],
    "identify": ["figure out", "work out", "spot", "tell me"],
    "analyze": ["look into", "break down", "go over", "dig into"],
    "analyse": ["look into", "break down", "go over", "dig into"],
    "evaluate": ["assess", "size up", "judge", "look over"],
    "assess": ["size up", "judge", "look over"],
    "review": ["go over", "look over", "check"],
    "summarize": ["sum up", "give me the gist of", "boil down", "recap"],
    "summarise": ["sum up", "give me the gist of", "boil down", "recap"],
    "provide": ["give me", "get me", "share", "tell me"],
    "return": ["give me", "get me", "tell me"],
    "give": ["get me", "hand me", "tell me"],
    "tell": ["give me", "let me know"],
    "create": ["make", "set up", "add", "put together"],
    "generate": ["make", "come up with", "produce", "put together"],
    "build": ["put together", "make", "set up"],
    "compose": ["write", "draft", "put together"],
    "draft": ["write", "put together", "jot"],
    "write": ["draft", "put together", "jot"],
    "insert": ["put in", "add", "stick in"],
    "delete": ["get rid of", "remove", "erase", "wipe", "scrap", "bin"],
    "remove": ["take off", "get rid of", "drop", "take out"],
    "clear": ["wipe", "cancel", "get rid of"],
    "update": ["change", "edit", "tweak", "amend"],
    "edit": ["change", "tweak", "fix"],
    "modify": ["change", "tweak", "alter"],
    "change": ["switch", "swap", "alter"],
    "set": ["change", "adjust"],
    "adjust": ["change", "tweak", "move"],
    "configure": ["set up", "tweak"],
    "send": ["fire off", "shoot off", "shoot"],
    "share": ["send", "pass on", "forward"],
    "post": ["put up", "share", "publish"],
    "publish": ["put out", "post", "release"],
    "submit": ["send in", "hand in", "file"],
    "start": ["kick off", "begin", "fire up", "launch"],
    "begin": ["start", "kick off"],
    "launch": ["start", "fire up", "open"],
    "run": ["kick off", "fire off", "start"],
    "execute": ["run", "kick off"],
    "perform": ["do", "run", "carry out"],
    "initiate": ["start", "kick off"],
    "trigger": ["set off", "fire", "kick off"],
    "stop": ["end", "kill", "halt", "shut off"],
    "end": ["stop", "finish", "wrap up"],
    "pause": ["hold", "freeze", "put on hold"],
    "resume": ["continue", "carry on with", "pick up"],
    "cancel": ["call off", "scrap", "drop", "kill"],
    "book": ["reserve", "grab", "get me"],
    "reserve": ["book", "hold", "grab"],
    "schedule": ["set up", "plan", "arrange", "pencil in", "put in"],
    "plan": ["map out", "work out", "sort out"],
    "arrange": ["sort out", "set up", "organise"],
    "organize": ["sort out", "arrange", "tidy up"],
    "open": ["open up", "bring up", "pull up"],
    "close": ["shut", "close up"],
    "enable": ["turn on", "switch on", "activate"],
    "disable": ["turn off", "switch off", "kill"],
    "activate": ["turn on", "switch on", "enable"],
    "deactivate": ["turn off", "switch off", "disable"],
    "turn on": ["switch on", "put on", "flip on"],
    "turn off": ["switch off", "kill", "shut off"],
    "switch on": ["turn on", "put on"],
    "switch off": ["turn off", "kill"],
    "play": ["put on", "stream", "queue up", "blast"],
    "stream": ["play", "put on"],
    "watch": ["put on", "stream"],
    "translate": ["convert"],
    "convert": ["change", "switch"],
    "track": ["follow", "keep tabs on", "watch"],
    "monitor": ["watch", "keep an eye on", "track"],
    "record": ["log", "note down", "jot down", "write down"],
    "log": ["note down", "record", "jot down", "write down"],
    "save": ["keep", "store", "hang on to"],
    "store": ["save", "keep"],
    "invite": ["ask", "bring in"],
    "notify": ["ping", "alert", "tell"],
    "alert": ["ping", "warn", "tell"],
    "remind": ["nudge", "ping"],
    "order": ["get me", "buy", "pick up"],
    "buy": ["get", "pick up", "purchase", "grab"],
    "purchase": ["buy", "get", "pick up"],
    "pay": ["settle", "cover", "send money for"],
    "transfer": ["send", "move", "wire"],
    "compare": ["weigh up", "stack up", "put side by side"],
    "suggest": ["recommend", "come up with", "pick"],
    "recommend": ["suggest", "come up with", "pick"],
    "reset": ["clear", "restart", "wipe"],
    "restart": ["reboot", "bounce", "cycle"],
    "reboot": ["restart", "bounce"],
    "lock": ["lock up", "secure"],
    "unlock": ["open", "undo the lock on"],
    "arm": ["set", "turn on"],
    "disarm": ["turn off", "switch off"],
    "upload": ["put up", "push"],
    "download": ["grab", "pull down", "save"],
    "install": ["put on", "set up"],
    "uninstall": ["remove", "get rid of"],
    "verify": ["double-check", "confirm", "make sure of"],
    "validate": ["check", "double-check", "verify"],
    "confirm": ["lock in", "OK", "double-check"],
    "approve": ["OK", "sign off on", "green-light"],
    "reject": ["turn down", "decline", "knock back"],
    "rate": ["score", "review", "give a rating to"],
    "register": ["sign up", "enrol"],
    "join": ["hop on", "get into", "jump into"],
    "leave": ["exit", "drop out of", "get out of"],
    "mute": ["silence", "quiet"],
    "unmute": ["turn the sound back on for"],
    "skip": ["jump past", "move past"],
    "increase": ["turn up", "raise", "bump up", "crank up"],
    "decrease": ["turn down", "lower", "bring down"],
    "raise": ["turn up", "bump up", "increase"],
    "lower": ["turn down", "bring down", "drop"],
    "dim": ["lower", "turn down"],
    "brighten": ["turn up", "light up"],
    "move": ["shift", "shove", "put"],
    "copy": ["duplicate", "clone"],
    "rename": ["retitle", "change the name of"],
    "assign": ["give", "hand", "hand over"],
    "mark": ["flag", "tag"],
    "flag": ["mark", "tag"],
    "refresh": ["reload", "update"],
    "reload": ["refresh", "update"],
    "sync": ["sync up", "bring up to date"],
    "scan": ["sweep", "check"],
    "filter": ["narrow down", "sift"],
    "sort": ["order", "arrange", "put in order"],
    "count": ["tally", "add up"],
    "call": ["ring", "phone", "dial"],
    "contact": ["reach out to", "get hold of", "get in touch with"],
    "follow": ["keep up with", "subscribe to"],
    "block": ["shut out", "ban"],
    "clean": ["tidy", "clean up"],
    "cook": ["make", "fix"],
    "prepare": ["make", "fix", "get ready"],
    "manage": ["handle", "sort out", "deal with"],
    "control": ["adjust", "handle"],
    "apply": ["use", "put on"],
    "solve": ["work out", "crack", "figure out"],
    "draw": ["sketch", "make"],
    "plot": ["chart", "graph", "draw"],
    "roll": ["throw"],
    "flip": ["toss"],
    "greet": ["say hi to", "welcome"],
    "extract": ["pull out", "grab", "get"],
    "merge": ["combine", "join", "put together"],
    "split": ["break up", "divide"],
    "parse": ["read", "break down"],
    "format": ["tidy up", "lay out"],
    "replace": ["swap out", "switch out"],
    "transcribe": ["write out", "type up"],
    "detect": ["spot", "pick up", "catch"],
    "access": ["get into", "open", "get to"],
    "subscribe": ["sign up for", "join"],
    "unsubscribe": ["opt out", "stop"],
    "authenticate": ["log in", "sign in"],
    "backup": ["back up", "save a copy of"],
    "restore": ["bring back", "roll back"],
    "charge": ["top up", "power up"],
    "water": ["give water to"],
    "locate": ["find", "track down", "dig up"],
    "toggle": ["flip", "switch"],
    "select": ["pick", "choose", "go with"],
    "request": ["ask for"],
    "snooze": ["push back", "put off"],
    "press": ["push", "hit"],
    "speak": ["say", "read out"],
    "load": ["open", "bring up", "pull up"],
    "dismiss": ["clear", "close", "get rid of"],
    "capture": ["grab", "take"],
    "invoke": ["run", "call"],
    "mix": ["blend", "combine"],
    "subtract": ["take away"],
    "feed": ["give food to"],
    "wash": ["clean"],
    "preheat": ["warm up", "heat up"],
    "heat": ["warm up"],
    "cool": ["chill", "cool down"],
    "encrypt": ["lock", "scramble"],
    "decrypt": ["unlock", "unscramble"],
}

# Hand-written.  A noun (singular; a plural in the text takes a plural substitute) and
# what people call it instead.  Multi-word keys are matched before their words.
NOUNS = {
    # weather and the outdoors
    "weather": ["conditions", "outlook", "weather outside"],
    "weather condition": ["weather", "conditions"],
    "weather forecast": ["forecast", "weather", "outlook"],
    "weather data": ["weather", "conditions"],
    "weather report": ["weather", "forecast"],
    "forecast": ["outlook", "prediction"],
    "temperature": ["temp", "temps"],
    "humidity": ["damp", "moisture", "mugginess"],
    "air quality": ["air", "pollution", "smog"],
    "air quality index": ["AQI", "pollution", "air"],
    "precipitation": ["rain", "rainfall"],
    "rainfall": ["rain"],
    "wind speed": ["wind", "breeze"],
    "sunrise": ["dawn", "sunup"],
    "sunset": ["dusk", "sundown"],
    "uv index": ["UV", "sun strength"],
    "pollen count": ["pollen", "hay fever level"],
    "tide": ["tide times", "water level"],
    "earthquake": ["quake", "tremor"],
    # time and the calendar
    "time": ["hour", "clock"],
    "date": ["day"],
    "time zone": ["zone", "local time"],
    "timezone": ["zone", "local time"],
    "appointment": ["slot", "booking", "visit"],
    "meeting": ["call", "catch-up", "sync"],
    "event": ["plan", "entry"],
    "calendar": ["schedule", "agenda", "planner"],
    "calendar event": ["event", "entry", "plan"],
    "schedule": ["timetable", "agenda", "plan"],
    "reminder": ["alert", "heads-up"],
    "alarm": ["wake-up call", "buzzer"],
    "timer": ["countdown"],
    "deadline": ["due date", "cut-off"],
    "holiday": ["day off", "bank holiday"],
    "birthday": ["bday", "big day"],
    "availability": ["free slots", "openings", "free time"],
    "duration": ["length", "time"],
    "countdown": ["timer"],
    # messages and people
    "message": ["text", "note", "msg", "line"],
    "text message": ["text", "SMS"],
    "sms": ["text", "message"],
    "email": ["mail", "e-mail", "note"],
    "email address": ["email", "address", "inbox"],
    "inbox": ["mail", "messages"],
    "notification": ["alert", "ping", "heads-up"],
    "conversation": ["chat", "thread"],
    "chat": ["conversation", "thread"],
    "thread": ["conversation", "chat"],
    "phone call": ["call", "ring"],
    "phone number": ["number", "phone", "mobile"],
    "voicemail": ["voice message", "messages"],
    "contact": ["person", "friend"],
    "contact list": ["contacts", "address book"],
    "recipient": ["person"],
    "post": ["update", "status"],
    "comment": ["reply", "remark"],
    "tweet": ["post"],
    "newsletter": ["mailing list", "digest"],
    "subscription": ["sub", "plan", "membership"],
    "invitation": ["invite"],
    "friend request": ["request", "add"],
    "user": ["person", "member"],
    "user profile": ["profile", "account"],
    "username": ["handle", "login"],
    "profile": ["account", "page"],
    "account": ["profile", "login"],
    "customer": ["client", "buyer"],
    "employee": ["staff member", "worker"],
    "team member": ["colleague", "teammate"],
    "member": ["person", "user"],
    "follower": ["fan"],
    # money
    "account balance": ["balance", "money"],
    "stock price": ["share price", "price", "quote"],
    "stock": ["share", "ticker"],
    "stock quote": ["quote", "share price"],
    "share price": ["stock price", "price"],
    "price": ["cost"],
    "cost": ["price", "damage"],
    "exchange rate": ["rate", "conversion rate"],
    "currency": ["money"],
    "payment": ["transfer", "bill"],
    "transaction": ["payment", "charge", "purchase"],
    "invoice": ["bill"],
    "bill": ["invoice", "charge"],
    "budget": ["spending plan", "allowance"],
    "expense": ["spending", "cost", "outgoing"],
    "loan": ["borrowing", "credit"],
    "interest rate": ["rate", "interest"],
    "mortgage": ["home loan"],
    "tax": ["taxes"],
    "dividend": ["payout"],
    "portfolio": ["investments", "holdings"],
    "revenue": ["sales", "income", "takings"],
    "salary": ["pay", "wage"],
    "discount": ["deal", "offer", "promo"],
    "coupon": ["voucher", "promo code"],
    "refund": ["money back"],
    "credit card": ["card"],
    "bank account": ["account"],
    "cryptocurrency": ["crypto", "coin"],
    "credit score": ["credit rating", "score"],
    "net worth": ["wealth"],
    # shopping, food and places to go
    "product": ["item", "thing"],
    "item": ["thing"],
    "order": ["purchase", "delivery"],
    "shipment": ["delivery", "parcel"],
    "shipping": ["delivery", "postage"],
    "delivery": ["drop-off"],
    "shopping list": ["list", "grocery list"],
    "shopping cart": ["basket", "cart"],
    "cart": ["basket", "trolley"],
    "review": ["rating", "opinion", "write-up"],
    "rating": ["score", "stars"],
    "recommendation": ["suggestion", "idea", "pick"],
    "suggestion": ["idea", "pick"],
    "store": ["shop"],
    "restaurant": ["place to eat", "spot", "eatery"],
    "reservation": ["booking", "table"],
    "recipe": ["dish", "meal idea"],
    "meal": ["food", "dinner"],
    "nutrition information": ["nutrition", "calories"],
    "nutritional information": ["nutrition", "calories"],
    "calorie": ["cal", "kcal"],
    "ingredient": ["stuff needed"],
    "menu": ["food options"],
    # travel and maps
    "flight": ["plane", "plane ticket"],
    "flight status": ["flight", "plane"],
    "hotel": ["place to stay", "room"],
    "accommodation": ["place to stay", "lodging"],
    "booking": ["reservation"],
    "ticket": ["pass", "seat"],
    "trip": ["journey", "travel"],
    "itinerary": ["plan", "trip plan"],
    "destination": ["place", "where I'm going"],
    "direction": ["route", "way"],
    "route": ["way", "path"],
    "travel time": ["journey time", "time"],
    "traffic": ["roads", "congestion"],
    "traffic condition": ["traffic", "roads"],
    "location": ["place", "spot", "whereabouts"],
    "address": ["place", "street address"],
    "coordinate": ["position", "lat and long"],
    "point of interest": ["place to see", "sight", "spot"],
    "attraction": ["sight", "thing to see"],
    "landmark": ["sight", "spot"],
    "vehicle": ["car", "ride"],
    "car": ["ride", "vehicle"],
    "ride": ["lift", "cab", "taxi"],
    "taxi": ["cab", "ride"],
    "parking": ["parking spot", "place to park"],
    "parking spot": ["space", "place to park"],
    "public transport": ["transit", "the bus"],
    "gas station": ["petrol station", "fuel stop"],
    "charging station": ["charger", "plug"],
    "train": ["rail"],
    "neighborhood": ["area", "part of town"],
    "neighbourhood": ["area", "part of town"],
    "region": ["area"],
    "city": ["town", "place"],
    "country": ["nation"],
    "zip code": ["postcode", "zip"],
    "postal code": ["postcode", "zip"],
    # media
    "song": ["track", "tune"],
    "music": ["tunes", "songs"],
    "playlist": ["mix", "list"],
    "album": ["record"],
    "artist": ["singer", "band"],
    "podcast": ["show", "episode"],
    "episode": ["ep", "instalment"],
    "movie": ["film", "flick"],
    "film": ["movie"],
    "tv show": ["show", "series"],
    "show": ["series", "programme"],
    "video": ["clip"],
    "speaker volume": ["sound", "loudness"],
    "audio volume": ["sound", "loudness"],
    "radio station": ["station", "radio"],
    "lyric": ["words"],
    "book": ["novel", "read"],
    "news": ["headlines", "latest"],
    "news article": ["story", "article"],
    "article": ["story", "piece"],
    "headline": ["top story"],
    "photo": ["picture", "pic", "shot"],
    "image": ["picture", "pic"],
    "picture": ["photo", "pic"],
    "game": ["match"],
    "score": ["result"],
    "match": ["game", "fixture"],
    "sport": ["sports"],
    "standing": ["table", "rankings"],
    "horoscope": ["stars", "reading"],
    "zodiac sign": ["star sign", "sign"],
    "joke": ["gag", "something funny"],
    "quote": ["quotation", "saying"],
    "fact": ["tidbit", "bit of trivia"],
    "trivia": ["quiz question", "fun fact"],
    "riddle": ["puzzle", "brain teaser"],
    # the home
    "light": ["lamp", "lights"],
    "lamp": ["light"],
    "brightness": ["light level"],
    "thermostat": ["heating", "heat"],
    "heating": ["heat", "radiators"],
    "air conditioner": ["AC", "aircon", "cooling"],
    "air conditioning": ["AC", "aircon", "cooling"],
    "garage door": ["garage"],
    "blind": ["shade", "curtain"],
    "curtain": ["drapes", "blinds"],
    "security system": ["alarm", "security"],
    "alarm system": ["alarm", "security"],
    "camera": ["cam", "camera feed"],
    "robot vacuum": ["robot", "hoover", "robot hoover"],
    "vacuum": ["hoover", "robot"],
    "vacuum cleaner": ["hoover", "robot"],
    "washing machine": ["washer", "laundry"],
    "refrigerator": ["fridge"],
    "oven": ["cooker"],
    "sprinkler": ["watering", "irrigation"],
    "scene": ["mode", "setup"],
    "device": ["gadget"],
    "smart plug": ["plug", "socket"],
    "television": ["telly", "TV", "screen"],
    "tv": ["telly", "screen"],
    "speaker": ["smart speaker"],
    "energy usage": ["power use", "electricity"],
    "energy consumption": ["power use", "electricity"],
    "power consumption": ["power use", "electricity"],
    "battery level": ["charge", "battery"],
    "battery": ["charge"],
    "appliance": ["machine"],
    # health
    "workout": ["exercise", "training", "run"],
    "exercise": ["workout", "training"],
    "step count": ["steps"],
    "heart rate": ["pulse", "heartbeat"],
    "blood pressure": ["BP"],
    "sleep": ["rest", "night"],
    "medication": ["meds", "pills"],
    "medicine": ["meds"],
    "prescription": ["script", "meds"],
    "doctor": ["GP", "physician"],
    "symptom": ["problem", "issue"],
    "water intake": ["water", "drinking"],
    "body mass index": ["BMI"],
    "calorie intake": ["calories", "food"],
    # work and documents
    "task": ["to-do", "job", "chore"],
    "to-do list": ["list", "to-dos"],
    "todo": ["task", "to-do"],
    "note": ["memo", "jotting"],
    "document": ["doc", "file"],
    "file": ["doc", "document"],
    "folder": ["directory"],
    "spreadsheet": ["sheet"],
    "presentation": ["slides", "deck"],
    "project": ["work", "job"],
    "report": ["summary", "write-up"],
    "summary": ["recap", "rundown", "gist"],
    "definition": ["meaning"],
    "meaning": ["definition"],
    "synonym": ["other word"],
    "word": ["term"],
    "password": ["login", "passcode"],
    "permission": ["access", "rights"],
    "setting": ["option", "preference"],
    "preference": ["setting"],
    "status": ["state"],
    "progress": ["status"],
    "history": ["record", "track record"],
    "log": ["record", "history"],
    "record": ["entry"],
    "entry": ["record", "item"],
    "detail": ["info", "specifics"],
    "information": ["info", "details"],
    "info": ["details"],
    "data": ["numbers", "figures", "info"],
    "statistic": ["stat", "number", "figure"],
    "stat": ["number", "figure"],
    "result": ["outcome"],
    "search result": ["result", "hit"],
    "keyword": ["term", "word"],
    "category": ["kind", "type"],
    "type": ["kind", "sort"],
    "feedback": ["comments", "thoughts"],
    "survey": ["poll", "questionnaire"],
    "question": ["query"],
    "answer": ["reply"],
    "translation": ["version"],
    # developer tools
    "repository": ["repo", "codebase"],
    "pull request": ["PR", "merge request"],
    "commit": ["change"],
    "issue": ["bug", "ticket"],
    "bug": ["issue", "defect"],
    "deployment": ["deploy", "release", "rollout"],
    "release": ["version", "build"],
    "build": ["CI run", "compile"],
    "pipeline": ["CI", "workflow"],
    "container": ["docker container", "box"],
    "server": ["box", "machine", "host"],
    "instance": ["VM", "machine", "server"],
    "virtual machine": ["VM", "box"],
    "database": ["DB"],
    "endpoint": ["route", "URL"],
    "api key": ["key", "token"],
    "access token": ["token", "key"],
    "token": ["key", "credential"],
    "webhook": ["hook", "callback"],
    "credential": ["login", "keys"],
    "secret": ["key"],
    "environment variable": ["env var", "setting"],
    "configuration": ["config", "setup"],
    "config": ["settings", "setup"],
    "dependency": ["package", "library"],
    "script": ["code"],
    "error": ["failure", "problem"],
    "error log": ["errors", "logs"],
    "log file": ["logs"],
    "metric": ["number", "stat", "measurement"],
    "dashboard": ["overview", "board"],
    "domain": ["site"],
    "website": ["site", "page"],
    "web page": ["page", "site"],
    "webpage": ["page", "site"],
    "url": ["link", "address"],
    "ip address": ["IP"],
    "certificate": ["cert"],
    "backup": ["copy", "snapshot"],
    "storage": ["space", "disk"],
    "disk space": ["space", "room left"],
    "disk usage": ["space used"],
    "memory usage": ["RAM use", "memory"],
    "cpu usage": ["processor load", "CPU"],
    "job": ["task", "run"],
    "workflow": ["flow", "automation"],
    "dataset": ["data"],
    "workspace": ["space", "team"],
    "branch": ["line of work"],
    "function": ["routine"],
    "request": ["call"],
    "response": ["reply", "answer"],
    "query": ["search"],
    "command": ["instruction", "order"],
    "mode": ["setting"],
    "option": ["choice"],
    "level": ["setting"],
    "rule": ["policy"],
    "identifier": ["ID", "reference"],
    "unique identifier": ["reference", "ref", "code"],
    "unique id": ["reference", "ref", "code"],
    "entity": ["device"],
    "automation": ["routine"],
    "routine": ["schedule", "habit"],
    "program": ["cycle"],
    "recording": ["clip"],
    "snapshot": ["picture", "still"],
    "screenshot": ["screen grab", "screen capture"],
    "registration": ["sign-up"],
    "provider": ["company", "supplier"],
    "sensor": ["detector"],
    "valve": ["tap"],
    "cover": ["blinds", "shutter"],
    "climate": ["heating", "AC"],
    "fan": ["ceiling fan", "blower"],
    "humidifier": ["moisture machine"],
    "media": ["music", "playback"],
    "playback": ["music", "what's playing"],
    "track": ["song", "tune"],
    "player": ["athlete"],
    "ranking": ["standings", "position", "place"],
    "activity": ["thing to do"],
    "instrument": ["axe"],
    "concert": ["gig", "show"],
    "lawyer": ["attorney", "solicitor"],
    "stylist": ["hairdresser", "barber"],
    "painting": ["picture", "artwork"],
    "artwork": ["art", "piece"],
    "trait": ["quality", "characteristic"],
    "analysis": ["breakdown", "rundown"],
    "alert": ["warning", "notification"],
    "content": ["stuff", "material"],
    "limit": ["cap", "ceiling"],
    "size": ["dimensions"],
    "capacity": ["room", "space"],
    "amount": ["sum", "figure"],
    "count": ["number", "tally"],
    "difference": ["gap"],
    "growth": ["increase", "rise"],
    "sequence": ["series"],
    "velocity": ["speed"],
    "person": ["someone"],
    # numbers and measures
    "sum": ["total"],
    "total": ["sum"],
    "average": ["mean"],
    "percentage": ["percent", "share"],
    "square root": ["root"],
    "equation": ["problem", "maths problem"],
    "calculation": ["maths", "sum"],
    "population": ["number of people", "headcount"],
    "probability": ["chance", "odds"],
    "frequency": ["rate"],
}

# A noun said as a clause: (after "tell me" / "find out", as a question).  Used when the
# noun is the whole object ("get the humidity" -> "tell me how humid it is").
CLAUSES = {
    "weather": [("what the weather's like", "what's the weather like"),
                ("what it's like outside", "what's it like outside")],
    "forecast": [("what the weather will be", "what will the weather be"),
                 ("what the weather's doing", "what's the weather doing")],
    "weather forecast": [("what the weather will be", "what will the weather be")],
    "temperature": [("how warm it is", "how warm is it"), ("how hot it is", "how hot is it"),
                    ("how cold it is", "how cold is it")],
    "humidity": [("how humid it is", "how humid is it"), ("how muggy it is", "how muggy is it")],
    "air quality": [("how clean the air is", "how clean is the air"),
                    ("how bad the air is", "how bad is the air")],
    "time": [("what time it is", "what time is it")],
    "current time": [("what time it is", "what time is it")],
    "distance": [("how far it is", "how far is it")],
    "price": [("how much it costs", "how much does it cost"), ("what it costs", "what does it cost")],
    "cost": [("how much it costs", "how much does it cost"), ("what it'll cost", "what will it cost")],
    "account balance": [("how much money I have", "how much money do I have"),
                        ("how much is in my account", "how much is in my account")],
    "balance": [("how much I have left", "how much do I have left")],
    "definition": [("what it means", "what does it mean")],
    "meaning": [("what it means", "what does it mean")],
    "status": [("how it's going", "how is it going"), ("where it's at", "where is it at")],
    "battery level": [("how much charge is left", "how much charge is left"),
                      ("how full the battery is", "how full is the battery")],
    "travel time": [("how long it takes", "how long does it take"),
                    ("how long the trip is", "how long is the trip")],
    "duration": [("how long it takes", "how long does it take"), ("how long it lasts", "how long does it last")],
    "population": [("how many people live", "how many people live")],
    "traffic": [("how bad the traffic is", "how bad is the traffic"),
                ("what the roads are like", "what are the roads like")],
    "exchange rate": [("what the rate is", "what's the rate"), ("how much it's worth", "how much is it worth")],
    "stock price": [("how the stock is doing", "how is the stock doing"),
                    ("what it's trading at", "what's it trading at")],
    "probability": [("how likely it is", "how likely is it"), ("what the odds are", "what are the odds")],
    "availability": [("when it's free", "when is it free"), ("whether there's room", "is there room")],
}

# a modifier that looks like an adjective ("historical", "detailed", "genetic"), dropped
# from an object at DROP_ADJECTIVE
ADJECTIVE = re.compile(r"^[a-z-]{4,}(al|ive|ic|ous|ful|ed|able|ible|ary|less|ish)$")
DROP_ADJECTIVE = 0.5
# nouns said without "a" ("the weather", not "a weather")
MASS_NOUNS = {"weather", "info", "information", "data", "stuff", "music", "advice", "news", "traffic",
              "rain", "rainfall", "mail", "heat", "money", "access", "material", "feedback", "help",
              "pollution", "air", "electricity", "nutrition", "damp", "moisture", "mugginess", "smog",
              "postage", "training", "lodging", "transit", "sound", "loudness", "playback", "maths",
              "wealth", "crypto", "credit", "space", "room", "pay", "sales", "income", "takings",
              "spending", "borrowing", "rest", "exercise", "security", "cooling", "heating", "aircon"}
# words an object is said without ("the current weather" -> "the weather")
FILLERS = {"current", "currently", "specified", "given", "provided", "particular", "specific",
           "available", "detailed", "relevant", "corresponding", "respective", "existing",
           "selected", "desired", "requested", "certain", "all", "new", "latest", "real-time",
           "realtime", "various", "full", "complete", "comprehensive", "basic"}
# heads that only frame the noun after "of": "a list of songs" -> "songs"
FRAME_HEADS = {"list", "lists", "collection", "set", "array", "series", "summary", "overview",
               "details", "detail", "information", "info", "data"}
# words that make a phrase point at an argument rather than say something ("for a certain
# number of days", "for the specified location")
REFERRING = {"certain", "specific", "specified", "given", "particular", "provided", "desired",
             "selected", "chosen", "some", "requested", "target", "input", "respective",
             "corresponding", "specify", "provide", "another", "other", "different", "any"}
PREPOSITIONS = {"for", "of", "in", "at", "from", "to", "by", "with", "within", "on", "between",
                "about", "into", "over", "under", "across", "near", "using", "via", "per", "after",
                "before", "during", "until", "through", "against", "without", "around", "among",
                "inside", "onto", "toward", "towards", "that", "which", "who", "whose", "where",
                "based", "according", "including", "as", "if", "when", "whether"}
# words that open a clause the phrase may lose whole
CLAUSE_LEADS = {"that", "which", "who", "whose", "where", "if", "when", "whether", "including",
                "according", "based", "as"}
VERB_PREPOSITIONS = {"for", "about", "to", "on", "at", "with", "into", "through", "up"}
PARTICLES = {"on", "off", "up", "down", "out", "in", "over", "back"}
PHRASAL = {"turn", "switch", "look", "set", "sign", "log", "check", "pick", "put", "shut", "back",
           "clean", "fill", "top", "wake", "power", "fire", "kick", "start", "warm", "cool", "hang"}
# nouns that an argument of a kind says ("call the contact Logan": the person says contact)
KIND_NOUNS = {
    "person": {"contact", "person", "user", "friend", "recipient", "member", "customer", "client",
               "employee", "player", "artist", "author", "guest", "attendee", "someone", "people",
               "participant", "patient", "student", "individual", "username"},
    "place": {"location", "place", "city", "address", "destination", "area", "region", "country",
              "town", "venue", "spot", "locality", "position", "site"},
    "message": {"message", "text", "note", "sms", "reply", "comment", "post", "tweet",
                "announcement", "memo", "content"},
    "room": {"room", "area", "zone", "space"},
}
POOL_NOUNS = {
    "song": {"song", "track", "music", "tune", "songs", "tracks"}, "album": {"album", "record"},
    "band": {"artist", "band", "musician", "group"}, "movie": {"movie", "film"},
    "show": {"show", "series", "episode", "podcast"}, "book": {"book", "novel", "title"},
    "playlist": {"playlist"}, "game": {"game"}, "dish": {"dish", "recipe", "meal", "food"},
    "grocery": {"item", "items", "grocery", "groceries", "product"}, "product": {"product", "item"},
    "task": {"task", "todo", "to-do", "chore", "reminder"}, "event": {"event", "meeting", "appointment"},
    "query": {"query", "search", "term", "keyword"}, "topic": {"topic", "subject", "keyword"},
    "file": {"file", "document", "path"}, "folder": {"folder", "project", "directory"},
    "team": {"team", "club"}, "business": {"company", "business", "store", "restaurant", "shop", "hotel"},
    "city": {"city", "town", "destination"}, "language": {"language"}, "color": {"color", "colour"},
    "message": {"message", "text", "note"}, "note": {"note", "comment", "memo"},
    "title": {"title", "headline"}, "username": {"user", "username", "account", "handle"},
}
# nouns a free-text value says ("translate the text …" -> "translate 'hello' …")
TEXT_NOUNS = {"text", "phrase", "sentence", "string", "message", "word"}
# pools whose value says the object ("play the song Waka Waka" -> "play Waka Waka")
TITLE_POOLS = {"song", "album", "movie", "show", "book", "playlist", "game", "band", "grocery",
               "product", "dish", "query"}
# pools whose values a person says bare, as a name ("play Waka Waka", "look up tax deadline")
NAMED_POOLS = {"song", "album", "band", "movie", "show", "book", "playlist", "game", "dish",
               "grocery", "product", "team", "business", "city", "address", "language", "file",
               "folder", "amenity"}
POOL_FORMS = {"query": ["for {s}", "{s}", "about {s}"], "topic": ["about {s}", "on {s}", "{s}"],
              "business": ["at {s}", "from {s}", "{s}"], "band": ["by {s}", "{s}"],
              "language": ["into {s}", "to {s}", "in {s}"], "file": ["{s}", "called {s}"],
              "folder": ["in {s}", "{s}"], "task": ["to {s}", "saying {s}", ": {s}"],
              "event": ["{s}", "for {s}", "called {s}"], "tag": ["{s}", "as {s}", "tagged {s}"],
              "genre": ["{s}", "in {s}"], "color": ["{s}", "in {s}"]}
# durations, levels, distances: the preposition a number with that unit takes
UNIT_FORMS = [({"minutes", "mins", "seconds", "secs", "hours"}, ["for {s}", "{s}", "for {s}"]),
              ({"days", "weeks"}, ["for {s}", "over the next {s}", "{s}"]),
              ({"percent", "%", "per cent", "degrees", "degrees Celsius", "°C", "degrees Fahrenheit",
                "°F", "kelvin", "K", "bpm", "watts", "W"}, ["to {s}", "at {s}"]),
              ({"km", "kilometres", "miles", "metres", "meters", "mm", "cm"}, ["within {s}", "{s}", "{s} away"]),
              ({"people", "servings"}, ["for {s}"]),
              ({"dollars", "euros"}, ["for {s}", "{s}"])]
# the phrase a getter is asked with (o: the object with "the")
QUESTION_FRAMES = ["what's {o}{a}?", "what's {o}{a}?", "can you tell me {o}{a}?", "do you know {o}{a}?",
                   "any idea what {o} is{a}?", "what is {o}{a}?"]
PLURAL_QUESTION_FRAMES = ["what are {o}{a}?", "can you tell me {o}{a}?", "are there any {b}{a}?",
                          "any {b}{a}?", "which {b} are there{a}?"]
NEED_FRAMES = ["I need {o}{a}", "I'd like {o}{a}", "I'm after {o}{a}", "I want {o}{a}",
               "looking for {o}{a}"]
# a forecast asked about what it forecasts: "the humidity forecast" -> "what will the
# humidity be …?"
# a property named by its unit ("days"): "for 9 days", the number said with it
UNIT_NAMES = {"days", "hours", "minutes", "seconds", "weeks", "months", "years", "nights", "people",
              "guests", "servings", "miles", "kilometers", "kilometres", "steps", "pages", "items"}
FUTURE_HEADS = {"forecast", "prediction", "outlook", "projection", "estimate"}
FUTURE_FRAMES = ["what will {o} be{a}?", "what's {o} going to be{a}?", "what's {o} going to be like{a}?",
                 "how will {o} look{a}?"]
CLAUSE_FRAMES = ["tell me {w}{a}", "find out {w}{a}", "I want to know {w}{a}", "check {w}{a}",
                 "let me know {w}{a}", "I'm wondering {w}{a}"]
# a place said as the situation before a getter's question ("I'm in Dublin this week —
# what's the weather like?"): the value is still said, only not inside the clause
PLACE_CONTEXTS = ["I'm in {s} this week", "I'm heading to {s} soon", "we're off to {s} tomorrow",
                  "I'm visiting {s} next month", "my sister lives in {s}", "I'm going to be in {s}",
                  "I'll be in {s} later"]
CONTEXT_JOINS = {"question": [", ", ". ", " - ", ", so "], "imperative": [", so ", ". ", " - can you "],
                 "noun": [": ", " - ", ". "], "statement": [", so ", ". ", " and "]}
# how a whole request of each form is wrapped (imperatives use data.POLITE and INDIRECT)
WRAPS = {
    "question": ["{c}", "{c}", "{C}", "{C}", "hey, {c}", "quick question: {c}", "{C} Thanks.",
                 "ok, {c}", "hey needle, {c}", "so {c}", "sorry, {c}"],
    "noun": ["{c}", "{C}", "{c}, please", "{C}, please.", "{c} please", "hey, {c}", "{C}?",
             "{c}?", "ok, {c}", "{C}, thanks."],
    "statement": ["{c}", "{C}.", "hey, {c}", "ok, {c}", "{c}, please", "{C}. Thanks!", "so {c}",
                  "{C}, if you can."],
    "chat": ["{c}", "{C}.", "hey, {c}", "ok, {c}", "so {c}", "{C}!", "hey needle, {c}"],
    "context": ["{c}", "{C}", "{C}", "hey, {c}", "ok, {c}", "so {c}", "hey needle, {c}"],
    "imperative": ["{c} for me", "{C} for me, please.", "{c} when you get a sec", "could you {c} for me?",
                   "can you just {c}?", "{c}, cheers", "do me a favour and {c}"],
}
# getters whose object a "what's …?" asks for ("provide help" is no question)
INFO_VERBS = {"get", "fetch", "retrieve", "check", "show", "list", "find", "search", "lookup", "look",
              "read", "query", "view", "count", "calculate", "compute", "estimate", "predict",
              "measure", "determine", "obtain", "return", "display", "identify"}
# what "set" makes rather than changes ("set an alarm": not "adjust an alarm")
MADE_NOUNS = {"reminder", "alarm", "timer", "appointment", "meeting", "event", "goal", "task",
              "note", "countdown", "booking", "reservation", "alert"}
MADE_VERBS = ["set up", "add", "put in", "make"]
GETTER_VERBS = {"get", "fetch", "retrieve", "check", "show", "list", "find", "search", "lookup", "look",
                "read", "query", "view", "track", "count", "calculate", "compute", "estimate",
                "predict", "measure", "determine", "obtain", "provide", "return", "display",
                "identify", "give", "tell", "analyze", "analyse", "evaluate", "assess", "summarize",
                "summarise", "monitor", "recommend", "suggest", "compare"}
SET_VERBS = {"set", "change", "adjust", "update", "modify", "configure"}
WHAT_VERBS = {"find", "search", "lookup", "look", "list", "recommend", "suggest"}


# ----------------------------------------------------------------- helpers ---

def singular(word):
    """'forecasts' -> 'forecast', 'cities' -> 'city', 'boxes' -> 'box' (a table key's form)."""
    w = word.lower()
    if len(w) > 4 and w.endswith("ies"):
        return w[:-3] + "y"
    if len(w) > 4 and re.search(r"(ches|shes|sses|xes)$", w):
        return w[:-2]
    if len(w) > 3 and w.endswith("s") and not w.endswith(("ss", "us", "is", "ics", "news")):
        return w[:-1]
    return w


def plural(phrase):
    """The phrase with its noun made plural ('tune' -> 'tunes', 'place to eat' ->
    'places to eat')."""
    words = phrase.split(" ")
    for i, w in enumerate(words[1:], 1):
        if w in ("to", "of", "for"):
            return " ".join([plural(" ".join(words[:i]))] + words[i:])
    head, _, last = phrase.rpartition(" ")
    if last.endswith("s") or not last[-1:].isalpha() or last.isupper():
        word = last
    elif last.endswith("y") and last[-2:-1] not in "aeiou":
        word = last[:-1] + "ies"
    elif re.search(r"(ch|sh|x|z)$", last):
        word = last + "es"
    else:
        word = last + "s"
    return (head + " " + word).strip()


def _article(text):
    """'a' / 'an' agreeing with the next word, after substitutions (the tool's own words
    only: a value is copied as it is)."""
    return re.sub(r"\b(a|an) ([A-Za-z])(\w*)",
                  lambda m: ("an " if m.group(2).lower() in "aeio" and not (m.group(2) + m.group(3)).isupper()
                             else "a ") + m.group(2) + m.group(3), text)


class Action:
    """A tool's action phrase read apart: verb words, object words, and the phrases after
    the object as (lead word, words).  ``is_verb(word)`` says whether the word after an
    "and"/"or" begins a second action ("get and display …"); the caller's verb list
    decides (``tool_requests``), so this module imports none of its users."""

    def __init__(self, text, is_verb=lambda word: False):
        text = re.sub(r"\b(a|an|the) (my|the|a|an)\b", r"\2", text)
        cut = re.split(r",? (?:optionally|optional|e\.g\.?|etc\.?|such as|like|if|unless)\b|: ", text)[0]
        text = cut if len(cut.split()) > 2 else text        # "check if …" keeps its "if"
        words = text.split()
        verb = [words[0]] if words else ["get"]
        i = 1
        if len(words) > 1 and words[1] in PARTICLES and verb[0] in PHRASAL:
            verb.append(words[1])
            i = 2
        self.alt = None
        if len(words) > i + 1 and words[i] in ("and", "or"):
            if is_verb(words[i + 1]):
                self.alt = (words[i], words[i + 1])
                i += 2
        self.verb = verb
        # "search for restaurants", "subscribe to the newsletter": a preposition the verb takes
        self.particle = None
        if len(words) > i + 1 and words[i] in VERB_PREPOSITIONS:
            self.particle = words[i]
            i += 1
        segments, cur, lead = [], [], None
        rest = words[i:]
        for k, w in enumerate(rest):
            bare = w.strip(",;").lower()
            if bare in PREPOSITIONS and (cur or lead is not None):
                segments.append((lead, cur))
                cur, lead = [], bare
                continue
            after = rest[k + 1].lower() if k + 1 < len(rest) else ""
            participle = re.fullmatch(r"[a-z]{3,}ed", bare) and not bare.endswith("eed") and bare != "hundred"
            if cur and lead is None and participle and after in PREPOSITIONS:
                segments.append((lead, cur))      # "the mandates associated with …"
                cur, lead = [w], "~"
                continue
            cur.append(w)
        segments.append((lead, cur))
        self.object = segments[0][1] if segments else []
        self.tail = [s for s in segments[1:] if s[1] or s[0]]

    def head(self):
        return singular(self.object[-1].strip(",;")) if self.object else None


def _replace_nouns(rng, words, rate):
    """Words with the table noun that ends them (the head: "the weather forecast",
    "a restaurant table" keeps "restaurant") swapped for what people say, at ``rate``.  A
    plural substitute does not follow "a"."""
    if not words or rng.random() >= rate:
        return list(words)
    low = [w.lower().strip(",;") for w in words]
    for n in (3, 2, 1):
        if len(words) < n:
            continue
        chunk = low[-n:]
        key = " ".join(chunk[:-1] + [singular(chunk[-1])])
        if key not in NOUNS:
            continue
        sub = NOUNS[key][rng.randrange(len(NOUNS[key]))]
        if {singular(w) for w in sub.lower().split()} & {singular(w) for w in low[:-n]}:
            return list(words)          # "a wake-up alarm" -> not "a wake-up wake-up call"
        if singular(chunk[-1]) != chunk[-1]:
            sub = plural(sub)
        elif len(words) > n and low[-n - 1] in ("a", "an") and singular(sub.split()[-1]) != sub.split()[-1]:
            return list(words)
        head = list(words[:-n])
        if head and head[-1].lower() in ("a", "an") and sub.split()[-1].lower() in MASS_NOUNS:
            head[-1] = "the"            # "a weather forecast" -> "the weather", not "a weather"
        return head + sub.split()
    return list(words)


_STOP = {"the", "a", "an", "of", "for", "to", "in", "on", "at", "by", "with", "from", "and", "or",
         "its", "their", "this", "that", "which", "is", "be", "used", "value", "number", "name"}


def said_words(param, renamed=False):
    """The words an argument's value stands for, singular: its name's words, or for a
    renamed property (a random key) its description's first words."""
    words = list(param.words) if not renamed or not param.description else \
        [w for w in re.findall(r"[a-z]+", param.description.lower())[:3] if w not in _STOP]
    return {singular(w) for w in words if len(w) > 2}


def _content(words):
    """A phrase's words that say something: no article, no pointing word, singular."""
    bare = [w.lower().strip(",;.") for w in words]
    return [singular(w) for w in bare if w not in REFERRING and w not in
            ("a", "an", "the", "its", "their", "his", "her", "my", "your", "this", "each", "one")]


def _refers(words, every):
    """Whether a phrase after the object only points at an argument ("for the location",
    "for a certain number of days"): it has a pointing word, or it is a property's noun."""
    content = _content(words)
    if len(content) < len([w for w in words if w.lower() not in ("a", "an", "the")]) or not content:
        return True
    pointing = words[0].lower() in ("a", "an", "the", "its", "their", "each")    # "on investment" is content
    return pointing and len(content) <= 2 and content[-1] in every


def _target(words, targets):
    """The key of the said argument a phrase points at ("to a contact": the contact), or None."""
    content = _content(words)
    if not content or len(content) > 3:
        return None
    for key, nouns in targets.items():
        if content[-1] in nouns:
            return key
    return None


def pick_verb(rng, action, rate):
    """The verb words as said: the action's own or a table paraphrase.  A paraphrase that
    ends in its own preposition ("look for") replaces the verb's ("search for"); "set" a
    thing that is made ("set a reminder") is said as making it."""
    key = " ".join(action.verb).lower()
    own = " ".join(action.verb + [action.particle] if action.particle else action.verb)
    if action.alt and action.alt[0] == "or":        # "heat or cool": both are meant
        return " ".join(action.verb + list(action.alt) + ([action.particle] if action.particle else []))
    options = VERBS.get(key) or (VERBS.get(action.verb[0].lower()) if len(action.verb) == 1 else None)
    if key == "set" and action.head() in MADE_NOUNS:
        options = MADE_VERBS
    if not options or rng.random() >= rate:
        return own
    said = options[rng.randrange(len(options))]
    if len(action.verb) > 1 and key not in VERBS:
        said += " " + " ".join(action.verb[1:])
    last = said.rsplit(" ", 1)[-1]
    if action.particle and last not in PARTICLES and last not in PREPOSITIONS:
        said += " " + action.particle
    return said


def object_words(rng, action, targets, said_as, every, noun_rate=NOUN_RATE, keep_detail=KEEP_DETAIL):
    """(object words, tail phrases kept, keys said in a phrase) with fillers dropped,
    nouns paraphrased and the phrases that point at an argument left out or filled with
    its value ("the definition of a word" -> "the definition of opera"; ``targets``: key ->
    the nouns that point at it, ``said_as``: key -> its value as said)."""
    obj = list(action.object)
    tail = list(action.tail)
    # "a list of songs" -> "songs"
    if obj and singular(obj[-1].lower()) in {singular(h) for h in FRAME_HEADS} and tail and tail[0][0] == "of" \
            and tail[0][1] and rng.random() < 0.6:
        det = [w for w in obj[:1] if w.lower() in ("the", "my")]
        inner = tail[0][1]
        obj = (det if inner[0].lower() not in ("a", "an", "the", "my", "all") else []) + inner
        tail = tail[1:]
    obj = [w for w in obj if w.lower() not in FILLERS or rng.random() < 0.25]
    # "the current or historical conditions" lost "current": no "or" left hanging
    obj = [w for i, w in enumerate(obj) if w.lower() not in ("or", "and") or
           (0 < i < len(obj) - 1 and obj[i - 1].lower() not in ("a", "an", "the", "my", "or", "and"))]
    # people shorten a long noun phrase: "the detailed analysis trail" -> "the analysis trail"
    obj = [w for i, w in enumerate(obj) if i == len(obj) - 1 or not ADJECTIVE.search(w.lower())
           or rng.random() >= DROP_ADJECTIVE]
    kept, skipping, used, dropped = [], False, [], False
    for lead, words in tail:
        if lead in ("of", "in") and dropped:     # "of people in the household" goes with the
            continue                            # "to the phones" it hangs on
        if lead == "by" and _content(words)[-1:] and _content(words)[-1] in every:
            continue                        # "by topic": how the tool is asked, the value says it
        dropped = True
        if words and words[-1].lower() in ("a", "an", "the"):    # "that match a" lost its noun
            continue
        # "by topic" is how the tool is asked, not where the value goes: said apart
        key = _target(words, targets) if lead not in ("~", "by") and lead not in CLAUSE_LEADS else None
        if key is not None and key not in used and not skipping:
            if rng.random() < 0.8:
                kept.append((lead, [said_as[key]]))
                used.append(key)
                dropped = False
            continue
        if lead == "~" or lead in CLAUSE_LEADS:
            # a participle or relative clause: kept whole or lost whole (it runs to
            # the end of the phrase, as far as a reading this shallow can tell)
            skipping = lead == "~" or _refers(words, every) or rng.random() > keep_detail
            if skipping:
                continue
        elif skipping:
            continue
        elif _refers(words, every) or (lead != "of" and rng.random() > keep_detail):
            continue
        words = _replace_nouns(rng, [w for w in words if w.lower() not in FILLERS], noun_rate * 0.6)
        kept.append((lead, _article(" ".join(words)).split()))
        dropped = False
    obj = _article(" ".join(_replace_nouns(rng, obj, noun_rate))).split()
    return obj, kept, used


def clause_for(obj, kept):
    """The CLAUSES entry for an object that is only its noun ("the humidity"), or None."""
    if kept:
        return None
    content = [w.lower() for w in obj if w.lower() not in ("the", "a", "an", "my", "current")]
    if not content:
        return None
    key = " ".join(content[:-1] + [singular(content[-1])])
    return CLAUSES.get(key)


def with_the(rng, words):
    """The object with a definite article (questions): 'a forecast' -> 'the forecast'."""
    if not words:
        return ""
    first = words[0].lower()
    if first in ("a", "an"):
        words = ["the"] + words[1:]
    elif first not in ("the", "my", "your", "our", "their", "his", "her", "this", "these", "all", "any"):
        words = (["the"] if rng.random() < 0.8 else ["my"]) + words
    return " ".join(words)


def bare(words):
    """The object without its article ('the forecast' -> 'forecast')."""
    if words and words[0].lower() in ("a", "an", "the"):
        words = words[1:]
    return " ".join(words)


def is_plural(words):
    if not words:
        return False
    last = words[-1].lower().strip(",;")
    return singular(last) != last and last not in ("news", "series", "status", "analysis")


def tail_text(kept):
    out = []
    for lead, words in kept:
        if lead and lead != "~":
            out.append(lead)
        out.extend(words)
    return (" " + " ".join(out)) if out else ""
