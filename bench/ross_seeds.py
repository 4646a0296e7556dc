"""ROSS study rows pooled over SFT seeds (not a test): paired per prompt, Holm over the pairs.

    python bench/ross_seeds.py STATE_SEED0 STATE_SEED1 [--bench arith-2d] [--sampled] [--out report.md]

Each ``STATE`` is a ``bench/ross_study.py`` state whose rows were evaluated on the same held-out
prompts (``STATE/ross/rows/<row>.json``, written by the study). A row trained once per state (ROSS,
ROSS w/o mask, positive SFT) is one sample per seed; a row shared by the states (base, upstream)
is read from each state that has it. Per prompt, a row's score is the share of its seeds whose
greedy answer verified; a pair of rows is compared by the exact sign test on the per-prompt
differences of those shares (a paired test over prompts: seeds are averaged inside a prompt, so
the prompts stay the independent units), Holm over the pairs. Each seed's own McNemar test is
printed beside it.

The false-claim share (a held-out greedy generation stating a result that recomputes to another
value, :func:`gfcr.ross.claims.find_claims`) is pooled the same way from
``STATE/ross/rows/<row>.generations.jsonl``, and so is the share holding a **corrected mistake** (a
false claim a later line fixes, :func:`gfcr.ross.claims.corrected_mistakes`: the mechanism testbed's
imitation measure), and the share holding one of the testbed's planted doubt phrases (:data:`DOUBT`);
with ``--sampled`` these three are measured on the sampled generations too (per prompt, the share of
its samples). So is **imitation of what the judge excludes**: the
``arith-steps`` judge (the study's) run on each row's *verified* greedy held-out generations, per
prompt the share of its characters the judge would exclude (0 where nothing is excluded), with the
exclusion categories counted: how much of what ROSS's mask cut from training each model still writes.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from greso_study import read_jsonl, sign_test  # noqa: E402

PAIRS = (("ross", "positive_sft"), ("ross", "ross_nomask"), ("ross_nomask", "positive_sft"), ("ross", "upstream"),
         ("ross", "continued_rl"))  # a pair is tested where the states hold both rows


def greedy_by_prompt(state: Path, bench: str) -> dict[str, dict[str, bool]]:
    """``{row: {prompt_id: greedy verified}}`` of one study state on benchmark ``bench``."""
    out = {}
    for f in sorted((state / "ross" / "rows").glob("*.json")):
        res = json.loads(f.read_text()).get(bench)
        if res is not None:
            out[f.stem] = {p["prompt_id"]: bool(p["greedy_correct"]) for p in res["per_prompt"]}
    return out


#: the doubt phrases the mechanism testbed's worked solutions plant (gfcr.tasks.chains): "Wait, that's
#: wrong.", "Oops, forgot the carry: …", "Wait, I forgot the borrow."
DOUBT = re.compile(r"\b(?:wait|oops|forgot the (?:carry|borrow))\b", re.I)


MEASURES = ("false_claim", "corrected", "doubt")


def flags(text: str) -> dict[str, bool]:
    """Each of :data:`MEASURES` in ``text`` (its claims parsed once): ``false_claim``, a stated result
    that recomputes to another value (``ross_study.has_false_claim``'s test); ``corrected``, a false
    claim a later line fixes (:func:`gfcr.ross.claims.corrected_mistakes`, what ROSS's mask excludes
    from a success); ``doubt``, a planted doubt phrase (:data:`DOUBT`)."""
    from gfcr.ross.claims import corrected_mistakes, find_claims

    cs = find_claims(text)
    return {"false_claim": any(not c.correct for c in cs), "corrected": corrected_mistakes(text, cs) > 0,
            "doubt": DOUBT.search(text) is not None}


def measures_by_prompt(state: Path, bench: str, sampled: bool = False) -> dict[str, dict[str, dict[str, float]]]:
    """``{"<measure> (greedy)": {row: {prompt_id: value}}, …}`` of one study state, each row's
    generations file read once: per :data:`MEASURES` item, whether the greedy generation holds it
    (:func:`flags`), and with ``sampled`` also ``"<measure> (sampled)"``, the share of the prompt's
    sampled generations that do. A row with no generation of a kind is left out of that kind."""
    kinds = ["greedy"] + (["sampled"] if sampled else [])
    out: dict[str, dict[str, dict[str, float]]] = {f"{m} ({k})": {} for m in MEASURES for k in kinds}
    for f in sorted((state / "ross" / "rows").glob("*.generations.jsonl")):
        row = f.name.removesuffix(".generations.jsonl")
        for g in read_jsonl(f):
            kind = "greedy" if g["greedy"] else "sampled"
            if g["benchmark"] != bench or not g["texts"] or kind not in kinds:
                continue
            fl = [flags(t) for t in g["texts"]]
            for m in MEASURES:
                out[f"{m} ({kind})"].setdefault(row, {})[g["prompt_id"]] = float(np.mean([x[m] for x in fl]))
    return out


def imitation_by_prompt(state: Path, bench: str, verified: dict[str, dict[str, bool]] | None = None
                        ) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, int]]]:
    """``({row: {prompt_id: excluded char share}}, {row: {category: spans}})`` over each row's
    verified greedy generations on ``bench`` (``verified``: :func:`greedy_by_prompt`'s, read when not
    given), judged by ``arith-steps`` against the prompt's answer."""
    from gfcr.ross import pipeline as P
    from gfcr.ross.config import load_config
    from gfcr.ross.judges import ArithSteps, JudgeRequest
    from gfcr.ross.units import split_units
    from gfcr.ross.verdict import VerdictError, validate_verdict

    cfg = load_config(state / "ross.yaml")
    answers = {p.prompt_id: p.answer for b, ps in P.heldout_benchmarks(cfg, P.open_store(cfg)) if b.name == bench
               for p in ps}
    verified = greedy_by_prompt(state, bench) if verified is None else verified
    share: dict[str, dict[str, float]] = {}
    cats: dict[str, dict[str, int]] = {}
    judge = ArithSteps()
    for f in sorted((state / "ross" / "rows").glob("*.generations.jsonl")):
        row = f.name.removesuffix(".generations.jsonl")
        share[row], cats[row] = {}, {}
        for g in read_jsonl(f):
            pid, text = g["prompt_id"], g["texts"][0]
            if not (g["greedy"] and g["benchmark"] == bench and verified.get(row, {}).get(pid)) or not text.strip():
                continue
            units = split_units(text)
            req = JudgeRequest(pid, "arith", "", text, units, "select-keep", answer=answers[pid])
            try:
                d = validate_verdict(judge.verdict(req), text, units, "select-keep", answer=answers[pid])
            except VerdictError:
                continue
            if d.status != "kept":
                share[row][pid] = 1.0
                cats[row]["discarded"] = cats[row].get("discarded", 0) + 1
                continue
            share[row][pid] = float((~d.kept_chars).sum()) / len(text)
            for sp in d.excluded:
                cats[row][sp.category] = cats[row].get(sp.category, 0) + 1
    return share, cats


def audit_summary(state: Path, judge: str = "arith-steps") -> dict[str, Any]:
    """The study store's audits by ``judge``'s newest version: kept, spans per category, excluded spans
    holding the verified answer, and kept rollouts whose kept text ends on the answer (the
    after-answer eos rule then supervises the stop)."""
    from gfcr.ross.audit import judge_request, load_kept
    from gfcr.ross.verdict import answer_positions
    from gfcr.store import RolloutStore

    store = RolloutStore.open(state / "upstream" / "store")
    versions = sorted({str(v) for v in store.audits(judge=judge).column("judge_version").to_pylist()}, key=int)
    aus, rmap = load_kept(store, judge, versions[-1])
    cats: dict[str, int] = {}
    with_answer = ends = 0
    for a in aus:
        req, _ = judge_request(rmap[a.rollout_id], None, "select-keep")
        pos = answer_positions(req.text, req.answer) if req.answer else []
        for sp in a.excluded:
            cats[sp.category] = cats.get(sp.category, 0) + 1
            with_answer += any(sp.start <= x and y <= sp.end for x, y in pos)
        ends += bool(a.meta.get("eos_supervised"))
    return {"judge_version": versions[-1], "kept": len(aus), "with_exclusion": sum(bool(a.excluded) for a in aus),
            "spans": cats, "spans_with_answer": with_answer, "kept_ending_on_answer": ends}


def pooled(per_seed: list[dict[str, dict[str, bool]]]) -> dict[str, dict[str, float]]:
    """Per row and prompt, the mean over the seeds that have the row.

    >>> pooled([{"a": {"p": True}}, {"a": {"p": False}, "b": {"p": True}}])
    {'a': {'p': 0.5}, 'b': {'p': 1.0}}
    """
    rows: dict[str, dict[str, list[float]]] = {}
    for seed in per_seed:
        for row, per in seed.items():
            for pid, v in per.items():
                rows.setdefault(row, {}).setdefault(pid, []).append(float(v))
    return {row: {pid: float(np.mean(v)) for pid, v in per.items()} for row, per in rows.items()}


def compare(scores: dict[str, dict[str, float]], a: str, b: str) -> dict[str, Any]:
    """Sign test on the per-prompt differences ``a - b`` over the prompts both rows have.

    >>> compare({"a": {"p": 1.0, "q": 0.5}, "b": {"p": 0.5, "q": 0.5}}, "a", "b")["a_better"]
    1
    """
    keys = sorted(set(scores[a]) & set(scores[b]))
    d = np.array([scores[a][k] - scores[b][k] for k in keys])
    lo, hi, p = sign_test(d)
    return {"a": a, "b": b, "n": len(keys), "diff": float(d.mean()) if len(d) else float("nan"),
            "a_better": hi, "b_better": lo, "p": p}


def report(states: list[Path], bench: str, sampled: bool = False) -> str:
    from gfcr.ross.evaluation import holm

    acc = [greedy_by_prompt(s, bench) for s in states]
    per_state = [measures_by_prompt(s, bench, sampled) for s in states]
    measures = {name: [x[name] for x in per_state] for name in per_state[0]}
    cl = measures["false_claim (greedy)"]
    im = [imitation_by_prompt(s, bench, a) for s, a in zip(states, acc, strict=True)]
    P, C, M = pooled(acc), pooled(cl), pooled([i[0] for i in im])  # the rows' tables; pairs pool per pair
    names = [r for r in ("base", "upstream", "continued_rl", "positive_sft", "ross_nomask", "ross", "ross_from_base") if r in P]
    au = audit_summary(states[0])
    lines = [f"Audit of the study store ({states[0].name}): `arith-steps` v{au['judge_version']}, {au['kept']} kept, "
             f"{au['with_exclusion']} with an exclusion; spans " + ", ".join(f"{k} {n}" for k, n in sorted(au["spans"].items()))
             + f"; {au['spans_with_answer']} excluded spans hold the verified answer; {au['kept_ending_on_answer']} "
             "kept rollouts end on the answer (eos supervised).", "",
             f"Benchmark `{bench}`, greedy, {len(states)} state(s): " + ", ".join(s.name for s in states), "",
             "| row | pass@1 per seed | pooled pass@1 | false claims per seed | pooled false claims |",
             "|---|---|---|---|---|"]

    def cells(per_seed: list[dict[str, dict[str, bool]]], pool: dict[str, dict[str, float]], r: str) -> str:
        if r not in pool:
            return "— | —"
        per = " / ".join(f"{100 * np.mean(list(x[r].values())):.1f}%" for x in per_seed if r in x)
        return f"{per} | {100 * np.mean(list(pool[r].values())):.1f}%"

    for r in names:
        lines.append(f"| {r} | {cells(acc, P, r)} | {cells(cl, C, r)} |")
    lines += ["", "What the judge would exclude from each row's verified greedy generations (pooled over seeds; "
              "spans per category summed over seeds):", "",
              "| row | verified generations | with an exclusion | excluded chars (mean share) | spans by category |",
              "|---|---|---|---|---|"]
    for r in names:
        if r not in M:
            continue
        v = list(M[r].values())
        spans: dict[str, int] = {}
        for _, c in im:
            for k, n in c.get(r, {}).items():
                spans[k] = spans.get(k, 0) + n
        lines.append(f"| {r} | {sum(len(i[0].get(r, {})) for i in im)} | {100 * np.mean([x > 0 for x in v]):.1f}% | "
                     f"{100 * np.mean(v):.1f}% | " + ", ".join(f"{k} {n}" for k, n in sorted(spans.items())) + " |")
    lines += ["", "Share of generations holding each measure (pooled over seeds; a sampled prompt counts the share "
              "of its samples):", "", "| row | " + " | ".join(measures) + " |", "|---|" + "---|" * len(measures)]
    for r in names:
        lines.append(f"| {r} | " + " | ".join(f"{100 * np.mean(list(pooled(v)[r].values())):.1f}%"
                                               if r in pooled(v) else "—" for v in measures.values()) + " |")
    for what, per_seed in (("pass@1", acc), *((m, v) for m, v in measures.items() if m != "false_claim (greedy)"),
                           ("false claims", cl),
                           ("excluded-char share of verified generations", [i[0] for i in im])):
        # a pair is pooled over the seeds that hold both rows (a row trained at one seed only is not
        # set against the other row's mean over more seeds)
        tests = []
        for a, b in PAIRS:
            both = [{a: x[a], b: x[b]} for x in per_seed if a in x and b in x]
            if both:
                tests.append(compare(pooled(both), a, b))
        for t, h in zip(tests, holm([t["p"] for t in tests]), strict=True):
            t["holm"] = h
        lines += ["", f"Paired per prompt, {what} (pooled over seeds; Holm over these {len(tests)} pairs):", "",
                  "| A − B | n | diff | A higher / B higher | p | p (Holm) | per seed (A / B higher, p) |",
                  "|---|---|---|---|---|---|---|"]
        for t in tests:
            seeds = []
            for s in per_seed:
                if t["a"] in s and t["b"] in s:
                    u = compare(pooled([{t["a"]: s[t["a"]], t["b"]: s[t["b"]]}]), t["a"], t["b"])
                    seeds.append(f"{u['a_better']} / {u['b_better']}, {u['p']:.2g}")
            lines.append(f"| {t['a']} − {t['b']} | {t['n']} | {100 * t['diff']:+.1f} points | {t['a_better']} / "
                         f"{t['b_better']} | {t['p']:.2g} | {t['holm']:.2g} | {'; '.join(seeds)} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("states", nargs="+", help="bench/ross_study.py state folders, one per SFT seed")
    ap.add_argument("--bench", default="arith-2d")
    ap.add_argument("--out", default=None, help="also write the report here")
    ap.add_argument("--sampled", action="store_true",
                    help="also measure the sampled generations (false claims, corrected mistakes, doubt phrases)")
    args = ap.parse_args()
    text = report([Path(s).expanduser() for s in args.states], args.bench, args.sampled)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
