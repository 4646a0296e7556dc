"""The same client checks against ``gfcr serve`` and a vLLM OpenAI server of the same model, with the
official ``openai`` client and httpx, on loopback; writes ``bench/out/serve_parity.json`` and the markdown
table of docs/generate.md ("Parity with vLLM") to ``bench/out/serve_parity.md``.

Usage (each server is started here, bound to 127.0.0.1, one after the other, and stopped)::

    python bench/serve_parity.py --model DIR [--vllm-python PATH] [--only gfcr|vllm]

``DIR``: an HF model folder (the default model converted by ``gfcr model pull``). vLLM runs as
``PATH -m vllm.entrypoints.openai.api_server --model DIR --dtype float32 --max-model-len 512
--enforce-eager`` (with ``--enable-auto-tool-choice --tool-call-parser hermes``, as gfcr serve runs with
``--tool-call-parser hermes``). Each check records what the server answered; the table shows both.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import openai

MSGS = [{"role": "user", "content": "What is 3 + 4?"}]
TOOLS = [{"type": "function", "function": {"name": "add", "description": "a + b", "parameters": {
    "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}}]
HISTORY = MSGS + [
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 3, "b": 4}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "7"},
]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def checks(root: str, model: str) -> dict[str, tuple[bool, str]]:
    """Run every check against the server at ``root`` (``http://127.0.0.1:PORT``); name → (ok, what it answered)."""
    c = openai.OpenAI(base_url=f"{root}/v1", api_key="none", max_retries=0, timeout=300)
    chat, cmpl = c.chat.completions.create, c.completions.create
    out: dict[str, tuple[bool, str]] = {}

    def run(name: str, fn: Any) -> None:
        try:
            ok, note = fn()
        except openai.APIStatusError as e:
            ok, note = False, f"HTTP {e.status_code}: {str(e.message)[:90]}"
        except Exception as e:  # noqa: BLE001 - recorded as the answer of that check
            ok, note = False, f"{type(e).__name__}: {str(e)[:90]}"
        out[name] = (ok, note)
        print(f"  {name}: {'pass' if ok else 'FAIL'} ({note})", flush=True)

    base = dict(model=model, messages=MSGS, max_tokens=8, temperature=0)
    run("tool-call history answered", lambda: (chat(**base | {"messages": HISTORY}).choices[0].message.role
                                               == "assistant", "200"))
    run("tools + tool_choice none", lambda: (chat(**base, tools=TOOLS, tool_choice="none") is not None, "200"))

    def auto():
        r = chat(**base, tools=TOOLS)
        ch = r.choices[0]
        return True, f"200, finish {ch.finish_reason}, tool_calls {len(ch.message.tool_calls or [])}"

    run("tools, tool_choice auto (hermes parser)", auto)

    def ignore_eos():
        r = chat(**base | {"max_tokens": 12}, extra_body={"ignore_eos": True})
        return r.usage.completion_tokens == 12, f"{r.usage.completion_tokens} tokens, {r.choices[0].finish_reason}"

    run("ignore_eos: max_tokens reached", ignore_eos)

    def min_tokens():
        short = chat(**base | {"max_tokens": 40, "logit_bias": {"2": 100}})
        r = chat(**base | {"max_tokens": 40, "logit_bias": {"2": 100}}, extra_body={"min_tokens": 6})
        n0, n = short.usage.completion_tokens, r.usage.completion_tokens
        return n >= 6 > n0, f"{n0} tokens without, {n} with min_tokens 6"

    run("min_tokens: no stop before it", min_tokens)

    def rep():
        p = dict(prompt="1 2 3 1 2 3 1 2 3 1 2", max_tokens=16, temperature=0, model=model)
        a, b = cmpl(**p).choices[0].text, cmpl(**p, extra_body={"repetition_penalty": 1.8}).choices[0].text
        return a != b, f"{a[:20]!r} -> {b[:20]!r}"

    run("repetition_penalty changes greedy text", rep)

    def min_p():
        p = dict(prompt="Once upon a time", max_tokens=24, temperature=1.5, seed=5, model=model)
        a, b = cmpl(**p).choices[0].text, cmpl(**p, extra_body={"min_p": 0.3}).choices[0].text
        return a != b, f"{a[:20]!r} -> {b[:20]!r}"

    run("min_p changes seeded text", min_p)

    def stop_str():
        p = dict(prompt="Count: 1, 2, 3,", max_tokens=24, temperature=0, model=model)
        text = cmpl(**p).choices[0].text
        s = text.strip()[:2] or text[:2]
        kept = cmpl(**p, stop=[s], extra_body={"include_stop_str_in_output": True}).choices[0].text
        cut = cmpl(**p, stop=[s]).choices[0].text
        return kept.endswith(s) and not cut.endswith(s), f"stop {s!r}: {cut!r} / {kept!r}"

    run("include_stop_str_in_output", stop_str)

    def tmpl():
        a = chat(**base | {"max_tokens": 1}).usage.prompt_tokens
        b = chat(**base | {"max_tokens": 1}, extra_body={"add_generation_prompt": False}).usage.prompt_tokens
        k = chat(**base | {"max_tokens": 1}, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        cont = chat(**base | {"max_tokens": 4, "messages": MSGS + [{"role": "assistant", "content": "The answer is"}]},
                    extra_body={"add_generation_prompt": False, "continue_final_message": True})
        return b < a and k is not None and cont is not None, f"prompt {a} tokens, {b} without generation prompt"

    run("add_generation_prompt / continue_final_message / chat_template_kwargs", tmpl)
    run("metadata, store, service_tier, user accepted",
        lambda: (chat(**base, metadata={"k": "v"}, store=False, service_tier="auto", user="u") is not None, "200"))
    def unknown():  # passes when the server refuses an unknown field (gfcr's rule; vLLM ignores them)
        try:
            chat(**base, extra_body={"frobnicate": 1})
        except openai.BadRequestError as e:
            return "frobnicate" in str(e), "400 naming the field"
        return False, "200 (ignored)"

    run("unknown field refused (400)", unknown)

    def seeded():
        p = dict(model=model, messages=MSGS, max_tokens=16, temperature=1.0, seed=11)
        return chat(**p).choices[0].message.content == chat(**p).choices[0].message.content, "same text twice"

    run("same seed, same text", seeded)

    def tokenize():
        t = httpx.post(f"{root}/tokenize", json={"model": model, "prompt": "Hello world"}, timeout=60).json()
        d = httpx.post(f"{root}/detokenize", json={"model": model, "tokens": t["tokens"]}, timeout=60).json()
        m = httpx.post(f"{root}/tokenize", json={"model": model, "messages": MSGS}, timeout=60).json()
        used = chat(**base | {"max_tokens": 1}).usage.prompt_tokens
        ok = t["count"] == len(t["tokens"]) and "Hello world" in d["prompt"] and m["count"] == used
        return ok, f"count {t['count']}, max_model_len {t.get('max_model_len')}, chat prompt {m['count']} = {used}"

    run("/tokenize, /detokenize", tokenize)

    def small():
        v = httpx.get(f"{root}/version", timeout=30)
        p = httpx.get(f"{root}/ping", timeout=30)
        m = httpx.get(f"{root}/metrics", timeout=30)
        return (v.status_code == p.status_code == m.status_code == 200 and "version" in v.json()
                and "# TYPE" in m.text), f"version {v.json().get('version')}, metrics {len(m.text)} bytes"

    run("/version, /ping, /metrics", small)
    return out


def _wait(root: str, proc: subprocess.Popen, limit_s: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            if httpx.get(f"{root}/v1/models", timeout=5).status_code == 200:
                return time.monotonic() - t0
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError(f"no server at {root} after {limit_s} s")


def _served(cmd: list[str], port: int, log: Path, limit_s: float, model: str) -> dict[str, Any]:
    root = f"http://127.0.0.1:{port}"
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=dict(os.environ))
        try:
            started = _wait(root, proc, limit_s)
            print(f"{cmd[2]}: up after {started:.0f} s (load {os.getloadavg()[0]:.1f})", flush=True)
            return {"startup_s": round(started, 1), "checks": checks(root, model)}
        finally:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()


def table(res: dict[str, Any]) -> str:
    names = list(next(iter(r["checks"] for r in res.values() if "checks" in r)))
    cols = list(res)
    lines = ["| check | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for n in names:
        cells = []
        for c in cols:
            ok, note = res[c].get("checks", {}).get(n, (False, res[c].get("error", "not run")))
            cells.append(f"{'pass' if ok else '**no**'}: {note}".replace("|", "/"))
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--vllm-python", default=None)
    ap.add_argument("--only", choices=["gfcr", "vllm"], default=None)
    ap.add_argument("--startup-limit-s", type=float, default=600)
    ap.add_argument("--vllm-memory", type=float, default=0.15,
                    help="vLLM's --gpu-memory-utilization: on its CPU backend, the fraction of RAM it reserves")
    ap.add_argument("--merge", action="store_true", help="keep the other arm's results from the last run's json")
    a = ap.parse_args()
    out_dir = Path(__file__).parent / "out"
    out_dir.mkdir(exist_ok=True)
    name = "model"
    last = out_dir / "serve_parity.json"
    res: dict[str, Any] = json.loads(last.read_text()) if a.merge and last.exists() else {}
    arms = {"gfcr serve": [sys.executable, "-m", "gfcr", "serve", "--model", a.model, "--name", name,
                           "--tool-call-parser", "hermes", "--host", "127.0.0.1"],
            "vLLM": [a.vllm_python or sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", a.model,
                     "--served-model-name", name, "--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
                     "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--host", "127.0.0.1",
                     "--gpu-memory-utilization", str(a.vllm_memory)]}
    for arm, cmd in arms.items():
        if a.only and not arm.lower().startswith(a.only):
            continue
        port = _free_port()
        load0 = os.getloadavg()
        try:
            res[arm] = _served(cmd + ["--port", str(port)], port, out_dir / f"serve_parity_{arm.split()[0]}.log",
                               a.startup_limit_s, name)
        except (RuntimeError, TimeoutError) as e:
            res[arm] = {"error": str(e)}
            print(f"{arm}: {e}", flush=True)
        res[arm]["load"] = [round(x, 2) for x in load0 + os.getloadavg()]
    last.write_text(json.dumps(res, indent=1))
    md = table(res)
    (out_dir / "serve_parity.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
