"""The ROSS stage of ``gfcr demo`` (registered through ``gfcr.train.demo.add_demo_stage``).

After the demo's RL stage: audit the run's stored rollouts with the ``arith-steps`` judge, train
positive-rollout SFT and ROSS (one epoch each; three and more rows with ``--full``), evaluate them
next to base and upstream on held-out one-digit sums and print the table.
"""

from __future__ import annotations

from typing import Any

from gfcr.train.demo import DemoContext, add_demo_stage


def ross_stage(ctx: DemoContext) -> None:
    from gfcr.ross.pipeline import run_ross_demo

    if ctx.result is None or ctx.result.checkpoint is None or ctx.store_path is None:
        ctx.console.print("[ross] skipped: the train stage left no checkpoint or store")
        return
    def log(msg: Any) -> None:
        ctx.console.print(msg, markup=False)

    ev = getattr(ctx.cfg, "eval", None)
    max_tokens = min(48, ev.max_tokens) if ev is not None and ev.max_tokens else 48  # the demo's eval length
    res = run_ross_demo(
        store=ctx.store_path, upstream_model=str(ctx.result.checkpoint), base_model=ctx.model_path,
        out_dir=ctx.run_dir / "ross", n_eval=32 if ctx.full else 8, k=4 if ctx.full else 2,
        epochs=3 if ctx.full else 1, max_tokens=max_tokens,
        variants=("positive_sft", "ross_nomask", "ross") if ctx.full else ("positive_sft", "ross"), log=log,
    )
    ctx.outputs["ROSS table"] = res.run_dir / "table.md"


add_demo_stage("ross", ross_stage, after="train")
