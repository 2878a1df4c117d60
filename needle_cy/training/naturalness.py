"""How close a case set's requests sit to their tools' words: a figure to compare a
generated set with hand-written ones, no model needed.

    python -m needle_cy.eval --naturalness --data FILE.jsonl [--tools tools.json] [--json]

Cases are ``needle_cy.eval`` cases (their own ``tools``, else the ``--tools`` catalogue,
by default the packaged smart-home one).  Over the cases whose answer has calls:

* ``bm25_top1``: for single-call cases, how often the engine's BM25 ranker
  (``needle_cy.retrieval.rank_bm25``) puts the gold tool first among the case's tools,
  on the request's own words; ``bm25_top1_expanded`` with the shipped query expansion,
  as the agent ranks.  A request that paraphrases its tool ("warm the car up" for
  ``precondition_cabin``) ranks it lower than one that repeats the tool's words.  The
  figure depends on the number of tools a case offers (``mean_tools``).
* ``word_share``: the mean, over cases, of the share of the request's distinct content
  words found among the gold tools' words.  Content words: lower-cased words, the
  ``STOPWORDS`` below and plain numbers (values, never tool words) left out.  A tool's
  words are what BM25 indexes: its name split into words, its description, its
  parameters' names and descriptions and its enum values.  Both sides are stemmed as
  BM25 stems them (``needle_cy.retrieval.stem``: "lights" meets "light").
* ``no_shared_word``: the share of requests with no content word among the gold tools'.

Generated requests that copy their schema's words rank their tool first and share many
words with it; people say what they want rather than what the tool is called.
"""
import json

from needle_cy.retrieval import (bm25_index, bm25_tokens, default_query_expansion, rank_bm25, stem,
                                 tool_document)
from needle_cy.toolspec import normalize_tools

# Function words and the politeness around a request: what says nothing about the tool.
# (Words are split at apostrophes first: "it's" is "it" and "s".)
STOPWORDS = frozenset("""
a an the this that these those it its i me my mine we us our you your yours he him his
she her they them their there here
am is are was were be been being do does did doing done have has had having will would shall
should can could may might must
to of in on at by for from with about into onto over under up down out off as than then so
and or but if because while when what which who whom whose where why how
all any some each every no not nothing just also too very really quite please thanks thank
hey hi hello ok okay now right let lets want wanna need like
s t d ll m re ve
""".split())


def content_words(text):
    """The stemmed content words of a request, in order, each once."""
    out = []
    for word in bm25_tokens(text):
        if word in STOPWORDS or word.isdigit():
            continue
        word = stem(word)
        if word not in out:
            out.append(word)
    return out


def _share(correct, total):
    return {"cases": total, "correct": correct, "accuracy": correct / total if total else None}


def measure(cases, tools):
    """The figures of the module docstring for ``needle_cy.eval`` cases; ``tools`` is the
    catalogue of the cases without their own."""
    expansion = default_query_expansion()
    catalogues = {}
    n_calls = n_single = top1 = top1_expanded = no_shared = 0
    shares, sizes = [], []
    for case in cases:
        answers = case.get("answers") or []
        query = case.get("query")
        if not answers or not isinstance(query, str):
            continue
        case_tools = case.get("tools") or tools
        key = json.dumps(case_tools, sort_keys=True)
        entry = catalogues.get(key)
        if entry is None:
            specs = normalize_tools(case_tools)
            entry = catalogues[key] = (specs, bm25_index(specs), {s.name: i for i, s in enumerate(specs)})
        specs, index, position = entry
        gold = [position.get(call.get("name")) for call in answers]
        if any(g is None for g in gold):
            raise ValueError(f"case {case.get('id')!r}: an answer names a tool the case does not "
                             f"offer ({', '.join(c.get('name', '?') for c in answers)})")
        n_calls += 1
        sizes.append(len(specs))
        if len(answers) == 1:
            n_single += 1
            top1 += rank_bm25(query, specs, index)[0] == gold[0]
            top1_expanded += rank_bm25(query, specs, index, expansion)[0] == gold[0]
        tool_words = set()
        for g in gold:
            tool_words.update(tool_document(specs[g]))
        words = content_words(query)
        found = sum(w in tool_words for w in words)
        shares.append(found / len(words) if words else 0.0)
        no_shared += found == 0
    return {
        "cases": len(cases), "call_cases": n_calls, "single_call_cases": n_single,
        "mean_tools": sum(sizes) / len(sizes) if sizes else None,
        "bm25_top1": _share(top1, n_single),
        "bm25_top1_expanded": _share(top1_expanded, n_single),
        "word_share": sum(shares) / len(shares) if shares else None,
        "no_shared_word": no_shared / n_calls if n_calls else None,
        "no_shared_word_cases": no_shared,
    }


def _pct(value):
    return "-" if value is None else f"{100 * value:.1f}%"


def format_figures(figures):
    """The figures on one line."""
    t1, t1x = figures["bm25_top1"], figures["bm25_top1_expanded"]
    mean_tools = "-" if figures["mean_tools"] is None else f"{figures['mean_tools']:.1f}"
    return (f"{figures.get('data', 'cases')}: {figures['call_cases']} cases with calls "
            f"({figures['single_call_cases']} single, {mean_tools} tools a case); "
            f"BM25 top-1 {t1['correct']}/{t1['cases']} {_pct(t1['accuracy'])} "
            f"(expanded {_pct(t1x['accuracy'])}); request words in the gold tool "
            f"{_pct(figures['word_share'])}; no shared word {figures['no_shared_word_cases']} "
            f"{_pct(figures['no_shared_word'])}")

