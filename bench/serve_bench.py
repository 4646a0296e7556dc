"""Benchmark (not a test): ``gfcr serve`` with dynamic batching off vs on, side by side in one run.

    .venv/bin/python bench/serve_bench.py [--clients 16] [--max-tokens 32] [--wait-ms 20] [--threads 0]
        [--rounds 2] [--seeded-check] [--out bench/out/serve_bench.json]
    .venv/bin/python bench/serve_bench.py --part window --wait-ms 10 --rounds 3   # bench/out/serve_window.json

On the default model (SmolLM2-135M-Instruct, fp32, CPU) one hf engine is served on loopback,
alternately (``--rounds`` pairs, medians reported):
``--batch-wait-ms 0`` (one request per engine call, the old behaviour) and ``--batch-wait-ms WAIT``
(concurrent requests share calls). Each time, ``clients`` concurrent clients (the openai engine with
``max_concurrency = clients``) ask for 1 greedy sample of ``max_tokens`` tokens on distinct prompts.
Reports generated tokens/s, engine calls, and the ratio on/off; checks that both runs return the
same tokens. ``--seeded-check`` adds two seeded (temperature 1) runs, alone (``--no-batch-seeded``) vs batched (the default),
and counts samples whose tokens differ (the float-rounding caveat of batching seeded requests).

``--part window``: the batching window's rule, batching on in both arms: a fixed window of ``--wait-ms``
from the oldest request (``stretch=1``) against the quiet-gap rule (the window closes ``--wait-ms`` after
the latest arrival, at most ``--stretch`` x the wait; several values give several arms), alternated
(the order rotating each round); reports engine calls per burst, the
burst's spread (first to last arrival at the batcher), tokens/s, CPU seconds beside wall seconds, and
the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path


class _Counting:
    """Delegates to an engine; counts generate calls and rows."""

    def __init__(self, inner):
        self.inner = inner
        self.calls = 0
        self.rows: list[int] = []
        self.call_s: list[float] = []

    def __getattr__(self, k):
        return getattr(self.inner, k)

    def generate(self, reqs):
        self.calls += 1
        self.rows.append(sum(r.params.n for r in reqs))
        t0 = time.perf_counter()
        out = self.inner.generate(reqs)
        self.call_s.append(round(time.perf_counter() - t0, 2))
        return out


_ARRIVALS: list[float] = []  # when each job reached the batcher (monotonic s), for the burst's spread


def _record_arrivals() -> None:
    """Make every Batcher note when each job is submitted (the spread of a burst as the server sees it)."""
    from gfcr.serve import batching

    if getattr(batching.Batcher.submit, "_bench", False):
        return
    real = batching.Batcher.submit

    def submit(self, reqs, cancel=None):
        _ARRIVALS.append(time.monotonic())
        return real(self, reqs, cancel)

    submit._bench = True
    batching.Batcher.submit = submit


def _run(engine, prompts, params, wait_ms: float, max_batch: int, batch_seeded: bool = False,
         stretch: float | None = None, warm: bool = False) -> dict:
    from gfcr.generate.engines import GenRequest
    from gfcr.generate.engines.openai import OpenAIEngine
    from gfcr.serve import serve_in_thread

    _record_arrivals()
    counted = _Counting(engine)
    rule = {} if stretch is None else {"batch_stretch": stretch}  # None: the server's default rule
    with serve_in_thread(counted, model_name="bench", batch_wait_ms=wait_ms, max_batch=max_batch,
                         batch_seeded=batch_seeded, **rule) as url:
        client = OpenAIEngine(url, "bench", max_concurrency=len(prompts), max_retries=0, timeout_s=1800)
        n_warm = len(prompts) if warm else 1  # warm: one open connection per client, as a client that has sent before
        client.generate([GenRequest(prompt_ids=p, params=params[0].model_copy(update={"max_tokens": 2})) for p in prompts[:n_warm]])
        counted.calls, counted.rows, counted.call_s = 0, [], []
        _ARRIVALS.clear()
        reqs = [GenRequest(prompt_ids=p, params=sp) for p, sp in zip(prompts, params, strict=True)]
        load0 = os.getloadavg()[0]
        t0, c0 = time.perf_counter(), time.process_time()
        res = client.generate(reqs)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        client.close()
    toks = [r[0].token_ids.tolist() for r in res]
    n = sum(len(t) for t in toks)
    return {"wait_ms": wait_ms, "batch_seeded": batch_seeded, "stretch": stretch, "seconds": round(dt, 2),
            "cpu_seconds": round(cpu, 2), "load_1min": [round(load0, 2), round(os.getloadavg()[0], 2)], "tokens": n,
            "tokens_per_s": round(n / dt, 2), "arrival_spread_ms": round(1000 * (max(_ARRIVALS) - min(_ARRIVALS)), 1),
            "arrivals_ms": [round(1000 * (t - min(_ARRIVALS)), 1) for t in sorted(_ARRIVALS)],
            "engine_calls": counted.calls, "rows_per_call": counted.rows, "call_seconds": counted.call_s,
            "_tokens": toks}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="HF dir (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--wait-ms", type=float, default=20.0, help="--batch-wait-ms of the batching run")
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    ap.add_argument("--rounds", type=int, default=2, help="off/on pairs, alternated; medians are reported")
    ap.add_argument("--seeded-check", action="store_true", help="also compare seeded samples alone vs batched")
    ap.add_argument("--part", choices=["onoff", "window"], default="onoff")
    ap.add_argument("--warm", action="store_true",
                    help="--part window: open every client connection before the burst (else only one is open)")
    ap.add_argument("--stretch", type=float, nargs="+", default=[4.0],
                    help="--part window: the quiet-gap arms' caps, x the wait (one arm each)")
    ap.add_argument("--out", default=None, help="default bench/out/serve_bench.json (window: serve_window.json)")
    a = ap.parse_args()
    a.out = a.out or ("bench/out/serve_window.json" if a.part == "window" else "bench/out/serve_bench.json")

    import torch

    from gfcr.generate.engines import SamplingParams
    from gfcr.generate.engines.hf import HFEngine

    if a.threads:
        torch.set_num_threads(a.threads)
    engine = HFEngine(a.model, max_batch=a.max_batch)
    prompts = [engine.encode_messages([{"role": "user", "content": f"What is {7 * i + 3} + {11 * i + 5}? Explain briefly."}])
               for i in range(a.clients)]
    greedy = [SamplingParams(temperature=0.0, max_tokens=a.max_tokens)] * a.clients
    if a.part == "window":
        return _window(a, engine, prompts, greedy)
    runs: dict[str, list[dict]] = {"off": [], "on": []}
    for r in range(a.rounds):  # alternated, so load from other processes hits both modes alike
        for mode, wait in (("off", 0.0), ("on", a.wait_ms)):
            x = _run(engine, prompts, greedy, wait, a.max_batch)
            runs[mode].append(x)
            print(f"round {r} {mode:3s}: {x['tokens']} tokens in {x['seconds']} s = {x['tokens_per_s']} tok/s, "
                  f"{x['engine_calls']} engine calls of {x['rows_per_call']} rows taking {x['call_seconds']} s", flush=True)
    med = {m: statistics.median(x["tokens_per_s"] for x in xs) for m, xs in runs.items()}
    same = sum(x == y for x, y in zip(runs["off"][0]["_tokens"], runs["on"][0]["_tokens"], strict=True))
    out = {"model": engine.model_name, "clients": a.clients, "max_tokens": a.max_tokens, "wait_ms": a.wait_ms,
           "torch_threads": torch.get_num_threads(), "rounds": a.rounds,
           "off_tokens_per_s": round(med["off"], 2), "on_tokens_per_s": round(med["on"], 2),
           "ratio_tokens_per_s": round(med["on"] / med["off"], 2),
           "greedy_same_tokens": f"{same}/{a.clients}",
           "runs": {m: [{k: v for k, v in x.items() if k != "_tokens"} for x in xs] for m, xs in runs.items()}}
    print(f"median tok/s off {out['off_tokens_per_s']}, on {out['on_tokens_per_s']}: ratio on/off "
          f"{out['ratio_tokens_per_s']}x; greedy answers identical off vs on: {out['greedy_same_tokens']}")
    if a.seeded_check:
        seeded = [SamplingParams(temperature=1.0, max_tokens=a.max_tokens, seed=1000 + i) for i in range(a.clients)]
        alone = _run(engine, prompts, seeded, a.wait_ms, a.max_batch)  # batch_seeded=False: each job alone
        shared = _run(engine, prompts, seeded, a.wait_ms, a.max_batch, batch_seeded=True)
        same_s = sum(x == y for x, y in zip(alone["_tokens"], shared["_tokens"], strict=True))
        out |= {"seeded_same_tokens": f"{same_s}/{a.clients}",
                "ratio_seeded_batched_vs_alone": round(shared["tokens_per_s"] / alone["tokens_per_s"], 2),
                "seeded_runs": [{k: v for k, v in x.items() if k != "_tokens"} for x in (alone, shared)]}
        print(f"seeded alone: {alone['tokens_per_s']} tok/s ({alone['engine_calls']} calls); batched: "
              f"{shared['tokens_per_s']} tok/s ({shared['engine_calls']} calls); same tokens {same_s}/{a.clients}")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {a.out}")


def _window(a, engine, prompts, greedy) -> None:
    """Fixed window vs quiet-gap window, batching on in both, alternated (see the module docstring)."""
    arms = [("fixed", 1.0)] + [(f"gap x{k:g}", k) for k in a.stretch]
    runs: dict[str, list[dict]] = {m: [] for m, _ in arms}
    for r in range(a.rounds):
        for mode, stretch in arms[r % len(arms):] + arms[: r % len(arms)]:  # the order rotates
            x = _run(engine, prompts, greedy, a.wait_ms, a.max_batch, stretch=stretch, warm=a.warm)
            runs[mode].append(x)
            print(f"round {r} {mode:8s}: {x['tokens_per_s']} tok/s, wall {x['seconds']} s, cpu {x['cpu_seconds']} s, "
                  f"{x['engine_calls']} calls {x['rows_per_call']}, arrivals (ms) {x['arrivals_ms']}, "
                  f"load {x['load_1min']}", flush=True)
    med = {m: {k: statistics.median(x[k] for x in xs) for k in ("tokens_per_s", "seconds", "cpu_seconds", "engine_calls", "arrival_spread_ms")}
           for m, xs in runs.items()}
    gap = arms[1][0]
    same = sum(x == y for x, y in zip(runs["fixed"][0]["_tokens"], runs[gap][0]["_tokens"], strict=True))
    out = {"model": engine.model_name, "clients": a.clients, "max_tokens": a.max_tokens, "wait_ms": a.wait_ms,
           "stretch": a.stretch, "warm": a.warm, "rounds": a.rounds, "medians": med, "greedy_same_tokens": f"{same}/{a.clients}",
           "ratio_tokens_per_s": {m: round(med[m]["tokens_per_s"] / med["fixed"]["tokens_per_s"], 2) for m, _ in arms[1:]},
           "runs": {m: [{k: v for k, v in x.items() if k != "_tokens"} for x in xs] for m, xs in runs.items()}}
    print(json.dumps({k: out[k] for k in ("medians", "ratio_tokens_per_s", "greedy_same_tokens")}))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
