"""Retrieval: nearest solved prompts through the Lance vector table next to the store."""

from __future__ import annotations

import numpy as np
import pytest

from gfcr.records import Rollout
from gfcr.replay.retrieval import HashEmbedding, Retrieval


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
    with pytest.raises(ValueError, match="dim"):
        Retrieval.for_store(store, embed=HashEmbedding(dim=64)).add([solved("x", "new prompt")])
