"""A tour of the store on bundled sample dumps: import three frameworks' formats, print per-step
stats, and answer a question with SQL. ``gfcr store walkthrough`` runs it."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from rich.console import Console

from gfcr.store import RolloutStore
from gfcr.store import samples as S
from gfcr.store.importers import import_rollouts


def run_walkthrough(path: Path | None = None, console: Console | None = None) -> RolloutStore:
    con = console or Console()
    path = Path(path) if path else Path("runs") / f"walkthrough-{time.strftime('%Y%m%d-%H%M%S')}"
    store = RolloutStore.open(path, create=True)
    con.rule("gfcr store walkthrough")
    con.print(f"store: {store.path}")
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        dumps = [
            ("verl", S.write_verl(t / "verl"), "run-verl"),
            ("trl", S.write_trl(t / "trl"), "run-trl"),
            ("prime-rl", S.write_prime_rl(t / "prime"), "run-prime"),
            ("roll", S.write_roll(t / "roll"), "run-roll"),
        ]
        opts = {"trl": {"reward_columns": ["accuracy_reward", "format_reward"]}}
        for fmt, p, run in dumps:
            res = import_rollouts(store, fmt, [str(p)], run_id=run, **opts.get(fmt, {}))
            con.print(f"  imported {len(res.rollouts):3d} rollouts from a {fmt} dump (tokens: {res.tokens_source})")
    from gfcr.store.cli import print_rows

    print_rows(store.stats(), title="per run and step")
    q = ("SELECT run_id, count(*) AS rollouts, avg(reward) AS mean_reward, "
         "sum(CASE WHEN tokens_source = 'engine' THEN 1 ELSE 0 END) AS token_faithful "
         "FROM rollouts GROUP BY run_id ORDER BY run_id")
    con.print(f"\nSQL> {q}")
    print_rows(store.sql(q).to_pylist())
    s = store.sample(3, seed=0, columns=["rollout_id", "run_id", "reward"])
    con.print(f"\n3 random rollouts: {s.column('rollout_id').to_pylist()}")
    con.print(f"versions: {[v['version'] for v in store.versions()]} — `gfcr store versions {store.path}`")
    return store
