"""ROSS build: full context, selective targets.

One row per kept audit: ``input_ids`` (the stored token ids, whole trajectory), ``loss_mask``
(the audit's per-token mask: 1 = supervised) and ``labels`` (``input_ids`` where supervised, −100
elsewhere: the Hugging Face convention, so TRL's SFTTrainer and any causal-LM loss honour it).
``no_mask=True`` is the "ROSS w/o mask" ablation: same samples and context, every generated token
supervised. The ``keep-all`` judge's audits give the positive-rollout SFT baseline.

Written to a new folder (never overwritten): ``data.parquet``, ``hf/`` (``datasets.save_to_disk``)
and ``build.json`` (what was built from what).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gfcr.records import GENERATED, IGNORE_INDEX, labels_from_mask
from gfcr.ross.audit import load_kept

__all__ = ["IGNORE_INDEX", "BuildResult", "build_dataset", "build_rows", "labels_from_mask", "load_dataset_rows"]


@dataclass
class BuildResult:
    out_dir: Path
    rows: int
    supervised_tokens: int
    generated_tokens: int
    dropped_too_long: int

    def to_dict(self) -> dict[str, Any]:
        return {"out_dir": str(self.out_dir), "rows": self.rows, "supervised_tokens": self.supervised_tokens,
                "generated_tokens": self.generated_tokens, "dropped_too_long": self.dropped_too_long}


def build_rows(store: Any, judge: str, judge_version: str | None = None, no_mask: bool = False,
               max_length: int | None = None) -> tuple[list[dict[str, Any]], int]:
    """Rows (dicts) for the kept audits of ``judge``; returns ``(rows, n_dropped_too_long)``."""
    aus, rmap = load_kept(store, judge, judge_version)
    rows, dropped = [], 0
    for a in aus:
        r = rmap[a.rollout_id]
        ids = np.asarray(r.token_ids, np.int64)
        if len(a.mask) != len(ids):
            raise ValueError(f"audit of {a.rollout_id} has a mask of {len(a.mask)} tokens, the rollout {len(ids)}")
        if max_length is not None and len(ids) > max_length:
            dropped += 1
            continue
        mask = (r.token_role == GENERATED).astype(np.int64) if no_mask else a.mask.astype(np.int64)
        mask[r.token_role != GENERATED] = 0
        rows.append({
            "rollout_id": r.rollout_id, "prompt_id": r.prompt_id, "step": int(r.step), "task": r.task,
            "input_ids": ids.tolist(), "labels": labels_from_mask(ids, mask).tolist(), "loss_mask": mask.tolist(),
            "ter": float(a.ter) if a.ter is not None else None, "n_generated": int(r.n_generated),
        })
    return rows, dropped


def build_dataset(store: Any, out_dir: str | Path, judge: str, judge_version: str | None = None,
                  no_mask: bool = False, max_length: int | None = None) -> BuildResult:
    """Write the SFT dataset of ``judge``'s kept audits to a new folder ``out_dir`` (see module doc)."""
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty; builds never overwrite: choose a new folder")
    rows, dropped = build_rows(store, judge, judge_version, no_mask, max_length)
    if not rows:
        raise ValueError(f"no kept audits for judge {judge!r}: run the audit stage first")
    out.mkdir(parents=True, exist_ok=True)
    schema = pa.schema([("rollout_id", pa.string()), ("prompt_id", pa.string()), ("step", pa.int64()),
                        ("task", pa.string()), ("input_ids", pa.list_(pa.int64())), ("labels", pa.list_(pa.int64())),
                        ("loss_mask", pa.list_(pa.int64())), ("ter", pa.float64()),
                        ("n_generated", pa.int64())])
    table = pa.Table.from_pylist(rows, schema=schema)
    pq.write_table(table, out / "data.parquet")
    import datasets
    from datasets.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    quiet = are_progress_bars_disabled()
    disable_progress_bars()  # a few rows: its "Saving the dataset" bars only clutter the pipeline's log
    try:
        datasets.Dataset(table).save_to_disk(str(out / "hf"))
    finally:
        if not quiet:
            enable_progress_bars()
    res = BuildResult(out, len(rows), int(sum(sum(r["loss_mask"]) for r in rows)),
                      int(sum(r["n_generated"] for r in rows)), dropped)
    (out / "build.json").write_text(json.dumps({"judge": judge, "judge_version": judge_version, "no_mask": no_mask,
                                                "max_length": max_length, **res.to_dict()}, indent=2))
    return res


def load_dataset_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a built dataset folder (or its ``data.parquet``)."""
    p = Path(path)
    p = p / "data.parquet" if p.is_dir() else p
    return pq.read_table(p).to_pylist()
