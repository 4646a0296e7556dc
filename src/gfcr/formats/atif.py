"""ATIF, the Agent Trajectory Interchange Format (Harbor RFC 0001, ``docs/rfcs/0001-trajectory-format.md``
in laude-institute/harbor, v1.4): import, and export of gfcr rollouts for ATIF readers.

The schema, field by field (RFC §II): root ``{schema_version, session_id, agent: {name, version,
model_name?, extra?}, steps, notes?, final_metrics?, extra?}``; a step ``{step_id (from 1),
timestamp?, source: system|user|agent, model_name?, reasoning_effort?, message, reasoning_content?,
tool_calls?: [{tool_call_id, function_name, arguments}], observation?: {results: [{source_call_id?,
content?, subagent_trajectory_ref?}]}, metrics?: {prompt_tokens?, completion_tokens?, cached_tokens?,
cost_usd?, prompt_token_ids? (v1.4: the whole prompt of that call, history included),
completion_token_ids? (v1.3), logprobs?, extra?}, extra?}``. Input: a ``*.json`` file holding one
trajectory (Harbor's ``trajectory.json``) or ``*.atif.jsonl`` with one trajectory per line.

Import mapping: steps → messages (system → ``system``, user → ``user``, agent → ``assistant`` with
its ``tool_calls`` as OpenAI-style JSON, each observation result → a ``tool`` turn named by its
``source_call_id``). Tokens when every agent step carries ``completion_token_ids`` and
``prompt_token_ids`` and each prompt extends the tokens so far (a prefix-consistent conversation):
the new part of each prompt is context (role 0), each completion is generated (role 1) with its
``logprobs`` (0 where none are given); otherwise text only (``tokens_source = "none"``) and the
per-step ids stay in ``meta.atif``. ``session_id`` → rollout id source; agent
``model_name`` → ``policy_version`` (``unknown`` without one); ``cost`` from the metrics' token
counts. ATIF holds no reward, verdict, finish reason or training step: verified null, finish
reason null, step 0; reward null unless a Harbor trial's verifier file gives it. Everything else (agent, notes, final metrics, step timestamps, reasoning,
metrics extras, root extra) → ``meta.atif``.

Harbor job folders and ATIF v1.5–v1.8 (harbor 0.26.0, ``harbor/models/trajectories/``): only
trajectory files are read (``trajectory*.json``, or any ``*.json`` with an ``ATIF-*``
``schema_version``); the rest of a job (``config.json``, ``result.json``, ``verifier/reward.json``, …)
is listed in ``ImportResult.ignored``. A continuation segment (``trajectory.cont-N.json``) is its own
rollout, id from ``session_id`` + ``cont-N``; ``is_copied_context`` steps carry no token ids and are
context of the next prompt; ``session_id`` is optional (v1.7: then ``trajectory_id``, else the
file's path); content parts (v1.6) → their text joined, the parts in ``meta.atif``; the trial's
``verifier/reward.txt`` / ``reward.json`` → reward (:func:`trial_reward`); groups per job folder.

Export (:func:`rollout_to_atif`): one trajectory per rollout, ``schema_version`` ``ATIF-v1.8``
(valid for harbor 0.26.0's ``TrajectoryValidator``, ``tests/contracts/check_atif_export.py``),
``session_id`` = the rollout id, one step per message (tool turns become the preceding agent step's
observation, its ``source_call_id`` only when it names a call of that step, else the name in the
result's ``extra.gfcr_name``; a rollout with no messages gets one empty agent step, ATIF's minimum,
marked ``extra.gfcr_placeholder``), each generated run of tokens on its assistant step as ``completion_token_ids`` /
``logprobs`` with ``prompt_token_ids`` = every token before it, when the runs and the assistant
turns pair up one to one. What ATIF has no field for (run, step, policy version, group, reward,
verdict, finish reason, signals, verifier, sampling, meta, and the token arrays when they do not
pair up) goes in the root ``extra["gfcr"]``, so :func:`parse` reads an exported file back with
every field equal. ATIF readers see a standard trajectory; the gfcr extras are ignorable.
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from gfcr.formats._common import (
    ImportFormatError,
    ImportResult,
    check_logprobs,
    check_unicode,
    deep_field,
    find_files,
    hid,
    read_jsonl,
    req,
    scoped,
    token_ids,
)
from gfcr.records import GENERATED, Cost, Message, Prompt, Rollout

PATTERNS = ("*.json", "*.atif.jsonl")
SCOPED = True  # a Harbor job folder: {job}/{trial}/agent/trajectory.json
SCHEMA_VERSION = "ATIF-v1.8"  # what the export writes (validated by harbor 0.26.0's TrajectoryValidator)
_ROLE = {"system": "system", "user": "user", "agent": "assistant"}


def _is_trajectory_name(f: Path) -> bool:
    """Names Harbor's agents write trajectories under (``trajectory.json``, ``trajectory.cont-1.json``,
    ``trajectory.summarization-1-summary.json``) and gfcr's ``*.atif.jsonl``."""
    return f.name.endswith(".atif.jsonl") or (f.name.startswith("trajectory") and f.suffix == ".json")


def _trajectories(f: Path) -> list[tuple[str, dict[str, Any]]] | str:
    """The trajectories in ``f``, or why ``f`` is not one (a job folder's ``config.json``,
    ``result.json``, ``verifier/reward.json``, …: any ``*.json`` not named as a trajectory whose
    object has no ``ATIF-*`` ``schema_version``). A file named as a trajectory must be one."""
    if f.name.endswith(".jsonl"):
        return [(f"line {i}", obj) for i, obj in read_jsonl(f)]
    named = _is_trajectory_name(f)
    try:
        text = f.read_text(encoding="utf-8")
        obj = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        if not named:
            return "not JSON"
        raise ImportFormatError(f, "file", "-", f"not a JSON trajectory ({e})") from e
    except RecursionError as e:
        raise ImportFormatError(f, "file", deep_field(text), "JSON nested too deeply") from e
    if not isinstance(obj, dict) or not str(obj.get("schema_version", "")).startswith("ATIF"):
        if not named:
            return "not an ATIF trajectory (no ATIF schema_version)"
        if not isinstance(obj, dict):
            raise ImportFormatError(f, "file", "-", f"expected an ATIF trajectory object, got {type(obj).__name__}")
    check_unicode(obj, f, "trajectory")
    return [("trajectory", obj)]


def _text(v: Any, f: Path, w: str, key: str) -> tuple[str, list[Any] | None]:
    """A message or observation content: text as is; v1.6 content parts (``[{type: text|image|audio,
    text?, source?}]``) → their text parts joined, and the parts themselves (kept in ``meta.atif``)."""
    if v is None:
        return "", None
    if isinstance(v, str):
        return v, None
    if isinstance(v, list) and all(isinstance(p, dict) and isinstance(p.get("type"), str) for p in v):
        return "".join(str(p.get("text") or "") for p in v if p["type"] == "text"), v
    raise ImportFormatError(f, w, key, f"expected text or content parts, got {type(v).__name__}")


def _continuation(f: Path, obj: dict[str, Any]) -> int:
    """A continuation segment's index: ``trajectory.cont-N.json`` (Harbor's Terminus-2 names them
    so), else ``agent.extra.continuation_index``; 0 for a root trajectory."""
    m = re.fullmatch(r"trajectory\.cont-(\d+)\.json", f.name)
    if m:
        return int(m.group(1))
    ex = (obj.get("agent") or {}).get("extra") if isinstance(obj.get("agent"), dict) else None
    ci = ex.get("continuation_index") if isinstance(ex, dict) else None
    return ci if isinstance(ci, int) and not isinstance(ci, bool) and ci > 0 else 0


def trial_reward(f: Path) -> tuple[float | None, dict[str, float], str | None]:
    """A Harbor trial's verifier reward for the trajectory ``{trial}/agent/…json``: ``{trial}/verifier/
    reward.txt`` (one number) or ``reward.json`` (``{name: number}``, ``Verifier`` in
    harbor/verifier/verifier.py). Returns (reward, named rewards, the file read): the reward is the
    number of reward.txt, or the ``reward`` key (or the only key) of reward.json; else None."""
    if f.parent.name != "agent":
        return None, {}, None
    vd = f.parent.parent / "verifier"
    txt, js = vd / "reward.txt", vd / "reward.json"
    try:
        if txt.is_file():
            x = float(txt.read_text().strip())
            return (x if math.isfinite(x) else None), {}, "verifier/reward.txt"
        if js.is_file():
            d = json.loads(js.read_text())
            if isinstance(d, dict):
                named = {str(k): float(v) for k, v in d.items()
                         if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)}
                r = named.get("reward", next(iter(named.values())) if len(named) == 1 else None)
                return r, named, "verifier/reward.json"
    except (OSError, ValueError):  # unreadable or not a number: the reward stays unknown (null)
        pass
    return None, {}, None


def _tool_calls_out(tc: Any, f: Path, w: str) -> str | None:
    """ATIF tool calls → the OpenAI-style JSON gfcr keeps (``id``, ``type``, ``function.name``,
    ``function.arguments``)."""
    if not tc:
        return None
    if not isinstance(tc, list):
        raise ImportFormatError(f, w, "tool_calls", "expected a list")
    out = []
    for j, c in enumerate(tc):
        if not isinstance(c, dict):
            raise ImportFormatError(f, w, f"tool_calls[{j}]", "expected an object")
        out.append({"id": req(c, "tool_call_id", str, f, w), "type": "function",
                    "function": {"name": req(c, "function_name", str, f, w), "arguments": c.get("arguments", {})}})
    return json.dumps(out, sort_keys=True)


def _tool_calls_in(tc: str | None) -> list[dict[str, Any]] | None:
    """gfcr's tool-call JSON → ATIF tool calls, when it is OpenAI-style; else None (kept raw)."""
    if not tc:
        return None
    try:
        calls = json.loads(tc)
        out = [{"tool_call_id": c["id"], "function_name": c["function"]["name"],
                "arguments": c["function"].get("arguments", {})} for c in calls]
    except (ValueError, TypeError, KeyError):
        return None
    return out if _tool_calls_out(out, Path("-"), "-") == tc else None


def _rollout(obj: dict[str, Any], f: Path, w: str, run_id: str | None, vocab: int | None, scope: str = ""
             ) -> tuple[Rollout, Prompt, bool]:
    """One trajectory → (rollout, its prompt, whether gfcr's export wrote it).

    Long because: one pass over the steps in the RFC's field order (message, tool calls, metrics and
    token ids, observation), then the two ways a rollout is made (gfcr's export, any other writer)."""
    req(obj, "schema_version", str, f, w)
    sid = obj.get("session_id")  # optional since v1.7
    if sid is not None and not isinstance(sid, str):
        raise ImportFormatError(f, w, "session_id", f"expected text, got {type(sid).__name__}")
    agent = req(obj, "agent", dict, f, w)
    steps = req(obj, "steps", list, f, w)
    msgs: list[Message] = []
    ids: list[int] = []
    role: list[int] = []
    lps: list[float] = []
    exact = True
    first_agent: int | None = None
    cost_p = cost_g = 0
    step_meta = []
    for k, s in enumerate(steps):
        sw = f"{w} steps[{k}]"
        if not isinstance(s, dict):
            raise ImportFormatError(f, sw, "-", "expected a step object")
        src = req(s, "source", str, f, sw)
        if src not in _ROLE:
            raise ImportFormatError(f, sw, "source", f"must be system, user or agent, got {src!r}")
        message, parts = _text(s.get("message", ""), f, sw, "message")
        copied = s.get("is_copied_context") is True  # v1.5: context from an earlier segment, no tokens
        ex = s.get("extra") if isinstance(s.get("extra"), dict) else {}
        if ex.get("gfcr_placeholder"):  # the export's one step of a rollout with no messages
            step_meta.append({})
            continue
        tc = ex["gfcr_tool_calls"] if "gfcr_tool_calls" in ex else _tool_calls_out(s.get("tool_calls"), f, sw)
        msgs.append(Message(ex.get("gfcr_role") or _ROLE[src], message, tool_calls=tc, name=ex.get("gfcr_name")))
        m = s.get("metrics") if isinstance(s.get("metrics"), dict) else {}
        if src == "agent":
            if first_agent is None:
                first_agent = len(msgs) - 1
            comp, prm = m.get("completion_token_ids"), m.get("prompt_token_ids")
            if copied and comp is None and prm is None:
                pass  # its text is in the next prompt's token ids, as context
            elif comp is None or prm is None:
                exact = False
            elif exact:
                prm = token_ids(prm, f, sw, "metrics.prompt_token_ids", vocab)
                comp = token_ids(comp, f, sw, "metrics.completion_token_ids", vocab)
                if prm[:len(ids)] != ids:
                    exact = False  # not prefix-consistent: no single token sequence
                else:
                    lp = m.get("logprobs")
                    lp = [0.0] * len(comp) if lp is None else check_logprobs(lp, len(comp), f, sw, "metrics.logprobs")
                    ids += prm[len(ids):] + comp
                    role += [0] * (len(prm) - len(role)) + [GENERATED] * len(comp)
                    lps += [0.0] * (len(prm) - len(lps)) + lp
            for key, acc in (("prompt_tokens", 0), ("completion_tokens", 1)):
                v = m.get(key)
                if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
                    if acc:
                        cost_g += v
                    else:
                        cost_p = max(cost_p, v)
        obs = s.get("observation")
        if isinstance(obs, dict):
            for j, res in enumerate(obs.get("results") or []):
                if not isinstance(res, dict):
                    raise ImportFormatError(f, f"{sw} observation.results[{j}]", "-", "expected an object")
                c = res.get("content")
                if isinstance(c, list):
                    c = _text(c, f, f"{sw} observation.results[{j}]", "content")[0]
                rex = res.get("extra") if isinstance(res.get("extra"), dict) else {}
                msgs.append(Message("tool", c if isinstance(c, str) else json.dumps(c) if c is not None else "",
                                    name=res.get("source_call_id") or rex.get("gfcr_name")))
        step_meta.append({k2: v for k2, v in s.items() if k2 not in ("source", "message", "tool_calls", "observation")
                          and v is not None} | ({"message_parts": parts} if parts is not None else {}))
    g = obj.get("extra", {}).get("gfcr") if isinstance(obj.get("extra"), dict) else None
    atif_meta = {"schema_version": obj["schema_version"], "agent": agent, "notes": obj.get("notes"),
                 **{k: obj[k] for k in ("trajectory_id", "continued_trajectory_ref", "subagent_trajectories")
                    if obj.get(k) is not None},
                 "final_metrics": obj.get("final_metrics"), "steps": step_meta,
                 "extra": {k: v for k, v in (obj.get("extra") or {}).items() if k != "gfcr"} or None,
                 "observations": [s.get("observation") for s in steps if isinstance(s, dict)]}
    ptext = json.dumps([m.to_dict() for m in msgs[:first_agent or 1]], sort_keys=True)
    if isinstance(g, dict):  # written by gfcr's export: every field as it was
        if "tokens" in g:
            ids, role, lps = g["tokens"]["token_ids"], g["tokens"]["token_role"], g["tokens"]["logprobs"]
        elif exact and g.get("trailing_token_ids"):
            ids += g["trailing_token_ids"]
            role += [0] * len(g["trailing_token_ids"])
            lps += [0.0] * len(g["trailing_token_ids"])
        r = Rollout(rollout_id=sid, run_id=run_id or g["run_id"], prompt_id=g["prompt_id"], token_ids=ids,
                    token_role=role, logprobs=lps, messages=msgs, task=g["task"], step=g["step"],
                    policy_version=g["policy_version"], group_id=g["group_id"], sample_index=g["sample_index"],
                    parent_id=g.get("parent_id"), branch_pos=g.get("branch_pos"), finish_reason=g.get("finish_reason"),
                    reward=g.get("reward"), verified=g.get("verified"), verifier=g["verifier"], signals=g["signals"],
                    sampling=g["sampling"], cost=Cost(**g["cost"]), tokens_source=g["tokens_source"],
                    created_at=datetime.fromisoformat(g["created_at"]), meta=g["meta"])
        return r, Prompt(prompt_id=r.prompt_id, task=r.task, messages=msgs[:first_agent or 1]), True
    run_id = run_id or "import-atif"
    if not (exact and ids):
        ids, role, lps = [], [], []
    pid = "atif-" + hid(ptext)
    cont = _continuation(f, obj)
    tid = obj.get("trajectory_id")
    if sid is not None:  # a root keeps the id it always had; a continuation segment adds its index
        key: tuple[Any, ...] = (sid,) if not cont else (sid, f"cont-{cont}")
    elif isinstance(tid, str):
        key = ("trajectory_id", tid)
    else:  # no session_id (optional since v1.7): the file's path under the dump root
        key = ("file", scoped(scope, f.name), w)
    reward, named, rsrc = trial_reward(f)
    parts = scope.split("/") if scope else []
    job = "/".join(parts[:-2] if parts[-1:] == ["agent"] else parts)  # {job}/{trial}/agent: the job's folder
    meta: dict[str, Any] = {"source": "atif", "file": scoped(scope, f.name), "session_id": sid, "atif": atif_meta}
    if cont:
        meta["continuation_index"] = cont
    if rsrc:
        meta["reward_source"] = rsrc
    r = Rollout(
        rollout_id="atif-" + hid(run_id, *key), run_id=run_id, prompt_id=pid, token_ids=ids, token_role=role,
        logprobs=lps, messages=msgs, task=str(agent.get("name") or "atif"), step=0,
        policy_version=str(agent.get("model_name") or "unknown"), group_id=f"{scoped(job, run_id, True)}/atif-{hid(ptext)}",
        finish_reason=None, reward=reward, verified=None, verifier={"name": "atif"},
        signals={f"reward/{k}": v for k, v in named.items()},
        cost=Cost(prompt_tokens=cost_p, gen_tokens=cost_g), tokens_source="engine" if ids else "none", meta=meta)
    return r, Prompt(prompt_id=pid, task=r.task, messages=msgs[:first_agent or 1]), False


def parse(paths: list[str], run_id: str | None, tokenizer: Any | None = None, vocab: int | None = None,
          scope: str = "", **_: Any) -> ImportResult:
    """``scope``: the file's folder under the dump root (a Harbor job: ``{trial}/agent``), which keys
    the id of a trajectory without ``session_id`` and, above ``{trial}/agent``, the groups."""
    files = find_files(paths, PATTERNS)
    rollouts, prompts, groups = [], {}, {}
    ignored = []
    for f in files:
        trajs = _trajectories(f)
        if isinstance(trajs, str):
            ignored.append((str(f), trajs))
            continue
        for w, obj in trajs:
            r, p, exported = _rollout(obj, f, w, run_id, vocab, scope)
            if not exported:
                r.meta["where"] = w
                r.sample_index = groups[r.group_id] = groups.get(r.group_id, -1) + 1
            rollouts.append(r)
            prompts.setdefault(p.prompt_id, p)
    notes = ["ATIF holds no verdict, finish reason or training step: stored as null (step 0) unless the file was "
             "written by gfcr's ATIF export; the reward is the Harbor trial's verifier/reward.* when present"]
    return ImportResult("atif", [str(f) for f in files], rollouts, list(prompts.values()), notes, ignored=ignored)


def _runs(role: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) of each run of generated tokens."""
    d = np.diff(np.r_[0, (role == GENERATED).astype(np.int8), 0])
    return list(zip(np.flatnonzero(d == 1).tolist(), np.flatnonzero(d == -1).tolist(), strict=True))


def rollout_to_atif(r: Rollout) -> dict[str, Any]:
    """One rollout → one ATIF v1.4 trajectory (see the module docstring). Example: a single-turn
    rollout [user, assistant] with tokens [5, 6 | 7, 8] (roles 0 0 1 1) → steps [{source: user},
    {source: agent, metrics: {prompt_token_ids: [5, 6], completion_token_ids: [7, 8], logprobs}}]."""
    ids = np.asarray(r.token_ids).tolist()
    role = np.asarray(r.token_role)
    lps = np.asarray(r.logprobs, np.float32).tolist()
    runs = _runs(role)
    n_assist = sum(m.role == "assistant" for m in r.messages)
    paired = bool(ids) and len(runs) == n_assist
    steps: list[dict[str, Any]] = []
    k = 0
    for m in r.messages:
        if m.role == "tool" and steps and steps[-1]["source"] == "agent":
            res: dict[str, Any] = {"content": m.content}
            called = {c["tool_call_id"] for c in steps[-1].get("tool_calls") or []}
            if m.name is not None and m.name in called:  # ATIF: must name a call of its step
                res["source_call_id"] = m.name
            elif m.name is not None:  # a tool name, or a call the step does not hold
                res["extra"] = {"gfcr_name": m.name}
            steps[-1].setdefault("observation", {"results": []})["results"].append(res)
            continue
        src = {"system": "system", "assistant": "agent"}.get(m.role, "user")
        s: dict[str, Any] = {"step_id": len(steps) + 1, "source": src, "message": m.content}
        extra = {}
        if m.role not in ("system", "user", "assistant"):
            extra["gfcr_role"] = m.role
        if m.name is not None:
            extra["gfcr_name"] = m.name
        if m.tool_calls:
            tc = _tool_calls_in(m.tool_calls)
            if tc is not None and src == "agent":
                s["tool_calls"] = tc
            else:
                extra["gfcr_tool_calls"] = m.tool_calls
        if src == "agent" and paired:
            a, b = runs[k]
            s["metrics"] = {"prompt_token_ids": ids[:a], "completion_token_ids": ids[a:b], "logprobs": lps[a:b],
                            "prompt_tokens": a, "completion_tokens": b - a}
            k += 1
        if extra:
            s["extra"] = extra
        steps.append(s)
    g: dict[str, Any] = {
        "run_id": r.run_id, "prompt_id": r.prompt_id, "task": r.task, "step": int(r.step),
        "policy_version": r.policy_version, "group_id": r.group_id, "sample_index": int(r.sample_index),
        "parent_id": r.parent_id, "branch_pos": r.branch_pos, "finish_reason": r.finish_reason,
        "reward": None if r.reward is None else float(r.reward), "verified": r.verified, "verifier": r.verifier,
        "signals": r.signals, "sampling": r.sampling, "cost": r.cost.to_dict(), "tokens_source": r.tokens_source,
        "created_at": r.created_at.isoformat(), "meta": r.meta,
    }
    if not steps:  # ATIF needs one step at least (``Trajectory.steps``, min_length=1)
        steps.append({"step_id": 1, "source": "agent", "message": "", "extra": {"gfcr_placeholder": True}})
    tail = ids[runs[-1][1]:] if paired else []
    if paired and tail:
        g["trailing_token_ids"] = tail
    if ids and not paired:
        g["tokens"] = {"token_ids": ids, "token_role": role.tolist(), "logprobs": lps}
    return {"schema_version": SCHEMA_VERSION, "session_id": r.rollout_id,
            "agent": {"name": "gfcr", "version": _version(), "model_name": r.policy_version},
            "steps": steps, "final_metrics": {"total_prompt_tokens": int(r.cost.prompt_tokens),
                                               "total_completion_tokens": int(r.cost.gen_tokens),
                                               "total_steps": len(steps)},
            "extra": {"gfcr": g}}


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("gfcr")
    except Exception:  # noqa: BLE001 - not installed as a distribution: still a valid trajectory
        return "0"
