"""Benchmark (not a test): `gfcr store export-sft` per format against the store's own Parquet export.

    .venv/bin/python bench/sft_export_bench.py [--n 5000]

Builds a store of ``n`` synthetic rollouts (128 context + 384 generated tokens, 10 per prompt), then
times ``export --to parquet`` (the baseline) and ``export_sft`` in each format on the same rows, side
by side, best of 3. Writes ``bench/out/sft_export_bench.json``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5000)
    args = ap.parse_args()

    from gfcr.formats.export import export
    from gfcr.formats.sft_export import SFT_FORMATS, export_sft
    from gfcr.store import RolloutStore
    from gfcr.testing import make_rollout

    tmp = Path(tempfile.mkdtemp(prefix="gfcr-sftx-"))
    st = RolloutStore.open(tmp / "store", create=True)
    st.append([make_rollout(i, prompt=f"p{i % (args.n // 10)}", n_ctx=128, n_gen=384) for i in range(args.n)])

    def best_of(fn, reps: int = 3) -> float:
        best = float("inf")
        for k in range(reps):
            t0 = time.perf_counter()
            fn(k)
            best = min(best, time.perf_counter() - t0)
        return best

    out: dict[str, dict[str, float]] = {}
    base = best_of(lambda k: export(st, "parquet", tmp / f"base{k}.parquet"))
    out["export_parquet"] = {"seconds": round(base, 3), "ratio": 1.0}
    for fmt in SFT_FORMATS:
        t = best_of(lambda k, fmt=fmt: export_sft(st, tmp / f"{fmt}{k}.parquet", fmt, dedup=False))
        out[fmt] = {"seconds": round(t, 3), "ratio": round(t / base, 2), "rollouts_per_s": round(args.n / t)}
    Path("bench/out").mkdir(parents=True, exist_ok=True)
    Path("bench/out/sft_export_bench.json").write_text(json.dumps(out, indent=1))
    print(f"{args.n} rollouts x 512 tokens")
    for k, v in out.items():
        print(f"  {k:18s} {v['seconds']:.3f} s  {v['ratio']:.2f}x baseline")


if __name__ == "__main__":
    main()
