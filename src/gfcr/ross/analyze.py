"""ROSS analyses in the paper's shapes (the seed's Figures 3, 5 and 6), sized for a CPU miniature.

- :func:`ter_by_step`: TER token-pooled per training step (excluded generated tokens / generated
  tokens of the kept rollouts of that step), its moving average over ``ma`` steps (the paper's
  thin line and 8-step thick line) and the token-weighted policy entropy of the same rollouts;
  filters by run, task and step window. :func:`ter_by_window` pools over windows of steps.
- :func:`categories_early_late`: per domain, each kept audit with exclusions gets one primary
  category (the one excluding the most characters) in the paper's taxonomy
  (:data:`PAPER_CATEGORY`: gfcr's ``abandoned_attempt`` counts as redundant exploration); shares
  early vs late (the paper: steps 1–20 vs 81–100, math vs code).
- :func:`compatibility`: mean token NLL under the current model of historical rollouts, of the
  current model's own samples that are *correct* (drawn at the configured temperature), of
  another model's correct samples, and of an external teacher's text (re-tokenized by the scored
  model's tokenizer and flagged so), on the same prompts.
- :func:`hardest_solved_prompts` + :func:`complementarity`: the hardest N prompts (lowest
  historical solve rate) that history solved at least once; the current model's pass@1/8/32 on
  them and how many it solves in at most half of its samples.
- Evaluation tables and paired comparisons: :mod:`gfcr.ross.evaluation` (re-exported here).

TER is the seed's definition: the share of a kept rollout's generated tokens that are not
supervision targets. The paper's exact protocols are not public; departures: entropy falls back
to the mean −log-prob of the sampled tokens when the engine stored none; "domain" is a task's
prefix before ``:`` unless a mapping is given.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from gfcr.records import GENERATED, Prompt, Rollout, table_to_audits
from gfcr.ross.evaluation import comparison_table, evaluate_models  # noqa: F401  (re-exported)


def policy_entropy(r: Rollout) -> float | None:
    """``signals["entropy"]`` if stored, else mean −log-prob of the generated tokens."""
    if "entropy" in r.signals:
        return float(r.signals["entropy"])
    lp = np.asarray(r.logprobs)[np.asarray(r.token_role) == GENERATED]
    return float(-lp.mean()) if len(lp) else None


def _kept_audits(store: Any, judge: str, judge_version: str | None, run: str | None, task: str | None,
                 steps: tuple[int, int] | None, with_exclusions: bool = False) -> list[tuple[Any, Rollout]]:
    t = store.audits(judge=judge, judge_version=judge_version)
    aus = [a for a in table_to_audits(t) if a.status == "kept" and (a.excluded or not with_exclusions)] if t.num_rows else []
    if not aus:
        return []
    rs = _rollouts_of(store, aus)
    out = []
    for a in aus:
        r = rs.get(a.rollout_id)
        if r is None or (run is not None and r.run_id != run) or (task is not None and r.task != task):
            continue
        if steps is not None and not steps[0] <= int(r.step) <= steps[1]:
            continue
        out.append((a, r))
    return out


def _pooled(pairs: Sequence[tuple[Any, Rollout]]) -> dict[str, Any]:
    gen = np.array([r.n_generated for _, r in pairs], np.float64)
    sup = np.array([int(np.asarray(a.mask).sum()) for a, _ in pairs], np.float64)
    ents = [(policy_entropy(r), r.n_generated) for _, r in pairs]
    ents = [(e, w) for e, w in ents if e is not None and w > 0]
    return {"n": len(pairs), "generated_tokens": int(gen.sum()), "excluded_tokens": int((gen - sup).sum()),
            "ter": float((gen - sup).sum() / gen.sum()) if gen.sum() else None,
            "ter_rollout_mean": float(np.mean(1 - sup / np.maximum(gen, 1))) if len(gen) else None,
            "entropy": float(np.average([e for e, _ in ents], weights=[w for _, w in ents])) if ents else None}


def moving_average(values: Sequence[float | None], window: int) -> list[float | None]:
    """Trailing moving average over the last ``window`` defined values (None where none is).

    Example: ``moving_average([1, 2, 3, 4], 2) == [1.0, 1.5, 2.5, 3.5]``.
    """
    out: list[float | None] = []
    for i in range(len(values)):
        w = [v for v in values[max(0, i - window + 1) : i + 1] if v is not None]
        out.append(float(np.mean(w)) if w else None)
    return out


def ter_by_step(store: Any, judge: str, judge_version: str | None = None, run: str | None = None,
                task: str | None = None, steps: tuple[int, int] | None = None, ma: int = 8) -> list[dict[str, Any]]:
    """Rows ``{step, n, generated_tokens, excluded_tokens, ter, ter_ma, ter_rollout_mean, entropy,
    entropy_ma}`` per training step of the kept audits (filters: run, task, inclusive step window).

    ``ter`` is token-pooled: Σ excluded / Σ generated over the step's kept rollouts (a long
    rollout weighs by its tokens); ``ter_rollout_mean`` is the mean of per-rollout ratios, kept
    for comparison; ``*_ma`` are trailing moving averages over ``ma`` steps.
    """
    if ma < 1:
        raise ValueError("ma must be >= 1")
    pairs = _kept_audits(store, judge, judge_version, run, task, steps)
    by: dict[int, list[tuple[Any, Rollout]]] = defaultdict(list)
    for a, r in pairs:
        by[int(r.step)].append((a, r))
    rows = [{"step": st, **_pooled(by[st])} for st in sorted(by)]
    for key in ("ter", "entropy"):
        for row, v in zip(rows, moving_average([r[key] for r in rows], ma), strict=True):
            row[f"{key}_ma"] = v
    return rows


def ter_by_window(store: Any, judge: str, window: int = 8, judge_version: str | None = None, run: str | None = None,
                  task: str | None = None, steps: tuple[int, int] | None = None) -> list[dict[str, Any]]:
    """Rows ``{steps: [lo, hi], n, ter, entropy, …}`` per window of ``window`` training steps,
    token-pooled as in :func:`ter_by_step`."""
    if window < 1:
        raise ValueError("window must be >= 1")
    by: dict[int, list[tuple[Any, Rollout]]] = defaultdict(list)
    for a, r in _kept_audits(store, judge, judge_version, run, task, steps):
        by[int(r.step) // window].append((a, r))
    return [{"steps": [w * window, (w + 1) * window - 1], **_pooled(by[w])} for w in sorted(by)]


def _rollouts_of(store: Any, aus: Sequence[Any]) -> dict[str, Rollout]:
    from gfcr.records import table_to_rollouts

    return {r.rollout_id: r for r in table_to_rollouts(store.get([a.rollout_id for a in aus]))}


#: gfcr's exclusion categories → the paper's (arXiv 2609.35954, Figure 6 as the seed describes it:
#: "Corrected mistake", and "Redundant exploration", which it defines as "over-planning, detours, or
#: exploration finally abandoned", so gfcr's ``abandoned_attempt`` belongs to it). The seed names no
#: other Figure 6 category: ``incorrect_claim`` (wrong, never corrected) and ``other`` report as ``other``.
PAPER_CATEGORY = {
    "corrected_mistake": "corrected_mistake",
    "redundant_exploration": "redundant_exploration",
    "abandoned_attempt": "redundant_exploration",
    "incorrect_claim": "other",
    "other": "other",
}
#: the paper's categories, in report order
PAPER_CATEGORIES = ("corrected_mistake", "redundant_exploration", "other")
TAXONOMIES = ("paper", "gfcr")


def primary_category(excluded: Sequence[Any], taxonomy: str = "paper") -> str | None:
    """The category excluding the most characters, in ``taxonomy`` (``paper``: gfcr's categories
    mapped by :data:`PAPER_CATEGORY` *before* counting, so redundant exploration and abandoned
    attempts add up; ``gfcr``: as stored). Ties: first in the taxonomy's order.

    Example: 30 chars ``abandoned_attempt`` + 30 ``redundant_exploration`` + 50
    ``corrected_mistake`` → ``redundant_exploration`` (60 > 50) in the paper's taxonomy,
    ``corrected_mistake`` in gfcr's."""
    from gfcr.records import EXCLUSION_CATEGORIES

    if taxonomy not in TAXONOMIES:
        raise ValueError(f"taxonomy must be one of {TAXONOMIES}, got {taxonomy!r}")
    order = PAPER_CATEGORIES if taxonomy == "paper" else EXCLUSION_CATEGORIES
    chars: Counter = Counter()
    for s in excluded:
        chars[PAPER_CATEGORY[s.category] if taxonomy == "paper" else s.category] += s.end - s.start
    if not chars:
        return None
    return max(chars, key=lambda c: (chars[c], -order.index(c)))


def domain_of(task: str, domains: Mapping[str, str] | None = None) -> str:
    """A task's domain: ``domains[task]`` when given, else the task name before ``:``
    (``tool:calculator`` → ``tool``, ``rg:basic_arithmetic`` → ``rg``, ``arith`` → ``arith``)."""
    if domains and task in domains:
        return domains[task]
    return task.split(":", 1)[0]


def categories_early_late(store: Any, judge: str, early: tuple[int, int], late: tuple[int, int],
                          judge_version: str | None = None, run: str | None = None,
                          domains: Mapping[str, str] | None = None,
                          taxonomy: str = "paper") -> dict[str, dict[str, Any]]:
    """``{domain: {"early": {steps, n, shares: {category: share}}, "late": {...}}}`` over kept
    audits with exclusions, one primary category per rollout (the paper's Figure 6), in the
    paper's categories by default (:data:`PAPER_CATEGORY`; ``taxonomy="gfcr"``: as stored)."""
    out: dict[str, dict[str, Any]] = {}
    pairs = _kept_audits(store, judge, judge_version, run, None, None, with_exclusions=True)
    for dom in sorted({domain_of(r.task, domains) for _, r in pairs}):
        out[dom] = {}
        for name, (lo, hi) in (("early", early), ("late", late)):
            cats: Counter = Counter()
            for a, r in pairs:
                if domain_of(r.task, domains) == dom and lo <= int(r.step) <= hi:
                    cats[primary_category(a.excluded, taxonomy)] += 1
            n = sum(cats.values())
            out[dom][name] = {"steps": [lo, hi], "n": n,
                              "shares": {c: k / n for c, k in cats.most_common()} if n else {}}
    return out


def rows_from_rollouts(rollouts: Sequence[Rollout]) -> list[dict[str, Any]]:
    """Scoring rows: full context, every generated token a target."""
    return [{"input_ids": np.asarray(r.token_ids).tolist(),
             "loss_mask": (np.asarray(r.token_role) == GENERATED).astype(int).tolist()} for r in rollouts]


def sample_rows(engine: Any, prompts: Sequence[Prompt], max_tokens: int, temperature: float = 0.7, seed: int = 0,
                n: int = 1, verify: Callable[[Prompt, str], bool] | None = None) -> list[dict[str, Any]]:
    """Scoring rows (context + generated ids) of up to one sample per prompt from ``engine``:
    ``n`` samples are drawn at ``temperature`` and the first that ``verify`` accepts is kept (a
    prompt with none contributes no row); a sample cut by the token limit never counts as
    correct. Rows carry ``prompt_id``."""
    from gfcr.generate.engines.base import GenRequest, SamplingParams

    params = SamplingParams(n=n, temperature=temperature, max_tokens=max_tokens, seed=seed)
    reqs = [GenRequest(prompt_ids=engine.encode_messages([m.to_dict() for m in p.messages]), params=params)
            for p in prompts]
    rows = []
    for p, req, results in zip(prompts, reqs, engine.generate(reqs), strict=True):
        for res in results:
            g = list(res.token_ids)
            if not g:
                continue
            if verify is not None:
                if res.finish_reason in ("length", "abort"):
                    continue
                text = res.text if res.text is not None else engine.tokenizer.decode(g, skip_special_tokens=True)
                if not verify(p, text):
                    continue
            rows.append({"prompt_id": p.prompt_id, "input_ids": list(req.prompt_ids) + g,
                         "loss_mask": [0] * len(req.prompt_ids) + [1] * len(g)})
            break
    return rows


def teacher_rows(tokenizer: Any, prompts: Sequence[Prompt], texts: Mapping[str, str]) -> list[dict[str, Any]]:
    """Scoring rows of an external teacher's answers (``texts[prompt_id]``): the prompt in the
    scored model's chat template, the teacher's text re-tokenized by the scored model's tokenizer,
    then its end-of-turn token. Re-tokenizing is lossy (the teacher's own tokens are unknown);
    rows say so with ``tokens_source = "retokenized"``."""
    rows = []
    for p in prompts:
        if p.prompt_id not in texts:
            continue
        ctx = tokenizer.apply_chat_template([m.to_dict() for m in p.messages], add_generation_prompt=True, tokenize=False)
        cids = list(tokenizer(ctx, add_special_tokens=False)["input_ids"])
        gids = list(tokenizer(texts[p.prompt_id], add_special_tokens=False)["input_ids"])
        if tokenizer.eos_token_id is not None:
            gids.append(int(tokenizer.eos_token_id))
        rows.append({"prompt_id": p.prompt_id, "input_ids": cids + gids, "loss_mask": [0] * len(cids) + [1] * len(gids),
                     "tokens_source": "retokenized"})
    return rows


def compatibility(current: Any, tokenizer: Any, historical: Sequence[Rollout], prompts: Sequence[Prompt],
                  other: Any | None = None, max_tokens: int = 96, seed: int = 0, temperature: float = 0.7,
                  tries: int = 4, verify: Callable[[Prompt, str], bool] | None = None,
                  teacher_texts: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Mean token NLL under ``current`` (lower = closer to the current policy) of:

    - ``historical``: the stored (verified) rollouts, one per prompt, exact stored tokens;
    - ``current``: the current model's own samples at ``temperature``, the first correct of
      ``tries`` per prompt (``verify``; None keeps the first sample, unfiltered);
    - ``other``: another model's correct samples, drawn the same way (when given);
    - ``teacher``: an external teacher's text per prompt (``teacher_texts``), re-tokenized.

    Each entry: ``{mean_nll, tokens, rows}``. ``common`` repeats every source's mean over only the
    prompts all the present sources cover, so the comparison is on the same prompts.
    """
    from gfcr.generate.engines.hf import HFEngine
    from gfcr.train.sft import mean_token_nll

    pad = tokenizer.pad_token_id
    hist_rows = [{"prompt_id": r.prompt_id, **row} for r, row in zip(historical, rows_from_rollouts(historical),
                                                                       strict=True)]
    sources: dict[str, list[dict[str, Any]]] = {"historical": hist_rows}
    eng = HFEngine(current, tokenizer=tokenizer, policy_version="current")
    sources["current"] = sample_rows(eng, prompts, max_tokens, temperature, seed, n=tries if verify else 1, verify=verify)
    if other is not None:
        oeng = HFEngine(other, tokenizer=tokenizer, policy_version="other")
        sources["other"] = sample_rows(oeng, prompts, max_tokens, temperature, seed, n=tries if verify else 1,
                                       verify=verify)
    if teacher_texts:
        sources["teacher"] = teacher_rows(tokenizer, prompts, teacher_texts)
    out: dict[str, Any] = {"temperature": temperature, "filtered_for_correctness": verify is not None}
    for name, rows in sources.items():
        st = mean_token_nll(current, rows, pad) if rows else None
        out[name] = {"mean_nll": None if st is None else st.mean_nll, "tokens": 0 if st is None else st.tokens,
                     "rows": len(rows)}
    common = set.intersection(*[{r["prompt_id"] for r in rows} for rows in sources.values()]) if sources else set()
    out["common"] = {"prompts": len(common)}
    if common:
        for name, rows in sources.items():
            sub = [r for r in rows if r["prompt_id"] in common]
            out["common"][name] = mean_token_nll(current, sub, pad).mean_nll
    return out


def solved_prompt_ids(store: Any, run: str | None = None, steps: tuple[int, int] | None = None,
                      task: str | None = None) -> list[str]:
    """Prompts with at least one verified-successful rollout in the window."""
    t = store.scan(run=run, steps=steps, verified=True, task=task, columns=["prompt_id"])
    return sorted(set(t.column("prompt_id").to_pylist()))


def hardest_solved_prompts(store: Any, n: int, run: str | None = None, steps: tuple[int, int] | None = None,
                           task: str | None = None) -> list[dict[str, Any]]:
    """The ``n`` hardest prompts that history solved at least once: lowest historical solve rate
    (verified / judged rollouts in the window) first, then higher stated difficulty, then id.
    Rows ``{prompt_id, solved, judged, rate}`` (the seed: the hardest 100 training problems, of
    which those solved at least once are re-sampled by the final model)."""
    t = store.scan(run=run, steps=steps, task=task, columns=["prompt_id", "verified"])
    judged: Counter = Counter()
    solved: Counter = Counter()
    for pid, v in zip(t.column("prompt_id").to_pylist(), t.column("verified").to_pylist(), strict=True):
        if v is None:
            continue
        judged[pid] += 1
        solved[pid] += bool(v)
    ids = [p for p in judged if solved[p] > 0]
    diff = {p.prompt_id: (p.difficulty or 0.0) for p in store.prompts(ids=sorted(ids))} if ids else {}
    ids.sort(key=lambda p: (solved[p] / judged[p], -diff.get(p, 0.0), p))
    return [{"prompt_id": p, "solved": solved[p], "judged": judged[p], "rate": solved[p] / judged[p]} for p in ids[:n]]


def complementarity(engine: Any, prompts: Sequence[Prompt], k: int = 32, ks: Sequence[int] = (1, 8, 32),
                    max_tokens: int = 96, verifier: Any = "numeric", seed: int = 0,
                    temperature: float = 0.7) -> dict[str, Any]:
    """The current model's pass@k on historically solved ``prompts`` (sampled at ``temperature``);
    also the number of prompts it solves in at most half of its ``k`` samples."""
    from gfcr.evaluate import evaluate_model

    res = evaluate_model(engine, list(prompts), k=k, ks=[x for x in ks if x <= k], verifier=verifier, greedy=False,
                         max_tokens=max_tokens, seed=seed, temperature=temperature)
    half = sum(1 for p in res.per_prompt if p.get("correct", 0) <= k / 2)
    return {"n_prompts": res.n_prompts, "metrics": {m: v.__dict__ for m, v in res.metrics.items()},
            "temperature": temperature, "at_most_half": half,
            "solved_any": sum(1 for p in res.per_prompt if p.get("correct", 0) > 0)}
