"""Where an export's tasks run: in this process, on a local process pool, or on a
Ray cluster (``eva.export.ray_run``).

A task format (``eva.formats.tasks.TaskFormat``, a format's ``TASKS``) cuts each subset into tasks: one output episode
each for hdf5, mcap and lerobot_v21 (``EpisodeFormat``), one data or video file each for
lerobot_v3 (planned from the source sizes first). ``run_episode_tasks`` runs them:

- ``serial``: one session in this process, tasks in output order (``serial_threads`` at a time);
- ``processes``: a ``ProcessPoolExecutor`` (spawn context: a worker starts from a fresh
  interpreter, with this process's environment, e.g. ``EVA_PUREPYTHON``). Each worker opens the
  source once and keeps one session (its reused buffers: memory bounded per worker) for all the
  tasks it is given.

Either way a task writes its file into the staging directory and hands back a small
``EpisodeResult``; the progress counts (episodes, files, bytes) follow the results as they
arrive, and the driver (``eva.export.pipeline``) finishes each subset and publishes the pair.
The files do not depend on the executor: a task is a pure function of its fields and the
source's files.

A task that fails stops the export: its ``DatasetError`` as it is (it names file, episode and
field), any other error as a ``DatasetError`` naming the episode. A worker that dies (killed,
out of memory) fails the export naming the episodes being written at the time. In both cases the
other workers are stopped before the error is raised, so nothing writes into the staging
directory once the pipeline removes it.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import pickle
import signal
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eva.dataset.errors import DatasetError, error_line, naming_write_errors
from eva.dataset.reader import DatasetReader
from eva.formats.base import ExportOptions
from eva.formats.catalog import FormatEntry
from eva.formats.tasks import (
    EpisodeResult,
    EpisodeWriterSession,
    ExportTask,
    TaskFormat,
    TaskT,
    report_result,
    run_ordered,
)
from eva.progress import ProgressSink

EXECUTORS = ("serial", "processes", "ray")
# A task's slot in the shared status array: not started, or done; else the pid writing it.
NOT_STARTED, DONE = 0, -1


def free_cores() -> int:
    """The cores this process may run on."""
    with contextlib.suppress(AttributeError, OSError):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def default_executor(fmt: FormatEntry) -> str:
    """``processes`` when the format writes tasks and at least its ``pool_from_cores`` cores
    are free (hdf5: 2, mcap: 4), else ``serial``."""
    tasks = fmt.load().TASKS
    if tasks is not None and free_cores() >= tasks.pool_from_cores:
        return "processes"
    return "serial"


def episode_name(task: ExportTask) -> str:
    """The episode as errors name it: its label, with its subset."""
    return task.label if task.label.startswith(task.subset) else f"{task.subset} {task.label}"


def write_task(session: EpisodeWriterSession[TaskT], task: TaskT) -> EpisodeResult:
    """One task through ``session``; a write failure names its file, any other error that is
    not a ``DatasetError`` is one naming the episode."""
    try:
        with naming_write_errors(task.subset_dir):
            return session.write(task)
    except DatasetError:
        raise
    except Exception as e:
        raise DatasetError(f"{episode_name(task)}: {error_line(e)}") from e


def run_episode_tasks(
    fmt: FormatEntry,
    episodes: TaskFormat[TaskT],
    reader: DatasetReader,
    tasks: Sequence[TaskT],
    progress: ProgressSink,
    *,
    options: ExportOptions,
    executor: str = "serial",
    workers: int | None = None,
    ray_address: str | None = None,
) -> list[EpisodeResult]:
    """Run ``tasks`` (every subset's) and return their results in task order. ``workers``: the
    pool's size (default: the free cores, or the Ray cluster's CPUs; never more than the
    tasks); a pool of one is the serial executor. ``ray_address``: the ``ray`` executor's
    cluster (``eva.export.ray_run``)."""
    if executor not in EXECUTORS:
        raise DatasetError(f"executor {executor!r}: use one of {', '.join(EXECUTORS)}")
    batch = TaskBatch(fmt, Path(reader.root), options, tasks)
    if executor == "ray" and tasks:
        from eva.export.ray_run import RayRun

        return RayRun(batch, workers, ray_address).run(progress)
    count = min(workers or free_cores(), len(tasks))
    if executor == "serial" or count <= 1:
        session = episodes.open_episode_writer(reader, options)
        try:
            return run_ordered(
                lambda task: write_task(session, task), tasks, progress, episodes.serial_threads
            )
        finally:
            session.close()
    return ProcessRun(batch, count).run(progress)


# ---- the process pool ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskFailure:
    """A task's error as it travels back to the driver: the exception itself when it survives
    pickling, else its one line."""

    error: BaseException | None
    line: str


def failure_of(error: Exception) -> TaskFailure:
    """``error``, raised by a task in a worker, as it travels back."""
    line = str(error) if isinstance(error, DatasetError) else error_line(error)
    return TaskFailure(travelling(error), line)


def task_error(failure: TaskFailure, task: ExportTask) -> DatasetError:
    """The error the driver raises for ``failure``: a ``DatasetError`` as it is, any other one
    naming the episode."""
    if isinstance(failure.error, DatasetError):
        return failure.error
    error = DatasetError(f"{episode_name(task)}: {failure.line}")
    error.__cause__ = failure.error
    return error


@dataclass(frozen=True)
class TaskBatch:
    """What every worker of an executor is given: the format, the source, the options, and
    the tasks to spread over them."""

    fmt: FormatEntry
    source: Path
    options: ExportOptions
    tasks: Sequence[ExportTask]


class ProcessRun:
    """One export's tasks on a process pool of ``count`` workers."""

    def __init__(self, batch: TaskBatch, count: int) -> None:
        fmt, source, options = batch.fmt, batch.source, batch.options
        self.tasks = list(batch.tasks)
        self.context = multiprocessing.get_context("spawn")
        # Per task: NOT_STARTED, DONE or the pid of the worker writing it (no lock: one writer
        # per slot).
        self.status = self.context.RawArray("q", len(self.tasks))
        self.pool = ProcessPoolExecutor(
            max_workers=count,
            mp_context=self.context,
            initializer=start_worker,
            initargs=(fmt, str(source), options, self.status, decoder_threads(count), os.getpid()),
        )

    def run(self, progress: ProgressSink) -> list[EpisodeResult]:
        results: dict[int, EpisodeResult] = {}
        try:
            pending: set[Future[EpisodeResult | TaskFailure]] = set()
            numbers: dict[Future[EpisodeResult | TaskFailure], int] = {}
            for number, task in enumerate(self.tasks):
                future = self.pool.submit(run_task, number, task)
                numbers[future] = number
                pending.add(future)
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in sorted(done, key=numbers.__getitem__):
                    outcome = self.outcome(future, numbers[future])
                    results[numbers[future]] = outcome
                    report_result(progress, outcome)
        except BaseException:
            self.stop()
            raise
        # Every result is in: stop the idle workers rather than send them the shutdown
        # sentinel. An idle worker waits for its next task holding the task queue's read lock;
        # one killed there (kill -9, the OOM killer) after the last task never releases it, and
        # a graceful shutdown would then wait forever for its siblings to read their sentinels.
        self.stop()
        return [results[number] for number in range(len(self.tasks))]

    def outcome(self, future: Future[EpisodeResult | TaskFailure], number: int) -> EpisodeResult:
        try:
            outcome = future.result()
        except BrokenProcessPool:
            self.stop()
            raise self.death_error() from None
        if isinstance(outcome, EpisodeResult):
            return outcome
        raise task_error(outcome, self.tasks[number])

    def stop(self) -> None:
        """Stop every worker now (the tasks they are writing, if any, are abandoned) and wait
        for them."""
        # The pool's own process handles: they include a worker still starting (its initializer
        # not run yet), and Process.terminate signals only a process not reaped yet (a reaped
        # worker's pid may be another process's by now). The private attribute is the one way
        # to a pool's processes; a pool without it is left to shut down by itself.
        processes = getattr(self.pool, "_processes", None) or {}
        for process in list(processes.values()):
            with contextlib.suppress(OSError, ValueError):
                process.terminate()
        # One shutdown that waits: it joins the workers (a first one that does not wait would
        # forget them, and the staging directory could be removed under a live one).
        self.pool.shutdown(wait=True, cancel_futures=True)

    def death_error(self) -> DatasetError:
        if all(state == NOT_STARTED for state in self.status):
            # No task began: the workers failed to start (their traceback is on stderr). The
            # usual cause: a script that runs the export at import time, which every spawned
            # worker then runs again as it imports the script.
            return DatasetError(
                "export worker processes failed to start (their error is above); a script "
                "exporting with executor='processes' must do so under "
                "`if __name__ == '__main__':`; nothing was published"
            )
        running = [episode_name(self.tasks[n]) for n, state in enumerate(self.status) if state > 0]
        where = f" while writing {', '.join(running)}" if running else " between episodes"
        return DatasetError(
            f"export worker process died (killed, or out of memory){where}; nothing was published"
        )


# ---- in the worker process ------------------------------------------------------------------


@dataclass
class Worker:
    # The session of the format's own task type: the tasks it is given are that format's.
    session: EpisodeWriterSession[ExportTask]
    status: Any  # the shared per-task status array


WORKER: list[Worker] = []  # this process's worker, once start_worker ran


def decoder_threads(workers: int) -> int:
    """Threads per video decoder in each of ``workers`` processes: their share of the free
    cores. FFmpeg's default (one thread per core in every decoder) oversubscribes the cores
    ``workers`` times over; the MCAP export also decodes its cameras on threads of their own."""
    return max(1, free_cores() // workers)


def start_worker(
    fmt: FormatEntry, source: str, options: ExportOptions, status: Any, threads: int, parent: int
) -> None:
    """Pool initializer: open the source and one session for all this worker's tasks.

    First, the worker is made to die with ``parent``, the eva process: a ``kill -9`` of it
    leaves workers blocked on the task queue forever (the queue's pipe stays open in each
    worker), and with them multiprocessing's resource tracker (it ends, and removes the pool's
    semaphores from /dev/shm, when the last process holding its pipe is gone). The thread that
    made the pool outlives it (``ProcessRun.run`` stops the pool), as the death signal needs."""
    from eva import libc
    from eva.dataset.video import set_decode_threads

    libc.die_with_parent(parent, signal.SIGKILL)

    set_decode_threads(threads)

    # Ctrl-C reaches the whole process group: the driver alone handles it (it stops the pool).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    episodes = fmt.load().TASKS
    assert episodes is not None  # checked by the driver
    session = episodes.open_episode_writer(DatasetReader(source), options)
    atexit.register(session.close)
    WORKER.append(Worker(session, status))


def run_task(number: int, task: ExportTask) -> EpisodeResult | TaskFailure:
    """One task in a worker; its error comes back as a ``TaskFailure``."""
    worker = WORKER[0]
    worker.status[number] = os.getpid()
    try:
        return write_task(worker.session, task)
    except Exception as e:
        return failure_of(e)
    finally:
        worker.status[number] = DONE


def travelling(error: BaseException) -> BaseException | None:
    """``error`` if it pickles and unpickles (an exception class whose constructor takes other
    arguments does not), else None."""
    try:
        copy = pickle.loads(pickle.dumps(error))
    except Exception:  # noqa: BLE001 - any failure means: send the line only
        return None
    return copy if isinstance(copy, BaseException) else None
