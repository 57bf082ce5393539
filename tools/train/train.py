"""One command: synthetic data -> byte-level BPE tokenizer -> target (qwen3, ~8M params) -> draft
(~1.6M params, distilled from the target) -> held-out evaluation -> GGUF export + reference logits
+ model card.

    python3 tools/train/train.py --out DIR [--smoke]

Runs on the device machine (PyTorch, tokenizers, jinja2; no internet). Deterministic for a seed up
to GPU nondeterminism; the step counts are fixed (a wall-clock cap only guards the device call).
"""
import argparse
import json
import math
import os
import random
import re
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import data as D  # noqa: E402
import gguf_export as G  # noqa: E402
from model import Config, Qwen3, generate_greedy  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>"]
CONTROL = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}
# Qwen2's pre-tokenizer split (single digits, so numbers are tokenised digit by digit).
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


def jinja_env():
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    return env


def render(tmpl, messages, tools=None, gen_prompt=False):
    return tmpl.render(messages=messages, tools=tools, add_generation_prompt=gen_prompt, bos_token="", eos_token="<|im_end|>")


class _Enc:
    def __init__(self, ids, offsets):
        self.ids, self.offsets = ids, offsets


class ByteTokenizer:
    """Byte-level tokenizer with no merges, standing in for `tokenizers` in local --smoke runs where
    that package is missing. Same interface subset; exports as a valid gpt2 vocabulary."""

    def __init__(self):
        bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
        cs, n = bs[:], 0
        for b in range(256):
            if b not in bs:
                bs.append(b)
                cs.append(256 + n)
                n += 1
        self.byte_char = {b: chr(c) for b, c in zip(bs, cs)}
        self.char_byte = {v: k for k, v in self.byte_char.items()}
        self.vocab = {t: i for i, t in enumerate(SPECIALS)}
        for b in range(256):
            self.vocab[self.byte_char[b]] = len(self.vocab)
        self.inv = {i: t for t, i in self.vocab.items()}
        self.split = re.compile("(" + "|".join(re.escape(s) for s in SPECIALS) + ")")

    def encode(self, text):
        ids, offs, pos = [], [], 0
        for part in self.split.split(text):
            if part in self.vocab and part in SPECIALS:
                ids.append(self.vocab[part])
                offs.append((pos, pos + len(part)))
            else:
                for i, ch in enumerate(part):
                    for b in ch.encode("utf-8"):
                        ids.append(self.vocab[self.byte_char[b]])
                        offs.append((pos + i, pos + i + 1))
            pos += len(part)
        return _Enc(ids, offs)

    def encode_batch(self, texts):
        return [self.encode(t) for t in texts]

    def decode(self, ids, skip_special_tokens=False):
        out, buf = [], bytearray()
        for i in ids:
            t = self.inv[i]
            if t in SPECIALS:
                out.append(buf.decode("utf-8", "replace"))
                buf = bytearray()
                if not skip_special_tokens:
                    out.append(t)
            else:
                buf.append(self.char_byte[t])
        out.append(buf.decode("utf-8", "replace"))
        return "".join(out)

    def get_vocab(self):
        return dict(self.vocab)

    def get_vocab_size(self):
        return len(self.vocab)

    def to_str(self):
        return json.dumps({"model": {"merges": []}})

    def save(self, path):
        open(path, "w").write(self.to_str())


def train_tokenizer(texts, vocab_size, smoke=False):
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        if not smoke:
            raise
        log("tokenizers is not installed: smoke run with a byte-level tokenizer")
        return ByteTokenizer()
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def assistant_mask(text, offsets):
    """1 for tokens inside assistant turns (content and the closing <|im_end|>), else 0."""
    spans = [(m.start(1), m.end()) for m in re.finditer(r"<\|im_start\|>assistant\n(.*?)<\|im_end\|>", text, re.S)]
    mask = np.zeros(len(offsets), dtype=np.uint8)
    j = 0
    for i, (a, b) in enumerate(offsets):
        while j < len(spans) and spans[j][1] <= a:
            j += 1
        if j < len(spans) and spans[j][0] <= a < spans[j][1]:
            mask[i] = 1
    return mask


def build_stream(tok, chats, code, eot_id):
    ids, mask = [], []
    enc = tok.encode_batch(chats)
    for text, e in zip(chats, enc):
        ids.extend(e.ids + [eot_id])
        mask.extend(list(assistant_mask(text, e.offsets)) + [0])
    for e in tok.encode_batch(code):
        ids.extend(e.ids + [eot_id])
        mask.extend([1] * len(e.ids) + [0])
    return np.asarray(ids, dtype=np.int32), np.asarray(mask, dtype=np.uint8)


def batches(ids, mask, seq, bs, rng):
    n = (len(ids) - 1) // seq
    order = np.arange(n)
    while True:
        rng.shuffle(order)
        for i in range(0, n - bs + 1, bs):
            rows = order[i:i + bs]
            x = np.stack([ids[r * seq:(r + 1) * seq + 1] for r in rows])
            m = np.stack([mask[r * seq + 1:(r + 1) * seq + 1] for r in rows])
            yield torch.from_numpy(x.astype(np.int64)), torch.from_numpy(m.astype(np.float32))


def lr_at(step, total, peak, warm=200):
    if step < warm:
        return peak * (step + 1) / warm
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warm) / max(1, total - warm)))))


def train_model(model, it, steps, peak_lr, cap_s, teacher=None, name="model"):
    dev = next(model.parameters()).device
    extra = {"fused": True} if dev.type == "cuda" else {}
    opt = torch.optim.AdamW(model.parameters(), lr=peak_lr, betas=(0.9, 0.95), weight_decay=0.1, **extra)
    step_fn = torch.compile(model) if dev.type == "cuda" else model
    t0 = time.time()
    compiled_ok = None
    done = 0
    for step in range(steps):
        x, m = next(it)
        x, m = x.to(dev, non_blocking=True), m.to(dev, non_blocking=True)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, peak_lr)
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            if compiled_ok is None and step_fn is not model:
                try:
                    logits = step_fn(x[:, :-1]).float()
                    compiled_ok = True
                except Exception as e:  # torch.compile unavailable there: eager is only slower
                    log(f"{name}: torch.compile failed ({type(e).__name__}: {e}); running eagerly")
                    step_fn, compiled_ok = model, False
                    logits = model(x[:, :-1]).float()
            else:
                logits = step_fn(x[:, :-1]).float()
            ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="none")
            loss = (ce * m.reshape(-1)).sum() / m.sum().clamp(min=1)
            if teacher is not None:
                with torch.no_grad():
                    tl = teacher(x[:, :-1]).float()
                kl = F.kl_div(F.log_softmax(logits, -1), F.log_softmax(tl, -1), log_target=True, reduction="none").sum(-1)
                loss = 0.3 * loss + 0.7 * (kl.reshape(-1) * m.reshape(-1)).sum() / m.sum().clamp(min=1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        done = step + 1
        if step % 250 == 0 or step == steps - 1:
            log(f"{name} step {step}/{steps} loss {loss.item():.4f} lr {lr_at(step, steps, peak_lr):.2e} {time.time() - t0:.0f}s")
        if time.time() - t0 > cap_s:
            log(f"{name}: wall-clock cap reached at step {done}")
            break
    return done, time.time() - t0


def split_reply(text):
    text = text.replace("<|im_end|>", "").replace("<|endoftext|>", "")
    if "</think>" in text:
        r, c = text.split("</think>", 1)
        return c.strip(), r.replace("<think>", "").strip()
    return text.strip(), ""


def evaluate(model, tok, tmpl, heldout, stop_ids, pad_id, max_new=160):
    results, transcripts = {}, []
    model.eval()
    for fam, samples in heldout.items():
        prompts = []
        for s in samples:
            upto = s.meta.get("eval_upto")
            msgs = [m for m in s.messages if m["role"] in ("system", "user")][:2] if upto else s.messages[:-1]
            prompts.append(tok.encode(render(tmpl, msgs, s.tools, True)).ids)
        outs = []
        for i in range(0, len(prompts), 64):
            outs += generate_greedy(model, prompts[i:i + 64], max_new, stop_ids, pad_id)
        ok = 0
        for s, p, o in zip(samples, prompts, outs):
            text = tok.decode(o, skip_special_tokens=False)
            content, reasoning = split_reply(text)
            good = bool(s.check(content, reasoning))
            ok += good
            transcripts.append({"family": fam, "prompt_ids": p, "gen_ids": o, "correct": good, "reply": text})
        results[fam] = ok / len(samples)
        log(f"held-out {fam}: {ok}/{len(samples)} = {100 * ok / len(samples):.1f}%")
    return results, transcripts


@torch.no_grad()
def agreement(target, draft, transcripts, dev):
    """Fraction of generated positions where the draft's greedy token equals the target's."""
    agree = total = 0
    for t in transcripts:
        seq = t["prompt_ids"] + t["gen_ids"]
        if len(t["gen_ids"]) < 2:
            continue
        x = torch.tensor([seq[:-1]], device=dev)
        a = target(x)[0].argmax(-1)
        b = draft(x)[0].argmax(-1)
        s = len(t["prompt_ids"]) - 1
        agree += int((a[s:] == b[s:]).sum())
        total += len(seq) - 1 - s
    return agree / max(total, 1)


def gguf_metadata(cfg: Config, tok, name, file_type, template):
    vocab = tok.get_vocab()
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    types = [3 if t in CONTROL else 4 if t in SPECIALS else 1 for t in tokens]
    model = json.loads(tok.to_str())["model"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    a = "qwen3"
    return {
        "general.architecture": a, "general.name": name, "general.file_type": file_type,
        "general.license": "apache-2.0", "general.source": "tools/train/train.py (synthetic data)",
        f"{a}.block_count": cfg.layers, f"{a}.context_length": cfg.ctx, f"{a}.embedding_length": cfg.dim,
        f"{a}.feed_forward_length": cfg.ffn, f"{a}.attention.head_count": cfg.heads, f"{a}.attention.head_count_kv": cfg.kv_heads,
        f"{a}.attention.key_length": cfg.head_dim, f"{a}.attention.value_length": cfg.head_dim,
        f"{a}.attention.layer_norm_rms_epsilon": cfg.eps, f"{a}.rope.freq_base": cfg.rope_base,
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": vocab["<|endoftext|>"], "tokenizer.ggml.eos_token_id": vocab["<|im_end|>"],
        "tokenizer.ggml.padding_token_id": vocab["<|endoftext|>"], "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": template,
    }


def export(model, cfg, tok, path, name, gtype, template):
    sd = {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}
    big = gtype
    tensors = [("token_embd.weight", sd["embed.weight"], big), ("output_norm.weight", sd["norm.weight"], G.GGML_F32)]
    names = {"attn_norm.weight": "attn_norm", "wq.weight": "attn_q", "wk.weight": "attn_k", "wv.weight": "attn_v",
             "wo.weight": "attn_output", "q_norm.weight": "attn_q_norm", "k_norm.weight": "attn_k_norm",
             "ffn_norm.weight": "ffn_norm", "gate.weight": "ffn_gate", "up.weight": "ffn_up", "down.weight": "ffn_down"}
    for i in range(cfg.layers):
        for k, g in names.items():
            arr = sd[f"blocks.{i}.{k}"]
            tensors.append((f"blk.{i}.{g}.weight", arr, big if arr.ndim == 2 else G.GGML_F32))
    ft = {G.GGML_F16: 1, G.GGML_Q8_0: 7}[gtype]
    stored = G.write_gguf(path, gguf_metadata(cfg, tok, name, ft, template), tensors)
    return stored


@torch.no_grad()
def reference_logits(model, cfg, stored, ids):
    """Logits of the PyTorch model in float32 on the CPU with exactly the weights the GGUF stores."""
    ref = Qwen3(cfg)
    sd = ref.state_dict()
    inv = {"token_embd.weight": "embed.weight", "output_norm.weight": "norm.weight"}
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
    ref.load_state_dict(sd)
    return ref(torch.tensor([ids])).float()[0].numpy()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, for checking the pipeline")
    ap.add_argument("--seed", type=int, default=20261129)
    ap.add_argument("--target-steps", type=int, default=4000)
    ap.add_argument("--draft-steps", type=int, default=2500)
    ap.add_argument("--cap-minutes", type=float, default=4.5, help="wall-clock cap for the target (device calls are limited)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    t_start = time.time()
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = True
    smoke = args.smoke
    n_samples = 4000 if smoke else 240000
    per_family = 16 if smoke else 200

    tmpl_src = open(os.path.join(HERE, "chat_template.jinja")).read()
    tmpl = jinja_env().from_string(tmpl_src)
    log("generating data")
    samples = D.make_samples(args.seed, n_samples)
    def question(s):
        return next(m["content"] for m in s.messages if m["role"] == "user")
    seen = {question(s) for s in samples}
    heldout = D.heldout(args.seed + 1, per_family * 2)
    heldout = {k: [s for s in v if question(s) not in seen][:per_family] for k, v in heldout.items()}
    chats = [render(tmpl, s.messages, s.tools) for s in samples]
    code = D.stdlib_code(300_000 if smoke else 12_000_000)
    log(f"{len(chats)} conversations, {len(code)} code files")

    log("training tokenizer")
    tok = train_tokenizer(chats[:60000] + code[:3000], 1024 if smoke else 4096, smoke)
    tok.save(os.path.join(args.out, "tokenizer.json"))
    vocab = tok.get_vocab()
    eot, im_end = vocab["<|endoftext|>"], vocab["<|im_end|>"]
    ids, mask = build_stream(tok, chats, code, eot)
    log(f"{len(ids)} tokens ({int(mask.sum())} trained on)")

    tcfg = Config(vocab=tok.get_vocab_size()) if not smoke else Config(vocab=tok.get_vocab_size(), dim=64, layers=2, heads=2, ffn=128)
    dcfg = Config(vocab=tcfg.vocab, dim=192, layers=2, heads=3, kv_heads=1, ffn=512) if not smoke else \
        Config(vocab=tcfg.vocab, dim=64, layers=1, heads=1, ffn=128)
    seq, bs = (512, 48) if not smoke else (128, 8)
    rng = np.random.default_rng(args.seed)
    target = Qwen3(tcfg).to(dev)
    log(f"target: {target.n_params() / 1e6:.2f}M parameters, {tcfg}")
    t_steps = 60 if smoke else args.target_steps
    t_done, t_secs = train_model(target, batches(ids, mask, seq, bs, rng), t_steps, 3e-3, args.cap_minutes * 60, name="target")
    target.eval()
    for p in target.parameters():
        p.requires_grad_(False)

    draft = Qwen3(dcfg).to(dev)
    log(f"draft: {draft.n_params() / 1e6:.2f}M parameters, {dcfg}")
    d_steps = 40 if smoke else args.draft_steps
    d_done, d_secs = train_model(draft, batches(ids, mask, seq, bs, rng), d_steps, 3e-3, args.cap_minutes * 60 / 2, teacher=target,
                                 name="draft")
    draft.eval()

    log("evaluating")
    stop = {im_end, eot}
    acc, transcripts = evaluate(target, tok, tmpl, heldout, stop, eot)
    dacc, _ = evaluate(draft, tok, tmpl, {k: v[:50] for k, v in heldout.items()}, stop, eot)
    agree = agreement(target, draft, transcripts, dev)
    log(f"draft/target greedy agreement on held-out generations: {100 * agree:.1f}%")

    log("exporting")
    files = {}
    for mdl, cfg, nm in ((target, tcfg, "peregrine-demo-target"), (draft, dcfg, "peregrine-demo-draft")):
        for gt, suffix in ((G.GGML_F16, "F16"), (G.GGML_Q8_0, "Q8_0")):
            path = os.path.join(args.out, f"{nm}-{suffix}.gguf")
            files[(nm, suffix)] = (export(mdl, cfg, tok, path, nm, gt, tmpl_src), cfg)
    # Reference logits for the CI test: a fixed chat prompt, PyTorch float32 on the stored weights.
    ref_msgs = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "What is 347 + 589?"}]
    ref_ids = tok.encode(render(tmpl, ref_msgs, None, True)).ids[:32]
    refs = {}
    for (nm, suffix), (stored, cfg) in files.items():
        if (nm, suffix) in (("peregrine-demo-target", "Q8_0"), ("peregrine-demo-draft", "F16")):
            lg = reference_logits(None, cfg, stored, ref_ids)
            fname = f"{nm}-{suffix}.ref_logits.f32"
            lg.astype("<f4").tofile(os.path.join(args.out, fname))
            refs[f"{nm}-{suffix}.gguf"] = {"logits_file": fname, "n_tokens": len(ref_ids), "n_vocab": cfg.vocab}
    card = {
        "seed": args.seed, "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu", "torch": torch.__version__,
        "target": {"config": tcfg.to_dict(), "params": target.n_params(), "steps": t_done, "train_seconds": round(t_secs, 1)},
        "draft": {"config": dcfg.to_dict(), "params": draft.n_params(), "steps": d_done, "train_seconds": round(d_secs, 1)},
        "tokens": int(len(ids)), "trained_tokens_per_step": seq * bs, "conversations": len(chats), "code_files": len(code),
        "heldout_per_family": per_family, "target_accuracy": acc, "draft_accuracy_50": dacc, "draft_target_agreement": agree,
        "reference": {"token_ids": ref_ids, "files": refs}, "total_seconds": round(time.time() - t_start, 1),
    }
    json.dump(card, open(os.path.join(args.out, "card.json"), "w"), indent=1)
    json.dump(transcripts[:40], open(os.path.join(args.out, "transcripts.json"), "w"), indent=1)
    log("done", json.dumps({k: card[k] for k in ("target_accuracy", "draft_target_agreement", "total_seconds")}))


if __name__ == "__main__":
    main()
