"""ROSS evaluation and analyses (the seed's Tables 1/3/4, Figures 3/5/6), sized for a CPU miniature.

- :func:`evaluate_models`: each model (base, upstream, continued RL, positive-rollout SFT, ROSS w/o
  mask, ROSS, ROSS from base …) on the same held-out prompts with ``gfcr.evaluate.evaluate_model``
  (unbiased pass@k, bootstrap CIs over prompts); :func:`comparison_table` renders it.
- :func:`ter_by_window`: TER of kept audits per training-step window next to the policy entropy of
  the same rollouts (``signals["entropy"]`` when stored, else the mean −log-prob of the sampled
  tokens, an unbiased estimate of the per-token entropy under the behaviour policy).
- :func:`categories_early_late`: each kept audit with exclusions gets one primary category (the
  one excluding the most characters); shares early vs late.
- :func:`compatibility`: mean token NLL under the current model of historical rollouts, of fresh
  current-model outputs and of another model's outputs, on the same prompts.
- :func:`complementarity`: for prompts solved at least once in history, the current model's
  pass@1/8/32 and how many prompts it solves at most half the time.

Definitions of TER / compatibility / complementarity follow the seed's text (the paper's exact
protocols are not public): TER = share of a kept rollout's generated tokens not supervised.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from gfcr.records import GENERATED, Prompt, Rollout, table_to_audits


def policy_entropy(r: Rollout) -> float | None:
    """``signals["entropy"]`` if stored, else mean −log-prob of the generated tokens."""
    if "entropy" in r.signals:
        return float(r.signals["entropy"])
    lp = np.asarray(r.logprobs)[np.asarray(r.token_role) == GENERATED]
    return float(-lp.mean()) if len(lp) else None


def ter_by_window(store: Any, judge: str, window: int = 8, judge_version: str | None = None) -> list[dict[str, Any]]:
    """Rows ``{steps: [lo, hi], n, ter, entropy}`` per window of ``window`` training steps."""
    if window < 1:
        raise ValueError("window must be >= 1")
    t = store.audits(judge=judge, judge_version=judge_version)
    aus = [a for a in table_to_audits(t) if a.status == "kept"] if t.num_rows else []
    if not aus:
        return []
    rs = _rollouts_of(store, aus)
    by: dict[int, list[tuple[float, float | None]]] = defaultdict(list)
    for a in aus:
        r = rs[a.rollout_id]
        by[int(r.step) // window].append((float(a.ter or 0.0), policy_entropy(r)))
    out = []
    for w in sorted(by):
        ters = [x for x, _ in by[w]]
        ents = [e for _, e in by[w] if e is not None]
        out.append({"steps": [w * window, (w + 1) * window - 1], "n": len(ters), "ter": float(np.mean(ters)),
                    "entropy": float(np.mean(ents)) if ents else None})
    return out


def _rollouts_of(store: Any, aus: Sequence[Any]) -> dict[str, Rollout]:
    from gfcr.records import table_to_rollouts

    return {r.rollout_id: r for r in table_to_rollouts(store.get([a.rollout_id for a in aus]))}


def primary_category(excluded: Sequence[Any]) -> str | None:
    """The category excluding the most characters (ties: first in the taxonomy order)."""
    from gfcr.records import EXCLUSION_CATEGORIES

    chars: Counter = Counter()
    for s in excluded:
        chars[s.category] += s.end - s.start
    if not chars:
        return None
    return max(chars, key=lambda c: (chars[c], -EXCLUSION_CATEGORIES.index(c)))


def categories_early_late(store: Any, judge: str, early: tuple[int, int], late: tuple[int, int],
                          judge_version: str | None = None) -> dict[str, dict[str, Any]]:
    """``{"early": {n, shares: {category: share}}, "late": {...}}`` over kept audits with exclusions."""
    t = store.audits(judge=judge, judge_version=judge_version)
    aus = [a for a in table_to_audits(t) if a.status == "kept" and a.excluded] if t.num_rows else []
    out = {}
    for name, (lo, hi) in (("early", early), ("late", late)):
        cats = Counter()
        for a in aus:
            step = int(a.meta.get("step", -1))
            if lo <= step <= hi:
                cats[primary_category(a.excluded)] += 1
        n = sum(cats.values())
        out[name] = {"steps": [lo, hi], "n": n, "shares": {c: k / n for c, k in cats.most_common()} if n else {}}
    return out


def rows_from_rollouts(rollouts: Sequence[Rollout]) -> list[dict[str, Any]]:
    """Scoring rows: full context, every generated token a target."""
    return [{"input_ids": np.asarray(r.token_ids).tolist(),
             "loss_mask": (np.asarray(r.token_role) == GENERATED).astype(int).tolist()} for r in rollouts]


def sample_rows(engine: Any, prompts: Sequence[Prompt], max_tokens: int, temperature: float = 0.7,
                seed: int = 0) -> list[dict[str, Any]]:
    """One sampled output per prompt from ``engine`` as scoring rows (context + generated ids)."""
    from gfcr.generate.engines.base import GenRequest, SamplingParams

    params = SamplingParams(n=1, temperature=temperature, max_tokens=max_tokens, seed=seed)
    reqs = [GenRequest(prompt_ids=engine.encode_messages([m.to_dict() for m in p.messages]), params=params)
            for p in prompts]
    rows = []
    for req, results in zip(reqs, engine.generate(reqs), strict=True):
        g = list(results[0].token_ids)
        if g:
            rows.append({"input_ids": list(req.prompt_ids) + g, "loss_mask": [0] * len(req.prompt_ids) + [1] * len(g)})
    return rows


def compatibility(current: Any, tokenizer: Any, historical: Sequence[Rollout], prompts: Sequence[Prompt],
                  other: Any | None = None, max_tokens: int = 96, seed: int = 0) -> dict[str, Any]:
    """Mean token NLL under ``current`` of: historical outputs, fresh ``current`` outputs and
    ``other``'s outputs (a model or None) on ``prompts``. Lower = closer to the current policy."""
    from gfcr.generate.engines.hf import HFEngine
    from gfcr.train.sft import mean_token_nll

    pad = tokenizer.pad_token_id
    out: dict[str, Any] = {"historical": mean_token_nll(current, rows_from_rollouts(historical), pad).__dict__}
    eng = HFEngine(current, tokenizer=tokenizer, policy_version="current")
    out["current"] = mean_token_nll(current, sample_rows(eng, prompts, max_tokens, seed=seed), pad).__dict__
    if other is not None:
        oeng = HFEngine(other, tokenizer=tokenizer, policy_version="other")
        out["other"] = mean_token_nll(current, sample_rows(oeng, prompts, max_tokens, seed=seed), pad).__dict__
    return out


def solved_prompt_ids(store: Any, run: str | None = None, steps: tuple[int, int] | None = None,
                      task: str | None = None) -> list[str]:
    """Prompts with at least one verified-successful rollout in the window."""
    t = store.scan(run=run, steps=steps, verified=True, task=task, columns=["prompt_id"])
    return sorted(set(t.column("prompt_id").to_pylist()))


def complementarity(engine: Any, prompts: Sequence[Prompt], k: int = 32, ks: Sequence[int] = (1, 8, 32),
                    max_tokens: int = 96, verifier: str = "numeric", seed: int = 0) -> dict[str, Any]:
    """The current model's pass@k on historically solved ``prompts``; also the number of prompts
    it solves in at most half of its ``k`` samples."""
    from gfcr.evaluate import evaluate_model

    res = evaluate_model(engine, list(prompts), k=k, ks=[x for x in ks if x <= k], verifier=verifier, greedy=False,
                         max_tokens=max_tokens, seed=seed)
    half = sum(1 for p in res.per_prompt if p.get("correct", 0) <= k / 2)
    return {"n_prompts": res.n_prompts, "metrics": {m: v.__dict__ for m, v in res.metrics.items()},
            "at_most_half": half, "solved_any": sum(1 for p in res.per_prompt if p.get("correct", 0) > 0)}


def evaluate_models(models: dict[str, Any], tokenizer: Any, prompts: Sequence[Prompt], k: int = 8,
                    ks: Sequence[int] | None = None, max_tokens: int = 96, verifier: str = "numeric",
                    seed: int = 0, greedy: bool = True) -> dict[str, dict[str, Any]]:
    """``{name: {metric: {value, ci_low, ci_high}}}`` for each model (a loaded model or a path)."""
    from gfcr.evaluate import evaluate_model
    from gfcr.generate.engines.hf import HFEngine

    out = {}
    for name, m in models.items():  # paths are loaded one at a time, so only one model is in memory
        eng = HFEngine(m, tokenizer=tokenizer, policy_version=name)
        res = evaluate_model(eng, list(prompts), k=k, ks=ks, verifier=verifier, greedy=greedy,
                             max_tokens=max_tokens, seed=seed)
        out[name] = {mname: v.__dict__ for mname, v in res.metrics.items()}
        del eng
    return out


def comparison_table(results: dict[str, dict[str, Any]], metrics: Sequence[str] | None = None) -> str:
    """A Markdown table: one row per model, ``value [ci_low, ci_high]`` per metric (in %)."""
    if not results:
        return "(no results)"
    names = list(metrics) if metrics else list(next(iter(results.values())).keys())
    lines = ["| model | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for model, ms in results.items():
        cells = []
        for n in names:
            m = ms.get(n)
            cells.append("—" if m is None else f"{100 * m['value']:.1f} [{100 * m['ci_low']:.1f}, {100 * m['ci_high']:.1f}]")
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
