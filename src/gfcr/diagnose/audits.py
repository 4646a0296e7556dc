"""Which ROSS judge's audits a view shows, and that judge's TER per step, for the report and the viewer.

A store can hold several judges' audits of the same rollouts: the ROSS demo writes the
``arith-steps`` judge's and the ``keep-all`` control's (positive-rollout SFT supervises every
generated token). A view shows one judge and says which: the one the user names (``gfcr report
--judge``, the viewer's ``?judge=``), else :func:`gfcr.store.stepstats.choose_judge` — any judge
that is not a control, then the most audits, then the name.

:func:`ter_by_step` is TER as :func:`gfcr.ross.analyze.ter_by_step` defines it (the seed's
definition, token-pooled): per step, Σ excluded generated tokens / Σ generated tokens over the
kept audits of the judge. Departure: one audit per rollout (the judge's latest), where the ROSS
analysis counts every stored audit of the judge (the two agree when each rollout is audited once,
which is what the audit stage writes).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gfcr.store.stepstats import CONTROL_JUDGES, choose_judge


def judge_counts(store: Any) -> dict[str, int]:
    """``{judge: audits}`` over the store's audits table (one small aggregate query)."""
    rows = store.sql("SELECT judge, count(*) AS n FROM audits GROUP BY judge").to_pylist()
    return {r["judge"]: int(r["n"]) for r in rows}


def resolve_judge(store: Any, judge: str | None = None) -> tuple[str | None, dict[str, int]]:
    """``(judge to show, {judge: audits})``: ``judge`` when given (a ValueError naming the store's
    judges when it has no audits by it), else :func:`choose_judge`; None when there are no audits."""
    counts = judge_counts(store)
    if judge is not None:
        if judge not in counts:
            have = ", ".join(f"{j} ({n})" for j, n in sorted(counts.items())) or "none"
            raise ValueError(f"no audits by judge {judge!r} in this store; judges with audits: {have}")
        return judge, counts
    return choose_judge(counts), counts


def judges_line(judge: str | None, counts: dict[str, int]) -> str:
    """One sentence naming the judge shown and the others, e.g. ``judge arith-steps (6 audits);
    also in the store: keep-all (6, the control)``."""
    if judge is None:
        return "no ROSS audits"
    others = [f"{j} ({n}{', the control' if j in CONTROL_JUDGES else ''})" for j, n in sorted(counts.items()) if j != judge]
    return f"judge {judge} ({counts.get(judge, 0)} audits)" + (f"; also in the store: {', '.join(others)}" if others else "")


def latest_audits(store: Any, rollout_ids: list[str], judge: str | None) -> dict[str, dict[str, Any]]:
    """``{rollout_id: audit}``: the latest audit by ``judge`` of each of ``rollout_ids`` (none when
    ``judge`` is None)."""
    if judge is None or not rollout_ids:
        return {}
    out: dict[str, dict[str, Any]] = {}
    for a in sorted(store.audits(judge=judge, rollout_ids=rollout_ids).to_pylist(), key=lambda a: a["created_at"]):
        out[a["rollout_id"]] = a
    return out


def ter_by_step(store: Any, judge: str | None, run: str | None = None) -> list[dict[str, Any]]:
    """Rows ``{run_id, step, n_audited, kept_share, generated_tokens, excluded_tokens, ter}`` per
    step of the rollouts ``judge`` audited (of ``run``; one audit per rollout, its latest), sorted
    by run and step. ``ter``: Σ (generated − supervised generated tokens) / Σ generated tokens
    over the step's *kept* audits (None when none is kept).

    Example: step 0 with two kept audits of 10 and 30 generated tokens, 5 and 0 excluded, and one
    discarded audit → ``n_audited`` 3, ``kept_share`` 2/3, ``ter`` 5/40 = 0.125.
    """
    if judge is None:
        return []
    audits = store.audits(judge=judge)
    if audits.num_rows == 0:
        return []
    latest: dict[str, dict[str, Any]] = {}
    for a in sorted(audits.select(["rollout_id", "status", "mask", "created_at"]).to_pylist(),
                    key=lambda a: a["created_at"]):
        latest[a["rollout_id"]] = a
    present = store.existing_ids(list(latest))
    ids = [i for i in latest if i in present]
    if not ids:
        return []
    t = store.get(ids, columns=["rollout_id", "run_id", "step", "token_role"])
    by: dict[tuple[str, int], dict[str, Any]] = {}
    for rid, r, st, role in zip(t.column("rollout_id").to_pylist(), t.column("run_id").to_pylist(),
                                t.column("step").to_pylist(), t.column("token_role").to_pylist(), strict=True):
        if run is not None and r != run:
            continue
        o = by.setdefault((r, int(st)), {"n": 0, "kept": 0, "gen": 0, "excl": 0})
        o["n"] += 1
        a = latest[rid]
        if a["status"] != "kept":
            continue
        gen = np.asarray(role) == 1
        mask = np.asarray(a["mask"] or [], np.int64)
        sup = int(mask[gen].sum()) if len(mask) == len(gen) else int(mask.sum())
        o["kept"] += 1
        o["gen"] += int(gen.sum())
        o["excl"] += int(gen.sum()) - sup
    return [{"run_id": r, "step": st, "n_audited": o["n"], "kept_share": o["kept"] / o["n"],
             "generated_tokens": o["gen"], "excluded_tokens": o["excl"],
             "ter": o["excl"] / o["gen"] if o["gen"] else None} for (r, st), o in sorted(by.items())]


__all__ = ["judge_counts", "judges_line", "latest_audits", "resolve_judge", "ter_by_step"]
