"""DFlash block-diffusion draft in plain PyTorch, and a minimal GGUF reader to load the bundled target.

The draft (docs/dflash.md; ../shared/reference/dflash-ddtree.md §1): target-width Qwen3 layers whose
keys/values are [context rows ; block rows]. Context rows are C = hidden_norm(fc · concat(target
features)), put through each layer's own W_k / k_norm / W_v (never through attn_norm, W_q, W_o or the
FFN). The block is [anchor token, MASK × (B-1)] embedded with the target's frozen table; attention is
non-causal inside the block; RoPE positions are absolute (context 0..p0-1, block p0..p0+B-1). Logits
come from the target's (tied) head applied to final_norm(block hidden). Slot k predicts the token at
p0+k (no shift); slot 0 is discarded.
"""
import struct
from dataclasses import dataclass, asdict, field
from typing import List

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import gguf_export as G
from model import Config, Qwen3, RMSNorm, apply_rope


# ---------------------------------------------------------------------------------------------------
# GGUF reading (the subset the bundled files use)

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


class GGUFFile:
    def __init__(self, path):
        self.data = open(path, "rb").read()
        self.off = 0
        magic, ver, nt, nkv = struct.unpack_from("<IIQQ", self.data, 0)
        assert magic == G.GGUF_MAGIC and ver == 3, path
        self.off = 24
        self.meta, self.meta_types = {}, {}
        for _ in range(nkv):
            k = self._str()
            t = self._u32()
            self.meta_types[k] = t if t != 9 else (9, struct.unpack_from("<I", self.data, self.off)[0])
            self.meta[k] = self._val(t)
        self.tensors = {}
        infos = []
        for _ in range(nt):
            name = self._str()
            nd = self._u32()
            shape = struct.unpack_from("<" + "q" * nd, self.data, self.off)
            self.off += 8 * nd
            gt, toff = struct.unpack_from("<IQ", self.data, self.off)
            self.off += 12
            infos.append((name, shape, gt, toff))
        align = self.meta.get("general.alignment", 32)
        base = (self.off + align - 1) // align * align
        for name, shape, gt, toff in infos:
            n = int(np.prod(shape))
            nbytes = {0: 4 * n, 1: 2 * n, 8: n // 32 * 34}[gt]
            raw = self.data[base + toff: base + toff + nbytes]
            self.tensors[name] = (gt, raw, tuple(reversed(shape)))

    def _u32(self):
        v = struct.unpack_from("<I", self.data, self.off)[0]
        self.off += 4
        return v

    def _str(self):
        n = struct.unpack_from("<Q", self.data, self.off)[0]
        s = self.data[self.off + 8: self.off + 8 + n].decode("utf-8")
        self.off += 8 + n
        return s

    def _val(self, t):
        if t == 8:
            return self._str()
        if t == 9:
            et = self._u32()
            n = struct.unpack_from("<Q", self.data, self.off)[0]
            self.off += 8
            return [self._val(et) for _ in range(n)]
        fmt = _SCALAR[t]
        v = struct.unpack_from(fmt, self.data, self.off)[0]
        self.off += struct.calcsize(fmt)
        return v

    def f32(self, name):
        gt, raw, shape = self.tensors[name]
        return G.stored_as_f32(gt, raw, shape)


def load_target(path) -> Qwen3:
    """The bundled qwen3 target in float32 with exactly the values its GGUF stores."""
    f = GGUFFile(path)
    m = f.meta
    a = m["general.architecture"]
    cfg = Config(vocab=f.tensors["token_embd.weight"][2][0], dim=m[f"{a}.embedding_length"], layers=m[f"{a}.block_count"],
                 heads=m[f"{a}.attention.head_count"], kv_heads=m[f"{a}.attention.head_count_kv"],
                 head_dim=m[f"{a}.attention.key_length"], ffn=m[f"{a}.feed_forward_length"],
                 rope_base=m[f"{a}.rope.freq_base"], eps=m[f"{a}.attention.layer_norm_rms_epsilon"],
                 ctx=m.get(f"{a}.context_length", 1024))
    model = Qwen3(cfg)
    sd = model.state_dict()
    names = {"attn_norm": "attn_norm.weight", "attn_q": "wq.weight", "attn_k": "wk.weight", "attn_v": "wv.weight",
             "attn_output": "wo.weight", "attn_q_norm": "q_norm.weight", "attn_k_norm": "k_norm.weight",
             "ffn_norm": "ffn_norm.weight", "ffn_gate": "gate.weight", "ffn_up": "up.weight", "ffn_down": "down.weight"}
    for n in f.tensors:
        if n == "token_embd.weight":
            key = "embed.weight"
        elif n == "output_norm.weight":
            key = "norm.weight"
        else:
            _, i, g, _ = n.split(".")
            key = f"blocks.{i}.{names[g]}"
        sd[key] = torch.from_numpy(f.f32(n).copy())
    model.load_state_dict(sd)
    model.eval()
    return model, cfg, f


@torch.no_grad()
def target_features(target: Qwen3, ids: torch.Tensor, layers: List[int]) -> torch.Tensor:
    """ids (B, T) -> (B, T, len(layers)·dim): the residual stream leaving each listed layer (0-based),
    concatenated in list order — what Peregrine's ForwardOptions::hidden_layers returns."""
    B, T = ids.shape
    pos = torch.arange(T, device=ids.device).unsqueeze(0).expand(B, T)
    cos, sin = target.cos[pos].unsqueeze(1), target.sin[pos].unsqueeze(1)
    x = target.embed(ids)
    out = {}
    for i, blk in enumerate(target.blocks):
        x = blk(x, cos, sin, None)
        if i in layers:
            out[i] = x
        if i >= max(layers):
            break
    return torch.cat([out[i] for i in layers], dim=-1)


# ---------------------------------------------------------------------------------------------------
# The draft

@dataclass
class DFlashConfig:
    dim: int = 320
    layers: int = 2
    heads: int = 5
    kv_heads: int = 1
    head_dim: int = 64
    ffn: int = 768
    rope_base: float = 1e6
    eps: float = 1e-6
    block: int = 16
    mask_id: int = 0
    target_layers: List[int] = field(default_factory=lambda: [1, 3, 5])  # 0-based target layers
    ctx: int = 1024

    def to_dict(self):
        return asdict(self)


class DBlock(nn.Module):
    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.c = c
        self.attn_norm = RMSNorm(c.dim, c.eps)
        self.wq = nn.Linear(c.dim, c.heads * c.head_dim, bias=False)
        self.wk = nn.Linear(c.dim, c.kv_heads * c.head_dim, bias=False)
        self.wv = nn.Linear(c.dim, c.kv_heads * c.head_dim, bias=False)
        self.wo = nn.Linear(c.heads * c.head_dim, c.dim, bias=False)
        self.q_norm = RMSNorm(c.head_dim, c.eps)
        self.k_norm = RMSNorm(c.head_dim, c.eps)
        self.ffn_norm = RMSNorm(c.dim, c.eps)
        self.gate = nn.Linear(c.dim, c.ffn, bias=False)
        self.up = nn.Linear(c.dim, c.ffn, bias=False)
        self.down = nn.Linear(c.ffn, c.dim, bias=False)

    def forward(self, x, ctx, rq, rc, mask):
        """x (B, Q, D) block rows; ctx (B, S, D) fused context; rq/rc: (cos, sin) of (B, 1, Q|S, hd/2);
        mask (B, 1, Q, S+Q) bool allowed keys."""
        c = self.c
        B, Q, _ = x.shape
        S = ctx.shape[1]
        h = self.attn_norm(x)
        q = self.q_norm(self.wq(h).view(B, Q, c.heads, c.head_dim)).transpose(1, 2)
        kb = self.k_norm(self.wk(h).view(B, Q, c.kv_heads, c.head_dim)).transpose(1, 2)
        vb = self.wv(h).view(B, Q, c.kv_heads, c.head_dim).transpose(1, 2)
        kc = self.k_norm(self.wk(ctx).view(B, S, c.kv_heads, c.head_dim)).transpose(1, 2)
        vc = self.wv(ctx).view(B, S, c.kv_heads, c.head_dim).transpose(1, 2)
        q, kb = apply_rope(q, *rq), apply_rope(kb, *rq)
        kc = apply_rope(kc, *rc)
        k = torch.cat([kc, kb], dim=2)
        v = torch.cat([vc, vb], dim=2)
        rep = c.heads // c.kv_heads
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        s = (q @ k.transpose(-1, -2)) / (c.head_dim ** 0.5)
        # Rows with no visible key (padding) get a finite floor instead of -inf, so softmax stays finite.
        s = s.masked_fill(~mask, -1e30)
        a = torch.softmax(s, -1) @ v
        x = x + self.wo(a.transpose(1, 2).reshape(B, Q, c.heads * c.head_dim))
        h = self.ffn_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class DFlashDraft(nn.Module):
    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.c = c
        nf = len(c.target_layers)
        self.fc = nn.Linear(nf * c.dim, c.dim, bias=False)
        self.hidden_norm = RMSNorm(c.dim, c.eps)
        self.blocks = nn.ModuleList(DBlock(c) for _ in range(c.layers))
        self.norm = RMSNorm(c.dim, c.eps)
        inv = c.rope_base ** (-torch.arange(0, c.head_dim, 2, dtype=torch.float64) / c.head_dim)
        ang = torch.outer(torch.arange(c.ctx + c.block, dtype=torch.float64), inv)
        self.register_buffer("cos", torch.cos(ang).float(), persistent=False)
        self.register_buffer("sin", torch.sin(ang).float(), persistent=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)

    def n_params(self):
        return sum(p.numel() for p in self.parameters())

    def forward(self, noise, qpos, feats, cpos, mask):
        """noise (B, Q, D) embedded block tokens; qpos (B, Q); feats (B, S, nf·D); cpos (B, S);
        mask (B, 1, Q, S+Q). Returns final-normed hidden (B, Q, D)."""
        ctx = self.hidden_norm(self.fc(feats))
        rq = (self.cos[qpos].unsqueeze(1), self.sin[qpos].unsqueeze(1))
        rc = (self.cos[cpos].unsqueeze(1), self.sin[cpos].unsqueeze(1))
        x = noise
        for blk in self.blocks:
            x = blk(x, ctx, rq, rc, mask)
        return self.norm(x)


def export_gguf(draft: DFlashDraft, path: str, target_file: GGUFFile, gtype: int, name: str):
    """llama.cpp's DFlash draft layout (architecture 'dflash'): fc, enc.output_norm (hidden_norm),
    output_norm, blk.N.* as qwen3; no token_embd/output (shared with the target); dflash.target_layers
    = the HF ids + 1 (llama.cpp counts the embedding output as layer 0); the target's tokenizer."""
    c = draft.c
    sd = {k: v.detach().float().cpu().numpy() for k, v in draft.state_dict().items()}
    a = "dflash"
    meta = {
        "general.architecture": a, "general.name": name, "general.file_type": {G.GGML_F16: 1, G.GGML_Q8_0: 7}[gtype],
        "general.license": "apache-2.0", "general.source": "tools/train/dflash_train.py (the bundled target's own generations)",
        f"{a}.block_count": c.layers, f"{a}.context_length": c.ctx, f"{a}.embedding_length": c.dim,
        f"{a}.feed_forward_length": c.ffn, f"{a}.attention.head_count": c.heads, f"{a}.attention.head_count_kv": c.kv_heads,
        f"{a}.attention.key_length": c.head_dim, f"{a}.attention.value_length": c.head_dim,
        f"{a}.attention.layer_norm_rms_epsilon": c.eps, f"{a}.rope.freq_base": c.rope_base,
        f"{a}.block_size": c.block, f"{a}.target_layers": [i + 1 for i in c.target_layers],
        "tokenizer.ggml.mask_token_id": c.mask_id,
    }
    for k, v in target_file.meta.items():
        if k.startswith("tokenizer.") and k != "tokenizer.chat_template":
            meta[k] = v
    tensors = [("fc.weight", sd["fc.weight"], gtype), ("enc.output_norm.weight", sd["hidden_norm.weight"], G.GGML_F32),
               ("output_norm.weight", sd["norm.weight"], G.GGML_F32)]
    names = {"attn_norm.weight": "attn_norm", "wq.weight": "attn_q", "wk.weight": "attn_k", "wv.weight": "attn_v",
             "wo.weight": "attn_output", "q_norm.weight": "attn_q_norm", "k_norm.weight": "attn_k_norm",
             "ffn_norm.weight": "ffn_norm", "gate.weight": "ffn_gate", "up.weight": "ffn_up", "down.weight": "ffn_down"}
    for i in range(c.layers):
        for k, g in names.items():
            arr = sd[f"blocks.{i}.{k}"]
            tensors.append((f"blk.{i}.{g}.weight", arr, gtype if arr.ndim == 2 else G.GGML_F32))
    return G.write_gguf(path, meta, tensors)


def load_stored(c: DFlashConfig, stored) -> DFlashDraft:
    """A float32 draft holding exactly the values the GGUF stores (for reference logits)."""
    d = DFlashDraft(c)
    sd = d.state_dict()
    inv = {"fc.weight": "fc.weight", "enc.output_norm.weight": "hidden_norm.weight", "output_norm.weight": "norm.weight"}
    names = {"attn_norm": "attn_norm.weight", "attn_q": "wq.weight", "attn_k": "wk.weight", "attn_v": "wv.weight",
             "attn_output": "wo.weight", "attn_q_norm": "q_norm.weight", "attn_k_norm": "k_norm.weight",
             "ffn_norm": "ffn_norm.weight", "ffn_gate": "gate.weight", "ffn_up": "up.weight", "ffn_down": "down.weight"}
    for n, (gt, raw, shape) in stored.items():
        if n in inv:
            key = inv[n]
        else:
            _, i, g, _ = n.split(".")
            key = f"blocks.{i}.{names[g]}"
        sd[key] = torch.from_numpy(G.stored_as_f32(gt, raw, shape).copy())
    d.load_state_dict(sd)
    d.eval()
    return d


@torch.no_grad()
def reference_block_logits(target: Qwen3, draft: DFlashDraft, ids: List[int], p0: int) -> np.ndarray:
    """Draft logits (B-1, vocab) for the block anchored at p0 (ids[p0] is the anchor), context =
    the target's features of ids[0:p0]."""
    c = draft.c
    feats = target_features(target, torch.tensor([ids[:p0]]), c.target_layers)
    blk = [ids[p0]] + [c.mask_id] * (c.block - 1)
    noise = target.embed(torch.tensor([blk]))
    qpos = torch.arange(p0, p0 + c.block).unsqueeze(0)
    cpos = torch.arange(p0).unsqueeze(0)
    mask = torch.ones(1, 1, c.block, p0 + c.block, dtype=torch.bool)
    h = draft(noise, qpos, feats, cpos, mask)
    return F.linear(h, target.embed.weight)[0, 1:].float().numpy()
