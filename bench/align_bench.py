"""Span → token alignment throughput (``gfcr.ross.align.align_mask``) on ~1,050-token rollouts.

Arms, alternated round by round on the same fresh rollouts (real SmolLM2 tokenizer, byte-level
BPE): ``vectorised`` (the byte-table gather + vectorised supervision now in ``align_mask``) and
``loop`` (the previous implementation: a Python loop over tokens building each token's bytes from
its vocabulary string, and a Python loop for the supervision test). Both keep the check against
``tokenizer.decode``. Every round draws new rollouts (random text with multi-byte characters, a
random kept mask per rollout) and asserts that both arms give identical masks.

Reports per arm: median tokens per CPU-second and per wall-second over rounds, with the CPU
seconds beside the wall seconds, and the machine load before and after.

    OMP_NUM_THREADS=1 .venv/bin/python bench/align_bench.py --rounds 7 --rollouts 40
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np


def loop_align(tokenizer, token_ids, token_role, messages, kept_chars):
    """The previous implementation of ``align_mask`` (per-token Python loops), for comparison."""
    import gfcr.ross.align as al
    from gfcr.records import assistant_text_ranges

    def decode(ids):
        table = al._byte_decoder()
        special = set(tokenizer.all_special_ids)
        chunks = []
        for tid, tok in zip(ids, tokenizer.convert_ids_to_tokens(ids), strict=True):
            chunks.append(b"" if tid in special else bytes(table[c] for c in tok))
        raw = b"".join(chunks)
        text = raw.decode("utf-8", errors="replace")
        assert text == tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        ends = np.cumsum([len(c) for c in chunks], dtype=np.int64)
        return text, ends - np.array([len(c) for c in chunks], dtype=np.int64), ends

    def supervision(starts, ends, kept_bytes):
        n = len(kept_bytes)
        out = np.zeros(len(starts), np.uint8)
        cs = np.concatenate([[0], np.cumsum(kept_bytes.astype(np.int64))])
        for i, (a, b) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
            if b > a:
                out[i] = cs[b] - cs[a] == b - a
            else:
                lo, hi = max(a - 1, 0), min(a + 1, n)
                out[i] = cs[hi] - cs[lo] == hi - lo
        return out

    text, _ = assistant_text_ranges(messages)
    (a, b), = al.generated_runs(token_role)
    ids = [int(x) for x in token_ids[a:b]]
    dec_text, starts, ends = decode(ids)
    assert dec_text == text
    kept_bytes = np.repeat(kept_chars.astype(bool), [len(c.encode()) for c in dec_text])
    mask = np.zeros(len(token_ids), np.uint8)
    mask[a:b] = supervision(starts, ends, kept_bytes)
    return mask


WORDS = ["the", "sum", "of", "23", "and", "45", "is", "68", "=", "+", "×", "café", "naïve", "数学", "题目", "🙂",
         "Answer:", "\n", "step", "carry", "so", "we", "get", "Wait,", "check", "again."]


def make_rollouts(tok, n, rng, target=1050):
    from gfcr.records import Message, Rollout

    ctx = tok.apply_chat_template([{"role": "user", "content": "Compute 23 + 45."}], add_generation_prompt=True,
                                  tokenize=False)
    cids = tok(ctx, add_special_tokens=False)["input_ids"]
    out = []
    for _ in range(n):
        words = list(rng.choice(WORDS, size=900))
        text = " ".join(words)
        gids = tok(text, add_special_tokens=False)["input_ids"][: target - len(cids) - 1]
        text = tok.decode(gids)
        gids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        ids = np.array(cids + gids, np.int32)
        role = np.array([0] * len(cids) + [1] * len(gids), np.uint8)
        r = Rollout(run_id="b", prompt_id="p", token_ids=ids, token_role=role, logprobs=np.zeros(len(ids), np.float32),
                    messages=[Message("user", "Compute 23 + 45."), Message("assistant", text)])
        kept = rng.random(len(text)) < 0.8
        out.append((r, kept))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--rollouts", type=int, default=40, help="fresh rollouts per round")
    args = ap.parse_args(argv)
    from transformers import AutoTokenizer

    from gfcr.models import resolve_model
    from gfcr.ross.align import align_mask

    tok = AutoTokenizer.from_pretrained(resolve_model(None))
    rng = np.random.default_rng(0)
    load0 = os.getloadavg()
    arms = {"vectorised": lambda r, k: align_mask(tok, r.token_ids, r.token_role, r.messages, k),
            "loop": lambda r, k: loop_align(tok, r.token_ids, r.token_role, r.messages, k)}
    align_mask(tok, *(lambda r: (r[0].token_ids, r[0].token_role, r[0].messages, r[1]))(make_rollouts(tok, 1, rng)[0]))
    res = {a: {"cpu": [], "wall": [], "tokens": []} for a in arms}
    for rnd in range(args.rounds):
        batch = make_rollouts(tok, args.rollouts, rng)
        masks = {}
        order = list(arms) if rnd % 2 == 0 else list(arms)[::-1]  # alternate which arm goes first
        for a in order:
            c0, w0 = time.process_time(), time.perf_counter()
            masks[a] = [arms[a](r, k) for r, k in batch]
            res[a]["cpu"].append(time.process_time() - c0)
            res[a]["wall"].append(time.perf_counter() - w0)
            res[a]["tokens"].append(sum(len(r.token_ids) for r, _ in batch))
        assert all(np.array_equal(x, y) for x, y in zip(masks["vectorised"], masks["loop"], strict=True)), "masks differ"
    out = {"rollout_tokens_mean": float(np.mean([len(r.token_ids) for r, _ in batch])), "rounds": args.rounds,
           "rollouts_per_round": args.rollouts, "identical_masks": True,
           "load_before": load0, "load_after": os.getloadavg(), "cpus": os.cpu_count()}
    for a, d in res.items():
        tpc = np.array(d["tokens"]) / np.array(d["cpu"])
        tpw = np.array(d["tokens"]) / np.array(d["wall"])
        out[a] = {"median_tokens_per_cpu_s": round(float(np.median(tpc))), "median_tokens_per_wall_s":
                  round(float(np.median(tpw))), "median_cpu_s_per_round": round(float(np.median(d["cpu"])), 4),
                  "median_wall_s_per_round": round(float(np.median(d["wall"])), 4)}
    out["speedup_cpu"] = round(out["vectorised"]["median_tokens_per_cpu_s"] / out["loop"]["median_tokens_per_cpu_s"], 1)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
