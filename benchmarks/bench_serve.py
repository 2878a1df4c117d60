"""``needle-cy serve``: time to the first call of a second turn, resumed against cold.

    python benchmarks/bench_serve.py [--repeats 8] [--threads 1] [--model PATH]

Starts ``needle-cy serve`` in a subprocess on a free loopback port (the embedded model and
its smart-home catalogue by default) and drives it with the ``openai`` client, streaming.
"to 1st call" = from sending the request to the first chunk carrying a tool call (the
server sends the calls when the turn has passed its checks, so this is close to the
whole turn).  Each repeat uses its own system fact (``location: flat N``), so that a
"cold" request finds nothing of its prompt prepared.

Requests per repeat (the conversation: a request, its calls, the tool results):

* first turn, cold       — a new tool block (system fact) and request: all prefilled;
* second turn, resumed   — the tool results right after the first turn: the server
                           restores the conversation and prefills the result turn only;
* second turn, cold      — the same two-turn conversation under a system fact never
                           seen: tool block, first turn (put in with ``add_turn``) and
                           result turn all prefilled;
* second turn, unseen    — tool block ready (the first turn's system fact and request),
                           but answered with calls this server did not write (another
                           temperature): the first turn is put in, then the result turn.

Reported: median and lowest milliseconds over the repeats, and the prompt and cached
tokens of the last repeat (``usage.prompt_tokens_details.cached_tokens``).
"""
import argparse
import json
import os
import select
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

QUERY = "set the thermostat to 21 degrees"
OTHER = "set a timer for ten minutes"            # warms the grammar of another selection
RESULT = json.dumps({"ok": True})


def start_server(args):
    cmd = [sys.executable, "-m", "needle_cy", "serve", "--port", "0"]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if args.model:
        cmd += ["--model", args.model]
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    line, deadline = "", time.monotonic() + 120
    while "needle-cy serve:" not in line:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the server did not start: {line}{proc.stderr.read() if proc.poll() is not None else ''}")
        if select.select([proc.stderr], [], [], 1)[0]:
            line = proc.stderr.readline()
    model = line.split("model ", 1)[1].split()[0].strip("'")
    return proc, line.split(" at ", 1)[1].split()[0], model


def timed(client, model, messages, tools):
    """(seconds to the first tool-call chunk, calls, usage) of a streamed request."""
    t0 = time.perf_counter()
    first, parts, usage = None, {}, None
    for chunk in client.chat.completions.create(model=model, messages=messages, tools=tools, stream=True,
                                                stream_options={"include_usage": True}):
        usage = chunk.usage or usage
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                if first is None:
                    first = time.perf_counter() - t0
                part = parts.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                part["id"] += delta.id or ""
                part["name"] += delta.function.name or ""
                part["arguments"] += delta.function.arguments or ""
    if first is None:
        raise SystemExit(f"no call for {messages[-1]}")
    return first, [parts[i] for i in sorted(parts)], usage


def second_turn(system, query, calls):
    assistant = {"role": "assistant", "content": None, "tool_calls": [
        {"id": c["id"] or f"call_{i}", "type": "function",
         "function": {"name": c["name"], "arguments": c["arguments"]}} for i, c in enumerate(calls)]}
    results = [{"role": "tool", "tool_call_id": t["id"], "content": RESULT} for t in assistant["tool_calls"]]
    return [{"role": "system", "content": system}, {"role": "user", "content": query}, assistant] + results


def other_answer(calls):
    """The first turn's calls with other arguments: an answer this server did not give."""
    out = []
    for call in calls:
        arguments = json.loads(call["arguments"])
        if "temperature" in arguments:
            arguments["temperature"] = 22
        out.append(dict(call, arguments=json.dumps(arguments), id=""))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--model", default=None)
    args = parser.parse_args()
    import openai
    from needle_cy import home_tools
    tools = [{"type": "function", "function": t} for t in home_tools()]
    proc, url, model = start_server(args)
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
        # warm-up: the grammar of the catalogue's selections, the server's first request
        for q in (QUERY, OTHER):
            timed(client, model, [{"role": "user", "content": q}], tools)
        rows = {name: [] for name in ("first turn, cold", "second turn, resumed", "second turn, cold",
                                      "second turn, unseen")}
        usage = {}
        for i in range(args.repeats):
            system = f"location: flat {i}"
            s, calls, u = timed(client, model, [{"role": "system", "content": system},
                                                {"role": "user", "content": QUERY}], tools)
            rows["first turn, cold"].append(s)
            usage["first turn, cold"] = u
            s, _, u = timed(client, model, second_turn(system, QUERY, calls), tools)
            rows["second turn, resumed"].append(s)
            usage["second turn, resumed"] = u
            s, _, u = timed(client, model, second_turn(f"location: house {i}", QUERY, calls), tools)
            rows["second turn, cold"].append(s)
            usage["second turn, cold"] = u
            s, _, u = timed(client, model, second_turn(system, QUERY, other_answer(calls)), tools)
            rows["second turn, unseen"].append(s)
            usage["second turn, unseen"] = u
    finally:
        proc.terminate()
        proc.wait(30)
    print(f"model {model}, {args.repeats} repeats, threads {args.threads or 'auto'}")
    print(f"{'request':24s} {'to 1st call ms':>15s} {'(lowest)':>9s} {'prompt tok':>11s} {'cached tok':>11s}")
    for name, times in rows.items():
        u = usage[name]
        print(f"{name:24s} {1000 * statistics.median(times):15.1f} {1000 * min(times):9.1f} "
              f"{u.prompt_tokens:11d} {u.prompt_tokens_details.cached_tokens:11d}")


if __name__ == "__main__":
    main()
