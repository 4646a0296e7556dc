"""ROSS evaluation in the paper's shape: one column per task/benchmark, domain averages, and
every model comparison paired per prompt.

The seed's Tables 1/3/4 report, per model row, one score per benchmark and the average of each
domain (math, code, instruction following). Here a *benchmark* is any held-out prompt set: a
task source (``gfcr.tasks``: ``arith``, ``reasoning_gym``, ``jsonl_math``…, or ``pkg.mod:fn``),
or the store's prompts of a split; a benchmark whose prompts are env episodes is evaluated
through :func:`gfcr.evaluate.evaluate_episodes` (the same env and turn budget as training).

- :func:`evaluate_models`: every model on every benchmark (same prompts, same sampling
  parameters, ``temperature`` honoured), each result keeping its per-prompt outcomes;
- :func:`paired_comparisons`: model A minus model B per benchmark and metric, paired per prompt
  (exact McNemar for greedy pass@1, paired bootstrap + sign-flip test for pass@k), with the
  interval of the difference and its p-value;
- :func:`comparison_table` / :func:`paired_table`: Markdown renderings that say in words when a
  difference is not significant.

Departure: the paper reports point scores (no intervals or tests); the miniature here is small
enough that a difference must be tested before it is claimed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from gfcr.records import Prompt


def benchmark_prompts(bench: Any, store: Any = None, default_task: str | None = None) -> list[Prompt]:
    """The prompts of one benchmark config (``gfcr.ross.config.BenchmarkConfig``), sorted and cut to
    ``n_prompts``; refuses a set with repeated prompt ids (a paired test needs distinct prompts)."""
    if bench.source == "store":
        if store is None:
            raise ValueError(f"benchmark {bench.name!r} reads the store's prompts: open a store")
        ps = sorted(store.prompts(split=bench.split, task=bench.task or default_task), key=lambda p: p.prompt_id)
        if not ps:
            raise ValueError(f"benchmark {bench.name!r}: the store has no prompts of split {bench.split!r}; "
                             "give the benchmark a task source (source: arith, reasoning_gym, …) or add them")
    else:
        from gfcr.tasks import make_source

        params = dict(bench.params)
        params.setdefault("split", bench.split)
        if bench.source in ("arith", "reasoning_gym"):
            params.setdefault("n", bench.n_prompts)
        ps = list(make_source(bench.source, **params).prompts())
    ps = ps[: bench.n_prompts]
    ids = [p.prompt_id for p in ps]
    if len(set(ids)) != len(ids):
        raise ValueError(f"benchmark {bench.name!r} has repeated prompt ids: a paired comparison needs distinct prompts")
    return ps


def make_verify_fn(name: str, params: dict[str, Any] | None = None) -> Callable[[Prompt, str], bool]:
    """``(prompt, completion) -> bool`` with the gfcr.filters verifier ``name`` configured by
    ``params``; the task's stated answer format is passed along (read strictly by default)."""
    from gfcr.filters.verifiers import get_verifier, stated_answer_format

    v = get_verifier(name, **(params or {}))

    def fn(prompt: Prompt, completion: str) -> bool:
        return bool(v.verify(completion, answer=prompt.answer, tests=prompt.tests,
                             answer_format=stated_answer_format(prompt)).passed)

    fn.__name__ = name
    return fn


def evaluate_one(engine: Any, prompts: Sequence[Prompt], bench: Any, ev: Any) -> dict[str, Any]:
    """One model on one benchmark → ``EvalResult.to_dict()`` (per-prompt outcomes included)."""
    from gfcr.evaluate import evaluate_episodes, evaluate_model

    verify = make_verify_fn(bench.verifier or ev.verifier, bench.verifier_params or ev.verifier_params)
    common = dict(k=ev.k, ks=ev.ks if ev.k > 0 else None, verifier=verify, greedy=ev.greedy,
                  temperature=ev.temperature, top_p=ev.top_p, max_tokens=bench.max_tokens or ev.max_tokens,
                  seed=ev.seed, allow_truncated=ev.allow_truncated)
    if bench.episodes is not None:
        e = bench.episodes
        res = evaluate_episodes(engine, list(prompts), env=e.env, max_turns=e.max_turns, obs_role=e.obs_role,
                                reward_source=e.reward_source, **common)
    else:
        res = evaluate_model(engine, list(prompts), batch_size=ev.batch_size, **common)
    out = res.to_dict()
    out["info"]["benchmark"] = bench.name
    out["info"]["domain"] = bench.domain
    return out


def evaluate_models(models: dict[str, Any], tokenizer: Any, benchmarks: Sequence[tuple[Any, Sequence[Prompt]]],
                    ev: Any, load: Callable[[Any], Any] | None = None, log: Any = None,
                    on_result: Callable[[dict[str, dict[str, Any]]], None] | None = None) -> dict[str, dict[str, Any]]:
    """``{model: {benchmark: EvalResult dict}}`` in the order of ``models``. ``models`` maps a row
    name to a loaded model or a path (loaded one at a time with ``load``, so one model is in memory
    at once). ROSS and upstream are evaluated first, so an interrupted run has its main pair;
    ``on_result`` sees the results so far after each model."""
    from gfcr.generate.engines.hf import HFEngine

    first = [m for m in ("ross", "upstream") if m in models]
    out: dict[str, dict[str, Any]] = {}
    for name in first + [m for m in models if m not in first]:
        m = models[name]
        model = load(m) if load is not None and isinstance(m, str) else m
        eng = HFEngine(model, tokenizer=tokenizer, policy_version=name)
        out[name] = {}
        for bench, prompts in benchmarks:
            out[name][bench.name] = evaluate_one(eng, prompts, bench, ev)
            if log is not None:
                m0 = headline_metric(out[name][bench.name])
                log(f"[ross] evaluate {name} on {bench.name}: {m0} {100 * out[name][bench.name]['metrics'][m0]['value']:.1f}%")
        del eng, model
        if on_result is not None:
            on_result(out)
    return {name: out[name] for name in models}


def headline_metric(res: dict[str, Any]) -> str:
    """The metric a table column shows: ``pass@1`` when sampled, else ``greedy_pass@1``."""
    return "pass@1" if "pass@1" in res["metrics"] else "greedy_pass@1"


def domain_averages(results: dict[str, dict[str, Any]], metric: str | None = None) -> dict[str, dict[str, float]]:
    """``{model: {domain: mean over that domain's benchmarks, "all": mean over benchmarks}}``."""
    out: dict[str, dict[str, float]] = {}
    for model, by_bench in results.items():
        doms: dict[str, list[float]] = {}
        for res in by_bench.values():
            m = metric or headline_metric(res)
            if m in res["metrics"]:
                doms.setdefault(res["info"].get("domain", "default"), []).append(res["metrics"][m]["value"])
        out[model] = {d: float(np.mean(v)) for d, v in doms.items()}
        allv = [x for v in doms.values() for x in v]
        out[model]["all"] = float(np.mean(allv)) if allv else float("nan")
    return out


def paired_comparisons(results: dict[str, dict[str, Any]], pairs: Sequence[tuple[str, str]],
                       metrics: Sequence[str] | None = None, seed: int = 0) -> list[dict[str, Any]]:
    """A minus B for each ``(A, B)`` in ``pairs`` (both present), each benchmark and metric."""
    from gfcr.evaluate import compare_paired

    rows = []
    for a, b in pairs:
        if a not in results or b not in results or a == b:
            continue
        for bench, ra in results[a].items():
            rb = results[b].get(bench)
            if rb is None:
                continue
            for m in metrics or [k for k in ra["metrics"] if not k.startswith("avg@")]:
                if m not in ra["metrics"] or m not in rb["metrics"]:
                    continue
                d = compare_paired(ra, rb, m, seed=seed)
                rows.append({"a": a, "b": b, "benchmark": bench, **d.to_dict()})
    return rows


def default_pairs(models: Sequence[str]) -> list[tuple[str, str]]:
    """ROSS against every other row; ROSS w/o mask against positive SFT (trajectory filtering)."""
    pairs = [("ross", m) for m in models if m != "ross"]
    if "ross_nomask" in models and "positive_sft" in models:
        pairs.append(("ross_nomask", "positive_sft"))
    if "ross_from_base" in models and "ross" in models:
        pairs.append(("ross_from_base", "ross"))
    return pairs


def comparison_table(evaluation: dict[str, Any]) -> str:
    """Markdown: one row per model, one column per benchmark (headline metric with its 95%
    bootstrap CI), the domain averages and the overall average; then the paired comparisons.

    ``evaluation`` is what ``stage_evaluate`` returns: ``{"results", "paired", "aliases"}``.
    """
    results = evaluation.get("results") or {}
    if not results:
        return "(no results)"
    aliases = evaluation.get("aliases") or {}
    benches = list(next(iter(results.values())).keys())
    first = next(iter(results.values()))
    doms = sorted({first[b]["info"].get("domain", "default") for b in benches})
    avgs = domain_averages(results)
    head = [f"{b} ({headline_metric(first[b])}, n={first[b]['n_prompts']})" for b in benches]
    head += [f"{d} avg" for d in doms] if len(doms) > 1 or len(benches) > 1 else []
    lines = ["| model | " + " | ".join(head) + " |", "|---|" + "---|" * len(head)]
    for model, by_bench in results.items():
        cells = []
        for b in benches:
            r = by_bench[b]
            m = r["metrics"][headline_metric(r)]
            cells.append(f"{100 * m['value']:.1f} [{100 * m['ci_low']:.1f}, {100 * m['ci_high']:.1f}]")
        if len(head) > len(benches):
            cells += [f"{100 * avgs[model][d]:.1f}" for d in doms]
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    for name, same in aliases.items():
        lines.append(f"| {name} | = {same} (identical training data: the judge discarded no rollout) |"
                     + " |" * (len(head) - 1))
    paired = evaluation.get("paired") or []
    if paired:
        lines += ["", paired_table(paired)]
    return "\n".join(lines)


def paired_table(paired: Sequence[dict[str, Any]]) -> str:
    """Markdown of paired differences, with 'not significant' spelled out."""
    lines = ["Paired per prompt (A − B, percentage points; McNemar exact for greedy, paired bootstrap + "
             "sign-flip test for sampled pass@k):", "",
             "| A − B | benchmark | metric | diff [95% CI] | A better / B better | p | verdict |",
             "|---|---|---|---|---|---|---|"]
    for r in paired:
        verdict = ("**significant**" if r["significant"] else "not significant")
        lines.append(f"| {r['a']} − {r['b']} | {r['benchmark']} | {r['metric']} | {100 * r['diff']:+.1f} "
                     f"[{100 * r['ci_low']:+.1f}, {100 * r['ci_high']:+.1f}] | {r['a_better']} / {r['b_better']} | "
                     f"{r['p_value']:.3g} | {verdict} |")
    return "\n".join(lines)
