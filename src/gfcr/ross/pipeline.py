"""The ROSS driver: select → audit → build → train → evaluate → analyze, each stage timed.

Stages talk through the store (audits) and the run folder (``data/<variant>``,
``models/<variant>``, ``eval.json``, ``analysis.json``, ``table.md``), so each one is also a
command (``gfcr ross <stage> CONFIG --run-dir DIR``) and a function here. Variants:

- ``positive_sft``: the ``keep-all`` judge's audits (every verified success, all generated tokens);
- ``ross_nomask``: the ROSS judge's kept rollouts, every generated token supervised;
- ``ross``: the same rollouts and context, only judge-selected tokens supervised;
- ``ross_from_base``: ``ross``'s dataset trained from the base checkpoint (the seed's Table 4).

All but ``ross_from_base`` start from the upstream checkpoint.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gfcr.ross.config import RossConfig

DATASET_OF = {"positive_sft": ("keep-all", False), "ross_nomask": ("judge", True), "ross": ("judge", False),
              "ross_from_base": ("judge", False)}


@dataclass
class RossRun:
    run_dir: Path
    timings: dict[str, float] = field(default_factory=dict)
    results: dict[str, Any] = field(default_factory=dict)
    table: str = ""


def new_run_dir(cfg: RossConfig) -> Path:
    """A fresh folder under ``cfg.out_dir`` (runs never overwrite each other)."""
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    d = Path(cfg.out_dir) / f"ross-{stamp}-{secrets.token_hex(2)}"
    d.mkdir(parents=True, exist_ok=False)
    (d / "config.json").write_text(cfg.model_dump_json(indent=2))
    return d


def open_store(cfg: RossConfig) -> Any:
    from gfcr.store import RolloutStore

    return RolloutStore.open(cfg.store)


def load_tokenizer(cfg: RossConfig) -> Any:
    from transformers import AutoTokenizer

    from gfcr.models import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model(cfg.tokenizer or cfg.upstream_model))


def load_model(name_or_path: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    from gfcr.models import resolve_model

    return AutoModelForCausalLM.from_pretrained(resolve_model(name_or_path), dtype=torch.float32)


def make_configured_judge(cfg: RossConfig) -> Any:
    from gfcr.ross.judges import make_judge

    j = cfg.judge
    if j.name != "llm":
        return make_judge(j.name)
    key = os.environ.get(j.api_key_env) if j.api_key_env else None
    if j.api_key_env and not key:
        raise ValueError(f"judge.api_key_env names {j.api_key_env!r}, which is not set in the environment")
    return make_judge("llm", base_url=j.base_url, model=j.model, api_key=key, mode=j.mode, version=j.version,
                      cache_dir=j.cache_dir)


def stage_select(cfg: RossConfig, store: Any) -> list[Any]:
    """Verified-successful, deduplicated rollouts of the configured window."""
    from gfcr.ross.audit import select_rollouts

    w = cfg.window
    reverify = None
    if w.reverify:
        from gfcr.evaluate import resolve_verifier

        fn = resolve_verifier(w.reverify)

        def reverify(r: Any, p: Any) -> bool:
            return p is not None and fn(p, r.completion)

    return select_rollouts(store, run=w.run, steps=w.steps, task=w.task, reverify=reverify, dedup=w.dedup, limit=w.limit)


def stage_audit(cfg: RossConfig, store: Any, rollouts: list[Any], tokenizer: Any, progress: bool = False) -> dict[str, Any]:
    """Audit with the configured judge (and ``keep-all`` when positive-rollout SFT is a variant)."""
    from gfcr.ross.audit import audit_rollouts
    from gfcr.ross.judges import KeepAll

    j = cfg.judge
    judges = [make_configured_judge(cfg)]
    if "positive_sft" in cfg.variants and j.name != "keep-all":
        judges.append(KeepAll())
    out = {}
    for judge in judges:
        s = audit_rollouts(store, rollouts, judge, tokenizer, retries=j.retries, concurrency=j.concurrency,
                           max_unit_chars=j.max_unit_chars, check_answer=j.check_answer, progress=progress)
        out[judge.name] = s.to_dict()
    return out


def stage_build(cfg: RossConfig, store: Any, run_dir: Path) -> dict[str, Any]:
    """One dataset per distinct variant dataset under ``run_dir/data``."""
    from gfcr.ross.build import build_dataset

    judge = make_configured_judge(cfg)
    out = {}
    for v in cfg.variants:
        if v == "ross_from_base":
            continue  # trains on the ross dataset
        which, no_mask = DATASET_OF[v]
        name, version = ("keep-all", None) if which == "keep-all" else (judge.name, judge.version)
        res = build_dataset(store, run_dir / "data" / v, name, version, no_mask=no_mask, max_length=cfg.build.max_length)
        out[v] = res.to_dict()
    return out


def stage_train(cfg: RossConfig, run_dir: Path, tokenizer: Any, progress: bool = False) -> dict[str, Any]:
    """Masked SFT of each variant into ``run_dir/models/<variant>``."""
    from gfcr.ross.build import load_dataset_rows
    from gfcr.ross.sft import train_masked_sft

    out = {}
    t = cfg.train
    for v in cfg.variants:
        data = run_dir / "data" / ("ross" if v == "ross_from_base" else v)
        if not data.exists():
            raise FileNotFoundError(f"{data} missing: run the build stage first")
        rows = load_dataset_rows(data)
        init = cfg.base_model if v == "ross_from_base" else cfg.upstream_model
        model = load_model(init)
        res = train_masked_sft(model, rows, tokenizer.pad_token_id, epochs=t.epochs, lr=t.lr, batch_size=t.batch_size,
                               grad_clip=t.grad_clip, seed=t.seed, out_dir=run_dir / "models" / v, tokenizer=tokenizer,
                               progress=progress, packing=t.packing, max_tokens_per_row=t.max_tokens_per_row)
        out[v] = {**res.to_dict(), "init": init}
    return out


def heldout_prompts(cfg: RossConfig, store: Any) -> list[Any]:
    e = cfg.evaluate
    if e.source == "arith":
        from gfcr.tasks.arith import make_arith

        src = make_arith(n=e.n_prompts, level=e.arith_level, digits=e.arith_digits, split=e.split, seed=e.seed)
        return src.prompts()[: e.n_prompts]
    ps = sorted(store.prompts(split=e.split, task=cfg.window.task), key=lambda p: p.prompt_id)
    if not ps:
        raise ValueError(f"the store has no prompts of split {e.split!r}; set evaluate.source: arith or add them")
    return ps[: e.n_prompts]


def model_paths(cfg: RossConfig, run_dir: Path) -> dict[str, str]:
    """Row name → checkpoint, in the table's order."""
    rows: dict[str, str] = {}
    if cfg.base_model:
        rows["base"] = cfg.base_model
    rows["upstream"] = cfg.upstream_model
    if cfg.continued_rl_model:
        rows["continued_rl"] = cfg.continued_rl_model
    for v in cfg.variants:
        rows[v] = str(run_dir / "models" / v)
    return rows


def stage_evaluate(cfg: RossConfig, store: Any, run_dir: Path, tokenizer: Any) -> dict[str, Any]:
    from gfcr.ross.analyze import evaluate_models

    e = cfg.evaluate
    prompts = heldout_prompts(cfg, store)
    res = evaluate_models(model_paths(cfg, run_dir), tokenizer, prompts, k=e.k, ks=e.ks, max_tokens=e.max_tokens, verifier=e.verifier,
                          seed=e.seed, greedy=e.greedy)
    (run_dir / "eval.json").write_text(json.dumps(res, indent=2))
    return res


def stage_analyze(cfg: RossConfig, store: Any, run_dir: Path, tokenizer: Any) -> dict[str, Any]:
    from gfcr.ross.analyze import (
        categories_early_late,
        compatibility,
        complementarity,
        solved_prompt_ids,
        ter_by_window,
    )

    a, w = cfg.analyze, cfg.window
    judge = make_configured_judge(cfg)
    out: dict[str, Any] = {"ter_by_window": ter_by_window(store, judge.name, a.ter_window, judge.version)}
    steps = [r["steps"] for r in out["ter_by_window"]]
    if steps:
        lo, hi = steps[0][0], steps[-1][1]
        q = max((hi - lo + 1) // 4, 1)
        early, late = a.early or (lo, lo + q - 1), a.late or (hi - q + 1, hi)
        out["categories"] = categories_early_late(store, judge.name, early, late, judge.version)
    current = load_model(cfg.upstream_model)
    solved = solved_prompt_ids(store, w.run, w.steps, w.task)
    prompts = {p.prompt_id: p for p in store.prompts(ids=solved)} if solved else {}
    if a.compatibility_prompts and prompts:
        from gfcr.ross.audit import select_rollouts

        hist = select_rollouts(store, run=w.run, steps=w.steps, task=w.task)
        seen, hist_one = set(), []
        for r in hist:  # one historical rollout per prompt, earliest first
            if r.prompt_id not in seen and r.prompt_id in prompts and len(seen) < a.compatibility_prompts:
                seen.add(r.prompt_id)
                hist_one.append(r)
        other_path = cfg.other_model or cfg.base_model
        other = load_model(other_path) if other_path else None
        out["compatibility"] = compatibility(current, tokenizer, hist_one, [prompts[r.prompt_id] for r in hist_one],
                                             other=other, max_tokens=a.max_tokens)
    if a.complementarity_prompts and prompts:
        from gfcr.generate.engines.hf import HFEngine

        eng = HFEngine(current, tokenizer=tokenizer, policy_version="upstream")
        ps = [prompts[i] for i in sorted(prompts)][: a.complementarity_prompts]
        out["complementarity"] = complementarity(eng, ps, k=a.complementarity_k,
                                                 ks=[k for k in (1, 8, 32) if k <= a.complementarity_k],
                                                 max_tokens=a.max_tokens, verifier=cfg.evaluate.verifier)
    (run_dir / "analysis.json").write_text(json.dumps(out, indent=2))
    return out


def render_report(run: RossRun) -> str:
    """The comparison table plus the analyses, as Markdown."""
    from gfcr.ross.analyze import comparison_table

    parts = ["## ROSS comparison (held-out, % with 95% bootstrap CIs)", ""]
    if "evaluate" in run.results:
        parts.append(comparison_table(run.results["evaluate"]))
    an = run.results.get("analyze", {})
    if an.get("ter_by_window"):
        parts += ["", "### TER by step window vs policy entropy", "", "| steps | n | TER | entropy |", "|---|---|---|---|"]
        for r in an["ter_by_window"]:
            ent = "—" if r["entropy"] is None else f"{r['entropy']:.3f}"
            parts.append(f"| {r['steps'][0]}–{r['steps'][1]} | {r['n']} | {100 * r['ter']:.1f}% | {ent} |")
    if an.get("categories"):
        parts += ["", "### Exclusion categories (primary per rollout)", ""]
        for k, v in an["categories"].items():
            shares = ", ".join(f"{c} {100 * s:.0f}%" for c, s in v["shares"].items()) or "none"
            parts.append(f"- {k} steps {v['steps'][0]}–{v['steps'][1]} (n={v['n']}): {shares}")
    if an.get("compatibility"):
        c = an["compatibility"]
        parts += ["", "### Compatibility (mean token NLL under upstream)", ""]
        parts += [f"- {k}: {v['mean_nll']:.3f} over {v['tokens']} tokens" for k, v in c.items()]
    if an.get("complementarity"):
        c = an["complementarity"]
        ms = ", ".join(f"{k} {100 * v['value']:.1f}%" for k, v in c["metrics"].items())
        parts += ["", f"### Complementarity ({c['n_prompts']} historically solved prompts)", "",
                  f"- upstream: {ms}; solved in at most half the samples: {c['at_most_half']}"]
    return "\n".join(parts) + "\n"


def run_ross(cfg: RossConfig, run_dir: str | Path | None = None, progress: bool = False,
             log: Any = print) -> RossRun:
    """Run the configured stages in order; returns timings, results and the rendered report."""
    store = open_store(cfg)  # bad inputs fail before a run folder is made
    tok = load_tokenizer(cfg)
    rd = Path(run_dir) if run_dir is not None else new_run_dir(cfg)
    rd.mkdir(parents=True, exist_ok=True)
    run = RossRun(rd)
    selected: list[Any] = []
    for stage in cfg.stages:
        t0 = time.perf_counter()
        if stage == "select":
            selected = stage_select(cfg, store)
            run.results["select"] = {"rollouts": len(selected)}
        elif stage == "audit":
            if not selected and "select" not in cfg.stages:
                selected = stage_select(cfg, store)
            run.results["audit"] = stage_audit(cfg, store, selected, tok, progress)
        elif stage == "build":
            run.results["build"] = stage_build(cfg, store, rd)
        elif stage == "train":
            run.results["train"] = stage_train(cfg, rd, tok, progress)
        elif stage == "evaluate":
            run.results["evaluate"] = stage_evaluate(cfg, store, rd, tok)
        elif stage == "analyze":
            run.results["analyze"] = stage_analyze(cfg, store, rd, tok)
        run.timings[stage] = round(time.perf_counter() - t0, 2)
        log(f"[ross] {stage}: {run.timings[stage]:.1f}s")
    run.table = render_report(run)
    (rd / "results.json").write_text(json.dumps({"timings": run.timings, **run.results}, indent=2, default=str))
    (rd / "table.md").write_text(run.table)
    return run


def run_ross_demo(store: str | Path, upstream_model: str, base_model: str | None = None, out_dir: str | Path = "runs/ross",
                  run: str | None = None, steps: tuple[int, int] | None = None, n_eval: int = 8, k: int = 2,
                  epochs: int = 1, lr: float = 1e-5, max_tokens: int = 48,
                  variants: tuple[str, ...] = ("positive_sft", "ross"), log: Any = print) -> RossRun:
    """The demo's ROSS stage: arith-steps judge on an RL run's rollouts, a short masked SFT per
    variant, base/upstream/variants on held-out one-digit sums; prints and returns the table."""
    cfg = RossConfig(
        store=str(store), out_dir=str(out_dir), upstream_model=upstream_model, base_model=base_model,
        variants=list(variants), window={"run": run, "steps": steps, "task": "arith"},
        train={"epochs": epochs, "lr": lr, "batch_size": 8},
        evaluate={"source": "arith", "n_prompts": n_eval, "k": k, "ks": sorted({1, k}), "max_tokens": max_tokens},
        analyze={"ter_window": 1, "compatibility_prompts": 0, "complementarity_prompts": 0},
    )
    res = run_ross(cfg, log=log)
    log(res.table)
    return res
