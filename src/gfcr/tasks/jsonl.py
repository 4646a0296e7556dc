"""JSONL loaders: math (GSM8K-style question/answer) and code (prompt + tests).

Math lines: ``{"question": ..., "answer": ...}``; a GSM8K answer ``"...reasoning... #### 42"``
keeps only what follows ``####`` as the gold answer (the reasoning goes to ``meta["solution"]``).
Code lines: ``{"prompt": ..., "tests": [...] | "assert ..."}``, plus optional ``entry_point``.
Math prompts state their answer format (a final ``Answer: N`` line) in ``meta["answer_format"]``.
Bad lines raise an error naming the file and line; nothing is half-loaded.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from gfcr.records import Message, Prompt
from gfcr.tasks import ListSource

MATH_INSTRUCTION = "{question}\n\nSolve it step by step, then finish with a final line of the form 'Answer: N'."
CODE_INSTRUCTION = "{prompt}\n\nWrite a complete Python solution in a single ```python code block."


def _read_jsonl(path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no such JSONL file: {p}")
    rows = []
    with open(p, encoding="utf-8") as fh:
        for ln, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{p}:{ln}: not valid JSON ({e.msg})") from e
            if not isinstance(obj, dict):
                raise ValueError(f"{p}:{ln}: expected a JSON object, got {type(obj).__name__}")
            rows.append((ln, obj))
    return rows


def _pid(prefix: str, text: str) -> str:
    return f"{prefix}-" + hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def gsm8k_answer(answer: str) -> str:
    """The final answer of a GSM8K-style answer string (after ``####``, commas removed)."""
    if "####" in answer:
        answer = answer.rsplit("####", 1)[1]
    return answer.strip().replace(",", "")


def load_math_jsonl(
    path: str,
    task: str = "gsm8k",
    question_key: str = "question",
    answer_key: str = "answer",
    split: str | None = None,
    limit: int | None = None,
) -> ListSource:
    """Math prompts from a JSONL file (see module docstring)."""
    out = []
    for ln, obj in _read_jsonl(path):
        if question_key not in obj or answer_key not in obj:
            raise ValueError(f"{path}:{ln}: needs keys {question_key!r} and {answer_key!r}, has {sorted(obj)}")
        q, a = str(obj[question_key]), str(obj[answer_key])
        out.append(
            Prompt(
                prompt_id=str(obj.get("id") or _pid(task, q)),
                task=task,
                messages=[Message("user", MATH_INSTRUCTION.format(question=q))],
                answer=gsm8k_answer(a),
                category=obj.get("category") or task,
                difficulty=float(obj["difficulty"]) if obj.get("difficulty") is not None else None,
                split=obj.get("split", split),
                meta={"solution": a, "source": str(path), "line": ln, "answer_format": "answer_line"},
            )
        )
        if limit is not None and len(out) >= limit:
            break
    return ListSource(task, out)


def load_code_jsonl(
    path: str,
    task: str = "code",
    prompt_key: str = "prompt",
    tests_key: str = "tests",
    split: str | None = None,
    limit: int | None = None,
) -> ListSource:
    """Code prompts from a JSONL file; ``tests`` (a list of assert strings or one script) go to ``Prompt.tests``."""
    out = []
    for ln, obj in _read_jsonl(path):
        if prompt_key not in obj or tests_key not in obj:
            raise ValueError(f"{path}:{ln}: needs keys {prompt_key!r} and {tests_key!r}, has {sorted(obj)}")
        tests = obj[tests_key]
        if isinstance(tests, str):
            tests = [tests]
        if not isinstance(tests, list) or not all(isinstance(t, str) for t in tests):
            raise ValueError(f"{path}:{ln}: {tests_key!r} must be a string or a list of strings")
        text = str(obj[prompt_key])
        out.append(
            Prompt(
                prompt_id=str(obj.get("id") or _pid(task, text)),
                task=task,
                messages=[Message("user", CODE_INSTRUCTION.format(prompt=text))],
                answer=None,
                tests={"tests": tests, "entry_point": obj.get("entry_point")},
                category=obj.get("category") or task,
                difficulty=float(obj["difficulty"]) if obj.get("difficulty") is not None else None,
                split=obj.get("split", split),
                meta={"source": str(path), "line": ln},
            )
        )
        if limit is not None and len(out) >= limit:
            break
    return ListSource(task, out)
