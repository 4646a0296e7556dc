"""OpenPipe ART trajectory Parquet: ``{output_dir}/trajectories/{split}/{step:04d}.parquet``.

Layout from the writer (openpipe-art 0.5.18, ``art/utils/trajectory_logging.py``
``write_trajectory_groups_parquet``, called by ``Model.log`` in ``art/model.py`` with that path):
one row per ``Trajectory`` of the logged ``TrajectoryGroup``s, columns ``group_index`` (the group's
position in the call), ``group_metadata`` / ``group_metrics`` (JSON text or null), ``group_logs``,
``reward``, ``metrics`` / ``metadata`` / ``tools`` (JSON text or null), ``logs`` and ``messages``
(``[{role, content, tool_calls (JSON text), tool_call_id, trainable}]``: ``trainable`` true for
the model's own choices). The 0.5.18 writer keeps no tokens, log-probs, finish reason or policy
versions. openpipe-art 0.5.23 (format version 2) adds ``trajectory_index``, ``group_json`` and
``trajectory_json`` (the whole ``Trajectory``: ``messages_and_choices`` with each choice's
``finish_reason``, ``initial_policy_version`` / ``final_policy_version``, ``exchanges``); a group
whose every rollout raised is written as ONE sentinel row (``trajectory_index`` null, no
trajectory), and a trajectory recorded as exchanges gets a null ``messages`` column.

Mapping: one rollout per row; ``messages`` as they are (``tool_call_id`` and the indices of the
``trainable`` messages in ``meta``); the messages before the first trainable one are the prompt
(``prompt_id`` from them); ``reward`` → reward (ART's default is 0.0, so a trajectory never scored
reads 0.0: the file cannot tell); numeric ``metrics`` → ``signals["metric/<name>"]`` (booleans as
0/1), every JSON column parsed into ``meta`` (``metadata``, ``metrics``, ``tools``, ``logs``, the
group's three); ``step`` = the file's number, ``policy_version`` = ``step-N``; ``group_id`` = run,
split, step and ``group_index``, ``sample_index`` = the row's place in its group; the ``train``
split to the run, any other (``val``) to ``{run}-eval`` (or skipped with ``evals="skip"``).
From ``trajectory_json`` (0.5.23): the finish reason of the last choice (or of the last
chat-completions exchange's response); ``policy_version`` = ``step-{initial}`` (``step-{a}..{b}``
when the trajectory spans an update; both in ``meta.policy_versions``); a null ``messages`` column
→ the last exchange's request messages and response; a sentinel row → skipped, counted in a note.
Null, never invented: finish reason and policy version of older files (``step-N`` from the file
name), verdict. Tokens: only where the chat exchanges carry exact ids (vLLM's ``prompt_token_ids``
/ ``token_ids`` or ``token_id:N`` log-prob tokens; :func:`exchange_tokens`), with their log-probs;
else text only (``tokens_source = none``).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from gfcr.formats._common import (
    ImportFormatError,
    ImportResult,
    check_logprobs,
    eval_run,
    find_files,
    hid,
    norm_finish,
    token_ids,
)
from gfcr.records import Message, Prompt, Rollout

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


def _choice_finish(items: Any) -> str | None:
    """The finish reason of the last model choice among ``messages_and_choices`` (a choice is a dict
    with ``finish_reason`` and ``message``), or None."""
    for it in reversed(items if isinstance(items, list) else []):
        if isinstance(it, dict) and "finish_reason" in it and "message" in it:
            return norm_finish(it.get("finish_reason"))
    return None


def _exchange_view(tj: dict[str, Any]) -> tuple[list[dict[str, Any]], str | None]:
    """(messages, finish reason) of the last chat-completions exchange of ART's exchange layout
    (``exchanges.chat_completions[-1]``: its request's messages, then its response's first choice),
    for rows whose ``messages`` column the writer leaves null (``_legacy_messages``)."""
    ex = ((tj.get("exchanges") or {}).get("chat_completions") or []) if isinstance(tj.get("exchanges"), dict) else []
    if not ex or not isinstance(ex[-1], dict):
        return [], None
    req_msgs = (ex[-1].get("request") or {}).get("messages") or []
    choices = (ex[-1].get("response") or {}).get("choices") or []
    said = {json.dumps(_first_choice(e).get("message", {}).get("content")) for e in ex[:-1] if isinstance(e, dict)}
    out = [({**m, "trainable": True} if m.get("role") == "assistant" and json.dumps(m.get("content")) in said else m)
           for m in req_msgs if isinstance(m, dict)]  # an earlier response in the history: generated
    finish = None
    if choices and isinstance(choices[0], dict):
        finish = norm_finish(choices[0].get("finish_reason"))
        if isinstance(choices[0].get("message"), dict):
            out.append({**choices[0]["message"], "trainable": True})
    for m in out:
        if isinstance(m.get("content"), list):  # content parts: the text parts
            m["content"] = "".join(str(p.get("text") or "") for p in m["content"] if isinstance(p, dict))
        if m.get("tool_calls") and not isinstance(m["tool_calls"], str):
            m["tool_calls"] = json.dumps(m["tool_calls"])
    return out, finish


def _first_choice(ex: dict[str, Any]) -> dict[str, Any]:
    ch = (ex.get("response") or {}).get("choices") or []
    return ch[0] if len(ch) == 1 and isinstance(ch[0], dict) else {}


_TOKEN_ID = re.compile(r"token_id:(\d+)")


def exchange_tokens(tj: dict[str, Any], f: Path, w: str, vocab: int | None = None
                    ) -> tuple[list[int], list[int], list[float], list[int]] | None:
    """Exact tokens of ART's chat-completions exchanges, as ART's own tokenizer reads them
    (openpipe-art 0.5.23 ``art/trajectories/_tokenize.py`` ``_chat_choice_tokens``): per exchange, the
    prompt ids (``choices[0].prompt_token_ids``, else the response's ``prompt_token_ids``) and the
    generated ids (``choices[0].token_ids``, else each log-prob entry's ``token_id:N`` token) with
    their log-probs (``logprobs.content[].logprob``). Each prompt must extend the tokens so far: its new
    part is context (role 0), the output generated (role 1). Returns (ids, roles, log-probs, positions
    whose log-prob the response did not give: 0 there), or None when an exchange lacks exact ids or
    a prompt does not extend the history (the row stays text only). Example: prompts [1, 2] then
    [1, 2, 5, 3], outputs [5] then [6] → ids [1, 2, 5, 3, 6], roles [0, 0, 1, 0, 1]."""
    exs = ((tj.get("exchanges") or {}).get("chat_completions") or []) if isinstance(tj.get("exchanges"), dict) else []
    ids: list[int] = []
    role: list[int] = []
    lps: list[float] = []
    missing: list[int] = []
    for k, ex in enumerate(exs if isinstance(exs, list) else []):
        ch = _first_choice(ex) if isinstance(ex, dict) else {}
        prompt = ch.get("prompt_token_ids") or (ex.get("response") or {}).get("prompt_token_ids")
        entries = (ch.get("logprobs") or {}).get("content") or []
        out = ch.get("token_ids")
        if out is None and entries:
            got = [_TOKEN_ID.fullmatch(str(e.get("token"))) if isinstance(e, dict) else None for e in entries]
            out = [int(m.group(1)) for m in got] if all(got) else None
        if not ch or prompt is None or out is None:
            return None
        ew = f"{w} exchanges.chat_completions[{k}]"
        prompt = token_ids(prompt, f, ew, "prompt_token_ids", vocab)
        out = token_ids(out, f, ew, "token_ids", vocab)
        if prompt[:len(ids)] != ids:
            return None
        vals = [e.get("logprob") if isinstance(e, dict) else None for e in entries]
        if entries and len(vals) != len(out):
            raise ImportFormatError(f, ew, "logprobs.content", f"{len(vals)} log-probs for {len(out)} generated tokens")
        vals = vals or [None] * len(out)
        base = len(prompt)
        gone = [j for j, v in enumerate(vals) if v is None]
        it = iter(check_logprobs([v for v in vals if v is not None], len(out) - len(gone), f, ew, "logprobs.content"))
        ids += prompt[len(ids):] + out
        role += [0] * (base - len(role)) + [1] * len(out)
        lps += [0.0] * (base - len(lps)) + [0.0 if j in gone else next(it) for j in range(len(out))]
        missing += [base + j for j in gone]
    return (ids, role, lps, missing) if ids else None


def _policy(tj: dict[str, Any], step: int) -> tuple[str, list[int | None] | None]:
    """``policy_version`` from ``Trajectory.initial_policy_version`` / ``final_policy_version``
    (ART 0.5.2x, in ``trajectory_json``): ``step-{initial}``, ``step-{initial}..{final}`` when a
    trajectory spans an update; the file's ``step-N`` when neither is recorded (older writers)."""
    a, b = tj.get("initial_policy_version"), tj.get("final_policy_version")
    ok = [v for v in (a, b) if isinstance(v, int) and not isinstance(v, bool)]
    if not ok:
        return f"step-{step}", None
    lo, hi = ok[0], ok[-1]
    return (f"step-{lo}" if lo == hi else f"step-{lo}..{hi}"), [a, b]


def parse(paths: list[str], run_id: str, tokenizer: Any | None = None, evals: str = "separate",
          vocab: int | None = None, **_: Any) -> ImportResult:
    """Long because: one pass per row that reads the materialised columns and, where ART 0.5.2x
    writes it, the authoritative ``trajectory_json`` (finish reason, policy versions, exchanges)."""
    files = find_files(paths, PATTERNS)
    rollouts: list[Rollout] = []
    prompts: dict[str, Prompt] = {}
    failed_groups: list[str] = []
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
            if "trajectory_index" in row and row["trajectory_index"] is None:  # ART's sentinel: a group
                if row.get("trajectory_json") is not None or row.get("messages") is not None:  # with no
                    raise ImportFormatError(f, w, "trajectory_index", "null, but the row holds a trajectory")
                failed_groups.append(f"{f.name} group {g}")  # trajectory left (every rollout raised)
                continue
            tj = _json(row.get("trajectory_json"), f, w, "trajectory_json") or {}
            if not isinstance(tj, dict):
                raise ImportFormatError(f, w, "trajectory_json", "expected a JSON object")
            reward = row["reward"]
            if reward is not None and not math.isfinite(reward):
                raise ImportFormatError(f, w, "reward", f"must be finite, got {reward!r}")
            finish = _choice_finish(tj.get("messages_and_choices"))
            msgs_raw = row["messages"]
            if msgs_raw is None:
                msgs_raw, ex_finish = _exchange_view(tj)
                finish = finish or ex_finish
            if not msgs_raw:
                raise ImportFormatError(f, w, "messages", "no messages, and no chat exchange in trajectory_json")
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
            pv, versions = _policy(tj, step)
            toks = exchange_tokens(tj, f, w, vocab)
            meta = {"source": "art", "file": f.name, "split": split, "row": i, "group_index": g,
                    "trainable": trainable, "tool_call_ids": tool_ids, "metrics": metrics,
                    "metadata": _json(row.get("metadata"), f, w, "metadata"),
                    "tools": _json(row.get("tools"), f, w, "tools"), "logs": row.get("logs"),
                    "group": {"metadata": _json(row.get("group_metadata"), f, w, "group_metadata"),
                              "metrics": _json(row.get("group_metrics"), f, w, "group_metrics"),
                              "logs": row.get("group_logs")}}
            if versions is not None:
                meta["policy_versions"] = versions
            if toks is not None and toks[3]:
                meta["logprobs_missing"], meta["logprobs_missing_at"] = len(toks[3]), toks[3]
            rollouts.append(Rollout(
                rollout_id="art-" + hid(run, split, f.name, i), run_id=run, prompt_id=pid,
                group_id=f"{run}/art-{split}-{step}-{g}", sample_index=k, task="art", step=step,
                policy_version=pv, messages=msgs, token_ids=toks[0] if toks else [],
                token_role=toks[1] if toks else [], logprobs=toks[2] if toks else [],
                tokens_source="engine" if toks else "none", finish_reason=finish, reward=reward, verified=None, signals=sig,
                verifier={"name": "art"}, meta=meta))
    notes = ["ART trajectory Parquet: tokens only where its chat exchanges carry exact ids (0.5.2x, vLLM's "
             "token ids), else text only (tokens_source 'none'); finish reason and policy versions from "
             "trajectory_json where ART writes it (0.5.2x), else null and step-N"]
    if failed_groups:
        notes.append(f"skipped {len(failed_groups)} group(s) whose every rollout raised (ART writes one sentinel "
                     f"row for each, no trajectory): {', '.join(failed_groups[:4])}")
    return ImportResult("art", [str(f) for f in files], rollouts, list(prompts.values()), notes)
