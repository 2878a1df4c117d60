"""A fake model with scripted logits, for exact tests of decoding and the agent loop.

``ScriptedModel(tokenizer, turns)``: for the n-th assistant turn of a conversation the
logits put a peak on the next token of ``turns[n]`` (a text encoded with the real
tokenizer, ``dummy_prefix=False``, its markers as marker ids).  The position inside the turn is recovered from the
token history (tokens fed since the last ``<|im_start|>assistant\\n``), so the fake follows
the agent through prefix caching, snapshots, rollbacks and multi-turn loops exactly like a
model whose state is its history.  After the script it predicts ``<|im_end|>``.

Optional knobs: ``peak`` (the logit of the scripted token; the rest are 0, so its
probability is e^peak / (e^peak + V − 1)), ``confidence_logit`` (a confidence head),
``on_feed(model, ids)`` (called before each prefill/step, used to cancel mid-phase).
"""
import numpy as np


# a light tool the scripted decoding tests share
LIGHT_TOOL = {"name": "set_light", "description": "Turn a light on or off.",
              "parameters": {"type": "object", "properties": {
                  "room": {"type": "string", "enum": ["kitchen", "bedroom"]},
                  "on": {"type": "boolean"}}, "required": ["room", "on"],
                  "additionalProperties": False}}


class _Config:
    def __init__(self, vocab, max_seq_len):
        self.vocab = vocab
        self.out_vocab = vocab
        self.max_seq_len = max_seq_len


class ScriptedModel:
    def __init__(self, tokenizer, turns, peak=12.0, confidence_logit=None, max_seq_len=4096,
                 vocab=None, overrides=None, on_feed=None, embedding=False):
        self.tokenizer = tokenizer
        self.vocab = vocab or tokenizer.vocab_size
        self.config = _Config(self.vocab, max_seq_len)
        # A script is what the model writes: its markers are marker ids.
        self.scripts = [list(tokenizer.encode(t, dummy_prefix=False, allowed_special="all"))
                        if isinstance(t, str) else list(t)
                        for t in turns]
        self.peak = peak
        self.confidence_logit = confidence_logit
        self.overrides = overrides or {}       # (turn, k) -> {token: logit}
        self.on_feed = on_feed
        self.history = []
        self.n_prefill_calls = 0
        self.n_prefilled_tokens = 0
        self.n_steps = 0
        self.embedding = embedding
        self.heads = ("confidence",) if confidence_logit is not None else ()
        if embedding:
            self.heads = self.heads + ("embedding",)
        self.im_start = tokenizer.marker_id("<|im_start|>")
        self.im_end = tokenizer.marker_id("<|im_end|>")
        self.header = list(tokenizer.encode("assistant\n", dummy_prefix=False))
        # Off-script tokens all tie at 0; a natural model rarely writes JSON escapes, so
        # pieces with a backslash sit slightly lower (escape paths have their own tests).
        self.prior = np.zeros(self.vocab, np.float32)
        for i, piece in enumerate(tokenizer.piece_table(size=self.vocab)):
            if piece and b"\\" in piece:
                self.prior[i] = -1.0

    # --- Model protocol ----------------------------------------------------------
    @property
    def position(self):
        return len(self.history)

    def reset(self):
        self.history = []

    def snapshot(self):
        return list(self.history)

    def restore(self, snap):
        self.history = list(snap)

    def prefill(self, ids):
        if self.on_feed:
            self.on_feed(self, list(ids))
        self.n_prefill_calls += 1
        self.n_prefilled_tokens += len(ids)
        self.history.extend(int(i) for i in ids)
        return self._logits()

    def step(self, token):
        if self.on_feed:
            self.on_feed(self, [int(token)])
        self.n_steps += 1
        self.history.append(int(token))
        return self._logits()

    def head_outputs(self):
        out = {}
        if self.confidence_logit is not None:
            out["confidence"] = float(self.confidence_logit)
        if self.embedding:
            vec = np.zeros(16, np.float32)
            for t in self.history:
                vec[t % 16] += 1.0
            out["embedding"] = vec / max(np.linalg.norm(vec), 1e-6)
        return out

    # --- where are we in the script ----------------------------------------------
    def turn_and_offset(self):
        h, hdr = self.history, self.header
        turn, start = -1, None
        for i, tok in enumerate(h):
            if tok == self.im_start and h[i + 1:i + 1 + len(hdr)] == hdr:
                turn += 1
                start = i + 1 + len(hdr)
        if start is None:
            return -1, 0
        return turn, len(h) - start

    def _logits(self):
        logits = self.prior.copy()
        turn, k = self.turn_and_offset()
        if turn < 0:
            return logits
        script = self.scripts[turn] if turn < len(self.scripts) else []
        target = script[k] if k < len(script) else self.im_end
        logits[target] = self.peak
        for tok, value in self.overrides.get((turn, k), {}).items():
            logits[tok] = value
        return logits


def token_at_byte(tokenizer, text, offset):
    """(ids, i): the script encoding of ``text`` and the index of the token holding its
    byte ``offset`` (a marker such as ``<tool_call>`` counts as its text)."""
    ids = tokenizer.encode(text, dummy_prefix=False, allowed_special="all")
    pieces = tokenizer.piece_table(size=tokenizer.vocab_size)
    pos = 0
    for i, t in enumerate(ids):
        pos += len(pieces[t] if pieces[t] is not None else tokenizer.decode([t]).encode())
        if pos > offset:
            return ids, i
    raise ValueError(f"byte {offset} is past the text")


class FiniteGrammar:
    """Stand-in grammar whose language is a finite set of call strings.

    Same protocol as ``needle_cy.grammar`` (start/feed/best_allowed).  ``traps`` are
    extra accepted prefixes that complete nothing: a deliberately buggy grammar, to test
    the decoder's recovery from dead ends.
    """

    def __init__(self, sentences, traps=()):
        self.sentences = [s.encode("utf-8") if isinstance(s, str) else s for s in sentences]
        self.traps = [t.encode("utf-8") if isinstance(t, str) else t for t in traps]

    def start(self):
        return _FiniteState(self, b"")

    def best_allowed(self, state, logits, piece_table, close_string=False):
        for tok in np.argsort(-np.asarray(logits), kind="stable"):
            piece = piece_table[int(tok)]
            if not piece:
                continue
            new = state.clone()
            if new.feed(piece):
                return int(tok), new
        return -1, state


class _FiniteState:
    def __init__(self, grammar, text):
        self.grammar, self.text = grammar, text

    def clone(self):
        return _FiniteState(self.grammar, self.text)

    def feed(self, data):
        new = self.text + bytes(data)
        if any(s.startswith(new) for s in self.grammar.sentences + self.grammar.traps):
            self.text = new
            return True
        return False

    def is_complete(self):
        return self.text in self.grammar.sentences and not any(
            s != self.text and s.startswith(self.text) for s in self.grammar.sentences)

    def in_string(self):
        return False
