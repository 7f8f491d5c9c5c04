"""The split plan: which source episodes go to accepted and which to rejected, in source order."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from eva.quality.verdicts import ACCEPTED, REJECTED, RULE, subset_of


@dataclass(frozen=True)
class SplitPlan:
    """Source episode indices of each subset, ascending (output episode i = ``accepted[i]``)."""

    accepted: list[int]
    rejected: list[int]
    rule: str = RULE

    def indices(self, subset: str) -> list[int]:
        if subset == ACCEPTED:
            return self.accepted
        if subset == REJECTED:
            return self.rejected
        raise ValueError(f"unknown subset {subset!r}")

    def as_dict(self) -> dict[str, Any]:
        return {ACCEPTED: list(self.accepted), REJECTED: list(self.rejected), "rule": self.rule}


def plan_split(rows: Iterable[Mapping[str, Any]]) -> SplitPlan:
    """Apply the accept/reject rule (``subset_of``) to every episodes.jsonl row (rows may come in
    any order)."""
    decided = sorted((int(row["episode_index"]), subset_of(row)) for row in rows)
    return SplitPlan(
        accepted=[i for i, s in decided if s == ACCEPTED],
        rejected=[i for i, s in decided if s == REJECTED],
    )
