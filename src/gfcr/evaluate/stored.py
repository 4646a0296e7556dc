"""Evaluations kept as stored rollouts, and two checkpoints compared per prompt from the store.

:class:`EvalRecorder` is the ``record`` hook of :func:`~gfcr.evaluate.run.evaluate_model`: every
generation of the evaluation becomes a token-faithful rollout of the *eval run* ``run_id`` (default
``eval-<policy_version>``) with the checkpoint as ``policy_version``, the verdict as ``verified`` and
``reward`` (1.0 / 0.0), and ``meta["eval"] = {"phase": "sampled" | "greedy", "split": ...}``; the
sampled answers of a prompt are ``sample_index`` 0..k-1 of one group, the greedy answer index k of
another. Rows are appended one commit per ``flush_every`` prompts and at :meth:`EvalRecorder.close`,
and the prompts are registered (with their gold answers) so that the store alone can re-verify them.

:func:`stored_eval` rebuilds the :class:`~gfcr.evaluate.metrics.EvalResult` of an eval run from the
stored verdicts through the same :func:`~gfcr.evaluate.metrics.summarize` (the same numbers as the live
evaluation); :func:`compare_stored` compares two eval runs paired per prompt
(:func:`~gfcr.evaluate.paired.compare_paired`) and lists the prompts where they disagree.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gfcr.evaluate.metrics import EvalResult, summarize
from gfcr.evaluate.paired import PairedDiff, compare_paired, per_prompt_values
from gfcr.generate.rollouts import encode_prompt, group_id_of, rollout_from_result
from gfcr.records import Prompt, Rollout


def _q(s: str) -> str:
    return "'" + str(s).replace("'", "''") + "'"


class EvalRecorder:
    """Keeps an evaluation's generations in ``store`` (see the module docstring).

    ``engine``: the evaluated engine (its tokenizer makes the prompt ids when a result carries none);
    ``policy_version``: the checkpoint's name or hash; ``run_id``: the eval run (default
    ``eval-<policy_version>``); ``step``: the training step the checkpoint closes (0 for a base model).
    """

    def __init__(self, store: Any, engine: Any, policy_version: str, run_id: str | None = None, step: int = 0,
                 split: str = "test", verifier: str = "", flush_every: int = 64):
        self.store, self.engine, self.policy_version = store, engine, str(policy_version)
        self.run_id = run_id or f"eval-{self.policy_version}"
        self.step, self.split, self.verifier, self.flush_every = int(step), split, verifier, int(flush_every)
        if store.count(where=f"run_id = {_q(self.run_id)}"):
            raise ValueError(f"the store already holds an eval run {self.run_id!r}; choose another run id")
        self._rows: list[Rollout] = []
        self._prompts: dict[str, Prompt] = {}
        self._k: dict[str, int] = {}  # prompt -> sampled answers recorded (the greedy answer's index)
        self.written = 0

    def __call__(self, phase: str, prompt: Prompt, results: Sequence[Any], verdicts: Sequence[bool],
                 params: Any) -> None:
        ids = None if all(getattr(r, "prompt_ids", None) is not None for r in results) else encode_prompt(self.engine, prompt)
        first = self._k.get(prompt.prompt_id, 0) if phase == "greedy" else 0
        group = group_id_of(prompt.prompt_id, self.step, self.run_id) + (":greedy" if phase == "greedy" else "")
        for i, (res, ok) in enumerate(zip(results, verdicts, strict=True)):
            r = rollout_from_result(self.engine, prompt, res, ids, params, self.run_id, self.step, first + i, group,
                                    self.policy_version, meta={"eval": {"phase": phase, "split": self.split}})
            r.verified, r.reward = bool(ok), float(bool(ok))
            r.verifier = {"name": self.verifier, "phase": phase} if self.verifier else {"phase": phase}
            self._rows.append(r)
        if phase == "sampled":
            self._k[prompt.prompt_id] = len(results)
        self._prompts.setdefault(prompt.prompt_id, prompt)
        if len({r.prompt_id for r in self._rows}) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        """Append what is held (one commit), after registering prompts the store does not hold."""
        if not self._rows:
            return
        new = [p for pid, p in self._prompts.items()
               if pid not in self.store.existing_ids(list(self._prompts), table="prompts", column="prompt_id")]
        if new:
            self.store.upsert_prompts(new)
        self._prompts = {}
        self.written += self.store.append(self._rows, source="eval", check_existing=False)
        self._rows = []

    def close(self) -> int:
        """Write the rest; returns the rollouts written in all."""
        self.flush()
        return self.written


def _verdicts(store: Any, run_id: str) -> tuple[dict[str, list[bool]], dict[str, bool]]:
    t = store.scan(run=run_id, columns=["prompt_id", "sample_index", "verified", "meta"])
    if t.num_rows == 0:
        raise ValueError(f"no eval run {run_id!r} in the store")
    sampled: dict[str, list[tuple[int, bool]]] = {}
    greedy: dict[str, bool] = {}
    for pid, i, ok, meta in zip(*(t.column(c).to_pylist() for c in ("prompt_id", "sample_index", "verified", "meta")),
                                strict=True):
        phase = (json.loads(meta or "{}").get("eval") or {}).get("phase")
        if phase == "greedy":
            greedy[pid] = bool(ok)
        elif phase == "sampled":
            sampled.setdefault(pid, []).append((int(i), bool(ok)))
        else:
            raise ValueError(f"run {run_id!r} holds rows that are not eval generations (no meta.eval.phase)")
    return {pid: [ok for _, ok in sorted(v)] for pid, v in sampled.items()}, greedy


def stored_eval(store: Any, run_id: str, ks: Sequence[int] | None = None, n_boot: int = 1000, seed: int = 0) -> EvalResult:
    """The :class:`EvalResult` of eval run ``run_id``, from its stored verdicts."""
    sampled, greedy = _verdicts(store, run_id)
    if sampled and greedy and set(sampled) != set(greedy):
        raise ValueError(f"eval run {run_id!r}: sampled and greedy answers cover different prompts")
    return summarize(sampled, greedy or None, ks=ks, n_boot=n_boot, seed=seed)


@dataclass
class StoredComparison:
    """Eval run A minus eval run B: the paired difference and the prompts they disagree on
    (``a_only``: solved by A, not B; ``b_only`` the reverse), each ``(prompt_id, value A, value B)``."""

    a: str
    b: str
    diff: PairedDiff
    a_only: list[tuple[str, float, float]] = field(default_factory=list)
    b_only: list[tuple[str, float, float]] = field(default_factory=list)


def compare_stored(store: Any, run_a: str, run_b: str, metric: str = "greedy_pass@1", n_boot: int = 2000,
                   seed: int = 0) -> StoredComparison:
    """Compare eval runs ``run_a`` and ``run_b`` of ``store`` on ``metric``, paired per prompt.

    Example: A solves prompts {p1, p2}, B solves {p2, p3}, greedy: diff 0, ``a_only`` [p1], ``b_only`` [p3]."""
    a, b = stored_eval(store, run_a, n_boot=n_boot, seed=seed), stored_eval(store, run_b, n_boot=n_boot, seed=seed)
    d = compare_paired(a, b, metric, n_boot=n_boot, seed=seed)
    va, vb = per_prompt_values(a, metric), per_prompt_values(b, metric)
    both = sorted(set(va) & set(vb))
    a_only = sorted(((p, va[p], vb[p]) for p in both if va[p] > vb[p]), key=lambda x: (x[2] - x[1], x[0]))
    b_only = sorted(((p, va[p], vb[p]) for p in both if vb[p] > va[p]), key=lambda x: (x[1] - x[2], x[0]))
    return StoredComparison(run_a, run_b, d, a_only, b_only)
