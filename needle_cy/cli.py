"""``needle-cy``: run, batch, chat, inspect, bench.

Every user error (missing file, malformed JSON, unsupported schema, context overflow …)
prints one line ``needle-cy: error: …`` on stderr and exits with status 1; usage errors
exit with 2 (argparse).  Set ``NEEDLE_CY_DEBUG=1`` to see tracebacks.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from .errors import NeedleError

USER_ERRORS = (NeedleError, FileNotFoundError, IsADirectoryError, PermissionError,
               json.JSONDecodeError, UnicodeDecodeError, ValueError, OSError, ImportError)


class CliError(Exception):
    """A user error the CLI reports in one line."""


# ------------------------------------------------------------------ inputs

def _read_json(path, what):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise CliError(f"{what} file not found: {path}") from None
    except IsADirectoryError:
        raise CliError(f"{what} path is a directory, expected a JSON file: {path}") from None
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise CliError(f"{what} file {path} is not UTF-8 text (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise CliError(f"{what} file {path} is not valid JSON: {exc.msg} at line {exc.lineno} "
                       f"column {exc.colno}") from None


def _typed_parameters_to_schema(params):
    """call-me-maybe style ``{"a": {"type": "number"}, …}`` → a JSON-Schema object."""
    return {"type": "object", "properties": dict(params), "required": list(params)}


def _looks_like_typed_parameters(params):
    return (isinstance(params, dict) and "type" not in params and "properties" not in params
            and all(isinstance(v, dict) and "type" in v for v in params.values()))


DEFAULT_TOOLS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models", "home_tools.json")


def load_tools(path):
    """Tools from a JSON file: a list, ``{"tools": [...]}``, or call-me-maybe definitions.
    ``None`` → the tool catalogue shipped with the embedded model, when there is one."""
    if path is None:
        if not os.path.exists(DEFAULT_TOOLS_PATH):
            raise CliError("no --tools file given and no embedded tool catalogue is installed")
        path = DEFAULT_TOOLS_PATH
    data = _read_json(path, "tools")
    if isinstance(data, dict) and isinstance(data.get("tools"), list):
        data = data["tools"]
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        raise CliError(f"tools file {path} must hold a JSON list of tool definitions, "
                       f"got {type(data).__name__}")
    tools = []
    for i, entry in enumerate(data):
        if not isinstance(entry, dict):
            raise CliError(f"tools file {path}: entry {i} must be an object, got {type(entry).__name__}")
        entry = dict(entry)
        if _looks_like_typed_parameters(entry.get("parameters")):
            entry["parameters"] = _typed_parameters_to_schema(entry["parameters"])
        entry.pop("returns", None)
        tools.append(entry)
    from .toolspec import normalize_tools
    normalize_tools(tools)        # validate before any model is loaded
    return tools


# ------------------------------------------------------------ live drawing

def render_partial_calls(text: str) -> str:
    """``[{"name":"f","arguments":{"a":1,"b":"x"}}]`` (possibly cut anywhere) →
    ``f(a=1, b="x")``, one call per line.  Tolerant: renders whatever prefix is there."""
    out, stack = [], []          # stack of "A"/"O": top array, call object, arguments, ...
    call_key, prev = None, None  # last key seen in the call object; last significant char
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        level = len(stack)
        if ch == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            raw, closed = text[i + 1:min(j, n)], j < n
            i = j + 1
            is_key = level >= 1 and stack[-1] == "O" and prev in ("{", ",")
            if level == 2:
                if is_key:
                    call_key = raw
                elif call_key == "name":
                    out.append(raw + ("(" if closed else ""))
            elif level == 3 and is_key:
                out.append(raw + ("=" if closed else ""))
            elif level >= 3:
                out.append('"' + raw + ('"' if closed else ""))
            prev = '"'
            continue
        if ch in "{[":
            stack.append("O" if ch == "{" else "A")
            if len(stack) > 3:
                out.append(ch)
        elif ch in "}]":
            if level == 3 and ch == "}":
                out.append(")")
            elif level > 3:
                out.append(ch)
            if stack:
                stack.pop()
        elif ch == ",":
            if level == 1:
                out.append("\n")
            elif level >= 3:
                out.append(", ")
        elif ch == ":":
            if level > 3:
                out.append(": ")
        elif not ch.isspace() and level >= 3:
            out.append(ch)
        if not ch.isspace():
            prev = ch
        i += 1
    return "".join(out)


# ------------------------------------------------------------------ commands

def _make_agent(args, tools):
    from .agent import Needle
    return Needle(args.model, tools=tools, system=getattr(args, "system", None),
                  constrained=not getattr(args, "no_constrained", False),
                  ground_values=not getattr(args, "no_grounding", False),
                  ground_notes=not getattr(args, "no_grounding", False),
                  threads=args.threads, backend=args.backend,
                  max_new_tokens=args.max_new_tokens, reasoning_limit=args.reasoning_limit)


def cmd_run(args):
    tools = load_tools(args.tools)
    agent = _make_agent(args, tools)
    live = sys.stdout.isatty() and not args.json
    final = None
    parts = []
    for event in agent.stream(args.query):
        kind = event["type"]
        if kind == "toolcall_start":
            parts.append("")
        elif kind in ("toolcall_delta", "toolcall_rewind") and live:
            if kind == "toolcall_rewind":
                del parts[event["index"] + 1:]
                parts[event["index"]] = event["text"]
            else:
                parts[event["index"]] += event["delta"]
            shown = render_partial_calls("[" + ",".join(parts)).replace("\n", "; ")
            sys.stdout.write("\r\033[K" + shown)
            sys.stdout.flush()
        elif kind in ("done", "error"):
            final = event
    if live:
        sys.stdout.write("\r\033[K")
    response = final["response"]
    if final.get("exception") is not None:
        raise final["exception"]
    if args.json:
        print(json.dumps(response, ensure_ascii=False, indent=2))
    else:
        if not response["success"]:
            raise CliError(response["error"])
        calls = response["function_calls"]
        held = response.get("suppressed_calls") or []
        if not calls and not held:
            print("(no call)")
        for call in calls:
            print(_call_text(call))
        for line in _held_back_lines(response):
            print(line)
        conf = response["confidence"]
        print(f"confidence: {conf:.3f}" if conf is not None else "confidence: n/a", file=sys.stderr)
    return 0 if response["success"] else 1


def _progress(done, total, start, stream=sys.stderr):
    width = 30
    frac = done / total if total else 1.0
    bar = "#" * int(frac * width)
    elapsed = time.perf_counter() - start
    stream.write(f"\r[{bar:<{width}}] {done}/{total} {elapsed:6.1f}s")
    if done == total:
        stream.write("\n")
    stream.flush()


def cmd_batch(args):
    tools = load_tools(args.functions_definition)
    prompts = _read_json(args.input, "input")
    if not isinstance(prompts, list):
        raise CliError(f"input file {args.input} must hold a JSON list of prompts")
    texts = []
    for i, p in enumerate(prompts):
        if isinstance(p, dict) and isinstance(p.get("prompt"), str):
            texts.append(p["prompt"])
        elif isinstance(p, str):
            texts.append(p)
        else:
            raise CliError(f"input file {args.input}: entry {i} must be a string or "
                           f"{{\"prompt\": \"...\"}}")
    agent = _make_agent(args, tools)
    out, start = [], time.perf_counter()
    show = not args.quiet
    for i, text in enumerate(texts):
        agent.reset()
        r = agent.complete(text)
        call = r["function_calls"][0] if r["success"] and r["function_calls"] else None
        out.append({"prompt": text, "name": call["name"] if call else None,
                    "parameters": call["arguments"] if call else {}})
        if show:
            _progress(i + 1, len(texts), start)
    try:
        with open(args.output, "w", encoding="utf-8") as f:
            json.dump(out, f, ensure_ascii=False, indent=2)
    except OSError as exc:
        raise CliError(f"cannot write output file {args.output}: {exc.strerror}") from None
    return 0


def _simulated(name):
    """A stand-in for a tool's function in ``chat``: it reports success and echoes the call."""
    def simulate(**arguments):
        return {"ok": True, "tool": name, "arguments": arguments}
    return simulate


def _call_text(call):
    """``name(key=value, …)`` of one call (only its name and arguments)."""
    return render_partial_calls(json.dumps([{"name": call["name"], "arguments": call.get("arguments") or {}}],
                                           ensure_ascii=False))


def _held_back_lines(response):
    why = ("the request negates it" if (response.get("validation") or {}).get("negation")
           else "low confidence")
    return [f"held back ({why}, escalate): {_call_text(c)}" for c in response.get("suppressed_calls") or []]


_LOOP_STOP_NOTES = {
    "max_steps": "(stopped: --max-steps reached)",
    "repeated_calls": "(stopped: the model asked again for the calls it just ran; not run twice)",
}


def cmd_chat(args):
    tools = load_tools(args.tools)
    agent = _make_agent(args, tools)
    for spec in agent.specs:         # JSON-Schema tools have no function: simulate them
        if spec.function is None:
            spec.function = _simulated(spec.name)
    print("needle-cy chat — calls are simulated; /reset starts over, /quit leaves.", file=sys.stderr)
    from .errors import ContextOverflowError
    while True:
        try:
            line = input("> ")
        except EOFError:
            print()
            return 0
        except UnicodeDecodeError as exc:
            print(f"error: that line is not UTF-8 text (byte {exc.start}); type it again", flush=True)
            continue
        line = line.strip()
        if not line:
            continue
        if line in ("/quit", "/exit"):
            return 0
        if line == "/reset":
            agent.reset()
            print("(conversation reset)")
            continue
        try:
            response = agent.run(line, max_steps=args.max_steps)
        except ContextOverflowError as exc:
            print(f"error: {exc} (/reset starts a new conversation)")
            continue
        for done in response["executed_calls"]:
            print(f"  {_call_text(done)} -> {json.dumps(done['result'], ensure_ascii=False, default=str)}")
        for held in _held_back_lines(response):
            print("  " + held)
        if not response["success"]:
            print(f"error: {response['error']}")
        elif not response["executed_calls"] and not response["suppressed_calls"]:
            print("(no call)" if not response.get("reasoning") else f"(no call) {response['reasoning']}")
        note = _LOOP_STOP_NOTES.get(response["loop_stop"])
        if note:
            print(note)


def cmd_inspect(args):
    from .archive import Archive, describe
    if not os.path.exists(args.model):
        raise CliError(f"model archive not found: {args.model}")
    archive = Archive.open(args.model)
    print(describe(archive))
    return 0


def cmd_bench(args):
    from .agent import Needle
    tools = load_tools(args.tools) if args.tools else _demo_tools()
    queries = args.queries or ["turn on the kitchen light", "set a timer for ten minutes",
                               "what's the weather like"]
    agent = Needle(args.model, tools=tools, threads=args.threads, backend=args.backend,
                   max_new_tokens=args.max_new_tokens, reasoning_limit=args.reasoning_limit)
    rows = []
    for q in queries:
        agent.reset()
        r = agent.complete(q)
        t = r.get("timings", {})
        rows.append((q, t.get("total_s", 0.0), t.get("prefill_s", 0.0) + t.get("prefix_s", 0.0),
                     t.get("reasoning_s", 0.0), t.get("constrained_s", 0.0), t.get("grammar_s", 0.0),
                     r["prefill_tps"], r["decode_tps"]))
    print(f"{'query':32s} {'total s':>8s} {'prefill':>8s} {'reason':>8s} {'constr':>8s} "
          f"{'grammar':>8s} {'pf tok/s':>9s} {'dec tok/s':>9s}")
    for q, *vals in rows:
        print(f"{q[:32]:32s} " + " ".join(f"{v:8.3f}" for v in vals[:5])
              + f" {vals[5]:9.1f} {vals[6]:9.1f}")
    return 0


def _demo_tools():
    return [
        {"name": "set_light", "description": "Turn the lights in one room on or off",
         "parameters": {"type": "object", "properties": {
             "room": {"type": "string", "enum": ["kitchen", "bedroom", "living room"]},
             "on": {"type": "boolean"}}, "required": ["room", "on"]}},
        {"name": "set_timer", "description": "Start a kitchen timer",
         "parameters": {"type": "object", "properties": {
             "minutes": {"type": "integer", "minimum": 1, "maximum": 600}}, "required": ["minutes"]}},
    ]


# ------------------------------------------------------------------ parser

def build_parser():
    parser = argparse.ArgumentParser(prog="needle-cy", description="Offline Needle tool calling on CPU.")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p, tools_flag=True):
        p.add_argument("--model", default=None, help="path to a .cact archive (default: the embedded model)")
        p.add_argument("--threads", type=int, default=None)
        p.add_argument("--backend", choices=["cython", "numpy"], default="cython")
        p.add_argument("--max-new-tokens", type=int, default=512)
        p.add_argument("--no-grounding", action="store_true",
                       help="string values and reasoning quotes need not come from the request "
                            "(see needle_cy.grounding)")
        p.add_argument("--reasoning-limit", type=int, default=256,
                       help="tokens of free reasoning before the turn declines")

    p = sub.add_parser("run", help="one request → tool calls")
    p.add_argument("query")
    p.add_argument("--tools", default=None,
                   help="JSON file with the tool definitions (default: the embedded model's catalogue)")
    p.add_argument("--system", default=None, help='facts, e.g. "date: 2026-03-04; location: Paris"')
    p.add_argument("--no-constrained", action="store_true", help="decode freely, validate afterwards")
    p.add_argument("--json", action="store_true", help="print the full response envelope")
    common(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("batch", help="call-me-maybe batch: prompts file → calls file")
    p.add_argument("--functions-definition", required=True)
    p.add_argument("--input", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--system", default=None)
    p.add_argument("--no-constrained", action="store_true")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    common(p)
    p.set_defaults(func=cmd_batch)

    p = sub.add_parser("chat", help="multi-turn REPL with simulated execution")
    p.add_argument("--tools", default=None)
    p.add_argument("--system", default=None)
    p.add_argument("--max-steps", type=int, default=4)
    common(p)
    p.set_defaults(func=cmd_chat)

    p = sub.add_parser("inspect", help="describe a .cact archive")
    p.add_argument("model")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("bench", help="latency of a few turns, split by phase")
    p.add_argument("--tools", default=None)
    p.add_argument("--queries", nargs="*", default=None)
    common(p)
    p.set_defaults(func=cmd_bench)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args) or 0
    except KeyboardInterrupt:
        print("needle-cy: interrupted", file=sys.stderr)
        return 130
    except (CliError,) + USER_ERRORS as exc:
        if os.environ.get("NEEDLE_CY_DEBUG"):
            raise
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"needle-cy: error: {message}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
