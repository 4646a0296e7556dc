"""verl ``trainer.rollout_data_dir`` (and ``validation_data_dir``) JSONL.

Layout from the writer, ``verl/trainer/ppo/ray_trainer.py`` (``_write_generations`` and
``_log_rollout_data``, verl-project/verl @ 1dda039b): one file ``{dump_path}/{global_steps}.jsonl``
per step, one line per response: ``input`` and ``output`` (decoded with
``skip_special_tokens=True``), ``gts`` (the ground truth), ``score`` (the summed token-level score
the trainer used), ``step``, every ``reward_extra_info`` key with one value per response, and
``request_id``. Reward managers put the verdict in ``acc`` (``naive``/``dapo`` reward loops:
``acc = score`` for a float-returning scorer; ``math_dapo``: ``acc`` a bool).

Mapping: ``score`` → ``reward``; ``acc`` (or ``verdict_key``) → ``verified`` (a bool as is, a number
``> 0`` = correct; absent → null); numeric extra keys → ``signals``; other keys and ``request_id`` →
``meta["extra"]``; ``gts`` → the prompt's gold answer. Lost: tokens (text only; retokenize with a
tokenizer), log-probs, finish reason (null), policy version (``step-N``), group uid (rows are
grouped by prompt text and step).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from gfcr.records import Message, Prompt, Rollout
from gfcr.store.importers._common import (
    ImportFormatError,
    ImportResult,
    Tokenize,
    find_files,
    hid,
    num,
    read_jsonl,
    req,
    step_int,
    text_only_note,
)

PATTERNS = ("*.jsonl",)
_STD = {"input", "output", "gts", "score", "step", "request_id"}


def verdict_of(acc: Any) -> bool | None:
    """verl's ``acc`` reward-extra value as a verdict: a bool as it is (``math_dapo`` returns
    ``{"score", "acc", "pred"}``); a number ``> 0`` is correct (for a scorer that returns a float the
    reward loop sets ``acc = score``, so a wrong answer scored ``-1`` or ``0`` is *not* verified);
    ``None`` when absent. Raises ``ValueError`` for anything else. Examples: ``True`` → True,
    ``-1.0`` → False, ``1`` → True, ``None`` → None."""
    if acc is None:
        return None
    if isinstance(acc, bool | np.bool_):
        return bool(acc)
    if isinstance(acc, int | float | np.integer | np.floating) and math.isfinite(float(acc)):
        return float(acc) > 0
    raise ValueError(f"expected a bool or a number (the verdict), got {acc!r}")


def _verdict(v: Any, path: Path, where: str, key: str) -> bool | None:
    try:
        return verdict_of(v)
    except ValueError as e:
        raise ImportFormatError(path, where, key, str(e)) from e


def parse(paths: list[str], run_id: str, tokenizer: Any | None = None, verdict_key: str = "acc",
          **_: Any) -> ImportResult:
    files = find_files(paths, PATTERNS)
    tok = Tokenize(tokenizer)
    rollouts, prompts = [], {}
    for f in files:
        counters: dict[tuple[int, str], int] = {}
        for i, obj in read_jsonl(f):
            w = f"line {i}"
            inp = req(obj, "input", str, f, w)
            out = req(obj, "output", str, f, w)
            score = num(obj, "score", f, w)
            step = step_int(req(obj, "step", (int, str), f, w), f, w)
            verified = _verdict(obj.get(verdict_key), f, w, verdict_key)
            gts = obj.get("gts")
            pid = "verl-" + hid(inp)
            prompts.setdefault(pid, Prompt(prompt_id=pid, task="verl", messages=[Message("user", inp)],
                                           answer=None if gts is None else (gts if isinstance(gts, str) else json.dumps(gts))))
            k = counters[(step, pid)] = counters.get((step, pid), -1) + 1
            sig, other = {}, {}
            for key, v in obj.items():
                if key in _STD:
                    continue
                if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(float(v)):
                    sig[key] = float(v)
                else:
                    other[key] = v
            rollouts.append(
                Rollout(
                    rollout_id="verl-" + hid(run_id, f.name, i, inp, out),
                    run_id=run_id, step=step, policy_version=f"step-{step}", prompt_id=pid,
                    group_id=f"{run_id}/{pid}@{step}", sample_index=k, task="verl",
                    messages=[Message("user", inp), Message("assistant", out)],
                    reward=score, verified=verified, finish_reason=None, signals=sig,
                    verifier={"name": "verl", "score": score, "verdict_key": verdict_key if verified is not None else None},
                    meta={"source": "verl", "file": f.name, "line": i, "request_id": obj.get("request_id"),
                          "extra": other},
                    **tok(inp, out),
                )
            )
    return ImportResult("verl", [str(f) for f in files], rollouts, list(prompts.values()), text_only_note("verl", tokenizer))
