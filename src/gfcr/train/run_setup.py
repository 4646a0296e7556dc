"""Set-up helpers of the training run (:mod:`gfcr.train.loop`): the run folder, task prompts, the
engine (built only through :func:`gfcr.generate.engines.make_engine`), the reward composition, the
checks made before anything is written, and held-out evaluation."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from gfcr.records import Prompt
from gfcr.train.config import TrainConfig, dump_config, load_config


class TrainError(RuntimeError):
    """The run cannot start or continue; the message says what to do."""


def load_task_prompts(cfg: TrainConfig, split: str) -> list[Prompt]:
    """Prompts of every configured task source for ``split`` ("train" or "test", the held-out split).

    Each source is built with ``gfcr.tasks.make_source(name, **params)`` (``eval_params`` merged in
    for the held-out split); ``n``, ``split`` and ``seed`` are passed when the source's factory takes
    them, otherwise its prompts are filtered by ``prompt.split`` (when set) and cut to ``n``.
    """
    import importlib
    import inspect

    from gfcr.tasks import SOURCES, make_source

    out: list[Prompt] = []
    for t in cfg.tasks:
        n = t.n_train if split == "train" else t.n_eval
        if n == 0:
            continue
        params = dict(t.params) if split == "train" else {**t.params, **t.eval_params}
        target = SOURCES.get(t.name, t.name)
        accepted: set[str] = set()
        if ":" in target:
            mod, _, fn = target.partition(":")
            with contextlib.suppress(ImportError, AttributeError, ValueError, TypeError):
                accepted = set(inspect.signature(getattr(importlib.import_module(mod), fn)).parameters)
        extra = {k: v for k, v in (("n", n), ("split", split), ("seed", cfg.seed)) if k in accepted and k not in params}
        try:
            ps = make_source(t.name, **params, **extra).prompts()
        except (ValueError, TypeError, OSError) as e:
            raise TrainError(f"task {t.name!r} ({split} split, n={n}, params {params}): {e}") from e
        if "split" not in accepted:
            ps = [p for p in ps if p.split in (None, split)]
        out.extend(ps[:n])
    return out



def build_engine(cfg: TrainConfig, model: Any, model_path: str, tokenizer: Any, device: str) -> Any:
    """The sampling engine of ``generate.engine`` (Generate's engine sub-config) through
    :func:`gfcr.generate.engines.make_engine`.

    ``sync: in_place`` hands the hf engine the training module itself; every other engine gets the
    model path and its own weights (pushed by :mod:`gfcr.generate.sync`). ``generate.engine.params`` keys
    ending in ``_env`` name environment variables (``api_key_env: OPENAI_KEY`` → ``api_key``), so no
    secret is written into the run folder.
    """
    from gfcr.config import ConfigError
    from gfcr.generate.engines import make_engine

    g = cfg.generate
    try:
        kw = g.engine.kwargs()
    except ConfigError as e:
        raise TrainError(str(e)) from e
    if g.engine.model is not None:
        kw.setdefault("model", g.engine.model)  # openai: the served model name
    version = None if g.sync == "in_place" else "unsynced"
    what = {  # what each engine needs from the run besides generate.engine.params
        "hf": {"model": model if g.sync == "in_place" else model_path, "tokenizer": tokenizer, "device": device,
               "max_batch": g.max_batch, "policy_version": version},
        "vllm": {"model": model_path, "policy_version": version, "weight_sync": True},
        "openai": {"tokenizer": tokenizer, "policy_version": version},
        "ray": {"model": model_path, "tokenizer": tokenizer, "policy_version": version},
    }[g.engine.name]
    engines = {}
    if g.engine.name == "ray":  # the Ray engine lives above Generate: the loop hands it in
        from gfcr.scale.engine import RayEngine

        engines["ray"] = RayEngine
    return make_engine(g.engine.name, engines, **what, **kw)


def reward_composition(cfg: TrainConfig) -> Any:
    """The run's :class:`gfcr.filters.reward.RewardComposition` (format, overlong, length, PRM, AdaptThink)."""
    from gfcr.filters.reward import RewardComposition

    s = cfg.signals
    return RewardComposition(
        format_bonus=cfg.verify.format_bonus, max_tokens=cfg.generate.max_tokens, overlong_buffer=s.overlong_buffer,
        overlong_penalty=s.overlong_penalty,
        length=({"alpha": 1.0, "beta": 0.001} | dict(s.length_reward.params)) if s.length_reward else None,
        prm=s.prm.model_dump() if s.prm else None, adapt_think=s.adapt_think.model_dump() if s.adapt_think else None,
        per_turn_length=cfg.generate.topology.name == "multi_turn")


def check_supported(cfg: TrainConfig) -> None:
    """What only the running machine can answer (config load checked the rest)."""
    if cfg.distill is not None:
        from gfcr.train.distill import teacher_missing

        why = teacher_missing(cfg.distill)
        if why is not None:
            raise TrainError(why)
    if cfg.generate.topology.name == "multi_turn":
        check_multi_turn(cfg.generate.topology.typed().env)  # type: ignore[attr-defined]
    engine = cfg.generate.engine.name
    needs = {"vllm": "pip install 'gfcr[vllm]' on a GPU machine, `make vllm` on CPU (or use engine: hf)", "ray": "pip install 'gfcr[ray]'"}
    if engine in needs:
        import importlib.util

        if importlib.util.find_spec(engine) is None:
            raise TrainError(f"generate.engine {engine!r} needs the {engine} package: {needs[engine]}")
    from gfcr.train.seeding import retrieve_unsupported

    why = retrieve_unsupported(cfg, int(os.environ.get("WORLD_SIZE", "1")))
    if why is not None:
        raise TrainError(why)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and engine in ("openai", "ray"):
        raise TrainError(f"generate.engine {engine!r} is one shared sampler; data-parallel runs "
                         "(WORLD_SIZE > 1) give each rank its own engine: use hf or vllm")


def new_run_dir(cfg: TrainConfig) -> Path:
    """A fresh folder ``output_dir/run_name-YYYYmmdd-HHMMSS[-n]`` (never an existing one)."""
    from gfcr.config import new_run_dir as _new

    return _new(cfg.output_dir, cfg.run_name)


_RESUMABLE_CHANGES = {"steps", "eval", "tensorboard", "output_dir", "run_name"}


def prepare_run(cfg: TrainConfig, resume: str | Path | None = None, run_dir: str | Path | None = None) -> tuple[Path, bool]:
    """Pick the run folder, check a resume is consistent, write the resolved config."""
    if resume is not None:
        d = Path(resume)
        if not (d / "config.yaml").exists():
            raise TrainError(f"--resume {d}: not a gfcr run folder (no config.yaml)")
        old = load_config(d / "config.yaml").model_dump(mode="json")
        new = cfg.model_dump(mode="json")
        changed = sorted(k for k in new if new[k] != old.get(k) and k not in _RESUMABLE_CHANGES)
        if changed:
            raise TrainError(
                f"--resume {d}: the config differs from the run's config.yaml in {changed}; "
                "only steps/eval/tensorboard may change on resume (start a new run otherwise)"
            )
        dump_config(cfg, d / "config.yaml")
        return d, True
    if run_dir is not None:
        d = Path(run_dir)
        if d.exists() and any(d.iterdir()):
            raise TrainError(f"run folder {d} exists and is not empty; gfcr never overwrites a run (use --resume)")
        d.mkdir(parents=True, exist_ok=True)
    else:
        d = new_run_dir(cfg)
    dump_config(cfg, d / "config.yaml")
    return d, False


def check_server(params: dict[str, Any]) -> None:
    """Fail before anything is written when the openai engine's server does not answer."""
    import httpx

    url = str(params["base_url"]).rstrip("/") + "/models"
    try:
        resp = httpx.get(url, timeout=10.0)
    except httpx.TransportError as e:
        raise TrainError(f"generate.engine.params.base_url: no server answers at {url} ({type(e).__name__}); start "
                         "one with `gfcr serve --model MODEL --allow-weight-updates` first") from e
    if resp.status_code != 200:
        raise TrainError(f"generate.engine.params.base_url: GET {url} -> HTTP {resp.status_code}")


def check_multi_turn(env: str) -> None:
    """The multi_turn env must be registered (or an import path) when the run starts (config load
    checked the keys and types; a test or plugin may register envs after it)."""
    from gfcr.generate.envs import ENVS

    if not (env in ENVS or ":" in env):
        raise TrainError(
            f"generate.topology multi_turn needs generate.topology.params.env: one of {sorted(ENVS)} or "
            f"'pkg.module:Class' (got {env!r}), e.g. generate: {{topology: {{name: multi_turn, params: {{env: "
            "calculator, max_turns: 3}}}}"
        )


def evaluate_policy(t: Any, name: str | None = None) -> Any:
    """Evaluate the run's current policy on its held-out prompts with the run's verifier. A multi_turn
    run is evaluated on the same env episodes it trains on (same env, ``max_turns``, ``obs_role``,
    and ``verify.reward_source`` deciding what counts as solved): :func:`gfcr.evaluate.evaluate_episodes`.
    With ``eval.store`` and a ``name``, a single-answer evaluation keeps its generations in the run's
    ``evals`` store as eval run ``eval-<name>`` (:class:`gfcr.evaluate.EvalRecorder`)."""
    from gfcr.evaluate import EvalRecorder, evaluate_episodes, evaluate_model
    from gfcr.filters.verifiers import stated_answer_format

    e, g = t.cfg.eval, t.cfg.generate
    verifier = t.verifier

    def verify(p: Prompt, text: str) -> bool:
        return bool(verifier.verify(text, answer=p.answer, tests=p.tests, answer_format=stated_answer_format(p)).passed)

    verify.__name__ = t.cfg.verify.verifier.name
    max_tokens = e.max_tokens or g.max_tokens
    if g.topology.name == "multi_turn":
        mt = g.topology.typed()  # MultiTurnParams: env, max_turns, obs_role with their defaults
        return evaluate_episodes(
            t.engine, t.eval_prompts, env=mt.env, max_turns=mt.max_turns,  # type: ignore[attr-defined]
            obs_role=mt.obs_role, k=e.k, verifier=verify,  # type: ignore[attr-defined]
            reward_source=t.cfg.verify.reward_source, env_weight=t.cfg.verify.env_weight, greedy=e.greedy,
            temperature=e.temperature, max_tokens=max_tokens, seed=t.cfg.seed,
        )
    rec = None
    if name is not None and getattr(e, "store", False):
        from gfcr.store import RolloutStore

        evals = RolloutStore.open(t.run_dir / "evals", create=True)
        run_id = f"eval-{name}"
        if evals.count(where=f"run_id = '{run_id}'") == 0:  # (a resumed run that already stored it keeps the first)
            rec = EvalRecorder(evals, t.engine, t.policy_version, run_id=run_id, split="eval",
                               verifier=t.cfg.verify.verifier.name)
    res = evaluate_model(
        t.engine, t.eval_prompts, k=e.k, verifier=verify, greedy=e.greedy, temperature=e.temperature,
        max_tokens=max_tokens, seed=t.cfg.seed, batch_size=g.max_batch, record=rec,
    )
    if rec is not None:
        res.info["stored"] = {"store": str(t.run_dir / "evals"), "eval_run": rec.run_id, "rollouts": rec.close()}
    return res
