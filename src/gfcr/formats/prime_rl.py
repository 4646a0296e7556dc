"""prime-rl / verifiers v1 episodes: ``{output_dir}/rollouts/step_{N}/{train,eval}/{all,effective}/traces.jsonl``.

Layout from the writers: prime-rl's ``FileMonitor.log_episodes`` (PrimeIntellect-ai/prime-rl @
559b4477, ``src/prime_rl/monitors/file.py``) appends ``Episode.to_record()`` per line; the record is
verifiers v1's (PrimeIntellect-ai/verifiers @ a60a606e, ``verifiers/v1/episode.py``, ``trace.py``,
``graph.py``): ``{id, env: {id, name}, task, group: {id}, run: {type, id, work: {type, step, policy:
{start, end}}}, ok, errors, traces: [{id, nodes: [{parent, message: {role, content, tool_calls,
name}, sampled, token_ids, mask, logprobs, advantages}], calls: [{node, finish_reason}], rewards:
{name: {score, weight} | null}, metrics, info, stop_condition, errors, agent: {trainable}}]}``.
A node holds only the tokens it adds; ``logprobs``/``advantages`` cover only its ``mask=True``
tokens. Each root-to-leaf path of a trace's node graph is one training sample (``Trace.branches``).

Mapping: one rollout per (episode, trace, branch); tokens = the path's concatenated ``token_ids``,
role 1 where ``mask`` is true, log-probs spread onto those positions (``Branch.logprobs``);
``step`` = ``run.work.step`` (the dispatch step; the folder's step, the batch the episode was
trained in, is ``meta.batch_step``); ``policy_version`` = ``v{start}`` or ``v{start}-v{end}`` from
``run.work.policy`` (``frozen`` when None); reward = ``Trace.reward`` = sum of ``score * weight``
(every named score also in ``signals["reward/<name>"]``, metrics in ``signals["metric/<name>"]``);
``signals["advantage"]`` = prime-rl's scalar advantage (``info.advantage``, else the mean non-zero
token advantage, ``scalar_advantage``), the per-token list in ``meta.advantages``; ``group_id`` =
``group.id``; finish reason: ``error`` for a failed trace, ``length`` when truncated
(``Trace.is_truncated``), else the last model call's ``stop``, else null. The orchestrator writes a
trained episode to both ``all/`` (on arrival, before advantages) and ``effective/`` (with them):
ids come from episode, trace and branch, so each is stored once, the ``effective`` copy preferred.
``eval`` work goes to the run ``{run}-eval`` (or is skipped with ``evals="skip"``). Episodes with no
trace (failures) are counted in a note. Lost: routed experts, multimodal data (never on disk).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gfcr.formats._common import (
    ImportFormatError,
    ImportResult,
    check_logprobs,
    eval_run,
    find_files,
    hid,
    opt_num,
    read_jsonl,
    req,
    step_int,
    token_ids,
)
from gfcr.records import GENERATED, Message, Prompt, Rollout

PATTERNS = ("traces.jsonl",)
_TRUNC = ("max_turns", "max_input_tokens", "max_output_tokens", "max_total_tokens", "context_length")


def _content(c: Any) -> str:
    if c is None:
        return ""
    if isinstance(c, str):
        return c
    if isinstance(c, list):  # content parts
        return "".join(str(p.get("text") or "") for p in c if isinstance(p, dict))
    return str(c)


def _message(node: dict[str, Any], f: Path, w: str) -> Message:
    m = node.get("message")
    if m is None and "role" in node:  # flat nodes, as older gfcr samples wrote them
        m = node
    if not isinstance(m, dict):
        raise ImportFormatError(f, w, "message", "missing: expected an object with role and content")
    role = req(m, "role", str, f, w + " message")
    tc = m.get("tool_calls")
    return Message(role=role, content=_content(m.get("content")),
                   tool_calls=json.dumps(tc, sort_keys=True) if tc else None,
                   name=m.get("name") or m.get("tool_call_id"))


def _branches(nodes: list[Any], f: Path, w: str) -> list[list[int]]:
    """Root-to-leaf index paths, leaves in node order (``verifiers.v1.graph.leaves``)."""
    parents = []
    for k, n in enumerate(nodes):
        if not isinstance(n, dict):
            raise ImportFormatError(f, f"{w} nodes[{k}]", "-", "expected an object")
        p = n.get("parent")
        if p is not None and (isinstance(p, bool) or not isinstance(p, int) or not 0 <= p < k):
            raise ImportFormatError(f, f"{w} nodes[{k}]", "parent", f"expected the index of an earlier node, got {p!r}")
        parents.append(p)
    has_child = {p for p in parents if p is not None}
    paths = []
    for leaf in (k for k in range(len(nodes)) if k not in has_child):
        path, nid = [], leaf
        while nid is not None:
            path.append(nid)
            nid = parents[nid]
        paths.append(path[::-1])
    return paths


def _spread(node: dict[str, Any], key: str, mask: list[bool], f: Path, w: str) -> list[float] | None:
    vals = node.get(key)
    if vals is None:
        return None
    if not isinstance(vals, list):
        raise ImportFormatError(f, w, key, f"expected a list, got {type(vals).__name__}")
    n = sum(mask)
    if len(vals) not in (n, len(mask)):
        raise ImportFormatError(f, w, key, f"length {len(vals)} != sampled tokens {n}")
    out = []
    for x in vals:
        v = opt_num(x, f, w, key)
        out.append(0.0 if v is None else v)
    if len(vals) == len(mask) and n != len(mask):  # a full-length layout: keep the sampled positions
        out = [x for x, m in zip(out, mask, strict=True) if m]
    return out


def _logprobs(node: dict[str, Any], mask: list[bool], f: Path, w: str) -> list[float]:
    """A node's log-probs over its ``mask=True`` tokens (``Branch.logprobs``), checked by the shared
    :func:`check_logprobs`: one finite value <= 0 per sampled token (a full-length list, one per
    token, keeps the sampled positions). Absent (no ``logprobs`` key) = 0 on every sampled token."""
    vals = node.get("logprobs")
    n = sum(mask)
    if vals is None:
        return [0.0] * n
    if isinstance(vals, list) and len(vals) == len(mask) and n != len(mask):
        vals = [x for x, m in zip(vals, mask, strict=True) if m]  # a full-length layout
    return check_logprobs(vals, n, f, w, "logprobs")


def _finish(tr: dict[str, Any], path_nodes: set[int]) -> str | None:
    if tr.get("errors") or tr.get("stop_condition") == "error":
        return "error"
    calls = [c for c in tr.get("calls") or [] if isinstance(c, dict) and (c.get("node") in path_nodes or c.get("node") is None)]
    if tr.get("stop_condition") in _TRUNC:
        return "length"
    last = next((c for c in reversed(calls) if not c.get("error")), None)
    if last is not None and last.get("finish_reason") == "length":
        return "length"
    if last is not None and last.get("finish_reason") == "stop":
        return "stop"
    return None


def _branch(nodes: list[dict[str, Any]], path: list[int], f: Path, tw: str, vocab: int | None
            ) -> tuple[list[int], list[int], list[float], list[float], bool, list[Message]]:
    """One root-to-leaf path → (ids, roles, log-probs, advantages over sampled tokens, any advantage
    assigned, messages), as ``verifiers.v1.trace.Branch`` builds a training sample."""
    ids: list[int] = []
    role: list[int] = []
    lps: list[float] = []
    advs: list[float] = []
    any_adv = False
    msgs = []
    for k in path:
        n = nodes[k]
        nw = f"{tw} nodes[{k}]"
        t_ids = token_ids(n.get("token_ids", []), f, nw, "token_ids", vocab)
        mask = n.get("mask", [False] * len(t_ids))
        if not isinstance(mask, list) or len(mask) != len(t_ids):
            raise ImportFormatError(f, nw, "mask", f"length {len(mask) if isinstance(mask, list) else '?'} != token_ids {len(t_ids)}")
        mask = [bool(x) for x in mask]
        lp = _logprobs(n, mask, f, nw)
        adv = _spread(n, "advantages", mask, f, nw)
        any_adv |= adv is not None
        advs.extend(adv or [0.0] * sum(mask))
        it = iter(lp)
        ids.extend(t_ids)
        role.extend(GENERATED if m else 0 for m in mask)
        lps.extend((next(it, 0.0) if m else 0.0) for m in mask)
        msgs.append(_message(n, f, nw))
    return ids, role, lps, advs, any_adv, msgs


def _trace_rollouts(obj: dict[str, Any], j: int, tr: Any, f: Path, w: str, ctx: dict[str, Any]) -> list[Rollout]:
    tw = f"{w} traces[{j}]"
    if not isinstance(tr, dict):
        raise ImportFormatError(f, tw, "-", "expected an object")
    nodes = tr.get("nodes", tr.get("messages"))
    if not isinstance(nodes, list) or not nodes:
        raise ImportFormatError(f, tw, "nodes", "missing or empty list of message nodes")
    rewards = tr.get("rewards") or {}
    if not isinstance(rewards, dict):
        raise ImportFormatError(f, tw, "rewards", "expected an object of named {score, weight}")
    sig: dict[str, float] = {}
    reward: float | None = None  # no score at all: unknown (null), never 0.0
    for name, r in rewards.items():
        if r is None:
            continue
        if not isinstance(r, dict):
            raise ImportFormatError(f, tw, f"rewards.{name}", "expected {score, weight}")
        score = opt_num(r.get("score"), f, tw, f"rewards.{name}.score")
        weight = opt_num(r.get("weight", 1.0), f, tw, f"rewards.{name}.weight")
        if score is None:
            continue
        sig[f"reward/{name}"] = score
        reward = (reward or 0.0) + score * (1.0 if weight is None else weight)
    if not rewards and "reward" in tr:  # flat layout
        reward = opt_num(tr.get("reward"), f, tw, "reward")
    for name, v in (tr.get("metrics") or {}).items():
        x = opt_num(v, f, tw, f"metrics.{name}") if isinstance(v, int | float) or v is None else None
        if x is not None:
            sig[f"metric/{name}"] = x
    info = tr.get("info") if isinstance(tr.get("info"), dict) else {}
    out = []
    for b, path in enumerate(_branches(nodes, f, tw)):
        ids, role, lps, advs, any_adv, msgs = _branch(nodes, path, f, tw, ctx.get("vocab"))
        if "advantage" in info and isinstance(info["advantage"], int | float):
            sig_adv = float(info["advantage"])
        elif any_adv:
            nz = [a for a in advs if a != 0.0]
            sig_adv = sum(nz) / len(nz) if nz else 0.0
        else:
            sig_adv = None
        rsig = dict(sig)
        if sig_adv is not None:
            rsig["advantage"] = sig_adv
        ctx_msgs = []
        for m, k in zip(msgs, path, strict=True):
            if nodes[k].get("sampled") or (m.role == "assistant" and "sampled" not in nodes[k]):
                break
            ctx_msgs.append(m)
        ptext = json.dumps([m.to_dict() for m in ctx_msgs])
        task = obj.get("task") if isinstance(obj.get("task"), dict) else {}
        pid = "prime-" + hid(ctx["env"], task.get("key") or task.get("hash") or ptext)
        out.append(Rollout(
            rollout_id="prime-" + hid(ctx["run"], ctx["eid"], tr.get("id", j), b),
            run_id=ctx["run"], step=ctx["step"], policy_version=ctx["pv"], prompt_id=pid, group_id=ctx["group"],
            sample_index=0, task=ctx["env"], messages=msgs, token_ids=ids, token_role=role, logprobs=lps,
            finish_reason=_finish(tr, set(path)), reward=reward, signals=rsig,
            verifier={"name": "verifiers", "rewards": rewards, "ok": tr.get("ok"), "errors": tr.get("errors") or None},
            meta={"source": "prime-rl", "episode": ctx["eid"], "trace": tr.get("id", j), "branch": b,
                  "file": str(Path(*f.parts[-4:])), "line": ctx["line"], "subset": ctx["subset"],
                  "batch_step": ctx["batch_step"], "advantages": advs if any_adv else None,
                  "trainable": (tr.get("agent") or {}).get("trainable") if isinstance(tr.get("agent"), dict) else None},
            tokens_source="engine",
        ))
        out[-1].meta["prompt"] = {"messages": [m.to_dict() for m in ctx_msgs], "task": task}
    return out


def file_order(f: Path) -> tuple:
    """``effective`` before ``all`` within a step folder, so its copy (with advantages) wins."""
    return (f.parent.parent, 0 if f.parent.name == "effective" else 1, f)


def inferior_copy(meta: dict[str, Any]) -> bool:
    """A stored ``all/`` copy is replaced when the ``effective/`` copy (with advantages) arrives."""
    return meta.get("subset") == "all"


def episode_rollouts(obj: Any, f: Path, w: str, line: int, run_id: str, evals: str, vocab: int | None,
                     where: dict[str, Any]) -> tuple[str, list[tuple[Rollout, dict[str, Any]]]] | None:
    """One episode record's rollouts with their prompt info, or None for an eval episode skipped
    (``evals="skip"``). ``where`` holds what the file's place says: ``kind`` (``train``/``eval`` or
    None), ``batch_step`` (str or None), ``subset``; ``w`` names the record in errors. Shared with
    :mod:`gfcr.formats.prime_rl_stream` (the same records, written once to a stream)."""
    if not isinstance(obj, dict):
        raise ImportFormatError(f, w, "-", "expected an object (an episode record)")
    eid = str(req(obj, "id", (str, int), f, w))
    traces = req(obj, "traces", list, f, w)
    run = obj.get("run") if isinstance(obj.get("run"), dict) else {}
    work = run.get("work") if isinstance(run.get("work"), dict) else {}
    legacy = obj.get("train") if isinstance(obj.get("train"), dict) else {}
    bstep = where.get("batch_step")
    kind = work.get("type") or where.get("kind") or ("eval" if run.get("type") == "eval" else "train")
    raw_step = work.get("step", legacy.get("step", bstep if bstep is not None else 0))
    step = step_int(raw_step, f, w, "run.work.step")
    pol = work.get("policy", legacy.get("policy"))
    if pol is None:
        pv = "frozen" if work else f"step-{step}"
    elif not isinstance(pol, dict) or not all(isinstance(pol.get(k), int) for k in ("start", "end")):
        raise ImportFormatError(f, w, "run.work.policy", f"expected {{start, end}} integers, got {pol!r}")
    else:
        pv = f"v{pol['start']}" if pol["start"] == pol["end"] else f"v{pol['start']}-v{pol['end']}"
    target = eval_run(run_id, kind == "eval", evals)
    if target is None:
        return None
    env = obj.get("env")
    env_id = (env.get("name") or env.get("id")) if isinstance(env, dict) else env
    env_id = str(env_id or "prime-rl")
    group = obj.get("group")
    gid = str(group["id"]) if isinstance(group, dict) and group.get("id") is not None else f"{eid}"
    ctx = {"run": target, "eid": eid, "step": step, "pv": pv, "env": env_id, "group": f"{target}/prime-{gid}",
           "subset": where.get("subset"), "batch_step": int(bstep) if bstep and str(bstep).isdigit() else None,
           "line": line, "vocab": vocab}
    out = []
    for j, tr in enumerate(traces):
        for r in _trace_rollouts(obj, j, tr, f, w, ctx):
            out.append((r, r.meta.pop("prompt")))
    return env_id, out


def add_prompt(prompts: dict[str, Prompt], r: Rollout, p: dict[str, Any], env_id: str) -> None:
    """The prompt of ``r`` (its context messages and task), once per prompt id."""
    task = p["task"]
    data = task.get("data") if isinstance(task.get("data"), dict) else {}
    ans = data.get("answer")
    prompts.setdefault(r.prompt_id, Prompt(
        prompt_id=r.prompt_id, task=env_id, messages=p["messages"],
        answer=None if ans is None else (ans if isinstance(ans, str) else json.dumps(ans)),
        meta={"source": "prime-rl", "task": task}))


def number_samples(rollouts: list[Rollout]) -> None:
    """``sample_index``: position within the group, in file order."""
    counters: dict[str, int] = {}
    for r in rollouts:
        r.sample_index = counters[r.group_id] = counters.get(r.group_id, -1) + 1


def parse(paths: list[str], run_id: str, tokenizer: Any | None = None, evals: str = "separate",
          vocab: int | None = None, **_: Any) -> ImportResult:
    files = sorted(find_files(paths, PATTERNS), key=file_order)
    rollouts: dict[str, Rollout] = {}
    prompts: dict[str, Prompt] = {}
    no_trace = skipped_eval = 0
    for f in files:
        parts = f.parts
        where = {"subset": parts[-2] if len(parts) >= 2 and parts[-2] in ("all", "effective") else None,
                 "kind": parts[-3] if len(parts) >= 3 and parts[-3] in ("train", "eval") else None,
                 "batch_step": parts[-4].removeprefix("step_") if len(parts) >= 4 and parts[-4].startswith("step_")
                 else None}
        for line, obj in read_jsonl(f):
            got = episode_rollouts(obj, f, f"line {line}", line, run_id, evals, vocab, where)
            if got is None:
                skipped_eval += 1
                continue
            env_id, rps = got
            if not obj["traces"]:
                no_trace += 1
            for r, p in rps:
                if r.rollout_id in rollouts:
                    continue  # the all/ copy of an effective episode
                rollouts[r.rollout_id] = r
                add_prompt(prompts, r, p, env_id)
    number_samples(list(rollouts.values()))
    notes = []
    if no_trace:
        notes.append(f"{no_trace} episode(s) without traces (failed before producing one) were not stored")
    if skipped_eval:
        notes.append(f"skipped {skipped_eval} eval episode(s) (evals=skip)")
    return ImportResult("prime-rl", [str(f) for f in files], list(rollouts.values()), list(prompts.values()), notes)
