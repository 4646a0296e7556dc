"""Verification throughput on Ray (gfcr.scale.ray_verify) at 1 and 2 workers vs in-process verify_many;
with ``--import-rows``, import throughput of ``gfcr scale import`` (gfcr.scale.ray_import) instead.

Run: .venv/bin/python bench/scale_bench.py [--n 1000] [--repeat 2] [--verifier math] [--out bench/out/scale.json]
     .venv/bin/python bench/scale_bench.py --import-rows 40000 [--import-files 8] [--rounds 3]

Import arms (``--import-rows``), alternated every round (order rotating), each into a new local store,
on a verl dump of ``--import-files`` files (``bench/import_bench.py``'s ``write_dump``): ``store import``
(:func:`gfcr.formats.import_rollouts` in this process: what ``gfcr store import`` runs) and
``scale import`` at 1 and 2 workers (Ray tasks that stage their share of the files, one commit by
this process; the local Ray cluster is started once, before, and timed apart). Per arm, medians:
wall s, rows/s, this process's CPU s and the import workers' CPU s beside the wall; load average
at each sample.

All rows are measured in the same run, side by side (best of ``--repeat``), on the same rollouts in a fresh store. The
in-process baseline is ``verify_many(workers=1)`` (its math-verify worker warmed first); each
``ray_verify`` call includes what a call costs: starting its actors, their math-verify worker's
cold start, reading the store, sending chunks (no write: ``write=False``). The marginal rate
``n / (t(2n) - t(n))`` removes the fixed start-up and shows the steady-state throughput. Ratios
are to the in-process baseline. Starting the local Ray cluster is timed separately.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path

from gfcr.filters import verify_many
from gfcr.filters.verifiers import get_verifier
from gfcr.records import Message, Prompt, Rollout
from gfcr.scale import init_ray, ray_verify
from gfcr.store import RolloutStore


def workload(n: int, seed: int = 0) -> tuple[list[Rollout], list[Prompt]]:
    """``n`` fraction answers, about 60% equivalent to the gold in another form."""
    rng = random.Random(seed)
    rollouts, prompts = [], []
    for i in range(n):
        a, b = rng.randint(1, 60), rng.randint(2, 60)
        prompts.append(Prompt(prompt_id=f"q{i}", task="math", messages=[Message("user", f"{a}/{b}?")],
                              answer=f"\\frac{{{a}}}{{{b}}}"))
        m = rng.randint(2, 4)
        pred = f"\\frac{{{a * m}}}{{{b * m}}}" if rng.random() < 0.6 else f"{a / b + 0.25:.3f}"
        rollouts.append(Rollout(run_id="bench", prompt_id=f"q{i}", task="math", token_ids=[1, 2], token_role=[0, 1],
                                logprobs=[0.0, -0.1], messages=[Message("user", "q"),
                                                                Message("assistant", f"Work.\nAnswer: {pred}")]))
    return rollouts, prompts


def timed(fn, repeat: int = 1) -> tuple[float, object]:
    """Best wall time of ``repeat`` calls, and the last result."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def import_arms(args: argparse.Namespace) -> None:
    """The ``--import-rows`` benchmark (module docstring)."""
    import statistics
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from import_bench import write_dump

    from gfcr.formats import import_rollouts
    from gfcr.scale.importing import ray_import

    samples: dict[str, list[dict]] = {"store import": [], "scale import, 1 worker": [], "scale import, 2 workers": []}
    with tempfile.TemporaryDirectory() as tmp:
        srv = None
        if args.import_s3:  # (before Ray starts: its workers inherit the endpoint's environment variables)
            from s3_bench import BUCKET, Server

            srv = Server(Path(tmp) / "requests.log")
        dump = Path(tmp) / "dump"
        size = write_dump(dump, args.import_rows, args.import_files)
        t_init, _ = timed(lambda: init_ray(num_cpus=os.cpu_count()))

        def where(tag: str) -> str:
            return f"s3://{BUCKET}/{tag}" if srv is not None else str(Path(tmp) / tag)

        ray_import(RolloutStore.open(where("warm"), create=True), "verl", [str(dump)], workers=2)  # warm workers

        def run(name: str, k: int) -> dict:
            st = RolloutStore.open(where(f"s{k}-{names.index(name)}"), create=True)  # a new store per sample
            load = os.getloadavg()[0]
            c0, t0 = time.process_time(), time.perf_counter()
            if name == "store import":
                n, workers_cpu = import_rollouts(st, "verl", [str(dump)]).written, 0.0
            else:
                out = ray_import(st, "verl", [str(dump)], workers=1 if "1 worker" in name else 2)
                n, workers_cpu = out["written"], sum(out["worker_cpu_s"])
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            assert n == args.import_rows == st.count(), (n, st.count())
            return {"wall_s": wall, "rows_per_s": n / wall, "driver_cpu_s": cpu, "workers_cpu_s": workers_cpu, "load": load}

        names = list(samples)
        for r in range(args.rounds):
            for k in range(len(names)):
                name = names[(r + k) % len(names)]
                samples[name].append(run(name, r))
                print(name, {k: round(v, 2) for k, v in samples[name][-1].items()})
        if srv is not None:
            srv.stop()
    out = {"backend": "s3 (loopback moto)" if args.import_s3 else "local", "rows": args.import_rows, "files": args.import_files, "dump_mb": round(size / 1e6, 1), "rounds": args.rounds,
           "cpus": os.cpu_count(), "ray_init_s": round(t_init, 1), "arms": {}}
    for name, xs in samples.items():
        out["arms"][name] = {k: round(statistics.median(x[k] for x in xs), 3) for k in xs[0]}
        out["arms"][name]["load_max"] = round(max(x["load"] for x in xs), 2)
    print(json.dumps(out, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--import-rows", type=int, default=0, help="Run the import benchmark on a dump of this many rows.")
    ap.add_argument("--import-files", type=int, default=8, help="Files of that dump.")
    ap.add_argument("--rounds", type=int, default=3, help="Import benchmark: samples per arm (alternated).")
    ap.add_argument("--import-s3", action="store_true", help="Import benchmark: into stores on a loopback S3 server.")
    ap.add_argument("--n", type=int, default=1000, help="Rollouts in the small set (the large one has 2n).")
    ap.add_argument("--verifier", default="math")
    ap.add_argument("--chunk-size", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=2, help="Best of this many runs per cell.")
    ap.add_argument("--out", default="bench/out/scale.json")
    args = ap.parse_args()
    if args.import_rows:
        import_arms(args)
        return

    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        stores = {}
        for n in (args.n, 2 * args.n):
            rs, ps = workload(n)
            st = RolloutStore.open(Path(tmp) / f"s{n}", create=True)
            st.upsert_prompts(ps)
            st.append(rs)
            stores[n] = (st, ps)
        v = get_verifier(args.verifier)
        v.prepare(1)
        verify_many(workload(4)[0], v, workload(4)[1])  # warm the in-process math-verify worker
        t_init, _ = timed(lambda: init_ray(num_cpus=os.cpu_count()))
        base = {}
        for n, (st, ps) in stores.items():
            def local(st=st, ps=ps):
                return verify_many(st.rollouts(), v, ps, workers=1)
            base[n], _ = timed(local, args.repeat)
        rows.append({"what": "in-process verify_many, 1 worker", "t_n": base[args.n], "t_2n": base[2 * args.n]})
        for w in (1, 2):
            t = {}
            for n, (st, _) in stores.items():
                t[n], out = timed(lambda st=st, w=w: ray_verify(st, args.verifier, workers=w, chunk_size=args.chunk_size,
                                                              write=False), args.repeat)
            rows.append({"what": f"ray_verify, {w} worker(s)", "t_n": t[args.n], "t_2n": t[2 * args.n]})
    n = args.n
    for r in rows:
        r["rate_n"] = n / r["t_n"]
        r["rate_2n"] = 2 * n / r["t_2n"]
        d = r["t_2n"] - r["t_n"]
        r["marginal_rate"] = n / d if d > 0.05 * r["t_n"] else float("nan")  # nan: lost in the noise
    b = rows[0]
    for r in rows:
        r["ratio_2n"] = r["rate_2n"] / b["rate_2n"]
        r["ratio_marginal"] = r["marginal_rate"] / b["marginal_rate"]
    load = os.getloadavg()
    print(f"ray.init (local, {os.cpu_count()} CPUs): {t_init:.1f} s; load average {load[0]:.1f}; n = {n} / {2 * n}")
    print(f"{'what':36s} {'t(n) s':>8s} {'t(2n) s':>8s} {'/s at 2n':>9s} {'marginal/s':>11s} {'x base 2n':>9s} {'x base marg':>11s}")
    for r in rows:
        print(f"{r['what']:36s} {r['t_n']:8.2f} {r['t_2n']:8.2f} {r['rate_2n']:9.1f} {r['marginal_rate']:11.1f} "
              f"{r['ratio_2n']:9.2f} {r['ratio_marginal']:11.2f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"n": n, "verifier": args.verifier, "ray_init_s": t_init, "load": load,
                                          "cpus": os.cpu_count(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
