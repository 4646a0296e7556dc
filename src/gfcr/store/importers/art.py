"""OpenPipe ART trajectory Parquet: ``{output_dir}/trajectories/{split}/{step:04d}.parquet``.

Layout from the writer (openpipe-art 0.5.18, ``art/utils/trajectory_logging.py``
``write_trajectory_groups_parquet``, called by ``Model.log`` in ``art/model.py`` with that path):
one row per ``Trajectory`` of the logged ``TrajectoryGroup``s, columns ``group_index`` (the group's
position in the call), ``group_metadata`` / ``group_metrics`` (JSON text or null), ``group_logs``,
``reward``, ``metrics`` / ``metadata`` / ``tools`` (JSON text or null), ``logs`` and ``messages``
(``[{role, content, tool_calls (JSON text), tool_call_id, trainable}]``: ``trainable`` true for
the model's own choices). The writer keeps no tokens, log-probs (a choice's are dropped), finish
reason (dropped with the choice) or policy versions (``Trajectory.initial_policy_version`` /
``final_policy_version`` are not written).

Mapping: one rollout per row; ``messages`` as they are (``tool_call_id`` and the indices of the
``trainable`` messages in ``meta``); the messages before the first trainable one are the prompt
(``prompt_id`` from them); ``reward`` → reward (ART's default is 0.0, so a trajectory never scored
reads 0.0: the file cannot tell); numeric ``metrics`` → ``signals["metric/<name>"]`` (booleans as
0/1), every JSON column parsed into ``meta`` (``metadata``, ``metrics``, ``tools``, ``logs``, the
group's three); ``step`` = the file's number, ``policy_version`` = ``step-N``; ``group_id`` = run,
split, step and ``group_index``, ``sample_index`` = the row's place in its group; the ``train``
split to the run, any other (``val``) to ``{run}-eval`` (or skipped with ``evals="skip"``).
Null, never invented: finish reason, verdict. Text only: no tokens (``tokens_source = none``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from gfcr.records import Message, Prompt, Rollout
from gfcr.store.importers._common import ImportFormatError, ImportResult, eval_run, find_files, hid

PATTERNS = ("*.parquet",)
_COLUMNS = ("group_index", "reward", "messages")


def file_order(f: Path) -> tuple[str, int]:
    return (f.parent.name, int(f.stem) if f.stem.isdigit() else -1)


def _json(v: Any, f: Path, w: str, key: str) -> Any:
    if v is None:
        return None
    try:
        return json.loads(v)
    except (json.JSONDecodeError, TypeError) as e:
        raise ImportFormatError(f, w, key, f"not JSON text: {e}") from e


def _read(f: Path) -> list[dict[str, Any]]:
    try:
        t = pq.read_table(f)
    except (OSError, pa.ArrowInvalid) as e:
        raise ImportFormatError(f, "file", "-", f"not a Parquet file: {str(e).splitlines()[0]}") from e
    for c in _COLUMNS:
        if c not in t.column_names:
            raise ImportFormatError(f, "file", c, "missing (not an ART trajectory file)")
    return t.to_pylist()


def parse(paths: list[str], run_id: str, tokenizer: Any | None = None, evals: str = "separate",
          **_: Any) -> ImportResult:
    files = find_files(paths, PATTERNS)
    rollouts: list[Rollout] = []
    prompts: dict[str, Prompt] = {}
    for f in files:
        if not f.stem.isdigit():
            raise ImportFormatError(f, "file", "-", "expected ART's {step:04d}.parquet name")
        step, split = int(f.stem), f.parent.name
        run = eval_run(run_id, split != "train", evals)
        if run is None:
            continue
        seen: dict[int, int] = {}
        for i, row in enumerate(_read(f)):
            w = f"row {i}"
            g = row["group_index"]
            if not isinstance(g, int) or g < 0:
                raise ImportFormatError(f, w, "group_index", f"expected an integer >= 0, got {g!r}")
            reward = row["reward"]
            if reward is not None and not math.isfinite(reward):
                raise ImportFormatError(f, w, "reward", f"must be finite, got {reward!r}")
            msgs_raw = row["messages"] or []
            msgs, trainable, tool_ids = [], [], {}
            for k, m in enumerate(msgs_raw):
                if not isinstance(m.get("role"), str):
                    raise ImportFormatError(f, w, f"messages[{k}].role", "missing")
                tc = m.get("tool_calls")
                _json(tc, f, w, f"messages[{k}].tool_calls")
                msgs.append(Message(m["role"], m.get("content") or "", tool_calls=tc))
                if m.get("trainable"):
                    trainable.append(k)
                if m.get("tool_call_id") is not None:
                    tool_ids[str(k)] = m["tool_call_id"]
            first = trainable[0] if trainable else len(msgs)
            pmsgs = msgs[:first]
            pid = "art-" + hid(*(json.dumps(m.to_dict(), sort_keys=True) for m in pmsgs))
            prompts.setdefault(pid, Prompt(prompt_id=pid, task="art", messages=pmsgs))
            metrics = _json(row.get("metrics"), f, w, "metrics") or {}
            sig = {f"metric/{k}": float(v) for k, v in metrics.items()
                   if isinstance(v, int | float) and math.isfinite(float(v))}
            k = seen[g] = seen.get(g, -1) + 1
            rollouts.append(Rollout(
                rollout_id="art-" + hid(run, split, f.name, i), run_id=run, prompt_id=pid,
                group_id=f"{run}/art-{split}-{step}-{g}", sample_index=k, task="art", step=step,
                policy_version=f"step-{step}", messages=msgs, token_ids=[], token_role=[], logprobs=[],
                tokens_source="none", finish_reason=None, reward=reward, verified=None, signals=sig,
                verifier={"name": "art"},
                meta={"source": "art", "file": f.name, "split": split, "row": i, "group_index": g,
                      "trainable": trainable, "tool_call_ids": tool_ids, "metrics": metrics,
                      "metadata": _json(row.get("metadata"), f, w, "metadata"),
                      "tools": _json(row.get("tools"), f, w, "tools"), "logs": row.get("logs"),
                      "group": {"metadata": _json(row.get("group_metadata"), f, w, "group_metadata"),
                                "metrics": _json(row.get("group_metrics"), f, w, "group_metrics"),
                                "logs": row.get("group_logs")}}))
    notes = ["ART trajectory Parquet holds text only (no tokens or log-probs), no finish reason and no "
             "policy version: tokens_source 'none', finish reason null, policy_version 'step-N' from the file name"]
    return ImportResult("art", [str(f) for f in files], rollouts, list(prompts.values()), notes)
