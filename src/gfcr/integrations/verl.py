"""gfcr inside verl: a ``DataProto`` batch → store writer, the way back, and a trainer hook.

Read against verl 0.9.1 (``verl/protocol.py``, ``verl/trainer/ppo/ray_trainer.py``,
``verl/utils/model.py``). After ``compute_advantage`` a PPO/GRPO batch holds, per row:

- ``prompts`` (B, P) left-padded and ``responses`` (B, R) right-padded token ids; ``input_ids`` =
  their concatenation; ``attention_mask`` (B, P+R) marks real tokens; ``position_ids`` =
  ``clip(cumsum(attention_mask) - 1, 0)`` (``compute_position_id_with_mask``);
- ``response_mask`` (B, R): 1 on LLM-generated tokens, 0 on tool/env tokens and padding;
- per-token floats over the response: ``old_log_probs`` (the trainer's recomputation),
  ``rollout_log_probs`` (the engine's, when the rollout returns them), ``ref_log_prob``, ``values``,
  ``token_level_scores`` (the reward function's score, on the last token), ``token_level_rewards``
  (scores minus the in-reward KL penalty), ``advantages``, ``returns``;
- ``non_tensor_batch``: ``uid`` (the GRPO group), ``data_source``, ``reward_model``
  (``ground_truth``), ``extra_info``, ``raw_prompt``, ``request_id``…; ``meta_info``: e.g.
  ``temperature``, ``global_steps`` (also ``trainer.global_steps``).

Mapping into a rollout row: ``token_ids`` = the real prompt tokens then the real response tokens;
``token_role`` = 0 on the prompt, ``response_mask`` on the response; ``logprobs`` =
``rollout_log_probs`` (behaviour) when present, else ``old_log_probs``, on role-1 tokens (0 elsewhere;
``meta["logprobs_from"]`` names the source). A NaN there is an unknown log-prob, never 0: the row's
``meta["logprobs_from"]`` is then null (its log-probs are not the source's; the ``logprobs``
column cannot hold a null, so it has 0 at those positions), ``meta["logprobs_unknown"]`` lists the
positions (in ``token_ids``), and the NaN is kept as null in ``meta["verl"]["per_token"]`` (read
back as NaN by :func:`rollouts_to_batch`); ``reward`` = the sum of ``token_level_rewards``;
``signals["advantage"]`` = the mean advantage over role-1 tokens, ``signals["score"]`` = the sum of
``token_level_scores``; ``verified`` = verl's ``acc`` reward-extra value when given (else null), read as the importer reads it
(:func:`gfcr.formats.verl.verdict_of`: a bool as is, a number ``> 0`` correct, since verl's
reward loop sets ``acc = score`` for a float scorer); ``finish_reason`` null (the batch does not
record it);
``step`` = ``global_steps``; ``policy_version`` = ``"step-<global_steps>"``; ``group_id`` from ``uid``;
``prompt_id`` = ``prompt_id`` / ``index`` of ``extra_info`` when present, else a hash of the prompt
tokens. Every 2-D per-token field (whatever its name) is kept exactly, over the row's real
positions, in ``meta["verl"]["per_token"]``; the non-tensor values (JSON-safe) and ``meta_info`` in
``meta["verl"]``; the padded widths and dtypes too, so :func:`rollouts_to_batch` rebuilds the
batch: every field equal on real positions; padding is rebuilt as verl makes it (pad id in token
fields, 0 in masks and per-token floats, ``position_ids`` by verl's formula). Values verl leaves
at padded positions of unmasked fields (``old_log_probs``, ``values``, ``ref_log_prob``) are not
kept.

What verl's own ``trainer.rollout_data_dir`` dump lacks and this keeps: token ids (its dump holds
text decoded with ``skip_special_tokens=True``), the response mask (tool vs model tokens),
log-probs, advantages, per-token rewards, groups (``uid``) and the prompt's gold answer.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from gfcr.records import Cost, Message, Prompt, Rollout, json_safe, new_id

from .writer import StepBatch, StepWriter

TESTED_VERL = "0.9.1"
TOKEN_FIELDS = ("prompts", "responses", "input_ids", "attention_mask", "position_ids")


def _np(v: Any) -> np.ndarray:
    return v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v)


def _dtype_name(v: Any) -> str:
    return str(v.dtype).removeprefix("torch.")


def _tensors(batch: Any) -> dict[str, Any]:
    """Tensor fields of a DataProto (``batch.batch``, a TensorDict) or of a plain dict."""
    td = getattr(batch, "batch", batch)
    if td is None:
        return {}
    return {k: td[k] for k in list(td.keys())}


def _scalar(x: Any) -> Any:
    return x.item() if hasattr(x, "item") and getattr(x, "ndim", 1) == 0 else x


def _prompt_id(prompt_tokens: np.ndarray, extra_info: Any) -> str:
    if isinstance(extra_info, dict):
        for k in ("prompt_id", "index"):
            if extra_info.get(k) is not None:
                return f"verl-{extra_info[k]}"
    return "verl-" + hashlib.sha1(np.asarray(prompt_tokens, np.int64).tobytes()).hexdigest()[:16]


def dataproto_to_rollouts(batch: Any, run_id: str, global_steps: int | None = None,
                          reward_extra_info: dict[str, Sequence[Any]] | None = None,
                          tokenizer: Any = None) -> tuple[list[Rollout], list[Prompt]]:
    """Rollouts (and their prompts) of one verl batch; see the module docstring for the mapping.

    Long because: verl's batch layout, field by field: the checks, then the per-row mapping in the order of
    the module docstring's table.

    ``batch``: a ``verl.DataProto`` (or anything with ``.batch``, ``.non_tensor_batch``,
    ``.meta_info``); ``global_steps``: the trainer's step (default ``meta_info["global_steps"]``);
    ``reward_extra_info``: the reward manager's extra values per row (``acc`` becomes ``verified``);
    ``tokenizer``: optional, to decode ``messages``.
    """
    from gfcr.formats.verl import verdict_of  # the dump importer's rule, one for both paths

    t = {k: _np(v) for k, v in _tensors(batch).items()}
    raw = _tensors(batch)
    nt = dict(getattr(batch, "non_tensor_batch", None) or {})
    meta_info = dict(getattr(batch, "meta_info", None) or {})
    for k in ("prompts", "responses", "attention_mask", "response_mask"):
        if k not in t:
            raise ValueError(f"verl batch has no '{k}' tensor; record it after the rollout (and after "
                             f"compute_advantage for advantages)")
    if global_steps is None:
        global_steps = meta_info.get("global_steps")
    if global_steps is None:
        raise ValueError("no global step: pass global_steps= (the trainer's self.global_steps) or set "
                         "meta_info['global_steps']")
    step = int(global_steps)
    prompts, responses, am = t["prompts"], t["responses"], t["attention_mask"]
    B, P = prompts.shape
    R = responses.shape[1]
    if am.shape != (B, P + R) or t["response_mask"].shape != (B, R):
        raise ValueError(f"verl batch shapes disagree: prompts {prompts.shape}, responses {responses.shape}, "
                         f"attention_mask {am.shape}, response_mask {t['response_mask'].shape}")
    widths = {P + R: "full", R: "response", P: "prompt"}
    per_token_fields = {k: widths[v.shape[1]] for k, v in t.items()
                        if k not in TOKEN_FIELDS and v.ndim == 2 and v.shape[0] == B and v.shape[1] in widths}
    row_fields = [k for k, v in t.items() if k not in TOKEN_FIELDS and v.ndim == 1 and v.shape[0] == B]
    skipped = sorted(set(t) - set(TOKEN_FIELDS) - set(per_token_fields) - set(row_fields))
    pad_id = _pad_id(prompts, responses, am, P)
    lp_key = "rollout_log_probs" if "rollout_log_probs" in t else ("old_log_probs" if "old_log_probs" in t else None)
    extra = {k: list(v) for k, v in (reward_extra_info or {}).items() if len(v) == B}
    dtypes = getattr(batch, "dtypes", None) or {k: _dtype_name(v) for k, v in raw.items()}
    rollouts, prompt_recs = [], {}
    sample_of: dict[str, int] = {}
    for i in range(B):
        preal, rreal = am[i, :P] != 0, am[i, P:] != 0
        p_ids, r_ids = prompts[i][preal].astype(np.int32), responses[i][rreal].astype(np.int32)
        role = (t["response_mask"][i][rreal] != 0).astype(np.int8)
        real = {"full": am[i] != 0, "response": rreal, "prompt": preal}
        per_token = {k: _nan_null(_np(t[k][i][real[lay]]).tolist()) for k, lay in per_token_fields.items()}
        lp = np.zeros(len(r_ids), np.float32)
        unknown: list[int] = []
        if lp_key is not None:
            v = t[lp_key][i][rreal].astype(np.float32)
            bad = (role == 1) & np.isnan(v)  # verl's NaN: no log-prob for that token (unknown, not 0)
            unknown = (np.flatnonzero(bad) + len(p_ids)).tolist()
            lp = np.where((role == 1) & ~bad, np.minimum(v, 0.0), 0.0).astype(np.float32)
        nti = {k: json_safe(_scalar(v[i])) for k, v in nt.items()}
        ex = {k: json_safe(_scalar(v[i])) for k, v in extra.items()}
        sig = {}
        if "advantages" in t and role.any():
            sig["advantage"] = float(t["advantages"][i][rreal][role == 1].astype(np.float64).mean())
        if "token_level_scores" in t:
            sig["score"] = float(t["token_level_scores"][i][rreal].astype(np.float64).sum())
        for k, v in ex.items():
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
                sig[f"extra/{k}"] = float(v)
        reward = float(t["token_level_rewards"][i][rreal].astype(np.float64).sum()) if "token_level_rewards" in t \
            else sig.get("score", 0.0)
        acc = ex.get("acc")
        try:  # verl sets acc = score for a float scorer: -1 is a wrong answer, not bool(-1) = True
            verified = verdict_of(acc)
        except ValueError as e:
            raise ValueError(f"verl batch row {i}: reward_extra_info['acc']: {e}") from e
        pid = _prompt_id(p_ids, nti.get("extra_info"))
        gt = (nti.get("reward_model") or {}).get("ground_truth") if isinstance(nti.get("reward_model"), dict) else None
        msgs: list[Message] = []
        if tokenizer is not None:
            msgs = [Message("user", tokenizer.decode(p_ids.tolist())),
                    Message("assistant", tokenizer.decode(r_ids.tolist()))]
        prompt_recs.setdefault(pid, Prompt(
            prompt_id=pid, task=str(nti.get("data_source") or "verl"), messages=msgs[:1],
            answer=None if gt is None else (gt if isinstance(gt, str) else json.dumps(gt)),
            meta={"source": "verl-live", "prompt_token_ids": p_ids.tolist()}))
        uid = nti.get("uid")
        gid = f"{run_id}/{step}/{uid}" if uid is not None else f"{run_id}/{pid}@{step}"
        k = sample_of[gid] = sample_of.get(gid, -1) + 1
        rollouts.append(Rollout(
            rollout_id=new_id(), run_id=run_id, step=step, policy_version=f"step-{step}", prompt_id=pid,
            group_id=gid, sample_index=k, task=str(nti.get("data_source") or "verl"), messages=msgs,
            token_ids=np.concatenate([p_ids, r_ids]), token_role=np.concatenate([np.zeros(len(p_ids), np.int8), role]),
            logprobs=np.concatenate([np.zeros(len(p_ids), np.float32), lp]), finish_reason=None,
            reward=reward, verified=verified,
            verifier={"name": "verl", "reward_extra_info": ex} if ex else {"name": "verl"},
            signals=sig, sampling={"engine": "verl", "temperature": json_safe(meta_info.get("temperature"))},
            cost=Cost(prompt_tokens=len(p_ids), gen_tokens=int(role.sum())), tokens_source="engine",
            meta={"source": "verl-live", "logprobs_from": None if unknown else lp_key,
                  **({"logprobs_unknown": unknown} if unknown else {}), "verl": {
                "row": i, "prompt_width": P, "response_width": R, "pad_token_id": pad_id,
                "n_prompt": int(preal.sum()), "per_token": per_token, "layout": per_token_fields,
                "per_row": {k: json_safe(_scalar(t[k][i])) for k in row_fields}, "dtypes": dtypes,
                "non_tensor": nti, "meta_info": json_safe(meta_info), "skipped": skipped}},
        ))
    return rollouts, list(prompt_recs.values())


def _nan_null(v: list[Any]) -> list[Any]:
    """A per-token list with each NaN (unknown) as None, so the stored JSON says null. Example:
    ``[-0.5, nan, 0.0]`` → ``[-0.5, None, 0.0]``; ints pass unchanged."""
    return [None if isinstance(x, float) and x != x else x for x in v]


def _pad_id(prompts: np.ndarray, responses: np.ndarray, am: np.ndarray, P: int) -> int | None:
    pads = np.concatenate([prompts[am[:, :P] == 0], responses[am[:, P:] == 0]])
    return int(pads[0]) if pads.size else None


def rollouts_to_batch(rollouts: Sequence[Rollout], pad_token_id: int | None = None) -> dict[str, Any]:
    """The verl batch the rollouts were recorded from: ``{"tensors": {name: np.ndarray},
    "non_tensors": {name: np.ndarray(object)}, "meta_info": dict}`` in the original row order.

    All rollouts must come from one recorded batch (same widths). ``pad_token_id`` is used when the
    recorded batch had no padding to read it from. Build a ``DataProto`` with :func:`to_dataproto`.
    """
    rs = sorted(rollouts, key=lambda r: r.meta["verl"]["row"])
    if not rs:
        raise ValueError("no rollouts to rebuild a verl batch from")
    v0 = rs[0].meta.get("verl")
    if v0 is None:
        raise ValueError(f"rollout {rs[0].rollout_id} was not recorded from verl (no meta['verl'])")
    P, R = v0["prompt_width"], v0["response_width"]
    if any(r.meta["verl"]["prompt_width"] != P or r.meta["verl"]["response_width"] != R for r in rs):
        raise ValueError("rollouts come from batches of different widths; rebuild one recorded batch at a time")
    pad = v0["pad_token_id"] if v0["pad_token_id"] is not None else pad_token_id
    if pad is None:
        pad = 0
    B = len(rs)
    dt = v0["dtypes"]
    prompts = np.full((B, P), pad, _npdt(dt.get("prompts", "int64")))
    responses = np.full((B, R), pad, _npdt(dt.get("responses", "int64")))
    am = np.zeros((B, P + R), _npdt(dt.get("attention_mask", "int64")))
    fields: dict[str, np.ndarray] = {}
    width = {"full": P + R, "response": R, "prompt": P}
    for k, lay in v0["layout"].items():
        fields[k] = np.zeros((B, width[lay]), _npdt(dt.get(k, "float32")))
    row_vals: dict[str, list[Any]] = {k: [] for k in v0["per_row"]}
    for i, r in enumerate(rs):
        v = r.meta["verl"]
        n_p = v["n_prompt"]
        ids = np.asarray(r.token_ids)
        n_r = len(ids) - n_p
        prompts[i, P - n_p:] = ids[:n_p]
        responses[i, :n_r] = ids[n_p:]
        am[i, P - n_p: P + n_r] = 1
        real = {"full": am[i] != 0, "response": am[i, P:] != 0, "prompt": am[i, :P] != 0}
        for k, lay in v0["layout"].items():
            fields[k][i][real[lay]] = np.asarray(v["per_token"][k], fields[k].dtype)
        for k in row_vals:
            row_vals[k].append(v["per_row"][k])
    tensors = {"prompts": prompts, "responses": responses, "input_ids": np.concatenate([prompts, responses], 1),
               "attention_mask": am}
    if "position_ids" in dt:
        tensors["position_ids"] = np.clip(np.cumsum(am, axis=-1) - 1, 0, None).astype(_npdt(dt["position_ids"]))
    tensors.update(fields)
    for k, vals in row_vals.items():
        tensors[k] = np.asarray(vals, _npdt(dt.get(k, "float32")))
    non_tensors = {k: _object_array([r.meta["verl"]["non_tensor"][k] for r in rs]) for k in v0["non_tensor"]}
    return {"tensors": {k: v for k, v in tensors.items() if k in dt}, "non_tensors": non_tensors,
            "meta_info": dict(v0["meta_info"])}


def _npdt(name: str) -> np.dtype:
    return np.dtype({"bfloat16": "float32"}.get(name, name))


def _object_array(vals: list[Any]) -> np.ndarray:
    out = np.empty(len(vals), dtype=object)
    for i, v in enumerate(vals):
        out[i] = v
    return out


def to_dataproto(rebuilt: dict[str, Any]) -> Any:
    """A ``verl.DataProto`` from :func:`rollouts_to_batch`'s output (needs verl and torch)."""
    import torch
    from verl import DataProto

    tensors = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in rebuilt["tensors"].items()}
    return DataProto.from_dict(tensors=tensors, non_tensors=rebuilt["non_tensors"], meta_info=rebuilt["meta_info"])


# ---------------------------------------------------------------------------------------------
# Live recording
# ---------------------------------------------------------------------------------------------


class VerlRecorder:
    """Records verl batches into a store off the trainer's thread, one commit per step.

    Call it where a batch is complete (after ``compute_advantage``)::

        recorder = VerlRecorder(RolloutStore.open(path, create=True), run_id="ppo-1")
        recorder(batch, global_steps=self.global_steps, reward_extra_info=reward_extra_infos_dict)

    On the calling thread it only copies the batch's tensors to numpy; the records are built and
    committed by a background :class:`~gfcr.integrations.writer.StepWriter`.
    """

    def __init__(self, store: Any, run_id: str, max_pending: int = 4, tokenizer: Any = None,
                 tracker: Callable[[int, list[Any]], None] | None = None):
        if not run_id:
            raise ValueError("run_id must be a non-empty string")
        self.store, self.run_id, self.tokenizer = store, run_id, tokenizer
        self.writer = StepWriter(store, max_pending=max_pending, name="gfcr-verl-writer", tracker=tracker)

    def __call__(self, batch: Any, global_steps: int | None = None,
                 reward_extra_info: dict[str, Sequence[Any]] | None = None) -> None:
        meta_info = dict(getattr(batch, "meta_info", None) or {})
        step = int(global_steps if global_steps is not None else meta_info.get("global_steps", -1))
        if step < 0:
            raise ValueError("no global step: pass global_steps=")
        snap = _Snapshot({k: _np(v).copy() for k, v in _tensors(batch).items()},
                         {k: np.array(v, copy=True) for k, v in (getattr(batch, "non_tensor_batch", None) or {}).items()},
                         meta_info, {k: _dtype_name(v) for k, v in _tensors(batch).items()})
        extra = {k: list(v) for k, v in (reward_extra_info or {}).items()}

        def job() -> StepBatch:
            rs, ps = dataproto_to_rollouts(snap, self.run_id, step, extra, self.tokenizer)
            return StepBatch(step, rs, ps)

        self.writer.submit(step, job)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class _Snapshot:
    """A DataProto's content copied to numpy, with the original tensors' dtype names."""

    def __init__(self, tensors: dict[str, np.ndarray], non_tensors: dict[str, np.ndarray],
                 meta_info: dict[str, Any], dtypes: dict[str, str]):
        self.batch = tensors
        self.non_tensor_batch = non_tensors
        self.meta_info = meta_info
        self.dtypes = dtypes




def install_hook(trainer_cls: Any = None, store: str | None = None, run_id: str | None = None) -> Any:
    """Make verl's ``RayPPOTrainer`` (or ``trainer_cls``) record every training batch into a store.

    Wraps ``_log_rollout_data``, which verl calls after the actor update with the full batch when
    ``trainer.rollout_data_dir`` is set: the original dump still runs, then the batch goes to a
    :class:`VerlRecorder`. The store path and run id come from the arguments, else the trainer
    config ``trainer.gfcr.store`` / ``trainer.gfcr.run_id`` (Hydra: ``+trainer.gfcr.store=...``),
    else the environment variables ``GFCR_STORE`` / ``GFCR_RUN_ID``. Returns the patched class.
    Idempotent.
    """
    if trainer_cls is None:
        from verl.trainer.ppo.ray_trainer import RayPPOTrainer as trainer_cls  # noqa: N813
    if getattr(trainer_cls._log_rollout_data, "_gfcr", False):
        return trainer_cls
    orig = trainer_cls._log_rollout_data

    def _log_rollout_data(self, batch, reward_extra_infos_dict, timing_raw, rollout_data_dir):  # noqa: ANN001
        orig(self, batch, reward_extra_infos_dict, timing_raw, rollout_data_dir)
        rec = getattr(self, "_gfcr_recorder", None)
        if rec is None:
            rec = self._gfcr_recorder = _recorder_from(self, store, run_id)
        rec(batch, global_steps=self.global_steps, reward_extra_info=reward_extra_infos_dict)

    _log_rollout_data._gfcr = True
    trainer_cls._log_rollout_data = _log_rollout_data
    return trainer_cls


def _recorder_from(trainer: Any, store: str | None, run_id: str | None) -> VerlRecorder:
    from gfcr.store import RolloutStore

    cfg = getattr(getattr(trainer, "config", None), "trainer", None)
    g = cfg.get("gfcr", None) if hasattr(cfg, "get") else None
    path = store or (g.get("store") if g is not None else None) or os.environ.get("GFCR_STORE")
    rid = run_id or (g.get("run_id") if g is not None else None) or os.environ.get("GFCR_RUN_ID")
    if not path:
        raise ValueError("gfcr verl hook: no store path; set +trainer.gfcr.store=PATH or GFCR_STORE")
    if not rid:
        exp = getattr(cfg, "experiment_name", None) if cfg is not None else None
        rid = str(exp or "verl")
    return VerlRecorder(RolloutStore.open(path, create=True), rid, tokenizer=getattr(trainer, "tokenizer", None))


__all__ = ["VerlRecorder", "dataproto_to_rollouts", "install_hook", "rollouts_to_batch", "to_dataproto",
           "TESTED_VERL"]
