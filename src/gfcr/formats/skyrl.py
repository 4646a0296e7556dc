"""SkyRL ``trainer.dump_data_batch`` pickles (see :func:`parse`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from gfcr.formats._common import (
    ImportFormatError,
    ImportResult,
    check_id_array,
    check_logprobs,
    find_files,
    hid,
    load_weights_only,
    need_torch,
)
from gfcr.records import GENERATED, Message, Prompt, Rollout

PATTERNS = ("global_step_*_training_input.pkl",)


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


def _arrays(obj: dict[str, Any], f: Path, meta: dict[str, Any], vocab: int | None) -> dict[str, Any]:
    """The batch tensors as numpy, checked: shapes, token-id range, the real-row count (``n_real``)."""
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
    check_id_array(np.where(am != 0, seq, 0), f, "batch", "sequences", vocab)
    pad = meta.get("pad_size", 0) if isinstance(meta.get("pad_size", 0), int) else 0
    n_real = n_rows - pad
    if not 0 <= n_real <= n_rows:
        raise ImportFormatError(f, "metadata", "pad_size", f"expected an int in [0, {n_rows}], got {pad!r}")
    return {"arrs": arrs, "seq": seq, "am": am, "n_rows": n_rows, "width": width, "resp_w": resp_w, "n_real": n_real}


def _group_keys(meta: dict[str, Any], rows: list[tuple], n_real: int) -> list[str]:
    """Group of each row: ``uids`` if kept, else SkyRL's per-prompt boundaries, else consecutive
    rows with the same prompt tokens."""
    uids = meta.get("uids")
    bounds = meta.get("policy_prompt_boundaries")
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
    return keys


def parse(paths: list[str], run_id: str, tokenizer: Any | None = None, trust_pickle: bool = False,
          vocab: int | None = None, **_: Any) -> ImportResult:
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
    dumping, so then the reward is stored as null (unknown, never 0.0) with ``meta["reward_in_dump"] = False`` (a note says
    so) and groups come from ``metadata["policy_prompt_boundaries"]`` or, failing that, from
    consecutive rows with the same prompt tokens. The last ``metadata["pad_size"]`` rows are
    data-parallel padding copies and are skipped. No policy version is recorded: it is set to
    ``step-{N}`` (under fully-async training the sampler may be older). No text: messages are
    decoded only when a tokenizer is given.

    Long because: one pass over one dump, checks and mapping kept in the order of the layout; the
    array checks and the grouping are in ``_arrays`` and ``_group_keys``.
    """
    torch = need_torch("SkyRL .pkl dumps")
    files = find_files(paths, PATTERNS)
    rollouts, prompts = [], {}
    notes: list[str] = []
    for f in files:
        if not trust_pickle:
            obj = load_weights_only(torch, f, "SkyRL pickles its own TrainingInputBatch class, which a "
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
        b = _arrays(obj, f, meta, vocab)
        arrs, seq, am, width, resp_w, n_real = (b[k] for k in ("arrs", "seq", "am", "width", "resp_w", "n_real"))
        lp_key = "rollout_logprobs" if "rollout_logprobs" in arrs else ("action_log_probs" if "action_log_probs" in arrs else None)
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
            resp = slice(width - resp_w, width)  # checked in the dump's own columns: rollout_logprobs[i, j]
            check_logprobs(np.where(gen[resp], lp_full[resp], 0.0), resp_w, f, w, lp_key or "logprobs")
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
            reward = float(arrs["rewards"][i][resp_sel].astype(np.float64).sum()) if "rewards" in arrs else None
            if reward is not None and not math.isfinite(reward):
                raise ImportFormatError(f, w, "rewards", "must be finite")
            rows.append((i, ids, role, lps, prompt_ids, reward, sig))
        keys = _group_keys(meta, rows, n_real)
        if "rewards" not in arrs:
            notes.append(f"{f.name}: no 'rewards' in the dump (SkyRL removes them before dumping): reward stored as "
                         "null (unknown), meta.reward_in_dump=false; the advantage is kept in signals")
        if lp_key == "action_log_probs":
            notes.append(f"{f.name}: no rollout_logprobs: logprobs are the trainer's action_log_probs")
        counters: dict[str, int] = {}
        for (i, ids, role, lps, prompt_ids, reward, sig), key in zip(rows, keys, strict=True):
            pid = "skyrl-" + hid(*prompt_ids.tolist())
            msgs: list[Message] = []
            if tokenizer is not None:
                msgs = [Message("user", tokenizer.decode(prompt_ids.tolist())),
                        Message("assistant", tokenizer.decode(ids[role == GENERATED].tolist()))]
            prompts.setdefault(pid, Prompt(prompt_id=pid, task="skyrl", messages=msgs[:1],
                                           meta={"source": "skyrl", "prompt_token_ids": prompt_ids.tolist()}))
            k = counters[key] = counters.get(key, -1) + 1
            rollouts.append(
                Rollout(
                    rollout_id="skyrl-" + hid(run_id, f.name, i), run_id=run_id, step=step,
                    policy_version=f"step-{step}", prompt_id=pid, group_id=f"{run_id}/{pid}@{step}#{key}", sample_index=k,
                    task="skyrl", messages=msgs, token_ids=ids, token_role=role, logprobs=lps, reward=reward,
                    finish_reason=None,
                    signals=sig, verifier={"name": "skyrl", "reward_in_dump": "rewards" in arrs},
                    meta={"source": "skyrl", "file": str(f), "row": i, "reward_in_dump": "rewards" in arrs,
                          "logprobs_from": lp_key},
                    tokens_source="engine",
                )
            )
    return ImportResult("skyrl", [str(f) for f in files], rollouts, list(prompts.values()), notes)
