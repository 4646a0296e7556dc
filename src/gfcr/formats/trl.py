"""TRL GRPO completion logs: ``{output_dir}/completions/completions_{global_step:05d}.parquet``.

Layout from the writer, ``GRPOTrainer.log`` (huggingface/trl @ f2cd5771,
``trl/trainer/grpo_trainer.py``): a pandas frame of ``step``, ``prompt``, ``completion``, one column
per reward function (``rewards_per_func``; NaN where a function returned None), every ``log_extra``
column, and ``advantage``. Reward-function columns and ``log_extra`` columns sit side by side with no
marker, so the reward columns and their weights come from the user (``reward_columns``,
``reward_weights``, as in ``GRPOConfig.reward_weights``); the reward is TRL's own
``nansum(weight * reward)``. With one numeric column besides ``step``/``advantage`` that column is
the reward; with several and no ``reward_columns`` the import refuses and lists them.

Mapping: reward columns → ``signals["reward/<name>"]``; every other numeric column →
``signals[<name>]`` (never summed); string and other columns → ``meta["extra"]``; ``advantage`` →
``signals["advantage"]``; a conversational ``completion`` (a list of messages) keeps each message
with its role, ``tool_calls`` and ``name``, so tool output stays a tool turn; ``step`` may be an
integer string (older TRL). ``verdict_key`` names a column whose value ``> 0`` means correct
(e.g. ``accuracy_reward``); without it ``verified`` is null. Lost: tokens (text decoded with
``skip_special_tokens=True``), log-probs, finish reason (null), group uid (rows of one prompt in one
step form the group).

Which step sampled a row, and rows logged twice (trl 1.16.0, ``trl/trainer/grpo_trainer.py``):
``GRPOTrainer.log`` writes the whole ``self._logs`` deque (``maxlen=generation_batch_size``: the
last generation batch) with ``step = self.state.global_step`` *at log time*, i.e. after that step's
optimizer update; the deque is filled only by ``_generate_and_score_completions``, which
``_prepare_inputs`` calls once every ``steps_per_generation * num_iterations`` micro-steps. So (1) a
batch sampled at global step ``g`` is first logged at step ``g + 1``: ``step`` and
``policy_version`` are the file's step − 1 (``step-0`` for the first batch, as the live recorder
stores it); with ``logging_steps > 1`` that is the latest step it can have been sampled at, and
``meta.sampled_step_range`` gives the bounds [previous log step, log step − 1]. (2) With
``num_iterations > 1`` (or ``steps_per_generation`` above gradient accumulation) a logging step with
no new generation writes the same deque again. Which files those are is read from the run's
config, never from content (a collapsed policy logs identical rows at consecutive steps too): the
``training_args.bin`` beside ``completions/`` (or in the newest ``checkpoint-*``), read without
executing the pickle (:func:`read_training_args`), and :func:`generation_of`; a re-logged file is
skipped (counted in a note). Without it nothing is dropped, and a note counts the rows equal to the
previous file's. Lengths: characters of prompt and completion (``meta.length_unit``; tokens when
retokenized). Ids and groups are scoped by the run's folder under the dump root (``SCOPE_STRIP``:
``completions/`` is not part of it), so two runs under one parent never share a group.
"""

from __future__ import annotations

import io
import json
import math
import pickle
import zipfile
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from gfcr.formats._common import (
    ImportFormatError,
    ImportResult,
    Tokenize,
    find_files,
    hid,
    opt_num,
    scoped,
    step_int,
    text_lengths,
    text_only_note,
)
from gfcr.records import Message, Prompt, Rollout

PATTERNS = ("completions_*.parquet",)
SCOPED = True  # ids and groups keyed by the run's folder under the dump root
SCOPE_STRIP = ("completions",)  # TRL's own subfolder of ``output_dir``: not part of the scope
#: the GRPOConfig fields that decide generation reuse (trl 1.16.0 ``GRPOTrainer._prepare_inputs``)
_REUSE_FIELDS = ("num_iterations", "steps_per_generation", "gradient_accumulation_steps", "logging_steps")
_STD = ("step", "prompt", "completion", "advantage")


def _messages(v: Any, f: Any, w: str, key: str) -> list[Message]:
    out = []
    for j, m in enumerate(v):
        if not isinstance(m, dict) or not m.get("role"):
            raise ImportFormatError(f, w, f"{key}[{j}]", "expected a message object with a 'role'")
        content = m.get("content")
        if isinstance(content, list):  # multimodal parts: keep the text parts
            content = "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
        tc = m.get("tool_calls")
        out.append(Message(role=str(m["role"]), content="" if content is None else str(content),
                           tool_calls=None if not tc else json.dumps(tc, sort_keys=True, default=str),
                           name=m.get("name")))
    return out


def _reward_columns(t: pa.Table, f: Any, reward_columns: list[str] | None) -> list[str]:
    numeric = [c for c in t.column_names if c not in _STD
               and (pa.types.is_floating(t.schema.field(c).type) or pa.types.is_integer(t.schema.field(c).type))]
    if reward_columns:
        for c in reward_columns:
            if c not in t.column_names:
                raise ImportFormatError(f, "schema", c, f"--reward-columns names a column this file lacks; "
                                        f"numeric columns: {numeric}")
        return list(reward_columns)
    if len(numeric) == 1:
        return numeric
    raise ImportFormatError(f, "schema", "-", f"cannot tell reward-function columns from log_extra columns among "
                            f"{numeric}: pass --reward-columns (and --reward-weights as in GRPOConfig)")


def _columns(row: dict[str, Any], names: list[str], weights: dict[str, float], f: Any, w: str
             ) -> tuple[float, bool, dict[str, float], dict[str, Any]]:
    """(reward = TRL's nansum of weight * reward column, any reward applied, signals, string extras)."""
    sig: dict[str, float] = {}
    extra: dict[str, Any] = {}
    reward, scored = 0.0, False
    for c in names:
        if c in ("step", "prompt", "completion"):
            continue
        v = row[c]
        if c in weights:
            x = opt_num(v, f, w, c)
            if x is not None:  # NaN: this reward function did not apply
                sig[f"reward/{c}"] = x
                reward += weights[c] * x
                scored = True
        elif isinstance(v, int | float) and not isinstance(v, bool):
            x = opt_num(v, f, w, c)
            if x is not None:
                sig[c] = x
        elif v is not None:
            extra[c] = v
    return reward, scored, sig, extra


def _log_step(f: Path) -> int | None:
    """The global step in TRL's file name ``completions_{global_step:05d}.parquet``."""
    n = f.stem.removeprefix("completions_")
    return int(n) if n.isdigit() else None


def _row_keys(t: pa.Table) -> list[str]:
    """Each row's content without the log-time ``step``: what two snapshots of one deque share."""
    rest = t.drop_columns([c for c in ("step",) if c in t.column_names])
    return [json.dumps(r, sort_keys=True, default=str) for r in rest.to_pylist()]


class _Inert:
    """Stands for every class a pickled ``GRPOConfig`` names: records its arguments and state,
    runs nothing (:func:`read_training_args` never imports or calls the pickle's classes)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        self.args, self.kw = args, kw

    def __setstate__(self, state: Any) -> None:
        self.state = state


class _InertUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return type(name, (_Inert,), {})

    def persistent_load(self, pid: Any) -> None:  # a tensor's storage: not needed for the config
        return None


def read_training_args(path: Path) -> dict[str, Any] | None:
    """The reuse-relevant fields (:data:`_REUSE_FIELDS`) of the ``training_args.bin`` that
    ``Trainer.save_model`` / a checkpoint writes (``torch.save`` of the ``GRPOConfig``: a zip holding
    ``*/data.pkl``), read without executing the pickle: every class it names becomes an inert
    record, so a hostile file cannot run code. None when the file cannot be read so."""
    try:
        with zipfile.ZipFile(path) as z:
            name = next((n for n in z.namelist() if n.endswith("/data.pkl")), None)
            if name is None:
                return None
            obj = _InertUnpickler(io.BytesIO(z.read(name))).load()
    except (OSError, zipfile.BadZipFile, pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError):
        return None
    state = getattr(obj, "state", None)
    if isinstance(state, tuple):  # (dict, slots) from __reduce_ex__
        state = state[0]
    if not isinstance(state, dict) or "num_iterations" not in state:
        return None
    return {k: state.get(k) for k in _REUSE_FIELDS}


def _training_args(f: Path) -> tuple[dict[str, Any] | None, Path | None]:
    """The run's config for a log file ``{output_dir}/completions/completions_N.parquet``: the
    ``training_args.bin`` in ``output_dir`` (``save_model``), else in its newest ``checkpoint-*``."""
    out = f.parent.parent if f.parent.name == "completions" else f.parent
    cands = [out / "training_args.bin", *sorted(out.glob("checkpoint-*/training_args.bin"),
                                                 key=lambda p: _ckpt(p.parent.name), reverse=True)]
    for c in cands:
        if c.is_file() and (cfg := read_training_args(c)) is not None:
            return cfg, c
    return None, None


def _ckpt(name: str) -> int:
    n = name.removeprefix("checkpoint-")
    return int(n) if n.isdigit() else -1


def generation_of(log_step: int, cfg: dict[str, Any]) -> int | None:
    """Which generation batch TRL's ``_logs`` deque holds when it writes the log of optimizer step
    ``log_step``: generation ``k`` happens at micro-step ``k * steps_per_generation *
    num_iterations`` (``_prepare_inputs``), and step ``s`` is logged after micro-step ``s * GA - 1``
    (GA = gradient accumulation), so ``floor((s * GA - 1) / (spg * ni))``. None when the config lacks
    a value. Example: GA 1, spg 1, ni 2 → steps 1, 2, 3, 4 hold generations 0, 0, 1, 1."""
    ga, spg, ni = cfg.get("gradient_accumulation_steps"), cfg.get("steps_per_generation"), cfg.get("num_iterations")
    if not all(isinstance(v, int) and v >= 1 for v in (ga, spg, ni)) or log_step < 1:
        return None
    return (log_step * ga - 1) // (spg * ni)


def _previous_log(f: Path) -> tuple[int | None, Counter[str]]:
    """(step, row keys) of the log file written just before ``f`` in its folder (none: (None, {}))."""
    s = _log_step(f)
    if s is None:
        return None, Counter()
    before = [(k, g) for g in f.parent.glob("completions_*.parquet") if (k := _log_step(g)) is not None and k < s]
    if not before:
        return None, Counter()
    k, g = max(before)
    try:
        return k, Counter(_row_keys(pq.read_table(g)))
    except (pa.ArrowInvalid, OSError):  # a damaged earlier file: it is refused when imported itself
        return k, Counter()


def _relogged(f: Path, log_step: int | None, prev_step: int | None) -> tuple[bool | None, Path | None]:
    """Whether log file ``f`` holds a generation batch an earlier logging step wrote already, from the
    run's config (:func:`generation_of`); None (unknown) without a readable ``training_args.bin``."""
    cfg, src = _training_args(f)
    if cfg is None or log_step is None:
        return None, None
    ls = cfg.get("logging_steps")
    prev = log_step - ls if isinstance(ls, int) and not isinstance(ls, bool) and ls >= 1 else prev_step
    if prev is None or prev < 1:
        return False, src
    g, h = generation_of(log_step, cfg), generation_of(prev, cfg)
    return (g is not None and g == h), src


def _rollout(row: dict[str, Any], i: int, f: Path, names: list[str], weights: dict[str, float],
             verdict_key: str | None, run_id: str, scope: str, log_step: int, prev_step: int | None,
             counters: dict[tuple[int, str], int], prompts: dict[str, Prompt], tok: Tokenize) -> Rollout:
    """One logged row → its rollout (its prompt added to ``prompts``; ``counters`` numbers the
    samples of one prompt in one step). Lengths: tokens when retokenized, else characters
    (``meta.length_unit``); TRL logs no finish reason (null)."""
    w = f"row {i}"
    step = max(log_step - 1, 0)  # logged after the update of the step that sampled it
    prompt = row["prompt"]
    if isinstance(prompt, list):  # conversational prompt
        pmsgs = _messages(prompt, f, w, "prompt")
        ptext = "\n".join(m.content for m in pmsgs)
    elif isinstance(prompt, str):
        pmsgs, ptext = [Message("user", prompt)], prompt
    else:
        raise ImportFormatError(f, w, "prompt", f"expected text or messages, got {type(prompt).__name__}")
    comp = row["completion"]
    if isinstance(comp, list):
        cmsgs = _messages(comp, f, w, "completion")
        ctext = "".join(m.content for m in cmsgs if m.role == "assistant")
    elif isinstance(comp, str):
        cmsgs, ctext = [Message("assistant", comp)], comp
    else:
        raise ImportFormatError(f, w, "completion", f"expected text or messages, got {type(comp).__name__}")
    reward, scored, sig, extra = _columns(row, names, weights, f, w)
    verified = None
    if verdict_key is not None:
        x = opt_num(row[verdict_key], f, w, verdict_key)
        verified = None if x is None else x > 0
    pid = "trl-" + hid(ptext)
    prompts.setdefault(pid, Prompt(prompt_id=pid, task="trl", messages=pmsgs))
    fname = scoped(scope, f.name)
    k = counters[(step, pid)] = counters.get((step, pid), -1) + 1
    if not scored:  # every reward function returned None: TRL itself logs the reward as NaN
        reward = None
    elif not math.isfinite(reward):
        raise ImportFormatError(f, w, "-", f"weighted reward is not finite ({reward})")
    toks = tok(ptext, ctext)
    cost, unit = text_lengths(ptext, ctext, toks)
    return Rollout(
        rollout_id="trl-" + hid(run_id, fname, i, ptext, json.dumps([m.to_dict() for m in cmsgs])),
        run_id=run_id, step=step, policy_version=f"step-{step}", prompt_id=pid,
        group_id=f"{scoped(scope, run_id, True)}/{pid}@{step}",
        sample_index=k, task="trl", messages=[*pmsgs, *cmsgs], reward=reward, verified=verified,
        finish_reason=None, signals=sig, cost=cost,
        verifier={"name": "trl", "reward_functions": weights, "scored": scored},
        meta={"source": "trl", "file": fname, "row": i, "extra": extra, "unscorable": not scored,
              "log_step": log_step, "sampled_step_range": [min(prev_step or 0, step), step], "length_unit": unit},
        **toks,
    )


def parse(paths: list[str], run_id: str, tokenizer: Any | None = None, reward_columns: list[str] | None = None,
          reward_weights: list[float] | None = None, verdict_key: str | None = None, scope: str = "",
          **_: Any) -> ImportResult:
    files = find_files(paths, PATTERNS)
    if reward_weights is not None and (not reward_columns or len(reward_weights) != len(reward_columns)):
        raise ImportFormatError(files[0] if files else paths[0], "options", "reward_weights",
                                "give one weight per --reward-columns entry")
    tok = Tokenize(tokenizer)
    rollouts, prompts = [], {}
    relogged = same_kept = 0
    cfg_src: Path | None = None
    for f in files:
        try:
            t = pq.read_table(f)
        except (pa.ArrowInvalid, OSError) as e:
            raise ImportFormatError(f, "file", "-", f"not a readable Parquet file: {e}") from e
        for col in ("step", "prompt", "completion"):
            if col not in t.column_names:
                raise ImportFormatError(f, "schema", col, "missing column")
        if t.num_rows == 0:
            raise ImportFormatError(f, "file", "-", "empty: no rows")
        rcols = _reward_columns(t, f, reward_columns)
        weights = dict(zip(rcols, reward_weights or [1.0] * len(rcols), strict=True))
        if verdict_key is not None and verdict_key not in t.column_names:
            raise ImportFormatError(f, "schema", verdict_key, "the verdict column is missing")
        counters: dict[tuple[int, str], int] = {}
        prev_step, prev_rows = _previous_log(f)
        again, src = _relogged(f, _log_step(f), prev_step)
        cfg_src = cfg_src or src
        keys = _row_keys(t)
        for i, row in enumerate(t.to_pylist()):
            w = f"row {i}"
            log_step = step_int(row["step"], f, w)
            if again:  # the config says: no generation since the last log; the deque written again
                relogged += 1
                continue
            if again is None and prev_rows[keys[i]] > 0:  # equal content alone proves no reuse: kept
                prev_rows[keys[i]] -= 1
                same_kept += 1
            rollouts.append(_rollout(row, i, f, t.column_names, weights, verdict_key, run_id, scope, log_step,
                                     prev_step, counters, prompts, tok))
    notes = text_only_note("TRL", tokenizer)
    if relogged:
        notes.append(f"skipped {relogged} row(s) that TRL logged again (no generation between two logging steps: "
                     f"num_iterations / steps_per_generation in {cfg_src})")
    if same_kept:
        notes.append(f"kept {same_kept} row(s) equal to a row of the previous log file: without the run's "
                     "training_args.bin gfcr cannot tell a re-logged batch (num_iterations > 1) from a policy that "
                     "repeats itself, and never drops rows by content alone")
    return ImportResult("trl", [str(f) for f in files], rollouts, list(prompts.values()), notes)
