"""ROSS's mechanism testbed (issue 47): three-term chains whose successes carry corrected mistakes.

Stages (each writes ``STATE/<stage>.json``; a finished stage is read back, not re-run):

1. ``judge``: worked solutions of held-out-shaped chains (:mod:`gfcr.tasks.chains`) at each dose;
   the ``arith-steps`` judge's kept characters against the planted exclusions (exact match share,
   char precision/recall of the exclusions), and how many chains have a carry/borrow step (where
   ``--mistake carry`` may plant a slip). Seconds; no model.
2. ``warm``: the default model SFT'd (full supervision of the assistant turn, the seed's 3 epochs by
   default) on ``--n-warm`` worked solutions of train-split chains at ``--dose`` (the share of steps
   with a planted, corrected mistake); saved under ``STATE/warm-<dose>`` (``warm-carry-<dose>`` with
   ``--mistake carry``), on ``--device`` (SFT batches follow the model's device).
3. ``probe``: greedy generations of base and warm start on ``--n-probe`` held-out chains: how many
   verify (numeric, the 'Answer: N' line or the last number) and how many of the *verified* ones hold
   a false claim that a later line corrects (what ROSS's mask excludes). Paired McNemar on verified.
4. ``sampled``: the warm start at T = 1 on the same prompts (what an upstream RL run from it samples
   and stores): verified, and verified with a corrected mistake. Warm start and probes run on
   ``--device`` (auto: CUDA when available).

5. ``mech``: the mask's mechanism on a *synthetic* upstream store (the warm start did not sample
   successes with corrected mistakes; docs/ross.md): ``--n-warm`` verified rollouts whose assistant
   turns are the worked solutions at ``--dose``, then the ROSS pipeline per ``--sft-seeds`` seed
   (select, ``arith-steps`` audit, build, ``--epochs-sft`` epochs of masked SFT from the default model,
   evaluation on ``--n-probe`` held-out chains, greedy and one sample at T = 1) in
   ``STATE/mech-<tag>-s<seed>``, a ``bench/ross_study.py``-shaped state that ``bench/ross_seeds.py
   --bench chains --sampled`` pools. Not in the default ``--stages``.
6. ``mechrl``: the testbed's continued-RL row (after ``mech``): GRPO from the default model on the
   train-split chains (``--rl-steps`` × ``--rl-prompts`` × K = ``--rl-k``, T = 1), its last checkpoint
   evaluated as row ``continued_rl`` in the seeds' states. Not in the default ``--stages``.

``--mistake``: ``random`` (the pilot's recipe: a slip at any step, off by ±1/2/10) or ``carry``
(systematic slips: only at a carry or borrow, the result without it, a doubt naming the reason;
:mod:`gfcr.tasks.chains`). Every stage's output records it; carry-mode files carry ``carry-`` in their
names (``judge-carry-0.3.json``, ``warm-carry-0.3``), so the two modes share a state folder.

What confirms or falsifies the mechanism (stated before the full run; see docs/ross.md "Mechanism
testbed"): on an upstream store from a warm start with corrected mistakes in ≥ 20% of its verified
successes, ROSS > ROSS w/o mask on held-out pass@1 (paired, Holm over the arms, ≥ 300 prompts, ≥ 2
seeds) *and* ROSS's models write fewer corrected mistakes on held-out prompts than w/o mask's confirm
it; no difference in pass@1 with fewer imitated mistakes says the mask changes style, not accuracy;
equal imitation falsifies the mechanism here. The upstream RL and the four arms run through
``bench/ross_study.py --run own`` with the warm start as the model (the command is printed by
``probe``).

Run: ``python bench/ross_testbed.py --state ~/.cache/gfcr/studies/ross-testbed [--dose 0.3] [--mistake carry]``.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


def cpu_seconds() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def tag(args: argparse.Namespace) -> str:
    """The suffix of this run's files: ``"0.3"`` (random mode, the pilot's names) or ``"carry-0.3"``."""
    return f"{args.dose}" if args.mistake == "random" else f"{args.mistake}-{args.dose}"


def resolve_device(device: str) -> str:
    """``auto`` → ``cuda`` when torch sees a GPU, else ``cpu``; ``cpu``/``cuda`` as given."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def chains(n: int, split: str, seed: int) -> list[Any]:
    from gfcr.tasks.arith import make_arith

    return make_arith(n=n, level=5, seed=seed, split=split).prompts()


def stage_judge(args: argparse.Namespace) -> dict[str, Any]:
    """Planted vs judged exclusions per dose (char level)."""
    import numpy as np

    from gfcr.ross.judges import ArithSteps, JudgeRequest
    from gfcr.ross.units import split_units
    from gfcr.ross.verdict import validate_verdict
    from gfcr.tasks.chains import carries, steps_of, worked_solution

    out = {}
    for dose in (0.0, 0.15, 0.3, 0.6):
        exact = tp = fp = fn = with_mistake = with_slip_step = 0
        prompts = chains(args.n_judge, "test", args.seed)
        for i, p in enumerate(prompts):
            expr = p.meta["expression"]
            ws = worked_solution(expr, random.Random(f"{args.seed}|{i}"), dose, args.detour, mistake=args.mistake)
            with_slip_step += any(carries(v, op, b) for v, op, b, _ in steps_of(expr))
            units = split_units(ws.text)
            req = JudgeRequest(f"r{i}", "arith", "", ws.text, units, "select-keep", answer=p.answer)
            d = validate_verdict(ArithSteps().verdict(req), ws.text, units, "select-keep", answer=p.answer)
            judged, planted = ~d.kept_chars, np.array(ws.excluded_mask(), bool)
            exact += bool(np.array_equal(judged, planted))
            tp += int((judged & planted).sum())
            fp += int((judged & ~planted).sum())
            fn += int((~judged & planted).sum())
            with_mistake += ws.n_mistakes > 0
        out[str(dose)] = {"mistake": args.mistake, "n": len(prompts), "exact": exact, "with_mistake": with_mistake,
                          "with_carry_or_borrow_step": with_slip_step,
                          "precision": tp / (tp + fp) if tp + fp else None,
                          "recall": tp / (tp + fn) if tp + fn else None}
    return out


def worked_tokens(tok: Any, p: Any, i: int, dose: float, detour: float, seed: int,
                  mistake: str = "random") -> tuple[Any, list[int], list[int]]:
    """Prompt ``p`` (the ``i``-th) worked at ``dose``: ``(WorkedSolution, context ids, answer ids + eos)``,
    the context chat-templated with the generation prompt."""
    from gfcr.tasks.chains import worked_solution

    ws = worked_solution(p.meta["expression"], random.Random(f"warm|{seed}|{i}"), dose, detour, mistake=mistake)
    msgs = [{"role": m.role, "content": m.content} for m in p.messages]
    ctx = tok(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False),
              add_special_tokens=False)["input_ids"]
    return ws, list(ctx), tok(ws.text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]


def warm_rows(tok: Any, prompts: list[Any], dose: float, detour: float, seed: int,
              mistake: str = "random") -> list[dict[str, Any]]:
    """Token rows (``input_ids``, ``loss_mask``): chat-templated prompt (unsupervised) + worked solution + eos."""
    rows = []
    for i, p in enumerate(prompts):
        _, ctx, ids = worked_tokens(tok, p, i, dose, detour, seed, mistake)
        rows.append({"input_ids": ctx + ids, "loss_mask": [0] * len(ctx) + [1] * len(ids)})
    return rows


def stage_warm(args: argparse.Namespace, state: Path) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gfcr.models import resolve_model
    from gfcr.train.sft import train_masked_sft

    torch.manual_seed(args.seed)
    base = resolve_model("default")
    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).to(resolve_device(args.device))
    rows = warm_rows(tok, chains(args.n_warm, "train", args.seed), args.dose, args.detour, args.seed, args.mistake)
    out_dir = state / f"warm-{tag(args)}"
    t0, c0 = time.time(), cpu_seconds()
    res = train_masked_sft(model, rows, pad_id=tok.pad_token_id or tok.eos_token_id, epochs=args.epochs,
                           lr=args.lr, batch_size=8, seed=args.seed, out_dir=out_dir, tokenizer=tok, progress=True)
    return {"dir": str(out_dir), "rows": len(rows), "tokens": sum(len(r["input_ids"]) for r in rows),
            "epochs": args.epochs, "lr": args.lr, "dose": args.dose, "detour": args.detour, "mistake": args.mistake,
            "wall_s": time.time() - t0, "cpu_s": cpu_seconds() - c0, "final_loss": getattr(res, "final_loss", None)}


def probe(model: str, prompts: list[Any], temperature: float = 0.0, seed: int = 0,
          device: str = "cpu") -> list[dict[str, Any]]:
    from gfcr.filters.verifiers import NumericVerifier
    from gfcr.generate.engines.base import GenRequest, SamplingParams
    from gfcr.generate.engines.hf import HFEngine
    from gfcr.ross.claims import corrected_mistakes

    eng = HFEngine(model, max_batch=32, device=device)
    ver = NumericVerifier(lenient_fallback=True)
    reqs = [GenRequest(messages=[{"role": m.role, "content": m.content} for m in p.messages],
                       params=SamplingParams(n=1, temperature=temperature, max_tokens=160, seed=seed + i))
            for i, p in enumerate(prompts)]
    rows = []
    for p, (r,) in zip(prompts, eng.generate(reqs), strict=True):
        text = r.text or ""
        v = ver.verify(text, p.answer)
        rows.append({"prompt_id": p.prompt_id, "verified": bool(v.passed), "finish": r.finish_reason,
                     "corrected": corrected_mistakes(text), "text": text})
    return rows


def rows_file(stage: str, args: argparse.Namespace) -> str:
    """The per-generation rows' file: the pilot's name in random mode, ``<stage>-rows-carry-<dose>.json`` else."""
    return f"{stage}-rows.json" if args.mistake == "random" else f"{stage}-rows-{tag(args)}.json"


def stage_probe(args: argparse.Namespace, state: Path, warm: dict[str, Any]) -> dict[str, Any]:
    from gfcr.evaluate.paired import mcnemar

    prompts = chains(args.n_probe, "test", args.seed)
    device = resolve_device(args.device)
    out: dict[str, Any] = {"mistake": args.mistake, "device": device}
    per: dict[str, list[dict[str, Any]]] = {}
    for name, model in (("base", "default"), ("warm", warm["dir"])):
        t0 = time.time()
        per[name] = probe(model, prompts, device=device)
        ok = [r for r in per[name] if r["verified"]]
        out[name] = {"n": len(prompts), "verified": len(ok), "verified_with_corrected": sum(r["corrected"] > 0 for r in ok),
                     "truncated": sum(r["finish"] == "length" for r in per[name]), "wall_s": time.time() - t0}
    a = [r["verified"] for r in per["base"]]
    b = [r["verified"] for r in per["warm"]]
    out["mcnemar_base_minus_warm"] = mcnemar(a, b, metric="greedy verified").to_dict()
    (state / rows_file("probe", args)).write_text(json.dumps(per, indent=1))
    out["next"] = (f"python bench/ross_study.py --state {state}/study --run own --rl-engine hf "
                   f"--rl-set model={warm['dir']} --rl-set tasks.0.params.level=5 --min-verified 300")
    return out


def stage_sampled(args: argparse.Namespace, state: Path, warm: dict[str, Any]) -> dict[str, Any]:
    """The warm start sampled at T = 1 (what an upstream RL run from it samples and stores): verified,
    and verified with a corrected mistake (greedy decoding takes the modal, mistake-free line)."""
    prompts = chains(args.n_probe, "test", args.seed)
    device = resolve_device(args.device)
    t0, c0 = time.time(), cpu_seconds()
    rows = probe(warm["dir"], prompts, temperature=1.0, seed=args.seed, device=device)
    ok = [r for r in rows if r["verified"]]
    (state / rows_file("sampled", args)).write_text(json.dumps(rows, indent=1))
    return {"mistake": args.mistake, "device": device, "n": len(prompts), "temperature": 1.0, "verified": len(ok),
            "verified_with_corrected": sum(r["corrected"] > 0 for r in ok),
            "any_with_corrected": sum(r["corrected"] > 0 for r in rows),
            "truncated": sum(r["finish"] == "length" for r in rows),
            "wall_s": time.time() - t0, "cpu_s": cpu_seconds() - c0}


def synthetic_store(path: Path, tok: Any, prompts: list[Any], dose: float, detour: float, seed: int,
                    mistake: str, append: bool = False) -> dict[str, Any]:
    """A store of one verified rollout per prompt: the worked solution (:func:`warm_rows`' recipe) as the
    assistant turn, an upstream policy's successes with planted corrected mistakes. Their tokens are built
    from text (``tokens_source="retokenized"``, logprobs 0 as for any retokenized row); ``policy_version``
    ``"synthetic"`` and ``meta`` (``planted_mistakes``, dose, mode) say what they are. ``append``: add them
    to the store at ``path`` instead of writing a new one."""
    import numpy as np

    from gfcr.records import Message, Rollout
    from gfcr.store import RolloutStore

    if path.exists() and not append:  # an earlier start that did not finish: written again whole
        shutil.rmtree(path)
    store = RolloutStore.open(path, create=True)
    store.upsert_prompts(prompts)
    rs, planted = [], 0
    for i, p in enumerate(prompts):
        ws, ctx, gen = worked_tokens(tok, p, i, dose, detour, seed, mistake)
        ids = np.array(ctx + gen, np.int32)
        role = np.array([0] * len(ctx) + [1] * len(gen), np.int8)
        rs.append(Rollout(run_id="synthetic", prompt_id=p.prompt_id, token_ids=ids, token_role=role,
                          logprobs=np.zeros(len(ids), np.float32), task=p.task, step=0, policy_version="synthetic",
                          messages=[*p.messages, Message("assistant", ws.text)], reward=1.0, verified=True,
                          verifier={"name": "numeric", "evidence": {"parsed": p.answer}}, tokens_source="retokenized",
                          meta={"planted_mistakes": ws.n_mistakes, "dose": dose, "detour": detour, "mistake": mistake}))
        planted += ws.n_mistakes > 0
    store.append(rs)
    return {"rollouts": len(rs), "with_planted_mistake": planted}


def stage_mech(args: argparse.Namespace, state: Path) -> dict[str, Any]:
    """The mask's mechanism on a synthetic upstream store (docs/ross.md "Mechanism testbed"): per SFT
    seed (``--sft-seeds``), a state ``STATE/mech-<tag>-s<seed>`` laid out as ``bench/ross_study.py``'s
    (``upstream/store``, ``ross.yaml``, ``ross/``) so that ``bench/ross_seeds.py`` pools it; ROSS,
    ROSS w/o mask and positive SFT (the latter two are one dataset when the judge discards nothing) from
    the default model, ``--epochs-sft`` epochs, evaluated on ``--n-probe`` held-out chains (greedy and
    one sample at T = 1, ``--max-tokens``)."""
    import ross_study as S
    import yaml
    from transformers import AutoTokenizer

    from gfcr.models import resolve_model
    from gfcr.ross.config import load_config

    tok = AutoTokenizer.from_pretrained(resolve_model("default"))
    out: dict[str, Any] = {"mistake": args.mistake, "dose": args.dose, "n_store": args.n_warm, "seeds": {}}
    for sd in [int(x) for x in args.sft_seeds.split(",")]:
        m = state / f"mech-{tag(args)}-s{sd}"
        m.mkdir(parents=True, exist_ok=True)
        store = m / "upstream" / "store"
        if not (m / "upstream" / "upstream.json").exists():
            info = synthetic_store(store, tok, chains(args.n_warm, "train", args.seed), args.dose, args.detour,
                                   args.seed, args.mistake)
            S.write_json(m / "upstream" / "upstream.json", {"synthetic": True, **info})
        if not (m / "ross.yaml").exists():
            bench = {"name": "chains", "source": "arith", "params": {"level": 5}, "n_prompts": args.n_probe,
                     "domain": "math"}
            cfg = {"store": str(store), "out_dir": str(m / "ross_runs"), "upstream_model": "default",
                   "base_model": None, "variants": ["positive_sft", "ross_nomask", "ross"],
                   "window": {"task": "arith", "dedup": True}, "judge": {"name": "arith-steps"},
                   "build": {"max_length": 512},
                   "train": {"epochs": args.epochs_sft, "lr": 1e-5, "batch_size": 8, "checkpoint_every": 50,
                             "seed": sd},
                   "evaluate": {"benchmarks": [bench], "k": 1, "ks": [1], "temperature": 1.0,
                                "max_tokens": args.max_tokens, "engine": "hf", "save_generations": True,
                                "verifier": {"name": "numeric", "params": {"lenient_fallback": True}}},
                   "stages": ["select", "audit", "build", "train", "evaluate"]}
            (m / "ross.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        cfg = load_config(m / "ross.yaml")
        rd = m / "ross"
        (rd / "rows").mkdir(parents=True, exist_ok=True)
        first = state / f"mech-{tag(args)}-s{args.sft_seeds.split(',')[0]}" / "ross" / "rows"
        if first != rd / "rows" and (first / "upstream.json").exists() and not (rd / "rows" / "upstream.json").exists():
            # the upstream row (the default model) is the same model on the same prompts at every SFT seed
            for f in ("upstream.generations.jsonl", "upstream.json"):
                shutil.copyfile(first / f, rd / "rows" / f)
        clock = S.Clock(m, None)
        build = S.stage_ross_data(cfg, rd, tok)
        S.stage_ross_train(cfg, rd, tok, clock, build)
        ev = S.stage_ross_evaluate(cfg, rd, tok, clock)
        out["seeds"][str(sd)] = {"state": str(m), "build": build["build"],
                                 "metrics": {r: v["chains"]["metrics"] for r, v in ev["results"].items()}}
        print(f"mech seed {sd}: {json.dumps(out['seeds'][str(sd)]['metrics'])}", flush=True)
    return out


def stage_mech_rl(args: argparse.Namespace, state: Path) -> dict[str, Any]:
    """The mechanism testbed's continued-RL row: GRPO from the upstream model (the default model) on the
    train-split chains, ``configs/arith-smollm2.yaml``'s loop and learning rate with the chains task,
    ``--rl-steps`` steps × ``--rl-prompts`` prompts × K = ``--rl-k`` at T = 1 and ``--max-tokens`` (the
    same extra compute as about one ROSS arm's SFT; both are timed), in ``STATE/mechrl-<tag>``; its last
    checkpoint is evaluated once as row ``continued_rl`` in the first SFT seed's state, exactly as the
    ROSS rows were (``ross.yaml``'s evaluation), and copied into the other seeds' states (one model, the
    same prompts and evaluation seed), where ``bench/ross_seeds.py`` pools it."""
    import ross_study as S
    from retrieve_train_bench import _train_stats
    from transformers import AutoTokenizer

    from gfcr.models import resolve_model
    from gfcr.ross import pipeline as P
    from gfcr.ross.config import load_config as ross_load
    from gfcr.ross.evaluation import evaluate_models
    from gfcr.train.checkpoint import latest_checkpoint
    from gfcr.train.config import load_config
    from gfcr.train.loop import prepare_run

    seeds = args.sft_seeds.split(",")
    first = state / f"mech-{tag(args)}-s{seeds[0]}"
    if not (first / "ross.yaml").exists():
        raise SystemExit(f"mechrl: {first} has no ross.yaml; run --stages mech first")
    d = state / f"mechrl-{tag(args)}"
    clock = S.Clock(d.parent, None)
    over = {"run_name": d.name, "output_dir": str(state), "steps": args.rl_steps, "tensorboard": False,
            "tasks": [{"name": "arith", "n_train": args.n_warm, "n_eval": 0, "params": {"level": 5}}],
            "generate.topology": {"name": "group", "params": {"k": args.rl_k}},
            "generate.prompts_per_step": args.rl_prompts, "generate.temperature": 1.0,
            "generate.max_tokens": args.max_tokens, "eval.before": False, "eval.after": False,
            "checkpoint.every": 1, "checkpoint.keep_last": 1, "seed": args.seed}
    cfg = load_config(Path(__file__).resolve().parent.parent / "configs" / "arith-smollm2.yaml", over)
    resume = d.exists() and latest_checkpoint(d) is not None
    if d.exists() and not resume:  # started, never checkpointed: start again
        shutil.rmtree(d)
    d, resuming = prepare_run(cfg, d if resume else None, None if resume else d)
    ck = S.train_steps(cfg, d, resuming, clock, "continued RL")
    steps = [r for r in S.read_jsonl(clock.path) if r["what"].startswith("continued RL step")]  # over resumes
    train = {"wall_s": round(sum(r["wall_s"] for r in steps)), "cpu_s": round(sum(r["cpu_s"] for r in steps)),
             "checkpoint": str(ck), **_train_stats(str(d / "store"))}
    rcfg = ross_load(first / "ross.yaml")
    tok = AutoTokenizer.from_pretrained(resolve_model("default"))
    rows = first / "ross" / "rows"
    if not (rows / "continued_rl.json").exists():
        gens = rows / "continued_rl.generations.jsonl"
        gens.write_text("")
        benches = P.heldout_benchmarks(rcfg, P.open_store(rcfg))

        def one() -> dict[str, Any]:
            return evaluate_models({"continued_rl": str(ck)}, tok, benches, rcfg.evaluate, load=P.load_model, log=print,
                                   on_generation=lambda g: S.append_jsonl(gens, g))["continued_rl"]

        S.write_json(rows / "continued_rl.json", S.timed(S.Clock(first, None), "eval_sample", 2 * args.n_probe,
                                                         "evaluation of continued_rl", one))
    for sd in seeds[1:]:
        other = state / f"mech-{tag(args)}-s{sd}" / "ross" / "rows"
        for f in ("continued_rl.generations.jsonl", "continued_rl.json"):
            shutil.copyfile(rows / f, other / f)
    res = json.loads((rows / "continued_rl.json").read_text())
    return {"train": train, "metrics": res["chains"]["metrics"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--state", default="~/.cache/gfcr/studies/ross-testbed", help="the study's folder (outside the repo)")
    ap.add_argument("--stages", default="judge,warm,probe,sampled")
    ap.add_argument("--dose", type=float, default=0.3, help="share of steps with a planted corrected mistake")
    ap.add_argument("--detour", type=float, default=0.1, help="share of steps repeated word for word")
    ap.add_argument("--mistake", choices=("random", "carry"), default="random",
                    help="random: a slip at any step (off by 1/2/10); carry: only at a carry/borrow, the result without it")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                    help="where the probes generate (auto: cuda when available); the warm start's SFT runs on the CPU")
    ap.add_argument("--n-judge", type=int, default=400)
    ap.add_argument("--n-warm", type=int, default=512)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--n-probe", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sft-seeds", default="0,1", help="mech: the SFT seeds (one state per seed)")
    ap.add_argument("--epochs-sft", type=int, default=3, help="mech: epochs of each ROSS arm (the paper's 3)")
    ap.add_argument("--max-tokens", type=int, default=192, help="mech: new tokens per held-out generation")
    ap.add_argument("--rl-steps", type=int, default=24,
                    help="mechrl: GRPO steps of the continued-RL row (24: about one ROSS arm's SFT wall time)")
    ap.add_argument("--rl-prompts", type=int, default=4, help="mechrl: prompts per step")
    ap.add_argument("--rl-k", type=int, default=8, help="mechrl: rollouts per prompt (the group size)")
    args = ap.parse_args()
    state = Path(args.state).expanduser()
    state.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    from stages import run_stages

    run_stages(args.stages.split(","), lambda st: state / f"{st}-{tag(args)}.json", {
        "judge": lambda: stage_judge(args),
        "warm": lambda: stage_warm(args, state),
        "probe": lambda: stage_probe(args, state, results["warm"]),
        "sampled": lambda: stage_sampled(args, state, results["warm"]),
        "mech": lambda: stage_mech(args, state),
        "mechrl": lambda: stage_mech_rl(args, state)}, results)


if __name__ == "__main__":
    main()
