"""Evaluation: pass@k (unbiased), avg@k, greedy pass@1, bootstrap confidence intervals over prompts.

The maths is pure (:func:`pass_at_k`, :func:`bootstrap_ci`, :func:`summarize`); :func:`evaluate_model`
composes an engine (``gfcr.generate``'s ``Engine`` protocol) with a verifier and returns an
:class:`EvalResult` that serialises to JSON. ROSS reuses the same functions to compare policies.

pass@k is Chen et al. 2021 ("Evaluating Large Language Models Trained on Code", arXiv 2107.03374):
with ``n`` samples of which ``c`` are correct, ``pass@k = 1 − C(n−c, k) / C(n, k)``, averaged over
prompts. It is unbiased for ``k ≤ n``; computed as a product to avoid huge binomials.
avg@k is the mean per-sample accuracy ``c / n`` (the expected pass@1 under sampling).
Confidence intervals are percentile bootstrap over prompts (prompts resampled with replacement).

Two models are compared *paired per prompt* (:func:`compare_paired`): exact McNemar for a binary
outcome per prompt (greedy pass@1), a paired bootstrap interval of the mean difference with a
sign-flip permutation p-value otherwise (pass@k, avg@k).

:func:`evaluate_episodes` is the multi-turn counterpart: each sample is a whole policy ↔ env episode
(``gfcr.generate``'s ``MultiTurn`` topology, the same env and ``max_turns`` as training), judged by
the verifier on its final assistant turn and/or the env's own success signal (``reward_source``),
and summarised by the same :func:`summarize`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field

from gfcr.config import StrictModel
from gfcr.records import Prompt

#: finish reasons of a generation that did not end by itself (never counted correct by default)
TRUNCATED_FINISHES = ("length", "abort")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one prompt: ``1 − C(n−c, k)/C(n, k)``.

    Examples: ``pass_at_k(4, 1, 1) = 0.25``; ``pass_at_k(4, 1, 2) = 1 − C(3,2)/C(4,2) = 0.5``;
    ``pass_at_k(5, 0, 3) = 0``; ``pass_at_k(5, 3, 3) = 1`` (fewer than k failures).
    """
    if not (0 <= c <= n):
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not (1 <= k <= n):
        raise ValueError(f"pass@{k} needs 1 <= k <= n samples per prompt (n={n}); sample more or lower k")
    if n - c < k:
        return 1.0
    # C(n-c, k)/C(n, k) = prod_{i=n-c+1}^{n} (1 - k/i)
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def bootstrap_ci(
    values: Sequence[float] | np.ndarray, n_boot: int = 1000, alpha: float = 0.05, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean of per-prompt ``values`` ``[P]`` → ``(low, high)``.

    Prompts are resampled with replacement ``n_boot`` times; returns the ``alpha/2`` and
    ``1 − alpha/2`` quantiles of the resampled means. A constant vector gives ``(v, v)``.
    """
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, v.size, size=(n_boot, v.size))
    means = v[idx].mean(axis=1)
    lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return (float(lo), float(hi))


class EvalConfig(StrictModel):
    """How held-out evaluation samples: the one eval vocabulary. ``gfcr train``'s ``eval:`` and
    ROSS's ``evaluate:`` sections extend it (when to evaluate; which prompts), and ``gfcr eval``'s
    flags are checked through it."""

    k: int = Field(4, ge=0, description="Samples per prompt for pass@k / avg@k (0 = greedy only).")
    greedy: bool = Field(True, description="Also compute greedy pass@1.")
    max_tokens: int | None = Field(None, ge=1, description="New tokens per eval sample (None: the run's generation length).")
    temperature: float = Field(0.7, gt=0.0, description="Sampling temperature for pass@k.")


@dataclass
class Metric:
    """A mean over prompts with its bootstrap interval."""

    value: float
    ci_low: float
    ci_high: float

    def __str__(self) -> str:
        return f"{self.value:.3f} [{self.ci_low:.3f}, {self.ci_high:.3f}]"


@dataclass
class EvalResult:
    """Evaluation summary: metric name (``pass@1``, ``pass@4``, ``avg@4``, ``greedy_pass@1``) → :class:`Metric`."""

    n_prompts: int
    n_samples: int
    metrics: dict[str, Metric]
    per_prompt: list[dict[str, Any]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_prompts": self.n_prompts,
            "n_samples": self.n_samples,
            "metrics": {k: asdict(m) for k, m in self.metrics.items()},
            "per_prompt": self.per_prompt,
            "info": self.info,
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True, default=str)

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(self.to_json())
        return p

    @classmethod
    def load(cls, path: str | Path) -> EvalResult:
        d = json.loads(Path(path).read_text())
        return cls(
            n_prompts=d["n_prompts"],
            n_samples=d["n_samples"],
            metrics={k: Metric(**m) for k, m in d["metrics"].items()},
            per_prompt=d.get("per_prompt", []),
            info=d.get("info", {}),
        )

    def summary(self) -> str:
        return ", ".join(f"{k} {m}" for k, m in self.metrics.items())


def summarize(
    correct: Mapping[str, Sequence[bool]],
    greedy: Mapping[str, bool] | None = None,
    ks: Sequence[int] | None = None,
    n_boot: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
) -> EvalResult:
    """Per-prompt correctness → :class:`EvalResult`.

    ``correct[prompt_id]`` is the list of sampled verdicts (all prompts the same length ``n``);
    ``greedy[prompt_id]`` the greedy verdict. ``ks`` defaults to ``{1, n}``. Metrics: ``pass@k`` for
    each k, ``avg@n`` and, when ``greedy`` is given, ``greedy_pass@1``.
    """
    ids = list(correct) if correct else list(greedy or {})
    metrics: dict[str, Metric] = {}
    per: dict[str, dict[str, Any]] = {pid: {"prompt_id": pid} for pid in ids}
    n = 0
    if correct:
        lens = {len(v) for v in correct.values()}
        if len(lens) != 1:
            raise ValueError(f"every prompt needs the same number of samples, got lengths {sorted(lens)}")
        n = lens.pop()
        ks = sorted(set(ks)) if ks else sorted({1, n})
        cs = np.array([int(sum(bool(x) for x in correct[pid])) for pid in ids])
        for k in ks:
            vals = np.array([pass_at_k(n, int(c), k) for c in cs])
            metrics[f"pass@{k}"] = Metric(float(vals.mean()), *bootstrap_ci(vals, n_boot, alpha, seed))
        acc = cs / n
        metrics[f"avg@{n}"] = Metric(float(acc.mean()), *bootstrap_ci(acc, n_boot, alpha, seed))
        for pid, c in zip(ids, cs, strict=True):
            per[pid]["n"] = n
            per[pid]["correct"] = int(c)
    if greedy is not None:
        missing = [pid for pid in ids if pid not in greedy]
        if missing:
            raise ValueError(f"greedy verdicts missing for {len(missing)} prompt(s), e.g. {missing[0]!r}")
        g = np.array([float(bool(greedy[pid])) for pid in ids])
        metrics["greedy_pass@1"] = Metric(float(g.mean()), *bootstrap_ci(g, n_boot, alpha, seed))
        for pid in ids:
            per[pid]["greedy_correct"] = bool(greedy[pid])
    return EvalResult(n_prompts=len(ids), n_samples=n, metrics=metrics, per_prompt=list(per.values()))


VerifyFn = Callable[[Prompt, str], bool]


def resolve_verifier(verifier: str | VerifyFn, params: dict[str, Any] | None = None) -> VerifyFn:
    """A ``(prompt, completion) -> bool`` from a callable or a ``gfcr.filters`` verifier name built
    with ``params`` (its config, e.g. ``{"lenient_fallback": True}``)."""
    if callable(verifier):
        if params:
            raise ValueError("verifier params apply to a verifier name, not to a callable")
        return verifier
    from gfcr.filters.verifiers import get_verifier

    v = get_verifier(verifier, **(params or {}))

    from gfcr.filters.verifiers import stated_answer_format

    def fn(prompt: Prompt, completion: str) -> bool:
        return bool(v.verify(completion, answer=prompt.answer, tests=prompt.tests,
                             answer_format=stated_answer_format(prompt)).passed)

    fn.__name__ = verifier
    return fn


def evaluate_model(
    engine: Any,
    prompts: Sequence[Prompt],
    *,
    k: int = 4,
    ks: Sequence[int] | None = None,
    verifier: str | VerifyFn = "numeric",
    verifier_params: dict[str, Any] | None = None,
    greedy: bool = True,
    temperature: float = 0.7,
    top_p: float = 1.0,
    max_tokens: int = 128,
    seed: int = 0,
    n_boot: int = 1000,
    batch_size: int = 32,
    tokenizer: Any = None,
    progress: bool = False,
    allow_truncated: bool = False,
) -> EvalResult:
    """Sample ``k`` completions (and one greedy) per prompt with ``engine``, verify, summarize.

    Long because: its signature (16 parameters) takes 19 lines; the body runs sampled then greedy decoding
    through one ``run`` closure over the progress bar and the truncation count.

    ``engine`` follows ``gfcr.generate``'s ``Engine`` protocol (``generate(list[GenRequest])``).
    ``verifier`` is a callable or a verifier name built with ``verifier_params`` (for SmolLM2-135M on
    arithmetic, ``{"lenient_fallback": True}``: it rarely writes the ``Answer: N`` line the task asks
    for). ``k = 0`` skips sampling (greedy only). Completions are taken from ``GenResult.text`` or, when
    absent, decoded with ``tokenizer`` (or ``engine.tokenizer``). A completion cut by the token
    limit (``finish_reason`` length/abort) counts as wrong unless ``allow_truncated``;
    ``info["truncated"]`` counts them. ``progress`` shows a bar on stderr (prompts done per phase,
    elapsed time), so stdout keeps only the result.
    """
    from gfcr.generate.engines.base import GenRequest, SamplingParams

    _check_eval_args(k, greedy, prompts)
    verify = resolve_verifier(verifier, verifier_params)
    tok = tokenizer if tokenizer is not None else getattr(engine, "tokenizer", None)

    def text_of(res: Any) -> str:
        if res.text is not None:
            return res.text
        if tok is None:
            raise ValueError("engine results carry no text and no tokenizer was given to decode them")
        return tok.decode(list(res.token_ids), skip_special_tokens=True)

    n_cut = [0]

    def judge(p: Prompt, r: Any) -> bool:
        if not allow_truncated and r.finish_reason in TRUNCATED_FINISHES:
            n_cut[0] += 1
            return False
        return bool(verify(p, text_of(r)))

    bar = _eval_progress(progress)

    def run(params: SamplingParams, desc: str) -> dict[str, list[bool]]:
        out: dict[str, list[bool]] = {}
        task = bar.add_task(desc, total=len(prompts))
        for i in range(0, len(prompts), batch_size):
            chunk = prompts[i : i + batch_size]
            reqs = [
                GenRequest(messages=[m.to_dict() for m in p.messages], params=params, request_id=p.prompt_id)
                for p in chunk
            ]
            for p, results in zip(chunk, engine.generate(reqs), strict=True):
                out[p.prompt_id] = [judge(p, r) for r in results]
            bar.advance(task, len(chunk))
        return out

    t0 = time.perf_counter()
    sampled: dict[str, list[bool]] = {}
    greedy_v: dict[str, bool] | None = None
    with bar:
        if k > 0:
            sampled = run(SamplingParams(n=k, temperature=temperature, top_p=top_p, max_tokens=max_tokens, seed=seed),
                          f"eval: {k} samples per prompt")
        if greedy:
            g = run(SamplingParams(n=1, temperature=0.0, max_tokens=max_tokens, seed=seed), "eval: greedy")
            greedy_v = {pid: v[0] for pid, v in g.items()}
    res = summarize(sampled, greedy_v, ks=ks if k > 0 else None, n_boot=n_boot, seed=seed)
    res.info.update(_run_info(engine, verify, prompts, k, temperature, top_p, max_tokens, seed, t0))
    res.info.update(truncated=n_cut[0], allow_truncated=allow_truncated)
    return res


def _eval_progress(enabled: bool) -> Any:
    """A rich progress bar on stderr (disabled: a no-op with the same methods)."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("prompts"), TimeElapsedColumn(), disable=not enabled, console=Console(stderr=True))


def eval_prompts(tasks: str, n: int, split: str = "test", seed: int = 0,
                 **task_args: Any) -> tuple[list[Prompt], list[str]]:
    """Up to ``n`` held-out prompts of each comma-separated task source, and notes for the reader.

    A source whose split holds fewer than ``n`` distinct prompts (e.g. ``arith``'s one-digit sums:
    100 expressions, 14 of them in ``test``) gives all it has, with a note, instead of failing:
    an evaluation over every held-out prompt is what was asked for. Other errors raise ``ValueError``.
    """
    from gfcr.tasks import PoolTooSmall, make_source

    prompts: list[Prompt] = []
    notes: list[str] = []
    for name in [t.strip() for t in tasks.split(",") if t.strip()]:
        try:
            prompts.extend(make_source(name, n=n, split=split, seed=seed, **task_args).prompts())
        except PoolTooSmall as e:
            prompts.extend(e.prompts)
            notes.append(f"{name}: the {split} split holds only {len(e.prompts)} distinct prompts at these settings; "
                         f"evaluating all {len(e.prompts)} (asked for {n})")
    return prompts, notes


def _check_eval_args(k: int, greedy: bool, prompts: Sequence[Prompt]) -> None:
    if k < 0:
        raise ValueError("k must be >= 0")
    if k == 0 and not greedy:
        raise ValueError("nothing to evaluate: k=0 and greedy=False")
    if not prompts:
        raise ValueError("no prompts to evaluate")


def _run_info(engine: Any, verify: Any, prompts: Sequence[Prompt], k: int, temperature: float, top_p: float,
              max_tokens: int, seed: int, t0: float) -> dict[str, Any]:
    """What an evaluation ran with (``EvalResult.info``)."""
    return {
        "engine": getattr(engine, "name", type(engine).__name__),
        "policy_version": getattr(engine, "policy_version", "unknown"),
        "k": k,
        "temperature": temperature,
        "top_p": top_p,
        "max_tokens": max_tokens,
        "seed": seed,
        "verifier": getattr(verify, "__name__", "callable"),
        "seconds": round(time.perf_counter() - t0, 3),
        "tasks": sorted({p.task for p in prompts}),
    }


def evaluate_episodes(
    engine: Any,
    prompts: Sequence[Prompt],
    *,
    env: str | Callable[[], Any],
    max_turns: int = 4,
    obs_role: str = "user",
    k: int = 4,
    ks: Sequence[int] | None = None,
    verifier: str | VerifyFn = "numeric",
    reward_source: str = "verifier",
    env_weight: float = 0.5,
    greedy: bool = True,
    temperature: float = 0.7,
    top_p: float = 1.0,
    max_tokens: int = 128,
    seed: int = 0,
    n_boot: int = 1000,
    allow_truncated: bool = False,
) -> EvalResult:
    """Run ``k`` sampled (and one greedy) env episodes per prompt, judge each, summarize as pass@k.

    Long because: its signature (17 parameters) takes 20 lines; the body runs sampled then greedy episodes
    through one ``run`` closure and summarises them.

    ``env`` is an env name (``calculator``, ``python``), ``'pkg.module:Class'`` or a zero-argument
    factory; ``max_turns`` and ``max_tokens`` (per turn) as in training. An episode counts as
    correct when :func:`gfcr.generate.envs.episode_reward` under ``reward_source`` (``verifier``,
    ``env``, ``env_or_verifier``, ``weighted``) gives ``verified = True``; the verifier sees the
    final assistant turn (never when that turn was cut by the token limit, unless
    ``allow_truncated``). ``engine`` needs a local tokenizer (``engine.tokenizer``: hf, vllm).
    ``info`` adds the env, ``max_turns``, ``reward_source``, and over all episodes run (sampled and
    greedy) the mean number of turns, the share with an env signal and the finish reasons.
    """
    from gfcr.generate.engines.base import SamplingParams
    from gfcr.generate.envs import REWARD_SOURCES, episode_reward, last_assistant_text, make_env
    from gfcr.generate.topologies import MultiTurn

    _check_eval_args(k, greedy, prompts)
    if max_turns < 1:
        raise ValueError(f"max_turns must be >= 1, got {max_turns}")
    if reward_source not in REWARD_SOURCES:
        raise ValueError(f"unknown reward_source {reward_source!r}; choose one of {list(REWARD_SOURCES)}")
    verify = resolve_verifier(verifier)
    factory = (lambda: make_env(env)) if isinstance(env, str) else env
    by_id = {p.prompt_id: p for p in prompts}
    if len(by_id) != len(prompts):
        raise ValueError("prompt ids must be unique")
    episodes: list[Any] = []

    def run(n: int, params: SamplingParams, tag: str) -> dict[str, list[bool]]:
        topo = MultiTurn(env=factory, k=n, max_turns=max_turns, params=params, seed=seed, obs_role=obs_role)
        rs = topo.generate(engine, list(prompts), run_id=f"eval-{tag}")
        out: dict[str, list[tuple[int, bool]]] = {pid: [] for pid in by_id}
        for r in rs:
            p = by_id[r.prompt_id]
            cut = (r.finish_reason in TRUNCATED_FINISHES and not r.meta.get("max_turns_reached")
                   and not allow_truncated)
            v = False if cut else bool(verify(p, last_assistant_text(r.messages)))
            env_r, env_ok = r.signals.get("env_reward"), r.meta.get("env_success")
            _, passed, _ = episode_reward(reward_source, float(v), v, env_r, env_ok, env_weight)
            out[r.prompt_id].append((r.sample_index, passed is True))
            episodes.append(r)
        return {pid: [ok for _, ok in sorted(v)] for pid, v in out.items()}

    t0 = time.perf_counter()
    sampled: dict[str, list[bool]] = {}
    if k > 0:
        sampled = run(k, SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_tokens), "sampled")
    greedy_v: dict[str, bool] | None = None
    if greedy:
        g = run(1, SamplingParams(temperature=0.0, max_tokens=max_tokens), "greedy")
        greedy_v = {pid: v[0] for pid, v in g.items()}
    res = summarize(sampled, greedy_v, ks=ks if k > 0 else None, n_boot=n_boot, seed=seed)
    finishes: dict[str, int] = {}
    for r in episodes:
        finishes[r.finish_reason] = finishes.get(r.finish_reason, 0) + 1
    res.info.update(_run_info(engine, verify, prompts, k, temperature, top_p, max_tokens, seed, t0))
    res.info.update(
        {
            "env": episodes[0].meta.get("env", "env") if episodes else None,
            "max_turns": max_turns,
            "reward_source": reward_source,
            "turns_mean": float(np.mean([r.meta["turns"] for r in episodes])) if episodes else None,
            "env_signal_share": (float(np.mean(["env_reward" in r.signals for r in episodes]))
                                 if episodes else None),
            "finish_reasons": finishes,
        }
    )
    return res


# ---------------------------------------------------------------------------------------------
# Paired comparisons: two models on the same prompts
# ---------------------------------------------------------------------------------------------


@dataclass
class PairedDiff:
    """Model A minus model B on one metric, paired per prompt.

    ``diff`` is the mean per-prompt difference; ``ci_low``/``ci_high`` its paired percentile
    bootstrap interval; ``p_value`` two-sided (sign-flip permutation test for ``paired_bootstrap``,
    exact binomial for ``mcnemar``). ``a_better``/``b_better`` count prompts where one side is
    higher (for McNemar: the discordant pairs).
    """

    metric: str
    n: int
    diff: float
    ci_low: float
    ci_high: float
    p_value: float
    a_better: int
    b_better: int
    test: str

    @property
    def significant(self) -> bool:
        """The interval excludes 0 and p < 0.05."""
        return self.p_value < 0.05 and (self.ci_low > 0 or self.ci_high < 0)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "significant": self.significant}


def paired_bootstrap(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, n_boot: int = 2000,
                     alpha: float = 0.05, seed: int = 0, n_perm: int = 10000, metric: str = "") -> PairedDiff:
    """Paired comparison of per-prompt values ``a[i]`` vs ``b[i]`` (same prompts, same order).

    Interval: percentile bootstrap of the mean difference, prompts resampled with replacement
    (the pair moves together). p-value: sign-flip permutation test of the per-prompt differences
    (under H0 each difference is as likely ``+d`` as ``−d``); exact over all ``2^n`` flips when
    ``n <= 16``, else ``n_perm`` random flips with the ``(hits + 1) / (n_perm + 1)`` estimator.

    Example: a = [1, 1, 1, 0], b = [0, 0, 1, 0] → d = [1, 1, 0, 0], diff 0.5; zeros do not move
    under a flip, and of the 4 sign patterns of the two ones, 2 give |sum| >= 2 → p = 0.5.
    """
    x, y = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"paired values need the same 1-D shape, got {x.shape} and {y.shape}")
    if x.size == 0:
        raise ValueError("no prompts to compare")
    d = x - y
    obs = abs(d.mean())
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, d.size, size=(n_boot, d.size))
    lo, hi = np.quantile(d[idx].mean(axis=1), [alpha / 2, 1 - alpha / 2])
    nz = d[d != 0]
    if nz.size == 0:
        p = 1.0
    elif nz.size <= 16:
        signs = ((np.arange(2 ** nz.size)[:, None] >> np.arange(nz.size)) & 1) * 2 - 1
        p = float(np.mean(np.abs((signs * nz).sum(axis=1)) >= obs * d.size - 1e-9))
    else:
        signs = rng.choice(np.array([-1.0, 1.0]), size=(n_perm, nz.size))
        hits = int(np.sum(np.abs((signs * nz).sum(axis=1)) >= obs * d.size - 1e-9))
        p = (hits + 1) / (n_perm + 1)
    return PairedDiff(metric, int(d.size), float(d.mean()), float(lo), float(hi), min(1.0, p),
                      int((d > 0).sum()), int((d < 0).sum()), "paired_bootstrap+sign_flip")


def mcnemar(a: Sequence[bool], b: Sequence[bool], alpha: float = 0.05, metric: str = "") -> PairedDiff:
    """Exact McNemar test of two paired binary outcomes per prompt (e.g. greedy correct).

    Only discordant prompts count: ``n01`` (A right, B wrong) and ``n10`` (B right, A wrong);
    under H0 ``n01 ~ Binomial(n01 + n10, 1/2)``; two-sided p = ``min(1, 2·P(X <= min(n01, n10)))``.
    The interval is the Wald interval of the difference of paired proportions,
    ``(n01 − n10)/n ± z·sqrt(n01 + n10 − (n01 − n10)²/n)/n``.

    Example: 10 prompts, A alone right on 6, B alone right on 1 → diff 0.5, p = 2·P(X <= 1 | 7, ½)
    = 2·8/128 = 0.125.
    """
    from math import comb, sqrt

    x, y = np.asarray(a, bool), np.asarray(b, bool)
    if x.shape != y.shape or x.ndim != 1 or x.size == 0:
        raise ValueError(f"paired outcomes need the same non-empty 1-D shape, got {x.shape} and {y.shape}")
    n = int(x.size)
    n01, n10 = int(np.sum(x & ~y)), int(np.sum(~x & y))
    m = n01 + n10
    p = 1.0 if m == 0 else min(1.0, 2 * sum(comb(m, i) for i in range(min(n01, n10) + 1)) / 2 ** m)
    diff = (n01 - n10) / n
    z = float(_norm_ppf(1 - alpha / 2))
    half = z * sqrt(max(m - (n01 - n10) ** 2 / n, 0.0)) / n
    return PairedDiff(metric, n, diff, diff - half, diff + half, p, n01, n10, "mcnemar_exact")


def _norm_ppf(q: float) -> float:
    """Standard normal quantile."""
    from statistics import NormalDist

    return NormalDist().inv_cdf(q)


def per_prompt_values(res: EvalResult | Mapping[str, Any], metric: str) -> dict[str, float]:
    """``prompt_id → value`` of ``metric`` (``pass@k``, ``avg@n``, ``greedy_pass@1``) from an
    evaluation's ``per_prompt`` rows (an :class:`EvalResult` or its ``to_dict()``)."""
    rows = res.per_prompt if isinstance(res, EvalResult) else res["per_prompt"]
    out: dict[str, float] = {}
    for r in rows:
        if metric == "greedy_pass@1":
            if "greedy_correct" not in r:
                raise ValueError("no greedy verdicts in this evaluation")
            out[r["prompt_id"]] = float(bool(r["greedy_correct"]))
        elif metric.startswith("pass@"):
            out[r["prompt_id"]] = pass_at_k(int(r["n"]), int(r["correct"]), int(metric[5:]))
        elif metric.startswith("avg@"):
            out[r["prompt_id"]] = r["correct"] / r["n"]
        else:
            raise ValueError(f"unknown metric {metric!r}; use pass@k, avg@n or greedy_pass@1")
    return out


def compare_paired(a: EvalResult | Mapping[str, Any], b: EvalResult | Mapping[str, Any], metric: str,
                   n_boot: int = 2000, seed: int = 0) -> PairedDiff:
    """A minus B on ``metric`` over the prompts both evaluated, paired per prompt: McNemar for
    greedy pass@1 (binary per prompt), paired bootstrap + sign-flip test otherwise.
    Refuses two evaluations that share no prompt."""
    va, vb = per_prompt_values(a, metric), per_prompt_values(b, metric)
    ids = sorted(set(va) & set(vb))
    if not ids:
        raise ValueError("the two evaluations share no prompt: a paired comparison needs the same prompts")
    if metric == "greedy_pass@1":
        return mcnemar([va[i] > 0.5 for i in ids], [vb[i] > 0.5 for i in ids], metric=metric)
    return paired_bootstrap([va[i] for i in ids], [vb[i] for i in ids], n_boot=n_boot, seed=seed, metric=metric)
