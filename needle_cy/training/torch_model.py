"""The Needle 3 model in PyTorch, for training: the engine's forward pass (spec §4, §5).

Needs the optional extra ``[train]`` (torch); the runtime never imports this module.

Parameters live in the archive's own layout: every parameter's ``state_dict`` name is
its archive role (``embedding``, ``layers.3.q_proj``, ``mhc_phi_res``,
``engram.0.tables``, ``heads.confidence.probes`` …) and its shape is the role's
logical shape (matrices ``[out, in]``), so export is a dict comprehension and an
existing ``.cact`` initialises the model directly:

    from needle_cy.training.torch_model import NeedleTorch
    model, tok = NeedleTorch.from_archive("needle_cy/models/default.cact")   # dequantized
    logits = model(ids)                                   # [B, T] int64 -> [B, T, out_rows]
    model.export("out.cact", bits=2, tokenizer_bytes=tok) # needle_cy.archive.write_archive

Numerics.  ``model(ids)`` with the defaults is the engine's ``numerics="float"`` forward
(no activation quantizer) on the float parameters.  ``quant=True`` adds the A8
activation fake-quant and the KV quantizer of ``numerics="deploy"`` (spec §3.8-3.9);
``cq=True`` runs every CQ role through the CQ quantizer of the writer (rotation,
nearest codeword, FP16 norms, ``bits`` per role) with a straight-through gradient, so a
CQ-QAT model computes what its exported archive computes.  All quantizers pass
gradients straight through (``x + (q(x) - x).detach()``, spec §10.4).

Speed.  The three Φ products of a layer's mHC router are one matmul; q/k/v/gate are
one matmul; the Q/K/V conv taps run on the concatenated channels; the lane mixing
``X' = P·X + hpost·y`` is one batched product over all tokens; attention is
``scaled_dot_product_attention``.  Everything is written for a batch ``[B, T]`` and
runs unchanged on CUDA (``model.to("cuda")``) and under ``torch.autocast``.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..archive import HEAD_NAMES, Archive, NeedleConfig, body_layout
from ..reference import ops as ref_ops

RMS_EPS = ref_ops.RMS_EPS
HEAD_OUT = {"embedding": 128, "confidence": 1, "router": 3}
COND_RANK = 8
# roles quantized with CQ in the archive (spec §3.7); head matrices use 4 bits always
_CQ_LAYER = ("q_proj", "k_proj", "v_proj", "gate_proj", "out_proj")


# ---------------------------------------------------------------------------
# numerics
# ---------------------------------------------------------------------------
def rms_unit(x):
    """``x · rsqrt(mean(x²) + 1e-6)`` over the last axis, in float32."""
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + RMS_EPS)


def zc_norm(x, scale):
    """Zero-centred RMSNorm ``(1 + s) ⊙ RMSunit(x)``, computed in float32, returned in x's dtype."""
    return (rms_unit(x) * (1.0 + scale.float())).to(x.dtype)


def _ste(x, q):
    return x + (q - x).detach()


def a8(x, bits=8):
    """Per-vector symmetric int8 fake-quant over the last axis (spec §3.8), straight-through."""
    xf = x.float()
    qmax = float(2 ** (bits - 1) - 1)
    amax = xf.detach().abs().amax(-1, keepdim=True)
    scale = torch.where(amax > 0, amax / qmax, torch.ones_like(amax))
    q = torch.clamp(torch.round(xf.detach() / scale), -qmax - 1, qmax) * scale
    return _ste(xf, q).to(x.dtype)


_HADAMARD = {}


def hadamard(g, device):
    key = (g, str(device))
    if key not in _HADAMARD:
        _HADAMARD[key] = torch.from_numpy(ref_ops.hadamard(g)).to(device)
    return _HADAMARD[key]


def _nearest(u, cb):
    """Nearest codeword index, ties to the lower one (spec §3.3 step 5)."""
    pos = torch.bucketize(u, cb, right=False)            # left bisection
    right = pos.clamp(1, cb.numel() - 1)
    left = right - 1
    pick_left = (u - cb[left]).abs() <= (u - cb[right]).abs()
    return torch.where(pick_left, left, right)


def cq_fake_quant(w, codebook, group):
    """CQ quantize-dequantize of ``w`` ``[out, in]`` along ``in`` (spec §3.3, §3.5), STE gradient.

    Pad to a multiple of ``group``, rotate with H_g, ν = ||r||, nearest codeword of
    ``u = r / max(ν, 1e-12)``, ν rounded to FP16, rotate back, crop.  ``codebook`` is a
    float32 tensor (ascending) of the width's codewords for this group size.
    """
    rows, cols = w.shape
    ng = -(-cols // group)
    wd = w.detach().float()
    if ng * group != cols:
        wd = F.pad(wd, (0, ng * group - cols))
    h = hadamard(group, w.device)
    r = wd.reshape(rows, ng, group) @ h
    nu = r.norm(dim=-1, keepdim=True)
    u = r / nu.clamp_min(ref_ops.CQ_NORM_FLOOR)
    q = codebook[_nearest(u, codebook)]
    nu16 = nu.half().float()
    deq = ((nu16 * q) @ h).reshape(rows, ng * group)[:, :cols]
    return _ste(w, deq.to(w.dtype))


def kv_fake_quant(x, kv_bits):
    """KV-cache quantizer of deploy numerics (spec §3.9): A8 per head at 8 bits, else CQ group 64."""
    if kv_bits >= 8:
        return a8(x)
    g = ref_ops.KV_CQ_GROUP
    dh = x.shape[-1]
    ng = -(-dh // g)
    xf = x.detach().float()
    if ng * g != dh:
        xf = F.pad(xf, (0, ng * g - dh))
    h = hadamard(g, x.device)
    r = xf.reshape(*xf.shape[:-1], ng, g) @ h
    nu = r.norm(dim=-1, keepdim=True)
    u = r / nu.clamp_min(ref_ops.CQ_NORM_FLOOR)
    cb = torch.from_numpy(ref_ops.kv_codebook(kv_bits, g)).to(x.device)
    q = cb[_nearest(u, cb)]
    deq = ((nu.half().float() * q) @ h).reshape(*xf.shape[:-1], ng * g)[..., :dh]
    return _ste(x.float(), deq).to(x.dtype)


def sinkhorn(z, iters=ref_ops.SINKHORN_ITERS):
    """Log-domain Sinkhorn on ``[..., n, n]`` (rows then columns, ``iters`` times), float32."""
    m = z.float()
    for _ in range(iters):
        m = m - _lse(m, -1)
        m = m - _lse(m, -2)
    return m.exp()


def _lse(m, dim):
    """``max + log Σ exp(m − max)`` (finite inputs; fewer kernels than torch.logsumexp)."""
    mx = m.detach().amax(dim, keepdim=True)
    return mx + (m - mx).exp().sum(dim, keepdim=True).log()


def rope_tables(T, dh, theta, device, offset=0):
    """cos/sin ``[T, dh/2]`` of rotate-half RoPE at positions offset..offset+T-1 (float32)."""
    freqs = torch.from_numpy(ref_ops.rope_frequencies(dh, theta)).to(device)
    pos = torch.arange(offset, offset + T, device=device, dtype=torch.float32)
    ang = pos[:, None] * freqs[None, :]
    return ang.cos(), ang.sin()


def apply_rope(x, cos, sin):
    """``x`` ``[B, T, heads, dh]``; rotate-half layout (spec §4.7 step 5), float32 tables."""
    half = x.shape[-1] // 2
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)


def causal_taps(x, taps, dilation=1, band=None):
    """Causal depthwise conv over time: ``y[t] = Σ_j taps[j] ⊙ x[t − j·dil]`` (zero before the start).

    ``x`` ``[B, T, C]``, ``taps`` ``[n_taps, C]``.  A tap whose offset is outside a local
    layer's ``band`` is not visible (spec §4.7 step 2).
    """
    T = x.shape[1]
    taps = taps.to(x.dtype)
    y = x * taps[0]
    for j in range(1, taps.shape[0]):
        off = j * dilation
        if off >= T or (band is not None and off >= band):
            continue
        y = y + F.pad(x[:, :T - off], (0, 0, off, 0)) * taps[j]
    return y


def engram_slots(ids, orders, heads, seed_stride, slots):
    """Slot of every (position, table) for the n-grams ending at each position (spec §4.4).

    ``ids`` int64 ``[B, T]`` → int64 ``[B, T, len(orders)·heads]`` (uint32 arithmetic
    emulated in int64; positions before the start read token 0).
    """
    mask32 = 0xFFFFFFFF
    tok = ids.long() & mask32
    stride = seed_stride or heads
    out = []
    for oi, o in enumerate(orders):
        for h in range(heads):
            acc = torch.full_like(tok, (ref_ops.ENGRAM_SEED * (oi * stride + h + 1)) & mask32)
            for j in range(o):
                prev = F.pad(tok[:, :tok.shape[1] - j], (j, 0)) if j else tok
                acc = ((acc ^ prev) * ref_ops.ENGRAM_PRIME) & mask32
            acc = acc ^ (acc >> ref_ops.ENGRAM_SHIFT)
            out.append(acc % slots)
    return torch.stack(out, dim=-1)


BAND_CHUNK = 128


def _banded_attention(q, k, v, mask, band, scale):
    """Sliding-window attention ``[B, H, T, dv]`` in query chunks of ``BAND_CHUNK``, each
    against the ``band - 1`` keys before it and its own: the same sums as one call with the
    whole ``[T, T]`` mask, whose fused kernel computes every masked block anyway
    (benchmarks/history/train_step.md)."""
    T = q.shape[2]
    outs = []
    for c0 in range(0, T, BAND_CHUNK):
        c1 = min(T, c0 + BAND_CHUNK)
        k0 = max(0, c0 - band + 1)
        outs.append(F.scaled_dot_product_attention(q[:, :, c0:c1], k[:, :, k0:c1], v[:, :, k0:c1],
                                                   attn_mask=mask[c0:c1, k0:c1], scale=scale))
    return torch.cat(outs, dim=2)


# ---------------------------------------------------------------------------
# modules (parameter names = archive role names)
# ---------------------------------------------------------------------------
def _p(*shape):
    return nn.Parameter(torch.zeros(*shape))


class Layer(nn.Module):
    def __init__(self, cfg: NeedleConfig):
        super().__init__()
        d, H, K, dq, dv, C, N = (cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.qk_head_dim,
                                 cfg.v_head_dim, cfg.qkv_conv_taps, cfg.hada_n)
        ba, bb = cfg.monarch_sizes
        self.norm_in = _p(d)
        self.q_proj, self.k_proj, self.v_proj = _p(H * dq, d), _p(K * dq, d), _p(K * dv, d)
        if C > 0:
            self.q_taps, self.k_taps, self.v_taps = _p(C, H * dq), _p(C, K * dq), _p(C, K * dv)
        self.q_norm, self.k_norm = _p(dq), _p(dq)
        self.gate_proj, self.out_proj = _p(H * dv, d), _p(d, H * dv)
        self.post_norm, self.attn_gate, self.pre_hada = _p(d), _p(1), _p(d)
        for name in ("d1", "d2", "b2", "d3", "d4"):
            setattr(self, name, _p(N))
        for s in (1, 2, 3):
            setattr(self, f"w{s}a", _p(ba, ba))
            setattr(self, f"w{s}b", _p(bb, bb))
        self.cond_v, self.cond_u = _p(d, COND_RANK), _p(COND_RANK, N)


class EngramSite(nn.Module):
    def __init__(self, cfg: NeedleConfig):
        super().__init__()
        NT, sub, d = cfg.num_engram_tables, cfg.engram_sub_dim, cfg.d_model
        self.tables = _p(NT * cfg.engram_slots, sub)
        self.key_proj, self.value_proj = _p(d, NT * sub), _p(d, NT * sub)
        self.taps = _p(cfg.engram_conv_taps, d)


class ProbeHead(nn.Module):
    def __init__(self, cfg: NeedleConfig, name, k, q, out):
        super().__init__()
        R, d = cfg.probe_rows, cfg.d_model
        self.name, self.k, self.q = name, k, q
        self.probes, self.gain, self.query = _p(R, k, d), _p(R, k), _p(q, d)
        self.row_bias, self.proj, self.bias = _p(q, R, k), _p(out, q * d), _p(out)
        if name == "router":
            self.register_buffer("calibration", torch.tensor([0.90, 0.00, 0.60]))


class NeedleTorch(nn.Module):
    """Needle 3 in PyTorch; see the module docstring.

    ``cfg``: a :class:`needle_cy.archive.NeedleConfig`.  ``heads``: dict name → (k, q)
    probes per row and queries (``out`` follows from the name), or None.
    ``bits``: CQ width for QAT and export (int or dict role → bits with "default").
    ``group_size``: the CQ group of QAT and export (128 in every archive).
    """

    def __init__(self, cfg: NeedleConfig, heads=None, bits=4, group_size=128):
        super().__init__()
        self.cfg = cfg
        self.bits = bits
        self.group_size = group_size
        d, L, n = cfg.d_model, cfg.num_layers, cfg.mhc_lanes
        self.embedding = _p(cfg.vocab, d)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(L))
        self.mhc_a_pre, self.mhc_a_post, self.mhc_a_res = _p(L), _p(L), _p(L)
        self.mhc_b_pre, self.mhc_b_post, self.mhc_b_res = _p(L, n), _p(L, n), _p(L, n, n)
        self.mhc_phi_pre, self.mhc_phi_post = _p(L * n, n * d), _p(L * n, n * d)
        self.mhc_phi_res = _p(L * n * n, n * d)
        self.register_buffer("hada_p1", torch.from_numpy(
            np.random.RandomState(11).permutation(cfg.hada_n)).long())
        self.register_buffer("hada_p2", torch.from_numpy(
            np.random.RandomState(13).permutation(cfg.hada_n)).long())
        self.engram = nn.ModuleList(EngramSite(cfg) for _ in cfg.engram_sites)
        self.final_norm = _p(d)
        heads = dict(heads or {})
        for name in heads:
            if name not in HEAD_NAMES:
                raise ValueError(f"unknown probe head {name!r}; expected some of {HEAD_NAMES}")
        self.heads = nn.ModuleDict({name: ProbeHead(cfg, name, k, q, HEAD_OUT[name])
                                    for name, (k, q) in ((h, heads[h]) for h in HEAD_NAMES if h in heads)})
        self._codebooks = {}
        from ..archive import DTYPE_CQ, DTYPE_FP16
        kinds = {slot.role: slot.dtype for slot in body_layout(cfg)}
        for name in self.heads:
            for part in ("probes", "query", "proj"):
                kinds[f"heads.{name}.{part}"] = DTYPE_CQ
        self._cq_roles = {r for r, k in kinds.items() if k == DTYPE_CQ}
        self._fp16_roles = {r for r, k in kinds.items() if k == DTYPE_FP16} | {
            f"heads.{name}.{part}" for name in self.heads for part in ("gain", "row_bias", "bias")}
        self.reset_parameters()

    # ------------------------------------------------------------ parameters
    @torch.no_grad()
    def reset_parameters(self, seed=None):
        """A fresh initialisation with the official recipe's scales (spec facts, not its code):
        matrices N(0, 0.02) (out_proj, value_proj N(0, 0.02/sqrt(2L))), ZC norm scales 0,
        taps identity, Monarch factors the normalised Walsh matrices, d1 = d2 = d3 = 1,
        b2 = 0, d4 = 0.02, cond_u = 0, mHC a = 0.01, b_pre = b_post = 0, b_res = 4·I,
        attention gate logit 0, head gains 1."""
        gen = torch.Generator().manual_seed(0 if seed is None else int(seed))
        cfg = self.cfg
        std_res = 0.02 / math.sqrt(2 * cfg.num_layers)

        def normal(p, std):
            p.copy_(torch.randn(p.shape, generator=gen) * std)

        for name, p in self.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if leaf in ("out_proj", "value_proj"):
                normal(p, std_res)
            elif leaf in ("embedding", "tables", "q_proj", "k_proj", "v_proj", "gate_proj", "key_proj",
                          "cond_v", "mhc_phi_pre", "mhc_phi_post", "mhc_phi_res", "probes", "query", "proj"):
                normal(p, 0.02)
            elif leaf.endswith("taps"):
                p.zero_()
                p[0] = 1.0
            elif leaf[0] == "w" and leaf[-1] in "ab" and len(leaf) == 3:
                p.copy_(torch.from_numpy(ref_ops.hadamard(p.shape[0])))
            elif leaf in ("d1", "d2", "d3", "gain"):
                p.fill_(1.0)
            elif leaf == "d4":
                p.fill_(0.02)
            elif leaf.startswith("mhc_a_"):
                p.fill_(0.01)
            elif leaf == "mhc_b_res":
                p.copy_(4.0 * torch.eye(cfg.mhc_lanes).expand_as(p))
            else:
                p.zero_()

    def roles(self):
        """The archive roles this model holds, in file order (heads after final_norm)."""
        out = [s.role for s in body_layout(self.cfg)]
        for name, head in self.heads.items():
            out += [f"heads.{name}.{part}" for part in ("probes", "gain", "query", "row_bias", "proj", "bias")]
            if name == "router":
                out.append(f"heads.{name}.calibration")
        return out

    def archive_tensors(self):
        """role → float32 NumPy array: exactly what ``needle_cy.archive.write_archive`` takes."""
        state = self.state_dict()
        out = {}
        for role in self.roles():
            out[role] = state[role].detach().float().cpu().numpy().copy()
        return out

    @torch.no_grad()
    def load_archive_tensors(self, tensors):
        """Set every parameter from role → float array (e.g. an archive's dequantized tensors)."""
        state = self.state_dict()
        missing = [r for r in self.roles() if r not in tensors]
        if missing:
            raise KeyError(f"load_archive_tensors: missing roles {missing[:5]}")
        for role in self.roles():
            target = state[role]
            value = torch.as_tensor(np.asarray(tensors[role], np.float32))
            if role in ("hada_p1", "hada_p2"):
                value = value.round().long()
            target.copy_(value.reshape(target.shape))
        return self

    @classmethod
    def from_archive(cls, path_or_archive, bits=None, group_size=None):
        """(model, tokenizer bytes or None) from a ``.cact``: every tensor dequantized to float32.

        The model's QAT/export widths default to the archive's (the width of its
        embedding record, per-role widths kept when they differ) and its group size.
        """
        arch = path_or_archive if isinstance(path_or_archive, Archive) else Archive.open(path_or_archive)
        try:
            heads = {name: (info.probes, info.queries) for name, info in arch.head_info.items()}
            recs = {r.role: r for r in arch.records}
            cq = {role: r for role, r in recs.items() if r.dtype_name == "CQ" and not role.startswith("heads.")}
            if bits is None:
                widths = {role: r.bits for role, r in cq.items()}
                default = widths.get("embedding", 4)
                bits = default if len(set(widths.values())) <= 1 else dict(widths, default=default)
            if group_size is None:
                group_size = recs["embedding"].group_size
            model = cls(arch.config, heads=heads, bits=bits, group_size=group_size)
            tensors = {role: arch.dequantize(role) for role in model.roles()}
            model.load_archive_tensors(tensors)
            model.remember_records(arch)
            return model, arch.tokenizer_bytes
        finally:
            if not isinstance(path_or_archive, Archive):
                arch.close()

    def remember_records(self, path_or_archive):
        """Remember an archive's encoded CQ records, so that :meth:`export` writes a tensor
        still equal to its decoded value as that very record (decoding then re-encoding CQ
        is not the identity, spec §5.2).  :meth:`from_archive` does this itself."""
        import dataclasses

        arch = path_or_archive if isinstance(path_or_archive, Archive) else Archive.open(path_or_archive)
        try:
            roles = set(self.roles())
            self._source_cq = {}
            for rec in arch.records:
                if rec.role in roles and rec.dtype_name == "CQ":
                    cqm = arch.tensor(rec.index)      # copied out of the mapping: the file may be overwritten
                    cqm = dataclasses.replace(cqm, packed=cqm.packed.copy(), norms=cqm.norms.copy())
                    self._source_cq[rec.role] = (cqm, arch.dequantize(rec.index))
        finally:
            if not isinstance(path_or_archive, Archive):
                arch.close()
        return self

    def export(self, path, bits=None, tokenizer_bytes=None, keep_unchanged=True):
        """Write the model as a ``.cact`` with ``needle_cy.archive.write_archive``.

        ``bits``: CQ width (int or dict role → bits with "default"; default ``self.bits``).
        For a model made by :meth:`from_archive`, a CQ tensor still equal to the value it
        was loaded with is written as its original record (``keep_unchanged``), since
        re-encoding decoded CQ values moves them.
        """
        from ..archive import write_archive

        tensors = self.archive_tensors()
        if keep_unchanged:
            for role, (record, loaded) in getattr(self, "_source_cq", {}).items():
                if np.array_equal(tensors[role].reshape(loaded.shape), loaded):
                    tensors[role] = record
        return write_archive(path, self.cfg, tensors, bits=self.bits if bits is None else bits,
                             group_size=self.group_size, tokenizer_bytes=tokenizer_bytes)

    def decay_mask(self):
        """name → whether AdamW decays it: parameters of 2 or more dimensions (as the official recipe)."""
        return {name: p.ndim >= 2 for name, p in self.named_parameters()}

    # ------------------------------------------------------------- CQ / QAT
    def _codebook(self, bits, device):
        key = (bits, self.group_size, str(device))
        if key not in self._codebooks:
            from ..cq_format import codebook
            self._codebooks[key] = torch.from_numpy(np.asarray(codebook(bits, self.group_size), np.float32)).to(device)
        return self._codebooks[key]

    def _bits_of(self, role):
        if role.startswith("heads."):
            return 4
        if isinstance(self.bits, dict):
            return int(self.bits.get(role, self.bits.get("default", 4)))
        return int(self.bits)

    def weights(self, cq=False):
        """role → the tensor the forward uses.  Plain parameters, or under ``cq`` (QAT) what
        the archive will hold: CQ roles through :func:`cq_fake_quant` at their width, FP16
        roles rounded to float16, both with straight-through gradients."""
        out = dict(self.named_parameters())
        out.update(self.named_buffers())
        if not cq:
            return out
        for role in self._cq_roles:
            p = out[role]
            w2 = p.reshape(-1, p.shape[-1])
            out[role] = cq_fake_quant(w2, self._codebook(self._bits_of(role), p.device),
                                      self.group_size).reshape(p.shape)
        for role in self._fp16_roles:
            p = out[role]
            out[role] = _ste(p, p.detach().half().to(p.dtype))
        return out

    # --------------------------------------------------------------- forward
    def forward(self, ids, quant=False, cq=False, cells=False, positions=None):
        """Logits ``[B, T, out_rows]`` of token ids ``[B, T]`` (causal, positions 0..T-1).

        ``quant``: A8 activations + KV quantizer (deploy numerics).  ``cq``: the archive's
        weight numerics (CQ fake-quant, FP16 rounding; QAT).  ``cells=True`` returns
        ``(logits, cells [B, T, L+1, d])``.  ``positions`` (bool ``[B, T]``) computes the
        head only there and returns ``[N, out_rows]`` in row-major order of the mask: the
        head is a third of a small model's arithmetic, and a loss that reads a sample of
        the prompt positions need not pay for the others.
        """
        logits, c = self._run(ids, quant, self.weights(cq), want_cells=cells, positions=positions)
        return (logits, c) if cells else logits

    def _run(self, ids, quant, w, want_cells=False, want_logits=True, positions=None):
        cfg = self.cfg
        if ids.dim() == 1:
            ids = ids[None]
        B, T = ids.shape
        d, n = cfg.d_model, cfg.mhc_lanes
        dev = ids.device
        E = w["embedding"]
        x0 = F.embedding(ids, E) * math.sqrt(d)                       # float32
        engram = self._engram(ids, quant, w) if cfg.engram_sites else {}
        cos, sin = rope_tables(T, cfg.qk_head_dim, cfg.rope_theta, dev)
        masks = {}
        X = x0[:, :, None, :].expand(B, T, n, d)
        cells = [x0] if want_cells else None
        own = torch.arange(n, device=dev)
        for l in range(cfg.num_layers):
            lane = l % n
            pre_off = torch.where(own == lane, ref_ops.MHC_PRE_OWN, ref_ops.MHC_PRE_OTHER).to(dev)
            post_off = torch.where(own == lane, ref_ops.MHC_POST_OWN, ref_ops.MHC_POST_OTHER).to(dev)
            # mHC router: one product for the pre, post and res rows of this layer
            nx = rms_unit(X.reshape(B, T, n * d))
            if quant:
                nx = a8(nx)
            phi = torch.cat([w["mhc_phi_pre"][l * n:(l + 1) * n], w["mhc_phi_post"][l * n:(l + 1) * n],
                             w["mhc_phi_res"][l * n * n:(l + 1) * n * n]], dim=0)
            h = (nx @ phi.t()).float()                                # [B, T, 2n + n²]
            hpre = torch.sigmoid(w["mhc_a_pre"][l] * h[..., :n] + w["mhc_b_pre"][l] + pre_off)
            hpost = 2.0 * torch.sigmoid(w["mhc_a_post"][l] * h[..., n:2 * n] + w["mhc_b_post"][l] + post_off)
            Z = w["mhc_a_res"][l] * h[..., 2 * n:].reshape(B, T, n, n) + w["mhc_b_res"][l]
            P = sinkhorn(Z)
            Xf = X.float()
            u = torch.einsum("btm,btmd->btd", hpre, Xf)
            y = self._block(l, u, engram, masks, cos, sin, quant, w) - u
            X = torch.matmul(P, Xf) + hpost[..., None] * y[:, :, None, :]
            if cells is not None:
                cells.append(X.mean(dim=-2))
        logits = None
        if want_logits:
            hfin = zc_norm(X.mean(dim=-2), w["final_norm"])
            if positions is not None:
                hfin = hfin[positions]
            if quant:
                hfin = a8(hfin)
            logits = hfin @ E[:cfg.out_rows].t()
        cell_t = torch.stack(cells, dim=2) if cells is not None else None
        return logits, cell_t

    def _engram(self, ids, quant, w):
        cfg = self.cfg
        B, T = ids.shape
        NT, slots = cfg.num_engram_tables, cfg.engram_slots
        slot = engram_slots(ids, cfg.engram_orders, cfg.engram_heads, cfg.engram_seed_heads, slots)
        rows = slot + torch.arange(NT, device=ids.device) * slots      # [B, T, NT]
        orders = torch.as_tensor(np.repeat(np.asarray(cfg.engram_orders), cfg.engram_heads), device=ids.device)
        ok = (torch.arange(T, device=ids.device)[:, None] >= (orders[None, :] - 1)).float()   # [T, NT]
        out = {}
        for s, layer in enumerate(cfg.engram_sites):
            e = (F.embedding(rows, w[f"engram.{s}.tables"]) * ok[None, :, :, None]).reshape(B, T, -1)
            if quant:
                e = a8(e)
            key = e @ w[f"engram.{s}.key_proj"].t()
            v_raw = e @ w[f"engram.{s}.value_proj"].t()
            out[layer] = (key, causal_taps(v_raw, w[f"engram.{s}.taps"], cfg.engram_conv_dilation))
        return out

    def _block(self, l, u, engram, masks, cos, sin, quant, w):
        cfg = self.cfg
        pre = f"layers.{l}."
        x = u
        if l in engram:
            key, value = engram[l]
            alpha = torch.sigmoid((rms_unit(u) * rms_unit(key)).sum(-1, keepdim=True) / math.sqrt(cfg.d_model))
            x = u + alpha * value.float()
        a = zc_norm(x, w[pre + "norm_in"])
        a = self._attention(l, a, masks, cos, sin, quant, w)
        a = zc_norm(a, w[pre + "post_norm"])
        x = x + torch.sigmoid(w[pre + "attn_gate"].float()) * a.float()
        m = zc_norm(x, w[pre + "pre_hada"])
        return x + self._mlp(l, m, w).float()

    def _band(self, l):
        cfg = self.cfg
        return None if cfg.is_global(l) else cfg.sliding_window

    def _mask(self, l, T, device, masks):
        band = self._band(l)
        if band is None or band >= T:
            return None
        if band not in masks:
            # an additive float mask: PyTorch's CPU attention with a boolean mask measured
            # several times slower than with the same mask as 0 / -inf
            t = torch.arange(T, device=device)
            diff = t[:, None] - t[None, :]
            keep = (diff >= 0) & (diff < band)
            masks[band] = torch.zeros(T, T, device=device).masked_fill(~keep, float("-inf"))
        return masks[band]

    def _attention(self, l, a, masks, cos, sin, quant, w):
        cfg = self.cfg
        pre = f"layers.{l}."
        B, T, _ = a.shape
        H, K, dq, dv = cfg.num_heads, cfg.num_kv_heads, cfg.qk_head_dim, cfg.v_head_dim
        if quant:
            a = a8(a)
        W = torch.cat([w[pre + r] for r in ("q_proj", "k_proj", "v_proj", "gate_proj")], dim=0)
        qkvg = a @ W.t()                                              # q, k, v and gate in one product
        nq, nk, nv = H * dq, K * dq, K * dv
        qkv, g = qkvg[..., :nq + nk + nv], qkvg[..., nq + nk + nv:]
        if cfg.qkv_conv_taps > 0:
            taps = torch.cat([w[pre + "q_taps"], w[pre + "k_taps"], w[pre + "v_taps"]], dim=1)
            qkv = causal_taps(qkv, taps, 1, self._band(l))
        q = qkv[..., :nq].reshape(B, T, H, dq)
        k = qkv[..., nq:nq + nk].reshape(B, T, K, dq)
        v = qkv[..., nq + nk:].reshape(B, T, K, dv)
        q = apply_rope(zc_norm(q, w[pre + "q_norm"]), cos, sin)
        k = apply_rope(zc_norm(k, w[pre + "k_norm"]), cos, sin)
        if quant:
            q = a8(q)
            k = kv_fake_quant(k, cfg.kv_bits)
            v = kv_fake_quant(v, cfg.kv_bits)
        mask = self._mask(l, T, a.device, masks)
        dt = qkvg.dtype
        q, k, v = q.transpose(1, 2).to(dt), k.transpose(1, 2).to(dt), v.transpose(1, 2).to(dt)
        if K != H:
            k = k.repeat_interleave(H // K, dim=1)
            v = v.repeat_interleave(H // K, dim=1)
        # zero-padding q and k to v's width leaves every score as it was and lets PyTorch
        # use its fused (flash) kernel, which needs equal head widths
        pad = dv - dq if dv > dq else 0
        qp, kp = (F.pad(q, (0, pad)), F.pad(k, (0, pad))) if pad else (q, k)
        if mask is None:
            o = F.scaled_dot_product_attention(qp, kp, v, is_causal=True, scale=dq ** -0.5)
        else:
            o = _banded_attention(qp, kp, v, mask.to(q.dtype), self._band(l), dq ** -0.5)
        o = o.transpose(1, 2).reshape(B, T, H * dv)
        o = o * torch.sigmoid(g)
        if quant:
            o = a8(o)
        return o @ w[pre + "out_proj"].t()

    def _mlp(self, l, m, w):
        cfg = self.cfg
        pre = f"layers.{l}."
        d, N = cfg.d_model, cfg.hada_n
        ba, bb = cfg.monarch_sizes
        lead = m.shape[:-1]

        rows = int(np.prod(lead))

        def kron(z, s):
            # flatten(Aᵀ·Z·B) as two large products: (Z·B) over all rows, then (Z·B)ᵀ·A
            Y = (z.reshape(rows * ba, bb) @ w[f"{pre}w{s}b"]).reshape(rows, ba, bb)
            Y = Y.transpose(1, 2).reshape(rows * bb, ba) @ w[f"{pre}w{s}a"]
            return Y.reshape(rows, bb, ba).transpose(1, 2).reshape(*lead, N)

        c = 1.0 + torch.softmax(m @ w[pre + "cond_v"], dim=-1) @ w[pre + "cond_u"]
        z = F.pad(m, (0, N - d)) if N > d else m
        z = kron(w[pre + "d1"] * z, 1)[..., w["hada_p1"]]
        z = kron(F.silu(w[pre + "d2"] * c * z + w[pre + "b2"]), 2)[..., w["hada_p2"]]
        z = kron(w[pre + "d3"] * z, 3)
        return (w[pre + "d4"] * z)[..., :d]

    # ----------------------------------------------------------------- heads
    def head_outputs(self, ids, quant=False, cq=False, keep=None):
        """Probe-head outputs for whole sequences ``[B, T]`` (spec §5.2-5.3).

        ``keep`` ``[B, T]`` bool (default ``ids != 0``: PAD left out of the pooling).
        Returns name → ``[B, out]`` (embedding unit-normalised, confidence/router raw).
        """
        if ids.dim() == 1:
            ids = ids[None]
        w = self.weights(cq)
        _, cells = self._run(ids, quant, w, want_cells=True, want_logits=False)
        keep = (ids != 0) if keep is None else keep
        return {name: self._head(name, head.k, head.q, cells.float(), keep, w)
                for name, head in self.heads.items()}

    def _head(self, name, k, q, cells, keep, w):
        B, T, R, d = cells.shape
        pre = f"heads.{name}."
        P, Q, W = w[pre + "probes"], w[pre + "query"], w[pre + "proj"]     # [R, k, d], [q, d], [out, q·d]
        score = torch.einsum("btrd,rjd->brjt", cells, P) / math.sqrt(d)
        score = score.masked_fill(~keep[:, None, None, :], float("-inf"))
        pi = torch.softmax(score, dim=-1)
        pooled = torch.einsum("brjt,btrd->brjd", pi, cells)
        rho = rms_unit(pooled) * w[pre + "gain"][None, :, :, None]          # [B, R, k, d]
        flat = rho.reshape(B, R * k, d)
        u = flat @ Q.t() / math.sqrt(d)                                      # [B, R·k, q]
        u = u.transpose(1, 2) + w[pre + "row_bias"].reshape(q, R * k)
        omega = torch.softmax(u, dim=-1)                                     # [B, q, R·k]
        z = (omega @ flat).reshape(B, q * d)
        out = z @ W.t() + w[pre + "bias"]
        if name == "embedding":
            out = out / torch.sqrt((out * out).sum(-1, keepdim=True) + ref_ops.L2_EPS)
        return out

    # ---------------------------------------------------------------- decode
    @torch.no_grad()
    def greedy(self, ids, max_new_tokens, stop=None, quant=False, cq=False):
        """Greedy continuation (full forward per step; for tests and checks, not speed)."""
        seq = list(int(i) for i in ids)
        out = []
        for _ in range(max_new_tokens):
            logits = self.forward(torch.tensor([seq], device=self.embedding.device), quant=quant, cq=cq)[0, -1]
            tok = int(torch.argmax(logits))
            out.append(tok)
            seq.append(tok)
            if stop is not None and tok == stop:
                break
        return out


def config_from_fields(model, vocab_size, kv_window=0):
    """A NeedleConfig from train.py's MODEL_CONFIG-style fields (run.json "model") and a vocabulary."""
    m = model
    return NeedleConfig.build(
        vocab=vocab_size, out_vocab=m.get("out_vocab", 0), d_model=m["d_model"],
        num_heads=m["num_heads"], num_kv_heads=m["num_kv_heads"], num_layers=m["num_layers"],
        qk_head_dim=m["qk_head_dim"], v_head_dim=m["v_head_dim"], max_seq_len=m["max_seq_len"],
        mhc_lanes=m["mhc_lanes"], sliding_window=m["sliding_window"],
        global_layers=tuple(m["global_layers"]), qkv_conv_taps=m["qkv_conv_taps"],
        engram_slots=m["engram_slots"], engram_orders=tuple(m["engram_orders"]),
        engram_heads=m.get("engram_heads", 0), engram_seed_heads=m.get("engram_seed_heads", 0),
        engram_sites=tuple(m["engram_layers"]), rope_theta=m["rope_theta"],
        kv_window=kv_window, kv_bits=m.get("kv_bits", 8))
