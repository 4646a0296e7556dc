import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from gfcr.formats import ImportFormatError, export, import_rollouts
from gfcr.store import StoreError
from gfcr.store import samples as S
from gfcr.testing import make_rollout, tiny_tokenizer


def test_verl_text_only_and_retokenized(store, tmp_path):
    d = S.write_verl(tmp_path / "verl", steps=2, k=4)
    res = import_rollouts(store, "verl", [str(d)], run_id="v")
    assert res.written == 24 and res.notes and "tokens" in res.notes[0]
    r = store.rollouts(run="v", steps=(2, 2))
    assert len(r) == 12 and all(x.tokens_source == "none" and len(x.token_ids) == 0 for x in r)
    assert {x.signals["acc"] for x in r} == {0.0, 1.0}
    # gts became the gold answer in the prompts table
    answers = {p.answer for p in store.prompts(task="verl")}
    assert answers == {"7", "42"}
    # groups: same prompt and step share a group, sample indices 0..3
    g = store.sql("SELECT group_id, list_sort(list(sample_index)) s FROM rollouts GROUP BY group_id").to_pylist()
    assert len(g) == 6 and all(x["s"] == [0, 1, 2, 3] for x in g)
    tok = tiny_tokenizer()
    res2 = import_rollouts(store, "verl", [str(d)], run_id="v2", tokenizer=tok)
    r2 = res2.rollouts[0]
    assert r2.tokens_source == "retokenized"
    gen = r2.token_ids[r2.token_role == 1]
    assert tok.decode(gen.tolist()) == r2.messages[-1].content


def test_trl(store, tmp_path):
    d = S.write_trl(tmp_path / "out", steps=2)
    with pytest.raises(ImportFormatError, match="--reward-columns"):  # two numeric columns: which are rewards?
        import_rollouts(store, "trl", [str(tmp_path / "out")])
    res = import_rollouts(store, "trl", [str(tmp_path / "out")], reward_columns=["accuracy_reward", "format_reward"],
                          reward_weights=[1.0, 2.0])
    assert len(res.rollouts) == 24
    r = [x for x in res.rollouts if x.signals["reward/accuracy_reward"] == 1.0][0]
    assert r.reward == 2.0 and "advantage" in r.signals  # 1.0 * 1.0 + 2.0 * 0.5
    assert r.finish_reason is None and r.verified is None
    assert d.name == "completions"


def test_areal_versions_and_segments(store, tmp_path):
    S.write_areal(tmp_path / "a", versions=2)
    res = import_rollouts(store, "areal", [str(tmp_path / "a")])
    pvs = {r.policy_version for r in res.rollouts}
    assert pvs == {"v0", "v0-v1"}
    seg = [r for r in res.rollouts if r.meta["task_id"] == "task2"][0]
    assert [m.role for m in seg.messages] == ["user", "assistant", "tool", "assistant"]
    assert seg.meta["version_rle"] is not None


def test_prime_rl_exact_tokens(store, tmp_path):
    p = S.write_prime_rl(tmp_path / "p", step=3)
    import_rollouts(store, "prime-rl", [str(p)])
    rs = store.rollouts()
    assert len(rs) == 6 and all(r.tokens_source == "engine" for r in rs)
    r = [x for x in rs if x.sample_index == 1][0]
    assert r.token_role.tolist() == [0] * 5 + [1] * 6
    assert r.logprobs[5:].tolist() == [-0.125 * (t + 1) for t in range(6)]
    assert r.step == 3 and r.policy_version == "v2-v3" and r.meta["batch_step"] == 4


def test_slime_weights_only_and_pickle_refusal(store, tmp_path):
    p = S.write_slime(tmp_path / "sl", rollout_id=5)
    res = import_rollouts(store, "slime", [str(p)])
    r = res.rollouts[0]
    assert r.step == 5 and r.policy_version == "v3-4" and r.finish_reason == "stop"
    assert r.token_role.tolist() == [0] * 4 + [1] * 5 + [0]  # loss_mask 0 on the last response token
    assert store.prompts(ids=[r.prompt_id])[0].answer == "7"

    class Evil:  # needs arbitrary unpickling
        def __reduce__(self):
            return (print, ("pwned",))

    bad = tmp_path / "evil.pt"
    torch.save({"rollout_id": 1, "samples": [Evil()]}, bad)
    n = store.count()
    with pytest.raises(ImportFormatError, match="--trust-pickle"):
        import_rollouts(store, "slime", [str(bad)])
    assert store.count() == n


def _count(store):
    return store.count(), store.count("prompts")


@pytest.mark.parametrize(
    "fmt, content, field",
    [
        ("verl", '{"input": "q", "output": "a", "score": 1.0, "step": 1}\n{"input": "q", "outp', "-"),
        ("verl", '{"input": "q", "output": "a", "score": 1.0}\n', "step"),
        ("verl", '{"input": "q", "output": "a", "score": "high", "step": 1}\n', "score"),
        ("verl", '{"input": "q", "output": 3, "score": 1.0, "step": 1}\n', "output"),
        ("verl", '[1, 2]\n', "-"),
        ("areal", '{"task_id": "t", "sample_idx": 0, "reward": 1, "prompt": "q"}\n', "completion"),
        ("areal", '{"task_id": "t", "sample_idx": 0, "reward": 1, "prompt": "q", "completion": "a", "version_rle": 5}\n',
         "version_rle"),
        ("prime-rl", '{"id": 1, "traces": [{"messages": [{"role": "user", "token_ids": [1, 2], "mask": [0]}]}]}\n', "mask"),
        ("prime-rl", '{"id": 1, "traces": [{"messages": [{"role": "user", "token_ids": [1, -2]}]}]}\n', "token_ids[1]"),
        ("jsonl", '{"rollout_id": "x", "prompt_id": "p", "run_id": "r", "token_ids": [1], "token_role": [1], '
                  '"logprobs": [0.5]}\n', "logprobs"),
        ("jsonl", '{"rollout_id": "x", "prompt_id": "p", "run_id": "r", "token_ids": [1, 2], "token_role": [1], '
                  '"logprobs": [0.0]}\n', "token_role"),
    ],
)
def test_malformed_input_clear_error_and_unchanged_store(store, tmp_path, fmt, content, field):
    S.write_verl(tmp_path / "good", steps=1)
    import_rollouts(store, "verl", [str(tmp_path / "good")])
    before = _count(store)
    name = "traces.jsonl" if fmt == "prime-rl" else "bad.jsonl"
    bad = tmp_path / "bad" / name
    bad.parent.mkdir()
    # a good file first: the later bad file must stop the whole import
    if fmt == "verl":
        (tmp_path / "bad" / "a_good.jsonl").write_text(json.dumps({"input": "z", "output": "y", "score": 0.0, "step": 9}) + "\n")
    bad.write_text(content)
    with pytest.raises(ImportFormatError) as e:
        import_rollouts(store, fmt, [str(tmp_path / "bad")])
    assert str(bad) in str(e.value) and f"field '{field}'" in str(e.value)
    if fmt in ("verl", "areal", "prime-rl", "jsonl"):
        assert "line" in str(e.value)
    assert _count(store) == before


def test_trl_missing_column(store, tmp_path):
    d = tmp_path / "completions"
    d.mkdir()
    pq.write_table(pa.table({"step": [1], "prompt": ["q"]}), d / "completions_00001.parquet")
    with pytest.raises(ImportFormatError, match="completion"):
        import_rollouts(store, "trl", [str(d)])
    assert store.count() == 0


def test_reimport_refused_and_export_roundtrip(store, tmp_path):
    rs = [make_rollout(i, step=i) for i in range(6)]
    store.append(rs)
    out = tmp_path / "x.jsonl"
    assert export(store, "jsonl", out, where="step >= 2") == 4
    with pytest.raises(StoreError, match="never overwrites"):
        export(store, "jsonl", out)
    again = import_rollouts(store, "jsonl", [str(out)])  # already there: skipped, not doubled
    assert (again.written, again.skipped) == (0, 4) and store.count() == 6
    from gfcr.store import RolloutStore

    other = RolloutStore.open(tmp_path / "other", create=True)
    import_rollouts(other, "jsonl", [str(out)])
    pqo = tmp_path / "x.parquet"
    export(store, "parquet", pqo)
    third = RolloutStore.open(tmp_path / "third", create=True)
    import_rollouts(third, "parquet", [str(pqo)])
    for s2, n in ((other, 4), (third, 6)):
        got = {r.rollout_id: r for r in s2.rollouts()}
        assert len(got) == n
        for r in rs:
            if r.rollout_id in got:
                b = got[r.rollout_id]
                assert b.logprobs.tobytes() == r.logprobs.tobytes()
                assert b.token_ids.tobytes() == r.token_ids.tobytes()
                assert (b.signals, b.meta, b.messages, b.created_at) == (r.signals, r.meta, r.messages, r.created_at)
