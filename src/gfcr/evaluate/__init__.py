"""Evaluation: pass@k (unbiased), avg@k, greedy pass@1, bootstrap confidence intervals over prompts.

The maths is pure (:mod:`~gfcr.evaluate.metrics`: :func:`pass_at_k`, :func:`bootstrap_ci`,
:func:`summarize`); :func:`evaluate_model` (:mod:`~gfcr.evaluate.run`) composes an engine (``gfcr.generate``'s ``Engine`` protocol) with a verifier and returns an
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

Evaluations as stored rollouts (:mod:`~gfcr.evaluate.stored`): :class:`EvalRecorder` keeps every
generation in a store as an eval run with the checkpoint as ``policy_version``; :func:`compare_stored`
compares two such runs paired per prompt and lists the prompts where they disagree.
"""

from gfcr.evaluate.metrics import (
    TRUNCATED_FINISHES,
    EvalConfig,
    EvalResult,
    Metric,
    VerifyFn,
    bootstrap_ci,
    pass_at_k,
    resolve_verifier,
    summarize,
)
from gfcr.evaluate.paired import PairedDiff, compare_paired, mcnemar, paired_bootstrap, per_prompt_values
from gfcr.evaluate.run import eval_prompts, evaluate_episodes, evaluate_model
from gfcr.evaluate.stored import EvalRecorder, StoredComparison, compare_stored, stored_eval

__all__ = ["TRUNCATED_FINISHES", "EvalConfig", "EvalRecorder", "EvalResult", "Metric", "PairedDiff",
           "StoredComparison", "VerifyFn", "bootstrap_ci", "compare_paired", "compare_stored", "stored_eval", "eval_prompts", "evaluate_episodes", "evaluate_model", "mcnemar", "paired_bootstrap",
           "pass_at_k", "per_prompt_values", "resolve_verifier", "summarize"]
