"""Reference logits of a DFlash draft GGUF, for tests/model/test_dflash.cpp: the draft's block logits on the
values the file stores (dequantized, FP32, CPU), for the block anchored in a token sequence.

dflash_train.py writes these beside the draft it trains; this script recomputes them for a draft trained
elsewhere (e.g. on the GPU machine, whose side files did not come back), reusing the token sequence and anchor of
an existing .ref.json and recording the training run's figures given on the command line.

    python3 tools/train/dflash_ref.py --draft models/peregrine-demo-dflash-Q8_0.gguf \
        --ids-from models/peregrine-demo-dflash-Q8_0.ref.json --train-log dflash.log
"""
import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dflash_model import DFlashConfig, GGUFFile, load_stored, load_target, reference_block_logits  # noqa: E402


def config_from_gguf(f: GGUFFile) -> DFlashConfig:
    m, a = f.meta, "dflash"
    return DFlashConfig(dim=m[f"{a}.embedding_length"], layers=m[f"{a}.block_count"], heads=m[f"{a}.attention.head_count"],
                        kv_heads=m[f"{a}.attention.head_count_kv"], head_dim=m[f"{a}.attention.key_length"],
                        ffn=m[f"{a}.feed_forward_length"], rope_base=m[f"{a}.rope.freq_base"],
                        eps=m[f"{a}.attention.layer_norm_rms_epsilon"], block=m[f"{a}.block_size"],
                        mask_id=m["tokenizer.ggml.mask_token_id"], target_layers=[i - 1 for i in m[f"{a}.target_layers"]],
                        ctx=m[f"{a}.context_length"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--draft", required=True)
    ap.add_argument("--target", default="models/peregrine-demo-target-Q8_0.gguf")
    ap.add_argument("--ids-from", required=True, help="a .ref.json whose token_ids and anchor are reused")
    ap.add_argument("--train-log", default="", help="the training run's log: its final held-out figures go into the JSON")
    args = ap.parse_args()
    f = GGUFFile(args.draft)
    c = config_from_gguf(f)
    old = json.load(open(args.ids_from))
    ids, p0 = old["token_ids"], old["anchor"]
    target, _, _ = load_target(args.target)
    logits = reference_block_logits(target, load_stored(c, f.tensors), ids, p0)
    base = args.draft[: -len(".gguf")]
    logits.astype("<f4").tofile(base + ".ref_logits.f32")
    out = {"token_ids": ids, "anchor": p0, "block": c.block, "mask_token_id": c.mask_id, "target_layers": c.target_layers,
           "logits_file": os.path.basename(base + ".ref_logits.f32"), "rows": c.block - 1, "n_vocab": int(logits.shape[1]),
           "config": c.to_dict()}
    if args.train_log:
        text = open(args.train_log).read()
        m = re.search(r"final held-out: loss ([\d.]+), token accuracy ([\d.]+), simulated accept length ([\d.]+)", text)
        if m:
            out["held_out"] = {"loss": float(m.group(1)), "token_accuracy": float(m.group(2)), "simulated_accept_length": float(m.group(3))}
        out["train_log"] = [l for l in text.splitlines() if l.startswith("[")]
    json.dump(out, open(base + ".ref.json", "w"), indent=1)
    print(f"wrote {base}.ref_logits.f32 ({logits.shape[0]} x {logits.shape[1]}) and {base}.ref.json")


if __name__ == "__main__":
    main()
