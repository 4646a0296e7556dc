"""Paired tests on domain averages and Holm's correction (issue 28): pure functions checked
against numbers worked out by hand."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gfcr.ross.evaluation import (
    all_comparisons,
    comparison_table,
    domain_comparisons,
    holm,
    paired_average_test,
    with_holm,
)


def test_holm_hand_worked():
    # sorted 0.005, 0.01, 0.03, 0.04 -> 4*0.005, 3*0.01, 2*0.03, max(1*0.04, 0.06)
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1 (2 * 0.5, then the running max)
    assert holm([0.02]) == [0.02] and holm([]) == []
    # ties keep their order and get the same value
    assert holm([0.01, 0.01, 0.2]) == pytest.approx([0.03, 0.03, 0.2])


def test_holm_against_the_definition_on_random_p_values():
    rng = np.random.default_rng(0)
    for _ in range(50):
        p = rng.uniform(0, 0.2, size=rng.integers(1, 9))
        m = len(p)
        order = np.argsort(p)
        want = np.empty(m)
        running = 0.0
        for rank, i in enumerate(order):  # the definition, written out as a loop
            running = max(running, (m - rank) * p[i])
            want[i] = min(1.0, running)
        assert holm(p) == pytest.approx(want.tolist())


def test_paired_average_test_hand_worked():
    t = paired_average_test({"x": [1, 1, 0], "y": [1, 0]})
    assert t["diff"] == pytest.approx(7 / 12)  # (2/3 + 1/2) / 2, the difference of the domain averages
    assert t["p_value"] == pytest.approx(0.25) and t["test"] == "sign-flip exact"
    assert t["n"] == 5 and (t["a_better"], t["b_better"]) == (3, 0)
    assert t["ci_low"] <= t["diff"] <= t["ci_high"]
    # the exact p-value is the share of all 2^n sign patterns at least as extreme (brute force here)
    d = {"x": [1.0, -0.5, 0.25, 1.0], "y": [0.5, 1.0, -1.0]}
    w = [1 / 8] * 4 + [1 / 6] * 3
    flat = d["x"] + d["y"]
    obs = sum(a * b for a, b in zip(w, flat, strict=True))
    pats = list(itertools.product([1, -1], repeat=len(flat)))
    extreme = sum(abs(sum(s * a * b for s, a, b in zip(p, w, flat, strict=True))) >= abs(obs) - 1e-12 for p in pats)
    t = paired_average_test(d)
    assert t["diff"] == pytest.approx(obs) and t["p_value"] == pytest.approx(extreme / len(pats))


def test_paired_average_test_weights_benchmarks_not_prompts():
    """A domain average weighs each benchmark once: 100 prompts of +0 and 2 prompts of +1 give
    (0 + 1) / 2 = 0.5, not 2/102."""
    t = paired_average_test({"big": [0.0] * 100, "small": [1.0, 1.0]})
    assert t["diff"] == pytest.approx(0.5)
    assert t["p_value"] == pytest.approx(0.5)  # 4 sign patterns of the two non-zero prompts, 2 as extreme
    many = paired_average_test({"a": [1.0] * 30, "b": [0.5] * 30}, n_perm=2000)
    assert many["test"] == "sign-flip permutation" and many["p_value"] < 0.01 and many["ci_low"] > 0
    with pytest.raises(ValueError):
        paired_average_test({"a": []})


def _res(domain, outcomes):
    return {"info": {"domain": domain}, "metrics": {"greedy_pass@1": {"value": float(np.mean(outcomes)),
                                                                      "ci_low": 0.0, "ci_high": 1.0}},
            "n_prompts": len(outcomes),
            "per_prompt": [{"prompt_id": f"q{i}", "greedy_correct": bool(o)} for i, o in enumerate(outcomes)]}


def test_domain_comparisons_and_holm_over_the_table():
    results = {
        "ross": {"m1": _res("math", [1, 1, 0]), "m2": _res("math", [1, 0]), "c1": _res("code", [1, 1, 1, 1])},
        "upstream": {"m1": _res("math", [0, 0, 0]), "m2": _res("math", [0, 0]), "c1": _res("code", [0, 0, 0, 0])},
    }
    rows = domain_comparisons(results, [("ross", "upstream")])
    by = {r["benchmark"]: r for r in rows}
    assert set(by) == {"math avg", "all avg"}  # code has one benchmark: its row is the benchmark's own
    assert by["math avg"]["diff"] == pytest.approx(7 / 12) and by["math avg"]["p_value"] == pytest.approx(0.25)
    # overall: mean of the three benchmark differences (2/3, 1/2, 1); 7 prompts differ -> exact, 2/128
    assert by["all avg"]["diff"] == pytest.approx((2 / 3 + 1 / 2 + 1) / 3)
    assert by["all avg"]["p_value"] == pytest.approx(2 / 2 ** 7)
    rows = all_comparisons(results, [("ross", "upstream")])
    assert [r["benchmark"] for r in rows] == ["m1", "m2", "c1", "all avg", "math avg"]
    raw = [r["p_value"] for r in rows]
    assert [r["p_holm"] for r in rows] == pytest.approx(holm(raw))
    # c1: 4 discordant of 4 (McNemar p = 0.125), all avg p = 1/64: Holm over 5 tests -> 5/64 = 0.078 > 0.05
    allrow = rows[3]
    assert allrow["p_value"] < 0.05 and allrow["p_holm"] == pytest.approx(5 / 64) and not allrow["significant"]
    table = comparison_table({"results": results, "paired": rows})
    assert "p (Holm)" in table and "| ross − upstream | all avg | greedy_pass@1 |" in table


def test_with_holm_decides_significance():
    rows = [{"p_value": p, "ci_low": 0.1, "ci_high": 0.2} for p in (0.01, 0.04, 0.03)]
    out = with_holm(rows)
    # sorted 0.01, 0.03, 0.04 -> 3 * 0.01 = 0.03, 2 * 0.03 = 0.06, max(1 * 0.04, 0.06) = 0.06
    assert [r["p_holm"] for r in out] == pytest.approx([0.03, 0.06, 0.06])
    assert [r["significant"] for r in out] == [True, False, False]  # unadjusted, all three were p < 0.05
    assert [r["p_value"] for r in out] == [0.01, 0.04, 0.03]
    crossing = with_holm([{"p_value": 0.001, "ci_low": -0.1, "ci_high": 0.2}])
    assert not crossing[0]["significant"]  # the interval holds 0
