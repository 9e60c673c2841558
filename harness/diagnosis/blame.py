"""What a blame rule answers (:class:`Blame`), and what the rules share."""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence


# Deaths closer than this are one event (e.g. a kill fault on two workers);
# TensorFlow's echoes of a death take seconds (heartbeats), so this is safe.
SIMULTANEOUS = 0.5


@dataclasses.dataclass(frozen=True)
class Blame:
    """One rule's conclusion, before it is rendered."""

    culprits: Sequence[int]
    reason: str
    step: Optional[int] = None
    ambiguous: bool = False
    headline: Optional[str] = None   # replaces the generic headline
