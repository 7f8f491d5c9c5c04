"""The console's review: episodes with their quality issues, verdicts, videos and plotted series.

The same ``eva.quality.verdicts`` calls, locks and files as ``eva qc``; every dataset is a name of
``collection.tasks`` resolved by :class:`~eva.console.datasets.DatasetDirs`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from eva.console.datasets import DatasetDirs
from eva.console.errors import bad_request, check_body, conflict, not_found
from eva.console.http_values import episode_index, typed_text
from eva.console.jobs import export_states
from eva.dataset import fsafe, layout
from eva.dataset.atomic import NotJSONError
from eva.dataset.edits import EpisodeEdits
from eva.dataset.errors import DatasetError, UnsafePathError
from eva.dataset.identity import Identity, file_identity
from eva.dataset.kept_histograms import BackgroundRecorder

if TYPE_CHECKING:
    from eva.quality.edits import EditRequest
    from eva.quality.verdicts import ReviewUpdate

MAX_SERIES_POINTS = 2000

_FRAME_REF = re.compile(r"\bframes? (\d+)")


def issue_frames(detail: object) -> list[int]:
    """Frame numbers an issue's detail names ("frame 12", "near frame 40", "frames 0-9"), so the
    replay can jump there."""
    if not isinstance(detail, str):
        return []
    return sorted({int(m) for m in _FRAME_REF.findall(detail)})


def _texts(value: object) -> list[str]:
    """A row's list of strings (tasks, video_keys) as the page can join and map it: a
    hand-edited value that is not a list (eva validate names it) is one item."""
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def _edit_fields(edits: EpisodeEdits) -> dict[str, Any]:
    """An episode's edits as the page shows them (null / false: none)."""
    return {
        "edit_trim": list(edits.trim) if edits.trim is not None else None,
        "edit_task": edits.task,
        "edit_drop": edits.drop,
    }


def edit_request(body: object) -> EditRequest:
    """An edit request's body as an ``EditRequest``; 400 naming the field for anything else."""
    from eva.dataset.edits import task_problem, trim_syntax_problem
    from eva.quality.edits import EditRequest

    check_body(body, ("trim", "task", "drop"))
    assert isinstance(body, Mapping)
    if not body:
        raise bad_request("bad_field", "trim: give trim, task or drop", "trim")
    trim: str | tuple[int, int] | None = None
    if "trim" in body and body["trim"] is not None:
        trim = _trim(body["trim"])
    task = body.get("task")
    if task is not None:
        problem = task_problem(typed_text(task, "task"))
        if problem is not None:
            raise bad_request("bad_field", f"task: {problem}", "task")
    drop = body.get("drop")
    if "drop" in body and not isinstance(drop, bool):
        raise bad_request("bad_field", f"drop: {drop!r} is not true or false", "drop")
    if isinstance(trim, str):
        problem = trim_syntax_problem(trim)
        if problem is not None:
            raise bad_request("bad_field", problem, "trim")
    return EditRequest(
        trim=trim,
        clear_trim="trim" in body and body["trim"] is None,
        task=task,
        clear_task="task" in body and task is None,
        drop=drop,
    )


def _trim(value: object) -> str | tuple[int, int]:
    if isinstance(value, str):
        return typed_text(value, "trim")
    if (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(b, int) and not isinstance(b, bool) for b in value)
    ):
        return (value[0], value[1])
    shown = repr(value)[:60]
    raise bad_request("bad_field", f'trim: {shown} is not [start, end], "A:B" or null', "trim")


class EpisodeReview:
    """Review of the datasets' episodes; ``changed`` is called when a verdict or note changed."""

    def __init__(self, dirs: DatasetDirs, changed: Callable[[], None]) -> None:
        self.dirs = dirs
        self.changed = changed
        self._videos: dict[tuple[str, str, str], tuple[Any, str]] = {}
        # a trim's kept frames decoded after the answer, not while the operator waits
        self.histograms = BackgroundRecorder()

    def episodes(self, name: str) -> dict[str, Any]:
        from eva.dataset.edits import episode_edits
        from eva.quality.split import plan_split
        from eva.quality.verdicts import quality_issues, read_episode_rows, reason_of, subset_of

        root = self.dirs.root(name)
        if not (root / layout.EPISODES).exists():
            return {"dataset": name, "dir": str(root), "episodes": [], "split": {}, "stale": []}
        root = self.dirs.checked_root(name)
        try:
            rows = read_episode_rows(root)
        except DatasetError as e:
            raise conflict("bad_dataset", str(e)) from None
        try:  # before the rows: a malformed edit names its episode and field here
            plan = plan_split(rows)
        except DatasetError as e:
            raise conflict("bad_dataset", f"{root / layout.EPISODES}: {e}") from None
        episodes = []
        for row in sorted(rows, key=lambda r: r["episode_index"]):
            issues = []
            for item in quality_issues(row):
                if isinstance(item, Mapping):
                    issues.append({**item, "frames": issue_frames(item.get("detail"))})
            episodes.append(
                {
                    "episode_index": row["episode_index"],
                    "length": row.get("length"),
                    "tasks": _texts(row.get("tasks")),
                    "quality": row.get("quality"),
                    "quality_issues": issues,
                    "qc_verdict": row.get("qc_verdict"),
                    "qc_note": row.get("qc_note"),
                    "subset": subset_of(row),
                    "reason": reason_of(row),
                    "video_keys": _texts(row.get("video_keys")),
                    "started_at": row.get("started_at"),
                    "duration_seconds": row.get("duration_seconds"),
                    **_edit_fields(episode_edits(row)),
                }
            )
        return {
            "dataset": name,
            "dir": str(root),
            "episodes": episodes,
            "split": {
                "accepted": plan.accepted,
                "rejected": plan.rejected,
                "dropped": plan.dropped,
            },
            "stale": [f for f, e in export_states(root, plan).items() if e.get("stale")],
        }

    def set_review(self, name: str, index: Any, body: Mapping[str, Any]) -> dict[str, Any]:
        from eva.quality.verdicts import review_episode, subset_of

        check_body(body, ("verdict", "note"))
        if "verdict" not in body and "note" not in body:
            raise bad_request(
                "bad_field", "verdict: give a verdict (pass, fail, null) or a note", "verdict"
            )
        verdict = body.get("verdict")
        if (
            "verdict" in body
            and verdict is not None
            and (not isinstance(verdict, str) or verdict.strip().lower() not in ("pass", "fail"))
        ):
            raise bad_request(
                "bad_field", f'verdict: {verdict!r}: use "pass", "fail" or null', "verdict"
            )
        note = body.get("note")
        if note is not None:
            note = typed_text(note, "note")
        root = self.dirs.checked_root(name)
        episode = self._episode_index(root, index)
        update = self._update(
            "review_failed",
            lambda: review_episode(
                root,
                episode,
                verdict=verdict,
                note=note,
                clear_verdict="verdict" in body and verdict is None,
            ),
        )
        row = update.row
        return {
            "episode_index": episode,
            "qc_verdict": row.get("qc_verdict"),
            "qc_note": row.get("qc_note"),
            "subset": subset_of(row),
            "changed": update.changed,
        }

    def set_edits(self, name: str, index: Any, body: Mapping[str, Any]) -> dict[str, Any]:
        """One edit request (docs/console.md): ``trim`` ([start, end] frames, "A:B" frames or
        seconds, or null to clear), ``task`` (text, or null to clear), ``drop`` (true/false);
        the same ``eva.quality.edits`` call, lock and rule as ``eva edit``."""
        from eva.dataset.edits import episode_edits
        from eva.quality.edits import edit_episodes
        from eva.quality.verdicts import subset_of

        request = edit_request(body)
        root = self.dirs.checked_root(name)
        episode = self._episode_index(root, index)
        update = self._update(
            "edit_failed",
            lambda: edit_episodes(root, [episode], request, record=self.histograms.submit)[0],
        )
        row = update.row
        return {
            "episode_index": episode,
            **_edit_fields(episode_edits(row)),
            "subset": subset_of(row),
            "changed": update.changed,
        }

    def _update(self, failed: str, run: Callable[[], ReviewUpdate]) -> ReviewUpdate:
        """``run()`` (one rewrite of episodes.jsonl), its refusals as HTTP errors (``failed``:
        the code of one the others do not name), and ``changed`` called when the file changed."""
        from eva.dataset.edits import EditError

        try:
            update = run()
        except NotJSONError as e:  # a hand-edited NaN in a row: the file is kept as it is
            raise conflict("invalid_episode_row", str(e)) from None
        except EditError as e:  # a well-formed edit whose trim does not fit the episode
            raise bad_request("bad_field", str(e), "trim") from None
        except DatasetError as e:
            text = str(e)
            if "being saved" in text or "not saved yet" in text:
                raise conflict("episode_saving", text) from None
            raise conflict(failed, text) from None
        if update.changed:
            self.changed()
        return update

    def _episode_index(self, root: Path, index: Any) -> int:
        from eva.quality.verdicts import read_episode_rows

        episode = episode_index(index)
        try:
            indices = {row["episode_index"] for row in read_episode_rows(root)}
        except UnsafePathError as e:
            raise conflict("unsafe_path", str(e)) from None
        except DatasetError as e:
            raise conflict("bad_dataset", str(e)) from None
        if episode not in indices:
            raise not_found(
                "unknown_episode", f"{root.name}: episode {episode} does not exist", "index"
            )
        return episode

    def _reader(self, name: str) -> tuple[Any, Path]:
        """A reader of the dataset for one request. It opens each file it reads beneath the
        checked root (no link at the root or below it) when it reads it."""
        from eva.dataset.reader import DatasetReader

        root = self.dirs.checked_root(name)
        try:
            return DatasetReader(root, root_may_link=False), root
        except DatasetError as e:
            raise conflict("bad_dataset", str(e)) from None

    def video_fd(self, name: str, index: Any, key: str) -> int:
        """An fd of the episode's raw MP4 of camera ``key`` (the caller closes it), opened now
        beneath the dataset root with no link followed at any component
        (``eva.dataset.fsafe.open_beneath``): a directory swapped for a link since an earlier
        request is refused, never followed.

        A replay seeks with many Range requests: the file's place in the dataset is remembered
        while info.json and episodes.jsonl are unchanged (one stat each instead of a reader, the
        rows and the template per request). That is metadata only; the open checks every time.
        """
        root = self.dirs.checked_root(name)
        signature = self._meta_signature(root)
        cached = self._videos.get((name, str(index), key))
        if signature is not None and cached is not None and cached[0] == signature:
            rel = cached[1]
        else:
            rel = self._video_rel(root, index, key)
            if signature is not None:
                self._videos[(name, str(index), key)] = (signature, rel)
        try:
            return fsafe.open_beneath(root, rel)
        except FileNotFoundError:
            raise not_found(
                "missing_video", f"{root / rel}: episode {index} video missing"
            ) from None
        except DatasetError as e:
            raise conflict("unsafe_path", str(e)) from None

    @staticmethod
    def _meta_signature(root: Path) -> tuple[Identity, ...] | None:
        """The identities of info.json and episodes.jsonl (``eva.dataset.identity``: a rewrite
        in place that puts the size, mtime and inode back still changes them), or None when
        either cannot be stat'ed (nothing is then remembered)."""
        identities: list[Identity] = []
        for rel in (layout.INFO, layout.EPISODES):
            identity = file_identity(root / rel)
            if identity is None:
                return None
            identities.append(identity)
        return tuple(identities)

    def _video_rel(self, root: Path, index: Any, key: str) -> str:
        """The MP4's path relative to ``root``, from info.json's template and the episode rows."""
        from eva.dataset.reader import DatasetReader

        try:
            reader = DatasetReader(root, root_may_link=False)
        except DatasetError as e:
            raise conflict("bad_dataset", str(e)) from None
        episode = self._episode_index(root, index)
        if key not in reader.video_keys:
            raise not_found("unknown_camera", f"{root.name}: no video feature {key!r}", "video_key")
        try:
            path: Path = reader.video_path(episode, key)
        except DatasetError as e:
            raise conflict("bad_dataset", str(e)) from None
        return path.relative_to(root).as_posix()

    def series(self, name: str, index: Any, max_points: Any = None) -> dict[str, Any]:
        """Vector features of one episode for the plots, at most ``max_points`` rows (evenly
        picked, first and last kept), with the frame index of each kept row."""
        reader, root = self._reader(name)
        episode = self._episode_index(root, index)
        if max_points is None:
            limit = MAX_SERIES_POINTS
        else:
            try:
                limit = int(max_points)
            except (TypeError, ValueError):
                raise bad_request(
                    "bad_field", f"max_points {max_points!r} is not an integer", "max_points"
                ) from None
            if not 2 <= limit <= 100_000:
                raise bad_request(
                    "bad_field", "max_points must be between 2 and 100000", "max_points"
                )
        try:
            rows = reader.count_rows(episode)
            picked = (
                np.arange(rows)
                if rows <= limit
                else np.unique(np.linspace(0, rows - 1, limit).round().astype(np.int64))
            )
            series = {}
            for key in reader.vector_keys:
                values = reader.read_vector(episode, key)
                if values.ndim == 1:
                    values = values[:, None]
                values = values[picked].astype(np.float64)
                names = reader.features.get(key, {}).get("names")
                if not isinstance(names, list) or len(names) != values.shape[1]:
                    names = [f"{key}[{i}]" for i in range(values.shape[1])]
                series[key] = {
                    "names": [str(n) for n in names],
                    # one list per dimension; null where a value is not finite (JSON has no NaN)
                    "values": [
                        [float(v) if np.isfinite(v) else None for v in values[:, d]]
                        for d in range(values.shape[1])
                    ],
                }
        except UnsafePathError as e:
            raise conflict("unsafe_path", str(e)) from None
        except DatasetError as e:
            raise conflict("bad_dataset", str(e)) from None
        return {
            "dataset": name,
            "episode_index": episode,
            "fps": reader.fps,
            "length": rows,
            "frame_index": picked.tolist(),
            "series": series,
        }
