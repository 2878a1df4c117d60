"""Choosing which tools go into the prompt (spec §5.4, seed 000 §7).

The catalogue is ranked against the query, and the highest-ranked *prefix* that fits both
``max_tools`` and the ``token_budget`` (tokens of each tool's compact JSON, measured with
the model's tokenizer) is kept.  The grammar is then compiled from exactly that set, so an
unselected tool cannot be called.  Everything here is deterministic: ties keep the
catalogue order.

Rankers:

* ``bm25`` — Okapi BM25 (k1 = 1.2, b = 0.75, idf = ln(1 + (N − df + ½)/(df + ½))) over
  each tool's words: its name, description, parameter names and descriptions and the
  string values of its enums/consts (a request names "movie night" or "auto", the scene
  and mode a tool takes, far more often than the tool). Words are lower-cased, split on
  non-alphanumerics and on snake_case / camelCase boundaries, and lightly stemmed (a
  final "s", "es" or "ing" is dropped from words longer than four letters, so "lights"
  meets "light"). A request with several clauses ("close the garage, lock the back door
  and start the vacuum") puts each clause's best tool first, in clause order, before
  the ranking of the whole request: every intent of a multi-call request then reaches
  the top ``max_tools`` even when one intent's words dominate the scores.
* ``QueryExpansion`` (with ``bm25``) — words a request uses for a tool that its schema
  does not ("dim" for ``set_light``, "mute" for ``set_volume``, "humid" for a humidity
  sensor): a table of request word → tool-name words with a share in [0, 1], learned
  from the training data (``needle_cy.training.query_expansion``: the share of
  single-call requests holding the word that call a tool with that word in its name).
  A request's words score with weight 1, each expansion word with ``weight × share``
  (summed into the same BM25 sum, shares ≤ 1), so the words said still count most.  A
  request word no tool and no table knows, of five letters or more, also counts as its
  known neighbours one edit away (a typo: "voluem"; "alrm" is too short to guess
  safely).  The shipped table (``needle_cy/models/query_expansion.json``) is the agent's
  default.
* ``embedding`` — cosine similarity of the model's embedding-head vectors (already L2
  normalised, so a dot product) of the query and of each tool's compact JSON.  Tool
  vectors are cached in memory and, with ``cache_path``, on disk in an ``.npz`` keyed by a
  fingerprint of the model and of each tool's JSON, so a changed schema re-embeds only
  that tool.
* ``auto`` — ``embedding`` when the model has an embedding head, else ``bm25``.

How many: ``clause_picks`` keeps only the best tool (or few) of each clause of the
request, so a one-intent request shows one tool and a three-intent request three.
Small models choose worse among more tools, and a near miss shown beside the right tool
is the commonest wrong call; the agent's ``tools_per_clause`` uses it
(docs/api.md, tool retrieval, has the measurements).

How likely: ``name_prior`` turns the BM25 scores into a probability per tool for each
call of the request (the i-th call favours the i-th intent's tools), the soft
counterpart of ``clause_picks``: every tool stays callable, and the decoder
(``needle_cy.name_prior.NamePrior``) multiplies the model's choice of tool name by it.
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import re
from collections import Counter

import numpy as np

from .errors import QueryExpansionError

__all__ = ["bm25_tokens", "BM25", "bm25_index", "rank_bm25", "clause_picks", "name_prior", "select_prefix",
           "EmbeddingRanker", "file_fingerprint", "QueryExpansion", "default_query_expansion",
           "NAME_PRIOR_TEMPERATURE"]

_WORD = re.compile(r"[A-Za-z0-9]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def bm25_tokens(text: str) -> list:
    """Lower-cased words; snake_case and camelCase names are split into their words."""
    out = []
    for word in _WORD.findall(_CAMEL.sub(" ", text or "")):
        out.append(word.lower())
    return out


def stem(word: str) -> str:
    """Drop one final "ing", "es" or "s" from words longer than four letters."""
    if len(word) > 4:
        for suffix in ("ing", "es", "s"):
            if word.endswith(suffix):
                return word[:-len(suffix)]
    return word


def _schema_words(schema, out, depth=0):
    """Parameter names, descriptions and string enum/const values, depth-first."""
    if not isinstance(schema, dict) or depth > 8:
        return
    if isinstance(schema.get("description"), str) and depth:
        out.extend(bm25_tokens(schema["description"]))
    for value in list(schema.get("enum") or []) + ([schema["const"]] if "const" in schema else []):
        if isinstance(value, str):
            out.extend(bm25_tokens(value))
    for name, sub in (schema.get("properties") or {}).items():
        out.extend(bm25_tokens(str(name).replace("_", " ")))
        _schema_words(sub, out, depth + 1)
    for key in ("items", "additionalProperties"):
        _schema_words(schema.get(key), out, depth + 1)
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        for sub in schema.get(key) or []:
            _schema_words(sub, out, depth + 1)


def tool_document(spec) -> list:
    """The stemmed words BM25 indexes for one tool."""
    words = bm25_tokens(spec.name.replace("_", " ")) + bm25_tokens(spec.description)
    _schema_words(spec.parameters, words)
    return [stem(w) for w in words]


def query_terms(text: str) -> list:
    return [stem(w) for w in bm25_tokens(text)]


# Clause boundaries of a multi-intent request: punctuation and coordinating words.
_CLAUSE = re.compile(r"[,;:!?]|\.\s|\b(?:and|then|also|plus|after that|afterwards)\b", re.I)


def request_clauses(text: str) -> list:
    """The clauses of a request, cut at ``_CLAUSE``.  A piece without a letter ("3" in
    "the sum of 2 and 3", "4.5" after a comma) asks for nothing on its own: it stays with
    the clause before it, boundary included."""
    text = text or ""
    pieces, start = [], 0
    for m in _CLAUSE.finditer(text):
        pieces.append((start, m.start()))
        start = m.end()
    pieces.append((start, len(text)))
    out = []                       # [start, end] of each clause so far
    for a, b in pieces:
        piece = text[a:b]
        if not piece.strip():
            continue
        if out and not any(ch.isalpha() for ch in piece):
            out[-1][1] = b
        else:
            out.append([a, b])
    return [text[a:b].strip() for a, b in out]


class BM25:
    def __init__(self, documents, k1=1.2, b=0.75):
        self.k1, self.b = k1, b
        self.tf = [Counter(doc) for doc in documents]
        self.lengths = np.array([len(doc) for doc in documents], dtype=np.float64)
        self.avg_len = float(self.lengths.mean()) if len(documents) and self.lengths.sum() else 1.0
        n = len(documents)
        df = Counter(term for tf in self.tf for term in tf)
        self.idf = {t: math.log(1.0 + (n - c + 0.5) / (c + 0.5)) for t, c in df.items()}

    def scores(self, query_terms) -> np.ndarray:
        """BM25 of each document; ``query_terms`` is a list of words (each distinct word
        counts once) or a ``{word: weight}`` mapping (each word's sum scaled)."""
        weights = query_terms if isinstance(query_terms, dict) else dict.fromkeys(query_terms, 1.0)
        out = np.zeros(len(self.tf), dtype=np.float64)
        for term, weight in weights.items():
            idf = self.idf.get(term)
            if idf is None or not weight:
                continue
            for i, tf in enumerate(self.tf):
                f = tf.get(term, 0)
                if f:
                    norm = self.k1 * (1.0 - self.b + self.b * self.lengths[i] / self.avg_len)
                    out[i] += weight * idf * f * (self.k1 + 1.0) / (f + norm)
        return out


def _one_edit_apart(a: str, b: str) -> bool:
    """Damerau–Levenshtein distance exactly 1 (one insertion, deletion, substitution
    or swap of neighbours)."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) > len(b):
        a, b = b, a
    i = 0
    while i < len(a) and a[i] == b[i]:
        i += 1
    if len(a) < len(b):
        return a[i:] == b[i + 1:]
    return a[i + 1:] == b[i + 1:] or (i + 1 < len(a) and a[i] == b[i + 1] and a[i + 1] == b[i]
                                      and a[i + 2:] == b[i + 2:])


class QueryExpansion:
    """Request word → ``{tool-name word: share}``, applied as extra weighted BM25 terms."""

    FORMAT = "needle_cy.query_expansion/1"
    MIN_TYPO_LENGTH = 5

    def __init__(self, terms, weight=1.0, source=None):
        if not isinstance(terms, dict):
            raise QueryExpansionError(f"query expansion: 'terms' must be an object of word -> "
                                      f"{{word: share}}, got {type(terms).__name__}")
        for word, targets in terms.items():
            if not isinstance(word, str) or not isinstance(targets, dict) or not all(
                    isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
                    and 0.0 <= v <= 1.0 for k, v in targets.items()):
                raise QueryExpansionError(f"query expansion: entry {word!r} must map words to shares "
                                          f"in [0, 1], got {targets!r}")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight >= 0:
            raise QueryExpansionError(f"query expansion: 'weight' must be a number >= 0, got {weight!r}")
        self.terms = {w: dict(t) for w, t in terms.items()}
        self.weight = float(weight)
        self.source = source or {}

    @classmethod
    def load(cls, path):
        try:
            with open(path, encoding="utf-8") as handle:
                data = json.load(handle)
        except (OSError, ValueError) as exc:
            raise QueryExpansionError(f"query expansion {os.fspath(path)!r}: cannot read it as JSON "
                                      f"({exc})") from None
        if not isinstance(data, dict) or data.get("format") != cls.FORMAT:
            raise QueryExpansionError(f"query expansion {os.fspath(path)!r}: expected an object with "
                                      f"\"format\": {cls.FORMAT!r}")
        return cls(data.get("terms"), data.get("weight", 1.0), data.get("source"))

    def to_json(self) -> dict:
        return {"format": self.FORMAT, "weight": self.weight, "source": self.source,
                "terms": {w: dict(sorted(t.items())) for w, t in sorted(self.terms.items())}}

    def weighted_terms(self, terms, vocabulary=()) -> dict:
        """``{word: weight}`` for a request's stemmed words: each word 1, plus its
        expansions; an unknown word of MIN_TYPO_LENGTH letters or more stands for the
        known words one edit away (``vocabulary``: the index's words)."""
        out = {}
        known = None
        for term in dict.fromkeys(terms):
            forms = [term]
            if term not in self.terms and term not in vocabulary and len(term) >= self.MIN_TYPO_LENGTH:
                if known is None:
                    known = sorted(set(vocabulary) | set(self.terms))
                forms = [w for w in known if _one_edit_apart(term, w)] or forms
            for form in forms:
                out[form] = out.get(form, 0.0) + 1.0
                for word, share in self.terms.get(form, {}).items():
                    out[word] = out.get(word, 0.0) + self.weight * share
        return out


_DEFAULT_EXPANSION = os.path.join(os.path.dirname(__file__), "models", "query_expansion.json")


@functools.lru_cache(maxsize=1)
def default_query_expansion() -> QueryExpansion:
    """The shipped table (learned from the default model's training data), loaded once."""
    return QueryExpansion.load(_DEFAULT_EXPANSION)


def _order(scores) -> list:
    """Indices by descending score; ties keep catalogue order (stable)."""
    return sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))


def bm25_index(specs) -> BM25:
    return BM25([tool_document(s) for s in specs])


def rank_bm25(query: str, specs, index=None, expansion=None) -> list:
    """Catalogue indices, best first; ``index`` = ``bm25_index(specs)`` when reused;
    ``expansion``: a ``QueryExpansion`` (None: the request's words alone)."""
    index = index or bm25_index(specs)

    def terms(text):
        words = query_terms(text)
        return expansion.weighted_terms(words, index.idf) if expansion is not None else words

    whole = _order(index.scores(terms(query)))
    first = []
    clauses = request_clauses(query)
    if len(clauses) > 1:
        for clause in clauses:
            scores = index.scores(terms(clause))
            best = _order(scores)[0] if len(scores) else None
            if best is not None and scores[best] > 0 and best not in first:
                first.append(best)
    return first + [i for i in whole if i not in first]


def clause_picks(query: str, specs, per_clause: int = 1, index=None, expansion=None) -> list:
    """The best ``per_clause`` tools of each clause of the request (of the whole request
    when it has one clause), those that score above zero, each tool once: what a request
    asks for, without the near misses a wider selection adds.  [] when no tool shares a
    word with the request (the caller then shows more and lets the model read)."""
    index = index or bm25_index(specs)

    def best(text):
        words = query_terms(text)
        scores = index.scores(expansion.weighted_terms(words, index.idf) if expansion is not None else words)
        return [i for i in _order(scores)[:per_clause] if scores[i] > 0]

    picks = []
    clauses = request_clauses(query)
    if len(clauses) > 1:
        for clause in clauses:
            picks += [i for i in best(clause) if i not in picks]
    return picks or best(query)


# Temperature of ``name_prior`` over scores scaled to [0, 1]: the best tool of the request
# (or of a clause) outweighs one sharing no word with it e^5 ≈ 150 to 1 before the
# decoder's weight; chosen on generated held-out sets, never on the evaluation files.
NAME_PRIOR_TEMPERATURE = 0.2


def name_prior(query: str, specs, index=None, expansion=None, temperature=None):
    """The prior over the tools of ``specs`` for each call of the request, or None when no
    tool shares a word with it (no evidence: the decoder then leaves the model alone).

    A list of ``(pick, probabilities)`` rows (probabilities in the order of ``specs``):
    one per intent of the request, in its order, where ``pick`` is the intent's best tool
    (the index a call serving it names), then a last row with ``pick`` None for any
    further call.  Each text, the whole request and (when it has several) each of its
    clauses, scores the tools with BM25 scaled by its best score; a clause whose best
    tool an earlier clause already has is the same intent, and one sharing no word with
    any tool is none.  An intent's row is its clause's scores, the last row each tool's
    best score over all the texts (so every clause's best tool scores 1, as
    ``clause_picks`` would keep it); each row is the softmax of its scores over
    ``temperature`` (``NAME_PRIOR_TEMPERATURE`` when None)."""
    t = NAME_PRIOR_TEMPERATURE if temperature is None else float(temperature)
    if not t > 0 or math.isinf(t):
        raise ValueError(f"name_prior: temperature must be a finite number > 0, got {temperature!r}")
    specs = list(specs)
    if not specs:
        return None
    index = index or bm25_index(specs)

    def scaled(text):
        words = query_terms(text)
        scores = index.scores(expansion.weighted_terms(words, index.idf) if expansion is not None else words)
        top = float(scores.max())
        return scores / top if top > 0 else None

    def softmax(scores):
        weights = np.exp((scores - scores.max()) / t)
        return [float(w) for w in weights / weights.sum()]

    clauses = request_clauses(query)
    rows = [r for r in map(scaled, [query] + (clauses if len(clauses) > 1 else [])) if r is not None]
    if not rows:
        return None
    intents = []
    for row in rows[1:] if len(rows) > 1 else rows:
        pick = _order(row)[0]
        if all(pick != p for p, _ in intents):
            intents.append((pick, row))
    best = np.max(np.stack(rows), axis=0)
    return [(pick, softmax(row)) for pick, row in intents] + [(None, softmax(best))]


def select_prefix(order, token_counts, max_tools=None, token_budget=None) -> list:
    """Longest prefix of ``order`` within ``max_tools`` and ``token_budget``."""
    chosen, used = [], 0
    for i in order:
        if max_tools is not None and len(chosen) >= max_tools:
            break
        cost = token_counts[i]
        if token_budget is not None and used + cost > token_budget:
            break
        chosen.append(i)
        used += cost
    return chosen


def file_fingerprint(path) -> str:
    """Cheap, stable fingerprint of a model file: size + SHA-256 of its head and tail."""
    h = hashlib.sha256()
    size = os.path.getsize(path)
    h.update(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
        if size > (2 << 20):
            f.seek(-(1 << 20), os.SEEK_END)
            h.update(f.read(1 << 20))
    return h.hexdigest()[:32]


class EmbeddingRanker:
    """Cosine ranking with the model's embedding head; tool vectors cached by fingerprint.

    ``embed(text) -> unit vector`` is supplied by the agent (it owns the model state).
    """

    def __init__(self, embed, model_fingerprint: str, cache_path=None):
        self.embed = embed
        self.model_fingerprint = model_fingerprint
        self.cache_path = os.fspath(cache_path) if cache_path else None
        self._vectors = {}
        if self.cache_path and os.path.exists(self.cache_path):
            try:
                with np.load(self.cache_path) as data:
                    self._vectors = {k: np.array(data[k], dtype=np.float32) for k in data.files}
            except (OSError, ValueError):
                self._vectors = {}   # a corrupt cache is rebuilt, never trusted

    def _key(self, text):
        return hashlib.sha256((self.model_fingerprint + "\0" + text).encode("utf-8")).hexdigest()[:40]

    def tool_vectors(self, texts) -> np.ndarray:
        changed = False
        rows = []
        for text in texts:
            key = self._key(text)
            vec = self._vectors.get(key)
            if vec is None:
                vec = np.asarray(self.embed(text), dtype=np.float32).reshape(-1)
                self._vectors[key] = vec
                changed = True
            rows.append(vec)
        if changed and self.cache_path:
            tmp = self.cache_path + ".tmp.npz"
            np.savez(tmp, **self._vectors)
            os.replace(tmp, self.cache_path)
        return np.stack(rows) if rows else np.zeros((0, 0), np.float32)

    def rank(self, query: str, texts) -> list:
        tools = self.tool_vectors(texts)
        q = np.asarray(self.embed(query), dtype=np.float32).reshape(-1)
        norms = np.linalg.norm(tools, axis=1) * max(float(np.linalg.norm(q)), 1e-12)
        scores = (tools @ q) / np.maximum(norms, 1e-12)
        return _order(np.round(scores.astype(np.float64), 7))
