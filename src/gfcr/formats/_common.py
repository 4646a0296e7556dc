"""What every importer shares: the error type, the result, file discovery, JSONL reading that names
file/line/field for every malformed input, typed field access, integer range checks, stable ids, and
the optional retokenization of text-only dumps."""

from __future__ import annotations

import contextvars
import glob
import hashlib
import json
import math
import os
import re
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from gfcr.records import Cost, Prompt, Rollout

T = TypeVar("T")

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1

#: set while following a growing dump: a last line without its newline is a write in progress
#: (read next time), and an empty file is a file not yet written; both are errors otherwise.
FOLLOWING: contextvars.ContextVar[bool] = contextvars.ContextVar("gfcr_import_following", default=False)


class ImportFormatError(ValueError):
    """Malformed import input. The message names the file, the line or record, and the field."""

    def __init__(self, path: str | os.PathLike[str], where: str, field_name: str, message: str):
        self.path, self.where, self.field = str(path), where, field_name
        super().__init__(f"{path}: {where}: field '{field_name}': {message}")


@dataclass
class ImportResult:
    """What a parser read: rollouts and prompts, the files, notes for the user. After
    :func:`gfcr.formats.import_rollouts`, ``skipped`` counts rollouts already stored and
    ``written`` those committed now."""

    format: str
    files: list[str]
    rollouts: list[Rollout]
    prompts: list[Prompt]
    notes: list[str] = field(default_factory=list)
    skipped: int = 0
    written: int = 0
    #: set by paths that build no Rollout objects (the columnar import), which say what they wrote
    tokens: str | None = None
    #: per file, how it was imported (columnar path: ``unchanged``, ``columnar`` or ``rows: <why>``)
    how: dict[str, str] = field(default_factory=dict)
    #: a resumable format's read position (prime-rl-stream): what ``follow`` hands to the next poll
    cursor: dict[str, Any] | None = None
    #: files found but not the format's data (a job folder's other JSON), with why: ``(path, why)``
    ignored: list[tuple[str, str]] = field(default_factory=list)

    @property
    def tokens_source(self) -> str:
        if self.tokens is not None:
            return self.tokens
        srcs = {r.tokens_source for r in self.rollouts}
        return ",".join(sorted(srcs)) or "-"


def find_files(paths: list[str], patterns: tuple[str, ...], exclude_dirs: tuple[str, ...] = ()) -> list[Path]:
    """Files named by ``paths``; a directory is searched recursively for ``patterns``, skipping any
    file below a folder named in ``exclude_dirs`` and any file inside a gfcr store (a folder holding
    ``gfcr-store.json``: its own files, such as the aggregates.parquet of older stores, are not a dump)."""
    out: list[Path] = []
    for p in paths:
        pp = Path(p)
        if pp.is_dir():
            found = sorted({Path(f) for pat in patterns for f in glob.glob(str(pp / "**" / pat), recursive=True)})
            found = [f for f in found if not set(f.relative_to(pp).parts[:-1]) & set(exclude_dirs)
                     and not _in_store(f, pp)]
            if not found and not FOLLOWING.get():
                raise ImportFormatError(pp, "directory", "-", f"no files matching {patterns} found")
            out.extend(found)
        elif pp.exists():
            out.append(pp)
        else:
            raise ImportFormatError(pp, "path", "-", "no such file or directory")
    return out


def file_scopes(paths: list[str], files: list[Path], strip: tuple[str, ...] = ()) -> dict[Path, str]:
    """Each file's scope: the folder it lies in, relative to the directory of ``paths`` it was found
    under, as a POSIX path; ``""`` for a file directly in that directory or named by itself (so the
    ids of a single-folder dump stay what they were). A trailing folder a framework always writes
    (``strip``, e.g. TRL's ``completions``) is left out, so ``out/completions/x.parquet`` under
    ``out`` scopes as ``""`` and ``runs/a/completions/x.parquet`` under ``runs`` as ``a``. Ids and
    groups of files in different scopes never meet: two experiments under one parent stay apart."""
    roots = [Path(p) for p in paths if Path(p).is_dir()]
    out: dict[Path, str] = {}
    for f in files:
        parts: tuple[str, ...] = ()
        for r in roots:
            try:
                parts = f.relative_to(r).parts[:-1]
                break
            except ValueError:
                continue
        while parts and parts[-1] in strip:
            parts = parts[:-1]
        out[f] = "/".join(parts)
    return out


def scoped(scope: str, name: str, run: bool = False) -> str:
    """``name`` under ``scope`` (``a/1.jsonl``), or ``name`` alone for the root scope; with ``run``,
    the group prefix of run ``name`` (``r/a``, or ``r`` for the root scope: the ids of before)."""
    if not scope:
        return name
    return f"{name}/{scope}" if run else f"{scope}/{name}"


def _in_store(f: Path, root: Path) -> bool:
    """Whether ``f`` lies in a gfcr store at or below ``root``."""
    return any((d / "gfcr-store.json").exists() for d in [*f.parents][: len(f.relative_to(root).parts)])


def read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line. Each line must be UTF-8 JSON holding an
    object; anything else raises :class:`ImportFormatError` naming the line. An empty file is an
    error (unless following a growing dump, where a last line without its newline is skipped)."""
    following = FOLLOWING.get()
    with open(path, "rb") as f:
        data = f.read()
    if not data.strip() and not following:
        raise ImportFormatError(path, "file", "-", "empty: no records")
    lines = data.split(b"\n")
    last_complete = data.endswith(b"\n")
    for i, raw in enumerate(lines, start=1):
        if i == len(lines) and following and not last_complete:
            return  # a line being written right now; read it next time
        if not raw.strip():
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ImportFormatError(path, f"line {i}", "-", f"not UTF-8 text (byte {e.start}: {raw[e.start:e.start + 1]!r})") from e
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise ImportFormatError(path, f"line {i}", "-", f"not valid JSON ({e.msg}); truncated line?") from e
        except RecursionError as e:
            raise ImportFormatError(path, f"line {i}", deep_field(text), "JSON nested too deeply") from e
        if not isinstance(obj, dict):
            raise ImportFormatError(path, f"line {i}", "-", f"expected a JSON object, got {type(obj).__name__}")
        if "\\u" in text and _SURROGATE_ESCAPE.search(text):
            check_unicode(obj, path, f"line {i}")
        yield i, obj


#: a JSON ``\\uD800``-``\\uDFFF`` escape: a surrogate, valid only as half of a pair
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def check_unicode(obj: Any, path: str | os.PathLike[str], where: str, key: str = "") -> None:
    """Refuse a string holding a lone surrogate (a JSON ``"\\ud800"`` escape decodes to one; UTF-8,
    and so the store, cannot hold it) with one line naming the field, instead of a bare
    ``UnicodeEncodeError`` at write time. Example: ``{"steps": [{"message": "a\\ud800"}]}`` raises
    ``…: field 'steps[0].message': lone surrogate '\\ud800' at character 1: not valid Unicode text``."""
    if isinstance(obj, str):
        try:
            obj.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ImportFormatError(path, where, key or "-", f"lone surrogate {obj[e.start]!r} at character {e.start}: "
                                    "not valid Unicode text") from None
    elif isinstance(obj, dict):
        for k, v in obj.items():
            check_unicode(k, path, where, key or "-")
            check_unicode(v, path, where, f"{key}.{k}" if key else str(k))
    elif isinstance(obj, list):
        for j, v in enumerate(obj):
            check_unicode(v, path, where, f"{key}[{j}]")


def deep_field(text: str, limit: int = 256) -> str:
    """The top-level key of a JSON object text under which nesting first passes ``limit`` levels
    (what a ``RecursionError`` from ``json.loads`` does not say), or ``-``. A scan of the text that
    skips strings; e.g. ``'{"a": 1, "b": [[[…]]]}'`` → ``b``."""
    depth, key, last, i, n = 0, "-", None, 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            last = text[i + 1:j]
            i = j + 1
            continue
        if c == ":" and depth == 1 and last is not None:
            key = last
        elif c in "[{":
            depth += 1
            if depth > limit:
                return key
        elif c in "]}":
            depth -= 1
        i += 1
    return "-"



def req(obj: dict[str, Any], key: str, types: type | tuple[type, ...], path: Path, where: str) -> Any:
    """``obj[key]``, which must exist and be of ``types`` (bool is never an int here unless asked)."""
    if key not in obj:
        raise ImportFormatError(path, where, key, "missing")
    v = obj[key]
    tt = types if isinstance(types, tuple) else (types,)
    if not isinstance(v, tt) or (isinstance(v, bool) and bool not in tt):
        tn = "/".join(t.__name__ for t in tt)
        raise ImportFormatError(path, where, key, f"expected {tn}, got {type(v).__name__} ({str(v)[:40]!r})")
    return v


def num(obj: dict[str, Any], key: str, path: Path, where: str) -> float:
    """A finite number."""
    v = req(obj, key, (int, float), path, where)
    if not math.isfinite(float(v)):
        raise ImportFormatError(path, where, key, f"must be finite, got {v!r}")
    return float(v)


def opt_num(v: Any, path: Path, where: str, key: str) -> float | None:
    """A finite number, or None for null / NaN (a value the source left out)."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float | np.integer | np.floating):
        raise ImportFormatError(path, where, key, f"expected a number or null, got {type(v).__name__} ({str(v)[:40]!r})")
    f = float(v)
    if math.isnan(f):
        return None
    if not math.isfinite(f):
        raise ImportFormatError(path, where, key, f"must be finite, got {v!r}")
    return f


def step_int(v: Any, path: Path, where: str, key: str = "step") -> int:
    """A training step: an integer in [0, 2^63); an integer string (older TRL) is read as one."""
    if isinstance(v, str) and v.strip().lstrip("+").isdigit():
        v = int(v.strip())
    if isinstance(v, bool) or not isinstance(v, int | np.integer):
        raise ImportFormatError(path, where, key, f"expected an integer >= 0, got {type(v).__name__} ({str(v)[:40]!r})")
    if not 0 <= int(v) <= INT64_MAX:
        raise ImportFormatError(path, where, key, f"must lie in [0, 2^63), got {v}")
    return int(v)


def token_ids(v: Any, path: Path, where: str, key: str, vocab: int | None = None) -> list[int]:
    """A list of token ids, each an integer in [0, vocab) (or [0, 2^31) without a vocabulary):
    a value that does not fit is refused, never wrapped."""
    if hasattr(v, "tolist"):
        v = v.tolist()
    if not isinstance(v, list):
        raise ImportFormatError(path, where, key, f"expected a list of token ids, got {type(v).__name__}")
    hi = vocab if vocab is not None else INT32_MAX + 1
    for j, x in enumerate(v):
        if isinstance(x, bool) or not isinstance(x, int):
            raise ImportFormatError(path, where, f"{key}[{j}]", f"expected an integer token id, got {x!r}")
        if not 0 <= x < hi:
            lim = f"the vocabulary size {vocab}" if vocab is not None else "2^31 (int32)"
            raise ImportFormatError(path, where, f"{key}[{j}]", f"token id {x} out of range: must be >= 0 and < {lim}")
    return v


def check_id_array(arr: np.ndarray, path: Path, where: str, key: str, vocab: int | None = None) -> None:
    """:func:`token_ids` for an integer array (any width): refuses ids that int32 (or the
    vocabulary) cannot hold instead of letting a cast wrap them."""
    if arr.size == 0:
        return
    hi = vocab if vocab is not None else INT32_MAX + 1
    bad = np.nonzero((arr < 0) | (arr >= hi))
    if len(bad[0]):
        pos = tuple(int(b[0]) for b in bad)
        lim = f"the vocabulary size {vocab}" if vocab is not None else "2^31 (int32)"
        raise ImportFormatError(path, where if len(pos) < 2 else f"row {pos[0]}", key,
                                f"token id {int(arr[pos])} at {list(pos)} out of range: must be >= 0 and < {lim}")


def hid(*parts: Any) -> str:
    """A stable 24-hex id from ``parts`` (content and source position)."""
    h = hashlib.sha1("\x1f".join(str(p) for p in parts).encode()).hexdigest()
    return h[:24]


def norm_finish(v: Any) -> str | None:
    """A framework's finish reason in gfcr's vocabulary, or None when absent or unknown."""
    if v is None:
        return None
    s = str(v).lower().split(".")[-1]
    return {"stop": "stop", "eos": "stop", "completed": "stop", "length": "length", "truncated": "length",
            "abort": "abort", "aborted": "abort", "error": "error", "failed": "error",
            "env_done": "env_done"}.get(s)


class Tokenize:
    """Turns (prompt text, completion text) into token arrays, or leaves them empty without a tokenizer."""

    def __init__(self, tokenizer: Any | None):
        self.tok = tokenizer

    def __call__(self, prompt: str, completion: str) -> dict[str, Any]:
        if self.tok is None:
            return dict(token_ids=np.zeros(0, np.int32), token_role=np.zeros(0, np.int8),
                        logprobs=np.zeros(0, np.float32), tokens_source="none")
        p = self.tok(prompt, add_special_tokens=False)["input_ids"]
        c = self.tok(completion, add_special_tokens=False)["input_ids"]
        if len(p) + len(c) == 0:
            return Tokenize(None)("", "")
        ids = np.asarray(list(p) + list(c), np.int32)
        role = np.asarray([0] * len(p) + [1] * len(c), np.int8)
        return dict(token_ids=ids, token_role=role, logprobs=np.zeros(len(ids), np.float32), tokens_source="retokenized")


def text_lengths(prompt: str, completion: str, toks: dict[str, Any]) -> tuple[Cost, str]:
    """(cost, unit) of a text-only row: token counts when :class:`Tokenize` retokenized it
    (``"tokens"``), else character counts (``"chars"``), so length metrics see the row; the unit
    goes to ``meta.length_unit``. Example: ("What?", "It is 5.", no tokenizer) → prompt 5, gen 8, chars."""
    if toks.get("tokens_source") == "none":
        return Cost(prompt_tokens=len(prompt), gen_tokens=len(completion)), "chars"
    g = int(np.asarray(toks["token_role"]).sum())
    return Cost(prompt_tokens=len(toks["token_role"]) - g, gen_tokens=g), "tokens"


def text_only_note(fmt: str, tokenizer: Any | None) -> list[str]:
    if tokenizer is not None:
        return []
    return [f"{fmt} dumps hold text only: imported without tokens (tokens_source=none); pass --tokenizer to retokenize"]


def load_tokenizer(name_or_path: str | None) -> Any | None:
    if not name_or_path:
        return None
    from transformers import AutoTokenizer  # heavy import only when asked for

    return AutoTokenizer.from_pretrained(name_or_path)


def load_weights_only(torch: Any, f: Path, why: str) -> Any:
    """``torch.load(f, weights_only=True)``; a file that needs arbitrary unpickling is refused with
    ``why`` and the ``--trust-pickle`` hint (unpickling can execute code)."""
    try:
        with warnings.catch_warnings():  # torch warns about the pickle protocol before refusing
            warnings.simplefilter("ignore", UserWarning)
            return torch.load(f, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises many types; report them all the same way
        if "weights_only" in str(e):
            raise ImportFormatError(
                f, "file", "-",
                f"needs arbitrary unpickling ({why}); refusing. Re-run with --trust-pickle only if you trust this "
                "file: unpickling can execute code",
            ) from e
        raise ImportFormatError(f, "file", "-", f"cannot be loaded as a torch file: {e}") from e


def need_torch(what: str) -> Any:
    try:
        import torch
    except ImportError as e:  # pragma: no cover - torch is in the [ml] extra
        from gfcr.store.core import StoreError

        raise StoreError(f"importing {what} needs torch: pip install 'gfcr[ml]'") from e
    return torch


def eval_run(run_id: str, is_eval: bool, evals: str) -> str | None:
    """The run an evaluation rollout goes to: ``{run}-eval`` (``evals="separate"``, the default),
    None = skip it (``evals="skip"``)."""
    if not is_eval:
        return run_id
    if evals == "skip":
        return None
    if evals != "separate":
        raise ValueError(f"evals must be 'separate' or 'skip', got {evals!r}")
    return f"{run_id}-eval"


#: tolerance above 0 for a log-probability (float32 round-off of a probability of 1)
LOGPROB_TOL = 1e-4


def check_logprobs(v: Any, n: int, path: str | os.PathLike[str], where: str, key: str) -> list[float]:
    """The behaviour log-probs of ``n`` tokens, as the store promises them (docs/store.md: "log-probs
    finite and <= 0", one per token): every value a number, finite and ``<= 0`` (within
    :data:`LOGPROB_TOL`), exactly ``n`` of them. Anything else raises :class:`ImportFormatError`
    naming the first bad index (``key[j]``). A NaN is refused, never read as 0: an unknown log-prob
    would poison an importance ratio. Example: ``check_logprobs([-0.5, nan], 2, f, "line 3",
    "logprobs")`` raises ``f: line 3: field 'logprobs[1]': must be finite, got nan``."""
    if hasattr(v, "tolist"):
        v = v.tolist()
    if not isinstance(v, list | tuple):
        raise ImportFormatError(path, where, key, f"expected a list of numbers, got {type(v).__name__}")
    if len(v) != n:
        raise ImportFormatError(path, where, key, f"length {len(v)} != {n} tokens it must cover")
    for j, x in enumerate(v):
        if isinstance(x, bool) or not isinstance(x, int | float | np.integer | np.floating):
            raise ImportFormatError(path, where, f"{key}[{j}]", f"expected a number, got {x!r}")
    arr = np.asarray(v, np.float64)
    bad = np.flatnonzero(~np.isfinite(arr) | (arr > LOGPROB_TOL))
    if len(bad):
        j = int(bad[0])
        what = "must be finite" if not math.isfinite(arr[j]) else "a log-probability must be <= 0"
        raise ImportFormatError(path, where, f"{key}[{j}]", f"{what}, got {v[j]!r}")
    return [float(x) for x in arr]


def source_where(r: Rollout) -> str:
    """Where in its file an imported rollout came from (``line 3``, ``row 2``, ``sample 0``), from the
    position each importer records in ``meta``; the rollout id when none is recorded."""
    m = r.meta if isinstance(r.meta, dict) else {}
    for key in ("line", "row", "sample", "step_index"):
        if isinstance(m.get(key), int) and not isinstance(m.get(key), bool):
            return f"{key.replace('_', ' ')} {m[key]}"
    return f"record {r.rollout_id}"


def validate_rollouts(rollouts: list[Rollout], path: str | os.PathLike[str]) -> None:
    """The one check every importer's output passes before anything is written: each rollout's
    :meth:`Rollout.validate` (equal lengths of ids / roles / log-probs, roles in {0, 1}, log-probs
    finite and <= 0, finite reward, a known finish reason, ...), a failure raised as ONE
    :class:`ImportFormatError` naming the file, the row it came from and the field."""
    from gfcr.records import RecordError

    for r in rollouts:
        try:
            r.validate()
        except RecordError as e:
            raise from_record_error(e, path, source_where(r)) from e


def from_record_error(e: Any, path: str | os.PathLike[str], where: str) -> ImportFormatError:
    """A :class:`RecordError` as the one-line import error (file, row, field, message once)."""
    return ImportFormatError(path, where, e.field, str(e).split(f"field '{e.field}': ", 1)[-1])


#: ``progress(stage, files_done, files)``, stage ``"read"`` or ``"write"`` (``import_rollouts``)
Progress = Callable[[str, int, int], None]


def ticking(items: Iterable[T], progress: Progress | None, stage: str, total: int) -> Iterator[T]:
    """``items`` as they are, ``progress(stage, k, total)`` called once the caller's loop body is done
    with the k-th (also when the body ``continue``s): a count that follows a loop with early exits.
    Example: ``for x in ticking("ab", p, "read", 2): ...`` calls ``p("read", 1, 2)`` after the body
    for ``"a"``, then ``p("read", 2, 2)``."""
    for k, x in enumerate(items, 1):
        yield x
        if progress is not None:
            progress(stage, k, total)
