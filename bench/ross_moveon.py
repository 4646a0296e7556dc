"""ROSS's complementarity in a curriculum that moves on (issue 47).

The paper's second reason for relearning from stored rollouts is *complementarity*: an RL run's
history holds successes its final checkpoint no longer reproduces, so supervised relearning on the
history can add what sampling the final policy cannot. This bench builds that situation on CPU and
measures it:

1. ``sweep_early`` (phase A, what the upstream run stored): the last checkpoint of a ``gfcr train``
   GRPO run on one- and two-digit sums (``--upstream RUN``, e.g. ``bench/retrieve_train_bench.py``'s
   ``rt-off-s0``) samples ``--k`` completions of every one of the run's train prompts at the run's
   temperature and token budget; verified with the run's verifier (numeric, last-number fallback)
   and appended, with the run's own rollouts, to the *history* store ``STATE/history``.
2. ``moveon`` (phase B, the curriculum moves on): that checkpoint is fine-tuned on ``--n-move`` worked
   three-term chains (``arith`` level 5, :func:`gfcr.tasks.chains.worked_solution` without mistakes),
   ``--move-epochs`` epochs of full-supervision SFT at ``--move-lr``: the *final* checkpoint.
3. ``sweep_final``: the final checkpoint samples the same prompts the same way (fresh seeds) into the
   *own* store ``STATE/own``: what continued training on the final policy's own successes can use.
   Lost successes: per prompt, the early sweep's solve rate against the final sweep's (paired sign
   test over all train prompts, no selection by either sweep's outcome).
4. ``arms``: per ``--sft-seeds`` seed, from the final checkpoint, the ROSS pipeline (select the
   verified rollouts, identical completions of a prompt once; ``arith-steps`` audit; masked SFT, ``--epochs-sft`` epochs, lr 1e-5, batch 8) on
   the history store (``ross_history``) and on the own store (``ross_own``): the same method, the same
   judge and steps per row, only the source of the successes differs.
5. ``matched``: ``ross_history`` at the own store's size (a random subset of the history's selected
   rollouts as large as ``ross_own``'s): which successes, not how many.
6. ``rl``: continued RL, the paper's other way to spend the compute: the upstream run's own config
   (GRPO on the phase-A prompts) from the final checkpoint for ``--rl-steps`` steps.
7. ``eval``: every model greedy on the run's train prompts (are phase A's successes back?), on
   ``--n-eval`` held-out two-digit sums (the arith test split, ``bench/retrieve_train_bench.py``'s set)
   and on ``--n-chains`` held-out chains (is phase B's skill kept?); paired sign tests per prompt,
   pooled over the SFT seeds.

Stated before the arms ran (docs/ross.md "Complementarity in a curriculum that moves on"): the
complementarity half is **confirmed** if ROSS on the history beats ROSS on the final policy's own
successes on held-out sums and on the train prompts (paired, pooled over ≥ 2 seeds, p < 0.05 after
Holm over the two), while held-out chains do not fall by more than the noise; **falsified** if the two
are equal (the history adds nothing sampling the final policy cannot) — and the whole test is void if
phase B loses nothing (the early sweep's per-prompt solve rates not above the final one's).

Each stage writes ``STATE/<stage>.json`` and is read back, not re-run, when it exists.
Run: ``python bench/ross_moveon.py --upstream bench/out/retrieve_train/rt-off-s0-* --state ~/.cache/gfcr/studies/ross-moveon``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import sys
import time
from pathlib import Path
from typing import Any


def cpu_seconds() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def upstream_facts(run_dir: Path) -> dict[str, Any]:
    """``complementarity_bench.run_facts`` (the run's id, last complete checkpoint, starting model,
    temperature and token budget) with the run folder and the run's last step."""
    from complementarity_bench import run_facts

    from gfcr.store import RolloutStore

    f = run_facts(run_dir)
    steps = RolloutStore.open(run_dir / "store").scan(columns=["step"]).column("step").to_pylist()
    return {"run_dir": str(run_dir), **f, "last_step": max(steps)}


def train_prompts(store: Any) -> list[Any]:
    return sorted((p for p in store.prompts() if p.split == "train"), key=lambda p: p.prompt_id)


def verifier(args: argparse.Namespace) -> Any:
    """The upstream run's verifier (numeric, last-number fallback); ``--format-pattern`` replaces it (tests)."""
    from gfcr.filters.verifiers import FormatVerifier, NumericVerifier

    return FormatVerifier(pattern=args.format_pattern) if args.format_pattern else NumericVerifier(lenient_fallback=True)


def sweep(model: str, store_path: Path, prompts: list[Any], k: int, temperature: float, max_tokens: int,
          seed: int, run_id: str, step: int, ver: Any) -> dict[str, Any]:
    """``k`` samples per prompt from ``model`` (group topology, per-prompt seeds from ``seed``), verified
    by ``ver``, appended to ``store_path``; per-prompt verified counts."""
    from gfcr.filters.apply import verify_many
    from gfcr.generate.engines.base import SamplingParams
    from gfcr.generate.engines.hf import HFEngine
    from gfcr.generate.topologies import make_topology
    from gfcr.store import RolloutStore

    eng = HFEngine(model, max_batch=32, policy_version=Path(model).name)
    topo = make_topology("group", params=SamplingParams(temperature=temperature, max_tokens=max_tokens), seed=seed, k=k)
    store = RolloutStore.open(store_path, create=True)
    store.upsert_prompts(prompts)
    solved: dict[str, int] = {p.prompt_id: 0 for p in prompts}
    t0, c0 = time.time(), cpu_seconds()
    for i in range(0, len(prompts), 16):
        batch = prompts[i:i + 16]
        rs = verify_many(topo.generate(eng, batch, run_id=run_id, step=step), ver, batch)
        store.append(rs)
        for r in rs:
            solved[r.prompt_id] += bool(r.verified)
        print(f"  sweep {run_id}: {i + len(batch)}/{len(prompts)} prompts", file=sys.stderr, flush=True)
    return {"model": model, "run_id": run_id, "k": k, "temperature": temperature, "max_tokens": max_tokens,
            "seed": seed, "rollouts": k * len(prompts), "verified": sum(solved.values()),
            "prompts_solved": sum(v > 0 for v in solved.values()), "per_prompt": solved,
            "wall_s": round(time.time() - t0, 1), "cpu_s": round(cpu_seconds() - c0, 1), "load": os.getloadavg()[0]}


def reuse_early(old: Path, state: Path) -> list[str]:
    """Phase A from another study of the same upstream run (``--reuse-early OLD``): its ``sweep_early.json``,
    its history store and its ``early/*`` evaluation rows (greedy, the same model and prompts: the same
    answers) are copied into ``state`` where ``state`` has none yet. Returns what was copied."""
    done = []
    if not (state / "sweep_early.json").exists():
        if (state / "history").exists():
            shutil.rmtree(state / "history")
        shutil.copytree(old / "history", state / "history")
        shutil.copy2(old / "sweep_early.json", state / "sweep_early.json")
        done += ["sweep_early.json", "history"]
    src, dst = old / "eval.partial.json", state / "eval.partial.json"
    if src.exists():
        part = json.loads(dst.read_text()) if dst.exists() else {}
        old_part = json.loads(src.read_text())
        for k, v in old_part.get("per_prompt", {}).items():
            if k.startswith("early/") and k not in part.setdefault("per_prompt", {}):
                part["per_prompt"][k] = v
                part.setdefault("timing", {})[k] = {**old_part.get("timing", {}).get(k, {}), "reused_from": str(old)}
                done.append(f"eval {k}")
        dst.write_text(json.dumps(part))
    return done


def stage_sweep_early(args: argparse.Namespace, state: Path, up: dict[str, Any]) -> dict[str, Any]:
    from gfcr.store import RolloutStore

    hist = state / "history"
    if hist.exists():  # an earlier start that did not finish: copied and swept again whole
        shutil.rmtree(hist)
    shutil.copytree(Path(up["run_dir"]) / "store", hist)
    prompts = train_prompts(RolloutStore.open(hist))
    return sweep(up["last"], hist, prompts, args.k, up["temperature"], up["max_tokens"], args.seed,
                 f"{up['run_id']}-sweep", up["last_step"] + 1, verifier(args))


def stage_moveon(args: argparse.Namespace, state: Path, up: dict[str, Any]) -> dict[str, Any]:
    import torch
    from ross_testbed import warm_rows
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gfcr.tasks.arith import make_arith
    from gfcr.train.sft import train_masked_sft

    torch.manual_seed(args.seed)
    init = str(Path(args.move_from).expanduser()) if args.move_from else up["last"]
    tok = AutoTokenizer.from_pretrained(init)
    model = AutoModelForCausalLM.from_pretrained(init, dtype=torch.float32)
    chains = make_arith(n=args.n_move, level=5, seed=args.seed, split="train").prompts()
    rows = warm_rows(tok, chains, 0.0, 0.0, args.seed)
    out_dir = state / "final"
    t0, c0 = time.time(), cpu_seconds()
    res = train_masked_sft(model, rows, pad_id=tok.pad_token_id or tok.eos_token_id, epochs=args.move_epochs,
                           lr=args.move_lr, batch_size=8, seed=args.seed, out_dir=out_dir, tokenizer=tok, progress=True)
    return {"dir": str(out_dir), "init": init, "rows": len(rows), "tokens": sum(len(r["input_ids"]) for r in rows),
            "epochs": args.move_epochs, "lr": args.move_lr, "wall_s": round(time.time() - t0, 1),
            "cpu_s": round(cpu_seconds() - c0, 1), "load": os.getloadavg()[0],
            "final_loss": getattr(res, "final_loss", None)}


def sign_test(a: list[float], b: list[float]) -> dict[str, Any]:
    """Paired per-item comparison: means, mean difference, items where a > b / a < b, and the benches'
    exact two-sided sign test (``greso_study.sign_test``, ties dropped)."""
    import numpy as np
    from greso_study import sign_test as exact

    lo, hi, p = exact(np.asarray(a, float) - np.asarray(b, float))
    return {"n": len(a), "a": sum(a) / len(a), "b": sum(b) / len(b), "diff": (sum(a) - sum(b)) / len(a),
            "a_higher": hi, "b_higher": lo, "p": p}


def stage_sweep_final(args: argparse.Namespace, state: Path, up: dict[str, Any], early: dict[str, Any],
                      final: dict[str, Any]) -> dict[str, Any]:
    from gfcr.store import RolloutStore

    own = state / "own"
    if own.exists():
        shutil.rmtree(own)
    prompts = train_prompts(RolloutStore.open(state / "history"))
    res = sweep(final["dir"], own, prompts, args.k, up["temperature"], up["max_tokens"], args.seed + 1,
                "final-sweep", 0, verifier(args))
    e, f = early["per_prompt"], res["per_prompt"]
    ids = sorted(e)
    res["lost"] = {"early_solved_final_not": sum(e[i] > 0 and f[i] == 0 for i in ids),
                   "final_solved_early_not": sum(f[i] > 0 and e[i] == 0 for i in ids),
                   "rate_early_minus_final": sign_test([e[i] / args.k for i in ids], [f[i] / args.k for i in ids])}
    return res


def ross_config(store: Path, out: Path, upstream: str, seed: int, epochs: int, judge: str = "arith-steps",
                check_answer: bool = True, variants: tuple[str, ...] = ("ross",)) -> Any:
    from gfcr.ross.config import load_config

    return load_config(None, {
        "store": str(store), "out_dir": str(out), "upstream_model": upstream, "base_model": None,
        "variants": list(variants), "window": {"task": "arith", "dedup": True}, "judge": {"name": judge, "check_answer": check_answer},
        "build": {"max_length": 512},
        "train": {"epochs": epochs, "lr": 1e-5, "batch_size": 8, "checkpoint_every": 50, "seed": seed},
        "stages": ["select", "audit", "build", "train"]})


def ross_arm(args: argparse.Namespace, state: Path, store: Path, name: str, seed: int,
             final: dict[str, Any]) -> dict[str, Any]:
    """One ROSS arm from the final checkpoint on ``store`` (``STATE/arms/<name>-s<seed>``), timed."""
    from gfcr.ross.audit import select_rollouts
    from gfcr.ross.pipeline import run_ross
    from gfcr.store import RolloutStore

    rd = state / "arms" / f"{name}-s{seed}"
    if not select_rollouts(RolloutStore.open(store), task="arith", dedup=True):  # nothing to relearn from
        print(f"[arms] {name} seed {seed}: no verified rollouts in {store}; the arm is the final checkpoint",
              file=sys.stderr, flush=True)
        return {"dir": final["dir"], "select": {"rollouts": 0}, "empty": True}
    t0, c0 = time.time(), cpu_seconds()
    run = run_ross(ross_config(store, state / "arms", final["dir"], seed, args.epochs_sft, args.judge,
                               check_answer=not args.format_pattern), rd)  # a format verdict has no answer
    rec = {"dir": str(rd / "models" / "ross"), "select": run.results["select"], "build": run.results["build"]["ross"],
           "wall_s": round(time.time() - t0, 1), "cpu_s": round(cpu_seconds() - c0, 1), "load": os.getloadavg()[0]}
    print(f"[arms] {name} seed {seed}: {json.dumps({k: rec[k] for k in ('select', 'wall_s')})}", file=sys.stderr,
          flush=True)
    return rec


def stage_arms(args: argparse.Namespace, state: Path, final: dict[str, Any]) -> dict[str, Any]:
    return {f"{name}-s{sd}": ross_arm(args, state, state / src, name, sd, final)
            for sd in [int(x) for x in args.sft_seeds.split(",")]
            for name, src in (("ross_history", "history"), ("ross_own", "own"))}


def stage_matched(args: argparse.Namespace, state: Path, final: dict[str, Any], arms: dict[str, Any]) -> dict[str, Any]:
    """``ross_history`` at the own store's size: a store ``STATE/history-matched`` of as many of the
    history's selected rollouts (verified, distinct) as ``ross_own`` selected, drawn at random
    (``--seed``), then the same ROSS pipeline per SFT seed. Separates *which* successes from *how many*."""
    from gfcr.ross.audit import select_rollouts
    from gfcr.store import RolloutStore

    seeds = [int(x) for x in args.sft_seeds.split(",")]
    n = arms[f"ross_own-s{seeds[0]}"]["select"]["rollouts"]
    hist = RolloutStore.open(state / "history")
    pool = select_rollouts(hist, task="arith", dedup=True)
    pick = random.Random(args.seed).sample(pool, min(n, len(pool)))
    sub = state / "history-matched"
    if sub.exists():
        shutil.rmtree(sub)
    store = RolloutStore.open(sub, create=True)
    store.upsert_prompts(hist.prompts(ids=sorted({r.prompt_id for r in pick})))
    store.append(pick)
    out: dict[str, Any] = {"rollouts": len(pick), "of": len(pool), "prompts": len({r.prompt_id for r in pick})}
    for sd in seeds:
        out[f"ross_history_matched-s{sd}"] = ross_arm(args, state, sub, "ross_history_matched", sd, final)
    return out


def stage_mixed(args: argparse.Namespace, state: Path, final: dict[str, Any]) -> dict[str, Any]:
    """``ross_mixed``: the history plus the new task's data. A store ``STATE/history-mixed``: the history
    store, then the first ``--n-mix`` of phase B's worked chains as verified rollouts (the same texts
    phase B trained on, ``ross_testbed.synthetic_store``, ``policy_version`` ``synthetic``); the same
    ROSS pipeline per SFT seed. Does replaying the new skill's data keep it while the history brings
    the old one back?"""
    from ross_testbed import synthetic_store
    from transformers import AutoTokenizer

    from gfcr.tasks.arith import make_arith

    sub = state / "history-mixed"
    if sub.exists():
        shutil.rmtree(sub)
    shutil.copytree(state / "history", sub)
    chains = make_arith(n=args.n_move, level=5, seed=args.seed, split="train").prompts()[:args.n_mix]
    tok = AutoTokenizer.from_pretrained(final["dir"])
    out: dict[str, Any] = {"chains": synthetic_store(sub, tok, chains, 0.0, 0.0, args.seed, "random", append=True)}
    for sd in [int(x) for x in args.sft_seeds.split(",")]:
        out[f"ross_mixed-s{sd}"] = ross_arm(args, state, sub, "ross_mixed", sd, final)
    return out


def stage_rl(args: argparse.Namespace, state: Path, up: dict[str, Any], final: dict[str, Any]) -> dict[str, Any]:
    """Continued RL: the upstream run's own config (GRPO on the phase-A prompts, its loop, loss, learning
    rate and sampling) from the final checkpoint, ``--rl-steps`` steps, into ``STATE/continued_rl``."""
    from gfcr.store import RolloutStore
    from gfcr.train.checkpoint import latest_checkpoint
    from gfcr.train.config import load_config
    from gfcr.train.loop import train

    d = state / "continued_rl"
    if d.exists():  # an earlier start that did not finish: run again whole
        shutil.rmtree(d)
    over = {"model": final["dir"], "run_name": d.name, "output_dir": str(state), "steps": args.rl_steps,
            "seed": args.seed, "eval.before": False, "eval.after": False, "checkpoint.every": args.rl_steps,
            "tensorboard": False}
    t0, c0 = time.time(), cpu_seconds()
    res = train(load_config(Path(up["run_dir"]) / "config.yaml", over), run_dir=d, progress=False)
    rs = RolloutStore.open(res.store_path).rollouts()
    return {"dir": str(latest_checkpoint(res.run_dir)), "steps": args.rl_steps, "rollouts": len(rs),
            "verified": sum(bool(r.verified) for r in rs), "wall_s": round(time.time() - t0, 1),
            "cpu_s": round(cpu_seconds() - c0, 1), "load": os.getloadavg()[0]}


def greedy(model: str, prompts: list[Any], max_tokens: int, ver: Any) -> list[bool]:
    from gfcr.generate.engines.base import GenRequest, SamplingParams
    from gfcr.generate.engines.hf import HFEngine

    eng = HFEngine(model, max_batch=32)
    reqs = [GenRequest(messages=[{"role": m.role, "content": m.content} for m in p.messages],
                       params=SamplingParams(n=1, temperature=0.0, max_tokens=max_tokens)) for p in prompts]
    return [bool(ver.verify(r.text or "", p.answer).passed) for p, (r,) in zip(prompts, eng.generate(reqs), strict=True)]


def stage_eval(args: argparse.Namespace, state: Path, up: dict[str, Any], final: dict[str, Any],
               arms: dict[str, Any], partial: dict[str, Any], rl: dict[str, Any] | None = None,
               matched: dict[str, Any] | None = None, mixed: dict[str, Any] | None = None) -> dict[str, Any]:
    from gfcr.store import RolloutStore
    from gfcr.tasks.arith import make_arith

    sets = {"train_sums": (train_prompts(RolloutStore.open(state / "history")), up["max_tokens"]),
            "heldout_sums": (make_arith(n=args.n_eval, level=2, split="test", seed=0).prompts(), up["max_tokens"]),
            "heldout_chains": (make_arith(n=args.n_chains, level=5, split="test", seed=0).prompts(), args.chain_tokens)}
    models = {"early": up["last"], "final": final["dir"], **{k: v["dir"] for k, v in arms.items()},
              **({"continued_rl": rl["dir"]} if rl else {}),
              **{k: v["dir"] for k, v in (matched or {}).items() if k.startswith("ross_")},
              **{k: v["dir"] for k, v in (mixed or {}).items() if k.startswith("ross_")}}
    res = partial.setdefault("per_prompt", {})
    timing = partial.setdefault("timing", {})
    path = state / "eval.partial.json"
    for name, model in models.items():
        for s, (prompts, mt) in sets.items():
            key = f"{name}/{s}"
            if key in res:
                continue
            same = next((n for n, m in models.items() if m == model and f"{n}/{s}" in res), None)
            if same is not None:  # an empty arm is the final checkpoint: the same greedy answers
                res[key], timing[key] = res[f"{same}/{s}"], {"same_as": same}
                path.write_text(json.dumps(partial))
                continue
            t0, c0 = time.time(), cpu_seconds()
            res[key] = greedy(model, prompts, mt, verifier(args))
            timing[key] = {"wall_s": round(time.time() - t0, 1), "cpu_s": round(cpu_seconds() - c0, 1),
                           "load": os.getloadavg()[0]}
            path.write_text(json.dumps(partial))
            print(f"[eval] {key}: {sum(res[key])}/{len(res[key])} ({timing[key]['wall_s']} s)", file=sys.stderr, flush=True)
    seeds = sorted({k.rsplit("-s", 1)[1] for k in arms})
    out: dict[str, Any] = {"n": {s: len(p) for s, (p, _) in sets.items()}, "timing": timing,
                           "pass@1": {k: sum(v) / len(v) for k, v in res.items()}, "paired": {}}

    def pooled(a: str, b: str, s: str) -> dict[str, Any]:  # per-prompt shares over seeds ('-' rows: one model)
        def share(m: str) -> list[float]:
            rows = [res[f"{m}-s{sd}/{s}"] for sd in seeds] if f"{m}-s{seeds[0]}/{s}" in res else [res[f"{m}/{s}"]]
            return [sum(col) / len(col) for col in zip(*rows, strict=True)]
        return sign_test(share(a), share(b))

    for s in sets:
        out["paired"][s] = {"final - early": pooled("final", "early", s),
                            "ross_history - ross_own": pooled("ross_history", "ross_own", s),
                            "ross_history - final": pooled("ross_history", "final", s),
                            "ross_own - final": pooled("ross_own", "final", s),
                            **({"ross_history - continued_rl": pooled("ross_history", "continued_rl", s),
                                "continued_rl - final": pooled("continued_rl", "final", s)} if rl else {}),
                            **({"ross_history_matched - ross_own": pooled("ross_history_matched", "ross_own", s),
                                "ross_history - ross_history_matched": pooled("ross_history", "ross_history_matched", s)}
                               if matched else {}),
                            **({"ross_mixed - ross_history": pooled("ross_mixed", "ross_history", s),
                                "ross_mixed - ross_own": pooled("ross_mixed", "ross_own", s),
                                "ross_mixed - final": pooled("ross_mixed", "final", s)} if mixed else {}),
                            **{f"ross_history - ross_own (seed {sd})": sign_test(
                                [float(x) for x in res[f"ross_history-s{sd}/{s}"]],
                                [float(x) for x in res[f"ross_own-s{sd}/{s}"]]) for sd in seeds}}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", required=True, help="a finished gfcr train run folder (phase A)")
    ap.add_argument("--state", default="~/.cache/gfcr/studies/ross-moveon", help="the study's folder (outside the repo)")
    ap.add_argument("--stages", default="sweep_early,moveon,sweep_final,arms,matched,rl,eval",
                    help="comma list; also: mixed (the history plus phase B's chains)")
    ap.add_argument("--reuse-early", default=None,
                    help="another study's state on the same --upstream: its phase A (sweep, history store, early "
                         "evaluation rows) is copied, not run again")
    ap.add_argument("--k", type=int, default=4, help="samples per train prompt in each sweep")
    ap.add_argument("--n-move", type=int, default=384, help="worked chains of the move-on SFT")
    ap.add_argument("--move-from", default=None,
                    help="phase B starts from this checkpoint instead of the upstream run's last (a longer move-on: "
                         "another study's final checkpoint)")
    ap.add_argument("--move-epochs", type=int, default=2)
    ap.add_argument("--move-lr", type=float, default=2e-5)
    ap.add_argument("--n-mix", type=int, default=128, help="phase B's worked chains added to the history (stage mixed)")
    ap.add_argument("--sft-seeds", default="0,1")
    ap.add_argument("--epochs-sft", type=int, default=3, help="epochs of each ROSS arm (the paper's 3)")
    ap.add_argument("--rl-steps", type=int, default=12, help="continued RL: GRPO steps from the final checkpoint")
    ap.add_argument("--n-eval", type=int, default=300, help="held-out two-digit sums")
    ap.add_argument("--n-chains", type=int, default=200, help="held-out three-term chains")
    ap.add_argument("--chain-tokens", type=int, default=160)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--judge", default="arith-steps", help="the ROSS arms' judge (keep-all: no mask, tests)")
    ap.add_argument("--format-pattern", default=None, help="verify by this regex instead of the numeric answer (tests)")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    state = Path(args.state).expanduser()
    state.mkdir(parents=True, exist_ok=True)
    up = upstream_facts(Path(args.upstream))
    if args.reuse_early:
        print(f"reused from {args.reuse_early}: {reuse_early(Path(args.reuse_early).expanduser(), state)}", file=sys.stderr)
    results: dict[str, Any] = {"upstream": up, "load_start": os.getloadavg()}
    from stages import run_stages

    def evaluate() -> dict[str, Any]:
        pp = state / "eval.partial.json"
        partial = json.loads(pp.read_text()) if pp.exists() else {}
        return stage_eval(args, state, up, results["moveon"], results["arms"], partial, results.get("rl"),
                          results.get("matched"), results.get("mixed"))

    run_stages(args.stages.split(","), lambda st: state / f"{st}.json", {
        "sweep_early": lambda: stage_sweep_early(args, state, up),
        "moveon": lambda: stage_moveon(args, state, up),
        "sweep_final": lambda: stage_sweep_final(args, state, up, results["sweep_early"], results["moveon"]),
        "arms": lambda: stage_arms(args, state, results["moveon"]),
        "matched": lambda: stage_matched(args, state, results["moveon"], results["arms"]),
        "mixed": lambda: stage_mixed(args, state, results["moveon"]),
        "rl": lambda: stage_rl(args, state, up, results["moveon"]),
        "eval": evaluate}, results, brief=lambda r: {k: v for k, v in r.items() if k != "per_prompt"}, echo=3000)
    results["load_end"] = os.getloadavg()
    (state / "result.json").write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
