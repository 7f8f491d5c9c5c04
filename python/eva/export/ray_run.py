"""The ``ray`` executor: an export's per-episode tasks on a Ray cluster (the optional extra
``eva[ray]``).

The driver connects to ``--ray-address`` (else ``RAY_ADDRESS``; else it starts a local Ray for
this export alone; a process already connected by its own ``ray.init`` uses that connection) and makes one actor per worker (one CPU each; default: the cluster's CPUs,
never more than the tasks). Like a pool worker, an actor opens the source once and keeps one
session (memory bounded per actor) for every task it is given, one task at a time. Workers read
the source and write into the staging directory by their absolute paths: every node must see
both at the same paths (a shared filesystem). The driver alone finishes the subsets and
publishes the pair.

A task's error comes back as it does from the pool. An actor that dies (its process killed, its
node lost) fails the export naming the episode it was writing; there is no retry. Before the
error is raised every actor is killed and its in-flight task awaited as failed, so nothing
writes into the staging directory once the pipeline removes it.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

from eva.dataset.errors import DatasetError
from eva.dataset.reader import DatasetReader
from eva.export.executors import TaskBatch, TaskFailure, episode_name, failure_of, task_error
from eva.formats.base import ExportOptions
from eva.formats.catalog import FormatEntry
from eva.formats.tasks import EpisodeResult, ExportTask, report_result
from eva.progress import ProgressSink

RAY_EXTRA_MISSING = "executor ray needs Ray: pip install 'eva[ray]'"
# The process environment a worker takes from the driver (the reference implementations).
FORWARDED_ENVIRON = ("EVA_PUREPYTHON", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def import_ray() -> Any:
    """The ``ray`` module, or the one-line error naming the extra."""
    try:
        import ray
    except ImportError:
        raise DatasetError(RAY_EXTRA_MISSING) from None
    return ray


class EpisodeActor:
    """A Ray actor: one source reader and one session for all the tasks it is given."""

    def __init__(self, fmt: FormatEntry, source: str, options: ExportOptions, threads: int) -> None:
        from eva.dataset.video import set_decode_threads

        set_decode_threads(threads)
        episodes = fmt.load().TASKS
        assert episodes is not None  # checked by the driver
        self.session = episodes.open_episode_writer(DatasetReader(source), options)

    def pid(self) -> int:
        return os.getpid()

    def write(self, task: ExportTask) -> EpisodeResult | TaskFailure:
        try:
            return self._write(task)
        except Exception as e:
            return failure_of(e)

    def _write(self, task: ExportTask) -> EpisodeResult:
        from eva.export.executors import write_task

        return write_task(self.session, task)


class RayRun:
    """One export's tasks on actors of the cluster at ``address`` (``workers`` of them, default
    the cluster's CPUs)."""

    def __init__(self, batch: TaskBatch, workers: int | None, address: str | None) -> None:
        self.ray = import_ray()
        self.tasks = list(batch.tasks)
        address = address or os.environ.get("RAY_ADDRESS") or "local"
        environ = {k: os.environ[k] for k in FORWARDED_ENVIRON if k in os.environ}
        # A caller already connected (its own ray.init) keeps its connection; ours is closed.
        self.connected = not self.ray.is_initialized()
        try:
            if self.connected:
                self.ray.init(
                    address=address,
                    runtime_env={"env_vars": environ} if environ else None,
                    include_dashboard=False if address == "local" else None,
                    log_to_driver=False,
                    logging_level=logging.ERROR,
                    configure_logging=True,
                )
        except Exception as e:  # noqa: BLE001 - Ray's own error types; one line either way
            raise DatasetError(f"ray cluster {address}: cannot connect ({e})") from None
        cpus = int(self.ray.cluster_resources().get("CPU", 1))
        self.count = max(1, min(workers or cpus, len(self.tasks)))
        actor = self.ray.remote(num_cpus=1, max_restarts=0)(EpisodeActor)
        # One decoder thread per actor: an actor holds one CPU of the cluster.
        self.actors = [
            actor.remote(batch.fmt, str(batch.source), batch.options, 1) for _ in range(self.count)
        ]

    def run(self, progress: ProgressSink) -> list[EpisodeResult]:
        ray = self.ray
        results: dict[int, EpisodeResult] = {}
        running: dict[Any, tuple[int, int]] = {}  # ref -> (task number, actor slot)
        queue = list(range(len(self.tasks)))
        try:
            for slot in range(self.count):
                if queue:
                    self.submit(queue.pop(0), slot, running)
            while running:
                done, _ = ray.wait(list(running), num_returns=1)
                number, slot = running.pop(done[0])
                results[number] = self.outcome(done[0], number)
                report_result(progress, results[number])
                if queue:
                    self.submit(queue.pop(0), slot, running)
        except BaseException:
            self.stop(running)
            raise
        self.stop({})
        return [results[number] for number in range(len(self.tasks))]

    def submit(self, number: int, slot: int, running: dict[Any, tuple[int, int]]) -> None:
        running[self.actors[slot].write.remote(self.tasks[number])] = (number, slot)

    def outcome(self, ref: Any, number: int) -> EpisodeResult:
        try:
            outcome = self.ray.get(ref)
        except self.ray.exceptions.RayError as e:
            raise DatasetError(
                f"export worker (Ray actor) died while writing {episode_name(self.tasks[number])} "
                f"({type(e).__name__}); nothing was published"
            ) from None
        if isinstance(outcome, EpisodeResult):
            return outcome
        raise task_error(outcome, self.tasks[number])

    def stop(self, running: dict[Any, tuple[int, int]]) -> None:
        """Kill every actor, wait until their in-flight tasks are over (failed), disconnect."""
        ray = self.ray
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        for ref in running:
            # the actor is dead: its task fails, which is what is waited for here
            with contextlib.suppress(Exception):
                ray.get(ref)
        if self.connected:
            ray.shutdown()
