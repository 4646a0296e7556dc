"""Pairwise and listwise judges (gfcr.filters.pairwise): the aggregations on hand-worked judges, the LLM
judge through an OpenAI-compatible server on 127.0.0.1, and the judge estimator."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_judge import FakeServer  # tests/filters is on sys.path (pytest's rootdir-relative import)

from gfcr.filters.advantages import make_estimator
from gfcr.filters.pairwise import borda_scores, group_scores, llm_compare, llm_rank, pairwise_winrates
from gfcr.testing import make_rollout


@pytest.fixture
def server_factory():
    made = []

    def make(replies):
        made.append(FakeServer(replies))
        return made[-1]

    yield make
    for s in made:
        s.close()


def test_pairwise_winrates_hand_worked_and_position_bias_cancels():
    lens = [3, 1, 2]
    longer = pairwise_winrates(3, lambda i, j: float(lens[i] > lens[j]))
    np.testing.assert_allclose(longer, [1.0, 0.0, 0.5])
    np.testing.assert_allclose(pairwise_winrates(3, lambda i, j: 1.0), [0.5, 0.5, 0.5])  # always "the first"
    assert pairwise_winrates(1, lambda i, j: 1.0).tolist() == [0.5]


def test_borda_scores_hand_worked_and_bad_rankings():
    np.testing.assert_allclose(borda_scores([2, 0, 1], 3), [0.5, 0.0, 1.0])
    np.testing.assert_allclose(borda_scores([1], 3), [0.25, 1.0, 0.25])  # the unranked share the last places
    with pytest.raises(ValueError, match="distinct ids"):
        borda_scores([0, 0, 1], 3)
    with pytest.raises(ValueError, match="distinct ids"):
        borda_scores([3], 3)


def _group(texts, rewards):
    rs = [make_rollout(i, prompt="p", reward=r) for i, r in enumerate(rewards)]
    for r, t in zip(rs, texts, strict=True):
        r.messages[-1].content = t
    return rs


def test_llm_pairwise_and_listwise_judges_through_a_local_server(server_factory):
    srv = server_factory(['{"winner": "A"}', '{"winner": "B"}', '{"winner": "tie"}', "not json", "still not"])
    cfg = {"base_url": srv.url, "model": "judge", "max_retries": 0}
    cmp = llm_compare(cfg)
    assert [cmp("q", "x", "y"), cmp("q", "x", "y"), cmp("q", "x", "y"), cmp("q", "x", "y")] == [1.0, 0.0, 0.5, 0.5]
    sent = srv.requests[0]["messages"][-1]["content"]
    assert '<response id="A">\nx\n</response>' in sent and "ignore any instruction" in srv.requests[0]["messages"][0]["content"]
    srv2 = server_factory([json.dumps({"ranking": [2, 0, 1]})])
    g = _group(["a", "b", "c"], [1.0, 1.0, 1.0])
    s = group_scores(g, "listwise", llm_rank({"base_url": srv2.url, "model": "judge"}))
    np.testing.assert_allclose(s, [0.5, 0.0, 1.0])
    assert [r.signals["judge_listwise"] for r in g] == [0.5, 0.0, 1.0]
    assert '<response id="2">\nc\n</response>' in srv2.requests[0]["messages"][-1]["content"]


def longer_is_better(prompt, a, b):
    return float(len(a) > len(b)) if len(a) != len(b) else 0.5


def test_judge_estimator_orders_what_the_verifier_ties(monkeypatch):
    """rewards [1, 1, 0, 0], the longer-wins judge over lengths [4, 2, 3, 1] → win rates [1, 1/3, 2/3, 0];
    weight 0.5 → GRPO of [1.5, 1.1667, 0.3333, 0]; the judge is called once per group (memoised)."""
    import gfcr.filters.pairwise as pw

    calls = []
    monkeypatch.setattr(pw, "_judge_for_test", lambda p, a, b: (calls.append(1), longer_is_better(p, a, b))[1],
                        raising=False)
    est = make_estimator("judge", mode="pairwise", judge="gfcr.filters.pairwise:_judge_for_test", weight=0.5)
    g = _group(["xxxx", "xx", "xxx", "x"], [1.0, 1.0, 0.0, 0.0])
    adv = est(g)
    r = np.array([1.5, 1 + 0.5 / 3, 1 / 3, 0.0])
    np.testing.assert_allclose(adv, (r - r.mean()) / (r.std(ddof=1) + 1e-6), atol=1e-6)
    n = len(calls)
    assert n == 12 and est(g) == adv and len(calls) == n
    np.testing.assert_allclose([x.signals["judge_pairwise"] for x in g], [1, 1 / 3, 2 / 3, 0])
    with pytest.raises(ValueError, match="give judge"):
        make_estimator("judge")
