"""Stored rollouts where teams already look: per-step numbers and a sample of rollouts, pushed to an
experiment tracker (trackio, local-first; W&B when the user has it).

What is pushed, per (run, step) of the store:

* scalars under ``gfcr/<name>``: the step's own metrics, :func:`gfcr.store.stepstats.summarize` over its
  rows (``n_rollouts``, ``reward_mean``, ``verified_rate``, ``zero_var_share``, ``len_mean``,
  ``trunc_rate``, ...): the names and numbers of the training progress bar and ``gfcr report``;
* one table ``gfcr/rollouts`` of at most ``samples`` rollouts drawn at random from the step (seeded),
  one row each: ``step``, ``rollout_id``, ``prompt_id``, ``task``, ``prompt`` (the last user turn),
  ``completion`` (the assistant text), ``reward``, ``verified``, ``finish_reason``, ``gen_tokens``.
  Unknown values stay null.

:func:`push_store` does it for a stored run (``gfcr store push``); :class:`TrackerHook` does it for
each step a live recorder commits (:class:`~gfcr.integrations.writer.StepWriter`'s ``tracker``).
Trackers are found by name (:data:`TRACKERS`); the tracker packages are imported only when used.
Text is cut to ``max_chars`` per cell so that a tracker's table stays small.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from gfcr.records import Rollout, assistant_text, rollouts_to_table
from gfcr.store.stepstats import FEATURE_COLUMNS, STEP_COLUMNS, summarize

#: the columns of the pushed rollout table, in order
COLUMNS = ["step", "rollout_id", "prompt_id", "task", "prompt", "completion", "reward", "verified",
           "finish_reason", "gen_tokens"]
#: the per-step scalars pushed (``gfcr/<name>``): the step's own metrics, as the report names them
SCALARS = STEP_COLUMNS


class Tracker(Protocol):
    """An experiment tracker run: scalars and tables at a step, then ``finish``."""

    def log(self, values: dict[str, Any], step: int) -> None: ...
    def log_table(self, name: str, columns: list[str], rows: list[list[Any]], step: int) -> None: ...
    def finish(self) -> None: ...


class TrackioTracker:
    """A trackio run (``trackio.init(project, name)``); logs go to trackio's local database
    (``TRACKIO_DIR``) unless the user's trackio settings say otherwise."""

    def __init__(self, project: str, run: str | None = None, config: dict[str, Any] | None = None):
        try:
            import trackio
        except ImportError as e:
            raise ImportError("pushing to trackio needs the trackio package: pip install trackio") from e
        self._trackio = trackio
        self.run = trackio.init(project=project, name=run, config=config or {})

    def log(self, values: dict[str, Any], step: int) -> None:
        self.run.log(values, step=step)

    def log_table(self, name: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        self.run.log({name: self._trackio.Table(columns=columns, data=rows)}, step=step)

    def finish(self) -> None:
        self.run.finish()


class WandbTracker:
    """A Weights & Biases run (``wandb.init(project, name)``); needs ``wandb`` installed and the
    user's own W&B set-up (``WANDB_MODE=offline`` works without a network)."""

    def __init__(self, project: str, run: str | None = None, config: dict[str, Any] | None = None):
        try:
            import wandb
        except ImportError as e:
            raise ImportError("pushing to W&B needs the wandb package: pip install wandb") from e
        self._wandb = wandb
        self.run = wandb.init(project=project, name=run, config=config or {})

    def log(self, values: dict[str, Any], step: int) -> None:
        self.run.log(values, step=step)

    def log_table(self, name: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        self.run.log({name: self._wandb.Table(columns=columns, data=rows)}, step=step)

    def finish(self) -> None:
        self.run.finish()


#: tracker name -> class (``gfcr store push --to NAME``)
TRACKERS: dict[str, type] = {"trackio": TrackioTracker, "wandb": WandbTracker}


def make_tracker(name: str, project: str, run: str | None = None, config: dict[str, Any] | None = None) -> Tracker:
    """The tracker called ``name`` (:data:`TRACKERS`); an unknown name is a ``ValueError`` naming the known ones."""
    if name not in TRACKERS:
        raise ValueError(f"unknown tracker {name!r}; known: {', '.join(sorted(TRACKERS))}")
    return TRACKERS[name](project, run, config)


def _cut(text: str | None, max_chars: int) -> str | None:
    if text is None or len(text) <= max_chars:
        return text
    return text[: max_chars - 1] + "…"


def _last_user(messages: Sequence[Any]) -> str | None:
    for m in reversed(list(messages)):
        role = m["role"] if isinstance(m, dict) else m.role
        if role == "user":
            content = m["content"] if isinstance(m, dict) else m.content
            return content if isinstance(content, str) else None
    return None


def rollout_rows(rows: Iterable[dict[str, Any]], max_chars: int = 2000) -> list[list[Any]]:
    """Table rows (:data:`COLUMNS` order) of rollouts given as dicts of the store's columns (``messages``
    as a list of dicts, ``cost`` as a dict or null). Example: a rollout of step 3 whose messages are
    ``[user "1+1?", assistant "2"]`` with reward 1.0 gives ``[3, id, pid, task, "1+1?", "2", 1.0, ...]``."""
    out = []
    for r in rows:
        msgs = r.get("messages") or []
        cost = r.get("cost") or {}
        out.append([r.get("step"), r.get("rollout_id"), r.get("prompt_id"), r.get("task"),
                    _cut(_last_user(msgs), max_chars), _cut(assistant_text(msgs), max_chars), r.get("reward"),
                    r.get("verified"), r.get("finish_reason"), cost.get("gen_tokens")])
    return out


def _scalars(metrics: dict[str, Any]) -> dict[str, Any]:
    return {f"gfcr/{k}": v for k, v in metrics.items() if k in SCALARS and v is not None}


_SAMPLE_COLUMNS = ["step", "rollout_id", "prompt_id", "task", "messages", "reward", "verified", "finish_reason", "cost"]


def push_store(store: Any, tracker: Tracker, run: str | None = None, steps: tuple[int, int] | None = None,
               samples: int = 8, seed: int = 0, max_chars: int = 2000) -> dict[str, int]:
    """Push the per-step scalars and ``samples`` random rollouts per step of ``store`` (one ``run``, or
    every run when the store holds one; ``steps`` inclusive) to ``tracker``. Returns counts pushed.

    A store with several runs needs ``run``: their steps would collide on one tracker axis."""
    runs = sorted({r["run_id"] for r in store.stats()})
    if run is None:
        if len(runs) > 1:
            raise ValueError(f"the store holds {len(runs)} runs ({', '.join(runs[:5])}...); name one with run=")
        run = runs[0] if runs else None
    elif run not in runs:
        raise ValueError(f"no run {run!r} in the store; runs: {', '.join(runs) or 'none'}")
    if run is None:
        return {"steps": 0, "rollouts": 0}
    pushed = {"steps": 0, "rollouts": 0}
    for row in store.stats(run):
        step = int(row["step"])
        if steps is not None and not steps[0] <= step <= steps[1]:
            continue
        tracker.log(_scalars(summarize(store.scan(run=run, steps=(step, step), columns=FEATURE_COLUMNS))), step=step)
        if samples > 0:
            where = f"run_id = '{run.replace(chr(39), chr(39) * 2)}' AND step = {step}"
            t = store.sample(samples, where=where, seed=seed + step, columns=_SAMPLE_COLUMNS)
            table_rows = sorted(rollout_rows(t.to_pylist(), max_chars), key=lambda r: str(r[1]))
            tracker.log_table("gfcr/rollouts", COLUMNS, table_rows, step=step)
            pushed["rollouts"] += len(table_rows)
        pushed["steps"] += 1
    return pushed


class TrackerHook:
    """After each step a live recorder commits: that step's scalars (over the committed rollouts) and
    ``samples`` of its rollouts, to ``tracker`` (:class:`~gfcr.integrations.writer.StepWriter`'s
    ``tracker=``). The scalars are :func:`~gfcr.store.stepstats.summarize` of the step's rollouts."""

    def __init__(self, tracker: Tracker, samples: int = 8, seed: int = 0, max_chars: int = 2000):
        self.tracker, self.samples, self.max_chars = tracker, int(samples), int(max_chars)
        self._rng = random.Random(seed)

    def __call__(self, step: int, rollouts: Sequence[Rollout]) -> None:
        if not rollouts:
            return
        values = _scalars(summarize(rollouts_to_table(rollouts).select(FEATURE_COLUMNS)))
        self.tracker.log(values, step=step)
        if self.samples > 0:
            pick = self._rng.sample(list(rollouts), min(self.samples, len(rollouts)))
            rows = [{"step": r.step, "rollout_id": r.rollout_id, "prompt_id": r.prompt_id, "task": r.task,
                     "messages": [{"role": m.role, "content": m.content} for m in r.messages],
                     "reward": r.reward, "verified": r.verified, "finish_reason": r.finish_reason,
                     "cost": {"gen_tokens": r.cost.gen_tokens}} for r in pick]
            self.tracker.log_table("gfcr/rollouts", COLUMNS, rollout_rows(rows, self.max_chars), step=step)
