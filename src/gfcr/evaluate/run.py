"""Running an evaluation: :func:`evaluate_model` (k samples and one greedy answer per prompt through
an engine, verified), :func:`evaluate_episodes` (multi-turn policy ↔ env episodes) and the held-out
prompts they run on (:func:`eval_prompts`). ``record`` hands every generation to a caller, e.g.
:class:`gfcr.evaluate.stored.EvalRecorder`, which keeps them in a store.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from gfcr.evaluate.metrics import TRUNCATED_FINISHES, EvalResult, VerifyFn, resolve_verifier, summarize
from gfcr.records import Prompt

#: ``record(phase, prompt, results, verdicts, params)``: a caller's hook on every generation of an evaluation
Recorder = Callable[[str, Prompt, Sequence[Any], Sequence[bool], Any], None]


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
    record: Recorder | None = None,
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
    elapsed time), so stdout keeps only the result. ``record(phase, prompt, results, verdicts, params)``
    receives every generation (``phase`` ``"sampled"`` or ``"greedy"``), e.g. an
    :class:`~gfcr.evaluate.stored.EvalRecorder` that keeps them in a store.
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
                if record is not None:
                    record("greedy" if params.temperature == 0 else "sampled", p, results, out[p.prompt_id], params)
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
