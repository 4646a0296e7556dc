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
- :func:`domain_comparisons`: the same on each domain average and the overall average
  (:func:`paired_average_test`: bootstrap stratified by benchmark, sign-flip permutation test);
- :func:`with_holm`: Holm's correction over every test of one table (:func:`holm`), which then
  decides "significant";
- :func:`comparison_table` / :func:`paired_table`: Markdown renderings that say in words when a
  difference is not significant.

Departure: the paper reports point scores (no intervals or tests); the miniature here is small
enough that a difference must be tested before it is claimed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
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

    method = bench.verifier or ev.verifier  # a benchmark's own verifier replaces evaluate's, name and params
    verify = make_verify_fn(method.name, method.params)
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


class RecordingEngine:
    """An engine that hands each request's results to ``sink(request, results, texts)`` after
    generating (the texts decoded with ``tokenizer`` when the engine gives none); everything else is
    the wrapped engine's."""

    def __init__(self, engine: Any, sink: Callable[[Any, list[Any], list[str]], None], tokenizer: Any = None):
        self._engine, self._sink = engine, sink
        self._tok = tokenizer if tokenizer is not None else getattr(engine, "tokenizer", None)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def generate(self, requests: Sequence[Any]) -> list[list[Any]]:
        out = self._engine.generate(requests)
        for req, results in zip(requests, out, strict=True):
            texts = [r.text if r.text is not None else self._tok.decode(list(r.token_ids), skip_special_tokens=True)
                     for r in results]
            self._sink(req, list(results), texts)
        return out


def eval_engine(m: Any, name: str, tokenizer: Any, ev: Any, load: Callable[[Any], Any] | None = None,
                engines: Mapping[str, Any] | None = None) -> Any:
    """The engine of ``ev.engine`` for one model row: ``hf`` wraps the loaded module (``load(path)``
    when ``m`` is a path); any other engine is built from the path by
    :func:`gfcr.generate.engines.make_engine` (``engines``: a composer's own names), with
    ``ev.engine``'s params (``*_env`` keys read from the environment)."""
    engine = getattr(ev, "engine", None)
    name_e = engine.name if engine is not None else "hf"
    params = engine.kwargs() if engine is not None else {}
    if name_e == "hf":
        from gfcr.generate.engines.hf import HFEngine

        model = load(m) if load is not None and isinstance(m, str) else m
        return HFEngine(model, tokenizer=tokenizer, policy_version=name, **params)
    if not isinstance(m, str):
        raise ValueError(f"evaluate.engine {name_e!r} builds each model from its path; row {name!r} is a loaded "
                         "model (give its checkpoint path, or use engine hf)")
    from gfcr.generate.engines import make_engine

    return make_engine(name_e, engines, model=None if m == "default" else m, policy_version=name, **params)


def evaluate_models(models: dict[str, Any], tokenizer: Any, benchmarks: Sequence[tuple[Any, Sequence[Prompt]]],
                    ev: Any, load: Callable[[Any], Any] | None = None, log: Any = None,
                    on_result: Callable[[dict[str, dict[str, Any]]], None] | None = None,
                    engines: Mapping[str, Any] | None = None,
                    on_generation: Callable[[dict[str, Any]], None] | None = None) -> dict[str, dict[str, Any]]:
    """``{model: {benchmark: EvalResult dict}}`` in the order of ``models``. ``models`` maps a row
    name to a loaded model or a path; each row gets its own engine (:func:`eval_engine`:
    ``ev.engine``, hf by default), released before the next, so one model is in memory at once.
    ROSS and upstream are evaluated first, so an interrupted run has its main pair; ``on_result``
    sees the results so far after each model; ``on_generation`` gets one dict per model, benchmark,
    prompt and decoding (``model, benchmark, prompt_id, greedy, texts``)."""
    import gc

    first = [m for m in ("ross", "upstream") if m in models]
    out: dict[str, dict[str, Any]] = {}
    for name in first + [m for m in models if m not in first]:
        eng = eval_engine(models[name], name, tokenizer, ev, load, engines)
        out[name], run_eng = {}, eng
        for bench, prompts in benchmarks:
            run_eng = eng
            if on_generation is not None:
                def sink(req: Any, results: list[Any], texts: list[str], _b: str = bench.name, _m: str = name) -> None:
                    on_generation({"model": _m, "benchmark": _b, "prompt_id": req.request_id,
                                   "greedy": req.params.temperature == 0, "texts": texts})

                run_eng = RecordingEngine(eng, sink, tokenizer)
            out[name][bench.name] = evaluate_one(run_eng, prompts, bench, ev)
            if log is not None:
                m0 = headline_metric(out[name][bench.name])
                log(f"[ross] evaluate {name} on {bench.name}: {m0} {100 * out[name][bench.name]['metrics'][m0]['value']:.1f}%")
        close = getattr(eng, "close", None)
        if callable(close):
            close()
        del eng, run_eng
        gc.collect()
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


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979, "A simple sequentially rejective multiple
    test procedure"), in the input order. With the ``m`` p-values sorted ascending,
    ``adj_(i) = min(1, max_{j <= i} (m - j + 1) p_(j))`` (1-based ``j``); rejecting where
    ``adj < alpha`` controls the family-wise error rate at ``alpha``.

    Example: ``holm([0.01, 0.04, 0.03, 0.005])`` → ``[0.03, 0.06, 0.06, 0.02]`` (sorted: 4 × 0.005 =
    0.02; 3 × 0.01 = 0.03; 2 × 0.03 = 0.06; 1 × 0.04 = 0.04 → 0.06, the running maximum).
    """
    p = np.asarray(p_values, float)
    m = p.size
    if m == 0:
        return []
    order = np.argsort(p, kind="stable")
    adj_sorted = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    out = np.empty(m)
    out[order] = adj_sorted
    return [float(x) for x in out]


def paired_average_test(diffs_by_bench: dict[str, Sequence[float]], n_boot: int = 2000, seed: int = 0,
                        exact_max: int = 16, n_perm: int = 10_000) -> dict[str, Any]:
    """A minus B on an **average over benchmarks** (a domain average, or the overall one), paired
    per prompt.

    ``diffs_by_bench[b]`` holds the per-prompt differences ``a_p - b_p`` of benchmark ``b`` (shape
    ``[n_b]``). The statistic is the mean over benchmarks of each benchmark's mean difference,
    which is exactly the difference of the two models' domain averages as the table prints them.
    - Interval: a percentile bootstrap **stratified by benchmark** (prompts resampled within each
      benchmark, ``n_boot`` times).
    - p-value: a two-sided **sign-flip permutation** test (under H0 each prompt's difference is
      symmetric about 0). It is exact, enumerating every sign pattern, when at most ``exact_max``
      prompts differ; otherwise ``n_perm`` random flips with the +1 correction.

    Worked example: ``{"x": [1, 1, 0], "y": [1, 0]}`` → diff = (2/3 + 1/2) / 2 = 7/12. Of the 8 sign
    patterns of the three non-zero differences, 2 give ``|D| >= 7/12``, so p = 0.25.

    Departure: the paper reports point averages only, with no test; this is gfcr's test.
    """
    benches = [np.asarray(v, float) for v in diffs_by_bench.values() if len(v)]
    if not benches:
        raise ValueError("no paired prompts in any benchmark")
    w = np.concatenate([np.full(len(v), 1.0 / (len(v) * len(benches))) for v in benches])  # D = sum(w * d)
    d = np.concatenate(benches)
    obs = float(np.sum(w * d))
    rng = np.random.default_rng(seed)
    boots = np.zeros(n_boot)
    for v in benches:
        idx = rng.integers(0, len(v), size=(n_boot, len(v)))
        boots += v[idx].mean(axis=1) / len(benches)
    lo, hi = (float(x) for x in np.percentile(boots, [2.5, 97.5]))
    nz = np.flatnonzero(d != 0)
    tol = 1e-12
    if nz.size == 0:
        p, exact = 1.0, True
    elif nz.size <= exact_max:
        signs = 1 - 2 * ((np.arange(2 ** nz.size)[:, None] >> np.arange(nz.size)) & 1)
        stats = np.abs(signs @ (w[nz] * d[nz]))
        p, exact = float(np.mean(stats >= abs(obs) - tol)), True
    else:
        signs = rng.choice([-1.0, 1.0], size=(n_perm, nz.size))
        stats = np.abs(signs @ (w[nz] * d[nz]))
        p, exact = float((1 + np.sum(stats >= abs(obs) - tol)) / (n_perm + 1)), False
    return {"diff": obs, "ci_low": lo, "ci_high": hi, "p_value": p, "n": int(d.size),
            "a_better": int(np.sum(d > 0)), "b_better": int(np.sum(d < 0)),
            "test": "sign-flip exact" if exact else "sign-flip permutation"}


def domain_comparisons(results: dict[str, dict[str, Any]], pairs: Sequence[tuple[str, str]],
                       metrics: Sequence[str] | None = None, seed: int = 0) -> list[dict[str, Any]]:
    """A minus B on each **domain average** (domains with at least two benchmarks: a one-benchmark
    domain is its benchmark, already tested) and on the overall average (``"all"``, when there are
    two domains or more), for each pair and metric, by :func:`paired_average_test` over the prompts
    both models evaluated. Rows have the shape of :func:`paired_comparisons`'s, with
    ``benchmark = "<domain> avg"``."""
    from gfcr.evaluate import per_prompt_values

    rows = []
    for a, b in pairs:
        if a not in results or b not in results or a == b:
            continue
        shared = [bn for bn in results[a] if bn in results[b]]
        doms: dict[str, list[str]] = {}
        for bn in shared:
            doms.setdefault(results[a][bn]["info"].get("domain", "default"), []).append(bn)
        groups = {d: bs for d, bs in doms.items() if len(bs) >= 2}
        if len(doms) >= 2:
            groups["all"] = shared
        for dom, bs in sorted(groups.items()):
            ms = metrics or [k for k in results[a][bs[0]]["metrics"] if not k.startswith("avg@")]
            for m in ms:
                if not all(m in results[a][bn]["metrics"] and m in results[b][bn]["metrics"] for bn in bs):
                    continue
                diffs = {}
                for bn in bs:
                    va, vb = per_prompt_values(results[a][bn], m), per_prompt_values(results[b][bn], m)
                    diffs[bn] = [va[i] - vb[i] for i in sorted(set(va) & set(vb))]
                t = paired_average_test(diffs, seed=seed)
                rows.append({"a": a, "b": b, "benchmark": f"{dom} avg", "metric": m, **t,
                             "significant": t["p_value"] < 0.05 and (t["ci_low"] > 0 or t["ci_high"] < 0)})
    return rows


def with_holm(rows: Sequence[dict[str, Any]], alpha: float = 0.05) -> list[dict[str, Any]]:
    """The rows with ``p_holm`` (:func:`holm` over **every row given**: one table's family of
    tests, all pairs, benchmarks, domain averages and metrics) and ``significant`` re-decided as
    ``p_holm < alpha`` and the (unadjusted) 95% interval excluding 0; ``p_value`` stays the
    unadjusted one."""
    adj = holm([r["p_value"] for r in rows])
    return [{**r, "p_holm": p, "significant": p < alpha and (r["ci_low"] > 0 or r["ci_high"] < 0)}
            for r, p in zip(rows, adj, strict=True)]


def all_comparisons(results: dict[str, dict[str, Any]], pairs: Sequence[tuple[str, str]],
                    metrics: Sequence[str] | None = None, seed: int = 0) -> list[dict[str, Any]]:
    """Per-benchmark (:func:`paired_comparisons`) and domain-average (:func:`domain_comparisons`)
    rows together, Holm-corrected as one family (:func:`with_holm`): what the ROSS table shows."""
    return with_holm(paired_comparisons(results, pairs, metrics, seed)
                     + domain_comparisons(results, pairs, metrics, seed))


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
    """Markdown of paired differences, with 'not significant' spelled out (decided on the Holm
    adjusted p-value when the rows carry one)."""
    holm_on = any("p_holm" in r for r in paired)
    lines = ["Paired per prompt (A − B, percentage points; McNemar exact for greedy, paired bootstrap + "
             "sign-flip test for sampled pass@k; domain averages: bootstrap stratified by benchmark + sign-flip test"
             + ("; p Holm-adjusted over every test in this table" if holm_on else "") + "):", "",
             "| A − B | benchmark | metric | diff [95% CI] | A better / B better | p | "
             + ("p (Holm) | " if holm_on else "") + "verdict |",
             "|---|---|---|---|---|---|" + ("---|" if holm_on else "") + "---|"]
    for r in paired:
        verdict = ("**significant**" if r["significant"] else "not significant")
        holm_cell = f"{r['p_holm']:.3g} | " if holm_on and "p_holm" in r else ("— | " if holm_on else "")
        lines.append(f"| {r['a']} − {r['b']} | {r['benchmark']} | {r['metric']} | {100 * r['diff']:+.1f} "
                     f"[{100 * r['ci_low']:+.1f}, {100 * r['ci_high']:+.1f}] | {r['a_better']} / {r['b_better']} | "
                     f"{r['p_value']:.3g} | {holm_cell}{verdict} |")
    return "\n".join(lines)
