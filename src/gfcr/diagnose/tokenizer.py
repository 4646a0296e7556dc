"""The tokenizer the viewer and the health checks decode stored tokens with: the one given, else the
one of the model the store's rows record (local files only), else none (tokens shown as ids), with a
note saying which.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gfcr.store.provenance import recorded_model


def resolve_tokenizer(store: Any, tokenizer: Any | None) -> tuple[Any | None, dict[str, str | None]]:
    """The tokenizer to decode tokens with, and what to tell the reader about it.

    ``tokenizer``: an HF tokenizer, a path/name (loaded as given), or None: the store's own model
    (:func:`gfcr.store.provenance.recorded_model`), local files only. Returns ``(tokenizer or None, {name, source, note})``
    with ``source`` one of ``given``, ``store``, ``none``.
    """
    if tokenizer is not None and not isinstance(tokenizer, str | Path):
        return tokenizer, {"name": getattr(tokenizer, "name_or_path", None) or "given", "source": "given", "note": None}
    from transformers import AutoTokenizer

    if tokenizer is not None:
        return AutoTokenizer.from_pretrained(str(tokenizer)), {"name": str(tokenizer), "source": "given", "note": None}
    name = recorded_model(store)
    if name is None:
        return None, {"name": None, "source": "none",
                      "note": "the store records no model: tokens are shown as ids (start with --tokenizer to decode)"}
    try:
        return AutoTokenizer.from_pretrained(name, local_files_only=True), {"name": name, "source": "store", "note": None}
    except Exception as e:  # noqa: BLE001 - any load failure falls back to ids, with the reason
        why = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        return None, {"name": name, "source": "none",
                      "note": f"could not load the tokenizer of the store's model {name!r} ({why}): tokens are shown "
                              "as ids (start with --tokenizer to decode)"}
