"""OpenPipe ART trajectory Parquet: the fixture was written by ART's own
``write_trajectory_groups_parquet`` (tests/contracts/gen_art.py); every column checked."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gfcr.formats import ImportFormatError, import_rollouts

FIX = Path(__file__).resolve().parents[1] / "contracts" / "fixtures" / "art"
TRAIN = FIX / "trajectories" / "train" / "0003.parquet"


def test_every_column_maps(store):
    res = import_rollouts(store, "art", [str(FIX)], run_id="a")
    assert res.written == 5
    rows = pq.read_table(TRAIN).to_pylist()
    got = sorted(store.rollouts(run="a"), key=lambda r: r.meta["row"])
    assert len(got) == len(rows) == 4
    for i, (r, row) in enumerate(zip(got, rows, strict=True)):
        assert r.meta["row"] == i and r.meta["file"] == "0003.parquet" and r.meta["split"] == "train"
        assert r.step == 3 and r.policy_version == "step-3"
        assert r.reward == row["reward"]
        assert r.meta["group_index"] == row["group_index"]
        assert r.group_id == f"a/art-train-3-{row['group_index']}"
        assert [(m.role, m.content, m.tool_calls) for m in r.messages] == \
            [(m["role"], m["content"] or "", m["tool_calls"]) for m in row["messages"]]
        assert r.meta["trainable"] == [k for k, m in enumerate(row["messages"]) if m["trainable"]]
        assert r.meta["tool_call_ids"] == {str(k): m["tool_call_id"] for k, m in enumerate(row["messages"])
                                           if m["tool_call_id"] is not None}
        for col in ("metadata", "tools"):
            assert r.meta[col] == (json.loads(row[col]) if row[col] else None)
        assert r.meta["metrics"] == (json.loads(row["metrics"]) if row["metrics"] else {})
        assert r.meta["logs"] == row["logs"]
        assert r.meta["group"] == {"metadata": json.loads(row["group_metadata"]) if row["group_metadata"] else None,
                                   "metrics": json.loads(row["group_metrics"]) if row["group_metrics"] else None,
                                   "logs": row["group_logs"]}
        # not in the file: null / none, never invented
        assert r.finish_reason is None and r.verified is None and r.tokens_source == "none" and len(r.token_ids) == 0
        p = store.prompts([r.prompt_id])[0]
        first = r.meta["trainable"][0]
        assert [m.to_dict() for m in p.messages] == [m.to_dict() for m in r.messages[:first]]
    assert [r.sample_index for r in got] == [0, 1, 2, 0]
    assert got[0].signals == {"metric/correct": 1.0, "metric/turns": 1.0} and got[2].signals == {"metric/correct": 0.0}
    assert got[0].prompt_id == got[1].prompt_id == got[2].prompt_id != got[3].prompt_id
    ev = store.rollouts(run="a-eval")
    assert len(ev) == 1 and ev[0].meta["split"] == "val"
    assert import_rollouts(store, "art", [str(FIX)], run_id="a").written == 0


def test_eval_split_can_be_skipped(store):
    res = import_rollouts(store, "art", [str(FIX)], run_id="a", evals="skip")
    assert res.written == 4 and store.count(where="run_id = 'a-eval'") == 0


@pytest.mark.parametrize(("change", "field"), [
    (lambda t: t.drop_columns(["messages"]), "messages"),
    (lambda t: t.set_column(t.column_names.index("metrics"), "metrics", pa.array(["{bad"] * t.num_rows)), "metrics"),
    (lambda t: t.set_column(t.column_names.index("reward"), "reward", pa.array([float("nan")] * t.num_rows)), "reward"),
])
def test_malformed_file_names_file_and_field_and_writes_nothing(store, tmp_path, change, field):
    d = tmp_path / "trajectories" / "train"
    d.mkdir(parents=True)
    pq.write_table(change(pq.read_table(TRAIN)), d / "0003.parquet")
    with pytest.raises(ImportFormatError, match=f"0003.parquet: .*field '{field}'"):
        import_rollouts(store, "art", [str(tmp_path)], run_id="a")
    assert store.count() == 0 and store.count("prompts") == 0
