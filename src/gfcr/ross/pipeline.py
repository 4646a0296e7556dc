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
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gfcr import config
from gfcr.ross.config import RossConfig
from gfcr.store.provenance import recorded_model

DATASET_OF = {"positive_sft": ("keep-all", False), "ross_nomask": ("judge", True), "ross": ("judge", False),
              "ross_from_base": ("judge", False)}


@dataclass
class RossRun:
    run_dir: Path
    timings: dict[str, float] = field(default_factory=dict)
    results: dict[str, Any] = field(default_factory=dict)
    table: str = ""


def new_run_dir(cfg: RossConfig) -> Path:
    """A fresh folder ``out_dir/ross-YYYYmmdd-HHMMSS[-n]`` (runs never overwrite each other) with
    the resolved config in ``config.json``."""
    d = config.new_run_dir(cfg.out_dir, "ross")
    (d / "config.json").write_text(cfg.model_dump_json(indent=2))
    return d


def open_store(cfg: RossConfig) -> Any:
    from gfcr.store import RolloutStore

    return RolloutStore.open(cfg.store)


def tokenizer_source(cfg: RossConfig, store: Any = None) -> str:
    """Where the tokenizer comes from: ``cfg.tokenizer``; else, given the ``store`` (audit, align:
    no model is needed there), the model its rollouts record when it is a local folder (the
    tokenizer that produced the stored tokens); else ``cfg.upstream_model``."""
    if cfg.tokenizer:
        return cfg.tokenizer
    if store is not None:
        m = recorded_model(store)
        if m and Path(m).is_dir():
            return m
    if cfg.upstream_model:
        return cfg.upstream_model
    raise ValueError("no tokenizer to align the audits with: set tokenizer (or upstream_model) in the config; "
                     "the store records no local model folder")


def need_upstream(cfg: RossConfig, stage: str) -> str:
    """``cfg.upstream_model``, or a one-line error naming the stage that needs it."""
    if not cfg.upstream_model:
        raise ValueError(f"the {stage} stage needs upstream_model (the checkpoint after RL): set it in the config "
                         "or with --set upstream_model=PATH")
    return cfg.upstream_model


def load_tokenizer(cfg: RossConfig, store: Any = None) -> Any:
    """The tokenizer of :func:`tokenizer_source` (``default`` is the default model's)."""
    from transformers import AutoTokenizer

    from gfcr.models import resolve_model

    src = tokenizer_source(cfg, store)
    return AutoTokenizer.from_pretrained(src if Path(src).is_dir() else resolve_model(src))


def load_model(name_or_path: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    from gfcr.models import resolve_model

    return AutoModelForCausalLM.from_pretrained(resolve_model(name_or_path), dtype=torch.float32)


def make_configured_judge(cfg: RossConfig) -> Any:
    from gfcr.ross.judges import make_judge

    j = cfg.judge
    if j.name != "llm" or j.llm is None:
        return make_judge(j.name)
    if j.llm.api_key_env and not os.environ.get(j.llm.api_key_env):
        raise ValueError(f"judge.api_key_env names {j.llm.api_key_env!r}, which is not set in the environment")
    return make_judge("llm", llm=j.llm, mode=j.mode, version=j.version, recheck=j.recheck)


def stage_select(cfg: RossConfig, store: Any) -> list[Any]:
    """Verified-successful, deduplicated rollouts of the configured window. With
    ``window.reverify`` each is verified again with that verifier and its params, the
    rollout as context: a truncated generation fails, the task's stated answer format is read."""
    from gfcr.ross.audit import select_rollouts

    w = cfg.window
    reverify = None
    if w.reverify:
        from gfcr.filters.verifiers import get_verifier, stated_answer_format

        v = get_verifier(w.reverify.name, **w.reverify.params)

        def reverify(r: Any, p: Any) -> bool:
            return p is not None and v.verify(r.completion, answer=p.answer, tests=p.tests, rollout=r,
                                              answer_format=stated_answer_format(p)).passed is True

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
                           max_unit_chars=j.max_unit_chars, check_answer=j.check_answer, progress=progress,
                           eos_rule=j.eos_rule)
        out[judge.name] = s.to_dict()
    return out


def stage_build(cfg: RossConfig, store: Any, run_dir: Path) -> dict[str, Any]:
    """One dataset per distinct variant dataset under ``run_dir/data``. When ROSS w/o mask's rows
    equal positive SFT's (the judge discarded no rollout), it is recorded as ``same_as`` and not
    trained again: the two would be one model reported twice."""
    from gfcr.ross.build import build_dataset, load_dataset_rows

    judge = make_configured_judge(cfg)
    out: dict[str, Any] = {}
    for v in cfg.variants:
        if v == "ross_from_base":
            continue  # trains on the ross dataset
        which, no_mask = DATASET_OF[v]
        name, version = ("keep-all", None) if which == "keep-all" else (judge.name, judge.version)
        res = build_dataset(store, run_dir / "data" / v, name, version, no_mask=no_mask, max_length=cfg.build.max_length)
        out[v] = res.to_dict()
    if "ross_nomask" in out and "positive_sft" in out:
        key = lambda rows: sorted((r["rollout_id"], tuple(r["loss_mask"])) for r in rows)  # noqa: E731
        if key(load_dataset_rows(run_dir / "data" / "ross_nomask")) == key(load_dataset_rows(run_dir / "data" / "positive_sft")):
            out["ross_nomask"]["same_as"] = "positive_sft"
            (run_dir / "data" / "ross_nomask" / "same_as").write_text("positive_sft\n")
    return out


def same_as(run_dir: Path, variant: str) -> str | None:
    """The variant whose dataset this one's equals (written by :func:`stage_build`), else None."""
    f = run_dir / "data" / variant / "same_as"
    return f.read_text().strip() if f.exists() else None


def stage_train(cfg: RossConfig, run_dir: Path, tokenizer: Any, progress: bool = False) -> dict[str, Any]:
    """Masked SFT of each variant into ``run_dir/models/<variant>``."""
    from gfcr.ross.build import load_dataset_rows
    from gfcr.train.sft import train_masked_sft

    out = {}
    t = cfg.train
    for v in cfg.variants:
        if same_as(run_dir, v):
            out[v] = {"same_as": same_as(run_dir, v)}
            continue
        data = run_dir / "data" / ("ross" if v == "ross_from_base" else v)
        if not data.exists():
            raise FileNotFoundError(f"{data} missing: run the build stage first")
        rows = load_dataset_rows(data)
        init = cfg.base_model if v == "ross_from_base" else need_upstream(cfg, "train")
        done, ckpt = run_dir / "models" / v, run_dir / "checkpoints" / v
        if (done / "sft.json").exists():  # written last: this variant finished in an earlier call
            out[v] = {**json.loads((done / "sft.json").read_text()), "init": init, "already_trained": True}
            continue
        if done.exists():  # a save cut short: its state is in the checkpoint
            shutil.rmtree(done)
        model = load_model(init)
        res = train_masked_sft(model, rows, tokenizer.pad_token_id, epochs=t.epochs, lr=t.lr, batch_size=t.batch_size,
                               grad_clip=t.grad_clip, seed=t.seed, out_dir=done, tokenizer=tokenizer,
                               progress=progress, packing=t.packing, max_tokens_per_row=t.max_tokens_per_row,
                               max_pad_fraction=t.max_pad_fraction, checkpoint_dir=ckpt,
                               checkpoint_every=t.checkpoint_every, autocast=t.autocast)
        shutil.rmtree(ckpt, ignore_errors=True)
        out[v] = {**res.to_dict(), "init": init}
    return out


def heldout_benchmarks(cfg: RossConfig, store: Any) -> list[tuple[Any, list[Any]]]:
    """``[(BenchmarkConfig, prompts)]`` of ``cfg.evaluate.benchmarks``."""
    from gfcr.ross.evaluation import benchmark_prompts

    return [(b, benchmark_prompts(b, store, cfg.window.task)) for b in cfg.evaluate.benchmarks]


def model_paths(cfg: RossConfig, run_dir: Path) -> tuple[dict[str, str], dict[str, str]]:
    """``(row name → checkpoint, alias row → row it equals)``, rows in the table's order."""
    rows: dict[str, str] = {}
    aliases: dict[str, str] = {}
    if cfg.base_model:
        rows["base"] = cfg.base_model
    rows["upstream"] = need_upstream(cfg, "evaluate")
    if cfg.continued_rl_model:
        rows["continued_rl"] = cfg.continued_rl_model
    for v in cfg.variants:
        if same_as(run_dir, v):
            aliases[v] = same_as(run_dir, v)
        else:
            rows[v] = str(run_dir / "models" / v)
    return rows, aliases


def stage_evaluate(cfg: RossConfig, store: Any, run_dir: Path, tokenizer: Any, log: Any = None) -> dict[str, Any]:
    """Every model row on every benchmark, then the paired comparisons (``eval.json``)."""
    from gfcr.ross.evaluation import all_comparisons, default_pairs, evaluate_models

    e = cfg.evaluate
    rows, aliases = model_paths(cfg, run_dir)
    partial = run_dir / "eval.partial.json"
    on_gen = None
    if e.save_generations:
        gens = run_dir / "generations.jsonl"
        gens.write_text("")

        def on_gen(row: dict[str, Any]) -> None:
            with open(gens, "a") as fh:
                fh.write(json.dumps(row) + "\n")

    results = evaluate_models(rows, tokenizer, heldout_benchmarks(cfg, store), e, load=load_model, log=log,
                              on_result=lambda r: partial.write_text(json.dumps(r)), on_generation=on_gen)
    pairs = [tuple(p) for p in e.pairs] if e.pairs is not None else default_pairs(list(rows))
    pairs = [(aliases.get(a, a), aliases.get(b, b)) for a, b in pairs]
    out = {"results": results, "aliases": aliases, "pairs": pairs,
           "paired": all_comparisons(results, pairs, seed=e.seed)}
    (run_dir / "eval.json").write_text(json.dumps(out, indent=2))
    return out


def _teacher_texts(path: str | None) -> dict[str, str]:
    if not path:
        return {}
    out = {}
    with open(path, encoding="utf-8") as fh:
        for ln, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                out[str(obj["prompt_id"])] = str(obj["text"])
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{ln}: expected a JSON object with prompt_id and text ({e})") from e
    return out


def stage_analyze(cfg: RossConfig, store: Any, run_dir: Path, tokenizer: Any) -> dict[str, Any]:
    """TER per step (token-pooled, moving average) and per window, categories early vs late per
    domain, compatibility, complementarity on the hardest solved prompts (``analysis.json``)."""
    from gfcr.ross.analyze import (
        categories_early_late,
        compatibility,
        ter_by_step,
        ter_by_window,
    )
    from gfcr.ross.evaluation import make_verify_fn

    a, w, e = cfg.analyze, cfg.window, cfg.evaluate
    judge = make_configured_judge(cfg)
    flt = dict(run=w.run, task=w.task, steps=w.steps)
    out: dict[str, Any] = {"ter_by_step": ter_by_step(store, judge.name, judge.version, ma=a.ter_ma, **flt),
                           "ter_by_window": ter_by_window(store, judge.name, a.ter_window, judge.version, **flt)}
    steps = [r["step"] for r in out["ter_by_step"]]
    if steps:
        lo, hi = steps[0], steps[-1]
        q = max((hi - lo + 1) // 4, 1)
        early, late = a.early or (lo, lo + q - 1), a.late or (hi - q + 1, hi)
        out["categories"] = categories_early_late(store, judge.name, early, late, judge.version, run=w.run,
                                                  domains=a.domains)
    verify = make_verify_fn(e.verifier.name, e.verifier.params)
    need_model = a.compatibility_prompts or a.complementarity_prompts
    current = load_model(need_upstream(cfg, "analyze")) if need_model else None
    if a.compatibility_prompts:
        from gfcr.ross.audit import select_rollouts

        hist = select_rollouts(store, run=w.run, steps=w.steps, task=w.task)
        seen, hist_one = set(), []
        for r in hist:  # one historical rollout per prompt, earliest first
            if r.prompt_id not in seen and len(seen) < a.compatibility_prompts:
                seen.add(r.prompt_id)
                hist_one.append(r)
        prompts = {p.prompt_id: p for p in store.prompts(ids=sorted(seen))} if seen else {}
        hist_one = [r for r in hist_one if r.prompt_id in prompts]
        if hist_one:
            other_path = cfg.other_model or cfg.base_model
            other = load_model(other_path) if other_path else None
            out["compatibility"] = compatibility(
                current, tokenizer, hist_one, [prompts[r.prompt_id] for r in hist_one], other=other,
                max_tokens=a.max_tokens, temperature=e.temperature, tries=a.compatibility_tries,
                verify=verify if a.compatibility_filter else None, teacher_texts=_teacher_texts(a.teacher_jsonl))
    if a.complementarity_prompts:
        res = complementarity_of(cfg, store, current, tokenizer, "upstream")
        if res is not None:
            out["complementarity"] = res
    (run_dir / "analysis.json").write_text(json.dumps(out, indent=2))
    return out


def complementarity_of(cfg: RossConfig, store: Any, model: Any, tokenizer: Any,
                       policy_version: str = "upstream") -> dict[str, Any] | None:
    """``model``'s :func:`gfcr.ross.analyze.complementarity` on the ``analyze.complementarity_prompts``
    hardest prompts the window's history solved (``historical_rates`` added, hardest first); None when
    history solved none. ``model``: a loaded model (the upstream one in :func:`stage_analyze`)."""
    from gfcr.generate.engines.hf import HFEngine
    from gfcr.ross.analyze import complementarity, hardest_solved_prompts
    from gfcr.ross.evaluation import make_verify_fn

    a, w, e = cfg.analyze, cfg.window, cfg.evaluate
    hard = hardest_solved_prompts(store, a.complementarity_prompts, w.run, w.steps, w.task)
    ps = {p.prompt_id: p for p in store.prompts(ids=[h["prompt_id"] for h in hard])} if hard else {}
    if not ps:
        return None
    eng = HFEngine(model, tokenizer=tokenizer, policy_version=policy_version)
    res = complementarity(eng, [ps[h["prompt_id"]] for h in hard if h["prompt_id"] in ps],
                          k=a.complementarity_k, ks=[k for k in (1, 8, 32) if k <= a.complementarity_k],
                          max_tokens=a.max_tokens, verifier=make_verify_fn(e.verifier.name, e.verifier.params),
                          temperature=e.temperature)
    return {**res, "historical_rates": [h["rate"] for h in hard]}


def identical_supervision(build: dict) -> list[str]:
    """The ROSS variants whose build supervised exactly what positive SFT did (the judge excluded
    nothing): same rows, and as many supervised tokens as positive SFT, which supervises every
    generated token. Their models then equal positive SFT's, and a comparison with it is empty.

    >>> identical_supervision({"positive_sft": {"rows": 6, "supervised_tokens": 85},
    ...                        "ross": {"rows": 6, "supervised_tokens": 85}})
    ['ross']
    >>> identical_supervision({"positive_sft": {"rows": 6, "supervised_tokens": 85},
    ...                        "ross": {"rows": 6, "supervised_tokens": 70}})
    []
    """
    pos = build.get("positive_sft")
    if not isinstance(pos, dict):
        return []
    return [k for k, v in build.items() if k != "positive_sft" and k.startswith("ross") and isinstance(v, dict)
            and v.get("rows") == pos.get("rows") and v.get("supervised_tokens") == pos.get("supervised_tokens")]


def render_report(run: RossRun) -> str:
    """The comparison table (with paired tests) plus the analyses, as Markdown."""
    from gfcr.ross.evaluation import comparison_table

    parts = ["## ROSS comparison (held-out, % with 95% bootstrap CIs over prompts)", ""]
    if "evaluate" in run.results:
        parts.append(comparison_table(run.results["evaluate"]))
    same = identical_supervision(run.results.get("build", {}))
    if same:
        parts += ["", f"Note: {' and '.join(same)} supervised exactly the rows and tokens positive_sft did (the judge "
                      "dropped and masked nothing), so they trained the same model: their comparison with it is "
                      "empty, not a result about the mask."]
    an = run.results.get("analyze", {})
    if an.get("ter_by_step"):
        parts += ["", "### TER per step (token-pooled) and its moving average vs policy entropy", "",
                  "| step | kept rollouts | TER | TER (moving avg) | entropy |", "|---|---|---|---|---|"]
        for r in an["ter_by_step"]:
            ent = "—" if r["entropy"] is None else f"{r['entropy']:.3f}"
            ter = "—" if r["ter"] is None else f"{100 * r['ter']:.1f}%"
            ma = "—" if r["ter_ma"] is None else f"{100 * r['ter_ma']:.1f}%"
            parts.append(f"| {r['step']} | {r['n']} | {ter} | {ma} | {ent} |")
    if an.get("categories"):
        parts += ["", "### Exclusion categories (primary per rollout, the paper's taxonomy: abandoned attempts count as "
                  "redundant exploration), early vs late, per domain", ""]
        for dom, d in an["categories"].items():
            for k, v in d.items():
                shares = ", ".join(f"{c} {100 * s:.0f}%" for c, s in v["shares"].items()) or "none"
                parts.append(f"- {dom}, {k} steps {v['steps'][0]}–{v['steps'][1]} (n={v['n']}): {shares}")
    if an.get("compatibility"):
        c = an["compatibility"]
        parts += ["", f"### Compatibility (mean token NLL under upstream; samples at T={c['temperature']}, "
                      f"{'correct only' if c['filtered_for_correctness'] else 'unfiltered'})", ""]
        for k in ("historical", "current", "other", "teacher"):
            if k in c and c[k]["mean_nll"] is not None:
                parts.append(f"- {k}: {c[k]['mean_nll']:.3f} over {c[k]['tokens']} tokens ({c[k]['rows']} prompts)")
        parts.append(f"- on the {c['common']['prompts']} prompts every source covers: "
                     + ", ".join(f"{k} {v:.3f}" for k, v in c["common"].items() if k != "prompts"))
    if an.get("complementarity"):
        c = an["complementarity"]
        ms = ", ".join(f"{k} {100 * v['value']:.1f}%" for k, v in c["metrics"].items())
        parts += ["", f"### Complementarity (the {c['n_prompts']} hardest historically solved prompts)", "",
                  f"- upstream at T={c['temperature']}: {ms}; solved in at most half the samples: {c['at_most_half']}"]
    return "\n".join(parts) + "\n"


def run_ross(cfg: RossConfig, run_dir: str | Path | None = None, progress: bool = False,
             log: Any = print) -> RossRun:
    """Run the configured stages in order; returns timings, results and the rendered report."""
    store = open_store(cfg)  # bad inputs fail before a run folder is made
    model_stages = [s for s in cfg.stages if s in ("train", "evaluate", "analyze")]
    if model_stages:
        need_upstream(cfg, model_stages[0])
    tok = load_tokenizer(cfg, None if model_stages else store)  # select + audit alone need no model
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
            run.results["evaluate"] = stage_evaluate(cfg, store, rd, tok, log=log)
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
                  variants: tuple[str, ...] = ("positive_sft", "ross"), task: str = "arith",
                  benchmarks: list[dict[str, Any]] | None = None, verifier_params: dict[str, Any] | None = None,
                  log: Any = print) -> RossRun:
    """The demo's ROSS stage: the ``arith-steps`` judge on an RL run's rollouts of ``task``, a short
    masked SFT per variant, base/upstream/variants on held-out prompts (``benchmarks``; default the
    task source ``task`` at ``n_eval`` test prompts; ``verifier_params`` as the RL run's verifier), paired
    comparisons; prints and returns the table. A run with no verified, complete rollout of the task is
    skipped with a message (nothing to relearn)."""
    cfg = RossConfig(
        store=str(store), out_dir=str(out_dir), upstream_model=upstream_model, base_model=base_model,
        variants=list(variants), window={"run": run, "steps": steps, "task": task},
        train={"epochs": epochs, "lr": lr, "batch_size": 8},
        evaluate={"benchmarks": benchmarks or [{"name": task, "source": task, "n_prompts": n_eval}],
                  "k": k, "ks": sorted({1, k}), "max_tokens": max_tokens,
                  "verifier": {"name": "numeric", "params": verifier_params or {}}},
        analyze={"ter_window": 1, "compatibility_prompts": 0, "complementarity_prompts": 0},
    )
    n = len(stage_select(cfg, open_store(cfg)))
    if n == 0:  # nothing verified to relearn (e.g. no 'Answer: N' line, or every success truncated)
        msg = f"ROSS skipped: the run stored no verified, complete rollout of task {task!r} to relearn"
        log(msg)
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "table.md").write_text(msg + "\n")
        return RossRun(Path(out_dir), results={"skipped": msg}, table=msg + "\n")
    res = run_ross(cfg, log=log)
    log(res.table)
    return res
