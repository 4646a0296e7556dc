"""ROLL's RLVR ``rollout_dump_dir`` text dump (see :func:`parse`)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from gfcr.formats._common import (
    ImportFormatError,
    ImportResult,
    Tokenize,
    find_files,
    hid,
    num,
    read_jsonl,
    req,
)
from gfcr.records import Message, Prompt, Rollout

PATTERNS = ("rollout_dump_data.step_*.jsonl",)


_ROLL_COLUMNS = ("global_step", "id", "source", "difficulty", "prompt", "messages", "ground_truth", "case_type",
                 "test_case_function", "test_cases", "tag", "domain", "responses", "scores", "sampling_params")


def _roll_rows(obj: dict[str, Any], path: Path, where: str) -> list[dict[str, Any]]:
    """One ROLL dump line → one dict per response. The real writer stores a whole step as one
    columnar object (every column a list with one entry per response); a line whose ``responses``
    is a single string is read as one response."""
    resp = obj.get("responses")
    if isinstance(resp, str):
        return [obj]
    if not isinstance(resp, list):
        raise ImportFormatError(path, where, "responses", f"expected a list of response texts, got {type(resp).__name__}"
                                if resp is not None else "missing")
    n = len(resp)
    for key, v in obj.items():
        if key in _ROLL_COLUMNS and (not isinstance(v, list) or len(v) != n):
            got = f"length {len(v)}" if isinstance(v, list) else type(v).__name__
            raise ImportFormatError(path, where, key, f"expected a list of {n} values (one per response), got {got}")
    return [{k: v[j] for k, v in obj.items() if isinstance(v, list) and len(v) == n} for j in range(n)]


def _roll_messages(raw: Any, path: Path, where: str) -> list[Message] | None:
    if raw is None:
        return None
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as e:
            raise ImportFormatError(path, where, "messages", f"not a JSON list of chat messages ({e.msg})") from e
    if not isinstance(raw, list) or not all(isinstance(m, dict) and "role" in m for m in raw):
        raise ImportFormatError(path, where, "messages", "expected a list of {role, content} objects")
    return [Message.coerce({"role": str(m["role"]), "content": str(m.get("content") or "")}) for m in raw]


def parse(paths: list[str], run_id: str, tokenizer: Any | None = None, **_: Any) -> ImportResult:
    """ROLL's RLVR ``rollout_dump_dir`` text dump, ``rollout_dump_data.step_{N}.jsonl``.

    Layout read from ``alibaba/ROLL`` @ 8eb27cc2, ``roll/pipeline/rlvr/utils.py``
    (``dump_rollout_to_specific_path``, ``write_to_json_process``, ``COLUMMNS_CONFIG``): each step
    file holds **one line**, a columnar object whose every column (``global_step``, ``id``,
    ``source``, ``difficulty``, ``prompt``, ``messages``, ``ground_truth``, ``case_type``,
    ``test_case_function``, ``test_cases``, ``tag``, ``domain``, ``responses``, ``scores``,
    ``sampling_params``) is a list with one entry per *response* (the prompt's fields repeat for
    each of its samples). Columns the dataset lacks are absent. Responses were decoded with
    ``skip_special_tokens=True``: text only, no tokens, logprobs or policy version. The dump has no
    group uid, so rows are grouped by prompt and step; ``ground_truth`` becomes the prompt's answer.
    """
    files = find_files(paths, PATTERNS)
    tok = Tokenize(tokenizer)
    rollouts, prompts = [], {}
    for f in files:
        counters: dict[tuple[int, str], int] = {}
        fstep = f.name.removeprefix("rollout_dump_data.step_").removesuffix(".jsonl")
        for i, obj in read_jsonl(f):
            for j, row in enumerate(_roll_rows(obj, f, f"line {i}")):
                w = f"line {i} response {j}"
                out = req(row, "responses", str, f, w)
                score = num(row, "scores", f, w)
                step = row.get("global_step", int(fstep) if fstep.isdigit() else None)
                if isinstance(step, bool) or not isinstance(step, int) or step < 0:
                    raise ImportFormatError(f, w, "global_step", f"expected an integer >= 0, got {step!r}")
                msgs = _roll_messages(row.get("messages"), f, w)
                ptext = row.get("prompt")
                if ptext is not None and not isinstance(ptext, str):
                    raise ImportFormatError(f, w, "prompt", f"expected text, got {type(ptext).__name__}")
                if msgs is None and ptext is None:
                    raise ImportFormatError(f, w, "prompt", "missing (and no 'messages' either)")
                if msgs is None:
                    msgs = [Message("user", ptext)]
                if ptext is None:
                    ptext = "\n".join(m.content for m in msgs)
                pid = "roll-" + hid(row.get("id"), ptext)
                if pid not in prompts:
                    gt = row.get("ground_truth")
                    tests = {k: row[k] for k in ("case_type", "test_case_function", "test_cases") if row.get(k) is not None}
                    diff = row.get("difficulty")
                    try:
                        dnum = None if diff is None or isinstance(diff, bool) else float(diff)
                    except (TypeError, ValueError):
                        dnum = None
                    dnum = dnum if dnum is not None and math.isfinite(dnum) else None
                    prompts[pid] = Prompt(
                        prompt_id=pid, task="roll", messages=msgs,
                        answer=None if gt is None else (gt if isinstance(gt, str) else json.dumps(gt)),
                        tests=tests or None, category=None if row.get("tag") is None else str(row["tag"]),
                        difficulty=dnum,
                        meta={"source": "roll", "id": row.get("id"), "dataset_source": row.get("source"),
                              "domain": row.get("domain"), "difficulty": diff},
                    )
                sp = row.get("sampling_params")
                if isinstance(sp, str):
                    try:
                        sp = json.loads(sp)
                    except json.JSONDecodeError:
                        sp = {"raw": sp}
                k = counters[(step, pid)] = counters.get((step, pid), -1) + 1
                rollouts.append(
                    Rollout(
                        rollout_id="roll-" + hid(run_id, f.name, i, j, ptext, out),
                        run_id=run_id, step=step, policy_version=f"step-{step}", prompt_id=pid,
                        group_id=f"{run_id}/{pid}@{step}", sample_index=k, task="roll",
                        messages=[*msgs, Message("assistant", out)], reward=score, finish_reason=None,
                        verifier={"name": "roll", "score": score, "domain": row.get("domain"), "tag": row.get("tag")},
                        sampling=sp if isinstance(sp, dict) else {},
                        meta={"source": "roll", "file": f.name, "line": i, "response": j, "id": row.get("id"),
                              "domain": row.get("domain"), "tag": row.get("tag")},
                        **tok(ptext, out),
                    )
                )
    notes = [] if tokenizer is not None else [
        "ROLL dumps hold text only: imported without tokens (tokens_source=none); pass --tokenizer to retokenize"
    ]
    return ImportResult("roll", [str(f) for f in files], rollouts, list(prompts.values()), notes)
