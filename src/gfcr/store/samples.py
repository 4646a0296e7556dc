"""Small sample dumps in each framework's format, written from the documented layouts
(docs/store.md). Used by the store walkthrough and as test fixtures."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

QUESTIONS = [("What is 3 + 4?", "7"), ("What is 12 - 5?", "7"), ("What is 6 * 7?", "42")]


def _answers(q: str, gold: str, k: int) -> list[tuple[str, float]]:
    out = []
    for j in range(k):
        if j % 2 == 0:
            out.append((f"Let me compute. {q[8:-1]} = {gold}. Answer: {gold}", 1.0))
        else:
            out.append((f"I think it is {int(gold) + j}. Answer: {int(gold) + j}", 0.0))
    return out


def write_verl(d: Path, steps: int = 2, k: int = 4) -> Path:
    """``{dir}/{step}.jsonl``: input, output, gts, score, step, reward-extra keys, request_id."""
    d.mkdir(parents=True, exist_ok=True)
    for step in range(1, steps + 1):
        with open(d / f"{step}.jsonl", "w") as f:
            for qi, (q, gold) in enumerate(QUESTIONS):
                for j, (out, score) in enumerate(_answers(q, gold, k)):
                    f.write(json.dumps({
                        "input": f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n", "output": out,
                        "gts": gold, "score": score, "step": step, "acc": score, "pred": out.rsplit(" ", 1)[-1],
                        "request_id": f"req-{step}-{qi}-{j}",
                    }) + "\n")
    return d


def write_trl(d: Path, steps: int = 2, k: int = 4) -> Path:
    """``completions/completions_{step:05d}.parquet``: step, prompt, completion, reward columns, advantage."""
    d = d / "completions"
    d.mkdir(parents=True, exist_ok=True)
    for step in range(1, steps + 1):
        rows = []
        for q, gold in QUESTIONS:
            ans = _answers(q, gold, k)
            mean = sum(s for _, s in ans) / len(ans)
            for out, score in ans:
                # each logging step holds a new generation (a batch logged twice unchanged is one batch)
                rows.append({"step": step, "prompt": q, "completion": out if step == 1 else f"{out} (step {step})",
                             "accuracy_reward": score,
                             "format_reward": 0.5, "advantage": score - mean})
        pq.write_table(pa.Table.from_pylist(rows), d / f"completions_{step:05d}.parquet")
    return d


def write_areal(d: Path, versions: int = 2, k: int = 2) -> Path:
    """``rollout/{version}/{task_id}.jsonl`` with head/tail versions, version_rle and segments."""
    for v in range(versions):
        vd = d / "rollout" / str(v)
        vd.mkdir(parents=True, exist_ok=True)
        for ti, (q, gold) in enumerate(QUESTIONS):
            with open(vd / f"task{ti}.jsonl", "w") as f:
                for j, (out, score) in enumerate(_answers(q, gold, k)):
                    rec = {"task_id": f"task{ti}", "sample_idx": j, "seqlen": 40, "prompt_len": 12,
                           "head_version": max(0, v - 1), "tail_version": v,
                           "version_rle": [[max(0, v - 1), 10], [v, 18]], "reward": score,
                           "prompt": q, "completion": out}
                    if ti == 2:
                        rec["segments"] = [{"role": "assistant", "content": "<tool>calc 6*7</tool>"},
                                           {"role": "tool", "content": "42"},
                                           {"role": "assistant", "content": out}]
                    f.write(json.dumps(rec) + "\n")
    return d


def write_prime_rl(d: Path, step: int = 3, k: int = 2) -> Path:
    """``rollouts/step_{N}/train/effective/traces.jsonl``: verifiers v1 Episodes (one per line) in the
    layout of ``Episode.to_record()``: nodes with ``message``, ``token_ids``, ``mask``, ``logprobs``
    over the sampled tokens only, named rewards, ``group`` and ``run.work`` with the policy span."""
    out = d / "rollouts" / f"step_{step + 1}" / "train" / "effective"
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "traces.jsonl", "w") as f:
        for qi, (q, gold) in enumerate(QUESTIONS):
            for j, (ans, score) in enumerate(_answers(q, gold, k)):
                n_ans = 5 + j
                nodes = [
                    {"message": {"role": "user", "content": q}, "sampled": False, "token_ids": [1, 20 + qi, 30, 31, 2],
                     "mask": [False] * 5, "logprobs": []},
                    {"parent": 0, "message": {"role": "assistant", "content": ans}, "sampled": True,
                     "token_ids": list(range(100, 100 + n_ans)), "mask": [True] * n_ans,
                     "logprobs": [-0.125 * (t + 1) for t in range(n_ans)], "advantages": [score - 0.5] * n_ans},
                ]
                trace = {"id": f"t-{qi}-{j}", "nodes": nodes, "calls": [{"node": 1, "finish_reason": "stop"}],
                         "rewards": {"correct": {"score": score, "weight": 1.0}}, "info": {"advantage": score - 0.5},
                         "ok": True, "errors": []}
                f.write(json.dumps({"id": f"ep-{qi}-{j}", "env": {"id": "arith"}, "group": {"id": f"g{qi}"},
                                    "task": {"type": "Arith", "data": {"answer": gold}, "key": q},
                                    "run": {"type": "train", "id": "r", "work": {"type": "train", "step": step,
                                                                                 "policy": {"start": step - 1, "end": step}}},
                                    "ok": True, "errors": [], "traces": [trace]}) + "\n")
    return out / "traces.jsonl"


def write_slime(d: Path, rollout_id: int = 5, k: int = 2) -> Path:
    """``{rollout_id}.pt``: ``{"rollout_id", "samples": [Sample.to_dict()]}`` (plain types only)."""
    import torch

    d.mkdir(parents=True, exist_ok=True)
    samples = []
    for qi, (q, gold) in enumerate(QUESTIONS):
        for j, (ans, score) in enumerate(_answers(q, gold, k)):
            resp = list(range(200, 206 + j))
            samples.append({
                "group_index": qi, "index": qi * k + j, "rollout_id": rollout_id, "prompt": q,
                "tokens": [1, 40 + qi, 41, 2] + resp, "response": ans, "response_length": len(resp),
                "label": gold, "reward": score, "loss_mask": [1] * (len(resp) - 1) + [0],
                "weight_versions": ["3", "4"], "rollout_log_probs": [-0.5] * len(resp),
                "status": "completed", "metadata": {"src": "sample"},
            })
    p = d / f"{rollout_id}.pt"
    torch.save({"rollout_id": rollout_id, "samples": samples}, p)
    return p


def write_roll(d: Path, steps: int = 2, k: int = 4) -> Path:
    """``rollout_dump_data.step_{N}.jsonl``: one columnar line per step, every column a list with one
    entry per response (ROLL's ``write_to_json_process``): global_step, id, source, difficulty,
    prompt, messages (JSON text), ground_truth, tag, domain, responses, scores, sampling_params."""
    d.mkdir(parents=True, exist_ok=True)
    for step in range(1, steps + 1):
        cols: dict[str, list] = {c: [] for c in ("global_step", "id", "source", "difficulty", "prompt", "messages",
                                                 "ground_truth", "tag", "domain", "responses", "scores",
                                                 "sampling_params")}
        for qi, (q, gold) in enumerate(QUESTIONS):
            for out, score in _answers(q, gold, k):
                for c, v in (("global_step", step), ("id", f"q{qi}"), ("source", "sample"), ("difficulty", str(qi)),
                             ("prompt", q), ("messages", json.dumps([{"role": "user", "content": q}])),
                             ("ground_truth", gold), ("tag", "arith"), ("domain", "math_rule"), ("responses", out),
                             ("scores", score),
                             ("sampling_params", json.dumps({"generation_config": {"temperature": 0.99}}))):
                    cols[c].append(v)
        with open(d / f"rollout_dump_data.step_{step}.jsonl", "w") as f:
            f.write(json.dumps(cols) + "\n")
    return d
