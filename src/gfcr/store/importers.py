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
- ``roll``: RLVR ``rollout_dump_dir`` ``rollout_dump_data.step_{N}.jsonl`` (one columnar line per
  step: ``responses``, ``scores``, ``prompt``/``messages``, ``ground_truth``, ``global_step``…). Text only.
- ``skyrl``: ``dumped_data/global_step_{N}_training_input.pkl`` (pickled ``TrainingInputBatch``:
  ``sequences``, ``attention_mask``, ``loss_mask``/``response_mask``, ``rollout_logprobs``,
  ``advantages``) — exact tokens; a pickle, so only with ``trust_pickle=True``.
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
import warnings
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


def _load_weights_only(torch: Any, f: Path, why: str) -> Any:
    """``torch.load(f, weights_only=True)``; a file that needs arbitrary unpickling is refused with
    ``why`` and the ``--trust-pickle`` hint (unpickling can execute code)."""
    try:
        with warnings.catch_warnings():  # torch warns about the pickle protocol before refusing
            warnings.simplefilter("ignore", UserWarning)
            return torch.load(f, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises many types; report them all the same way
        if "weights_only" in str(e):
            raise ImportFormatError(
                f, "file", "-",
                f"needs arbitrary unpickling ({why}); refusing. Re-run with --trust-pickle only if you trust this "
                "file: unpickling can execute code",
            ) from e
        raise ImportFormatError(f, "file", "-", f"cannot be loaded as a torch file: {e}") from e


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
        if trust_pickle:
            try:
                obj = torch.load(f, map_location="cpu", weights_only=False)
            except Exception as e:  # noqa: BLE001 - torch raises many types; report them all the same way
                raise ImportFormatError(f, "file", "-", f"cannot be loaded as a torch file: {e}") from e
        else:
            obj = _load_weights_only(torch, f, "custom objects inside")
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


# ROLL --------------------------------------------------------------------------------------------

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


def parse_roll(paths: list[str], run_id: str, tokenizer: Any | None = None) -> ImportResult:
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
    files = _files(paths, ("rollout_dump_data.step_*.jsonl",))
    tok = _Tokenize(tokenizer)
    rollouts, prompts = [], {}
    for f in files:
        counters: dict[tuple[int, str], int] = {}
        fstep = f.name.removeprefix("rollout_dump_data.step_").removesuffix(".jsonl")
        for i, obj in _jsonl(f):
            for j, row in enumerate(_roll_rows(obj, f, f"line {i}")):
                w = f"line {i} response {j}"
                out = _req(row, "responses", str, f, w)
                score = _num(row, "scores", f, w)
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
                pid = "roll-" + _hid(row.get("id"), ptext)
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
                        rollout_id="roll-" + _hid(run_id, f.name, i, j, ptext, out),
                        run_id=run_id, step=step, policy_version=f"step-{step}", prompt_id=pid,
                        group_id=f"{pid}@{step}", sample_index=k, task="roll",
                        messages=[*msgs, Message("assistant", out)], reward=score, finish_reason="unknown",
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


# SkyRL -------------------------------------------------------------------------------------------

_SKYRL_BATCH_CLASSES = ("TrainingInputBatch", "TensorBatch", "TrainingOutputBatch")


class _SkyRLBatch(dict):
    """Reads SkyRL's pickled ``TensorBatch`` (a dict of tensors plus ``metadata``) without SkyRL
    installed. Two pickle layouts: the current one, whose ``__reduce__`` hands a state dict
    ``{"batch_dict": {key: {"format": "numpy", "data", "shape", "dtype"} | {"format": "torch",
    "data"} | {"format": "tensor_list", "items"} | None}, "batch_size", "device", "metadata"}`` to a
    module-level rebuild function; and the older plain dict-subclass pickle (items, then
    ``__dict__`` with ``metadata``)."""

    metadata: dict[str, Any] | None = None

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "batch_dict" in state:
            for key, value in state["batch_dict"].items():
                if value is not None and value.get("format") == "tensor_list":
                    value = [_skyrl_tensor(v) for v in value["items"]]
                elif value is not None:
                    value = _skyrl_tensor(value)
                self[key] = value
        self.metadata = state.get("metadata")


class _SkyRLOpaque:
    """Stand-in for SkyRL classes gfcr does not read (e.g. ``TensorList`` of image patches)."""

    def __setstate__(self, state: Any) -> None:
        self.state = state


def _skyrl_tensor(value: dict[str, Any]) -> Any:
    import io

    import torch

    if value.get("format") == "torch":
        return torch.load(io.BytesIO(value["data"]), weights_only=True)
    arr = np.frombuffer(value["data"], dtype=np.dtype(value["dtype"])).reshape(value["shape"])
    return torch.from_numpy(arr.copy())


def _skyrl_rebuild(cls: Any, state: dict[str, Any]) -> _SkyRLBatch:
    obj = _SkyRLBatch()
    obj.__setstate__(state)
    return obj


def _skyrl_unpickle(path: Path) -> Any:
    """Trusted load: SkyRL's batch classes (``skyrl.backends.skyrl_train.training_batch`` now,
    ``skyrl_train.training_batch`` before) map to :class:`_SkyRLBatch`; everything else resolves as
    plain pickle would."""
    import pickle

    class _Unpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            if module.split(".")[-1] == "training_batch":
                if name in _SKYRL_BATCH_CLASSES:
                    return _SkyRLBatch
                if name == "_rebuild_tensor_batch":
                    return _skyrl_rebuild
                if name == "TensorList":
                    return _SkyRLOpaque
            return super().find_class(module, name)

    with open(path, "rb") as fh:
        return _Unpickler(fh).load()


def _np(v: Any) -> np.ndarray:
    return v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v)


def parse_skyrl(paths: list[str], run_id: str, tokenizer: Any | None = None, trust_pickle: bool = False) -> ImportResult:
    """SkyRL's ``trainer.dump_data_batch``: ``{export_path}/dumped_data/global_step_{N}_training_input.pkl``.

    Layout read from ``NovaSky-AI/SkyRL`` @ a9564572: ``skyrl/train/trainer.py`` (``dump_data``,
    called after ``compute_advantages_and_returns``), ``skyrl/backends/skyrl_train/training_batch.py``
    (``TensorBatch.save`` = ``pickle.dump``; ``TrainingInput`` fields) and
    ``skyrl/train/dataset/preprocess.py`` (``convert_prompts_responses_to_batch_tensors``). A pickled
    ``TrainingInputBatch``: ``sequences``/``attention_mask`` ``(B, L)``, left-padded;
    ``response_mask``, ``loss_mask``, ``rollout_logprobs``, ``action_log_probs``, ``advantages``,
    ``rewards`` ``(B, R)``, aligned with the last ``R`` columns of ``sequences``. Mapping: real
    tokens = ``attention_mask == 1``; role 1 exactly where ``loss_mask`` (else ``response_mask``) is 1;
    logprobs = ``rollout_logprobs`` (else ``action_log_probs``, the trainer's recomputation) on role-1
    tokens, 0 elsewhere; reward = sum of ``rewards`` over the response (SkyRL's own sequence score),
    ``signals["advantage"]`` = mean advantage over role-1 tokens; step from the file name.

    Departures forced by the dump: the stock trainer pops ``rewards`` and ``metadata["uids"]`` before
    dumping, so then the reward is stored as 0.0 with ``meta["reward_in_dump"] = False`` (a note says
    so) and groups come from ``metadata["policy_prompt_boundaries"]`` or, failing that, from
    consecutive rows with the same prompt tokens. The last ``metadata["pad_size"]`` rows are
    data-parallel padding copies and are skipped. No policy version is recorded: it is set to
    ``step-{N}`` (under fully-async training the sampler may be older). No text: messages are
    decoded only when a tokenizer is given.
    """
    try:
        import torch
    except ImportError as e:  # pragma: no cover - torch is in the [ml] extra
        raise StoreError("importing SkyRL .pkl dumps needs torch: pip install 'gfcr[ml]'") from e
    files = _files(paths, ("global_step_*_training_input.pkl",))
    rollouts, prompts = [], {}
    notes: list[str] = []
    for f in files:
        if not trust_pickle:
            obj = _load_weights_only(torch, f, "SkyRL pickles its own TrainingInputBatch class, which a "
                                               "weights-only load cannot rebuild")
        else:
            try:
                obj = _skyrl_unpickle(f)
            except Exception as e:  # noqa: BLE001 - unpickling raises many types; report them all the same way
                raise ImportFormatError(f, "file", "-", f"cannot be unpickled ({type(e).__name__}: {e}); "
                                        "truncated or not a SkyRL training-input dump?") from e
        if not isinstance(obj, dict):
            raise ImportFormatError(f, "file", "-", f"expected a SkyRL TrainingInputBatch (dict of tensors), "
                                    f"got {type(obj).__name__}")
        meta = getattr(obj, "metadata", None) or {}
        base = f.name.removeprefix("global_step_").removesuffix("_training_input.pkl")
        step = int(base) if base.isdigit() else meta.get("global_step")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ImportFormatError(f, "file name", "global_step",
                                    "no step: expected global_step_{N}_training_input.pkl or metadata['global_step']")
        arrs: dict[str, np.ndarray] = {}
        for key in ("sequences", "attention_mask", "response_mask", "loss_mask", "rollout_logprobs",
                    "action_log_probs", "advantages", "rewards"):
            v = obj.get(key)
            if v is None:
                continue
            if not hasattr(v, "shape") or len(v.shape) != 2:
                raise ImportFormatError(f, "batch", key, f"expected a 2-D tensor, got {type(v).__name__} "
                                        f"{tuple(getattr(v, 'shape', ()))}")
            arrs[key] = _np(v)
        for key in ("sequences", "attention_mask"):
            if key not in arrs:
                raise ImportFormatError(f, "batch", key, "missing")
        seq, am = arrs["sequences"], arrs["attention_mask"]
        if am.shape != seq.shape:
            raise ImportFormatError(f, "batch", "attention_mask", f"shape {am.shape} != sequences {seq.shape}")
        if "response_mask" not in arrs and "loss_mask" not in arrs:
            raise ImportFormatError(f, "batch", "response_mask", "missing (and no loss_mask either)")
        n_rows, width = seq.shape
        resp_w = (arrs.get("response_mask") if "response_mask" in arrs else arrs["loss_mask"]).shape[1]
        for key in ("response_mask", "loss_mask", "rollout_logprobs", "action_log_probs", "advantages", "rewards"):
            if key in arrs and arrs[key].shape != (n_rows, resp_w):
                raise ImportFormatError(f, "batch", key, f"shape {arrs[key].shape} != ({n_rows}, {resp_w}) "
                                        "(batch, response width)")
        if resp_w > width:
            raise ImportFormatError(f, "batch", "response_mask", f"response width {resp_w} > sequence width {width}")
        if np.any(seq < 0):
            raise ImportFormatError(f, "batch", "sequences", "token ids must be >= 0")
        pad = meta.get("pad_size", 0) if isinstance(meta.get("pad_size", 0), int) else 0
        n_real = n_rows - pad
        if not 0 <= n_real <= n_rows:
            raise ImportFormatError(f, "metadata", "pad_size", f"expected an int in [0, {n_rows}], got {pad!r}")
        lp_key = "rollout_logprobs" if "rollout_logprobs" in arrs else ("action_log_probs" if "action_log_probs" in arrs else None)
        # group of each row: uids if kept, else prompt boundaries, else consecutive equal prompt tokens
        uids = meta.get("uids")
        bounds = meta.get("policy_prompt_boundaries")
        rows = []
        for i in range(n_real):
            w = f"row {i}"
            real = am[i] != 0
            rmask = np.zeros(width, bool)
            rmask[width - resp_w:] = (arrs["response_mask"][i] if "response_mask" in arrs else arrs["loss_mask"][i]) != 0
            gen = np.zeros(width, bool)
            gen[width - resp_w:] = (arrs["loss_mask"][i] if "loss_mask" in arrs else arrs["response_mask"][i]) != 0
            gen &= rmask & real
            lp_full = np.zeros(width, np.float32)
            if lp_key is not None:
                lp_full[width - resp_w:] = arrs[lp_key][i].astype(np.float32)
            lps = np.where(gen, lp_full, np.float32(0.0))[real].astype(np.float32)
            if not np.all(np.isfinite(lps)) or np.any(lps > 1e-4):
                raise ImportFormatError(f, w, lp_key or "-", "log-probs on generated tokens must be finite and <= 0")
            ids = seq[i][real].astype(np.int32)
            role = gen[real].astype(np.int8)
            prompt_ids = seq[i][real & ~rmask].astype(np.int32)
            if len(ids) == 0:
                raise ImportFormatError(f, w, "attention_mask", "row has no real tokens")
            resp_cols = slice(width - resp_w, width)
            resp_sel = rmask[resp_cols] & real[resp_cols]
            sig = {}
            if "advantages" in arrs and gen.any():
                sig["advantage"] = float(arrs["advantages"][i][gen[resp_cols]].astype(np.float64).mean())
            reward = float(arrs["rewards"][i][resp_sel].astype(np.float64).sum()) if "rewards" in arrs else 0.0
            if not math.isfinite(reward):
                raise ImportFormatError(f, w, "rewards", "must be finite")
            rows.append((i, ids, role, lps, prompt_ids, reward, sig))
        if uids is not None and len(uids) >= n_real:
            keys = [str(uids[i]) for i in range(n_real)]
        elif isinstance(bounds, list) and bounds:
            keys = [""] * n_real
            for b, se in enumerate(bounds):
                s, e = int(se[0]), int(se[1])
                for i in range(s, min(e, n_real)):
                    keys[i] = f"b{b}"
        else:
            keys = []
            for i, r in enumerate(rows):
                same = i > 0 and np.array_equal(rows[i - 1][4], r[4])
                keys.append(keys[-1] if same else f"g{i}")
        if "rewards" not in arrs:
            notes.append(f"{f.name}: no 'rewards' in the dump (SkyRL removes them before dumping): reward stored as "
                         "0.0, meta.reward_in_dump=false; the advantage is kept in signals")
        if lp_key == "action_log_probs":
            notes.append(f"{f.name}: no rollout_logprobs: logprobs are the trainer's action_log_probs")
        counters: dict[str, int] = {}
        for (i, ids, role, lps, prompt_ids, reward, sig), key in zip(rows, keys, strict=True):
            pid = "skyrl-" + _hid(*prompt_ids.tolist())
            msgs: list[Message] = []
            if tokenizer is not None:
                msgs = [Message("user", tokenizer.decode(prompt_ids.tolist())),
                        Message("assistant", tokenizer.decode(ids[role == GENERATED].tolist()))]
            prompts.setdefault(pid, Prompt(prompt_id=pid, task="skyrl", messages=msgs[:1],
                                           meta={"source": "skyrl", "prompt_token_ids": prompt_ids.tolist()}))
            k = counters[key] = counters.get(key, -1) + 1
            rollouts.append(
                Rollout(
                    rollout_id="skyrl-" + _hid(run_id, f.name, i), run_id=run_id, step=step,
                    policy_version=f"step-{step}", prompt_id=pid, group_id=f"{pid}@{step}#{key}", sample_index=k,
                    task="skyrl", messages=msgs, token_ids=ids, token_role=role, logprobs=lps, reward=reward,
                    finish_reason="unknown",
                    signals=sig, verifier={"name": "skyrl", "reward_in_dump": "rewards" in arrs},
                    meta={"source": "skyrl", "file": str(f), "row": i, "reward_in_dump": "rewards" in arrs,
                          "logprobs_from": lp_key},
                    tokens_source="engine",
                )
            )
    return ImportResult("skyrl", [str(f) for f in files], rollouts, list(prompts.values()), notes)


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
    "roll": parse_roll,
    "skyrl": parse_skyrl,
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
    if fmt in ("slime", "skyrl"):
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


def refuse_existing(out: str | os.PathLike[str]) -> Path:
    """``out`` as a Path; a :class:`StoreError` when it exists (exports never overwrite)."""
    out = Path(out)
    if out.exists():
        raise StoreError(f"{out} exists; gfcr never overwrites outputs: choose a new path")
    return out


def write_new_file(out: Path, write: Callable[[Path], None]) -> None:
    """Have ``write`` fill a temp file next to ``out``, then rename it into place; a failure leaves
    neither ``out`` nor the temp file behind."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.partial-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


def export(store: RolloutStore, fmt: str, out: str | os.PathLike[str], where: str | None = None) -> int:
    """Write rollouts (optionally those matching the DuckDB predicate ``where``) as gfcr JSONL or
    Parquet. Refuses to overwrite an existing file. Returns the number of rows written."""
    out = refuse_existing(out)
    if fmt not in ("jsonl", "parquet"):
        raise StoreError(f"unknown export format {fmt!r}; choose jsonl or parquet")
    t = store.sql(f"SELECT * FROM rollouts WHERE {where}") if where else store.scan()
    t = conform(t, ROLLOUT_SCHEMA, "export")

    def write(tmp: Path) -> None:
        if fmt == "parquet":
            pq.write_table(t, tmp)
            return
        with open(tmp, "w", encoding="utf-8") as fh:
            for batch in t.to_batches(max_chunksize=1024):
                for row in batch.to_pylist():
                    fh.write(json.dumps(rollout_to_json(row), ensure_ascii=False) + "\n")

    write_new_file(out, write)
    return t.num_rows
