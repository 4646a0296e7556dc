"""verl ``trainer.rollout_data_dir`` (and ``validation_data_dir``) JSONL.

Layout from the writer, ``verl/trainer/ppo/ray_trainer.py`` (``_write_generations`` and
``_log_rollout_data``, verl-project/verl @ 1dda039b): one file ``{dump_path}/{global_steps}.jsonl``
per step, one line per response: ``input`` and ``output`` (decoded with
``skip_special_tokens=True``), ``gts`` (the ground truth), ``score`` (the summed token-level score
the trainer used), ``step``, every ``reward_extra_info`` key with one value per response, and
``request_id``. Reward managers put the verdict in ``acc`` (``naive``/``dapo`` reward loops:
``acc = score`` for a float-returning scorer; ``math_dapo``: ``acc`` a bool).

Mapping: ``score`` → ``reward``; ``acc`` (or ``verdict_key``) → ``verified`` (a bool as is, a number
``> 0`` = correct; absent → null); numeric extra keys → ``signals``; other keys and ``request_id`` →
``meta["extra"]``; ``gts`` → the prompt's gold answer; ``input`` (the prompt after the chat
template) split back into turns by :func:`split_prompt` (or kept verbatim, ``meta.prompt_format =
"templated"``; with a tokenizer, a prompt whose template marks were decoded away is split when the
tokenizer's chat template confirms it, :func:`split_with_template`, ``chat_template``); ``cost`` = characters of ``input`` / ``output`` (``meta.length_unit``; tokens when
retokenized). Ids and groups are scoped by the file's folder under the dump root (two experiments
under one parent stay apart; a file directly in it keeps the ids of before). Lost: tokens (text
only; retokenize with a tokenizer), log-probs, finish reason (null), policy version (``step-N``),
group uid (rows are grouped by prompt text and step).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from gfcr.formats._common import (
    ImportFormatError,
    ImportResult,
    Tokenize,
    find_files,
    hid,
    num,
    read_jsonl,
    req,
    scoped,
    step_int,
    text_lengths,
    text_only_note,
)
from gfcr.records import Message, Prompt, Rollout

PATTERNS = ("*.jsonl",)
SCOPED = True  # ids and groups keyed by the file's folder under the dump root
#: the fields of a verl dump row gfcr maps to record fields (any other key is kept in meta)
VERL_FIELDS = {"input", "output", "gts", "score", "step", "request_id"}


#: (name, text before the first turn, a turn's head before its role, after its role, its end, the
#: generation prompt after the last turn); a turn is ``head role mid content end`` (``role`` one or
#: more word characters, ``content`` up to the first ``end``), ChatML's optionally followed by ``\n``
_TEMPLATES = (("chatml", "", "<|im_start|>", "\n", "<|im_end|>", "<|im_start|>assistant\n"),
              ("llama3", "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>\n\n", "<|eot_id|>",
               "<|start_header_id|>assistant<|end_header_id|>\n\n"))
_WORD = re.compile(r"\w+")
#: a chat template's marks (or Qwen's ChatML with its special tokens decoded away: ``user\n…\nassistant\n``)
_TEMPLATED = re.compile(r"<\|[A-Za-z_]+\|>|\[/?INST\]|<(?:start|end)_of_turn>|</?s>|\A(?:system|user)\n[\s\S]*\nassistant\n?\Z")


def _turns(body: str, head: str, mid: str, end: str, newline: bool) -> tuple[list[tuple[str, str]], int]:
    """The turns at the start of ``body``, one after another, and where they stop: what the regex
    ``head(\\w+)mid(.*?)end`` (then ``\\n?`` when ``newline``), matched again and again from the
    end of the last match, would give, by ``str.find`` (a lazy ``.*?`` tries the end mark at every
    character: 8 against 1 µs a prompt of 330 characters). Example: ``"<a>u|x</a>"`` with ``"<a>"``,
    ``"|"``, ``"</a>"`` → ``([("u", "x")], 10)``."""
    turns: list[tuple[str, str]] = []
    pos = 0
    while body.startswith(head, pos):
        role = _WORD.match(body, pos + len(head))
        if role is None or not body.startswith(mid, role.end()):
            break
        start = role.end() + len(mid)
        stop = body.find(end, start)
        if stop < 0:
            break
        turns.append((role.group(), body[start:stop]))
        pos = stop + len(end)
        if newline and body.startswith("\n", pos):
            pos += 1
    return turns, pos


def split_prompt(text: str) -> tuple[list[tuple[str, str]], str]:
    """verl's ``input`` (the prompt after the chat template, decoded) back into ``(role, content)``
    turns, and which template: ``chatml`` (``<|im_start|>role\\n…<|im_end|>``, Qwen/ChatML
    templates) or ``llama3`` (``<|start_header_id|>role<|end_header_id|>\\n\\n…<|eot_id|>``), the
    trailing generation prompt dropped; the whole text must be turns. Otherwise one user turn,
    ``text`` when no template mark is seen, ``templated`` when one is but the template is not
    recognised (the text is kept verbatim and exports must not template it again). Example:
    ``"<|im_start|>system\\nBe brief.<|im_end|>\\n<|im_start|>user\\n2+3?<|im_end|>\\n<|im_start|>assistant\\n"``
    → ``([("system", "Be brief."), ("user", "2+3?")], "chatml")``."""
    for name, lead, head, mid, end, gen in _TEMPLATES:
        body = text.removeprefix(lead)
        turns, pos = _turns(body, head, mid, end, name == "chatml")
        if turns and body[pos:] in ("", gen, gen.rstrip("\n")):
            return turns, name
    return [("user", text)], ("templated" if _TEMPLATED.search(text) else "text")


_ROLE_LINE = re.compile(r"(?:\A|\n)(system|user|assistant|tool)\n")


def split_with_template(text: str, tokenizer: Any) -> list[tuple[str, str]] | None:
    """Turns of a prompt whose template marks were special tokens, decoded away (Qwen's ChatML read
    with ``skip_special_tokens=True``: ``system\\n…\\nuser\\n…\\nassistant\\n``), confirmed with the
    run's tokenizer: the text is cut at its role lines and the cut is kept only when the tokenizer's
    own chat template renders those turns (with the generation prompt), encoded and decoded as verl
    decodes them, back to exactly ``text``. None when it does not (kept verbatim then)."""
    marks = list(_ROLE_LINE.finditer(text))
    if not marks or marks[0].start() != 0 or getattr(tokenizer, "chat_template", None) is None:
        return None
    turns = [(a.group(1), text[a.end():b.start() if b is not None else len(text)])
             for a, b in zip(marks, [*marks[1:], None], strict=True)]
    if turns[-1] != ("assistant", "") or len(turns) < 2:
        return None
    turns = turns[:-1]
    try:
        rendered = tokenizer.apply_chat_template([{"role": r, "content": c} for r, c in turns], tokenize=False,
                                                 add_generation_prompt=True)
        back = tokenizer.decode(tokenizer(rendered, add_special_tokens=False)["input_ids"], skip_special_tokens=True)
    except (ValueError, TypeError, KeyError):  # a template that refuses these turns: not confirmed
        return None
    return turns if back == text else None


def verdict_of(acc: Any) -> bool | None:
    """verl's ``acc`` reward-extra value as a verdict: a bool as it is (``math_dapo`` returns
    ``{"score", "acc", "pred"}``); a number ``> 0`` is correct (for a scorer that returns a float the
    reward loop sets ``acc = score``, so a wrong answer scored ``-1`` or ``0`` is *not* verified);
    ``None`` when absent. Raises ``ValueError`` for anything else. Examples: ``True`` → True,
    ``-1.0`` → False, ``1`` → True, ``None`` → None."""
    if acc is None:
        return None
    if isinstance(acc, bool | np.bool_):
        return bool(acc)
    if isinstance(acc, int | float | np.integer | np.floating) and math.isfinite(float(acc)):
        return float(acc) > 0
    raise ValueError(f"expected a bool or a number (the verdict), got {acc!r}")


def _verdict(v: Any, path: Path, where: str, key: str) -> bool | None:
    try:
        return verdict_of(v)
    except ValueError as e:
        raise ImportFormatError(path, where, key, str(e)) from e


def parse(paths: list[str], run_id: str, tokenizer: Any | None = None, verdict_key: str = "acc",
          scope: str = "", **_: Any) -> ImportResult:
    """``scope``: the file's folder relative to the dump root (``""`` directly in it), which keys ids
    and groups (:func:`gfcr.formats._common.file_scopes`)."""
    files = find_files(paths, PATTERNS)
    tok = Tokenize(tokenizer)
    rollouts, prompts = [], {}
    templated = 0
    confirmed: dict[str, list[tuple[str, str]] | None] = {}  # per prompt text: split_with_template
    for f in files:
        counters: dict[tuple[int, str], int] = {}
        for i, obj in read_jsonl(f):
            w = f"line {i}"
            inp = req(obj, "input", str, f, w)
            out = req(obj, "output", str, f, w)
            score = num(obj, "score", f, w)
            step = step_int(req(obj, "step", (int, str), f, w), f, w)
            verified = _verdict(obj.get(verdict_key), f, w, verdict_key)
            gts = obj.get("gts")
            pid = "verl-" + hid(inp)
            turns, pfmt = split_prompt(inp)
            if pfmt == "templated" and tokenizer is not None:
                if inp not in confirmed:
                    confirmed[inp] = split_with_template(inp, tokenizer)
                if confirmed[inp] is not None:
                    turns, pfmt = confirmed[inp], "chat_template"
            pmsgs = [Message(r, c) for r, c in turns]
            templated += pfmt == "templated"
            prompts.setdefault(pid, Prompt(prompt_id=pid, task="verl", messages=pmsgs,
                                           answer=None if gts is None else (gts if isinstance(gts, str) else json.dumps(gts))))
            k = counters[(step, pid)] = counters.get((step, pid), -1) + 1
            sig, other = {}, {}
            for key, v in obj.items():
                if key in VERL_FIELDS:
                    continue
                if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(float(v)):
                    sig[key] = float(v)
                else:
                    other[key] = v
            toks = tok(inp, out)
            cost, unit = text_lengths(inp, out, toks)
            rollouts.append(
                Rollout(
                    rollout_id="verl-" + hid(run_id, scoped(scope, f.name), i, inp, out),
                    run_id=run_id, step=step, policy_version=f"step-{step}", prompt_id=pid,
                    group_id=f"{scoped(scope, run_id, True)}/{pid}@{step}", sample_index=k, task="verl",
                    messages=[*pmsgs, Message("assistant", out)], cost=cost,
                    reward=score, verified=verified, finish_reason=None, signals=sig,
                    verifier={"name": "verl", "score": score, "verdict_key": verdict_key if verified is not None else None},
                    meta={"source": "verl", "file": scoped(scope, f.name), "line": i, "request_id": obj.get("request_id"),
                          "extra": other, "length_unit": unit, "prompt_format": pfmt},
                    **toks,
                )
            )
    return ImportResult("verl", [str(f) for f in files], rollouts, list(prompts.values()),
                        text_only_note("verl", tokenizer) + templated_note(templated))


def templated_note(n: int) -> list[str]:
    """The warning for rows whose prompt carries a chat template gfcr cannot split into turns."""
    if not n:
        return []
    return [f"warning: {n} prompt(s) hold a chat template gfcr does not recognise: kept verbatim as one user turn "
            "(meta.prompt_format = templated); SFT text exports skip them rather than template them twice"]
