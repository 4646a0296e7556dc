"""The ROSS report says when a ROSS variant trained exactly what positive SFT did.

Seen in the demo's store: the judge excluded nothing, the ROSS and positive-SFT checkpoints were
byte-identical, and the table showed a row of zero differences with no word on why."""

from pathlib import Path

from gfcr.ross.pipeline import RossRun, identical_supervision, render_report


def _build(ross_tokens: int, nomask_rows: int = 6) -> dict:
    return {"positive_sft": {"rows": 6, "supervised_tokens": 85, "generated_tokens": 85},
            "ross_nomask": {"rows": nomask_rows, "supervised_tokens": 85 if nomask_rows == 6 else 60},
            "ross": {"rows": 6, "supervised_tokens": ross_tokens, "generated_tokens": 85}}


def test_identical_supervision_names_each_variant_that_equals_positive_sft():
    assert identical_supervision(_build(85)) == ["ross_nomask", "ross"]
    assert identical_supervision(_build(70)) == ["ross_nomask"]
    assert identical_supervision(_build(70, nomask_rows=4)) == []
    assert identical_supervision({"ross": {"rows": 6, "supervised_tokens": 85}}) == []


def test_report_carries_the_note_only_when_the_mask_did_nothing(tmp_path: Path):
    note = "trained the same model"
    assert note in render_report(RossRun(tmp_path, results={"build": _build(85, nomask_rows=4)}))
    assert note not in render_report(RossRun(tmp_path, results={"build": _build(70, nomask_rows=4)}))
