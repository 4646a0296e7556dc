"""The README's commands work as a newcomer would type them.

The commands are read from README.md's ```bash blocks when the tests run (not copied here), so a
README edit is checked as soon as it lands. Every command needs a rule in :data:`RULES`:

* run here on tiny settings — the same command, in the same order, in one scratch folder, with a
  tiny random model in place of the default one and small sizes (the rule lists the added flags;
  ROSS gets a few solved rollouts added to the tiny RL run's store, which a random policy never
  produces);
  servers (``gfcr serve``, ``gfcr view``) are started, probed, and stopped;
* ``real`` — needs the real default model: runs in the slow set on the real model, as written plus
  the rule's size flags: fewer held-out prompts (``gfcr demo`` keeps its RL steps, per-step sizes and
  ROSS stage as they are; only its before/after evaluations run on 2 prompts per task, not 8 + 24);
* ``skip`` — only the installation lines and ``make test`` (which is this suite).

A rule's ``check`` asserts what the README's comment says the command prints (the walkthrough's
dumps, stats and SQL; the import's count; ``store check``'s ``ok:``; the eval's one line with a
non-zero greedy pass@1 on the real model).

A new README command without a rule fails :func:`test_every_readme_command_has_a_rule`.
The ```python blocks run after the bash blocks, against the store they made; the live-capture block
(the one that imports ``trl``) runs on its own, :func:`test_readme_live_trl_block_records_a_run`,
with TRL's real ``GRPOTrainer`` on a tiny random model in place of the named one.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GFCR = [sys.executable, "-m", "gfcr.cli"]


def readme_blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), re.S)


def is_live_block(block: str) -> bool:
    """The README's live-capture snippet: a python block that trains with TRL."""
    return re.search(r"^from trl import", block, re.M) is not None


def readme_commands() -> list[list[list[str]]]:
    """Each README bash line as its simple commands (``a; b`` and ``a & b`` split), comments dropped."""
    lines = []
    for block in readme_blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            lex = shlex.shlex(line, posix=True, punctuation_chars=";&|<>")
            lex.whitespace_split = True
            lex.commenters = "#"
            toks = list(lex)
            if not toks:
                continue
            cmds: list[list[str]] = [[]]
            for t in toks:
                if t in (";", "&", "&&"):
                    cmds.append([])
                else:
                    assert t not in ("|", ">", "<", ">>"), f"README line uses a pipe or redirection; teach the test: {line}"
                    cmds[-1].append(t)
            lines.append([c for c in cmds if c])
    return lines


def _key(argv: list[str]) -> str:
    """The rule key: the command and its subcommands (``gfcr store import``, ``make demo``)."""
    words = []
    for a in argv:
        if a.startswith("-") or "/" in a or "." in a or len(words) >= 3:
            break
        words.append(a)
    if words[:1] == ["gfcr"] and len(words) > 2 and words[1] not in ("store", "ross", "scale", "model"):
        words = words[:2]
    return " ".join(words)


def _tiny_train() -> list[str]:
    return ["--set", "model={tiny}", "--set", "steps=3", "--set", "generate.topology.params.k=2", "--set", "generate.prompts_per_step=2",
            "--set", "generate.max_tokens=6", "--set", "eval.before=false", "--set", "eval.after=false",
            "--set", "checkpoint.every=3", "--set", "tensorboard=false"]


#: rule key → ("skip" | "real", reason) or ("tiny", {"add": flags, "replace": {README word: tiny word}})
RULES: dict[str, tuple[str, object]] = {
    "make test": ("skip", "the test suite itself"),
    # the main job is the default model's: a random tiny policy solves nothing, and ROSS has nothing to relearn
    "make demo": ("real", {"why": "the main job on the default model (`gfcr demo`)", "add": "{demo_small_eval}"}),
    "pip install": ("skip", "installation: `make test` installs the same on every fresh CI machine"),
    # each README comment's claim, as the command prints it
    "gfcr store walkthrough": ("tiny", {"check": ["stdout_has:verl dump", "stdout_has:trl dump", "stdout_has:prime-rl dump",
                                                  "stdout_has:per run and step", "stdout_has:SQL>"]}),
    "gfcr store import": ("tiny", {"replace": {"path/to/rollout_data_dir": "{verl_dump}"},
                                   "check": "stdout_has:imported 24 new rollouts"}),
    "gfcr store query": ("tiny", {"check": "stdout_has:avg(reward)"}),
    "gfcr store export": ("tiny", {}),
    "gfcr store export-sft": ("tiny", {"check": "stdout_has:(messages;"}),
    "gfcr generate": ("tiny", {"add": ["--model", "{tiny}", "--n", "4", "--max-tokens", "8"], "check": "stdout_json"}),
    "gfcr verify": ("tiny", {}),
    "gfcr train": ("tiny", {"add": [*_tiny_train(), "--no-progress"]}),
    # served under the name the README's serve config asks for ('default', the real model's name)
    "gfcr serve": ("tiny", {"server": "/v1/models", "add": ["--model", "{tiny}", "--name", "default", "--port", "{port}"]}),
    "gfcr eval": ("real", {"why": "its point is the default model: pass@k of SmolLM2-135M on held-out arithmetic",
                           "add": ["--n", "4"]}),
    "gfcr ross run": ("tiny", {"add": ["--set", "base_model={tiny}", "--set", "train.epochs=1", "--set", "train.batch_size=4",
                                       "--set", "evaluate.benchmarks=[{name: arith-1d, source: arith, params: {level: 1}, n_prompts: 2}]",
                                       "--set", "evaluate.k=2", "--set", "evaluate.ks=[1,2]",
                                       "--set", "evaluate.max_tokens=6", "--set", "analyze.compatibility_prompts=2",
                                       "--set", "analyze.complementarity_prompts=2", "--set", "analyze.complementarity_k=2",
                                       "--set", "analyze.max_tokens=6", "--set", "window.steps=[0,3]"],
                               "replace": {"runs/RUN/checkpoints/step_000019": "runs/RUN/checkpoints/step_000002"},
                               "before": "add_solved_rollouts"}),
    "gfcr simulate": ("tiny", {}),
    "gfcr report": ("tiny", {"check": "stdout_has:report.html"}),
    "gfcr diagnose": ("tiny", {"check": "stdout_nonempty"}),  # findings and health lines, or "no finding, ..."
    "gfcr store index": ("tiny", {"check": "stdout_has:text index"}),
    "gfcr store check": ("tiny", {"check": "stdout_has:ok: runs/gen verified"}),
    "gfcr view": ("tiny", {"server": "/api/summary", "add": ["--port", "{port}"]}),
    "gfcr scale verify": ("tiny", {"replace": {"4": "1"}, "check": "stdout_json"}),
}
#: how a later command reaches a server the README starts in the background
SERVE_CONFIG = {"configs/arith-smollm2-serve.yaml": ["--set", "generate.engine.params.base_url=http://127.0.0.1:{port}/v1"]}


def _add_solved_rollouts(store_path: Path, tokenizer_dir: str, n: int = 6) -> None:
    """What a random tiny policy never produces: a few verified arithmetic rollouts (a slip, then the
    fix, so the arith-steps judge has something to exclude), in the run's store, for ROSS to relearn."""
    import numpy as np
    from transformers import AutoTokenizer

    from gfcr.records import Message, Prompt, Rollout
    from gfcr.store import RolloutStore

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    store = RolloutStore.open(store_path)
    run = store.scan(columns=["run_id"]).column("run_id")[0].as_py()
    rows, prompts = [], []
    for i in range(n):
        a, b = i + 2, 7
        q, text = f"What is {a} + {b}?", f"{a} + {b} = {a + b + 1}.\nOops. {a} + {b} = {a + b}.\nAnswer: {a + b}"
        chat = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        ctx = tok(chat, add_special_tokens=False)["input_ids"]
        gen = tok(text + "<|im_end|>", add_special_tokens=False)["input_ids"]
        rows.append(Rollout(run_id=run, prompt_id=f"solved-{i}", group_id=f"solved-{i}@{i % 4}", step=i % 4, task="arith",
                            token_ids=np.asarray(ctx + gen, np.int32), token_role=np.asarray([0] * len(ctx) + [1] * len(gen), np.uint8),
                            logprobs=np.asarray([0.0] * len(ctx) + [-0.5] * len(gen), np.float32),
                            messages=[Message("user", q), Message("assistant", text)], reward=1.0, verified=True,
                            finish_reason="stop"))
        prompts.append(Prompt(prompt_id=f"solved-{i}", task="arith", messages=[Message("user", q)], answer=str(a + b)))
    store.upsert_prompts(prompts)
    store.append(rows)


def test_every_readme_command_has_a_rule():
    keys = [_key(c) for line in readme_commands() for c in line]
    assert keys, "no bash commands found in README.md"
    missing = sorted({k for k in keys if k not in RULES})
    assert not missing, f"README commands without a rule in tests/test_readme.py: {missing}"
    unused = sorted(set(RULES) - set(keys))
    assert not unused, f"rules for commands no longer in README.md (remove them): {unused}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited with {proc.returncode}: {proc.stderr.read()[-2000:] if proc.stderr else ''}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:  # noqa: S310 - loopback only
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"server did not answer {url}")


def _argv(argv: list[str], rule: dict, subs: dict[str, str]) -> list[str]:
    if "argv" in rule:
        out = list(rule["argv"])
    else:
        out = []
        for a in argv:  # whole words, and longer keys (paths) inside a word too (``--set k=path``)
            for old, new in rule.get("replace", {}).items():
                a = new if a == old else (a.replace(old, new) if len(old) > 3 else a)
            out.append(a)
        out += list(rule.get("add", []))
        for cfg, extra in SERVE_CONFIG.items():
            if cfg in out:
                out += extra
    for k, v in subs.items():
        out = [a.replace("{" + k + "}", v) for a in out]
    if out[0] == "gfcr":
        out = [*GFCR, *out[1:]]
    return out


def _env(one_thread: bool = True) -> dict[str, str]:
    """The commands' environment; tiny settings run on one thread, the real model on what the
    machine has (as a user runs it), unless OMP_NUM_THREADS is already set."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    if one_thread:
        env.setdefault("OMP_NUM_THREADS", "1")
    env["COLUMNS"] = "80"
    return env


@pytest.mark.slow
def test_readme_commands_run_on_tiny_settings(tmp_path):
    """Every tiny-rule command in README order, in one folder, each exit code 0."""
    from gfcr.store.samples import write_verl
    from gfcr.testing import save_tiny

    work = tmp_path / "work"
    work.mkdir()
    shutil.copytree(ROOT / "configs", work / "configs")
    subs = {"tiny": save_tiny(str(tmp_path / "tiny")), "verl_dump": str(write_verl(tmp_path / "verl"))}
    servers: list[subprocess.Popen] = []
    ran = []
    trains = 0
    try:
        for line in readme_commands():
            for argv in line:
                kind, rule = RULES[_key(argv)]
                if kind != "tiny":
                    continue
                assert isinstance(rule, dict)
                if "server" in rule or any(c in argv for c in SERVE_CONFIG):
                    subs.setdefault("port", str(_free_port()))
                if _key(argv) == "gfcr train" and "--run-dir" not in argv:  # the first is the run ROSS reads
                    trains += 1
                    rule = {**rule, "add": [*rule.get("add", []), "--run-dir", "runs/RUN" if trains == 1 else f"runs/RUN-{trains}"]}
                if rule.get("before") == "add_solved_rollouts":
                    _add_solved_rollouts(work / "runs" / "RUN" / "store", subs["tiny"])
                cmd = _argv(argv, rule, subs)
                if "server" in rule:
                    p = subprocess.Popen(cmd, cwd=work, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                         text=True)
                    servers.append(p)
                    _wait(f"http://127.0.0.1:{subs['port']}{rule['server']}", p)
                    ran.append(" ".join(argv))
                    continue
                t0 = time.perf_counter()
                proc = subprocess.run(cmd, cwd=work, env=_env(), capture_output=True, text=True, timeout=600)
                print(f"{time.perf_counter() - t0:6.1f} s  {' '.join(argv)}")  # the cost of each, with -s
                assert proc.returncode == 0, f"README command failed: {' '.join(argv)}\n{proc.stderr[-3000:]}"
                checks = rule.get("check")
                for check in checks if isinstance(checks, list) else [checks] if checks else []:
                    if check == "stdout_json":
                        json.loads(proc.stdout)  # progress went to stderr, the summary alone to stdout
                    elif check == "stdout_nonempty":
                        assert proc.stdout.strip(), f"{' '.join(argv)} printed nothing"
                    elif check.startswith("stdout_has:"):
                        assert check.split(":", 1)[1] in " ".join(proc.stdout.split()), \
                            f"{' '.join(argv)}:\n{proc.stdout[-2000:]}"
                ran.append(" ".join(argv))
            for p in servers:
                p.terminate()
                p.wait(timeout=30)
            servers.clear()
            subs.pop("port", None)
    finally:
        for p in servers:
            p.kill()
    assert (work / "report.html").exists() and (work / "runs" / "RUN" / "store").exists()
    # the python blocks, against the stores the commands made (the live-capture block has its own test)
    for block in [b for b in readme_blocks("python") if not is_live_block(b)]:
        code = subprocess.run([sys.executable, "-c", block], cwd=work, env=_env(), capture_output=True, text=True,
                              timeout=300)
        assert code.returncode == 0, f"README python block failed:\n{block}\n{code.stderr[-3000:]}"


def _demo_small_eval(n_eval: int = 2) -> list[str]:
    """``gfcr demo`` with ``n_eval`` held-out prompts per task: its own task list, only ``n_eval`` changed."""
    from gfcr.demo import demo_config

    tasks = [{**t.model_dump(mode="json"), "n_eval": n_eval} for t in demo_config().tasks]
    return ["--set", "tasks=" + json.dumps(tasks)]


@pytest.mark.slow
@pytest.mark.timeout(900)  # ~5 min on one thread of a 2-core machine at load ~2; the suite's 600 s is per test
def test_readme_real_model_commands(tmp_path):
    """The commands marked ``real``, on the real default model (pulled if needed), with the rule's size
    flags: the demo's every stage runs, its RL steps and ROSS at their own sizes."""
    real = [argv for line in readme_commands() for argv in line if RULES[_key(argv)][0] == "real"]
    assert [_key(a) for a in real] == ["make demo", "gfcr eval"]
    for argv in real:
        rule = RULES[_key(argv)][1]
        assert isinstance(rule, dict)
        add = _demo_small_eval() if rule["add"] == "{demo_small_eval}" else list(rule["add"])
        cmd = [*GFCR, "demo", *add] if argv == ["make", "demo"] else [*GFCR, *argv[1:], *add]  # `make demo` = `gfcr demo`
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=tmp_path, env=_env(one_thread=False), capture_output=True, text=True, timeout=900)
        print(f"{time.perf_counter() - t0:6.1f} s  {' '.join(argv)}")
        assert proc.returncode == 0, f"README command failed: {' '.join(argv)}\n{proc.stderr[-3000:]}"
        if _key(argv) == "make demo":
            (run,) = (tmp_path / "runs").glob("demo-*")
            steps = [json.loads(ln)["step"] for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]
            from gfcr.demo import demo_config

            assert steps == list(range(demo_config().steps))  # the demo's own RL steps, all of them
            for name in ("eval_before.json", "eval_after.json"):
                assert json.loads((run / name).read_text())["n_prompts"] == 4
            assert list(run.glob("checkpoints/step_*")) and (run / "report.html").exists()
            (table,) = (run / "ross").rglob("table.md")  # the ROSS table, or why it skipped
            assert "| ross |" in table.read_text() or "ROSS skipped" in table.read_text()
        if _key(argv) == "gfcr eval":  # one summary line on stdout; progress and notes on stderr
            (line,) = [ln for ln in proc.stdout.splitlines() if ln.strip()]
            assert line.startswith("4 prompts, k=4: pass@1 ") and "pass@4" in line, line
            greedy = float(re.search(r"greedy_pass@1 ([0-9.]+) \[", line).group(1))
            assert greedy > 0, line  # the README promises a non-zero greedy pass@1 on the default model


#: runs before the README's live block: TRL's own GRPOTrainer on a tiny random model (the README
#: names the default model, which a test cannot download), with the README's dataset, reward
#: functions and num_generations; everything the block does with gfcr runs as written
_LIVE_PRELUDE = """
import sys, types
sys.path.insert(0, {helpers!r})
import trl
from trl_helpers import arith_dataset, make_trainer

ds = arith_dataset(8)
_real = trl.GRPOConfig, trl.GRPOTrainer

def _config(**kw):
    return types.SimpleNamespace(**kw)

def _tiny_grpo(model, train_dataset, args, reward_funcs, **kw):
    trl.GRPOConfig, trl.GRPOTrainer = _real  # make_trainer builds TRL's own config and trainer
    return make_trainer(args.output_dir, reward_funcs, dataset=train_dataset, max_steps=2, per_device=8,
                        num_generations=args.num_generations)

trl.GRPOConfig, trl.GRPOTrainer = _config, _tiny_grpo  # what the block's `from trl import ...` gets
"""


@pytest.mark.slow
def test_readme_live_trl_block_records_a_run(tmp_path):
    """The README's TRL snippet, as written after the prelude: a real GRPO run whose every rollout is
    in the store under the README's run id, scored by the gfcr verifier, the selector's state saved."""
    pytest.importorskip("trl")
    (block,) = [b for b in readme_blocks("python") if is_live_block(b)]
    prelude = _LIVE_PRELUDE.format(helpers=str(ROOT / "tests" / "integrations"))
    proc = subprocess.run([sys.executable, "-c", prelude + block], cwd=tmp_path, env=_env(), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"README live block failed:\n{block}\n{proc.stderr[-3000:]}"
    from gfcr.store import RolloutStore

    store = RolloutStore.open(tmp_path / "rollouts")
    rows = store.sql("SELECT run_id, step, group_id, verifier FROM rollouts").to_pylist()
    assert rows and {r["run_id"] for r in rows} == {"grpo-1"}
    assert len({r["step"] for r in rows}) == 2  # max_steps=2: one commit per step
    sizes = Counter(r["group_id"] for r in rows)
    assert set(sizes.values()) == {4}  # num_generations=4, as written
    assert all(r["verifier"] and "math" in r["verifier"] for r in rows)  # the gfcr verifier scored them
    assert store.count("prompts") == 8

