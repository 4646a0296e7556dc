"""Full-text search over the turns of the rollouts (prompts and completions): a Lance inverted index.

**What matches.** A query's *words* are its runs of letters and digits, lower-cased
(:func:`query_words`; ``"3+4?"`` → ``["3", "4"]``, ``"common_word"`` → ``["common", "word"]``). A row
matches when every word occurs as a whole word in the text of any of its turns (``messages[].content``
of every role; the words may sit in different turns), case-insensitively. No stemming, no stop words,
no accent folding: ``"crossed"`` does not find ``"cross"``, ``"the"`` is a word like any other.

**The index.** :func:`build_text_index` builds a Lance ``INVERTED`` index on the nested field
``messages.content`` (one document per row; the ``simple`` tokenizer, lower-cased, no stemming, stop
words kept, no folding, no token-length cut, no positions) or, when one exists, adds the fragments
appended since (``optimize_indices``). It is built by ``gfcr store index`` (and only there: the viewer
only reads), one Lance commit. :func:`search` asks Lance for the rows holding every word
(``MatchQuery`` with ``AND``); Lance answers the indexed fragments from the index and tokenizes the
fragments appended since with the index's own settings (a flat search), so the answer stays exact
after appends, only slower in proportion to the rows not yet indexed. A compaction keeps the index
(Lance remaps it).

**Without the index** (:func:`search` returns None) a reader scans and tests each row
(:func:`gfcr.diagnose.listing.word_match`), with the same definition of a match.

Example: rows ["What is 3+4?" / "7"], ["The zebra"], ["zebras"]: ``q="3 + 4"`` matches the first,
``q="ZEBRA"`` the second only (whole words), ``q="zebra 7"`` none.
"""

from __future__ import annotations

import re
from typing import Any

import lance
import numpy as np
import pyarrow as pa

#: the indexed field (a list of structs; Lance indexes the nested strings, one document per row)
TEXT_FIELD = "messages.content"
INDEX_NAME = "messages_text"
#: the tokenizer: split on anything but letters and digits, lower-case, nothing else
INDEX_PARAMS: dict[str, Any] = {"base_tokenizer": "simple", "lower_case": True, "stem": False,
                                "remove_stop_words": False, "ascii_folding": False, "max_token_length": None,
                                "with_position": False}
_WORD = re.compile(r"[^\W_]+")


def query_words(q: str) -> list[str]:
    """The words of a query: runs of letters and digits, lower-cased, in order, without repeats.

    Example: ``"Zebra crossed, zebra!"`` → ``["zebra", "crossed"]``; ``"+"`` → ``[]``.
    """
    return list(dict.fromkeys(w.lower() for w in _WORD.findall(q)))


def text_index(ds: lance.LanceDataset) -> dict[str, Any] | None:
    """The text index of a rollouts dataset: ``{"name", "rows_indexed", "rows"}``, or None."""
    for d in ds.describe_indices():
        if list(getattr(d, "field_names", [])) == ["messages.item.content"] and "Inverted" in d.type_url:
            return {"name": d.name, "rows_indexed": int(d.num_rows_indexed), "rows": ds.count_rows()}
    return None


def build_text_index(uri: str, storage_options: dict[str, str] | None = None) -> dict[str, Any]:
    """Build the text index of the rollouts dataset at ``uri``, or bring an existing one up to date
    (index the fragments appended since). One commit. Returns ``{"action": "built" | "updated" | "empty",
    "rows_indexed", "rows"}``; an empty table gets no index."""
    ds = lance.dataset(uri, storage_options=storage_options)
    if not ds.count_rows():
        return {"action": "empty", "rows_indexed": 0, "rows": 0}
    have = text_index(ds)
    if have is None:
        ds.create_scalar_index(TEXT_FIELD, "INVERTED", name=INDEX_NAME, **INDEX_PARAMS)
        action = "built"
    else:
        ds.optimize.optimize_indices(index_names=[have["name"]])
        action = "updated"
    after = text_index(lance.dataset(uri, storage_options=storage_options)) or {}
    return {"action": action, "rows_indexed": after.get("rows_indexed", 0), "rows": after.get("rows", 0)}


def search(ds: lance.LanceDataset, q: str, columns: list[str], where: str | None = None,
           take_share: float = 0.02) -> pa.Table | None:
    """The rows of ``ds`` matching ``q`` (see the module docstring) and the Lance predicate ``where``,
    with ``columns``, through the text index; in row order. None when ``ds`` has no text index or ``q``
    has no word (the caller scans).

    The index gives the matching row ids; when they are at most ``take_share`` of the rows, those rows
    are taken by id, else the columns are scanned and the matches kept (a word in most rows: a scan of
    the few list columns costs less than a take of most of the rows)."""
    from lance.query import FullTextOperator, MatchQuery

    words = query_words(q)
    if not words or text_index(ds) is None:
        return None
    fts = MatchQuery(" ".join(words), TEXT_FIELD, operator=FullTextOperator.AND)
    ids = ds.to_table(columns=[], filter=where, prefilter=where is not None, full_text_query=fts, with_row_id=True,
                      disable_scoring_autoprojection=True).column("_rowid").to_numpy()
    ids = np.sort(ids)
    if len(ids) <= take_share * ds.count_rows():
        return ds._take_rows(ids.tolist(), columns=columns) if len(ids) else ds.to_table(columns=columns, limit=0)
    t = ds.to_table(columns=columns, filter=where, with_row_id=True)
    keep = np.isin(t.column("_rowid").to_numpy(), ids, assume_unique=True)
    return t.filter(pa.array(keep)).drop_columns(["_rowid"])


__all__ = ["INDEX_NAME", "INDEX_PARAMS", "TEXT_FIELD", "build_text_index", "query_words", "search", "text_index"]
