"""slime ``--save-debug-rollout-data`` / ``--dump-details``: ``{rollout_id}.pt`` and ``eval_{rollout_id}.pt``.

Layout from the writer, ``save_debug_rollout_data`` (THUDM/slime @ 624b824a,
``slime/observability/rollout_data_utils.py``): ``torch.save({"rollout_id", "samples":
[Sample.to_dict()]})``; evaluation dumps go to ``eval_{rollout_id}.pt`` beside the training ones.
``Sample.to_dict`` (``slime/utils/types.py``) is the sample's ``__dict__`` with ``status`` as its
value: ``group_index``, ``index``, ``prompt``, ``tokens``, ``response``, ``response_length``,
``label``, ``reward`` (a float, or a dict from which ``--reward-key`` picks the training reward:
``Sample.get_reward_value``), ``loss_mask``, ``weight_versions``, ``rollout_log_probs``,
``remove_sample``, ``status`` (pending/completed/truncated/aborted/failed), ``metadata`` …

Mapping: ``tokens`` with the last ``response_length`` the response; role 1 where ``loss_mask`` is 1
(tool output inside the response stays context); ``rollout_log_probs`` on those tokens; reward =
``reward[reward_key]`` for a dict (every numeric entry also in ``signals["reward/<key>"]``);
``weight_versions`` → ``policy_version`` (``v3`` or ``v3-4``, sorted as numbers); ``status`` →
finish reason; ``label`` → the prompt's gold answer; ``remove_sample`` → ``meta.remove_sample``
(slime zeroes its loss mask when training; the tokens are kept as sampled); ``group_index`` →
group. ``eval_*.pt`` go to the run ``{run}-eval`` (or are skipped with ``evals="skip"``). A pickle:
``torch.load(weights_only=True)`` unless ``trust_pickle``. Lost: top-p token sets, routed experts,
multimodal inputs, teacher log-probs. RedNote's Relax (redai-infra/Relax @ 2765d18a,
``relax/utils/training/train_dump_utils.py`` ``save_debug_rollout_data``) writes the same layout
with its own ``Sample`` (``relax/utils/types.py``): also ``rollout_log_probs_mask`` (False where the
token and its behaviour log-prob no longer correspond: that log-prob is unknown, stored as 0 and
listed in ``meta.logprobs_missing_at``), ``decoded_tokens``, ``spec_info``, ``prefix_cache_info``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from gfcr.formats._common import (
    ImportFormatError,
    ImportResult,
    check_logprobs,
    eval_run,
    find_files,
    hid,
    load_weights_only,
    need_torch,
    norm_finish,
    step_int,
    token_ids,
)
from gfcr.records import GENERATED, Message, Prompt, Rollout

PATTERNS = ("*.pt",)


def _lst(v: Any) -> list:
    return v.tolist() if hasattr(v, "tolist") else list(v)


def _version_key(v: str) -> tuple:
    return (0, int(v), "") if str(v).lstrip("-").isdigit() else (1, 0, str(v))


def _reward(s: dict[str, Any], key: str | None, f: Path, w: str) -> tuple[float, dict[str, float]]:
    r = s.get("reward")
    sig: dict[str, float] = {}
    if isinstance(r, dict):
        for k, v in r.items():
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(float(v)):
                sig[f"reward/{k}"] = float(v)
        if key is None:
            raise ImportFormatError(f, w, "reward", f"a dict ({sorted(r)}): pass --reward-key (slime's --reward-key) "
                                    "to name the training reward")
        if key not in r:
            raise ImportFormatError(f, w, f"reward.{key}", f"missing; the reward dict has {sorted(r)}")
        r = r[key]
    elif key is not None and r is not None:
        raise ImportFormatError(f, w, "reward", f"--reward-key {key!r} given but the reward is a number ({r!r})")
    if isinstance(r, bool) or not isinstance(r, int | float) or not math.isfinite(float(r)):
        raise ImportFormatError(f, w, "reward" if key is None else f"reward.{key}", f"expected a finite number, got {r!r}")
    return float(r), sig


def _sample(s: Any, i: int, f: Path, rid: int, run: str, reward_key: str | None, vocab: int | None
            ) -> tuple[Rollout, Prompt]:
    w = f"sample {i}"
    if not isinstance(s, dict):
        raise ImportFormatError(f, w, "-", "expected a dict (Sample.to_dict())")
    if "tokens" not in s:
        raise ImportFormatError(f, w, "tokens", "missing")
    tokens = token_ids(_lst(s["tokens"]), f, w, "tokens", vocab)
    rlen = s.get("response_length")
    if isinstance(rlen, bool) or not isinstance(rlen, int) or not (0 <= rlen <= len(tokens)):
        raise ImportFormatError(f, w, "response_length", f"expected an int in [0, {len(tokens)}], got {rlen!r}")
    plen = len(tokens) - rlen
    mask = [int(x) for x in _lst(s.get("loss_mask") if s.get("loss_mask") is not None else [1] * rlen)]
    if len(mask) != rlen:
        raise ImportFormatError(f, w, "loss_mask", f"length {len(mask)} != response_length {rlen}")
    lp_raw = s.get("rollout_log_probs")
    lp = [0.0] * rlen
    missing: list[int] = []
    if lp_raw is not None:
        raw = _lst(lp_raw)
        if len(raw) != rlen:
            raise ImportFormatError(f, w, "rollout_log_probs", f"length {len(raw)} != response_length {rlen}")
        pair = s.get("rollout_log_probs_mask")  # Relax: False where token and behaviour log-prob no
        if pair is not None:  # longer correspond (relax/utils/types.py): that log-prob is unknown
            pair = [bool(x) for x in _lst(pair)]
            if len(pair) != rlen:
                raise ImportFormatError(f, w, "rollout_log_probs_mask", f"length {len(pair)} != response_length {rlen}")
            missing = [plen + j for j, (m, ok) in enumerate(zip(mask, pair, strict=True)) if m and not ok]
        sel = [j for j, m in enumerate(mask) if m and (pair is None or pair[j])]  # trained tokens' log-probs
        for j, x in zip(sel, check_logprobs([raw[j] for j in sel], len(sel), f, w, "rollout_log_probs"), strict=True):
            lp[j] = x
    reward, sig = _reward(s, reward_key, f, w)
    role = [0] * plen + [GENERATED if m else 0 for m in mask]
    lps = [0.0] * plen + [x if m else 0.0 for x, m in zip(lp, mask, strict=True)]
    versions = sorted({str(v) for v in _lst(s.get("weight_versions") or [])}, key=_version_key)
    pv = ("v" + versions[0] if len(versions) == 1 else f"v{versions[0]}-{versions[-1]}") if versions else "unknown"
    prompt = s.get("prompt", "")
    ptext = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True)
    msgs = [Message.coerce(m) for m in prompt] if isinstance(prompt, list) else [Message("user", ptext)]
    gi = s.get("group_index", i)
    pid = "slime-" + hid(ptext)
    label = s.get("label")
    p = Prompt(prompt_id=pid, task="slime", messages=msgs,
               answer=None if label is None else (label if isinstance(label, str) else json.dumps(label)))
    status = s.get("status")
    idx = s.get("index")
    r = Rollout(
        rollout_id="slime-" + hid(run, f.name, rid, i, idx, *tokens[-8:]), run_id=run, step=rid,
        policy_version=pv, prompt_id=pid, group_id=f"{run}/{pid}@{rid}#{gi}",
        sample_index=i if isinstance(idx, bool) or not isinstance(idx, int) or idx < 0 else idx,
        task="slime", messages=[*msgs, Message("assistant", str(s.get("response", "")))],
        token_ids=tokens, token_role=role, logprobs=lps, finish_reason=norm_finish(status), reward=reward,
        signals=sig, verifier={"name": "slime", "label": label, "reward_key": reward_key},
        meta={"source": "slime", "file": f.name, "rollout_id": rid, "sample": i, "index": idx,
              "remove_sample": bool(s.get("remove_sample", False)), "status": str(status),
              "weight_versions": versions, "logprobs_in_dump": lp_raw is not None,
              **({"logprobs_missing": len(missing), "logprobs_missing_at": missing} if missing else {}),
              "metadata": s.get("metadata") if isinstance(s.get("metadata"), dict) else None},
        tokens_source="engine",
    )
    return r, p


def parse(paths: list[str], run_id: str, tokenizer: Any | None = None, trust_pickle: bool = False,
          reward_key: str | None = None, evals: str = "separate", vocab: int | None = None, **_: Any) -> ImportResult:
    torch = need_torch("slime .pt dumps")
    files = find_files(paths, PATTERNS)
    rollouts, prompts = [], {}
    notes: list[str] = []
    n_removed = 0
    for f in files:
        is_eval = f.name.startswith("eval_")
        run = eval_run(run_id, is_eval, evals)
        if run is None:
            notes.append(f"skipped {f.name} (an evaluation dump; evals=skip)")
            continue
        if trust_pickle:
            try:
                obj = torch.load(f, map_location="cpu", weights_only=False)
            except Exception as e:  # noqa: BLE001 - torch raises many types; report them all the same way
                raise ImportFormatError(f, "file", "-", f"cannot be loaded as a torch file: {e}") from e
        else:
            obj = load_weights_only(torch, f, "custom objects inside")
        if not isinstance(obj, dict) or not isinstance(obj.get("samples"), list):
            raise ImportFormatError(f, "file", "samples", "expected a dict with a 'samples' list")
        if not obj["samples"]:
            raise ImportFormatError(f, "file", "samples", "empty: no samples")
        stem = f.stem.removeprefix("eval_")
        rid = step_int(obj.get("rollout_id", int(stem) if stem.isdigit() else None), f, "file", "rollout_id")
        for i, s in enumerate(obj["samples"]):
            r, p = _sample(s, i, f, rid, run, reward_key, vocab)
            r.meta["eval"] = is_eval
            n_removed += r.meta["remove_sample"]
            rollouts.append(r)
            prompts.setdefault(p.prompt_id, p)
        if is_eval:
            notes.append(f"{f.name}: evaluation samples imported into run {run}")
    if n_removed:
        notes.append(f"{n_removed} sample(s) have remove_sample=true (kept; meta.remove_sample)")
    return ImportResult("slime", [str(f) for f in files], rollouts, list(prompts.values()), notes)
