"""ROSS's mask on an RL policy's own corrected mistakes: feedback episodes (issue 47).

ROSS's token mask matters where verified successes hold mistakes the policy made and then fixed:
supervising the whole success teaches the mistake too. At 135M a policy does not catch its own slips
(docs/ross.md, the chain warm starts), so its sampled successes hold none. An environment that says
"try again" makes them: the policy answers, a wrong answer gets ``That is not correct. Try again.``
(:class:`gfcr.generate.envs.RetryEnv`), and the policy answers again. A success after a failed attempt
is a corrected mistake the RL policy itself sampled, the agentic case of the paper, where feedback
from tools or an environment exposes an error and a later turn fixes it.

1. ``sweep``: the last checkpoint of a ``gfcr train`` GRPO run on sums (``--upstream``, e.g.
   ``bench/retrieve_train_bench.py``'s ``rt-off-s0``) runs ``--k`` episodes of each of the run's train
   prompts in the retry env (lenient reading: an ``Answer:`` line, else the last number, as the run's
   verifier), up to ``--max-turns`` answers, at the run's temperature and token budget per turn, into
   ``STATE/episodes``. Verified = the env's success. Counted: verified episodes by the attempt that passed.
2. ``arms``: per ``--sft-seeds`` seed, from that checkpoint, the ROSS pipeline on the episodes
   (select verified, distinct; ``arith-steps`` v8; ``--epochs-sft`` epochs, lr 1e-5, batch 8) with two
   variants on the same rows: ``ross`` (the judge's mask: failed attempts out of the loss, kept as
   context) and ``ross_nomask`` (every generated token supervised, failed attempts included).
3. ``eval``: every model (the checkpoint and the arms) runs one greedy episode of each of ``--n-eval``
   held-out sums (the arith test split, ``bench/retrieve_train_bench.py``'s set) in the same env:
   first-attempt success (what a single answer scores), success within ``--max-turns`` and the attempts
   used, per prompt; paired sign tests pooled over the SFT seeds.
4. ``rl`` (before ``eval``): continued RL, ``--rl-steps`` more GRPO steps of the upstream run's own
   config from its last checkpoint, scored like the arms.

Stated before the sweep ran (docs/ross.md "Feedback episodes"). Each stage writes ``STATE/<stage>.json``
and is read back, not re-run, when it exists (``bench/stages.py``).
Run: ``python bench/ross_feedback.py --upstream bench/out/retrieve_train/rt-off-s0-*``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ross_moveon import cpu_seconds, sign_test, train_prompts, upstream_facts  # noqa: E402


def env_factory(args: argparse.Namespace) -> Any:
    """The retry env (lenient unless ``--strict``); ``args.env``, a zero-argument factory, replaces it (tests)."""
    from gfcr.generate.envs import RetryEnv

    return getattr(args, "env", None) or (lambda: RetryEnv(lenient=not args.strict))


def attempts(r: Any) -> int | None:
    """The attempt that passed (1, 2, ...), None when the episode failed."""
    if not r.meta.get("env_success"):
        return None
    return int(r.meta["env_info"][-1]["attempt"])


def episodes(model: str, prompts: list[Any], args: argparse.Namespace, temperature: float, max_tokens: int,
             k: int, seed: int, run_id: str) -> list[Any]:
    """``k`` retry-env episodes per prompt from ``model`` (batches of 32 prompts), each marked verified
    by the env's success, with the answer the env read as the verifier's evidence."""
    import copy

    from gfcr.generate.engines.base import SamplingParams
    from gfcr.generate.engines.hf import HFEngine
    from gfcr.generate.topologies import MultiTurn

    eng = HFEngine(model, max_batch=32, policy_version=Path(model).name)
    topo = MultiTurn(env=env_factory(args), k=k, max_turns=args.max_turns, seed=seed,
                     params=SamplingParams(temperature=temperature, max_tokens=getattr(args, "max_tokens", None) or max_tokens,
                                           **({"stop_token_ids": args.stop_ids} if getattr(args, "stop_ids", None)
                                              else {})))  # max_tokens and stop_ids: tests
    out = []
    for i in range(0, len(prompts), 32):
        for r in topo.generate(eng, prompts[i:i + 32], run_id=run_id):
            r = copy.copy(r)
            ok = r.meta.get("env_success")
            info = r.meta.get("env_info") or [{}]
            r.verified, r.reward = (None, None) if ok is None else (bool(ok), float(bool(ok)))
            r.verifier = {"name": "retry-env", "evidence": {"parsed": info[-1].get("answer")}}
            out.append(r)
        print(f"  episodes {run_id}: {min(i + 32, len(prompts))}/{len(prompts)} prompts", file=sys.stderr, flush=True)
    return out


def stage_sweep(args: argparse.Namespace, state: Path, up: dict[str, Any]) -> dict[str, Any]:
    import shutil

    from gfcr.store import RolloutStore

    prompts = train_prompts(RolloutStore.open(Path(up["run_dir"]) / "store"))
    path = state / "episodes"
    if path.exists():  # an earlier start that did not finish: swept again whole
        shutil.rmtree(path)
    store = RolloutStore.open(path, create=True)
    store.upsert_prompts(prompts)
    t0, c0 = time.time(), cpu_seconds()
    rs = episodes(up["last"], prompts, args, up["temperature"], up["max_tokens"], args.k, args.seed, "feedback-sweep")
    store.append(rs)
    by = Counter(attempts(r) for r in rs)
    ok = [r for r in rs if r.verified]
    return {"model": up["last"], "k": args.k, "max_turns": args.max_turns, "episodes": len(rs), "verified": len(ok),
            "verified_by_attempt": {str(a): by[a] for a in range(1, args.max_turns + 1)},
            "verified_after_a_failed_attempt": sum(attempts(r) > 1 for r in ok),
            "prompts_solved": len({r.prompt_id for r in ok}), "finish": dict(Counter(r.finish_reason for r in rs)),
            "wall_s": round(time.time() - t0, 1), "cpu_s": round(cpu_seconds() - c0, 1), "load": os.getloadavg()[0]}


def audit_facts(store: Any, judge: str = "arith-steps") -> dict[str, Any]:
    """What the judge did with the episodes: kept / discarded, and per kept rollout the categories it
    excluded, split by whether the episode holds a failed attempt."""
    from gfcr.ross.audit import load_kept

    kept, by_id = load_kept(store, judge)
    out: Counter[str] = Counter()
    for a in kept:
        failed = (attempts(by_id[a.rollout_id]) or 1) > 1
        cats = (a.meta or {}).get("categories", {})
        out["kept_with_failed_attempt" if failed else "kept_first_attempt"] += 1
        if failed and cats.get("corrected_mistake"):
            out["failed_attempt_with_corrected_mistake_excluded"] += 1
        if not failed and cats:
            out["first_attempt_with_an_exclusion"] += 1
    return dict(out)


def stage_arms(args: argparse.Namespace, state: Path, up: dict[str, Any]) -> dict[str, Any]:
    from ross_moveon import ross_config

    from gfcr.ross.pipeline import run_ross
    from gfcr.store import RolloutStore

    out: dict[str, Any] = {}
    for sd in [int(x) for x in args.sft_seeds.split(",")]:
        rd = state / "arms" / f"s{sd}"
        cfg = ross_config(state / "episodes", state / "arms", up["last"], sd, args.epochs_sft, args.judge,
                          check_answer=args.judge != "keep-all", variants=("ross_nomask", "ross"))  # keep-all: tests
        t0, c0 = time.time(), cpu_seconds()
        run = run_ross(cfg, rd)
        out[f"s{sd}"] = {"dirs": {v: str(rd / "models" / v) for v in ("ross_nomask", "ross")},
                         "select": run.results["select"], "build": run.results["build"],
                         "wall_s": round(time.time() - t0, 1), "cpu_s": round(cpu_seconds() - c0, 1),
                         "load": os.getloadavg()[0]}
        print(f"[arms] seed {sd}: {json.dumps(out[f's{sd}']['select'])} {out[f's{sd}']['wall_s']} s", file=sys.stderr)
    out["audit"] = audit_facts(RolloutStore.open(state / "episodes"), args.judge)
    return out


def stage_rl(args: argparse.Namespace, state: Path, up: dict[str, Any]) -> dict[str, Any]:
    """Continued RL, the paper's other way to spend the compute: ``--rl-steps`` more GRPO steps of the
    upstream run's own config (single answers, its prompts, loss and learning rate) from its last
    checkpoint (``ross_moveon.stage_rl``), into ``STATE/continued_rl``."""
    from ross_moveon import stage_rl as moveon_rl

    return moveon_rl(args, state, up, {"dir": up["last"]})


def stage_eval(args: argparse.Namespace, state: Path, up: dict[str, Any], arms: dict[str, Any],
               partial: dict[str, Any], rl: dict[str, Any] | None = None) -> dict[str, Any]:
    from gfcr.tasks.arith import make_arith

    prompts = make_arith(n=args.n_eval, level=2, split="test", seed=0).prompts()
    models = {"upstream": up["last"], **{f"{v}-{s}": d for s, a in arms.items() if s.startswith("s")
                                        for v, d in a["dirs"].items()},
              **({"continued_rl": rl["dir"]} if rl else {})}
    res, timing = partial.setdefault("attempt", {}), partial.setdefault("timing", {})
    for name, model in models.items():
        if name in res:
            continue
        t0, c0 = time.time(), cpu_seconds()
        rs = episodes(model, prompts, args, 0.0, up["max_tokens"], 1, 0, f"eval-{name}")
        res[name] = [attempts(r) for r in rs]
        timing[name] = {"wall_s": round(time.time() - t0, 1), "cpu_s": round(cpu_seconds() - c0, 1),
                        "load": os.getloadavg()[0]}
        (state / "eval.partial.json").write_text(json.dumps(partial))
        print(f"[eval] {name}: first {sum(a == 1 for a in res[name])}, any {sum(a is not None for a in res[name])}"
              f" of {len(prompts)} ({timing[name]['wall_s']} s)", file=sys.stderr, flush=True)
    seeds = [s for s in arms if s.startswith("s")]

    def share(m: str, ok: Any) -> list[float]:  # per prompt, pooled over the SFT seeds
        rows = [res[f"{m}-{s}"] for s in seeds] if m in ("ross", "ross_nomask") else [res[m]]
        return [sum(map(ok, col)) / len(col) for col in zip(*rows, strict=True)]

    measures = {"first_attempt": lambda a: a == 1, "within_turns": lambda a: a is not None}
    out: dict[str, Any] = {"n": len(prompts), "timing": timing, "rates": {}, "paired": {}}
    for m in ("upstream", "ross_nomask", "ross", *(["continued_rl"] if rl else [])):
        out["rates"][m] = {k: sum(share(m, f)) / len(prompts) for k, f in measures.items()}
        attempts_used = [a for s in (seeds if m in ("ross", "ross_nomask") else [None])
                         for a in res[m if s is None else f"{m}-{s}"] if a is not None]
        out["rates"][m]["mean_attempt_of_a_success"] = sum(attempts_used) / max(len(attempts_used), 1)
    for k, f in measures.items():
        out["paired"][k] = {"ross - ross_nomask": sign_test(share("ross", f), share("ross_nomask", f)),
                            "ross - upstream": sign_test(share("ross", f), share("upstream", f)),
                            "ross_nomask - upstream": sign_test(share("ross_nomask", f), share("upstream", f)),
                            **({"ross - continued_rl": sign_test(share("ross", f), share("continued_rl", f)),
                                "continued_rl - upstream": sign_test(share("continued_rl", f), share("upstream", f))}
                               if rl else {}),
                            **{f"ross - ross_nomask ({s})": sign_test([float(f(a)) for a in res[f"ross-{s}"]],
                                                                       [float(f(a)) for a in res[f"ross_nomask-{s}"]])
                               for s in seeds}}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", required=True, help="a finished gfcr train run folder (the RL policy)")
    ap.add_argument("--state", default="~/.cache/gfcr/studies/ross-feedback", help="the study's folder (outside the repo)")
    ap.add_argument("--stages", default="sweep,arms,rl,eval")
    ap.add_argument("--k", type=int, default=2, help="episodes per train prompt in the sweep")
    ap.add_argument("--max-turns", type=int, default=3, help="answers per episode (the first and the retries)")
    ap.add_argument("--strict", action="store_true", help="the env reads only a stated answer (no last-number fallback)")
    ap.add_argument("--sft-seeds", default="0,1")
    ap.add_argument("--epochs-sft", type=int, default=3, help="epochs of each ROSS arm (the paper's 3)")
    ap.add_argument("--n-eval", type=int, default=300, help="held-out two-digit sums")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rl-steps", type=int, default=12, help="continued RL: more GRPO steps of the upstream run")
    ap.add_argument("--judge", default="arith-steps", help="the arms' judge (keep-all: no mask, tests)")
    args = ap.parse_args()
    from stages import run_stages

    state = Path(args.state).expanduser()
    state.mkdir(parents=True, exist_ok=True)
    up = upstream_facts(Path(args.upstream))
    results: dict[str, Any] = {"upstream": up}

    def evaluate() -> dict[str, Any]:
        pp = state / "eval.partial.json"
        return stage_eval(args, state, up, results["arms"], json.loads(pp.read_text()) if pp.exists() else {},
                          results.get("rl"))

    run_stages(args.stages.split(","), lambda st: state / f"{st}.json", {
        "sweep": lambda: stage_sweep(args, state, up),
        "arms": lambda: stage_arms(args, state, up),
        "rl": lambda: stage_rl(args, state, up),
        "eval": evaluate}, results)
    (state / "result.json").write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
