"""The report stage of ``gfcr demo``: write the HTML report of the demo's store and print its path.

Imported by ``gfcr.train.demo`` (listed in its ``DEMO_EXTENSIONS``); registers itself just before
the summary, i.e. after training and after any stage (ROSS) registered before it, so the report
includes their audits.
"""

from __future__ import annotations

from typing import Any

from gfcr.train.demo import add_demo_stage


def report_stage(ctx: Any) -> None:
    """Write ``<run dir>/report.html`` from ``ctx.store_path`` (skipped with a note when no store)."""
    from gfcr.diagnose.report import write_report
    from gfcr.store import RolloutStore

    if ctx.store_path is None or ctx.run_dir is None:
        ctx.console.print("report: no store from the train stage; skipped")
        return
    store = RolloutStore.open(ctx.store_path)
    path = write_report(store, ctx.run_dir / "report.html", overwrite=True)
    ctx.outputs["report"] = path
    ctx.console.print(f"report: {path.resolve()}")


add_demo_stage("report", report_stage)
