"""Apply a verifier to rollouts: one at a time, many in parallel, or a whole store (re-verify).

The gold answer / tests come from the task's :class:`~gfcr.records.Prompt` (the store's prompts
table), so a store alone is enough to re-verify any rollout. Writing a verdict into a rollout sets
``reward`` (the verdict's score), ``verified`` (passed) and ``verifier`` (JSON evidence: name,
version, passed, score, evidence, cost_s).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gfcr.records import Prompt, Rollout

from .verifiers import Verdict, Verifier, get_verifier, stated_answer_format


def verdict_record(verifier: Verifier, verdict: Verdict) -> dict[str, Any]:
    """The JSON stored in ``rollout.verifier`` for a verdict."""
    return {
        "name": verifier.name,
        "version": verifier.version,
        "passed": verdict.passed,
        "score": verdict.score,
        "evidence": verdict.evidence,
        "cost_s": verdict.cost_s,
    }


def verify_rollout(rollout: Rollout, verifier: Verifier, prompt: Prompt | None = None) -> Rollout:
    """A copy of ``rollout`` with reward, verified and verifier evidence from ``verifier``.

    ``prompt`` supplies the gold ``answer``, ``tests`` and the answer format the task states
    (:func:`~gfcr.filters.verifiers.stated_answer_format`; None: the verifier judges without them,
    which most verifiers answer with ``passed=None``). The rollout goes along as context, so a
    truncated generation (``finish_reason`` length/abort) is not verified unless the verifier's
    config allows it. The input rollout is not modified.
    """
    if prompt is not None and prompt.prompt_id != rollout.prompt_id:
        raise ValueError(f"prompt {prompt.prompt_id!r} does not belong to rollout {rollout.rollout_id!r} "
                         f"(prompt_id {rollout.prompt_id!r})")
    verdict = verifier.verify(
        rollout.completion,
        answer=None if prompt is None else prompt.answer,
        tests=None if prompt is None else prompt.tests,
        rollout=rollout,
        answer_format=stated_answer_format(prompt),
    )
    out = copy.copy(rollout)
    out.signals = dict(rollout.signals)
    out.reward = float(verdict.score)
    out.verified = verdict.passed
    out.verifier = verdict_record(verifier, verdict)
    return out


def verify_many(
    rollouts: Sequence[Rollout],
    verifier: Verifier | str,
    prompts: Mapping[str, Prompt] | Iterable[Prompt] | None = None,
    workers: int = 1,
    progress: bool = False,
) -> list[Rollout]:
    """Verify many rollouts in parallel; results keep the input order.

    The heavy work already runs in worker processes (math-verify pool, sandbox), so ``workers``
    threads drive ``workers`` processes; the math pool is grown to ``workers``. A missing prompt
    gives ``verified=None`` with the reason in the evidence (nothing is dropped).
    """
    v = get_verifier(verifier) if isinstance(verifier, str) else verifier
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if prompts is None:
        by_id: dict[str, Prompt] = {}
    elif isinstance(prompts, Mapping):
        by_id = dict(prompts)
    else:
        by_id = {p.prompt_id: p for p in prompts}
    if hasattr(v, "prepare"):
        v.prepare(workers)

    def one(r: Rollout) -> Rollout:
        return verify_rollout(r, v, by_id.get(r.prompt_id))

    rs = list(rollouts)
    if not progress:
        if workers == 1:
            return [one(r) for r in rs]
        with ThreadPoolExecutor(workers) as ex:
            return list(ex.map(one, rs))
    from rich.console import Console
    from rich.progress import Progress

    out: list[Rollout] = []
    with Progress(transient=True, console=Console(stderr=True)) as bar, ThreadPoolExecutor(workers) as ex:
        task = bar.add_task(f"verify ({v.name})", total=len(rs))
        for r in ex.map(one, rs):
            out.append(r)
            bar.advance(task)
    return out


def recompose(old: Sequence[Rollout], new: Sequence[Rollout]) -> None:
    """Rebuild the reward of re-verified rollouts with the recipe each was trained with.

    ``new[i]`` is ``old[i]`` with a fresh verdict (``reward`` = the verdict's score). When the stored
    rollout carries ``verifier["reward_recipe"]`` (written by :class:`~gfcr.filters.reward.RewardComposition`),
    the score becomes ``signals["correctness"]`` and the recipe is applied again per group
    (``group_id``), so a store re-verified with the verifier that made it keeps its rewards.
    """
    from .reward import RewardComposition

    groups: dict[str, list[Rollout]] = {}
    for o, n in zip(old, new, strict=True):
        recipe = (o.verifier or {}).get("reward_recipe")
        if recipe is None:
            continue
        n.signals["correctness"] = float(n.reward)
        n.verifier = {**(n.verifier or {}), "reward_recipe": recipe}
        groups.setdefault(n.group_id, []).append(n)
    for g in groups.values():
        comp = RewardComposition.from_recipe(g[0].verifier["reward_recipe"])
        comp.seed_ref_accuracy(g)
        comp.apply(g)


def reverify_store(store: Any, verifier: Verifier | str, where: str | None = None, workers: int = 1,
                   progress: bool = False) -> dict[str, Any]:
    """Re-verify the store's rollouts (optionally a SQL ``where`` filter) and write the new verdicts.

    Gold answers / tests come from the store's prompts table. The update is one new store version;
    the previous version stays reachable with ``store.checkout(version)``. Returns a summary.
    """
    v = get_verifier(verifier) if isinstance(verifier, str) else verifier
    before = store.version
    rollouts = store.rollouts(where=where) if where else store.rollouts()
    if not rollouts:
        return {"n": 0, "changed": 0, "passed": 0, "unjudged": 0, "missing_prompts": 0,
                "version_before": before, "version_after": before}
    prompt_ids = sorted({r.prompt_id for r in rollouts})
    prompts = store.prompts(ids=prompt_ids)
    new = verify_many(rollouts, v, prompts, workers=workers, progress=progress)
    recompose(rollouts, new)
    changed = sum((a.reward != b.reward) or (a.verified != b.verified) for a, b in zip(rollouts, new, strict=True))
    store.update(new)
    return {
        "n": len(new),
        "changed": changed,
        "passed": sum(r.verified is True for r in new),
        "unjudged": sum(r.verified is None for r in new),
        "missing_prompts": len(set(prompt_ids) - {p.prompt_id for p in prompts}),
        "version_before": before,
        "version_after": store.version,
    }
