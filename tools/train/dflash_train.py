"""Train a DFlash block-diffusion draft for the bundled target (models/peregrine-demo-target-Q8_0.gguf).

The DFlash recipe (../shared/reference/dflash-ddtree.md §2), scaled to a 8 M-parameter target and a
CPU: prompts from the target's own training generator (tools/train/data.py, a seed the target never
saw), responses regenerated greedily by the target itself, the target's hidden states at the draft's
layer ids over prompt + response, random anchors in the response, blocks [anchor token, MASK × (B-1)]
that see the context strictly before the anchor and each other (non-causal), weighted cross-entropy
w_k = exp(-(k-1)/γ) on slots 1..B-1 against the target's tokens. Then the GGUF export (llama.cpp's
'dflash' layout), a reference forward on stored weights (.ref_logits.f32 + .ref.json) for the CI test.

    nice python3 tools/train/dflash_train.py --peregrine build/src/cli/peregrine --minutes 25

Tokenization goes through `peregrine tokenize` (the target's own tokenizer, no `tokenizers` package).
"""
import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import data as D  # noqa: E402
import gguf_export as G  # noqa: E402
from dflash_model import DFlashConfig, DFlashDraft, export_gguf, load_stored, load_target, reference_block_logits, target_features  # noqa: E402
from model import generate_greedy  # noqa: E402

T0 = time.time()
LOG = []


def log(*a):
    s = f"[{time.time() - T0:7.1f}s] " + " ".join(str(x) for x in a)
    print(s, flush=True)
    LOG.append(s)


def render_prompt(s):
    """The ChatML prompt of the sample's first user turn (system prompt kept), as the chat template
    renders it for a request without tools."""
    out = ""
    msgs = s.messages
    if msgs and msgs[0]["role"] == "system":
        out += f"<|im_start|>system\n{msgs[0]['content']}<|im_end|>\n"
        msgs = msgs[1:]
    for m in msgs:
        if m["role"] == "user":
            return out + f"<|im_start|>user\n{m['content']}<|im_end|>\n<|im_start|>assistant\n"
    return None


def tokenize_all(peregrine, model, texts, sep_id):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("<|endoftext|>".join(texts))
        path = f.name
    out = subprocess.run([peregrine, "tokenize", "-m", model, "-f", path, "--parse-special", "--no-bos", "--ids"],
                         check=True, capture_output=True, text=True).stdout
    os.unlink(path)
    ids = [int(x) for x in out.split()]
    res, cur = [], []
    for t in ids:
        if t == sep_id:
            res.append(cur)
            cur = []
        else:
            cur.append(t)
    res.append(cur)
    assert len(res) == len(texts), (len(res), len(texts))
    return res


def make_batch(seqs, feats, plen, idx, c: DFlashConfig, n_anchor, rng, embed):
    """Packed DFlash batch: N blocks per sequence over one shared context (dflash-ddtree.md §2.1).
    Index tensors are built on the host and moved once; features and the embedding table stay on
    the training device."""
    B = c.block
    S = max(len(seqs[i]) for i in idx)
    nf_d = feats[idx[0]].shape[1]
    bs, Q = len(idx), n_anchor * B
    dev = embed.device
    fe = torch.zeros(bs, S, nf_d, device=dev)
    ids = torch.full((bs, Q), c.mask_id, dtype=torch.long)
    qpos = torch.zeros(bs, Q, dtype=torch.long)
    labels = torch.full((bs, Q), -100, dtype=torch.long)
    mask = torch.zeros(bs, 1, Q, S + Q, dtype=torch.bool)
    for r, i in enumerate(idx):
        s, P = seqs[i], plen[i]
        fe[r, : len(s)] = feats[i].float()
        cand = list(range(P, len(s) - 1))
        anchors = rng.sample(cand, min(n_anchor, len(cand)))
        for j in range(n_anchor):
            q0 = j * B
            mask[r, 0, q0:q0 + B, S + q0:S + q0 + B] = True  # the block sees itself, both ways
            if j >= len(anchors):
                continue
            a = anchors[j]
            ids[r, q0] = s[a]
            qpos[r, q0:q0 + B] = torch.arange(a, a + B)
            mask[r, 0, q0:q0 + B, :a] = True  # context strictly before the anchor
            for k in range(1, B):
                if a + k < len(s):
                    labels[r, q0 + k] = s[a + k]
    ids, qpos, mask, labels = ids.to(dev), qpos.to(dev), mask.to(dev), labels.to(dev)
    noise = embed[ids]
    return noise, qpos, fe, torch.arange(S, device=dev).unsqueeze(0).expand(bs, S), mask, labels


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="models/peregrine-demo-target-Q8_0.gguf")
    ap.add_argument("--peregrine", default="build/src/cli/peregrine")
    ap.add_argument("--out", default="models/peregrine-demo-dflash-Q8_0.gguf")
    ap.add_argument("--prompts", type=int, default=2400)
    ap.add_argument("--max-new", type=int, default=192)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--target-layers", default="1,3,5")
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--gamma", type=float, default=7.0)
    ap.add_argument("--anchors", type=int, default=12)
    ap.add_argument("--bs", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--minutes", type=float, default=25.0, help="training wall-clock budget")
    ap.add_argument("--max-steps", type=int, default=100000)
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--cache", default="", help="JSON file keeping the target's generations between runs")
    ap.add_argument("--device", default="auto", help="cpu, cuda or auto (cuda when PyTorch sees a GPU)")
    args = ap.parse_args()
    dev = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    if dev.type == "cpu":
        torch.set_num_threads(1)
    else:
        torch.backends.cuda.matmul.allow_tf32 = True  # training only; the reference logits are computed on the CPU in FP32
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)

    target, tcfg, tfile = load_target(args.target)
    target = target.to(dev)
    log(f"device {dev}")
    vocab = tfile.meta["tokenizer.ggml.tokens"]
    tid = {t: i for i, t in enumerate(vocab)}
    eot, im_end = tid["<|endoftext|>"], tid["<|im_end|>"]
    log(f"target {args.target}: {tcfg}")

    # 1. Prompts (a seed the target's training never used) and the target's own greedy responses.
    samples = D.make_samples(args.seed, args.prompts * 2)
    texts = [t for t in (render_prompt(s) for s in samples if not s.tools) if t][: args.prompts]
    prompts = tokenize_all(args.peregrine, args.target, texts, eot)
    log(f"{len(prompts)} prompts, {sum(map(len, prompts))} prompt tokens")
    seqs, plen = [], []
    key = f"{args.seed}-{args.prompts}-{args.max_new}"
    if args.cache and os.path.exists(args.cache) and json.load(open(args.cache)).get("key") == key:
        cached = json.load(open(args.cache))
        seqs, plen = cached["seqs"], cached["plen"]
        log(f"responses from {args.cache}")
    else:
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        gen_bs = 64 if dev.type == "cpu" else 512
        for b0 in range(0, len(order), gen_bs):
            chunk = [prompts[i] for i in order[b0:b0 + gen_bs]]
            gens = generate_greedy(target, chunk, args.max_new, {im_end, eot}, eot)
            for p, g in zip(chunk, gens):
                seqs.append(p + g)
                plen.append(len(p))
        if args.cache:
            json.dump({"key": key, "seqs": seqs, "plen": plen}, open(args.cache, "w"))
    log(f"generated: {sum(len(s) - p for s, p in zip(seqs, plen))} response tokens")

    # 2. Mask token: an id the data never uses (the draft must not confuse it with real input) whose
    #    embedding row has a typical norm (a never-trained row decays toward 0 under weight decay).
    used = set(t for s in seqs for t in s)
    norms = target.embed.weight.norm(dim=1).cpu()
    med = float(norms.median())
    cands = [i for i in range(len(vocab)) if i not in used and i not in (eot, im_end) and not vocab[i].startswith("<")]
    mask_id = min(cands, key=lambda i: (abs(float(norms[i]) - med), i))
    log(f"mask token {mask_id} {vocab[mask_id]!r}: norm {float(norms[mask_id]):.3f} (median {med:.3f}, {len(cands)} unused ids)")

    layers = [int(x) for x in args.target_layers.split(",")]
    c = DFlashConfig(dim=tcfg.dim, layers=args.layers, heads=tcfg.heads, kv_heads=tcfg.kv_heads, head_dim=tcfg.head_dim,
                     ffn=tcfg.ffn, rope_base=tcfg.rope_base, eps=tcfg.eps, block=args.block, mask_id=mask_id,
                     target_layers=layers, ctx=tcfg.ctx)

    # 3. Target features of every position (float16 to keep them small; training reads them as float32).
    feats = [None] * len(seqs)
    for b0 in range(0, len(seqs), 32):
        idx = list(range(b0, min(len(seqs), b0 + 32)))
        T = max(len(seqs[i]) for i in idx)
        ids = torch.full((len(idx), T), eot, dtype=torch.long)
        for r, i in enumerate(idx):
            ids[r, : len(seqs[i])] = torch.tensor(seqs[i])
        f = target_features(target, ids.to(dev), layers)  # causal: right padding does not touch real rows
        for r, i in enumerate(idx):
            feats[i] = f[r, : len(seqs[i])].half()  # kept on the training device (~2 bytes × 3·dim per position)
    log("features captured")
    n_hold = max(32, len(seqs) // 20)
    perm = list(range(len(seqs)))
    rng.shuffle(perm)
    hold, train = perm[:n_hold], perm[n_hold:]

    # 4. Train.
    draft = DFlashDraft(c).to(dev)
    log(f"draft: {c.to_dict()}, {draft.n_params()} parameters")
    embed = target.embed.weight.detach()
    opt = torch.optim.AdamW(draft.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    wk = torch.tensor([0.0] + [math.exp(-(k - 1) / args.gamma) for k in range(1, c.block)], device=dev)

    def loss_of(batch, want_acc=False):
        noise, qpos, fe, cpos, mask, labels = batch
        h = draft(noise, qpos, fe, cpos, mask)
        logits = F.linear(h, embed)
        bs, Q = labels.shape
        w = wk.repeat(Q // c.block).unsqueeze(0).expand(bs, Q)
        valid = labels >= 0
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.clamp(min=0).reshape(-1), reduction="none").view(bs, Q)
        loss = (ce * w * valid).sum() / (w * valid).sum().clamp(min=1e-6)
        if not want_acc:
            return loss
        hit = (logits.argmax(-1) == labels) & valid
        # Simulated acceptance: 1 + the accepted prefix of each block (the bonus counts), as SpecForge's proxy.
        hb = hit.view(bs, Q // c.block, c.block)[:, :, 1:]
        vb = valid.view(bs, Q // c.block, c.block)[:, :, 1]
        acc_len = (hb.int().cumprod(-1).sum(-1) + 1).float()
        return loss, float(hit.sum()) / max(1, int(valid.sum())), float(acc_len[vb].mean())

    def evaluate():
        draft.eval()
        erng = random.Random(1)
        tot = [0.0, 0.0, 0.0]
        n = 0
        with torch.no_grad():
            for b0 in range(0, len(hold), args.bs):
                idx = hold[b0:b0 + args.bs]
                l, a, al = loss_of(make_batch(seqs, feats, plen, idx, c, args.anchors, erng, embed), True)
                tot[0] += l.item()
                tot[1] += a
                tot[2] += al
                n += 1
        draft.train()
        return [t / n for t in tot]

    budget = args.minutes * 60
    t_train = time.time()
    total = args.max_steps
    step = 0
    warm = 0
    while step < total:
        if step == 10:
            per = (time.time() - t_train) / 10
            total = min(args.max_steps, max(20, int(budget / per)))
            warm = max(1, int(0.04 * total))
            log(f"{per:.2f} s/step -> {total} steps")
        # Progress is the larger of steps and wall-clock used, so a machine slower than the first steps
        # suggested still ends with the schedule decayed (the step count is logged).
        prog = max(step / max(1, total), (time.time() - t_train) / budget)
        if prog >= 1.0:
            log(f"schedule done at step {step}")
            break
        lr = args.lr * (min(1.0, (step + 1) / max(1, warm)) if step < warm else 0.5 * (1 + math.cos(math.pi * min(1.0, prog))))
        lr = max(lr, args.lr * 0.02)
        for g in opt.param_groups:
            g["lr"] = lr
        idx = rng.sample(train, args.bs)
        loss = loss_of(make_batch(seqs, feats, plen, idx, c, args.anchors, rng, embed))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == total - 1:
            msg = f"step {step}/{total} loss {loss.item():.4f} lr {lr:.2e}"
            if step % 500 == 0 or step == total - 1:
                el, ea, eal = evaluate()
                msg += f" | held-out loss {el:.4f} token acc {ea:.3f} simulated accept len {eal:.2f}"
            log(msg)
        step += 1
    el, ea, eal = evaluate()
    log(f"final held-out: loss {el:.4f}, token accuracy {ea:.3f}, simulated accept length {eal:.2f} (block {c.block})")

    # 5. Export + reference logits on the stored weights.
    draft.eval()
    stored = export_gguf(draft, args.out, tfile, G.GGML_Q8_0, "peregrine-demo-dflash")
    log(f"wrote {args.out} ({os.path.getsize(args.out)} bytes)")
    ref = load_stored(c, stored)
    r = hold[0]
    ids, p0 = seqs[r], plen[r] + 3
    target_cpu, _, _ = load_target(args.target)  # the reference runs on the CPU in FP32, like the CI test's tolerance assumes
    logits = reference_block_logits(target_cpu, ref, ids[: p0 + 1], p0)
    base = args.out[: -len(".gguf")]
    logits.astype("<f4").tofile(base + ".ref_logits.f32")
    json.dump({"token_ids": ids[: p0 + 1], "anchor": p0, "block": c.block, "mask_token_id": mask_id,
               "target_layers": layers, "logits_file": os.path.basename(base + ".ref_logits.f32"),
               "rows": c.block - 1, "n_vocab": int(logits.shape[1]), "seed": args.seed,
               "held_out": {"loss": el, "token_accuracy": ea, "simulated_accept_length": eal},
               "train": {"steps": step, "minutes": (time.time() - t_train) / 60, "sequences": len(train),
                         "config": c.to_dict(), "lr": args.lr, "gamma": args.gamma, "anchors": args.anchors, "bs": args.bs}},
              open(base + ".ref.json", "w"), indent=1)
    with open(base + ".train.log", "w") as f:
        f.write("\n".join(LOG) + "\n")
    log("done")


if __name__ == "__main__":
    main()
