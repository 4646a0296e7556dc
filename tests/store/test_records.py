import numpy as np
import pytest

from gfcr.records import (
    Audit,
    RecordError,
    Rollout,
    audits_to_table,
    rollouts_to_table,
    table_to_audits,
    table_to_rollouts,
)
from gfcr.testing import make_rollout


def test_roundtrip_every_field_bit_exact():
    rs = [make_rollout(i, parent_id="x" if i == 1 else None, branch_pos=3 if i == 1 else None) for i in range(3)]
    rs[2].logprobs[-1] = np.float32(-1.2345678e-7)  # a value that loses bits in float64 text
    back = table_to_rollouts(rollouts_to_table(rs))
    for a, b in zip(rs, back, strict=True):
        for f in a.__dataclass_fields__:
            va, vb = getattr(a, f), getattr(b, f)
            if isinstance(va, np.ndarray):
                assert va.dtype == vb.dtype and va.tobytes() == vb.tobytes(), f
            else:
                assert va == vb, f


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(token_role=[0, 1]), "token_role"),
        (dict(logprobs=[0.0]), "logprobs"),
        (dict(token_role=[0, 2, 1]), "token_role"),
        (dict(step=-1), "step"),
        (dict(run_id=""), "run_id"),
        (dict(reward=float("nan")), "reward"),
        (dict(reward=float("inf")), "reward"),
        (dict(finish_reason="weird"), "finish_reason"),
        (dict(logprobs=[0.0, 0.5, -1.0]), "logprobs"),
        (dict(parent_id="x"), "branch_pos"),
        (dict(signals={"a": "high"}), "signals"),
    ],
)
def test_validation_names_the_field(change, field):
    base = dict(run_id="r", prompt_id="p", token_ids=[1, 2, 3], token_role=[0, 1, 1], logprobs=[0.0, -0.1, -0.2])
    base.update(change)
    with pytest.raises(RecordError) as e:
        Rollout(**base).validate()
    assert e.value.field == field
    assert f"'{field}'" in str(e.value)


def test_empty_tokens_need_source_none():
    r = Rollout(run_id="r", prompt_id="p", token_ids=[], token_role=[], logprobs=[])
    with pytest.raises(RecordError):
        r.validate()
    r.tokens_source = "none"
    r.validate()


def test_audit_roundtrip_and_validation():
    a = Audit(rollout_id="r1", judge="arith-steps", judge_version="1", status="kept", mask=[0, 1, 1, 0],
              excluded=[{"start": 3, "end": 9, "category": "corrected_mistake", "unit": 2, "quote": None}], ter=0.25)
    b = table_to_audits(audits_to_table([a]))[0]
    assert b.mask.tolist() == [0, 1, 1, 0] and b.excluded == a.excluded and b.ter == 0.25
    a.excluded[0].category = "nonsense"
    with pytest.raises(RecordError, match="category"):
        a.validate()


def test_json_safe_converts_numpy_dates_sets_and_unknowns():
    from datetime import UTC, datetime

    from gfcr.records import json_safe

    class Odd:
        def __str__(self):
            return "odd"

    out = json_safe({"a": np.int64(3), "b": np.float32(0.5), "c": np.arange(2), "d": {1}, "e": (1, 2),
                     "t": datetime(2026, 1, 2, tzinfo=UTC), "o": Odd()})
    assert out == {"a": 3, "b": 0.5, "c": [0, 1], "d": [1], "e": [1, 2], "t": "2026-01-02T00:00:00+00:00", "o": "odd"}


def test_assistant_text_and_ranges_worked_example():
    from gfcr.records import Message, assistant_text, assistant_text_ranges

    msgs = [Message("user", "q"), Message("assistant", "ab"), Message("tool", "r"), Message("assistant", "c")]
    assert assistant_text_ranges(msgs) == ("ab\nc", [(0, 2), (3, 4)])
    rows = [m.to_dict() for m in msgs]  # rows read from the store are dicts: the same text
    assert assistant_text(rows) == "ab\nc" and assistant_text([]) == ""


def test_conform_of_a_table_already_in_the_schema_returns_it_and_still_refuses_nulls():
    """A table with exactly the rollout schema is returned as it is (no per-column cast and rebuild:
    ~0.1 ms of every append); a null in a required field is still refused by name."""
    import pyarrow as pa

    from gfcr.records import ROLLOUT_SCHEMA, conform

    t = rollouts_to_table([make_rollout(i) for i in range(3)])
    assert t.schema.equals(ROLLOUT_SCHEMA, check_metadata=True)
    assert conform(t, ROLLOUT_SCHEMA, "batch") is t
    bad = t.set_column(t.schema.get_field_index("task"), ROLLOUT_SCHEMA.field("task"),
                       pa.array(["a", None, "c"], pa.string()))
    assert bad.schema.equals(ROLLOUT_SCHEMA, check_metadata=True)
    with pytest.raises(RecordError, match="task.*1 null value"):
        conform(bad, ROLLOUT_SCHEMA, "batch")
