"""``gfcr train``, ``gfcr eval`` and ``gfcr demo``: thin wrappers over :func:`gfcr.train.loop.train`,
:mod:`gfcr.evaluate` and the demo."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Annotated, Any

import typer

from .common import fail, parse_sets, quiet_transformers, topmost_new, validated


def _train_fresh(cfg: Any, run_dir: Path | None, progress: bool) -> Any:
    """Train into a new run folder; if the run fails before its first step, the folder is removed
    again (a failed command leaves nothing behind; a run with steps done is kept for ``--resume``)."""
    from gfcr.config import new_run_dir
    from gfcr.train import dist
    from gfcr.train.loop import train

    single = int(os.environ.get("WORLD_SIZE", "1")) <= 1  # under torchrun, rank 0 picks the folder
    created: Path | None = None
    if single and run_dir is None:
        created = topmost_new(Path(cfg.output_dir))
        run_dir = new_run_dir(cfg.output_dir, cfg.run_name)
        created = created or run_dir
    elif single:
        created = topmost_new(run_dir)
    done: list[int] = []
    try:
        return train(cfg, run_dir=run_dir, progress=progress, on_step=lambda step, _m: done.append(step))
    except BaseException:
        if created is not None and not done and dist.is_main():
            shutil.rmtree(created, ignore_errors=True)
        raise


def train_cmd(
    config: Annotated[Path | None, typer.Argument(help="YAML config (see configs/); omitted = all defaults.")] = None,
    resume: Annotated[Path | None, typer.Option("--resume", help="Continue the run in this folder from its last checkpoint and store.")] = None,
    run_dir: Annotated[Path | None, typer.Option("--run-dir", help="Exact (new or empty) run folder instead of output_dir/run_name-TIME.")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override a field: --set optim.lr=1e-5 (repeatable).")] = None,
    no_progress: Annotated[bool, typer.Option("--no-progress", help="No progress bar (for logs).")] = False,
) -> None:
    """RL-train a policy: select → generate → verify → signals → control → replay → store → update."""
    from rich.console import Console

    from gfcr.train import dist
    from gfcr.train.config import load_config
    from gfcr.train.loop import train

    console = Console()
    quiet_transformers()
    cfg = load_config(config, parse_sets(set_))
    if resume is not None:
        res = train(cfg, resume=resume, run_dir=run_dir, progress=not no_progress)
    else:
        res = _train_fresh(cfg, run_dir, progress=not no_progress)
    if dist.is_main():  # under torchrun, rank 0 speaks for the run
        console.print(f"run dir:  {res.run_dir}\nstore:    {res.store_path}\nmetrics:  {res.metrics_path}\n"
                      f"checkpoint: {res.checkpoint}\nsteps done: {res.steps_done}")
    for name, ev in (("eval before", res.eval_before), ("eval after", res.eval_after)):
        if ev is not None:
            console.print(f"{name}: {ev.summary()}")


def eval_cmd(
    model: Annotated[str, typer.Option("--model", help="HF model directory/name, or 'default'.")] = "default",
    tasks: Annotated[str, typer.Option("--tasks", help="Task source name(s), comma-separated (e.g. arith).")] = "arith",
    k: Annotated[int, typer.Option("--k", help="Samples per prompt for pass@k/avg@k (0 = greedy only).")] = 4,
    n: Annotated[int, typer.Option("--n", help="Held-out prompts per task (at most: a smaller split gives all it holds, with a note).")] = 32,
    split: Annotated[str, typer.Option("--split", help="Task split to evaluate.")] = "test",
    task_arg: Annotated[list[str] | None, typer.Option("--task-arg", help="Task source argument KEY=VALUE (repeatable), e.g. level=2.")] = None,
    verifier: Annotated[str, typer.Option("--verifier", help="Verifier name in gfcr.filters.")] = "numeric",
    verifier_arg: Annotated[list[str] | None, typer.Option("--verifier-arg", help="Verifier config KEY=VALUE (repeatable), e.g. lenient_fallback=true.")] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="New tokens per sample.")] = 64,
    temperature: Annotated[float, typer.Option("--temperature", help="Sampling temperature for pass@k.")] = 0.7,
    no_greedy: Annotated[bool, typer.Option("--no-greedy", help="Skip greedy pass@1.")] = False,
    seed: Annotated[int, typer.Option("--seed", help="Seed for prompts and sampling.")] = 0,
    device: Annotated[str, typer.Option("--device", help="torch device (hf engine).")] = "cpu",
    engine_name: Annotated[str, typer.Option("--engine", help="Engine: hf (transformers) or vllm (offline vllm.LLM; make vllm).")] = "hf",
    engine_arg: Annotated[list[str] | None, typer.Option("--engine-arg", help="Engine argument KEY=VALUE (repeatable), e.g. max_model_len=1024 for vllm.")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Also write the JSON result (metrics, per-prompt counts) here.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the JSON result on stdout instead of the summary line.")] = False,
    env: Annotated[str | None, typer.Option("--env", help="Evaluate multi-turn episodes against this env (calculator, python, retry or pkg.module:Class) instead of single answers.")] = None,
    max_turns: Annotated[int, typer.Option("--max-turns", help="With --env: most policy turns per episode (--max-tokens is per turn).")] = 4,
    obs_role: Annotated[str, typer.Option("--obs-role", help="With --env: chat role of the env's observations.")] = "user",
    reward_source: Annotated[str, typer.Option("--reward-source", help="With --env: what counts as solved: verifier (final turn), env (the env's success), env_or_verifier, weighted.")] = "verifier",
    env_weight: Annotated[float, typer.Option("--env-weight", help="With --env and --reward-source weighted: the env's weight in [0, 1].")] = 0.5,
    store: Annotated[str | None, typer.Option("--store", help="Keep every generation in this store (created if new) as an eval run; compare two with `gfcr compare`.")] = None,
    eval_run: Annotated[str | None, typer.Option("--eval-run", help="With --store: the eval run's id (default eval-<policy version>).")] = None,
    policy_version: Annotated[str | None, typer.Option("--policy-version", help="With --store: the checkpoint's name (default: the --model value).")] = None,
) -> None:
    """Evaluate a model: unbiased pass@k, avg@k and greedy pass@1 with bootstrap CIs over prompts; prints
    one summary line (--json: the full result). With --env, each sample is a whole policy-env episode
    (as in multi_turn training). The default model is verified as the train and demo configs verify
    it (numeric with lenient_fallback=true) unless --verifier-arg says otherwise.

    Long because: most of it is the option list, one typed line per option, as every command."""
    from gfcr.evaluate import EvalConfig, eval_prompts, evaluate_episodes, evaluate_model, resolve_verifier
    from gfcr.generate.engines.hf import HFEngine
    from gfcr.generate.envs import REWARD_SOURCES, make_env

    if env is None and (max_turns != 4 or obs_role != "user" or reward_source != "verifier" or env_weight != 0.5):
        fail("--max-turns, --obs-role, --reward-source and --env-weight apply to multi-turn episodes: add --env NAME")
    if env is not None:
        try:
            make_env(env)  # fail before the model is loaded
        except (ValueError, ImportError, AttributeError, TypeError) as e:
            fail(f"--env {env!r} could not be built: {e}")
        if max_turns < 1:
            fail(f"--max-turns must be >= 1, got {max_turns}")
        if reward_source not in REWARD_SOURCES:
            fail(f"--reward-source {reward_source!r}: choose one of {list(REWARD_SOURCES)}")
        if not 0.0 <= env_weight <= 1.0:
            fail(f"--env-weight must lie in [0, 1], got {env_weight}")
    validated(EvalConfig, {"k": k, "greedy": not no_greedy, "max_tokens": max_tokens, "temperature": temperature},
              "eval options", {"k": "--k", "max_tokens": "--max-tokens", "temperature": "--temperature"})
    kw = parse_sets(task_arg, option="--task-arg")
    vparams = parse_sets(verifier_arg, option="--verifier-arg")
    if model == "default" and verifier == "numeric" and "lenient_fallback" not in vparams:
        vparams["lenient_fallback"] = True  # as configs/arith-smollm2.yaml and the demo verify the default model
        typer.echo("note: the default model is verified with numeric lenient_fallback=true, as its train and demo "
                   "configs are (--verifier-arg lenient_fallback=false for the strict 'Answer: N' line)", err=True)
    try:
        verify = resolve_verifier(verifier, vparams)  # built once, before the model is loaded
    except (ValueError, TypeError) as e:
        fail(f"--verifier {verifier!r}: {e}")
    prompts, notes = [], []
    try:
        prompts, notes = eval_prompts(tasks, n=n, split=split, seed=seed, **kw)
    except (ValueError, TypeError) as e:
        fail(f"--tasks {tasks!r}: {e}")
    for note in notes:
        typer.echo(f"note: {note}", err=True)
    if not prompts:
        fail("no prompts to evaluate")
    if engine_name not in ("hf", "vllm"):
        fail(f"--engine {engine_name!r}: choose hf or vllm")
    recorder = None
    if store is not None:  # checked before the model is loaded
        if env is not None:
            fail("--store keeps single-answer evaluations; multi-turn episodes (--env) are not stored yet")
        from gfcr.evaluate import EvalRecorder
        from gfcr.store import RolloutStore

        recorder = EvalRecorder(RolloutStore.open(store, create=True), None, policy_version or model, run_id=eval_run,
                                split=split, verifier=verifier)
    eargs = parse_sets(engine_arg, option="--engine-arg")
    if engine_name == "vllm":
        from gfcr.generate.engines import make_engine

        try:
            engine = make_engine("vllm", model=None if model == "default" else model, **eargs)
        except ImportError as e:
            fail(f"--engine vllm: {e}")
    else:
        engine = HFEngine(None if model == "default" else model, device=device, **eargs)
    if recorder is not None:
        recorder.engine = engine
    if env is not None:
        res = evaluate_episodes(engine, prompts, env=env, max_turns=max_turns, obs_role=obs_role, k=k,
                                verifier=verify, reward_source=reward_source, env_weight=env_weight,
                                greedy=not no_greedy, temperature=temperature, max_tokens=max_tokens, seed=seed)
    else:
        res = evaluate_model(engine, prompts, k=k, verifier=verify, greedy=not no_greedy,
                             temperature=temperature, max_tokens=max_tokens, seed=seed, progress=True, record=recorder)
    res.info["model"] = model
    res.info["verifier"] = {"name": verifier, "params": vparams}
    if recorder is not None:
        n_rows = recorder.close()
        res.info["store"] = {"path": store, "eval_run": recorder.run_id, "rollouts": n_rows}
        typer.echo(f"stored {n_rows} generations in {store} as eval run {recorder.run_id!r}", err=True)
    if out is not None:
        res.save(out)
        typer.echo(f"written: {out}", err=True)
    typer.echo(res.to_json() if as_json else eval_summary_line(res))


def eval_summary_line(res: Any) -> str:
    """One line: prompts, samples and each metric with its 95% bootstrap CI.

    Example: 4 prompts, k=4, sampled 2 of 4 right on each, greedy right on 2 →
    ``4 prompts, k=4: pass@1 0.500 [0.500, 0.500] · pass@4 1.000 [1.000, 1.000] · avg@4 … · greedy_pass@1 0.500 [...]``."""
    return (f"{res.n_prompts} prompts, k={res.n_samples}: "
            + " · ".join(f"{name} {m}" for name, m in res.metrics.items()))


def compare_cmd(
    store: Annotated[str, typer.Argument(help="The store holding both eval runs (gfcr eval --store).")],
    run_a: Annotated[str, typer.Argument(help="Eval run A (e.g. eval-after).")],
    run_b: Annotated[str, typer.Argument(help="Eval run B (e.g. eval-base).")],
    metric: Annotated[str, typer.Option("--metric", help="greedy_pass@1, pass@k or avg@n.")] = "greedy_pass@1",
    show: Annotated[int, typer.Option("--show", min=0, help="Prompts listed on each side of the disagreement.")] = 10,
    as_json: Annotated[bool, typer.Option("--json", help="Print the comparison as JSON.")] = False,
) -> None:
    """Two stored evaluations paired per prompt: A minus B with its CI and p-value, and the prompts they disagree on."""
    import json

    from gfcr.evaluate import compare_stored
    from gfcr.store import RolloutStore

    c = compare_stored(RolloutStore.open(store), run_a, run_b, metric=metric)
    d = c.diff
    if as_json:
        typer.echo(json.dumps({"a": run_a, "b": run_b, "metric": metric, "n": d.n, "diff": d.diff, "ci": [d.ci_low, d.ci_high],
                               "p_value": d.p_value, "test": d.test, "a_only": c.a_only, "b_only": c.b_only}))
        return
    sig = "significant" if d.p_value < 0.05 else "not significant"
    typer.echo(f"{run_a} - {run_b}, {metric}: {d.diff:+.3f} [{d.ci_low:+.3f}, {d.ci_high:+.3f}] over {d.n} prompts, "
               f"p = {d.p_value:.2g} ({d.test}): {sig}")
    for name, rows in ((f"better in {run_a}", c.a_only), (f"better in {run_b}", c.b_only)):
        typer.echo(f"{len(rows)} prompt(s) {name}" + (":" if rows[:show] else ""))
        for pid, va, vb in rows[:show]:
            typer.echo(f"  {pid}  {va:.3g} vs {vb:.3g}")


def demo_cmd(
    full: Annotated[bool, typer.Option("--full", help="A longer run (20 steps, more prompts, k=4 eval).")] = False,
    output_dir: Annotated[str, typer.Option("--output-dir", help="Where run folders go.")] = "runs",
    model: Annotated[str, typer.Option("--model", help="Policy model (default: SmolLM2-135M-Instruct).")] = "default",
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override a field of the demo's train config, as in gfcr train: --set steps=2 (repeatable).")] = None,
) -> None:
    """The main job: pull the default model, evaluate it, RL a few CPU steps into a store, evaluate again,
    relearn from the stored successes with ROSS, and write the HTML report."""
    from gfcr.demo import run_demo

    quiet_transformers()
    run_demo(full=full, output_dir=output_dir, model=model, overrides=parse_sets(set_))  # a bad --set fails first


def register(app: typer.Typer) -> None:
    """Add ``gfcr train``, ``gfcr eval``, ``gfcr compare`` and ``gfcr demo`` to the top-level app."""
    app.command("train")(train_cmd)
    app.command("eval")(eval_cmd)
    app.command("compare")(compare_cmd)
    app.command("demo")(demo_cmd)
