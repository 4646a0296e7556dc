"""AReaL ``rollout.dump_to_file``: ``{log_path}/rollout/{version}/{task_id}.jsonl`` (and
``eval-rollout/`` for evaluation).

Layout from the writer, ``WorkflowExecutor._dump_trajectory`` (areal-project/AReaL @ cbff54d6,
``areal/infra/workflow_executor.py``): one line per sample: ``task_id``, ``sample_idx``, ``seqlen``,
``prompt_len``, ``head_version``/``tail_version`` and ``version_rle`` (run-length ``[version,
n_tokens]``), ``reward``, ``prompt`` and ``completion`` decoded with ``skip_special_tokens=False``,
``segments`` (``{role: prompt|gen|context, len, text}``) for multi-turn samples, and
``original_reward``. The folder is the batch's highest version.

Mapping: the policy version is taken over *generated* tokens only: prompt tokens carry version −1,
and writers before the fix above folded them into ``head_version``; the head is then rebuilt from the
non-negative ``version_rle`` runs (``v3`` or ``v2-v3``; ``v?-v3`` when the head cannot be known).
Special tokens are stripped from message text (ChatML and Llama-3 role headers become message
roles); with a tokenizer the raw text, special tokens included, is what gets tokenized. Segments
become turns: ``gen`` → assistant, ``context`` → the role its header names (else ``env``).
``eval-rollout/`` rows go to the run ``{run}-eval`` (or are skipped with ``evals="skip"``).
Lost: tokens (text only), log-probs, finish reason (null), verdict (null), the trainer's step
(``step`` = the version folder).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from gfcr.formats._common import (
    ImportFormatError,
    ImportResult,
    Tokenize,
    eval_run,
    find_files,
    hid,
    num,
    opt_num,
    read_jsonl,
    req,
    text_only_note,
)
from gfcr.records import Message, Prompt, Rollout

PATTERNS = ("*.jsonl",)
_HEADER = re.compile(r"<\|im_start\|>(\w+)\n|<\|start_header_id\|>(\w+)<\|end_header_id\|>\n*")
_SPECIAL = re.compile(r"<\|[^|<>\s]{1,40}\|>|</?s>")


def strip_special(text: str, specials: tuple[str, ...] = ()) -> str:
    for s in specials:
        text = text.replace(s, "")
    return _SPECIAL.sub("", text)


def chat_messages(text: str, default_role: str, specials: tuple[str, ...] = ()) -> list[Message]:
    """Decoded chat text → messages: ChatML / Llama-3 role headers give the roles, special tokens are
    dropped; text without headers is one ``default_role`` message. Empty turns (a trailing
    generation prompt) are dropped."""
    out: list[Message] = []
    pos, role = 0, default_role
    for m in _HEADER.finditer(text):
        body = strip_special(text[pos:m.start()], specials).strip("\n")
        if body.strip():
            out.append(Message(role, body))
        role, pos = m.group(1) or m.group(2), m.end()
    body = strip_special(text[pos:], specials).strip("\n")
    if body.strip():
        out.append(Message(role, body))
    return out


def _version(obj: dict[str, Any], f: Path, w: str) -> tuple[str, int | None, int | None]:
    head, tail = obj.get("head_version"), obj.get("tail_version")
    rle = obj.get("version_rle")
    if rle is not None:
        if not isinstance(rle, list) or not all(isinstance(x, list) and len(x) == 2 and all(
                isinstance(y, int) and not isinstance(y, bool) for y in x) for x in rle):
            raise ImportFormatError(f, w, "version_rle", "expected a list of [version, n_tokens] integer pairs")
        gen = [v for v, n in rle if v >= 0 and n > 0]
        if gen:
            head, tail = min(gen), max(gen)
    for key, v in (("head_version", head), ("tail_version", tail)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise ImportFormatError(f, w, key, f"expected an integer, got {v!r}")
    if tail is None or tail < 0:
        return "unknown", None, None
    if head is None or head < 0:
        return f"v?-v{tail}", None, tail
    return (f"v{head}" if head == tail else f"v{head}-v{tail}"), head, tail


def parse(paths: list[str], run_id: str, tokenizer: Any | None = None, evals: str = "separate",
          **_: Any) -> ImportResult:
    files = find_files(paths, PATTERNS)
    tok = Tokenize(tokenizer)
    specials = tuple(getattr(tokenizer, "all_special_tokens", ()) or ())
    rollouts, prompts = [], {}
    n_eval = 0
    for f in files:
        is_eval = "eval-rollout" in f.parts
        run = eval_run(run_id, is_eval, evals)
        n_eval += is_eval
        if run is None:
            continue
        dir_version = f.parent.name
        for i, obj in read_jsonl(f):
            w = f"line {i}"
            task_id = str(req(obj, "task_id", (str, int), f, w))
            idx = req(obj, "sample_idx", int, f, w)
            reward = num(obj, "reward", f, w)
            prompt = req(obj, "prompt", str, f, w)
            completion = req(obj, "completion", str, f, w)
            pv, head, tail = _version(obj, f, w)
            step = int(dir_version) if dir_version.isdigit() else (tail if tail is not None else 0)
            pmsgs = chat_messages(prompt, "user", specials) or [Message("user", "")]
            msgs = list(pmsgs)
            segments = obj.get("segments")
            if segments is not None:
                if not isinstance(segments, list):
                    raise ImportFormatError(f, w, "segments", "expected a list of turns")
                for j, seg in enumerate(segments):
                    if not isinstance(seg, dict) or "role" not in seg:
                        raise ImportFormatError(f, w, f"segments[{j}]", "expected an object with 'role' and 'text'")
                    text = seg.get("text", seg.get("content", ""))
                    if not isinstance(text, str):
                        raise ImportFormatError(f, w, f"segments[{j}].text", f"expected text, got {type(text).__name__}")
                    r = str(seg["role"])
                    if r == "prompt":
                        continue
                    if r in ("gen", "assistant"):
                        msgs.append(Message("assistant", strip_special(text, specials).strip("\n")))
                    else:
                        msgs.extend(chat_messages(text, "env" if r == "context" else r, specials))
            else:  # writers before segments: the completion may hold later turns (tool, assistant)
                msgs.extend(chat_messages(completion, "assistant", specials) or [Message("assistant", "")])
            # writers before the fix above split multi-turn samples after the first turn: the prompt text
            # then holds generated turns; the task's prompt is what precedes the first assistant turn
            first = next((k for k, m in enumerate(pmsgs) if m.role == "assistant"), len(pmsgs))
            pmsgs = pmsgs[:first] or pmsgs
            ptext = "\n".join(m.content for m in pmsgs)
            pid = "areal-" + hid(ptext)
            prompts.setdefault(pid, Prompt(prompt_id=pid, task="areal", messages=pmsgs))
            sig = {}
            orig = opt_num(obj.get("original_reward"), f, w, "original_reward")
            if orig is not None:
                sig["original_reward"] = orig
            rollouts.append(
                Rollout(
                    rollout_id="areal-" + hid(run, "eval" if is_eval else "train", dir_version, f.name, i, task_id, idx,
                                              prompt, completion),
                    run_id=run, step=step, policy_version=pv, prompt_id=pid, group_id=f"{run}/areal-{task_id}@{dir_version}",
                    sample_index=idx, task="areal", messages=msgs, reward=reward, finish_reason=None, signals=sig,
                    verifier={"name": "areal", "reward": reward},
                    meta={"source": "areal", "file": str(Path(f.parent.name) / f.name), "line": i, "task_id": task_id,
                          "head_version": head, "tail_version": tail, "version_rle": obj.get("version_rle"),
                          "seqlen": obj.get("seqlen"), "prompt_len": obj.get("prompt_len"), "eval": is_eval},
                    **tok(prompt, completion),
                )
            )
    notes = text_only_note("AReaL", tokenizer)
    if n_eval and evals == "skip":
        notes.append(f"skipped {n_eval} eval-rollout file(s) (evals=skip)")
    elif n_eval:
        notes.append(f"{n_eval} eval-rollout file(s) imported into run {run_id}-eval")
    return ImportResult("areal", [str(f) for f in files], rollouts, list(prompts.values()), notes)
