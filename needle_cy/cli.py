"""``needle-cy``: run, batch, chat, inspect, bench, serve.

Every user error (missing file, malformed JSON, unsupported schema, context overflow …)
prints one line ``needle-cy: error: …`` on stderr and exits with status 1; usage errors
exit with 2 (argparse).  Set ``NEEDLE_CY_DEBUG=1`` to see tracebacks.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import unicodedata
import warnings

from .errors import NeedleError, SchemaWarning

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
_TOOL_SHAPE = '{"name": "...", "description": "...", "parameters": {"type": "object", "properties": {...}}}'
_TOOLS_FILE_SHAPE = (f"write the file as a JSON list of tool definitions [{_TOOL_SHAPE}, ...] "
                     f"or as {{\"tools\": [...]}}")


def load_tools(path, strict=False):
    """Tools from a JSON file: a list, ``{"tools": [...]}``, or call-me-maybe definitions.
    ``None`` → the tool catalogue shipped with the embedded model, when there is one.
    Validated (``strict``: a misspelt schema keyword is an error, not a warning)."""
    from .toolspec import normalize_tools
    tools = _tool_definitions(path)
    normalize_tools(tools, strict=strict)        # validate before any model is loaded
    return tools


def _load_specs(path, strict):
    """The commands' tools, normalised once (each warning about them shown once)."""
    from .toolspec import normalize_tools
    return normalize_tools(_tool_definitions(path), strict=strict)


def _tool_definitions(path):
    if path is None:
        if not os.path.exists(DEFAULT_TOOLS_PATH):
            raise CliError("no --tools file given and no embedded tool catalogue is installed; "
                           "pass --tools FILE (a JSON list of tool definitions)")
        path = DEFAULT_TOOLS_PATH
    data = _read_json(path, "tools")
    if isinstance(data, dict) and "tools" in data:
        if not isinstance(data["tools"], list):
            raise CliError(f"tools file {path}: \"tools\" must be a list of tool definitions, "
                           f"got {type(data['tools']).__name__} {json.dumps(data['tools'])[:40]}; "
                           f"{_TOOLS_FILE_SHAPE}")
        data = data["tools"]
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        raise CliError(f"tools file {path} must hold a JSON list of tool definitions, "
                       f"got {type(data).__name__}; {_TOOLS_FILE_SHAPE}")
    tools = []
    for i, entry in enumerate(data):
        if not isinstance(entry, dict):
            raise CliError(f"tools file {path}: entry {i} must be an object, got "
                           f"{type(entry).__name__}; each tool is {_TOOL_SHAPE}")
        entry = dict(entry)
        if _looks_like_typed_parameters(entry.get("parameters")):
            entry["parameters"] = _typed_parameters_to_schema(entry["parameters"])
        entry.pop("returns", None)
        tools.append(entry)
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


def _display_width(ch):
    if unicodedata.combining(ch):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def fit_to_width(text: str, columns: int) -> str:
    """``text`` on one line of a terminal ``columns`` wide, one column spare so the cursor
    never wraps: the end of it (what is being written) behind ``…`` when it is longer."""
    text = text.replace("\n", "; ")
    room = max(columns - 1, 1)
    if sum(_display_width(c) for c in text) <= room:
        return text
    kept, width = [], 1                      # 1 for the leading "…"
    for ch in reversed(text):
        w = _display_width(ch)
        if width + w > room:
            break
        kept.append(ch)
        width += w
    return "…" + "".join(reversed(kept))


class LiveLine:
    """One line redrawn in place on a terminal (carriage return, clear to the end of the
    line, the new text).  The text is cut to the terminal's width (``fit_to_width``), so it
    never wraps: a wrapped line would leave its upper rows behind at every redraw."""

    def __init__(self, stream):
        self.stream = stream
        self.shown = False

    def show(self, text):
        columns = shutil.get_terminal_size((80, 24)).columns
        self.stream.write("\r\033[K" + fit_to_width(text, columns))
        self.stream.flush()
        self.shown = True

    def clear(self):
        if self.shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self.shown = False


_SPINNER = "|/-\\"


def _is_terminal(stream):
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


# ------------------------------------------------------------------ commands

def _make_agent(args, tools):
    from .agent import Needle
    return Needle(args.model, tools=tools, model_file=args.model_file,
                  system=getattr(args, "system", None),
                  constrained=not getattr(args, "no_constrained", False),
                  ground_values=not getattr(args, "no_grounding", False),
                  ground_notes=not getattr(args, "no_grounding", False),
                  threads=args.threads, backend=args.backend,
                  max_new_tokens=args.max_new_tokens, reasoning_limit=args.reasoning_limit,
                  strict=getattr(args, "strict", False),
                  tools_per_clause=getattr(args, "tools_per_clause", None),
                  name_prior=getattr(args, "name_prior", None))


def cmd_run(args):
    if not args.query.strip():
        raise CliError("the request is blank: give the text of a request, e.g. "
                       "needle-cy run \"lock the front door\"")
    tools = _load_specs(args.tools, args.strict)
    agent = _make_agent(args, tools)
    # Drawn only on a terminal: a phase line while the request is read and the model
    # reasons, then the calls as they are written.
    line = LiveLine(sys.stdout) if _is_terminal(sys.stdout) and not args.json else None
    final = None
    parts = []
    spin = 0
    for event in agent.stream(args.query):
        kind = event["type"]
        if kind == "toolcall_start":
            parts.append("")
        elif kind == "toolcall_rewind":
            del parts[event["index"] + 1:]
            parts[event["index"]] = event["text"]
        elif kind == "toolcall_delta":
            parts[event["index"]] += event["delta"]
        elif kind in ("done", "error"):
            final = event
        if line is None:
            continue
        if kind == "start":
            line.show("reading the request…")
        elif kind in ("thinking_start", "thinking_delta"):
            spin += 1
            line.show(f"thinking {_SPINNER[spin % len(_SPINNER)]}")
        elif kind in ("toolcall_delta", "toolcall_rewind"):
            line.show(render_partial_calls("[" + ",".join(parts)))
    if line is not None:
        line.clear()
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


def _progress(line, done, total, start):
    width = 30
    frac = done / total if total else 1.0
    bar = "#" * int(frac * width)
    line.show(f"[{bar:<{width}}] {done}/{total} {time.perf_counter() - start:6.1f}s")


def _open_output(path):
    """A temporary file beside ``path``, opened before any prompt runs so that an
    unwritable output fails at once; ``os.replace`` puts it in place at the end."""
    target = os.path.abspath(path)
    if os.path.isdir(target):
        raise CliError(f"output path is a directory, expected a file name: {path}")
    folder = os.path.dirname(target)
    if not os.path.isdir(folder):
        raise CliError(f"cannot write output file {path}: the folder {folder} does not exist")
    try:
        return tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=folder, delete=False,
                                           prefix=".needle-cy-", suffix=".json.tmp")
    except OSError as exc:
        raise CliError(f"cannot write output file {path}: {exc.strerror}") from None


def batch_record(prompt, response):
    """One output record: the call-me-maybe fields (``prompt``, and the ``name`` and
    ``parameters`` of the first call, ``null`` / ``{}`` without one), every call in
    ``calls``, the calls held back (not made) in ``held_back`` with the ``reason``, and
    ``error`` when the turn failed.

    The call-me-maybe contract is the file format of a function-calling exercise: one
    ``{"prompt", "name", "parameters"}`` record per prompt, naming the one function to call
    and its arguments.  Its readers look only at those three fields, so the extra fields
    (several calls, held-back calls) are added beside them, never in their place."""
    calls = [{"name": c["name"], "parameters": c.get("arguments") or {}}
             for c in response["function_calls"]] if response["success"] else []
    reason = "negated" if (response.get("validation") or {}).get("negation") else "low_confidence"
    held = [{"name": c["name"], "parameters": c.get("arguments") or {}, "reason": reason}
            for c in response.get("suppressed_calls") or []]
    record = {"prompt": prompt, "name": calls[0]["name"] if calls else None,
              "parameters": calls[0]["parameters"] if calls else {}, "calls": calls, "held_back": held}
    if not response["success"]:
        record["error"] = response["error"]
    return record


def cmd_batch(args):
    tools = _load_specs(args.functions_definition, args.strict)
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
        if not texts[-1].strip():
            raise CliError(f"input file {args.input}: entry {i} is a blank prompt")
    output = _open_output(args.output)
    try:
        agent = _make_agent(args, tools)
        out, start = [], time.perf_counter()
        line = LiveLine(sys.stderr) if not args.quiet and _is_terminal(sys.stderr) else None
        for i, text in enumerate(texts):
            agent.reset()
            out.append(batch_record(text, agent.complete(text)))
            if line is not None:
                _progress(line, i + 1, len(texts), start)
        if line is not None:
            line.clear()
        with output:
            json.dump(out, output, ensure_ascii=False, indent=2)
        os.replace(output.name, args.output)
    except BaseException:
        output.close()
        os.unlink(output.name)
        raise
    if not args.quiet:
        n_calls = sum(len(r["calls"]) for r in out)
        n_held = sum(len(r["held_back"]) for r in out)
        print(f"wrote {len(out)} records ({n_calls} calls, {n_held} held back) to {args.output}",
              file=sys.stderr)
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
    tools = _load_specs(args.tools, args.strict)
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


def describe_json(archive):
    """What ``describe`` prints, as JSON-ready data."""
    from dataclasses import fields
    from .archive import DTYPE_CQ, TERNARY_BITS
    config = archive.config
    return {
        "path": str(archive.source), "file_size": archive.file_size,
        "header": {f.name: getattr(config, f.name) for f in fields(config)},
        "heads": [{"name": h.name, "probes": h.probes, "queries": h.queries, "out": h.out,
                   "layout": h.layout} for h in archive.head_info.values()],
        "tokenizer_bytes": len(archive.tokenizer_bytes) if archive.tokenizer_bytes else 0,
        "parameters": archive.parameter_count,
        "tensors": [{"index": r.index, "role": r.role, "dtype": r.dtype_name, "shape": list(r.shape),
                     "bits": (("ternary" if r.bits == TERNARY_BITS else r.bits) if r.dtype == DTYPE_CQ
                              else None),
                     "group_size": r.group_size if r.dtype == DTYPE_CQ else None, "nbytes": r.nbytes}
                    for r in archive.records],
    }


def cmd_inspect(args):
    if args.config:
        from .config import format_settings
        print(format_settings())
        if args.model is None:
            return 0
    if args.model is None:
        raise SystemExit("needle-cy inspect: name a model (a .cact file, a folder or a Hugging Face id), "
                         "or pass --config")
    from .archive import Archive, describe
    from .hub import resolve_model
    path = resolve_model(args.model, args.model_file)
    archive = Archive.open(str(path))
    if args.json:
        print(json.dumps(describe_json(archive), indent=2, default=str))
    else:
        print(describe(archive))
    return 0


BENCH_QUERIES = ["turn on the kitchen light", "set a timer for ten minutes", "what's the weather like"]


def bench_rows(agent, queries):
    """Per query: (query, total, prefill, reasoning, constrained, other, grammar, prefill
    tok/s, decode tok/s).  total = prefill + reasoning + constrained + other (tool
    selection, grammar compilation, the envelope); grammar is part of constrained."""
    rows = []
    for q in queries:
        agent.reset()
        r = agent.complete(q)
        t = r["timings"]
        prefill = t["prefill_s"] + t["prefix_s"]
        other = max(t["total_s"] - prefill - t["reasoning_s"] - t["constrained_s"], 0.0)
        rows.append((q, prefill + t["reasoning_s"] + t["constrained_s"] + other, prefill,
                     t["reasoning_s"], t["constrained_s"], other, t["grammar_s"],
                     r["prefill_tps"], r["decode_tps"]))
    return rows


def cmd_bench(args):
    tools = _load_specs(args.tools, args.strict)
    agent = _make_agent(args, tools)
    queries = args.queries or BENCH_QUERIES
    rows = bench_rows(agent, queries)
    print(f"tools: {len(tools)} from {args.tools or DEFAULT_TOOLS_PATH}; model: "
          f"{agent.model_path or 'in memory'}")
    print(f"{'query':32s} {'total s':>8s} {'prefill':>8s} {'reason':>8s} {'constr':>8s} "
          f"{'other':>8s} {'(grammar':>9s} {'pf tok/s':>9s} {'dec tok/s':>9s}")
    for q, *vals in rows:
        print(f"{q[:32]:32s} " + " ".join(f"{v:8.3f}" for v in vals[:5])
              + f" {vals[5]:9.3f} {vals[6]:9.1f} {vals[7]:9.1f}")
    print("total = prefill + reason + constr + other (tool selection, grammar compile, envelope); "
          "grammar is part of constr")
    return 0


def cmd_serve(args):
    try:
        import starlette  # noqa: F401  (the [serve] extra)
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise CliError(f"needle-cy serve needs the serve extra ({exc.name or exc} is not "
                       f"installed): pip install 'needle_cy[serve]'") from None
    from .serve.app import bind, is_loopback, run
    from .serve.engine import Engine
    try:
        sock = bind(args.host, args.port)
    except OSError as exc:
        raise CliError(f"cannot listen on {args.host}:{args.port} ({exc.strerror or exc}); another "
                       f"server (Ollama?) may hold the port: pass --port") from None
    if not is_loopback(args.host) and not args.api_key:
        print(f"needle-cy: warning: serving on {args.host} without --api-key: anyone who can reach "
              f"this port can use the model (docs/serve.md)", file=sys.stderr)
    try:
        engine = Engine(args.model, model_file=args.model_file, threads=args.threads, name=args.name,
                        max_queue=args.max_queue, ignore_system=args.ignore_system)
        run(engine, api_key=args.api_key, max_body_bytes=args.max_request_kb * 1024,
            log_level=args.log_level, sock=sock)
    except KeyboardInterrupt:
        pass                     # Ctrl-C: the server has shut down
    finally:
        sock.close()
    return 0


# ------------------------------------------------------------------ parser

def _int_at_least(minimum):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value
    parse.__name__ = f"integer >= {minimum}"
    return parse


def _float_above_zero(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text}")
    return value


def build_parser():
    from . import __version__
    parser = argparse.ArgumentParser(prog="needle-cy", description="Offline Needle tool calling on CPU.")
    parser.add_argument("--version", action="version", version=f"needle-cy {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def model_flags(p, positional=False, optional=False):
        if positional:
            p.add_argument("model", nargs="?" if optional else None, default=None,
                           help="a .cact archive, a folder holding one, or a Hugging Face "
                                "model id (org/name[@revision])")
        else:
            p.add_argument("--model", default=None,
                           help="a .cact archive, a folder holding one, or a Hugging Face model id "
                                "(org/name[@revision], from the local cache first); default: the "
                                "embedded model")
        p.add_argument("--model-file", default=None,
                       help="which .cact file of a folder or Hugging Face model (default: the only "
                            "one, else model.cact)")

    def common(p, tools_flag=True):
        model_flags(p)
        p.add_argument("--threads", type=_int_at_least(1), default=None,
                       help="threads the engine uses (default: chosen per call, at most the "
                            "free physical cores)")
        p.add_argument("--backend", choices=["cython", "numpy"], default="cython",
                       help="engine: the compiled one (default) or the NumPy reference (slow; "
                            "for checking results)")
        p.add_argument("--max-new-tokens", type=_int_at_least(1), default=512,
                       help="tokens the model may write in one turn (default: 512)")
        p.add_argument("--no-grounding", action="store_true",
                       help="string values and reasoning quotes need not come from the request "
                            "(see needle_cy.grounding)")
        p.add_argument("--reasoning-limit", type=_int_at_least(0), default=256,
                       help="tokens of free reasoning before the turn declines")
        p.add_argument("--strict", action="store_true",
                       help="a tool schema keyword that looks misspelt (\"maximun\") is an error, "
                            "not a warning")
        p.add_argument("--tools-per-clause", type=_int_at_least(1), default=None, metavar="N",
                       help="the prompt holds only the ranker's best N tools for each clause of "
                            "the request (default: off; for a model that reads a tool list poorly)")
        p.add_argument("--name-prior", type=_float_above_zero, default=None, metavar="ALPHA",
                       help="weigh the model's choice of tool name by the ranker's prior to the "
                            "power ALPHA (default: off; every tool stays callable)")

    p = sub.add_parser("run", help="one request → tool calls")
    p.add_argument("query", help="the request, in quotes")
    p.add_argument("--tools", default=None,
                   help="JSON file with the tool definitions: a list of {name, description, "
                        "parameters} (default: the embedded model's catalogue)")
    p.add_argument("--system", default=None, help='facts, e.g. "date: 2026-03-04; location: Paris"')
    p.add_argument("--no-constrained", action="store_true", help="decode freely, validate afterwards")
    p.add_argument("--json", action="store_true", help="print the full response envelope")
    common(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser(
        "batch", help="call-me-maybe batch: prompts file → calls file",
        description="The call-me-maybe contract (a function-calling exercise's file formats): "
                    "functions as [{name, description, parameters: {arg: {type}}, returns}], "
                    'prompts as [{"prompt": "..."}], and one output record per prompt with the '
                    "prompt, the function to call (name) and its arguments (parameters); null and "
                    "{} when there is none.  needle-cy adds every call of the turn (calls), the "
                    "calls proposed but not made (held_back, with a reason) and error.")
    p.add_argument("--functions-definition", required=True,
                   help="JSON file with the tool definitions (the same formats as --tools)")
    p.add_argument("--input", required=True,
                   help='JSON file with the prompts: a list of {"prompt": "..."} or of strings')
    p.add_argument("--output", required=True,
                   help="JSON file to write: one record per prompt (prompt, name, parameters, "
                        "calls, held_back)")
    p.add_argument("--system", default=None, help='facts, e.g. "date: 2026-03-04; location: Paris"')
    p.add_argument("--no-constrained", action="store_true", help="decode freely, validate afterwards")
    p.add_argument("--quiet", action="store_true", help="no progress bar, no summary line")
    common(p)
    p.set_defaults(func=cmd_batch)

    p = sub.add_parser("chat", help="multi-turn REPL with simulated execution")
    p.add_argument("--tools", default=None,
                   help="JSON file with the tool definitions (default: the embedded model's catalogue)")
    p.add_argument("--system", default=None, help='facts, e.g. "date: 2026-03-04; location: Paris"')
    p.add_argument("--max-steps", type=_int_at_least(0), default=4,
                   help="at most this many model turns per request (default: 4)")
    common(p)
    p.set_defaults(func=cmd_chat)

    p = sub.add_parser("inspect", help="describe a .cact archive, or (--config) the settings")
    model_flags(p, positional=True, optional=True)
    p.add_argument("--json", action="store_true", help="the description as JSON")
    p.add_argument("--config", action="store_true",
                   help="every NEEDLE_CY_* environment variable: its value here or default, when it "
                        "is read, whom it is for (needle_cy.config)")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("bench", help="latency of a few turns, split by phase")
    p.add_argument("--tools", default=None,
                   help="JSON file with the tool definitions (default: the embedded model's catalogue)")
    p.add_argument("--queries", nargs="*", default=None,
                   help="requests to time (default: three fixed smart-home requests)")
    common(p)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("serve", help="a local OpenAI- and Ollama-compatible tool-calling endpoint "
                                     "(the [serve] extra; docs/serve.md)")
    model_flags(p)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 "
                        "exposes the model to the network, see docs/serve.md)")
    p.add_argument("--port", type=_port, default=11434,
                   help="port (default 11434, Ollama's; 0 picks a free one)")
    p.add_argument("--threads", type=_int_at_least(1), default=None,
                   help="the engine's worker threads (default: automatic, per call)")
    p.add_argument("--api-key", default=os.environ.get("NEEDLE_CY_API_KEY") or None,
                   help="require 'Authorization: Bearer KEY' on every request (default: the "
                        "NEEDLE_CY_API_KEY environment variable; none)")
    p.add_argument("--name", default=None,
                   help="the model name clients ask for (default: needle-cy for the embedded "
                        "model, else the archive's name)")
    p.add_argument("--ignore-system", action="store_true",
                   help="leave the clients' system messages out of the prompt (long instructions "
                        "do not fit a small model's context)")
    p.add_argument("--max-queue", type=_int_at_least(0), default=8,
                   help="requests that may wait behind the running one; more get 503 with Retry-After")
    p.add_argument("--max-request-kb", type=_int_at_least(1), default=1024,
                   help="largest request body in KiB (default 1024); larger ones get 413")
    p.add_argument("--log-level", choices=["critical", "error", "warning", "info", "debug"],
                   default="warning", help="uvicorn's log level (info logs every request)")
    p.set_defaults(func=cmd_serve)
    return parser


def _port(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number 0-65535, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 0-65535, got {value}")
    return value


# Arguments that are text for the model (not file names, which may be any bytes).
_TEXT_ARGUMENTS = ("query", "system", "queries")


def _check_text_arguments(args):
    """Text given on the command line in another encoding than UTF-8 reaches Python with
    its undecodable bytes as lone surrogates; name the argument and the byte instead of
    failing later inside the tokenizer."""
    for name in _TEXT_ARGUMENTS:
        value = getattr(args, name, None)
        for text in (value if isinstance(value, list) else [value]):
            if not isinstance(text, str):
                continue
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                byte = ord(text[exc.start]) - 0xDC00 if 0xDC80 <= ord(text[exc.start]) <= 0xDCFF else None
                what = f"byte 0x{byte:02X}" if byte is not None else f"U+{ord(text[exc.start]):04X}"
                raise CliError(f"the {name} argument is not UTF-8 text ({what} at character "
                               f"{exc.start}); give it in UTF-8") from None


def _quiet_broken_pipe():
    """The reader of stdout went away (``needle-cy … | head``): stop without a message.
    stdout is pointed at /dev/null so that the interpreter's final flush stays quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 141          # 128 + SIGPIPE, as a program killed by the signal reports


def _warning_printer(show_other):
    """``warnings.showwarning`` for the CLI: a SchemaWarning as one line ``needle-cy:
    warning: …`` (a problem of the user's tools file, not a place in the code), any other
    warning by ``show_other``."""
    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, SchemaWarning):
            print(f"needle-cy: warning: {message}", file=sys.stderr if file is None else file)
        else:
            show_other(message, category, filename, lineno, file, line)
    return show


def main(argv=None):
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
    except BrokenPipeError:       # --help / --version into a closed pipe
        return _quiet_broken_pipe()
    try:
        _check_text_arguments(args)
        with warnings.catch_warnings():
            warnings.showwarning = _warning_printer(warnings.showwarning)
            return args.func(args) or 0
    except BrokenPipeError:
        return _quiet_broken_pipe()
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
