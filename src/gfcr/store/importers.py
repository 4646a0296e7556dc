"""Bring rollouts in from the frameworks people already run, and take them out again.

Every importer parses *all* its input into records and validates them before anything is written;
then the rollouts land in one commit (and their prompts, with gold answers, in the prompts table).
A malformed file raises :class:`ImportFormatError` naming file, line (or record) and field, and the
store is left exactly as it was.

Formats (see docs/store.md for the exact fields read):

- ``verl``: ``trainer.rollout_data_dir`` JSONL (``input``, ``output``, ``gts``, ``score``, ``step``,
  reward-extra keys, ``request_id``). Text only.
- ``trl``: GRPO ``completions/completions_*.parquet`` (``step``, ``prompt``, ``completion``, one
  column per reward function, ``advantage``). Text only.
- ``areal``: ``rollout/{version}/{task_id}.jsonl`` (``head_version``/``tail_version``/``version_rle``
  → policy_version; ``segments`` → turns). Text only.
- ``prime-rl``: verifiers ``traces.jsonl`` episodes with per-message ``token_ids``/``mask``/``logprobs``
  — exact tokens.
- ``slime``: ``.pt`` dumps (``tokens``, ``loss_mask``, ``rollout_log_probs``, ``weight_versions``,
  ``reward``), loaded with ``torch.load(weights_only=True)`` unless ``trust_pickle=True``.
- ``jsonl`` / ``parquet``: gfcr's own schema, as written by :func:`export`.

Text-only formats: with a tokenizer the text is tokenized (prompt tokens role 0, completion tokens
role 1, logprobs 0) and the row is flagged ``tokens_source="retokenized"``; without one the token
arrays stay empty (``tokens_source="none"``).
"""

from __future__ import annotations

import glob
import hashlib
import json
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gfcr.records import (
    GENERATED,
    ROLLOUT_SCHEMA,
    Message,
    Prompt,
    RecordError,
    Rollout,
    conform,
    rollouts_to_table,
    table_to_rollouts,
)
from gfcr.store.core import RolloutStore, StoreError


class ImportFormatError(ValueError):
    """Malformed import input. The message names the file, the line or record, and the field."""

    def __init__(self, path: str | os.PathLike[str], where: str, field_name: str, message: str):
        self.path, self.where, self.field = str(path), where, field_name
        super().__init__(f"{path}: {where}: field '{field_name}': {message}")


@dataclass
class ImportResult:
    format: str
    files: list[str]
    rollouts: list[Rollout]
    prompts: list[Prompt]
    notes: list[str] = field(default_factory=list)

    @property
    def tokens_source(self) -> str:
        srcs = {r.tokens_source for r in self.rollouts}
        return ",".join(sorted(srcs)) or "-"


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def _files(paths: list[str], patterns: tuple[str, ...]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        pp = Path(p)
        if pp.is_dir():
            found = sorted({Path(f) for pat in patterns for f in glob.glob(str(pp / "**" / pat), recursive=True)})
            if not found:
                raise ImportFormatError(pp, "directory", "-", f"no files matching {patterns} found")
            out.extend(found)
        elif pp.exists():
            out.append(pp)
        else:
            raise ImportFormatError(pp, "path", "-", "no such file or directory")
    return out


def _jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ImportFormatError(path, f"line {i}", "-", f"not valid JSON ({e.msg}); truncated line?") from e
            if not isinstance(obj, dict):
                raise ImportFormatError(path, f"line {i}", "-", f"expected a JSON object, got {type(obj).__name__}")
            yield i, obj


def _req(obj: dict[str, Any], key: str, types: type | tuple[type, ...], path: Path, where: str) -> Any:
    if key not in obj:
        raise ImportFormatError(path, where, key, "missing")
    v = obj[key]
    if not isinstance(v, types) or (isinstance(v, bool) and bool not in (types if isinstance(types, tuple) else (types,))):
        tn = types.__name__ if isinstance(types, type) else "/".join(t.__name__ for t in types)
        raise ImportFormatError(path, where, key, f"expected {tn}, got {type(v).__name__} ({str(v)[:40]!r})")
    return v


def _num(obj: dict[str, Any], key: str, path: Path, where: str) -> float:
    v = _req(obj, key, (int, float), path, where)
    if not math.isfinite(float(v)):
        raise ImportFormatError(path, where, key, f"must be finite, got {v!r}")
    return float(v)


def _hid(*parts: Any) -> str:
    h = hashlib.sha1("\x1f".join(str(p) for p in parts).encode()).hexdigest()
    return h[:24]


class _Tokenize:
    """Turns (prompt text, completion text) into token arrays, or leaves them empty without a tokenizer."""

    def __init__(self, tokenizer: Any | None):
        self.tok = tokenizer

    def __call__(self, prompt: str, completion: str) -> dict[str, Any]:
        if self.tok is None:
            empty_i = np.zeros(0, np.int32)
            return dict(token_ids=empty_i, token_role=np.zeros(0, np.int8), logprobs=np.zeros(0, np.float32),
                        tokens_source="none")
        p = self.tok(prompt, add_special_tokens=False)["input_ids"]
        c = self.tok(completion, add_special_tokens=False)["input_ids"]
        ids = np.asarray(list(p) + list(c), np.int32)
        role = np.asarray([0] * len(p) + [1] * len(c), np.int8)
        if len(ids) == 0:
            return self.__class__(None)("", "")
        return dict(token_ids=ids, token_role=role, logprobs=np.zeros(len(ids), np.float32), tokens_source="retokenized")


def load_tokenizer(name_or_path: str | None) -> Any | None:
    if not name_or_path:
        return None
    from transformers import AutoTokenizer  # heavy import only when asked for

    return AutoTokenizer.from_pretrained(name_or_path)


# ---------------------------------------------------------------------------------------------
# framework formats
# ---------------------------------------------------------------------------------------------


def parse_verl(paths: list[str], run_id: str, tokenizer: Any | None = None) -> ImportResult:
    files = _files(paths, ("*.jsonl",))
    tok = _Tokenize(tokenizer)
    rollouts, prompts = [], {}
    std = {"input", "output", "gts", "score", "step", "request_id"}
    for f in files:
        counters: dict[tuple[int, str], int] = {}
        for i, obj in _jsonl(f):
            w = f"line {i}"
            inp = _req(obj, "input", str, f, w)
            out = _req(obj, "output", str, f, w)
            score = _num(obj, "score", f, w)
            step = _req(obj, "step", int, f, w)
            if step < 0:
                raise ImportFormatError(f, w, "step", f"must be >= 0, got {step}")
            gts = obj.get("gts")
            pid = "verl-" + _hid(inp)
            prompts.setdefault(pid, Prompt(prompt_id=pid, task="verl", messages=[Message("user", inp)],
                                           answer=None if gts is None else (gts if isinstance(gts, str) else json.dumps(gts))))
            k = counters[(step, pid)] = counters.get((step, pid), -1) + 1
            extra = {}
            for key, v in obj.items():
                if key in std:
                    continue
                if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(float(v)):
                    extra.setdefault("_other", {})[key] = v
                else:
                    extra[key] = float(v)
            other = extra.pop("_other", {})
            rollouts.append(
                Rollout(
                    rollout_id="verl-" + _hid(run_id, f.name, i, inp, out),
                    run_id=run_id, step=step, policy_version=f"step-{step}", prompt_id=pid,
                    group_id=f"{pid}@{step}", sample_index=k, task="verl",
                    messages=[Message("user", inp), Message("assistant", out)],
                    reward=score, signals=extra, verifier={"name": "verl", "score": score},
                    meta={"source": "verl", "file": f.name, "line": i, "request_id": obj.get("request_id"),
                          "extra": other},
                    **tok(inp, out),
                )
            )
    notes = [] if tokenizer is not None else [
        "verl dumps hold text only: imported without tokens (tokens_source=none); pass --tokenizer to retokenize"
    ]
    return ImportResult("verl", [str(f) for f in files], rollouts, list(prompts.values()), notes)


def parse_trl(paths: list[str], run_id: str, tokenizer: Any | None = None) -> ImportResult:
    files = _files(paths, ("completions_*.parquet",))
    tok = _Tokenize(tokenizer)
    rollouts, prompts = [], {}
    for f in files:
        try:
            t = pq.read_table(f)
        except (pa.ArrowInvalid, OSError) as e:
            raise ImportFormatError(f, "file", "-", f"not a readable Parquet file: {e}") from e
        for col in ("step", "prompt", "completion"):
            if col not in t.column_names:
                raise ImportFormatError(f, "schema", col, "missing column")
        reward_cols = [
            c for c in t.column_names
            if c not in ("step", "prompt", "completion", "advantage")
            and (pa.types.is_floating(t.schema.field(c).type) or pa.types.is_integer(t.schema.field(c).type))
        ]
        counters: dict[tuple[int, str], int] = {}
        for i, row in enumerate(t.to_pylist()):
            w = f"row {i}"
            step = _req(row, "step", int, f, w)
            prompt = row["prompt"]
            if isinstance(prompt, list):  # conversational prompt
                msgs = [Message.coerce(m) for m in prompt]
                ptext = "\n".join(m.content for m in msgs)
            elif isinstance(prompt, str):
                msgs, ptext = [Message("user", prompt)], prompt
            else:
                raise ImportFormatError(f, w, "prompt", f"expected text or messages, got {type(prompt).__name__}")
            comp = row["completion"]
            if isinstance(comp, list):
                comp = "".join(str(m.get("content", "")) for m in comp if isinstance(m, dict))
            if not isinstance(comp, str):
                raise ImportFormatError(f, w, "completion", f"expected text, got {type(comp).__name__}")
            rewards = {}
            for c in reward_cols:
                v = row[c]
                if v is None or not math.isfinite(float(v)):
                    continue  # TRL writes NaN for reward functions that do not apply
                rewards[c] = float(v)
            pid = "trl-" + _hid(ptext)
            prompts.setdefault(pid, Prompt(prompt_id=pid, task="trl", messages=msgs))
            k = counters[(step, pid)] = counters.get((step, pid), -1) + 1
            sig = {f"reward/{c}": v for c, v in rewards.items()}
            adv = row.get("advantage")
            if adv is not None and math.isfinite(float(adv)):
                sig["advantage"] = float(adv)
            rollouts.append(
                Rollout(
                    rollout_id="trl-" + _hid(run_id, f.name, i, ptext, comp),
                    run_id=run_id, step=step, policy_version=f"step-{step}", prompt_id=pid, group_id=f"{pid}@{step}",
                    sample_index=k, task="trl", messages=[*msgs, Message("assistant", comp)],
                    reward=float(sum(rewards.values())), signals=sig,
                    verifier={"name": "trl", "reward_functions": sorted(rewards)},
                    meta={"source": "trl", "file": f.name, "row": i}, **tok(ptext, comp),
                )
            )
    notes = [] if tokenizer is not None else ["TRL completion logs hold text only: imported without tokens"]
    return ImportResult("trl", [str(f) for f in files], rollouts, list(prompts.values()), notes)


def parse_areal(paths: list[str], run_id: str, tokenizer: Any | None = None) -> ImportResult:
    files = _files(paths, ("*.jsonl",))
    tok = _Tokenize(tokenizer)
    rollouts, prompts = [], {}
    for f in files:
        dir_version = f.parent.name
        for i, obj in _jsonl(f):
            w = f"line {i}"
            task_id = str(_req(obj, "task_id", (str, int), f, w))
            idx = _req(obj, "sample_idx", int, f, w)
            reward = _num(obj, "reward", f, w)
            prompt = _req(obj, "prompt", str, f, w)
            completion = _req(obj, "completion", str, f, w)
            head = obj.get("head_version")
            tail = obj.get("tail_version")
            rle = obj.get("version_rle")
            if rle is not None and (not isinstance(rle, list) or not all(isinstance(x, list) and len(x) == 2 for x in rle)):
                raise ImportFormatError(f, w, "version_rle", "expected a list of [version, n_tokens] pairs")
            if head is not None and tail is not None:
                pv = f"v{head}" if head == tail else f"v{head}-v{tail}"
            else:
                pv = f"v{dir_version}"
            step = int(tail if isinstance(tail, int) else (int(dir_version) if dir_version.isdigit() else 0))
            msgs = [Message("user", prompt)]
            segments = obj.get("segments")
            if segments is not None:
                if not isinstance(segments, list):
                    raise ImportFormatError(f, w, "segments", "expected a list of turns")
                for j, seg in enumerate(segments):
                    if not isinstance(seg, dict) or "role" not in seg:
                        raise ImportFormatError(f, w, f"segments[{j}]", "expected an object with 'role' and 'content'")
                    msgs.append(Message(str(seg["role"]), str(seg.get("content", seg.get("text", "")))))
            else:
                msgs.append(Message("assistant", completion))
            pid = f"areal-{task_id}"
            prompts.setdefault(pid, Prompt(prompt_id=pid, task="areal", messages=[Message("user", prompt)]))
            sig = {}
            if obj.get("original_reward") is not None:
                sig["original_reward"] = _num(obj, "original_reward", f, w)
            rollouts.append(
                Rollout(
                    rollout_id="areal-" + _hid(run_id, f.parent.name, f.name, i, task_id, idx),
                    run_id=run_id, step=step, policy_version=pv, prompt_id=pid, group_id=f"{pid}@{dir_version}",
                    sample_index=idx, task="areal", messages=msgs, reward=reward, signals=sig,
                    verifier={"name": "areal", "reward": reward},
                    meta={"source": "areal", "file": str(Path(f.parent.name) / f.name), "line": i,
                          "version_rle": rle, "seqlen": obj.get("seqlen"), "prompt_len": obj.get("prompt_len")},
                    **tok(prompt, completion),
                )
            )
    notes = [] if tokenizer is not None else ["AReaL dumps hold text only: imported without tokens"]
    return ImportResult("areal", [str(f) for f in files], rollouts, list(prompts.values()), notes)


def parse_prime_rl(paths: list[str], run_id: str, tokenizer: Any | None = None) -> ImportResult:
    """verifiers Episode lines: ``{"id", "env", "traces": [{"messages"|"nodes": [{"role", "content",
    "token_ids", "mask", "logprobs"}], "reward"}], "train": {"step", "policy": {"start", "end"}}}``.
    ``mask`` 1 marks model-sampled tokens (role 1); the others are context."""
    files = _files(paths, ("traces.jsonl",))
    rollouts, prompts = [], {}
    for f in files:
        for line, obj in _jsonl(f):
            w = f"line {line}"
            eid = str(_req(obj, "id", (str, int), f, w))
            env = str(obj.get("env", "prime-rl"))
            traces = _req(obj, "traces", list, f, w)
            train = obj.get("train") or {}
            step = train.get("step", obj.get("step", 0))
            if not isinstance(step, int) or step < 0:
                raise ImportFormatError(f, w, "train.step", f"expected an integer >= 0, got {step!r}")
            pol = train.get("policy") or {}
            pv = f"step-{pol.get('start', step)}" + (f"-{pol['end']}" if pol.get("end") not in (None, pol.get("start")) else "")
            for j, tr in enumerate(traces):
                tw = f"{w} traces[{j}]"
                if not isinstance(tr, dict):
                    raise ImportFormatError(f, tw, "-", "expected an object")
                nodes = tr.get("messages", tr.get("nodes"))
                if not isinstance(nodes, list) or not nodes:
                    raise ImportFormatError(f, tw, "messages", "missing or empty list of message nodes")
                ids: list[int] = []
                role: list[int] = []
                lps: list[float] = []
                msgs = []
                for k, m in enumerate(nodes):
                    mw = f"{tw} messages[{k}]"
                    if not isinstance(m, dict):
                        raise ImportFormatError(f, mw, "-", "expected an object")
                    t_ids = _req(m, "token_ids", list, f, mw)
                    mask = m.get("mask", [0] * len(t_ids))
                    lp = m.get("logprobs") or [0.0] * len(t_ids)
                    if not isinstance(mask, list) or len(mask) != len(t_ids):
                        raise ImportFormatError(f, mw, "mask", f"length {len(mask) if isinstance(mask, list) else '?'} != token_ids {len(t_ids)}")
                    if not isinstance(lp, list) or len(lp) != len(t_ids):
                        raise ImportFormatError(f, mw, "logprobs", f"length != token_ids {len(t_ids)}")
                    if not all(isinstance(x, int) and x >= 0 for x in t_ids):
                        raise ImportFormatError(f, mw, "token_ids", "expected non-negative integers")
                    ids.extend(t_ids)
                    role.extend(GENERATED if x else 0 for x in mask)
                    lps.extend(float(x) if mk else 0.0 for x, mk in zip(lp, mask, strict=True))
                    msgs.append(Message(str(_req(m, "role", str, f, mw)), str(m.get("content") or "")))
                reward = tr.get("reward", obj.get("reward", 0.0))
                if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
                    raise ImportFormatError(f, tw, "reward", f"expected a finite number, got {reward!r}")
                first_user = next((m for m in msgs if m.role in ("user", "system")), msgs[0])
                pid = "prime-" + _hid(env, first_user.content)
                prompts.setdefault(pid, Prompt(prompt_id=pid, task=env, messages=[m for m in msgs if m.role != "assistant"][:2]))
                sig = {}
                if isinstance(tr.get("advantage"), int | float):
                    sig["advantage"] = float(tr["advantage"])
                rollouts.append(
                    Rollout(
                        rollout_id="prime-" + _hid(run_id, f.parent, eid, j), run_id=run_id, step=step, policy_version=pv,
                        prompt_id=pid, group_id=f"{pid}@{step}", sample_index=j, task=env, messages=msgs,
                        token_ids=ids, token_role=role, logprobs=lps, reward=float(reward), signals=sig,
                        verifier={"name": "verifiers", "errors": obj.get("errors")},
                        meta={"source": "prime-rl", "episode": eid, "file": str(f), "line": line},
                        tokens_source="engine",
                    )
                )
    return ImportResult("prime-rl", [str(f) for f in files], rollouts, list(prompts.values()), [])


def parse_slime(paths: list[str], run_id: str, tokenizer: Any | None = None, trust_pickle: bool = False) -> ImportResult:
    try:
        import torch
    except ImportError as e:  # pragma: no cover - torch is in the [ml] extra
        raise StoreError("importing slime .pt dumps needs torch: pip install 'gfcr[ml]'") from e
    files = _files(paths, ("*.pt",))
    rollouts, prompts = [], {}

    def lst(v: Any) -> list:
        return v.tolist() if hasattr(v, "tolist") else list(v)

    for f in files:
        try:
            obj = torch.load(f, map_location="cpu", weights_only=not trust_pickle)
        except Exception as e:  # noqa: BLE001 - torch raises many types; report them all the same way
            if not trust_pickle and "weights_only" in str(e):
                raise ImportFormatError(
                    f, "file", "-",
                    "needs arbitrary unpickling (custom objects inside); refusing. Re-run with --trust-pickle "
                    "only if you trust this file: unpickling can execute code",
                ) from e
            raise ImportFormatError(f, "file", "-", f"cannot be loaded as a torch file: {e}") from e
        if not isinstance(obj, dict) or not isinstance(obj.get("samples"), list):
            raise ImportFormatError(f, "file", "samples", "expected a dict with a 'samples' list")
        rid = obj.get("rollout_id", 0)
        for i, s in enumerate(obj["samples"]):
            w = f"sample {i}"
            if not isinstance(s, dict):
                raise ImportFormatError(f, w, "-", "expected a dict (Sample.to_dict())")
            if "tokens" not in s:
                raise ImportFormatError(f, w, "tokens", "missing")
            tokens = [int(x) for x in lst(s["tokens"])]
            rlen = s.get("response_length")
            if not isinstance(rlen, int) or not (0 <= rlen <= len(tokens)):
                raise ImportFormatError(f, w, "response_length", f"expected an int in [0, {len(tokens)}], got {rlen!r}")
            plen = len(tokens) - rlen
            mask = [int(x) for x in lst(s.get("loss_mask") or [1] * rlen)]
            if len(mask) != rlen:
                raise ImportFormatError(f, w, "loss_mask", f"length {len(mask)} != response_length {rlen}")
            lp = [float(x) for x in lst(s.get("rollout_log_probs") or [0.0] * rlen)]
            if len(lp) != rlen:
                raise ImportFormatError(f, w, "rollout_log_probs", f"length {len(lp)} != response_length {rlen}")
            reward = s.get("reward")
            if isinstance(reward, dict):
                reward = reward.get("score", reward.get("reward"))
            if isinstance(reward, bool) or not isinstance(reward, int | float):
                raise ImportFormatError(f, w, "reward", f"expected a number, got {reward!r}")
            role = [0] * plen + [GENERATED if m else 0 for m in mask]
            lps = [0.0] * plen + [x if m else 0.0 for x, m in zip(lp, mask, strict=True)]
            versions = s.get("weight_versions") or []
            pv = "v" + "-".join(str(v) for v in sorted(set(lst(versions)))) if len(versions) else f"rollout-{rid}"
            prompt = s.get("prompt", "")
            ptext = prompt if isinstance(prompt, str) else json.dumps(prompt)
            msgs = [Message.coerce(m) for m in prompt] if isinstance(prompt, list) else [Message("user", ptext)]
            gi = s.get("group_index", i)
            pid = "slime-" + _hid(ptext)
            prompts.setdefault(pid, Prompt(prompt_id=pid, task="slime", messages=msgs,
                                           answer=None if s.get("label") is None else str(s.get("label"))))
            status = str(s.get("status", "completed")).lower().split(".")[-1]
            finish = {"completed": "stop", "truncated": "length", "aborted": "abort", "failed": "error"}.get(status, "unknown")
            rollouts.append(
                Rollout(
                    rollout_id="slime-" + _hid(run_id, f.name, rid, i, s.get("index", i)), run_id=run_id, step=int(rid),
                    policy_version=pv, prompt_id=pid, group_id=f"{pid}@{rid}#{gi}", sample_index=int(s.get("index", i)) if isinstance(s.get("index"), int) else i,
                    task="slime", messages=[*msgs, Message("assistant", str(s.get("response", "")))],
                    token_ids=tokens, token_role=role, logprobs=lps, finish_reason=finish, reward=float(reward),
                    verifier={"name": "slime", "label": s.get("label")},
                    meta={"source": "slime", "file": f.name, "rollout_id": rid, "sample": i,
                          "metadata": s.get("metadata") if isinstance(s.get("metadata"), dict) else None},
                    tokens_source="engine",
                )
            )
    return ImportResult("slime", [str(f) for f in files], rollouts, list(prompts.values()), [])


def parse_gfcr_jsonl(paths: list[str], run_id: str | None = None, tokenizer: Any | None = None) -> ImportResult:
    """gfcr's own JSONL (one rollout per line, as :func:`export` writes it)."""
    files = _files(paths, ("*.jsonl",))
    rows = []
    for f in files:
        for i, obj in _jsonl(f):
            rows.append((f, i, obj))
    rollouts = []
    for f, i, obj in rows:
        try:
            rollouts.append(_rollout_from_json(obj, run_id))
        except RecordError as e:
            raise ImportFormatError(f, f"line {i}", e.field, str(e)) from e
        except (KeyError, TypeError, ValueError) as e:
            fld = e.args[0] if isinstance(e, KeyError) else "-"
            raise ImportFormatError(f, f"line {i}", str(fld), f"missing or mistyped: {e}") from e
    return ImportResult("jsonl", [str(f) for f in files], rollouts, [], [])


def parse_gfcr_parquet(paths: list[str], run_id: str | None = None, tokenizer: Any | None = None) -> ImportResult:
    files = _files(paths, ("*.parquet",))
    rollouts = []
    for f in files:
        try:
            t = pq.read_table(f)
        except (pa.ArrowInvalid, OSError) as e:
            raise ImportFormatError(f, "file", "-", f"not a readable Parquet file: {e}") from e
        try:
            t = conform(t, ROLLOUT_SCHEMA, str(f))
            rs = table_to_rollouts(t)
            for j, r in enumerate(rs):
                try:
                    r.validate()
                except RecordError as e:
                    raise ImportFormatError(f, f"row {j}", e.field, str(e)) from e
                if run_id:
                    r.run_id = run_id
            rollouts.extend(rs)
        except RecordError as e:
            raise ImportFormatError(f, "schema", e.field, str(e)) from e
    return ImportResult("parquet", [str(f) for f in files], rollouts, [], [])


# ---------------------------------------------------------------------------------------------
# gfcr JSON rows
# ---------------------------------------------------------------------------------------------



def rollout_to_json(row: dict[str, Any]) -> dict[str, Any]:
    """One Arrow row (``to_pylist``) → a JSON-safe dict. float32 logprobs widen exactly to JSON
    doubles and narrow back to the same float32, so the round trip is bit-exact."""
    out = dict(row)
    out["created_at"] = row["created_at"].isoformat()
    out["signals"] = dict(row["signals"]) if isinstance(row["signals"], list) else row["signals"]
    for k in ("verifier", "sampling", "meta"):
        out[k] = json.loads(row[k])
    return out


def _rollout_from_json(obj: dict[str, Any], run_id: str | None) -> Rollout:
    from datetime import datetime

    lp = obj.get("logprobs")
    for key in ("rollout_id", "prompt_id", "token_ids", "token_role"):
        if key not in obj:
            raise RecordError(key, "missing")
    if not isinstance(lp, list) or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in lp):
        raise RecordError("logprobs", "expected a list of numbers")
    for key in ("token_ids", "token_role"):
        if not isinstance(obj[key], list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in obj[key]):
            raise RecordError(key, "expected a list of integers")
    kw = {k: obj[k] for k in ("step", "policy_version", "group_id", "sample_index", "parent_id", "branch_pos", "task",
                               "finish_reason", "reward", "verified", "verifier", "signals", "sampling", "cost",
                               "tokens_source", "meta") if k in obj and obj[k] is not None}
    if "step" in kw and (not isinstance(kw["step"], int) or isinstance(kw["step"], bool)):
        raise RecordError("step", f"expected an integer, got {kw['step']!r}")
    if "reward" in kw and (isinstance(kw["reward"], bool) or not isinstance(kw["reward"], int | float)):
        raise RecordError("reward", f"expected a number, got {kw['reward']!r}")
    if "created_at" in obj:
        kw["created_at"] = datetime.fromisoformat(obj["created_at"])
    r = Rollout(
        rollout_id=obj["rollout_id"], run_id=run_id or obj.get("run_id") or "", prompt_id=obj["prompt_id"],
        token_ids=obj["token_ids"], token_role=obj["token_role"], logprobs=lp,
        messages=obj.get("messages") or [], **kw,
    )
    return r.validate()


# ---------------------------------------------------------------------------------------------
# entry points
# ---------------------------------------------------------------------------------------------

FORMATS: dict[str, Callable[..., ImportResult]] = {
    "verl": parse_verl,
    "trl": parse_trl,
    "areal": parse_areal,
    "prime-rl": parse_prime_rl,
    "slime": parse_slime,
    "jsonl": parse_gfcr_jsonl,
    "parquet": parse_gfcr_parquet,
}


def import_rollouts(
    store: RolloutStore,
    fmt: str,
    paths: list[str],
    run_id: str | None = None,
    tokenizer: Any | str | None = None,
    trust_pickle: bool = False,
) -> ImportResult:
    """Parse and validate everything, then write: prompts (gold answers) first, then all rollouts in
    one commit. On any error nothing is written."""
    if fmt not in FORMATS:
        raise StoreError(f"unknown import format {fmt!r}; choose one of {sorted(FORMATS)}")
    if isinstance(tokenizer, str):
        tokenizer = load_tokenizer(tokenizer)
    run = run_id or f"import-{fmt}"
    kw: dict[str, Any] = {"tokenizer": tokenizer}
    if fmt == "slime":
        kw["trust_pickle"] = trust_pickle
    res = FORMATS[fmt](paths, run if fmt not in ("jsonl", "parquet") else run_id, **kw)
    for r in res.rollouts:
        try:
            r.validate()
        except RecordError as e:
            raise ImportFormatError(r.meta.get("file", paths[0]), f"record {r.rollout_id}", e.field, str(e)) from e
    table = rollouts_to_table(res.rollouts, validate=False)
    # Check everything that can refuse before the first write.
    ids = table.column("rollout_id").to_pylist()
    if len(set(ids)) != len(ids):
        raise StoreError("the input holds the same rollout twice (duplicate rollout_id); nothing was written")
    clash = store.existing_ids(ids)
    if clash:
        raise StoreError(
            f"{len(clash)} of these rollouts are already in the store (e.g. {sorted(clash)[0]!r}): "
            "this input was imported before; nothing was written"
        )
    if res.prompts:
        store.upsert_prompts(res.prompts)
    store.append(table, source=fmt)
    return res


def export(store: RolloutStore, fmt: str, out: str | os.PathLike[str], where: str | None = None) -> int:
    """Write rollouts (optionally those matching the DuckDB predicate ``where``) as gfcr JSONL or
    Parquet. Refuses to overwrite an existing file. Returns the number of rows written."""
    out = Path(out)
    if out.exists():
        raise StoreError(f"{out} exists; gfcr never overwrites outputs: choose a new path")
    if fmt not in ("jsonl", "parquet"):
        raise StoreError(f"unknown export format {fmt!r}; choose jsonl or parquet")
    t = store.sql(f"SELECT * FROM rollouts WHERE {where}") if where else store.scan()
    t = conform(t, ROLLOUT_SCHEMA, "export")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    if fmt == "parquet":
        pq.write_table(t, tmp)
    else:
        with open(tmp, "w", encoding="utf-8") as fh:
            for batch in t.to_batches(max_chunksize=1024):
                for row in batch.to_pylist():
                    fh.write(json.dumps(rollout_to_json(row), ensure_ascii=False) + "\n")
    os.replace(tmp, out)
    return t.num_rows
