"""The per-token overlays of the viewer's token strip (issue 27, item 3), through the JSON API:
behaviour log-prob, entropy, trainer/sampler gap, advantage, loss mask, ROSS mask with categories."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient

from gfcr.diagnose.viewer import create_app, token_overlays
from gfcr.records import Audit, Message, Rollout, Span
from gfcr.testing import tiny_tokenizer


def test_token_overlays_hand_worked():
    o = token_overlays([5, 6], [0, 1], [0.0, -0.5], {"advantage": 1.0}, {}, None, [None, None], "")
    assert o["logprob"] == [None, -0.5] and o["entropy"] == [None, 0.5] and o["advantage"] == [None, 1.0]
    assert o["loss_mask"] == [0, 1] and o["gap"] is None and o["ross_mask"] is None
    assert "not stored" in o["notes"]["entropy"] and "no trainer" in o["notes"]["gap"]


@pytest.fixture
def client(store, tmp_path):
    tok = tiny_tokenizer()
    text = "Try 3*4=11. No: 3*4=12. Answer: 12"
    gen = tok(text, add_special_tokens=False)["input_ids"]
    ids = [1, 2] + gen
    role = [0, 0] + [1] * len(gen)
    lp = [0.0, 0.0] + [-0.25] * len(gen)
    r = Rollout(run_id="a", prompt_id="p", group_id="p@0", token_ids=np.asarray(ids, np.int32),
                token_role=np.asarray(role, np.uint8), logprobs=np.asarray(lp, np.float32),
                messages=[Message("user", "3*4?"), Message("assistant", text)], reward=1.0, verified=True,
                signals={"advantage": 0.75}, rollout_id="r1",
                meta={"trainer_logprobs": [0.0, 0.0] + [-0.5] * len(gen), "token_entropy": [0.0, 0.0] + [1.5] * len(gen)})
    store.append([r])
    a0, a1 = text.index("Try"), text.index("No:")
    mask = np.asarray(role, np.uint8)
    pieces = [tok.decode([i]) for i in ids]
    pos, excluded_tokens = 0, []
    for i in range(2, len(ids)):  # the tokens wholly or partly inside [a0, a1) are excluded
        at = text.find(pieces[i], pos)
        pos = at + len(pieces[i])
        if at < a1 and pos > a0:
            mask[i] = 0
            excluded_tokens.append(i)
    store.upsert_audits([Audit(rollout_id="r1", judge="rule", judge_version="1", status="kept", mask=mask,
                               excluded=[Span(a0, a1, "corrected_mistake")], ter=0.3)])
    tok.save_pretrained(str(tmp_path / "tok"))
    return TestClient(create_app(store.path, tokenizer=str(tmp_path / "tok"))), len(ids), excluded_tokens


def test_overlays_in_the_api(client):
    c, n, excluded = client
    o = c.get("/api/rollouts/r1").json()["overlays"]
    assert o["logprob"][:2] == [None, None] and set(o["logprob"][2:]) == {-0.25}
    assert set(o["entropy"][2:]) == {1.5} and "stored" in o["notes"]["entropy"]
    assert o["gap"][2:] == pytest.approx([-0.25] * (n - 2))
    assert o["advantage"] == [None, None] + [0.75] * (n - 2)
    assert o["loss_mask"] == [0, 0] + [1] * (n - 2)
    assert [i for i, m in enumerate(o["ross_mask"]) if m == 0] == [0, 1] + excluded
    assert [i for i, c_ in enumerate(o["ross_category"]) if c_] == excluded
    assert {o["ross_category"][i] for i in excluded} == {"corrected_mistake"}
    assert len(excluded) >= 3
