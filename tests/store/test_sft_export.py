"""SFT export (`gfcr store export-sft`): the four formats, where/dedup, no overwrite, no partial
file, TRL SFTTrainer acceptance and the CLI."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from gfcr.formats.sft_export import (
    IGNORE_INDEX,
    export_sft,
    split_last_assistant,
    token_targets,
    with_assistant,
)
from gfcr.records import Message, Rollout
from gfcr.store import RolloutStore, StoreError
from gfcr.testing import make_rollout, tiny_model, tiny_tokenizer

TWO_TURN = [
    Message("system", "You are terse."),
    Message("user", "What is 6 * 7?"),
    Message("assistant", "<tool>calculator: 6 * 7</tool>"),
    Message("tool", "42"),
    Message("assistant", "So the answer is 42."),
]


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def _ids(tok, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


def chat_rollout(tok, messages: list[Message], **kw) -> Rollout:
    """Tokens as a chat run stores them: each assistant turn's content + <|im_end|> is generated
    (role 1); everything else, including the ``<|im_start|>assistant\\n`` header, is context."""
    ids: list[int] = []
    role: list[int] = []
    for m in messages:
        if m.role == "assistant":
            head, body = _ids(tok, "<|im_start|>assistant\n"), _ids(tok, m.content) + [tok.eos_token_id]
            ids += head + body
            role += [0] * len(head) + [1] * len(body)
            ids += _ids(tok, "\n")
            role += [0]
        else:
            t = _ids(tok, f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n")
            ids += t
            role += [0] * len(t)
    lp = [-0.5 if r else 0.0 for r in role]
    base = dict(run_id="run", prompt_id="p6x7", token_ids=ids, token_role=role, logprobs=lp, messages=messages,
                task="tool:calculator", step=3, policy_version="v3", reward=1.0, verified=True)
    return Rollout(**{**base, **kw})


def _store(tmp_path, rollouts) -> RolloutStore:
    s = RolloutStore.open(tmp_path / "st", create=True)
    s.append(rollouts)
    return s


def _rows(path):
    return pq.read_table(path).to_pylist()


# --- pure helpers, hand-worked -------------------------------------------------------------------


def test_token_targets_hand_worked():
    ids, labels, mask = token_targets(np.array([5, 6, 7, 8], np.int32), np.array([0, 1, 0, 1], np.int8))
    assert ids.tolist() == [5, 6, 7, 8]
    assert labels.tolist() == [-100, 6, -100, 8]
    assert mask.tolist() == [0, 1, 0, 1] and mask.dtype == np.int8
    with pytest.raises(ValueError, match="token_role has 3"):
        token_targets(np.arange(4), np.zeros(3))


def test_conversation_helpers_hand_worked():
    assert with_assistant([{"role": "user", "content": "q"}], "a") == [
        {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    have = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "x"}]
    assert with_assistant(have, "ignored") == have
    assert with_assistant([{"role": "user", "content": "q"}], None) == []
    conv = [{"role": r, "content": r[0] + str(i)} for i, r in enumerate(["system", "user", "assistant", "tool",
                                                                        "assistant", "user"])]
    prompt, completion = split_last_assistant(conv)
    assert [m["content"] for m in prompt] == ["s0", "u1", "a2", "t3"]
    assert completion == [{"role": "assistant", "content": "a4"}]
    with pytest.raises(ValueError, match="no assistant"):
        split_last_assistant(conv[:2])


# --- tokens ----------------------------------------------------------------------------------------


def test_tokens_bit_exact_labels_single_and_multi_turn(tmp_path, tok):
    single = make_rollout(0, n_ctx=5, n_gen=7)
    multi = chat_rollout(tok, TWO_TURN)
    role = np.asarray(multi.token_role)
    # observation tokens between the two assistant turns are context
    gen = np.flatnonzero(role == 1)
    assert np.any(role[gen.min():gen.max()] == 0)
    store = _store(tmp_path, [single, multi])
    res = export_sft(store, tmp_path / "t.parquet", "tokens")
    assert res["rows"] == 2 and res["skipped"] == {}
    rows = {r["rollout_id"]: r for r in _rows(tmp_path / "t.parquet")}
    for r in (single, multi):
        row = rows[r.rollout_id]
        ids = np.asarray(row["input_ids"])
        assert np.array_equal(ids.astype(np.int32), r.token_ids) and np.array_equal(ids, r.token_ids.astype(np.int64))
        lab = np.asarray(row["labels"])
        ctx = np.asarray(r.token_role) == 0
        assert np.all(lab[ctx] == IGNORE_INDEX) and np.array_equal(lab[~ctx], ids[~ctx])
        assert row["completion_mask"] == np.asarray(r.token_role).tolist()
        assert (row["run_id"], row["step"], row["policy_version"], row["prompt_id"], row["reward"]) == (
            r.run_id, r.step, r.policy_version, r.prompt_id, r.reward)
    assert pq.read_schema(tmp_path / "t.parquet").field("completion_mask").type.value_type.bit_width == 8


def test_tokens_skips_rollouts_stored_without_tokens(tmp_path):
    textonly = make_rollout(1, n_ctx=0, n_gen=0, tokens_source="none")
    store = _store(tmp_path, [make_rollout(0), textonly])
    res = export_sft(store, tmp_path / "t.parquet", "tokens")
    assert res["rows"] == 1 and res["skipped"] == {"no_tokens": 1}
    # the text formats still export it
    assert export_sft(store, tmp_path / "m.parquet", "messages")["rows"] == 2


# --- text formats: hand-written expected rows ------------------------------------------------------


def test_messages_prompt_completion_slime_two_turn(tmp_path, tok):
    r = chat_rollout(tok, TWO_TURN)
    store = _store(tmp_path, [r])
    prov = {"rollout_id": r.rollout_id, "run_id": "run", "step": 3, "policy_version": "v3", "prompt_id": "p6x7",
            "task": "tool:calculator", "reward": 1.0}
    sys_, user = {"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 6 * 7?"}
    a1 = {"role": "assistant", "content": "<tool>calculator: 6 * 7</tool>"}
    obs = {"role": "tool", "content": "42"}
    a2 = {"role": "assistant", "content": "So the answer is 42."}

    export_sft(store, tmp_path / "m.parquet", "messages")
    assert _rows(tmp_path / "m.parquet") == [{"messages": [sys_, user, a1, obs, a2], **prov}]

    export_sft(store, tmp_path / "pc.parquet", "prompt-completion")
    assert _rows(tmp_path / "pc.parquet") == [{"prompt": [sys_, user, a1, obs], "completion": [a2], **prov}]

    export_sft(store, tmp_path / "s.parquet", "slime")
    assert _rows(tmp_path / "s.parquet") == [{"messages": [
        {**sys_, "step_loss_mask": 0}, {**user, "step_loss_mask": 0}, {**a1, "step_loss_mask": 1},
        {**obs, "step_loss_mask": 0}, {**a2, "step_loss_mask": 1}], **prov}]


def test_missing_assistant_turn_is_decoded_from_generated_tokens(tmp_path, tok):
    r = chat_rollout(tok, TWO_TURN[:2] + [Message("assistant", "Answer: 42")])
    r.messages = r.messages[:2]  # as some importers store it: prompt turns only
    store = _store(tmp_path, [r])
    with pytest.raises(StoreError, match="no assistant turn.*tokenizer"):
        export_sft(store, tmp_path / "m.parquet", "messages")
    assert not (tmp_path / "m.parquet").exists()
    export_sft(store, tmp_path / "m.parquet", "prompt-completion", tokenizer=tok)
    row = _rows(tmp_path / "m.parquet")[0]
    assert row["completion"] == [{"role": "assistant", "content": "Answer: 42"}]
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]


# --- where, dedup, overwrite, failure ------------------------------------------------------------


def test_where_and_dedup(tmp_path):
    a = make_rollout(0, prompt="p0", step=0, reward=1.0, verified=True)
    dup = make_rollout(0, prompt="p0", step=1, reward=1.0, verified=True)  # same token ids, same prompt
    assert np.array_equal(a.token_ids, dup.token_ids) and a.rollout_id != dup.rollout_id
    other_prompt = make_rollout(0, prompt="p1", step=1, verified=True)  # same ids, other prompt: kept
    bad = make_rollout(3, prompt="p0", step=2, reward=0.0, verified=False)
    store = _store(tmp_path, [dup, bad, a, other_prompt])
    res = export_sft(store, tmp_path / "a.parquet", "tokens", where="verified AND reward > 0")
    assert (res["matched"], res["rows"], res["duplicates_dropped"]) == (3, 2, 1)
    rows = _rows(tmp_path / "a.parquet")
    assert [(r["rollout_id"]) for r in rows] == [a.rollout_id, other_prompt.rollout_id]  # oldest step kept
    res = export_sft(store, tmp_path / "b.parquet", "messages", where="verified", dedup=False)
    assert (res["rows"], res["duplicates_dropped"]) == (3, 0)
    assert export_sft(store, tmp_path / "c.parquet", "slime")["rows"] == 3  # all rollouts, one duplicate dropped
    with pytest.raises(StoreError, match="SQL error"):
        export_sft(store, tmp_path / "d.parquet", "tokens", where="no_such_column > 1")
    with pytest.raises(StoreError, match="no rollouts to export: 0 matched"):
        export_sft(store, tmp_path / "d.parquet", "tokens", where="reward > 5")
    assert not (tmp_path / "d.parquet").exists()


def test_refuses_overwrite_bad_format_and_leaves_no_partial_file(tmp_path, monkeypatch):
    store = _store(tmp_path, [make_rollout(0)])
    out = tmp_path / "x.parquet"
    out.write_bytes(b"keep me")
    with pytest.raises(StoreError, match="never overwrites"):
        export_sft(store, out, "tokens")
    assert out.read_bytes() == b"keep me"
    with pytest.raises(StoreError, match="unknown SFT format 'chatml'"):
        export_sft(store, tmp_path / "y.parquet", "chatml")
    with pytest.raises(StoreError, match=r"ending in \.parquet"):
        export_sft(store, tmp_path / "y.jsonl", "tokens")

    import gfcr.formats.sft_export as M

    def broken_write(table, where, **kw):
        with open(where, "wb") as fh:
            fh.write(b"PAR1 half")
        raise OSError("disk full")

    monkeypatch.setattr(M.pq, "write_table", broken_write)
    out2 = tmp_path / "sub" / "z.parquet"
    with pytest.raises(OSError, match="disk full"):
        export_sft(store, out2, "tokens")
    assert not out2.exists() and list(out2.parent.iterdir()) == []


# --- TRL SFTTrainer reads the exports ---------------------------------------------------------------


def _trl_train_one_step(ds, tok, tmp_path, **cfg_kw):
    import torch
    from trl import SFTConfig, SFTTrainer

    model = tiny_model(tok, seed=0)
    cfg = SFTConfig(output_dir=str(tmp_path / "trl"), max_steps=1, per_device_train_batch_size=2, bf16=False,
                    gradient_checkpointing=False, report_to=[], logging_steps=1, save_strategy="no",
                    use_cpu=True, dataloader_num_workers=0, **cfg_kw)
    trainer = SFTTrainer(model=model, args=cfg, train_dataset=ds, processing_class=tok)
    w0 = [p.detach().clone() for p in model.parameters()]
    out = trainer.train()
    assert out.global_step == 1 and math.isfinite(out.training_loss)
    assert any(not torch.equal(a, b) for a, b in zip(w0, model.parameters(), strict=True))
    return trainer


@pytest.fixture(scope="module")
def chat_store(tmp_path_factory, tok):
    tmp = tmp_path_factory.mktemp("chat")
    rs = [chat_rollout(tok, TWO_TURN, prompt_id=f"p{i}") for i in range(2)]
    rs += [chat_rollout(tok, [*TWO_TURN[:2], Message("assistant", f"Answer: {40 + i}")], prompt_id=f"q{i}")
           for i in range(2)]
    return _store(tmp, rs)


def test_trl_sfttrainer_accepts_tokens_export(chat_store, tmp_path, tok):
    import datasets

    export_sft(chat_store, tmp_path / "t.parquet", "tokens")
    ds = datasets.Dataset.from_parquet(str(tmp_path / "t.parquet"), cache_dir=str(tmp_path / "cache"))
    trainer = _trl_train_one_step(ds, tok, tmp_path)
    # the explicit labels reach the model: -100 exactly on the context tokens
    batch = trainer.data_collator([trainer.train_dataset[0]])
    lab = batch["labels"][0]
    want = ds[0]["labels"]
    assert lab[: len(want)].tolist() == want


def test_trl_sfttrainer_accepts_messages_and_prompt_completion_exports(chat_store, tmp_path, tok):
    import datasets

    export_sft(chat_store, tmp_path / "m.parquet", "messages")
    ds = datasets.Dataset.from_parquet(str(tmp_path / "m.parquet"), cache_dir=str(tmp_path / "cache"))
    trainer = _trl_train_one_step(ds, tok, tmp_path / "m")
    # TRL rendered each whole conversation with the tokenizer's chat template
    for i in range(ds.num_rows):
        row = trainer.train_dataset[i]
        assert tok.decode(row["input_ids"]) == tok.apply_chat_template(ds[i]["messages"], tokenize=False)

    export_sft(chat_store, tmp_path / "pc.parquet", "prompt-completion")
    ds = datasets.Dataset.from_parquet(str(tmp_path / "pc.parquet"), cache_dir=str(tmp_path / "cache"))
    trainer = _trl_train_one_step(ds, tok, tmp_path / "pc")
    # loss only on the last assistant turn
    by_id = {trainer.train_dataset[i]["rollout_id"]: trainer.train_dataset[i] for i in range(ds.num_rows)}
    for r in ds:
        row = by_id[r["rollout_id"]]
        target = [t for t in row["labels"] if t != IGNORE_INDEX]
        assert tok.decode(target).startswith(r["completion"][0]["content"] + "<|im_end|>")
        assert r["completion"][0]["content"] not in tok.decode(row["input_ids"][: len(row["labels"]) - len(target)])


# --- CLI -----------------------------------------------------------------------------------------------


def test_cli_export_sft(tmp_path):
    store = _store(tmp_path, [make_rollout(0, verified=True), make_rollout(1, verified=False, reward=0.0)])

    def gfcr(*args):
        return subprocess.run([sys.executable, "-m", "gfcr.cli", "store", "export-sft", *map(str, args)],
                              capture_output=True, text=True, timeout=120)

    p = gfcr(store.path, tmp_path / "v.parquet", "--format", "tokens", "--where", "verified")
    assert p.returncode == 0, p.stderr
    assert "wrote 1 rows" in p.stdout and "v.parquet" in p.stdout
    assert len(_rows(tmp_path / "v.parquet")) == 1
    p = gfcr(store.path, tmp_path / "all.parquet", "--format", "prompt-completion", "--no-dedup")
    assert p.returncode == 0 and "wrote 2 rows" in p.stdout
    again = gfcr(store.path, tmp_path / "v.parquet", "--format", "tokens")
    assert again.returncode == 2 and "never overwrites" in again.stderr
    bad = gfcr(store.path, tmp_path / "b.parquet", "--format", "alpaca")
    assert bad.returncode == 2 and "unknown SFT format" in bad.stderr


def test_truncated_rollouts_are_skipped_unless_asked(tmp_path, tok):
    """A rollout cut by the token limit would be closed with an end-of-turn token by the text
    formats, teaching the model to stop mid-sentence: it is skipped (and counted) by default."""
    store = RolloutStore.open(tmp_path / "s", create=True)
    ctx = _ids(tok, "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n")
    rs = []
    for i, (text, finish) in enumerate([("add 3 + 6 to 9, which gives 11 ... multiply 11 by 9, which results in",
                                         "length"), ("3 + 6 = 9\nAnswer: 9", "stop")]):
        gen = _ids(tok, text)
        rs.append(Rollout(run_id="r", prompt_id=f"p{i}", token_ids=ctx + gen, token_role=[0] * len(ctx) + [1] * len(gen),
                          logprobs=[0.0] * (len(ctx) + len(gen)), finish_reason=finish, verified=True,
                          messages=[Message("user", "q"), Message("assistant", text)]))
    ep = rs[1]
    ep2 = Rollout(run_id="r", prompt_id="p2", token_ids=ep.token_ids, token_role=ep.token_role, logprobs=ep.logprobs,
                  finish_reason="length", verified=True, messages=ep.messages, meta={"max_turns_reached": True})
    store.append(rs + [ep2])
    for fmt in ("tokens", "messages"):
        res = export_sft(store, tmp_path / f"{fmt}.parquet", fmt, where="verified")
        assert res["rows"] == 2 and res["skipped"] == {"truncated": 1}
        assert "p0" not in pq.read_table(tmp_path / f"{fmt}.parquet").column("prompt_id").to_pylist()
    res = export_sft(store, tmp_path / "all.parquet", "messages", where="verified", include_truncated=True)
    assert res["rows"] == 3 and res["skipped"] == {}
