"""Train a small Needle 3 model from scratch with the official JAX code as a library.

Needs the optional training stack (``pip install "cactus-needle[train]==3.2.8"``,
which brings jax, flax, optax and sentencepiece). The architecture, the
fake-quant numerics and the ``.cact`` exporter are the official package's; this
module only supplies the data, the configuration, the loop and checkpoints.

A run lives in one folder (outside the repository):

    run/
      data.jsonl          generated examples (needle_cy.training.data, fixed seed)
      tokenizer.model     SentencePiece BPE trained on generated text
      tokens.npz          tokenized examples (ids, prompt lengths)
      run.json            the configuration and hyper-parameters of the run
      state.pkl           parameters + optimizer state + step (atomic, resumable)
      log.jsonl           one line per logged step

Commands:

    python -m needle_cy.training.train prepare RUN [--examples N] [--seed S]
    python -m needle_cy.training.train add-data RUN NAME [--examples N] [--seed S] [--version 2]
    python -m needle_cy.training.train merge-tokens OUT.npz A.npz B.npz ...  # one compressed file
    python -m needle_cy.training.train fit RUN [--steps N] [--until-step N]   # resumes
    python -m needle_cy.training.train export RUN OUT.cact [--bits 4]
"""
import argparse
import json
import math
import os
import pickle
import sys
import time

import numpy as np

from . import data as data_mod

# The shipped configuration: chosen for a Raspberry Pi-class CPU and for what 2
# shared cores can train in a few hours (see needle_cy/models/MODEL_CARD.md).
MODEL_CONFIG = dict(
    d_model=256, num_heads=4, num_kv_heads=2, num_layers=4, qk_head_dim=32, v_head_dim=64,
    max_seq_len=1024, rope_theta=100000.0, mhc_lanes=4, qkv_conv_taps=3,
    sliding_window=256, global_layers=(1, 3), engram_orders=(2, 3), engram_heads=0,
    engram_slots=2039, engram_seed_heads=0, engram_layers=(0, 2),
    embedding_dim=128, embedding_probes=4, embedding_queries=4,
    confidence_probes=4, confidence_queries=4, router_probes=4, router_queries=4,
    kv_bits=8, act_bits=8, dtype="float32", flash=False, remat=False, out_vocab=0,
)
HYPER = dict(
    vocab_size=4096, examples=150000, seed=0, peak_lr=2e-3, min_lr_ratio=0.1, warmup=50,
    total_steps=1500, decay_steps=300, weight_decay=0.05, b1=0.9, b2=0.95, clip=1.0, prompt_weight=0.1,
    tokens_per_batch=2048, buckets=(512,), checkpoint_every=25,
    log_every=5,
)


def _log(run_dir, record):
    with open(os.path.join(run_dir, "log.jsonl"), "a") as handle:
        handle.write(json.dumps(record) + "\n")
    print(json.dumps(record), flush=True)


# ------------------------------------------------------------------ prepare ---

def prepare(run_dir, examples=None, seed=None, vocab_size=None, **more):
    """A run from scratch: smart-home data, a tokenizer trained on it, its token file;
    ``more`` overrides further hyper-parameters (``tokenizer_examples`` …)."""
    from .tokenizer import check_tokenizer, train_tokenizer

    os.makedirs(run_dir, exist_ok=True)
    hyper = dict(HYPER, **more)
    if examples:
        hyper["examples"] = examples
    if seed is not None:
        hyper["seed"] = seed
    if vocab_size:
        hyper["vocab_size"] = vocab_size
    t0 = time.time()
    data_path = os.path.join(run_dir, "data.jsonl")
    data_mod.write_jsonl(data_path, hyper["examples"], seed=hyper["seed"])
    model_path = train_tokenizer(os.path.join(run_dir, "tokenizer"), hyper["vocab_size"],
                                 n_examples=hyper.get("tokenizer_examples", 20000),
                                 seed=1234 + hyper["seed"])
    sp = check_tokenizer(model_path)
    offsets = _tokenize(sp, data_path, os.path.join(run_dir, "tokens.npz"))
    run = {"model": MODEL_CONFIG, "hyper": hyper, "vocab_pieces": sp.get_piece_size(),
           "prepare_seconds": round(time.time() - t0, 1)}
    with open(os.path.join(run_dir, "run.json"), "w") as handle:
        json.dump(run, handle, indent=1)
    lengths = np.diff(np.asarray(offsets))
    print(f"prepared {len(lengths)} examples, {int(lengths.sum())} tokens, "
          f"mean {lengths.mean():.0f}, max {lengths.max()} in {time.time() - t0:.0f}s")


def _assistant_spans(ids, header, im_end):
    """[start, end) of each assistant turn's body in ``ids``: after every occurrence of
    the ``<|im_start|>assistant\\n`` ids up to and including the next ``<|im_end|>``."""
    spans, n, i = [], len(header), 0
    while i + n <= len(ids):
        if ids[i:i + n] == header:
            j = i + n
            while j < len(ids) and ids[j] != im_end:
                j += 1
            spans.append((i + n, min(j + 1, len(ids))))
            i = j
        else:
            i += 1
    return spans


def _tokenize(sp, data_path, out_path, max_len=None, text_tok=None):
    """[BOS] + prompt + target + [EOS] per example (prompt and target encoded separately,
    spec §7.1) into one .npz; returns the example offsets.

    An example with marker spellings in its outside text (``data.has_marker_text``) has
    its prompt encoded as the agent encodes it (``prompt.encode_template``, the spellings
    as text) by ``text_tok``, a ``needle_cy.tokenizer.Tokenizer`` of the same pieces.

    With ``max_len`` (data version 3) the file also holds a ``target_mask``: every
    assistant turn of the conversation (history included) is a target, and a conversation
    longer than ``max_len`` loses trailing requests until it fits."""
    im_start, im_end = sp.piece_to_id("<|im_start|>"), sp.piece_to_id("<|im_end|>")
    ids, offsets, prompt_lens, mask, header = [], [0], [], [], None
    with open(data_path, encoding="utf-8") as handle:
        for line in handle:
            example = json.loads(line)
            while True:
                prompt, target = data_mod.render(example)
                p, t = _encode_prompt(sp, text_tok, example, prompt), sp.encode(target)
                too_long = max_len is not None and len(p) + len(t) + 2 > max_len
                shorter = data_mod.drop_last_turn(example) if too_long else None
                if shorter is None:
                    break
                example = shorter
            if max_len is not None:
                if header is None:      # the prompt ends with the assistant header
                    header = p[len(p) - 1 - p[::-1].index(im_start):]
                p, m = _mask_turns(sp, p, t, header, im_start, im_end)
                mask.append(_role_codes(sp, [2] + p + t + [1], m))
            ids.extend([2] + p + t + [1])
            offsets.append(len(ids))
            prompt_lens.append(1 + len(p))
    arrays = dict(ids=np.asarray(ids, np.int32), offsets=np.asarray(offsets, np.int64),
                  prompt_lens=np.asarray(prompt_lens, np.int32))
    if max_len is not None:
        arrays["target_mask"] = np.concatenate(mask)
    np.savez(out_path, **arrays)
    return offsets


def _encode_prompt(sp, text_tok, example, prompt):
    if not data_mod.has_marker_text(example):
        return sp.encode(prompt)
    if text_tok is None:
        raise ValueError("an example has chat-marker spellings in its outside text: tokenizing it "
                         "needs the run's tokenizer.record (needle_cy's encoder), which is missing")
    from needle_cy.prompt import encode_template

    parts, _ = data_mod.render_parts(example)
    return encode_template(text_tok, parts, dummy_prefix=True)


def text_tokenizer(run_dir, sp=None):
    """needle_cy's encoder over the run's pieces (``tokenizer.record``), or None."""
    from needle_cy.tokenizer import Tokenizer

    if isinstance(sp, ArchiveTokenizer):
        return sp.tok
    path = os.path.join(run_dir, "tokenizer.record")
    if not os.path.exists(path):
        return None
    with open(path, "rb") as handle:
        return Tokenizer.from_record_bytes(handle.read())


# Target-mask codes: 0 prompt, 1 target; the tool names and the argument values of the
# answers (in the call and in the <think> note) are targets with their own codes, so a
# run can weight them (hyper "role_weights"); readers that only ask "> 0" see targets.
# A name's first piece ("name_start") is where the tool is chosen; the rest of a name
# mostly follows from it.
ROLE_CODES = {"name": 2, "value": 3, "name_start": 4}
_JSON_PUNCT = frozenset(b'"{}[]:,')


def _piece_bytes(sp, i):
    piece = sp.id_to_piece(int(i))
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        return bytes([int(piece[3:5], 16)])
    return piece.replace("\u2581", " ").encode("utf-8")


def _role_codes(sp, ids, mask):
    """``mask`` with the name and value tokens of every target span recoded (ROLE_CODES).
    A span's answers are read from its own ``<tool_call>`` JSON; a span whose call does
    not parse, or whose bytes are not whole UTF-8 text, keeps code 1."""
    out = mask.copy()
    n, i = len(mask), 0
    while i < n:
        if mask[i] != 1:
            i += 1
            continue
        j = i
        while j < n and mask[j] == 1:
            j += 1
        pieces = [_piece_bytes(sp, t) for t in ids[i:j]]
        try:
            text = b"".join(pieces).decode("utf-8")
            a, b = text.find("<tool_call>"), text.find("</tool_call>")
            answers = json.loads(text[a + len("<tool_call>"):b]) if 0 <= a < b else []
            if not isinstance(answers, list) or not all(isinstance(c, dict) and isinstance(c.get("name"), str)
                                                        and isinstance(c.get("arguments", {}), dict)
                                                        for c in answers):
                raise ValueError
            answers = [{"name": c["name"], "arguments": c.get("arguments", {})} for c in answers]
        except ValueError:
            i = j
            continue
        byte_roles = [r for ch, r in zip(text, data_mod.token_roles(text, answers)) for _ in ch.encode("utf-8")]
        c = 0
        for k, piece in enumerate(pieces):
            # a piece's role is that of its content bytes: the JSON punctuation a piece
            # such as '":"' carries around a value is structure
            roles = {byte_roles[c + q] for q, b in enumerate(piece) if b not in _JSON_PUNCT}
            code = ROLE_CODES["name"] if "name" in roles else ROLE_CODES["value"] if "value" in roles else 1
            if code == ROLE_CODES["name"] and (k == 0 or out[i + k - 1] not in (ROLE_CODES["name"],
                                                                                ROLE_CODES["name_start"])):
                code = ROLE_CODES["name_start"]
            out[i + k] = code
            c += len(piece)
        i = j
    return out


def _mask_turns(sp, p, t, header, im_start, im_end):
    """(prompt ids, target mask of [BOS] + prompt + target + [EOS]) with every assistant
    answer of the history a target.  A target encoded on its own starts with the
    dummy-prefix piece, so the model writes it first; the history answers get it too, as
    the agent appends the generated ids as they were."""
    if t and t[0] not in (im_start, im_end) and sp.id_to_piece(t[0]) == "\u2581":
        lead, p2, last = t[0], [], 0
        for a, b in _assistant_spans(p, header, im_end):
            if a >= len(p):
                break                   # the final header: the target follows
            p2 += p[last:a] + ([lead] if p[a:a + 1] != [lead] else [])
            last = a
        p = p2 + p[last:]
    m = np.zeros(len(p) + len(t) + 2, np.uint8)
    for a, b in _assistant_spans([2] + p, header, im_end):
        m[a:b] = 1
    m[1 + len(p):] = 1
    return p, m


MIX_VERSIONS = {"mix": 1, "mix2": 2, "mix3": 3, "mix4": 4, "mix5": 5, "mix6": 6, "mix7": 7}      # data version name -> needle_cy.training.mix version


def add_data(run_dir, name, examples, seed, version):
    """More training data for an existing run, tokenized with the run's own tokenizer:
    ``data_{name}.jsonl`` and ``tokens_{name}.npz``.  A run trains on it from the next
    ``fit`` when control.json says ``"tokens": "tokens_{name}.npz"``.  ``version``
    "mix" is the schema-general mix (``needle_cy.training.mix``), "mix2" its version 2
    (the hand-written consumer catalogues added, ``needle_cy.training.catalogues``), "mix3"
    its version 3 (most catalogues renamed), "mix4" its version 4 (phrase values), "mix5" its
    version 5 (requests in people's words rather than the tool's), "mix6" its version 6
    (more refusals that need the catalogue read), "mix7" its version 7 (more chat-marker
    spellings in outside text), else a smart-home data version (``needle_cy.training.data``)."""
    from . import mix

    t0 = time.time()
    sp = run_tokenizer(run_dir)
    data_path = os.path.join(run_dir, f"data_{name}.jsonl")
    if version in MIX_VERSIONS:
        mix.write_jsonl(data_path, examples, seed=seed, version=MIX_VERSIONS[version])
    else:
        data_mod.write_jsonl(data_path, examples, seed=seed, version=version)
    out_path = os.path.join(run_dir, f"tokens_{name}.npz")
    max_len = max(load_run(run_dir)["hyper"]["buckets"]) if version in MIX_VERSIONS or version >= 3 else None
    offsets = _tokenize(sp, data_path, out_path, max_len, text_tokenizer(run_dir, sp))
    lengths = np.diff(np.asarray(offsets))
    print(f"added {len(lengths)} examples (data version {version}, seed {seed}), "
          f"{int(lengths.sum())} tokens, mean {lengths.mean():.0f} in {time.time() - t0:.0f}s")


def load_run(run_dir):
    with open(os.path.join(run_dir, "run.json")) as handle:
        return json.load(handle)


def transformer_config(run):
    from needle.model.architecture import TransformerConfig

    fields = dict(run["model"])
    fields["vocab_size"] = run["hyper"]["vocab_size"]
    for key in ("global_layers", "engram_layers", "engram_orders"):
        fields[key] = tuple(fields[key])
    return TransformerConfig(**fields)


# ----------------------------------------------------------------- warm start ---

def _init_params(config, seed=0):
    import jax
    import jax.numpy as jnp
    from needle.model.architecture import SimpleAttentionNetwork

    params = SimpleAttentionNetwork(config).init(jax.random.PRNGKey(seed), jnp.zeros((1, 16), jnp.int32))["params"]
    return jax.tree.map(np.asarray, params)


_PROBE_HEADS = ("embedding_head", "confidence_head", "router_head")


def params_from_archive(archive_path, config):
    """The JAX parameter tree (numpy leaves) holding an archive's dequantized weights.

    The exporter's layout (transposes, reshapes, splits) is inverted by exporting
    index-coded parameters once: every leaf element holds 4 × (its global index + 1),
    ``official_float_tensors`` lays them out as it lays out weights, and each archive
    role's element then names the parameter element it came from.  The factor 4 proves
    the layout is pure (a scaled or shifted value would not be a multiple of 4); a
    parameter no role reaches keeps its seeded initial value (the probe heads, which the
    loop does not train)."""
    import jax

    from needle_cy.archive import Archive

    params = _init_params(config)
    trained = {k: v for k, v in params.items() if k not in _PROBE_HEADS}
    leaves, treedef = jax.tree.flatten(trained)
    total = sum(leaf.size for leaf in leaves)
    if 4 * (total + 1) >= 2 ** 24:
        raise ValueError(f"{total} parameters are too many for float32 index coding")
    coded, offset = [], 0
    for leaf in leaves:
        coded.append((4 * (np.arange(leaf.size, dtype=np.float64) + offset + 1))
                     .reshape(leaf.shape).astype(np.float32))
        offset += leaf.size
    layout = official_float_tensors(jax.tree.unflatten(treedef, coded), config)
    flat = np.concatenate([leaf.ravel().astype(np.float32) for leaf in leaves])
    filled = np.zeros(total, bool)
    archive = Archive.open(archive_path)
    try:
        for role, codes in layout.items():
            codes = np.asarray(codes, np.float64)
            if role in ("hada_p1", "hada_p2"):
                continue                    # fixed permutations, not parameters
            if not (np.all(codes % 4 == 0) and codes.min() >= 4 and codes.max() <= 4 * total):
                raise ValueError(f"exporter role {role!r} is not a pure layout of parameters")
            values = archive.dequantize(role)
            if values.size != codes.size:
                raise ValueError(f"archive role {role!r} has {values.size} values, "
                                 f"the configuration lays out {codes.size}")
            index = (codes.ravel() // 4 - 1).astype(np.int64)
            flat[index] = values.reshape(-1)
            filled[index] = True
    finally:
        archive.close()
    if not filled.all():
        raise ValueError(f"{int((~filled).sum())} parameters are in no archive role")
    out, offset = [], 0
    for leaf in leaves:
        out.append(flat[offset:offset + leaf.size].reshape(leaf.shape).astype(leaf.dtype))
        offset += leaf.size
    restored = jax.tree.unflatten(treedef, out)
    restored.update({k: v for k, v in params.items() if k in _PROBE_HEADS})
    return restored


class ArchiveTokenizer:
    """The sentencepiece calls the run uses (encode, piece_to_id, id_to_piece,
    get_piece_size), answered by needle_cy's own encoder over an archive's tokenizer
    record: a warm-started run has the record, not a ``tokenizer.model``.  Encoding is
    exact to sentencepiece's (tests/conformance)."""

    def __init__(self, record_bytes):
        from needle_cy.tokenizer import Tokenizer

        self.tok = Tokenizer.from_record_bytes(record_bytes)
        self._ids = {p: i for i, p in enumerate(self.tok.record.pieces)}

    def encode(self, text):
        # sentencepiece's encoding: the rendered examples write their markers as text.
        return list(self.tok.encode(text, allowed_special="all"))

    def piece_to_id(self, piece):
        return self._ids.get(piece, self.tok.unk_id)

    def id_to_piece(self, i):
        return self.tok.piece(i)

    def get_piece_size(self):
        return self.tok.vocab_size


def run_tokenizer(run_dir):
    """The run's tokenizer: ``tokenizer.model`` (a run from scratch) or the archive
    record ``tokenizer.record`` (a warm start)."""
    model = os.path.join(run_dir, "tokenizer.model")
    if os.path.exists(model):
        import sentencepiece as spm
        return spm.SentencePieceProcessor(model_file=model)
    with open(os.path.join(run_dir, "tokenizer.record"), "rb") as handle:
        return ArchiveTokenizer(handle.read())


def retrain_tokenizer(run_dir, vocab_size=4096, examples=6000, seed=300, source="mix"):
    """Give a run a tokenizer of its own, trained on ``source`` text (``training.tokenizer``):
    ``tokenizer.model`` (which ``run_tokenizer`` and so ``add_data`` use from then on),
    the same as an archive record in ``tokenizer.record`` (what the trainers put into the
    checkpoint and the export, with no sentencepiece needed there), and run.json's
    ``vocab_size``.  Token files made before it no longer fit the run."""
    from ..tokenizer import record_from_sentencepiece
    from .tokenizer import check_tokenizer, train_tokenizer

    model_path = train_tokenizer(os.path.join(run_dir, "tokenizer"), vocab_size, n_examples=examples,
                                 seed=seed, source=source)
    sp = check_tokenizer(model_path)
    with open(os.path.join(run_dir, "tokenizer.record"), "wb") as handle:
        handle.write(record_from_sentencepiece(model_path))
    run = load_run(run_dir)
    run["hyper"]["vocab_size"] = sp.get_piece_size()
    run["tokenizer"] = {"source": source, "examples": examples, "seed": seed, "pieces": sp.get_piece_size()}
    with open(os.path.join(run_dir, "run.json"), "w") as handle:
        json.dump(run, handle, indent=1)
    return model_path


def warm_start(run_dir, archive_path, params=True, **hyper):
    """A run folder whose step-0 state holds ``archive_path``'s dequantized weights (and
    a fresh optimizer), with the archive's tokenizer record; ``hyper`` overrides HYPER.
    ``params=False`` writes the folder only (run.json, tokenizer.record): the PyTorch
    trainer reads the archive itself (``torch_train.fit(init=...)``)."""
    from needle_cy.archive import Archive

    os.makedirs(run_dir, exist_ok=True)
    run = {"model": MODEL_CONFIG, "hyper": dict(HYPER, **hyper), "warm_start": os.path.abspath(archive_path)}
    with Archive.open(archive_path) as archive:
        if archive.tokenizer_bytes is None:
            raise ValueError(f"{archive_path} has no tokenizer record")
        record = archive.tokenizer_bytes
        run["hyper"]["vocab_size"] = archive.config.vocab
    with open(os.path.join(run_dir, "tokenizer.record"), "wb") as handle:
        handle.write(record)
    with open(os.path.join(run_dir, "run.json"), "w") as handle:
        json.dump(run, handle, indent=1)
    if not params:
        return
    params = params_from_archive(archive_path, transformer_config(run))
    _save_state(run_dir, {"params": params, "opt_state": None, "step": 0, "tokens": 0,
                          "target_tokens": 0, "seconds": 0.0})


# -------------------------------------------------------------------- batches ---

class Batches:
    """Length-bucketed batches in a seeded order per epoch; batch k of the whole run
    is a pure function of (seed, k), so a resumed run sees the same stream."""

    def __init__(self, run_dir, hyper, tokens="tokens.npz", first_step=0):
        z = np.load(os.path.join(run_dir, tokens))
        self.first_step = first_step
        self.ids, self.offsets, self.prompt_lens = z["ids"], z["offsets"], z["prompt_lens"]
        # per-token targets (every assistant turn) when the data has them, else the
        # target is what follows the prompt
        self.target_mask = z["target_mask"] if "target_mask" in z.files else None
        self.lengths = np.diff(self.offsets)
        self.buckets = sorted(hyper["buckets"])
        self.tokens_per_batch = hyper["tokens_per_batch"]
        self.seed = hyper["seed"]
        self.prompt_weight = hyper["prompt_weight"]
        # weight of each target-mask code (ROLE_CODES): targets 1, unless hyper
        # "role_weights" ({"name": w, "value": w}) weights names and values apart
        roles = hyper.get("role_weights") or {}
        unknown = set(roles) - set(ROLE_CODES)
        if unknown:
            raise ValueError(f"role_weights: unknown role(s) {sorted(unknown)}; the roles are {sorted(ROLE_CODES)}")
        self.code_weights = np.ones(max(ROLE_CODES.values()) + 1, np.float32)
        self.code_weights[0] = self.prompt_weight
        for role, w in roles.items():
            if not float(w) >= 1.0:
                raise ValueError(f"role_weights[{role!r}] = {w!r}: a target's weight must be >= 1")
            self.code_weights[ROLE_CODES[role]] = float(w)
        self._epoch, self._plan = None, None
        keep = self.lengths <= self.buckets[-1]
        self.usable = np.nonzero(keep)[0]

    def _bucket(self, n):
        for b in self.buckets:
            if n <= b:
                return b
        return self.buckets[-1]

    def _plan_epoch(self, epoch):
        rng = np.random.default_rng([self.seed, epoch])
        order = self.usable[rng.permutation(len(self.usable))]
        groups = {}
        plan = []
        for i in order:
            b = self._bucket(self.lengths[i])
            groups.setdefault(b, []).append(i)
            size = max(1, self.tokens_per_batch // b)
            if len(groups[b]) == size:
                plan.append((b, groups.pop(b)))
        return plan

    def batch(self, k):
        """Batch for run step ``k``: the file's batch ``k - first_step``."""
        k = max(0, k - self.first_step)
        # epochs are planned lazily; batches per epoch is fixed for a given seed
        if self._plan is None:
            self._epoch, self._plan = 0, self._plan_epoch(0)
        per_epoch = len(self._plan) if self._epoch == 0 else self._per_epoch
        self._per_epoch = per_epoch
        epoch, index = divmod(k, per_epoch)
        if epoch != self._epoch:
            self._epoch, self._plan = epoch, self._plan_epoch(epoch)
        index = min(index, len(self._plan) - 1)
        seq_len, members = self._plan[index]
        ids = np.zeros((len(members), seq_len), np.int32)
        weights = np.zeros((len(members), seq_len), np.float32)
        for row, i in enumerate(members):
            seq = self.ids[self.offsets[i]:self.offsets[i + 1]]
            ids[row, :len(seq)] = seq
            if self.target_mask is not None:
                m = self.target_mask[self.offsets[i]:self.offsets[i + 1]]
                weights[row, :len(seq)] = self.code_weights[np.minimum(m, len(self.code_weights) - 1)]
            else:
                p = self.prompt_lens[i]
                weights[row, :p] = self.prompt_weight
                weights[row, p:len(seq)] = 1.0
        return ids, weights, epoch


# ------------------------------------------------------------------------ fit ---

def lr_at(step, hyper, end, decay_steps, min_lr_ratio=None):
    """Warmup, then a constant peak, then a linear decay to min over the last
    ``decay_steps`` before ``end`` (warmup-stable-decay): the end can be chosen
    while the run is going, so a run can be cut to the time there is.  ``min_lr_ratio``
    (control.json's, for a final anneal below the run's floor) overrides the hyper's."""
    ratio = hyper["min_lr_ratio"] if min_lr_ratio is None else min_lr_ratio
    peak, floor = hyper["peak_lr"], hyper["peak_lr"] * ratio
    if step < hyper["warmup"]:
        return peak * (step + 1) / hyper["warmup"]
    start = end - decay_steps
    if step < start:
        return peak
    frac = min(1.0, (step - start) / max(1, decay_steps))
    return peak + (floor - peak) * frac


def _optimizer(hyper):
    import optax

    def decay_mask(params):
        import jax
        return jax.tree.map(lambda a: a.ndim >= 2, params)

    return optax.chain(
        optax.clip_by_global_norm(hyper["clip"]),
        optax.inject_hyperparams(optax.adamw)(
            learning_rate=hyper["peak_lr"], b1=hyper["b1"], b2=hyper["b2"],
            weight_decay=hyper["weight_decay"], mask=decay_mask))


def read_tokens_file(run_dir):
    """The token file a ``fit`` trains on: control.json's ``"tokens"`` (read when fit
    starts), else tokens.npz.  Batch k is drawn from that file's seeded epoch plan."""
    return str(_control(run_dir).get("tokens", "tokens.npz"))


def read_tokens_start(run_dir):
    """The run step at which the token file's batch 0 is read: control.json's
    ``"tokens_from_step"``, else 0.  A run that switches files mid-way sets it to the
    step of the switch, so it starts the new file at its first batch instead of at the
    batch of the run's step (skipping that many)."""
    return int(_control(run_dir).get("tokens_from_step", 0))


def _control(run_dir):
    try:
        with open(os.path.join(run_dir, "control.json")) as handle:
            got = json.load(handle)
        return got if isinstance(got, dict) else {}
    except (ValueError, OSError):
        return {}


def read_control(run_dir, hyper):
    """(end, decay_steps, min_lr_ratio or None) from run_dir/control.json, else from the
    hyper-parameters.  Edit control.json while a run goes to move its end; it is re-read
    every log."""
    end, decay = hyper["total_steps"], hyper.get("decay_steps", hyper["total_steps"] // 4)
    ratio = None
    path = os.path.join(run_dir, "control.json")
    if os.path.exists(path):
        try:
            with open(path) as handle:
                ctl = json.load(handle)
            end, decay = int(ctl.get("end", end)), int(ctl.get("decay_steps", decay))
            ratio = float(ctl["min_lr_ratio"]) if "min_lr_ratio" in ctl else None
        except (ValueError, OSError):
            pass
    return end, decay, ratio


def _save_state(run_dir, state):
    path = os.path.join(run_dir, "state.pkl")
    tmp = path + ".tmp"
    with open(tmp, "wb") as handle:
        pickle.dump(state, handle, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, path)


def load_state(run_dir):
    path = os.path.join(run_dir, "state.pkl")
    if not os.path.exists(path):
        return None
    with open(path, "rb") as handle:
        return pickle.load(handle)


def fit(run_dir, steps=None, until_step=None, qat=False):
    import jax
    import jax.numpy as jnp
    import optax
    from needle.model.architecture import SimpleAttentionNetwork
    from needle.model.quantize import WEIGHT_BITS, configure_deploy, cq_ste_params

    run = load_run(run_dir)
    hyper = run["hyper"]
    config = transformer_config(run)
    model = SimpleAttentionNetwork(config)
    optimizer = _optimizer(hyper)
    tokens_file = read_tokens_file(run_dir)
    batches = Batches(run_dir, hyper, tokens_file, read_tokens_start(run_dir))

    state = load_state(run_dir)
    if state is None:
        state = {"params": _init_params(config, hyper["seed"]), "opt_state": None,
                 "step": 0, "tokens": 0, "target_tokens": 0, "seconds": 0.0}
    params = jax.tree.map(jnp.asarray, state["params"])
    opt_state = (optimizer.init(params) if state["opt_state"] is None
                 else jax.tree.map(jnp.asarray, state["opt_state"]))
    n_params = sum(int(np.prod(a.shape)) for a in jax.tree.leaves(params))
    if qat:
        configure_deploy(act_bits=config.act_bits, kv_bits=config.kv_bits)

    def loss_fn(p, ids, weights):
        if qat:
            p = cq_ste_params(p, WEIGHT_BITS)
        logits = model.apply({"params": p}, ids, quant=bool(qat))
        logits, targets, w = logits[:, :-1], ids[:, 1:], weights[:, 1:]
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
        target_mask = (w >= 1.0).astype(jnp.float32)
        total = (ce * w).sum() / jnp.maximum(w.sum(), 1.0)
        target_ce = (ce * target_mask).sum() / jnp.maximum(target_mask.sum(), 1.0)
        return total, target_ce

    @jax.jit
    def train_step(p, o, ids, weights, lr):
        o[1].hyperparams["learning_rate"] = lr
        (loss, target_ce), grads = jax.value_and_grad(loss_fn, has_aux=True)(p, ids, weights)
        updates, o = optimizer.update(grads, o, p)
        return optax.apply_updates(p, updates), o, loss, target_ce

    def stop_at():
        sched_end, decay, ratio = read_control(run_dir, hyper)
        end = sched_end if until_step is None else min(until_step, sched_end)
        if steps is not None:
            end = min(end, first_step + steps)
        return end, sched_end, decay, ratio

    first_step = state["step"]
    end, sched_end, decay, ratio = stop_at()
    _log(run_dir, {"event": "start", "step": state["step"], "end": end, "params": n_params,
                   "tokens_file": tokens_file,
                   "qat": bool(qat), "time": time.strftime("%Y-%m-%d %H:%M:%S")})
    t_last = time.time()
    last_save = time.time()
    acc_loss, acc_tce, acc_n, acc_tok = 0.0, 0.0, 0, 0
    while state["step"] < end:
        ids, weights, epoch = batches.batch(state["step"])
        lr = lr_at(state["step"], hyper, sched_end, decay, ratio)
        params, opt_state, loss, tce = train_step(params, opt_state, jnp.asarray(ids),
                                                  jnp.asarray(weights), jnp.float32(lr))
        state["step"] += 1
        if acc_n == 0 and state["step"] == first_step + 1:
            loss.block_until_ready()
            _log(run_dir, {"event": "first step done", "seconds": round(time.time() - t_last, 1)})
        ntok = int((ids != 0).sum())
        state["tokens"] += ntok
        state["target_tokens"] += int((weights >= 1.0).sum())
        acc_loss += float(loss)
        acc_tce += float(tce)
        acc_n += 1
        acc_tok += ntok
        if state["step"] % hyper["log_every"] == 0 or state["step"] == end:
            now = time.time()
            state["seconds"] += now - t_last
            _log(run_dir, {"step": state["step"], "epoch": epoch, "loss": round(acc_loss / acc_n, 4),
                           "target_ce": round(acc_tce / acc_n, 4),
                           "lr": round(lr, 7),
                           "tok_per_s": round(acc_tok / max(now - t_last, 1e-9), 1),
                           "tokens": state["tokens"], "seconds": round(state["seconds"])})
            t_last = now
            acc_loss, acc_tce, acc_n, acc_tok = 0.0, 0.0, 0, 0
            end, sched_end, decay, ratio = stop_at()
        if (state["step"] % hyper["checkpoint_every"] == 0 or state["step"] == end
                or time.time() - last_save > 600):
            state["params"] = jax.tree.map(np.asarray, params)
            state["opt_state"] = jax.tree.map(np.asarray, opt_state)
            _save_state(run_dir, state)
            last_save = time.time()
    return state


# --------------------------------------------------------------------- export ---

class _SpHolder:
    """What the official exporter's tokenizer dump reads: an object with .sp."""

    def __init__(self, model_path):
        import sentencepiece as spm
        self.sp = spm.SentencePieceProcessor(model_file=model_path)


def export(run_dir, out_path, bits=4, state_path=None):
    """Write the run's latest parameters as a .cact with the official exporter."""
    from needle.model.architecture import effective_kv_window
    from needle.model.export import write_export

    run = load_run(run_dir)
    config = transformer_config(run)
    if state_path:
        with open(state_path, "rb") as handle:
            state = pickle.load(handle)
    else:
        state = load_state(run_dir)
    params = state["params"]
    # probe heads are not trained by this loop: none are exported (confidence → None)
    params = {k: v for k, v in params.items()
              if k not in ("embedding_head", "confidence_head", "router_head")}
    tok = _SpHolder(os.path.join(run_dir, "tokenizer.model"))
    info = write_export(params, config, out_path, bits=bits, tokenizer=tok,
                        kv_window=effective_kv_window(config))
    print(f"wrote {info['path']} {info['bytes'] / 1e6:.2f} MB {info['tensors']} tensors "
          f"(step {state['step']}, {state['tokens']} tokens)")
    return info


def official_float_tensors(params, config):
    """Role → float32 array in the archive layout, as the official exporter lays it out.

    The official ``_tensors`` is run with its quantize/round helpers swapped for
    capturing ones, so the transposes and reshapes are exactly the exporter's; the
    arrays are then written by needle_cy's own writer (any CQ width)."""
    import re
    from needle.model import export as official

    captured = {}

    def grab_q(name, mat, bits, group):
        captured[name] = np.asarray(mat, np.float32)
        return official._Tensor(name, official.FP16, (), b"")

    def grab_fp16(name, arr):
        captured[name] = np.asarray(arr, np.float32)
        return official._Tensor(name, official.FP16, (), b"")

    saved = official._q, official._fp16
    official._q, official._fp16 = grab_q, grab_fp16
    try:
        tensors = official._tensors(params, config, 4, 128)
    finally:
        official._q, official._fp16 = saved
    for t in tensors:
        if t.name not in captured and t.dtype == official.FP32:
            captured[t.name] = np.frombuffer(t.blob, np.float32).reshape(t.shape)
    roles = {}
    for name, value in captured.items():
        role = re.sub(r"^layer(\d+)\.", lambda m: f"layers.{int(m.group(1))}.", name)
        role = re.sub(r"^engram(\d+)\.", lambda m: f"engram.{int(m.group(1))}.", role)
        roles[role] = value
    return roles


def export_ours(run_dir, out_path, bits=2, state_path=None):
    """Write the run's parameters with needle_cy.archive.write_archive at ``bits``."""
    from needle.model.architecture import effective_kv_window
    from needle.model.export import _tokenizer_blob
    from needle_cy.archive import NeedleConfig, write_archive

    run = load_run(run_dir)
    config = transformer_config(run)
    if state_path:
        with open(state_path, "rb") as handle:
            state = pickle.load(handle)
    else:
        state = load_state(run_dir)
    params = {k: v for k, v in state["params"].items()
              if k not in ("embedding_head", "confidence_head", "router_head")}
    tensors = official_float_tensors(params, config)
    m = run["model"]
    cfg = NeedleConfig.build(
        vocab=run["hyper"]["vocab_size"], out_vocab=m["out_vocab"], d_model=m["d_model"],
        num_heads=m["num_heads"], num_kv_heads=m["num_kv_heads"], num_layers=m["num_layers"],
        qk_head_dim=m["qk_head_dim"], v_head_dim=m["v_head_dim"], max_seq_len=m["max_seq_len"],
        mhc_lanes=m["mhc_lanes"], sliding_window=m["sliding_window"],
        global_layers=tuple(m["global_layers"]), qkv_conv_taps=m["qkv_conv_taps"],
        engram_slots=m["engram_slots"], engram_orders=tuple(m["engram_orders"]),
        engram_heads=m["engram_heads"], engram_seed_heads=m["engram_seed_heads"],
        engram_sites=tuple(m["engram_layers"]), rope_theta=m["rope_theta"],
        kv_window=effective_kv_window(config), kv_bits=m["kv_bits"])
    record = os.path.join(run_dir, "tokenizer.record")
    if os.path.exists(record):          # a warm start keeps its archive's record
        with open(record, "rb") as handle:
            tokenizer_bytes = handle.read()
    else:
        tokenizer_bytes = _tokenizer_blob(_SpHolder(os.path.join(run_dir, "tokenizer.model")))
    write_archive(out_path, cfg, tensors, bits=bits, group_size=128,
                  tokenizer_bytes=tokenizer_bytes)
    size = os.path.getsize(out_path)
    print(f"wrote {out_path} {size / 1e6:.2f} MB at {bits} bits (step {state['step']})")
    return out_path


def merge_tokens(paths, out_path):
    """Concatenate token files (``_tokenize``'s format) into one compressed file whose ids
    are uint16 when the vocabulary allows: the mix's repeated catalogues compress ~9x
    (24.4 M tokens: 123 MB as int32 + mask, 13.7 MB compressed), small enough to carry
    a run's data to another machine.  Readers (``Batches``) take either form."""
    ids, offsets, prompt_lens, masks, base = [], [np.zeros(1, np.int64)], [], [], 0
    for path in paths:
        z = np.load(path)
        if "target_mask" not in z.files and masks:
            raise ValueError(f"{path}: no target_mask while earlier files have one")
        ids.append(z["ids"])
        offsets.append(z["offsets"][1:] + base)
        prompt_lens.append(z["prompt_lens"])
        if "target_mask" in z.files:
            masks.append(z["target_mask"])
        base += int(z["offsets"][-1])
    ids = np.concatenate(ids)
    dtype = np.uint16 if ids.size == 0 or int(ids.max()) < 65536 else np.int32
    arrays = dict(ids=ids.astype(dtype), offsets=np.concatenate(offsets),
                  prompt_lens=np.concatenate(prompt_lens))
    if masks:
        if len(masks) != len(paths):
            raise ValueError("merge_tokens: every file or none must have a target_mask")
        arrays["target_mask"] = np.concatenate(masks)
    np.savez_compressed(out_path, **arrays)
    return out_path


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m needle_cy.training.train")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("run_dir")
    p.add_argument("--examples", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--vocab", type=int)
    a = sub.add_parser("add-data")
    a.add_argument("run_dir")
    a.add_argument("name")
    a.add_argument("--examples", type=int, default=60000)
    a.add_argument("--seed", type=int, default=1)
    a.add_argument("--version", default="2", help="a smart-home data version (1-7), 'mix', 'mix2', ..., 'mix7'")
    t = sub.add_parser("tokenizer", help="retrain the run's tokenizer (before its token files)")
    t.add_argument("run_dir")
    t.add_argument("--vocab", type=int, default=4096)
    t.add_argument("--examples", type=int, default=6000)
    t.add_argument("--seed", type=int, default=300)
    t.add_argument("--source", choices=("home", "mix", "mix2"), default="mix")
    m = sub.add_parser("merge-tokens", help="concatenate token files into one compressed file")
    m.add_argument("out")
    m.add_argument("inputs", nargs="+")
    f = sub.add_parser("fit")
    f.add_argument("run_dir")
    f.add_argument("--steps", type=int)
    f.add_argument("--until-step", type=int)
    f.add_argument("--qat", action="store_true")
    e = sub.add_parser("export")
    e.add_argument("run_dir")
    e.add_argument("out")
    e.add_argument("--bits", type=int, default=4)
    e.add_argument("--writer", choices=("official", "ours"), default="official")
    args = parser.parse_args(argv)
    if args.cmd == "prepare":
        prepare(args.run_dir, args.examples, args.seed, args.vocab)
    elif args.cmd == "add-data":
        version = args.version if args.version in MIX_VERSIONS else int(args.version)
        add_data(args.run_dir, args.name, args.examples, args.seed, version)
    elif args.cmd == "tokenizer":
        retrain_tokenizer(args.run_dir, args.vocab, args.examples, args.seed, args.source)
    elif args.cmd == "merge-tokens":
        merge_tokens(args.inputs, args.out)
    elif args.cmd == "fit":
        fit(args.run_dir, args.steps, args.until_step, args.qat)
    elif args.writer == "ours":
        export_ours(args.run_dir, args.out, args.bits)
    else:
        export(args.run_dir, args.out, args.bits)


if __name__ == "__main__":
    sys.exit(main())
