"""What a put answers: ``PutStatus`` (every expected outcome, as a value) and ``PutResult`` (the status with the
copies written and the pin granted); what a read into a buffer answers besides a length: ``MISS``,
``TOO_SMALL``."""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["PutStatus", "PutResult", "MISS", "TOO_SMALL"]

#: A read's result for a key the pool does not hold.
MISS = -1
#: ``get_into_batch``'s result for a key whose value is larger than its buffer (nothing is written to it;
#: the batch's other keys are read as usual).
TOO_SMALL = -2


class PutStatus(enum.Enum):
    """Outcome of a put or upsert. Every value is an expected outcome, never an exception."""

    OK = "ok"
    """Stored and visible to every client."""
    ALREADY_EXISTS = "already_exists"
    """A put found the key present (stored, or being written by someone else); nothing changed."""
    POOL_FULL = "pool_full"
    """No segment has room even after eviction."""
    NO_SEGMENT = "no_segment"
    """No node has joined the pool yet."""
    FENCED = "fenced"
    """A remove_all(force=True) happened while this put was in flight, so it was discarded."""
    FAILED = "failed"
    """The bytes could not be written (node unreachable or gone, or the reservation expired)."""
    QUOTA_EXCEEDED = "quota_exceeded"
    """The key's tenant is at its memory quota (docs/operations.md, "Tenants"); nobody else's objects were touched."""


@dataclass(frozen=True, slots=True)
class PutResult:
    """The outcome of a put in full: its status and, for a stored object, how many copies were written
    against how many were asked for, and whether its pin was granted.

    ``copies`` is 0 unless ``status`` is OK; it is below ``copies_wanted`` when the pool had fewer
    segments with room, or a node failed during the put: the master makes the missing copies later when
    there is room (its ``master_objects_under_replicated`` gauge counts such objects meanwhile).
    ``pinned`` is False when no pin was asked for, or when the pool's pins were at their cap (the object
    is then stored unpinned).
    """

    status: PutStatus
    copies: int
    copies_wanted: int
    pinned: bool = False

    @property
    def under_replicated(self) -> bool:
        """True for a stored object with fewer copies than asked for."""
        return self.status == PutStatus.OK and self.copies < self.copies_wanted
