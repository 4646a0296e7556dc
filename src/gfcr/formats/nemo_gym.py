"""NeMo Gym token capture: a folder of ``<rollout_id>.tokens.jsonl`` files, one ``TokenEntry`` per line.

Layout from the writer (NVIDIA-NeMo/Gym @ 07d6b0d0, ``nemo_gym/token_id_capture/``): ``sink.py``
``capture_tokens`` builds one ``TokenEntry`` (``records.py``) per model call from the served
response, and ``store.py`` ``TokenCaptureStore.append`` writes it as one sorted-key JSON line to
``<rollout_id>.tokens.jsonl``: ``{schema_version (1), rollout_id, model_call_id, model,
prompt_token_ids, generation_token_ids, generation_log_probs (one per generated token),
routed_experts, output_items (the response's output items without the token arrays),
token_item_index, created_at}`` (``extra="allow"``: more keys may follow). Beside it: a
``.tokens.state.json`` (``incomplete`` among its flags), a ``.tokens.intents`` (one model call id a
line, written before the call is dispatched) and, when a call lost its tokens, a
``.tokens.incomplete`` sentinel. Gym's consumer masks a rollout whose capture is incomplete (a lost
call, or an intent with no entry).

Mapping: one rollout per model call, as Gym's ``per_request`` builder (``builder.py``) makes one
training sequence per call: ``token_ids`` = ``prompt_token_ids`` (role 0) + ``generation_token_ids``
(role 1), ``logprobs`` = ``generation_log_probs`` on the generated tokens (checked: finite, ≤ 0), 0
on the prompt; the assistant message from ``output_items`` (``message`` items' text; ``function_call``
items as ``tool_calls``); ``prompt_id`` from the prompt tokens (calls on the same prompt tokens
share it); ``group_id`` = run / Gym rollout / call, ``sample_index`` 0 (the capture records no
sampling group: Gym's rollout id names one trajectory, not a group of samples); ``meta`` keeps the Gym rollout id,
``model_call_id``, ``model``, ``created_at``, the full ``output_items``, ``token_item_index``,
``routed_experts`` and any extra keys; ``meta.capture_incomplete`` (and ``meta.lost_calls``) when Gym
would mask the rollout. Null or absent, never invented: reward and verdict (a capture holds none),
finish reason (the output items do not say why generation stopped), step 0 and policy version
``unknown`` (not recorded). Not rebuilt: Gym's ``prefix_merging`` chains of calls (each call is its
own row). A record with a ``schema_version`` above 1 is refused, as Gym's reader refuses it.

Rewards: the capture holds none; Gym's rollout collection writes them to its results file (its
``output_jsonl_fpath``, one line per trajectory with the harness's ``reward`` and the row's
``_ng_task_index``, ``_ng_rollout_index``, optional ``_ng_attempt_index`` and ``_ng_rollout_id``,
``nemo_gym/rollout_collection.py`` @ 07d6b0d0). A results file found among the imported paths (a
``*.jsonl`` whose first record has ``_ng_task_index``; its ``_materialized_inputs`` and ``_failures``
siblings are not results) is joined by Gym's own capture key (``rollout_correlation.py``
``maybe_rollout_id_from_run_body``: ``_ng_rollout_id``, else ``"{task}-{rollout}"``, then ``-a{n}`` for
a re-dispatch attempt ``n > 0``): each model call of that trajectory gets the trajectory's ``reward``
(Gym scores trajectories, not calls) and ``meta.reward_source`` names the file and line. A capture with
no results line keeps ``reward`` null; the verdict stays null (Gym's reward is not a pass/fail).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gfcr.formats._common import (
    ImportFormatError,
    ImportResult,
    check_logprobs,
    find_files,
    hid,
    read_jsonl,
    req,
    token_ids,
)
from gfcr.records import Message, Prompt, Rollout

PATTERNS = ("*.tokens.jsonl",)
READS_ROOTS = True  # the driver passes the import's paths (``roots``): the results files live beside the captures
SCHEMA_VERSION = 1  # TOKEN_ENTRY_RECORD_SCHEMA_VERSION of the writer read
_KNOWN = {"schema_version", "rollout_id", "model_call_id", "model", "prompt_token_ids", "generation_token_ids",
          "generation_log_probs", "routed_experts", "output_items", "token_item_index", "created_at"}


def assistant_message(items: list[dict[str, Any]]) -> Message:
    """The assistant turn of a call's ``output_items``: the text of its ``message`` items (a string
    content, or the ``output_text``/``text`` parts of a list) joined, and its ``function_call`` items
    (or a chat message's ``tool_calls``) as ``tool_calls``. Reasoning items are not text of the turn.
    Example: ``[{"type": "message", "content": [{"type": "output_text", "text": "4"}]}]`` →
    ``Message("assistant", "4")``."""
    texts: list[str] = []
    calls: list[Any] = []
    for it in items:
        kind = it.get("type")
        if kind == "message":
            c = it.get("content")
            if isinstance(c, str):
                texts.append(c)
            elif isinstance(c, list):
                texts.extend(p["text"] for p in c if isinstance(p, dict) and p.get("type") in ("output_text", "text")
                             and isinstance(p.get("text"), str))
            if isinstance(it.get("tool_calls"), list):
                calls.extend(it["tool_calls"])
        elif kind == "function_call":
            calls.append({"id": it.get("call_id"), "type": "function",
                          "function": {"name": it.get("name"), "arguments": it.get("arguments")}})
    return Message("assistant", "".join(texts), tool_calls=json.dumps(calls, sort_keys=True) if calls else None)


def _lost_calls(f: Path, rollout: str, entries: list[str]) -> tuple[bool, list[str]]:
    """(incomplete, lost call ids) from the files ``TokenCaptureStore`` keeps beside the entries."""
    base = f.name[: -len(".tokens.jsonl")]
    state_f, sentinel, intents_f = (f.with_name(base + s) for s in (".tokens.state.json", ".tokens.incomplete",
                                                                    ".tokens.intents"))
    state: dict[str, Any] = {}
    if state_f.exists():
        try:
            state = json.loads(state_f.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ImportFormatError(state_f, "file", "-", f"not JSON: {e}") from e
    intents = [x.strip() for x in intents_f.read_text().splitlines() if x.strip()] if intents_f.exists() else []
    lost = [c for c in intents if c not in set(entries)]
    if sentinel.exists():
        lost += [x.strip() for x in sentinel.read_text().splitlines() if x.strip() and x.strip() not in lost]
    return bool(state.get("incomplete")) or sentinel.exists() or bool(lost), sorted(set(lost))


ROLLOUT_KEYS = ("_ng_task_index", "_ng_rollout_index", "_ng_attempt_index", "_ng_rollout_id")


def capture_key(row: dict[str, Any]) -> str | None:
    """Gym's capture key of a results row (``maybe_rollout_id_from_run_body`` @ 07d6b0d0): the explicit
    ``_ng_rollout_id``, else ``"{task}-{rollout}"``; ``-a{n}`` appended for attempt ``n > 0``; None when
    the row names neither. Examples: ``{_ng_task_index: 3, _ng_rollout_index: 1}`` → ``"3-1"``; with
    ``_ng_attempt_index: 2`` → ``"3-1-a2"``; ``{_ng_rollout_id: "x", _ng_task_index: 3, ...}`` → ``"x"``."""
    rid = row.get("_ng_rollout_id")
    if rid is None:
        task, rollout = row.get("_ng_task_index"), row.get("_ng_rollout_index")
        if task is None or rollout is None:
            return None
        rid = f"{task}-{rollout}"
    attempt = row.get("_ng_attempt_index")
    if isinstance(attempt, int) and not isinstance(attempt, bool) and attempt > 0:
        rid = f"{rid}-a{attempt}"
    return str(rid)


def results_files(paths: list[str]) -> list[Path]:
    """Gym rollout-collection results files among ``paths`` (see the module docstring)."""
    out = []
    for f in find_files(paths, ("*.jsonl",)):
        if f.name.endswith((".tokens.jsonl", "_materialized_inputs.jsonl", "_failures.jsonl")):
            continue
        with open(f, "rb") as fh:
            first = fh.readline()
        try:
            head = json.loads(first) if first.strip() else None
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(head, dict) and "_ng_task_index" in head:
            out.append(f)
    return out


def rewards_of(roots: list[str]) -> tuple[list[Path], dict[str, tuple[float, str]]]:
    """The results files under ``roots`` and their rewards by capture key, read once per import (cached
    on the files' paths, sizes and modification times: the driver parses one capture file at a time)."""
    files = results_files(roots)
    stamp = tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    if _REWARDS.get("stamp") != stamp:
        _REWARDS.update(stamp=stamp, rewards=rewards_by_capture(files))
    return files, _REWARDS["rewards"]


_REWARDS: dict[str, Any] = {}


def rewards_by_capture(files: list[Path]) -> dict[str, tuple[float, str]]:
    """``capture key -> (reward, "file:line")`` from Gym results files; a trajectory listed twice with
    different rewards is refused (one line naming both places)."""
    out: dict[str, tuple[float, str]] = {}
    for f in files:
        for line, obj in read_jsonl(f):
            key = capture_key(obj)
            r = obj.get("reward")
            if key is None or r is None or "_ng_failure_class" in obj:
                continue
            if not isinstance(r, int | float) or isinstance(r, bool):
                raise ImportFormatError(f, f"line {line}", "reward", f"expected a number, got {r!r}")
            where = f"{f.name}:{line}"
            if key in out and out[key][0] != float(r):
                raise ImportFormatError(f, f"line {line}", "reward", f"trajectory {key!r} has reward {r} here "
                                        f"and {out[key][0]} at {out[key][1]}")
            out[key] = (float(r), where)
    return out


def parse(paths: list[str], run_id: str, tokenizer: Any | None = None, vocab: int | None = None,
          roots: list[str] | None = None, **_: Any) -> ImportResult:
    files = [f for f in find_files(paths, PATTERNS) if f.name.endswith(".tokens.jsonl")]
    results, rewards = rewards_of(roots or paths)
    rollouts: list[Rollout] = []
    prompts: dict[str, Prompt] = {}
    flagged = 0
    for f in files:
        rows = list(read_jsonl(f))
        rollout = f.name[: -len(".tokens.jsonl")]
        calls = [o.get("model_call_id") for _, o in rows]
        incomplete, lost = _lost_calls(f, rollout, [c for c in calls if isinstance(c, str)])
        flagged += incomplete
        for line, obj in rows:
            w = f"line {line}"
            ver = obj.get("schema_version", 1)
            if not isinstance(ver, int) or isinstance(ver, bool) or ver > SCHEMA_VERSION:
                raise ImportFormatError(f, w, "schema_version", f"{ver!r}: this reader understands up to "
                                        f"{SCHEMA_VERSION} (NeMo Gym's TokenEntry)")
            rid = req(obj, "rollout_id", str, f, w)
            if rid != rollout:
                raise ImportFormatError(f, w, "rollout_id", f"{rid!r} in the file of rollout {rollout!r}")
            call = req(obj, "model_call_id", str, f, w)
            p_ids = token_ids(req(obj, "prompt_token_ids", list, f, w), f, w, "prompt_token_ids", vocab)
            g_ids = token_ids(req(obj, "generation_token_ids", list, f, w), f, w, "generation_token_ids", vocab)
            lps = check_logprobs(req(obj, "generation_log_probs", list, f, w), len(g_ids), f, w, "generation_log_probs")
            items = obj.get("output_items") or []
            if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
                raise ImportFormatError(f, w, "output_items", "expected a list of objects")
            pid = "nemo-gym-" + hid(*p_ids)
            gid = f"{run_id}/{rid}/{call}"
            prompts.setdefault(pid, Prompt(prompt_id=pid, task="nemo-gym", messages=[],
                                           meta={"source": "nemo-gym", "prompt_token_ids": p_ids}))
            meta = {"source": "nemo-gym", "file": f.name, "line": line, "gym_rollout_id": rid, "model_call_id": call,
                    "model": obj.get("model"), "created_at": obj.get("created_at"), "output_items": items,
                    "token_item_index": obj.get("token_item_index"), "routed_experts": obj.get("routed_experts"),
                    "schema_version": ver, "step_in_dump": False,
                    "extra": {key: v for key, v in obj.items() if key not in _KNOWN}}
            if incomplete:
                meta.update(capture_incomplete=True, lost_calls=lost)
            reward = rewards.get(rid)
            if reward is not None:
                meta["reward_source"] = reward[1]
            rollouts.append(Rollout(
                rollout_id="nemo-gym-" + hid(run_id, rid, call), run_id=run_id, prompt_id=pid, group_id=gid,
                sample_index=0, task="nemo-gym", step=0, policy_version="unknown",
                messages=[assistant_message(items)], token_ids=p_ids + g_ids,
                token_role=[0] * len(p_ids) + [1] * len(g_ids), logprobs=[0.0] * len(p_ids) + lps,
                finish_reason=None, reward=reward[0] if reward is not None else None, verified=None, verifier={},
                tokens_source="engine",
                sampling={"model": obj["model"]} if isinstance(obj.get("model"), str) and obj["model"] else {},
                meta=meta))
    notes = ["NeMo Gym token capture records no verdict, finish reason, step or policy version: "
             "null, step 0 (meta.step_in_dump=false), policy_version 'unknown'",
             f"rewards joined from the Gym results file(s) {', '.join(f.name for f in results)}: each trajectory's "
             "reward on each of its model calls; a capture with no results line keeps a null reward"
             if results else "no Gym results file among the paths: rewards are null (import the results "
             "JSONL with the capture folder to join them)"]
    if flagged:
        notes.append("rollouts that lost a call (Gym's consumer masks them) are stored with "
                     "meta.capture_incomplete=true and meta.lost_calls")
    return ImportResult("nemo-gym", [str(f) for f in files], rollouts, list(prompts.values()), notes)
