"""Two runs of a store side by side, paired per prompt: the viewer's compare table.

For each prompt both runs hold rollouts with a verdict for, the verified rate of each run (verified
rollouts / rollouts with a verdict; for an eval run, its sampled and greedy answers together), their
difference, and the mean difference over the shared prompts with a paired bootstrap interval and a
sign-flip p-value (:func:`gfcr.evaluate.paired.paired_bootstrap`, the one implementation ``gfcr
compare`` uses). ``gfcr compare`` gives an eval run's own metrics (greedy pass@1 by McNemar, pass@k).
"""

from __future__ import annotations

from typing import Any

from gfcr.store.sql import quote

#: prompts listed in the table (most different first)
MAX_ROWS = 200


def paired_prompts(store: Any, a: str, b: str, n_boot: int = 1000, seed: int = 0) -> dict[str, Any]:
    """Runs ``a`` and ``b`` of ``store`` paired per prompt (module docstring). Returns ``{a, b, n, diff,
    ci, p_value, test, a_better, b_better, rows}``; ``rows``: ``{prompt_id, a: [verified, judged], b: [...],
    diff}``, A's wins first (largest difference), then B's, at most :data:`MAX_ROWS`; two runs that share no
    prompt with a verdict give ``n`` 0 and a ``note`` saying so. A ``ValueError`` when the runs are the same.

    Example: A verified 2/2 on p1 and 0/2 on p2, B 1/2 and 0/2 → p1 diff +0.5, p2 0; mean diff +0.25."""
    from gfcr.evaluate.paired import paired_bootstrap

    if a == b:
        raise ValueError("compare two different runs")
    t = store.sql(
        "SELECT run_id, prompt_id, sum(CASE WHEN verified THEN 1 ELSE 0 END)::BIGINT AS ok, count(verified) AS judged "
        f"FROM rollouts WHERE run_id IN ({quote(a)}, {quote(b)}) GROUP BY run_id, prompt_id").to_pylist()
    per: dict[str, dict[str, tuple[int, int]]] = {}
    for r in t:
        if r["judged"]:
            per.setdefault(r["prompt_id"], {})[r["run_id"]] = (int(r["ok"]), int(r["judged"]))
    shared = sorted(p for p, v in per.items() if a in v and b in v)
    if not shared:
        return {"a": a, "b": b, "n": 0, "rows": [], "note": f"runs {a} and {b} share no prompt with a verdict"}
    va = [per[p][a][0] / per[p][a][1] for p in shared]
    vb = [per[p][b][0] / per[p][b][1] for p in shared]
    d = paired_bootstrap(va, vb, n_boot=n_boot, seed=seed, metric="verified rate")
    rows = [{"prompt_id": p, "a": list(per[p][a]), "b": list(per[p][b]), "diff": x - y}
            for p, x, y in zip(shared, va, vb, strict=True)]
    rows.sort(key=lambda r: (-r["diff"], r["prompt_id"]))
    wins_b = sorted((r for r in rows if r["diff"] < 0), key=lambda r: (r["diff"], r["prompt_id"]))
    listed = [r for r in rows if r["diff"] > 0] + wins_b + [r for r in rows if r["diff"] == 0]
    return {"a": a, "b": b, "n": d.n, "diff": d.diff, "ci": [d.ci_low, d.ci_high], "p_value": d.p_value,
            "test": d.test, "a_better": d.a_better, "b_better": d.b_better, "rows": listed[:MAX_ROWS]}
