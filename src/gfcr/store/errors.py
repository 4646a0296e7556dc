"""What a store's failures are, each read in one line: refused (:class:`StoreError`), damaged
(:class:`StoreDamaged`), a commit that lost to other writers too often (:class:`CommitGaveUp`), an object
store that did not answer (:class:`StoreUnreachable`); and how Lance's error text is read to tell them
apart (:func:`lance_reason`, :func:`is_conflict`, :func:`unreachable_write`).
"""

from __future__ import annotations

import re


class StoreError(RuntimeError):
    """A store operation was refused; the message says why and what to do. Nothing was written."""


class StoreDamaged(StoreError):
    """The store on disk is damaged; the message names the damaged file and what to do."""


def lance_reason(e: BaseException) -> str:
    """Lance's error message without its Rust source locations and wrapper names (one line).

    Example: ``"LanceError(IO): file size is too small, /x/lance-io/src/utils.rs:172:20"`` →
    ``"file size is too small"``."""
    s = " ".join(str(e).split())
    s = re.sub(r",? /\S+\.rs:\d+:\d+", "", s)
    s = re.sub(r"\b(?:External error: |LanceError\(\w+\): |Invalid user input: )", "", s)
    return s.strip() or type(e).__name__


#: an object store's transport errors as Lance passes them on (object_store's "Generic S3 error: …")
NETWORK = re.compile(r"Generic \w+ error|error sending request|HTTP error|Error performing \w+ request")




#: Lance's commit-conflict messages (lance 14, ``rust/lance-core/src/error.rs``): a retryable
#: conflict, an incompatible concurrent transaction, and its own retry limit on a contended table
CONFLICT_MESSAGES = ("Retryable commit conflict for version", "Commit conflict for version",
                     "transaction is incompatible with concurrent transaction",
                     "transaction was preempted by concurrent transaction", "Too many concurrent writers")


def is_conflict(e: BaseException) -> bool:
    """Did a Lance commit fail because another writer committed first? By type
    (``lance.commit.CommitConflictError``) or by one of Lance's exact messages (:data:`CONFLICT_MESSAGES`),
    never by loose words. Example: ``OSError("Too many concurrent writers. …")`` → True;
    ``OSError("retry the commit later: disk full")`` → False."""
    from lance.commit import CommitConflictError

    return isinstance(e, CommitConflictError) or any(m in str(e) for m in CONFLICT_MESSAGES)


class CommitGaveUp(StoreError):
    """A commit lost to other writers ``attempts`` times in a row; nothing of it was written."""


class StoreUnreachable(StoreError):
    """The object store did not answer a write (after the object store client's own bounded retries)."""


_STATUS = re.compile(r"status code: (\d{3}[A-Za-z ]*)")
_RETRIES = re.compile(r"after (\d+) retries")


def unreachable_write(e: BaseException) -> StoreUnreachable | None:
    """One line for a write the object store did not complete (:data:`NETWORK` errors), else None.

    Example: Lance's ``"… Generic S3 error: Error performing list request … after 2 retries …
    Server returned non-2xx status code: 503 Service Unavailable: …"`` → ``"the object store did not
    complete the write (503 Service Unavailable, after 2 retries): …"``."""
    text = " ".join(str(e).split())
    if not NETWORK.search(text):
        return None
    status = _STATUS.search(text)
    retries = _RETRIES.search(text)
    what = ", ".join(x for x in (status.group(1).strip() if status else "no answer",
                                 f"after {retries.group(1)} retries" if retries else "") if x)
    return StoreUnreachable(f"the object store did not complete the write ({what}): a commit lands whole or not "
                            "at all, so count the store before writing the batch again (its duplicate ids are refused)")
