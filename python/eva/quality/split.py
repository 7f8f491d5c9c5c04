"""The split plan: which source episodes go to accepted and which to rejected, in source order.

An episode the operator dropped (``edit_drop``, ``eva.dataset.edits``) goes to neither; the plan
lists it apart, so an export's ``quality_split.json`` still accounts for every source episode.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from eva.dataset.edits import EpisodeEdits, episode_edits
from eva.quality.verdicts import ACCEPTED, DROPPED, REJECTED, RULE, subset_of


@dataclass(frozen=True)
class SplitPlan:
    """Source episode indices of each subset, ascending (output episode i = ``accepted[i]``)."""

    accepted: list[int]
    rejected: list[int]
    rule: str = RULE
    dropped: list[int] = field(default_factory=list)  # in neither subset, ascending
    # The trim and task edits of the episodes in a subset (those with any): what the export
    # applies to each.
    edits: dict[int, EpisodeEdits] = field(default_factory=dict)

    def indices(self, subset: str) -> list[int]:
        if subset == ACCEPTED:
            return self.accepted
        if subset == REJECTED:
            return self.rejected
        raise ValueError(f"unknown subset {subset!r}")

    def edits_of(self, source_episode: int) -> EpisodeEdits:
        """The edits an export applies to one source episode (none: an unedited one)."""
        return self.edits.get(source_episode, EpisodeEdits())

    @property
    def source_total(self) -> int:
        """Every source episode the plan accounts for, dropped ones included."""
        return len(self.accepted) + len(self.rejected) + len(self.dropped)

    def provenance(self, source_indices: Sequence[int]) -> dict[str, Any]:
        """What a subset's ``quality_split.json`` records of the edits beside its
        ``source_episode_indices``: ``dropped`` (every dropped source episode) and ``edits``
        (source index -> ``EpisodeEdits.record()`` of its episodes that have one); each key
        only when it has an entry, so an export of an unedited dataset records neither."""
        out: dict[str, Any] = {}
        if self.dropped:
            out[DROPPED] = list(self.dropped)
        edits = {str(i): self.edits[i].record() for i in source_indices if i in self.edits}
        if edits:
            out["edits"] = edits
        return out

    def as_dict(self) -> dict[str, Any]:
        out = {ACCEPTED: list(self.accepted), REJECTED: list(self.rejected), "rule": self.rule}
        if self.dropped:
            out[DROPPED] = list(self.dropped)
        return out


def plan_split(rows: Iterable[Mapping[str, Any]]) -> SplitPlan:
    """Apply the accept/reject rule (``subset_of``) to every episodes.jsonl row (rows may come in
    any order); ``EditError`` (a ``DatasetError`` naming the episode and field) for a row whose
    edits are malformed, as ``eva validate`` reports them."""
    decided: list[tuple[int, str]] = []
    edits: dict[int, EpisodeEdits] = {}
    for row in rows:
        index = int(row["episode_index"])
        edited = episode_edits(row)
        subset = DROPPED if edited.drop else subset_of(row)
        decided.append((index, subset))
        if subset != DROPPED and edited.record():
            edits[index] = edited
    decided.sort()
    return SplitPlan(
        accepted=[i for i, s in decided if s == ACCEPTED],
        rejected=[i for i, s in decided if s == REJECTED],
        dropped=[i for i, s in decided if s == DROPPED],
        edits=edits,
    )
