"""Learn the retrieval's query-expansion table from the training data generator.

    python -m needle_cy.training.query_expansion needle_cy/models/query_expansion.json

BM25 finds a tool only through words its schema holds; people ask with others ("dim the
kitchen", "mute it", "how humid is it").  The generator's single-call requests say which
words people use for which tool, so the table is counted from them: for each (stemmed)
request word (letters only) seen in at least ``min_count`` such requests whose most
frequent tool is called by at least ``min_top_share`` of them (a word that points
somewhere), every tool called by at least ``min_share`` of them, and ``min_lift`` times
more often than tools are called on average, lends the words of its *name* with that
share.  Name words, not tool ids: the
table then helps any catalogue whose tools are named the usual way (``set_volume``,
``get_sensor_reading``), not only the one it was counted on.

Counted on data version 4 with its own seed (no training run used it; the evaluation
files in ../shared/eval are never read), so the shipped table is reproduced exactly by
the command above (a test does).
"""
import argparse
import json
import sys
from collections import Counter, defaultdict

from needle_cy.retrieval import QueryExpansion, bm25_tokens, query_terms, stem

from .data import Generator, load_catalogue

DEFAULTS = dict(examples=20000, seed=11, version=4, min_count=10, min_top_share=0.5, min_share=0.25,
                min_lift=3.0, weight=1.0)


def single_call_requests(examples, seed, version):
    """(request, tool name) of every turn of ``examples`` generated conversations that
    calls exactly one catalogue tool (once or more)."""
    generator = Generator(seed=seed, version=version)
    catalogue = {t["name"] for t in load_catalogue()}
    for _ in range(examples):
        example = generator.example()
        turns = [(h["query"], h["answers"]) for h in example.get("history", [])]
        turns.append((example["query"], example["answers"]))
        for query, answers in turns:
            names = {call["name"] for call in answers}
            if len(names) == 1 and names <= catalogue:
                yield query, names.pop()


def learn(examples=DEFAULTS["examples"], seed=DEFAULTS["seed"], version=DEFAULTS["version"],
          min_count=DEFAULTS["min_count"], min_top_share=DEFAULTS["min_top_share"],
          min_share=DEFAULTS["min_share"],
          min_lift=DEFAULTS["min_lift"], weight=DEFAULTS["weight"]) -> QueryExpansion:
    word_count, tool_count = Counter(), Counter()
    word_tool = defaultdict(Counter)
    requests = 0
    for query, tool in single_call_requests(examples, seed, version):
        requests += 1
        tool_count[tool] += 1
        for word in set(query_terms(query)):
            word_count[word] += 1
            word_tool[word][tool] += 1
    terms = {}
    for word, count in word_count.items():
        if count < min_count or not word.isalpha():
            continue    # numbers tie to this catalogue's ranges, not to language
        if max(word_tool[word].values()) < min_top_share * count:
            continue    # a word spread over many tools ("a", "for", "open") points nowhere
        expansion = {}
        for tool, together in word_tool[word].items():
            share = together / count
            if share >= min_share and share >= min_lift * tool_count[tool] / requests:
                for name_word in bm25_tokens(tool.replace("_", " ")):
                    key = stem(name_word)
                    expansion[key] = max(expansion.get(key, 0.0), round(share, 3))
        if expansion:
            terms[word] = expansion
    source = dict(generator_version=version, seed=seed, examples=examples, requests=requests,
                  min_count=min_count, min_top_share=min_top_share, min_share=min_share,
                  min_lift=min_lift)
    return QueryExpansion(terms, weight=weight, source=source)


def write(expansion: QueryExpansion, path):
    """JSON with one request word per line (diffs stay readable)."""
    data = expansion.to_json()
    terms = data.pop("terms")
    head = json.dumps(data)[:-1]
    lines = [f"{json.dumps(w)}: {json.dumps(t)}" for w, t in terms.items()]
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(head + ', "terms": {\n' + ",\n".join(lines) + "\n}}\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="where to write the table (JSON)")
    for key, value in DEFAULTS.items():
        parser.add_argument("--" + key.replace("_", "-"), type=type(value), default=value)
    args = parser.parse_args(argv)
    expansion = learn(**{k: getattr(args, k) for k in DEFAULTS})
    write(expansion, args.out)
    print(f"{len(expansion.terms)} request words from {expansion.source['requests']} requests "
          f"-> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
