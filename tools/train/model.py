"""A Qwen3-architecture decoder in plain PyTorch: RMSNorm pre-norm blocks, GQA attention with
per-head q/k RMSNorm and NEOX rotary embeddings, SwiGLU feed-forward, tied embeddings. The math is
exactly what llama.cpp's (and Peregrine's) `qwen3` forward computes, so the exported GGUF runs there.
"""
from dataclasses import dataclass, asdict

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    vocab: int = 4096
    dim: int = 320
    layers: int = 7
    heads: int = 5
    kv_heads: int = 1
    head_dim: int = 64
    ffn: int = 768
    rope_base: float = 1e6
    eps: float = 1e-6
    ctx: int = 1024

    def to_dict(self):
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight.to(x.dtype)


def rope_tables(cfg: Config, device):
    inv = cfg.rope_base ** (-torch.arange(0, cfg.head_dim, 2, device=device, dtype=torch.float64) / cfg.head_dim)
    t = torch.arange(cfg.ctx, device=device, dtype=torch.float64)
    ang = torch.outer(t, inv)  # (ctx, head_dim/2)
    return torch.cos(ang).float(), torch.sin(ang).float()


def apply_rope(x, cos, sin):
    # x: (B, H, T, D); cos/sin: (B, 1, T, D/2). NEOX pairs (x[i], x[i + D/2]).
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d].float(), x[..., d:].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def attention(q, k, v, mask):
    """softmax(q·kᵀ/sqrt(d) + mask)·v; mask None = causal, else boolean (B, 1, Tq, Tk) of allowed keys."""
    if hasattr(F, "scaled_dot_product_attention"):
        if mask is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    # PyTorch < 2 (only used for local smoke tests on the CPU).
    s = (q.float() @ k.float().transpose(-1, -2)) / (q.shape[-1] ** 0.5)
    if mask is None:
        tq, tk = s.shape[-2], s.shape[-1]
        mask = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril(tk - tq)
    s = s.masked_fill(~mask, float("-inf"))
    return (torch.softmax(s, -1) @ v.float()).to(q.dtype)


class Block(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.attn_norm = RMSNorm(cfg.dim, cfg.eps)
        self.wq = nn.Linear(cfg.dim, cfg.heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.heads * cfg.head_dim, cfg.dim, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.eps)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.eps)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.eps)
        self.gate = nn.Linear(cfg.dim, cfg.ffn, bias=False)
        self.up = nn.Linear(cfg.dim, cfg.ffn, bias=False)
        self.down = nn.Linear(cfg.ffn, cfg.dim, bias=False)

    def forward(self, x, cos, sin, mask=None, cache=None):
        c = self.cfg
        B, T, _ = x.shape
        h = self.attn_norm(x)
        q = self.q_norm(self.wq(h).view(B, T, c.heads, c.head_dim)).transpose(1, 2)
        k = self.k_norm(self.wk(h).view(B, T, c.kv_heads, c.head_dim)).transpose(1, 2)
        v = self.wv(h).view(B, T, c.kv_heads, c.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            if "k" in cache:
                k = torch.cat([cache["k"], k], dim=2)
                v = torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v
        rep = c.heads // c.kv_heads
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        a = attention(q, k, v, mask)
        x = x + self.wo(a.transpose(1, 2).reshape(B, T, c.heads * c.head_dim))
        h = self.ffn_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Qwen3(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.dim, cfg.eps)
        self.register_buffer("cos", torch.zeros(cfg.ctx, cfg.head_dim // 2), persistent=False)
        self.register_buffer("sin", torch.zeros(cfg.ctx, cfg.head_dim // 2), persistent=False)
        self.reset_parameters()

    def reset_parameters(self):
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / ((2 * self.cfg.layers) ** 0.5) if name.endswith(("wo.weight", "down.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
        cos, sin = rope_tables(self.cfg, self.cos.device)
        self.cos.copy_(cos)
        self.sin.copy_(sin)

    def n_params(self):
        return sum(p.numel() for p in self.parameters())

    def forward(self, ids, pos=None, mask=None, caches=None):
        B, T = ids.shape
        if pos is None:
            pos = torch.arange(T, device=ids.device).unsqueeze(0).expand(B, T)
        cos = self.cos[pos].unsqueeze(1)
        sin = self.sin[pos].unsqueeze(1)
        x = self.embed(ids)
        for i, blk in enumerate(self.blocks):
            x = blk(x, cos, sin, mask, None if caches is None else caches[i])
        return F.linear(self.norm(x), self.embed.weight)  # tied output


@torch.no_grad()
def generate_greedy(model: Qwen3, prompts, max_new: int, stop_ids, pad_id: int):
    """Batched greedy decoding with a KV cache; prompts are left-padded. Returns new ids per prompt."""
    dev = model.embed.weight.device
    B = len(prompts)
    L = max(len(p) for p in prompts)
    ids = torch.full((B, L), pad_id, dtype=torch.long, device=dev)
    valid = torch.zeros((B, L), dtype=torch.bool, device=dev)
    for i, p in enumerate(prompts):
        ids[i, L - len(p):] = torch.tensor(p, device=dev)
        valid[i, L - len(p):] = True
    pos = (valid.long().cumsum(1) - 1).clamp(min=0)
    causal = torch.tril(torch.ones(L, L, dtype=torch.bool, device=dev))
    mask = (causal.unsqueeze(0) & valid.unsqueeze(1)).unsqueeze(1)
    mask = mask | torch.eye(L, dtype=torch.bool, device=dev).view(1, 1, L, L)  # padded rows attend to themselves
    caches = [dict() for _ in model.blocks]
    logits = model(ids, pos, mask, caches)
    done = torch.zeros(B, dtype=torch.bool, device=dev)
    next_pos = pos[:, -1] + 1
    stop = torch.tensor(sorted(stop_ids), device=dev)
    # Tokens and "already done before this step" flags stay on the device until the end: reading them
    # per step would synchronise the GPU once per prompt and token.
    steps, was_done = [], []
    for i in range(max_new):
        nxt = logits[:, -1].argmax(-1)
        steps.append(nxt)
        was_done.append(done.clone())
        done |= torch.isin(nxt, stop)
        if i % 16 == 15 and bool(done.all()):
            break
        valid = torch.cat([valid, torch.ones((B, 1), dtype=torch.bool, device=dev)], dim=1)
        m = valid.view(B, 1, 1, -1)
        logits = model(nxt.view(B, 1), next_pos.view(B, 1), m, caches)
        next_pos = next_pos + 1
    toks = torch.stack(steps, 1).cpu().tolist()
    skip = torch.stack(was_done, 1).cpu().tolist()
    return [[t for t, d in zip(toks[b], skip[b]) if not d] for b in range(B)]
