import json

import pytest

from gfcr.tasks import TaskSource, make_source
from gfcr.tasks.arith import LEVELS, evaluate, make_arith, split_of


def test_evaluate_hand_worked():
    assert evaluate("12 + 7") == 19
    assert evaluate("3 * 4 - 5") == 7
    assert evaluate("2 + 3 * 4") == 14
    assert evaluate("10 - 2 - 3") == 5
    with pytest.raises(ValueError):
        evaluate("2 + + 3")


def test_arith_train_and_test_are_disjoint_and_deterministic():
    for level in (1, 2, 3):
        tr = make_arith(n=60 if level == 1 else 200, level=level, seed=0, split="train").prompts()
        tr2 = make_arith(n=60 if level == 1 else 200, level=level, seed=1, split="train").prompts()
        te = make_arith(n=8 if level == 1 else 20, level=level, seed=0, split="test").prompts()
        train_exprs = {p.meta["expression"] for p in tr + tr2}
        test_exprs = {p.meta["expression"] for p in te}
        assert not train_exprs & test_exprs
        assert all(p.split == "test" and split_of(p.meta["expression"]) == "test" for p in te)
    a = make_arith(n=10, level=2, seed=3).prompts()
    b = make_arith(n=10, level=2, seed=3).prompts()
    assert [p.prompt_id for p in a] == [p.prompt_id for p in b]


def test_arith_prompt_content():
    ps = make_arith(n=20, level=5, seed=1).prompts()
    assert len({p.prompt_id for p in ps}) == 20
    for p in ps:
        p.validate()
        assert p.task == "arith" and p.difficulty == 5.0 and p.category
        assert "Answer: N" in p.messages[-1].content
        assert p.meta["expression"] in p.messages[-1].content
        assert int(p.answer) == evaluate(p.meta["expression"])
        assert len(p.meta["expression"].split()) == 2 * LEVELS[5][1] - 1


def test_arith_too_many_asks_for_fewer():
    with pytest.raises(ValueError, match="ask for fewer"):
        make_arith(n=500, level=1, split="test")


def test_reasoning_gym_adapter_and_scorer():
    from gfcr.tasks.rgym import score_reasoning_gym

    src = make_source("reasoning_gym", dataset="basic_arithmetic", n=3, seed=1)
    assert isinstance(src, TaskSource)
    ps = src.prompts()
    assert len(ps) == 3
    p = ps[0]
    assert p.answer and p.task == "rg:basic_arithmetic"
    json.dumps(p.tests)
    assert score_reasoning_gym(p, p.answer) == 1.0
    assert score_reasoning_gym(p, "not a number") < 1.0


def test_jsonl_loaders(tmp_path):
    m = tmp_path / "math.jsonl"
    m.write_text(
        json.dumps({"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"}) + "\n"
        + json.dumps({"question": "Big?", "answer": "#### 1,234"}) + "\n"
    )
    ps = make_source("jsonl_math", path=str(m)).prompts()
    assert [p.answer for p in ps] == ["7", "1234"]
    assert ps[0].meta["solution"].startswith("3 + 4")
    c = tmp_path / "code.jsonl"
    c.write_text(json.dumps({"prompt": "Write add(a, b).", "tests": ["assert add(1, 2) == 3"]}) + "\n")
    cp = make_source("jsonl_code", path=str(c)).prompts()
    assert cp[0].tests["tests"] == ["assert add(1, 2) == 3"] and cp[0].task == "code"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "x", "answer": "1"}\n{not json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        make_source("jsonl_math", path=str(bad))
    with pytest.raises(ValueError, match="unknown task source"):
        make_source("nope")
