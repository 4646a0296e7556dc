"""The maths of evaluation: unbiased pass@k (Chen et al. 2021), bootstrap intervals over prompts,
:func:`summarize` (per-prompt outcomes → :class:`EvalResult`), the eval config and the verifier a
name resolves to. See :mod:`gfcr.evaluate` for the definitions.
"""

from __future__ import annotations

import json
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
    max_tokens: int | None = Field(None, ge=1, description=(
        "New tokens per eval sample (None: the run's generation length)."))
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
