"""AllenAI open-instruct GRPO ``save_traces``: ``{rollouts_save_path}/{run_name}_rollouts_{shard:06d}.jsonl``.

Layout from the writer, ``_save_rollouts`` / ``RolloutRecord`` (allenai/open-instruct @ e6c3044a,
``open_instruct/rl_utils.py``): one line per sample: ``step``, ``sample_idx``, ``prompt_idx``
(``sample_idx // num_samples_per_prompt``), ``prompt_tokens``, ``response_tokens``, ``reward``,
``advantage``, ``finish_reason``, ``dataset``, ``ground_truth``, ``request_info`` (tool calls,
outputs, errors), ``logprobs`` (over the response, or null). ``{run_name}_metadata.jsonl`` beside the
shards holds the run name, model and git commit.

Mapping: prompt tokens role 0, response tokens role 1 with ``logprobs`` (0 when not saved);
``reward``, ``signals["advantage"]``, ``finish_reason`` (``stop``/``length``; others null);
``ground_truth`` → the prompt's gold answer; ``dataset`` → task; group = (run, the file's ``run_name``, step, ``prompt_idx``: two runs sharing
open-instruct's default save folder never merge), ``sample_index`` = the rank of ``sample_idx``
within its group (the batch position is ``meta.sample_idx``);
``request_info`` and the run metadata → ``meta``. Lost: no text is saved (messages are decoded only
with a tokenizer); the response's tool-output tokens are not marked, so with tools they count as
generated (``meta.tool_called`` says which rows called a tool); policy version is ``step-N``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gfcr.formats._common import (
    ImportResult,
    check_logprobs,
    find_files,
    hid,
    norm_finish,
    num,
    opt_num,
    read_jsonl,
    req,
    step_int,
    token_ids,
)
from gfcr.records import Message, Prompt, Rollout

PATTERNS = ("*_rollouts_*.jsonl",)


def _run_meta(f: Path) -> dict[str, Any]:
    run_name = f.name.rsplit("_rollouts_", 1)[0]
    mp = f.with_name(f"{run_name}_metadata.jsonl")
    if mp.exists():
        try:
            return json.loads(mp.read_text().splitlines()[0])
        except (ValueError, IndexError):
            return {}
    return {}


def parse(paths: list[str], run_id: str, tokenizer: Any | None = None, vocab: int | None = None,
          **_: Any) -> ImportResult:
    files = find_files(paths, PATTERNS)
    rollouts, prompts = [], {}
    for f in files:
        run_meta = _run_meta(f)
        run_name = f.name.rsplit("_rollouts_", 1)[0]
        rows = list(read_jsonl(f))
        # the index within the group: sample_idx ranked within (step, prompt_idx); a step's whole batch
        # is appended to one shard in one call (_save_rollouts), so a group never spans two files
        ranks: dict[tuple[Any, Any], list[Any]] = {}
        for _, obj in rows:
            si = obj.get("sample_idx")
            if isinstance(si, int) and not isinstance(si, bool):  # others are refused below, by line
                ranks.setdefault((obj.get("step"), obj.get("prompt_idx")), []).append(si)
        for i, obj in rows:
            w = f"line {i}"
            step = step_int(req(obj, "step", (int, str), f, w), f, w)
            p_ids = token_ids(req(obj, "prompt_tokens", list, f, w), f, w, "prompt_tokens", vocab)
            r_ids = token_ids(req(obj, "response_tokens", list, f, w), f, w, "response_tokens", vocab)
            reward = num(obj, "reward", f, w)
            adv = opt_num(obj.get("advantage"), f, w, "advantage")
            lp = obj.get("logprobs")
            if lp is not None:
                lp = check_logprobs(lp, len(r_ids), f, w, "logprobs")
            pidx = req(obj, "prompt_idx", int, f, w)
            sidx = req(obj, "sample_idx", int, f, w)
            dataset = str(obj.get("dataset") or "open-instruct")
            gt = obj.get("ground_truth")
            pid = "oi-" + hid(*p_ids)
            msgs = []
            if tokenizer is not None:
                msgs = [Message("user", tokenizer.decode(p_ids)), Message("assistant", tokenizer.decode(r_ids))]
            prompts.setdefault(pid, Prompt(prompt_id=pid, task=dataset, messages=msgs[:1],
                                           answer=None if gt is None else (gt if isinstance(gt, str) else json.dumps(gt)),
                                           meta={"source": "open-instruct", "prompt_token_ids": p_ids}))
            info = obj.get("request_info") if isinstance(obj.get("request_info"), dict) else None
            rollouts.append(Rollout(
                rollout_id="oi-" + hid(run_id, f.name, i, step, sidx, *r_ids[:16]), run_id=run_id, step=step,
                policy_version=f"step-{step}", prompt_id=pid,
                group_id="oi-" + hid(run_id, run_name, step, pidx),
                sample_index=sorted(ranks[(obj.get("step"), pidx)]).index(sidx), task=dataset, messages=msgs,
                token_ids=p_ids + r_ids, token_role=[0] * len(p_ids) + [1] * len(r_ids),
                logprobs=[0.0] * len(p_ids) + (lp or [0.0] * len(r_ids)),
                finish_reason=norm_finish(obj.get("finish_reason")), reward=reward,
                signals={} if adv is None else {"advantage": adv},
                verifier={"name": "open-instruct", "ground_truth": gt},
                meta={"source": "open-instruct", "file": f.name, "line": i, "prompt_idx": pidx, "sample_idx": sidx,
                      "run_name": run_name,
                      "raw_finish_reason": obj.get("finish_reason"), "request_info": info,
                      "tool_called": bool(info and info.get("tool_calleds")), "logprobs_in_dump": lp is not None,
                      "run": run_meta},
                tokens_source="engine",
            ))
    notes = [] if tokenizer is not None else ["open-instruct saves token ids only: messages are empty; pass --tokenizer to decode them"]
    return ImportResult("open-instruct", [str(f) for f in files], rollouts, list(prompts.values()), notes)
