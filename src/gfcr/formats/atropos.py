"""Atropos scored groups: the JSONL an environment writes with ``data_path_to_save_groups``.

Layout from the writer (NousResearch/atropos @ 296a0bc5, ``atroposlib/envs/base.py``):
``BaseEnv`` opens ``jsonlines.open(data_path_to_save_groups, "w")`` (``_1``, ``_2`` … appended to
the stem when the file exists) and writes each valid ``ScoredDataGroup`` as one line: ``tokens``
``[[int]]`` (one full sequence per sample), ``masks`` ``[[int]]`` (``-100`` on tokens not trained
on, the token id itself on trained ones), ``scores`` ``[float]``, and the optional ``advantages``
``[[float]]`` (per token), ``ref_logprobs``, ``messages`` ``[[{role, content}]]``,
``generation_params``, ``inference_logprobs`` ``[[float]]`` (per token, ``1.0`` on prompt positions:
``ManagedServer._create_sequence_node`` in ``atroposlib/envs/server_handling/managed_server.py``),
``group_overrides``, ``overrides`` ``[dict]``, ``images``, ``distill_token_ids`` /
``distill_logprobs``.

Mapping: one rollout per sample; ``token_ids`` = ``tokens[i]``; role 1 where ``masks[i] != -100``
(and then it must equal the token); ``logprobs`` = ``inference_logprobs[i]`` on role-1 tokens
(checked finite and <= 0), 0 on context (the ``1.0`` placeholder is not a log-prob); a generated
position holding ``1.0`` is ManagedServer's padding for a log-prob the server did not return
(``_create_sequence_node`` pads a short list with ``1.0``): unknown, stored as 0 and listed in
``meta.logprobs_missing`` (count) / ``logprobs_missing_at`` (positions); ``reward`` =
``scores[i]``; ``signals["advantage"]`` = the mean of ``advantages[i]`` over role-1 tokens;
``messages`` = ``messages[i]`` (else empty); one group per line (``group_id`` from run, file and
line), ``sample_index`` = ``i``. Lost: the dump records no training step and no policy version
(step 0 with ``meta.step_in_dump = false``, ``policy_version`` ``unknown``), no finish reason (null,
unless ``overrides[i].finish_reason``), no verdict (null); ``ref_logprobs``, ``generation_params``,
group/sample overrides → ``meta``; images and distillation top-k are not kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gfcr.formats._common import (
    ImportFormatError,
    ImportResult,
    check_logprobs,
    find_files,
    hid,
    norm_finish,
    opt_num,
    read_jsonl,
    req,
    token_ids,
)
from gfcr.records import Message, Prompt, Rollout

PATTERNS = ("*.jsonl",)
MASKED = -100
PAD = 1.0  # ManagedServer's log-prob on prompt positions and on generated ones the server left out


def _per_sample(obj: dict[str, Any], key: str, n: int, f: Path, w: str) -> list[Any] | None:
    v = obj.get(key)
    if v is None:
        return None
    if not isinstance(v, list) or len(v) != n:
        raise ImportFormatError(f, w, key, f"expected a list of {n} entries (one per sample), got "
                                f"{len(v) if isinstance(v, list) else type(v).__name__}")
    return v


def _sample(obj: dict[str, Any], i: int, f: Path, w: str, run_id: str, line: int, vocab: int | None
            ) -> tuple[Rollout, Prompt]:
    sw = f"{w} sample {i}"
    ids = token_ids(obj["tokens"][i], f, sw, "tokens", vocab)
    mask = obj["masks"][i]
    if not isinstance(mask, list) or len(mask) != len(ids):
        raise ImportFormatError(f, sw, "masks", f"length {len(mask) if isinstance(mask, list) else '?'} != tokens {len(ids)}")
    gen = [m != MASKED for m in mask]
    bad = next((j for j, (m, t) in enumerate(zip(mask, ids, strict=True)) if m != MASKED and m != t), None)
    if bad is not None:
        raise ImportFormatError(f, sw, f"masks[{bad}]", f"expected -100 or the token id {ids[bad]}, got {mask[bad]!r}")
    lp = [0.0] * len(ids)
    inf = obj.get("inference_logprobs")
    missing: list[int] = []
    if inf:
        row = inf[i]
        if not isinstance(row, list) or len(row) != len(ids):
            raise ImportFormatError(f, sw, "inference_logprobs", f"expected {len(ids)} values (one per token)")
        # ManagedServer pads the log-probs the server did not return with 1.0 (_create_sequence_node):
        # unknown, never a probability; stored as 0 and counted, as a missing log-prob is elsewhere
        missing = [j for j, g in enumerate(gen) if g and row[j] == PAD and not isinstance(row[j], bool)]
        sel = [j for j, g in enumerate(gen) if g and j not in set(missing)]
        for j, x in zip(sel, check_logprobs([row[j] for j in sel], len(sel), f, sw, "inference_logprobs"), strict=True):
            lp[j] = x
    score = opt_num(obj["scores"][i], f, sw, "scores")
    sig: dict[str, float] = {}
    adv = obj.get("advantages")
    if adv:
        a = adv[i]
        if not isinstance(a, list) or len(a) != len(ids):
            raise ImportFormatError(f, sw, "advantages", f"expected {len(ids)} values (one per token)")
        vals = [opt_num(x, f, sw, "advantages") for x, g in zip(a, gen, strict=True) if g]
        vals = [v for v in vals if v is not None]
        if vals:
            sig["advantage"] = float(np.mean(vals))
    msgs = []
    mm = obj.get("messages")
    if mm:
        if not isinstance(mm[i], list):
            raise ImportFormatError(f, sw, "messages", "expected a list of {role, content} objects")
        for k, m in enumerate(mm[i]):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise ImportFormatError(f, sw, f"messages[{k}]", "expected a {role, content} object")
            msgs.append(Message.coerce(m))
    ov = (obj.get("overrides") or [None] * (i + 1))[i]
    ctx = [t for t, g in zip(ids, gen, strict=True) if not g][: next((j for j, g in enumerate(gen) if g), len(ids))]
    pid = "atropos-" + hid(*ctx)
    r = Rollout(
        rollout_id="atropos-" + hid(run_id, f.name, line, i), run_id=run_id, prompt_id=pid,
        group_id=f"{run_id}/atropos-{hid(f.name, line)}", sample_index=i, task="atropos", step=0,
        policy_version="unknown", messages=msgs, token_ids=ids, token_role=[1 if g else 0 for g in gen], logprobs=lp,
        finish_reason=norm_finish(ov.get("finish_reason")) if isinstance(ov, dict) else None,
        reward=score, verified=None, signals=sig, verifier={"name": "atropos"},
        sampling=obj.get("generation_params") if isinstance(obj.get("generation_params"), dict) else {},
        tokens_source="engine",
        meta={"source": "atropos", "file": f.name, "line": line, "sample": i, "step_in_dump": False,
              "logprobs_in_dump": bool(inf), "overrides": ov,
              **({"logprobs_missing": len(missing), "logprobs_missing_at": missing} if missing else {}), "group_overrides": obj.get("group_overrides"),
              "ref_logprobs": (obj.get("ref_logprobs") or [None] * (i + 1))[i]},
    )
    first_gen = next((k for k, m in enumerate(msgs) if m.role == "assistant"), len(msgs))
    return r, Prompt(prompt_id=pid, task="atropos", messages=msgs[:first_gen], meta={"prompt_token_ids": ctx})


def parse(paths: list[str], run_id: str, tokenizer: Any | None = None, vocab: int | None = None,
          **_: Any) -> ImportResult:
    files = find_files(paths, PATTERNS)
    rollouts, prompts = [], {}
    for f in files:
        for line, obj in read_jsonl(f):
            w = f"line {line}"
            toks = req(obj, "tokens", list, f, w)
            n = len(toks)
            for key in ("masks", "scores"):
                req(obj, key, list, f, w)
                _per_sample(obj, key, n, f, w)
            for key in ("advantages", "inference_logprobs", "messages", "overrides", "ref_logprobs"):
                _per_sample(obj, key, n, f, w)
            for i in range(n):
                r, p = _sample(obj, i, f, w, run_id, line, vocab)
                rollouts.append(r)
                prompts.setdefault(p.prompt_id, p)
    notes = ["Atropos groups record no training step or policy version: step 0 (meta.step_in_dump=false), "
             "policy_version 'unknown'"]
    return ImportResult("atropos", [str(f) for f in files], rollouts, list(prompts.values()), notes)
