"""The ROSS LLM judge run for real: the default model (SmolLM2-135M-Instruct) served by ``gfcr serve`` on
127.0.0.1 audits verified rollouts of the same model, through the whole protocol: numbered units, JSON
verdicts validated and retried with the error fed back, the independent re-check, concurrency, the
on-disk cache, cost accounting, and resume.

A 135M model is a weak judge: the point is the path, not the verdicts. The run records what a user
would need to size a real one: calls, tokens, seconds, audits per minute, how many verdicts parsed, how
many rollouts ended kept / discarded / error and why, then what a second pass of the same judge version
does (resume: rollouts with a kept / discarded audit are skipped; errors are retried, here from the
cache) and that a new judge version on the same requests is served from the cache (``cache_failures``
on, so that a weak judge's invalid answers are cached too).

    python bench/ross_llm_judge_run.py --prompts 12 --k 4 --out bench/out/ross_llm_judge.json

Stages (each timed): generate (hf engine, arith level 1) -> verify (numeric, lenient) -> serve the judge
-> audit (pass 1) -> audit again (resume) -> audit as a new version (cache).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_health(url: str, proc: subprocess.Popen, timeout_s: float = 600.0) -> float:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"gfcr serve exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return time.perf_counter() - t0
        except OSError:
            time.sleep(1.0)
    raise TimeoutError("gfcr serve did not answer /health")


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=192, help="the judge's answer budget")
    ap.add_argument("--limit", type=int, default=8, help="verified rollouts audited")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()

    from gfcr.filters.apply import reverify_store
    from gfcr.filters.judge import JudgeConfig
    from gfcr.filters.verifiers import get_verifier
    from gfcr.generate.config import GenerateConfig
    from gfcr.generate.run import run_generate
    from gfcr.models import resolve_model
    from gfcr.ross.audit import audit_rollouts, select_rollouts
    from gfcr.ross.judges import make_judge
    from gfcr.store import RolloutStore

    out: dict = {"load_start": _load(), "args": vars(a) | {"out": str(a.out)}}
    work = Path(tempfile.mkdtemp(prefix="gfcr-llm-judge-"))
    model = resolve_model("default")
    t = time.perf_counter()
    store = RolloutStore.open(work / "store", create=True)
    cfg = GenerateConfig.model_validate({
        "store": str(work / "store"), "seed": 0, "batch_prompts": 16,
        "tasks": {"name": "arith", "params": {"n": a.prompts, "level": 1, "split": "train"}},
        "engine": {"name": "hf", "model": model, "args": {"device": "cpu", "max_batch": 32}},
        "topology": {"name": "group", "k": a.k}, "sampling": {"temperature": 0.7, "max_tokens": 96}})
    run_generate(cfg, progress=False)
    out["generate_s"] = round(time.perf_counter() - t, 1)
    t = time.perf_counter()
    v = reverify_store(store, get_verifier("numeric", lenient_fallback=True))
    out["verify"] = {"s": round(time.perf_counter() - t, 1), **{k: v[k] for k in v if isinstance(v[k], int | float)}}
    rollouts = select_rollouts(store, limit=a.limit)
    out["selected"] = len(rollouts)

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    serve = subprocess.Popen([sys.executable, "-m", "gfcr", "serve", "--model", model, "--port", str(port),
                              "--host", "127.0.0.1", "--name", "gfcr"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        out["serve_start_s"] = round(_wait_health(base, serve), 1)
        cache = work / "judge-cache"
        passes = []
        for name, version in (("audit", "bench-1"), ("resume", "bench-1"), ("cache", "bench-2")):
            llm = JudgeConfig(base_url=base + "/v1", model="gfcr", max_tokens=a.max_tokens, timeout_s=600.0,
                              cache_dir=str(cache), cache_failures=True)
            judge = make_judge("llm", llm=llm, version=version, recheck=True)
            t, c = time.perf_counter(), time.process_time()
            s = audit_rollouts(store, rollouts, judge, tok, retries=2, concurrency=a.concurrency)
            wall = time.perf_counter() - t
            passes.append({"pass": name, "wall_s": round(wall, 1), "client_cpu_s": round(time.process_time() - c, 1),
                           "load": _load(), **s.to_dict(),
                           "audits_per_min": round(60 * s.audited / wall, 2) if s.audited else 0.0})
            print(json.dumps(passes[-1]), flush=True)
            if a.out is not None:  # what is done so far survives a time-out
                a.out.parent.mkdir(parents=True, exist_ok=True)
                a.out.write_text(json.dumps(out | {"passes": passes}, indent=2, default=str) + "\n")
        out["passes"] = passes
        audits = store.audits(judge_version="bench-1").to_pylist()
        out["valid_verdicts"] = sum(1 for x in audits if not str(x.get("reason") or "").startswith("invalid judge output"))
        out["audits_stored"] = len(audits)
    finally:
        serve.terminate()
        try:
            serve.wait(timeout=60)
        except subprocess.TimeoutExpired:
            serve.kill()
    out["load_end"] = _load()
    text = json.dumps(out, indent=2, default=str)
    print(text)
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
