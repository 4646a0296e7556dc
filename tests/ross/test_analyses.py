"""The analyses in the paper's shapes, on hand-built audits: token-pooled TER per step with its
moving average and filters, categories per domain, hardest solved prompts, teacher rows, and the
correctness filter of compatibility samples."""

from __future__ import annotations

import numpy as np
import pytest

from gfcr.records import Audit, Span
from gfcr.ross.analyze import (
    categories_early_late,
    hardest_solved_prompts,
    moving_average,
    sample_rows,
    teacher_rows,
    ter_by_step,
    ter_by_window,
)

from .conftest import make_prompt, make_rollout


def _store(tmp_path, tok):
    """Rollouts with known generated lengths; audits supervising a known number of tokens."""
    from gfcr.store import RolloutStore

    store = RolloutStore.open(tmp_path / "store", create=True)
    # (step, task, run, text, supervised tokens, exclusion category)
    spec = [(0, "arith", "a", "1 + 1 = 2.\nAnswer: 2", 2, "corrected_mistake"),
            (0, "arith", "a", "2 + 2 = 4. Long text here to have more tokens.\nAnswer: 4", None, None),
            (1, "arith", "a", "3 + 3 = 6.\nAnswer: 6", 3, "redundant_exploration"),
            (1, "tool:calc", "a", "4 + 4 = 8.\nAnswer: 8", 1, "abandoned_attempt"),
            (2, "arith", "b", "5 + 5 = 10.\nAnswer: 10", 4, "corrected_mistake")]
    rs, aus = [], []
    for i, (step, task, run, text, sup, cat) in enumerate(spec):
        r = make_rollout(tok, f"q{i}", text, gold="x", step=step, run_id=run, prompt_id=f"p{i}")
        r.task = task
        rs.append(r)
        gen = np.flatnonzero(r.token_role == 1)
        mask = np.zeros(len(r.token_ids), np.uint8)
        k = len(gen) if sup is None else sup
        mask[gen[:k]] = 1
        exc = [] if cat is None else [Span(0, 3, cat, 1, None)]
        aus.append(Audit(rollout_id=r.rollout_id, judge="j", judge_version="1", status="kept", mask=mask,
                         excluded=exc, ter=1 - k / len(gen), meta={"step": step, "task": task}))
    store.append(rs)
    store.upsert_audits(aus)
    return store, rs


def test_moving_average_hand_worked():
    assert moving_average([1, 2, 3, 4], 2) == [1.0, 1.5, 2.5, 3.5]
    assert moving_average([None, 2, None, 4], 8) == [None, 2.0, 2.0, 3.0]


def test_ter_is_token_pooled_per_step_with_filters(tmp_path, tok):
    store, rs = _store(tmp_path, tok)
    gen = [r.n_generated for r in rs]
    rows = ter_by_step(store, "j", ma=2)
    assert [r["step"] for r in rows] == [0, 1, 2]
    # step 0: excluded (gen0 - 2) + 0 over gen0 + gen1: pooled, not the mean of the two ratios
    pooled0 = (gen[0] - 2) / (gen[0] + gen[1])
    assert rows[0]["ter"] == pytest.approx(pooled0)
    assert rows[0]["ter_rollout_mean"] == pytest.approx(((gen[0] - 2) / gen[0] + 0) / 2)
    assert rows[0]["ter"] != pytest.approx(rows[0]["ter_rollout_mean"])
    step1 = (gen[2] - 3 + gen[3] - 1) / (gen[2] + gen[3])
    assert rows[1]["ter"] == pytest.approx(step1) and rows[1]["ter_ma"] == pytest.approx((pooled0 + step1) / 2)
    # filters: task, run, step window
    assert [r["n"] for r in ter_by_step(store, "j", task="arith")] == [2, 1, 1]
    assert [r["step"] for r in ter_by_step(store, "j", run="b")] == [2]
    assert [r["step"] for r in ter_by_step(store, "j", steps=(1, 1))] == [1]
    w = ter_by_window(store, "j", window=2)
    assert w[0]["n"] == 4 and w[0]["excluded_tokens"] == gen[0] - 2 + gen[2] - 3 + gen[3] - 1


def test_categories_per_domain_early_late(tmp_path, tok):
    store, _ = _store(tmp_path, tok)
    out = categories_early_late(store, "j", (0, 0), (1, 2))
    assert set(out) == {"arith", "tool"}
    assert out["arith"]["early"]["shares"] == {"corrected_mistake": 1.0}
    assert out["arith"]["late"]["shares"] == {"redundant_exploration": 0.5, "corrected_mistake": 0.5}
    # the paper's taxonomy by default: an abandoned attempt is redundant exploration
    assert out["tool"]["late"]["shares"] == {"redundant_exploration": 1.0} and out["tool"]["early"]["n"] == 0
    gfcr = categories_early_late(store, "j", (0, 0), (1, 2), taxonomy="gfcr")
    assert gfcr["tool"]["late"]["shares"] == {"abandoned_attempt": 1.0}
    mapped = categories_early_late(store, "j", (0, 0), (1, 2), domains={"tool:calc": "agent"})
    assert set(mapped) == {"arith", "agent"}


def test_primary_category_in_the_papers_taxonomy():
    """Issue 28: the paper's "redundant exploration" was split across two gfcr categories, so a
    rollout mostly redundant by the paper's count was reported as a corrected mistake."""
    from gfcr.ross.analyze import PAPER_CATEGORIES, PAPER_CATEGORY, primary_category

    spans = [Span(0, 30, "abandoned_attempt"), Span(30, 60, "redundant_exploration"),
             Span(60, 110, "corrected_mistake")]
    assert primary_category(spans) == "redundant_exploration"  # 60 chars against 50
    assert primary_category(spans, taxonomy="gfcr") == "corrected_mistake"
    assert primary_category([Span(0, 5, "incorrect_claim")]) == "other"
    assert primary_category([]) is None
    from gfcr.records import EXCLUSION_CATEGORIES

    assert set(PAPER_CATEGORY) == set(EXCLUSION_CATEGORIES) and set(PAPER_CATEGORY.values()) == set(PAPER_CATEGORIES)
    with pytest.raises(ValueError, match="taxonomy"):
        primary_category(spans, taxonomy="x")


def test_hardest_solved_prompts(tmp_path, tok):
    from gfcr.store import RolloutStore

    store = RolloutStore.open(tmp_path / "s2", create=True)
    rs = []
    # p_easy solved 3/3, p_hard 1/4, p_never 0/2, p_mid 1/2
    for pid, outcomes in {"p_easy": [1, 1, 1], "p_hard": [1, 0, 0, 0], "p_never": [0, 0], "p_mid": [1, 0]}.items():
        for i, ok in enumerate(outcomes):
            rs.append(make_rollout(tok, pid, f"Answer: {i}", step=i, prompt_id=pid, verified=bool(ok)))
    store.append(rs)
    hard = hardest_solved_prompts(store, 2)
    assert [h["prompt_id"] for h in hard] == ["p_hard", "p_mid"]
    assert hard[0]["rate"] == 0.25 and hard[0]["judged"] == 4
    assert [h["prompt_id"] for h in hardest_solved_prompts(store, 10)] == ["p_hard", "p_mid", "p_easy"]


def test_teacher_rows_are_retokenized_by_the_scored_tokenizer(tok):
    p = make_prompt("What is 2 + 2?", "4", "t1")
    rows = teacher_rows(tok, [p, make_prompt("x", "1", "t2")], {"t1": "2 + 2 = 4.\nAnswer: 4"})
    assert len(rows) == 1 and rows[0]["tokens_source"] == "retokenized"
    n_gen = sum(rows[0]["loss_mask"])
    body = tok("2 + 2 = 4.\nAnswer: 4", add_special_tokens=False)["input_ids"]
    assert rows[0]["input_ids"][-n_gen:] == body + [tok.eos_token_id]


class _Engine:
    """Fake engine: for each prompt, samples 'Answer: 5' (wrong), then 'Answer: <gold>'."""

    def __init__(self, tok):
        self.tokenizer = tok

    def encode_messages(self, messages):
        return [1, 2, 3]

    def generate(self, reqs):
        from gfcr.generate.engines.base import GenResult

        out = []
        for r in reqs:
            res = []
            for text in ("Answer: 5", "Answer: 4")[: r.params.n]:
                ids = np.array(self.tokenizer(text, add_special_tokens=False)["input_ids"], np.int32)
                res.append(GenResult(token_ids=ids, logprobs=np.zeros(len(ids), np.float32), finish_reason="stop",
                                     text=text))
            out.append(res)
        return out


def test_compatibility_samples_filtered_for_correctness(tok):
    from gfcr.ross.evaluation import make_verify_fn

    p = make_prompt("What is 2 + 2? End with a final line of the form 'Answer: N'.", "4", "c1")
    verify = make_verify_fn("numeric")
    kept = sample_rows(_Engine(tok), [p], 8, n=2, verify=verify)
    assert len(kept) == 1
    assert kept[0]["input_ids"][3:] == tok("Answer: 4", add_special_tokens=False)["input_ids"]
    unfiltered = sample_rows(_Engine(tok), [p], 8, n=1)
    assert unfiltered[0]["input_ids"][3:] == tok("Answer: 5", add_special_tokens=False)["input_ids"]
    assert sample_rows(_Engine(tok), [p], 8, n=1, verify=verify) == []  # no correct sample: no row


def test_episode_benchmark_goes_through_the_episode_evaluator(monkeypatch):
    """A benchmark with `episodes` is evaluated as env episodes, with the configured temperature."""
    import gfcr.evaluate as ev_mod
    from gfcr.evaluate import EvalResult
    from gfcr.ross.config import RossConfig
    from gfcr.ross.evaluation import evaluate_one

    seen = {}

    def fake_episodes(engine, prompts, **kw):
        seen.update(kw)
        return EvalResult(n_prompts=len(prompts), n_samples=0, metrics={}, per_prompt=[], info={})

    def no_single(*a, **k):
        raise AssertionError("single-answer evaluator used for an episode benchmark")

    monkeypatch.setattr(ev_mod, "evaluate_episodes", fake_episodes)
    monkeypatch.setattr(ev_mod, "evaluate_model", no_single)
    cfg = RossConfig(store="s", upstream_model="u", evaluate={
        "benchmarks": [{"name": "calc", "source": "store", "episodes": {"env": "calculator", "max_turns": 3,
                                                                       "reward_source": "env_or_verifier"}}],
        "k": 2, "ks": [1, 2], "temperature": 0.3})
    out = evaluate_one(object(), [make_prompt("q", "1")], cfg.evaluate.benchmarks[0], cfg.evaluate)
    assert seen["env"] == "calculator" and seen["max_turns"] == 3 and seen["reward_source"] == "env_or_verifier"
    assert seen["temperature"] == 0.3 and out["info"]["benchmark"] == "calc"


def test_evaluate_temperature_and_verifier_params_are_honoured(monkeypatch):
    import gfcr.evaluate as ev_mod
    from gfcr.evaluate import EvalResult
    from gfcr.ross.config import RossConfig
    from gfcr.ross.evaluation import evaluate_one

    seen = {}

    def fake_model(engine, prompts, **kw):
        seen.update(kw)
        return EvalResult(n_prompts=len(prompts), n_samples=0, metrics={}, per_prompt=[], info={})

    monkeypatch.setattr(ev_mod, "evaluate_model", fake_model)
    cfg = RossConfig(store="s", upstream_model="u", evaluate={
        "benchmarks": [{"name": "a", "source": "arith"}], "k": 2, "ks": [1, 2], "temperature": 1.3, "top_p": 0.9,
        "verifier": {"name": "numeric", "params": {"lenient_fallback": True}}, "batch_size": 7})
    p = make_prompt("Compute 2 + 2. End with a final line of the form 'Answer: N'.", "4")
    evaluate_one(object(), [p], cfg.evaluate.benchmarks[0], cfg.evaluate)
    assert seen["temperature"] == 1.3 and seen["top_p"] == 0.9 and seen["batch_size"] == 7
    assert seen["verifier"](p, "so 2 + 2 = 4") is True          # lenient fallback as configured
    strict = RossConfig(store="s", upstream_model="u", evaluate={"benchmarks": [{"name": "a", "source": "arith"}],
                                                                "k": 2, "ks": [1, 2]})
    evaluate_one(object(), [p], strict.evaluate.benchmarks[0], strict.evaluate)
    assert seen["verifier"](p, "so 2 + 2 = 4") is False         # the stated format, strictly
