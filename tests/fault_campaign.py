"""Fault injection: ``kill -9`` at random instants of recording, STOP/save, encoding and recovery,
for ``eva collect`` and for the console's recorder; after each kill, recovery, then the checks
eva promises (docs/safety.md, "A recording survives a kill"):

- ``eva validate`` accepts the dataset;
- every episode committed before the kill is still there, unchanged (index, length, task);
- a kill while an episode recorded leaves, after recovery, an episode holding all but at most
  the last ``LOSS_BOUND_S`` seconds of what was captured (from START to the kill).

``tests/test_crash_recovery.py`` runs a short campaign; ``make faults`` runs
``python tests/fault_campaign.py --kills 1000``. Each kill is one ``Kill`` record; the summary
counts the kills per phase and every violation.
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

EVA = [sys.executable, "-m", "eva.cli"]
FPS = 30
LOSS_BOUND_S = 2.0
EPISODE_S = 3.5  # longer than LOSS_BOUND_S, so that kills late in an episode test the bound
EPISODES = 2
KILLS_PER_DATASET = 8

CONFIG = """
[collection]
log_dir = "{log_dir}"
fps = {fps}
min_episode_frames = 3

[collection.tasks]
faults = ["pick up the cube"]

[[collection.cameras]]
key = "observation.images.front"
width = 96
height = 64

[[collection.cameras]]
key = "observation.images.wrist"
width = 96
height = 64

[[collection.vectors]]
name = "observation.state"
dim = 14
discrete = [6, 13]

[[collection.vectors]]
name = "action"
dim = 14

[collection.encoder]
preset = "ultrafast"
"""


@dataclass
class Kill:
    """One kill and what the checks found after it."""

    number: int
    mode: str  # collect | console | recover
    phase: str = ""  # recording | saving | between | starting | recovery
    at_s: float = 0.0  # seconds after the process started
    captured_s: float | None = None  # recording: START -> kill
    recovered_frames: int | None = None
    problems: list[str] = field(default_factory=list)


def write_config(directory: Path) -> Path:
    path = directory / "rig.toml"
    path.write_text(CONFIG.format(log_dir=directory / "logs", fps=FPS))
    return path


def dataset_dir(directory: Path) -> Path:
    return directory / "logs" / "faults" / "raw"


def committed_rows(raw: Path) -> dict[int, tuple[int, list[str]]]:
    """episode_index -> (length, tasks) of the committed rows (complete lines only)."""
    path = raw / "meta" / "episodes.jsonl"
    rows: dict[int, tuple[int, list[str]]] = {}
    if not path.exists():
        return rows
    data = path.read_bytes()
    for line in data.split(b"\n")[: data.count(b"\n")]:
        if line.strip():
            row = json.loads(line)
            rows[int(row["episode_index"])] = (int(row["length"]), list(row["tasks"]))
    return rows


class Lines:
    """A child's stderr lines, each with the monotonic time it arrived."""

    def __init__(self, stream: Any) -> None:
        self.lines: list[tuple[float, str]] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: Any) -> None:
        for raw in iter(stream.readline, b""):
            self.lines.append((time.monotonic(), raw.decode(errors="replace").rstrip()))

    def join(self) -> None:
        self._thread.join(5)


def kill_collect(config: Path, rng: random.Random, kill: Kill) -> None:
    """``eva collect`` recording episodes back to back, killed at a random instant; the
    recording episode's START is read from its announcement line."""
    episodes = EPISODES
    proc = subprocess.Popen(
        [*EVA, "collect", str(config), "--episodes", str(episodes), "--seconds", str(EPISODE_S)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    began = time.monotonic()
    lines = Lines(proc.stderr)
    # Half the kills aim at a STOP/save (the instants after an episode's end), the rest anywhere.
    while not any("recording" in text for _, text in lines.lines):
        if proc.poll() is not None or time.monotonic() - began > 60:
            break
        time.sleep(0.01)
    first = next((t for t, text in lines.lines if "recording" in text), time.monotonic())
    if rng.random() < 0.5:
        target = first + rng.uniform(0.0, episodes * EPISODE_S)
    else:
        target = first + (rng.randrange(episodes) + 1) * EPISODE_S + rng.uniform(0.0, 0.4)
    time.sleep(max(target - time.monotonic(), 0.0))
    proc.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    proc.wait()
    lines.join()
    kill.at_s = killed - began
    starts = [t for t, text in lines.lines if ": recording" in text and t <= killed]
    if not starts:
        kill.phase = "starting"
    elif killed - starts[-1] < EPISODE_S:
        kill.phase = "recording"
        kill.captured_s = killed - starts[-1]
    else:
        kill.phase = "saving"


def kill_console(config: Path, directory: Path, rng: random.Random, kill: Kill) -> None:
    """The console's recorder: START through the API, then a kill while recording or saving."""
    sys.path.insert(0, str(Path(__file__).parent))
    from console_server import ConsoleServer

    server = ConsoleServer(config, directory / "token")
    began = time.monotonic()
    server.start(timeout=60)
    assert server.process is not None
    try:
        client = server.client()
        response = client.post("/api/collect/start", json={"dataset": "faults"})
        started = time.monotonic()
        if response.status_code != 200:
            kill.problems.append(f"console START answered {response.status_code}")
        if rng.random() < 0.6:
            time.sleep(rng.uniform(0.0, 3.0))
            phase = "recording"
        else:
            time.sleep(rng.uniform(0.5, 2.0))
            client.post("/api/collect/stop")
            time.sleep(rng.uniform(0.0, 0.5))
            phase = "saving"
        server.process.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        server.process.wait()
        kill.at_s = killed - began
        kill.phase = phase
        if phase == "recording":
            kill.captured_s = killed - started
    finally:
        server.stop()


def kill_recover(raw: Path, rng: random.Random, kill: Kill) -> None:
    """``eva recover`` itself killed at a random instant (there may be nothing to recover)."""
    proc = subprocess.Popen(
        [*EVA, "recover", str(raw)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    began = time.monotonic()
    time.sleep(rng.uniform(0.0, 1.5))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    kill.at_s = time.monotonic() - began
    kill.phase = "recovery"


def check_after(raw: Path, before: dict[int, tuple[int, list[str]]], kill: Kill) -> None:
    """Recover, then the promises: a valid dataset, earlier episodes kept, at most 2 s lost.

    Recovery and validation run in this process (the code ``eva recover`` and ``eva validate``
    run, without two interpreter start-ups per kill)."""
    from eva.dataset.errors import DatasetError
    from eva.dataset.validate import validate_dataset
    from eva.dataset.writer import DatasetWriter

    if not (raw / "meta" / "info.json").exists():
        if before:
            kill.problems.append("the dataset disappeared")
        return
    try:
        writer = DatasetWriter.open_existing(raw)
    except DatasetError as e:
        kill.problems.append(f"recovery refused the dataset: {e}")
        return
    writer.close()
    for result in writer.recovered:
        if result.error is not None:
            kill.problems.append(f"recovery failed: {result.line()}")
    problems = validate_dataset(raw)
    if problems:
        kill.problems.append(f"eva validate refused the dataset: {problems}")
    after = committed_rows(raw)
    for index, row in before.items():
        if after.get(index) != row:
            kill.problems.append(f"episode {index} lost or changed: {row} -> {after.get(index)}")
    kill.recovered_frames = max((r.frames for r in writer.recovered), default=0)
    if kill.captured_s is not None:
        # The episode that was recording is the longest one recovered now (another may be an
        # episode that was saving when the kill came).
        need = int((kill.captured_s - LOSS_BOUND_S) * FPS)
        if kill.recovered_frames < need:
            kill.problems.append(
                f"killed {kill.captured_s:.2f} s into an episode: {kill.recovered_frames} frames "
                f"kept, at least {need} expected"
            )


def campaign(
    kills: int, workdir: Path, seed: int, *, console_share: float = 0.15,
    recover_share: float = 0.1, progress: Callable[[Kill], None] | None = None,
) -> list[Kill]:  # fmt: skip
    rng = random.Random(seed)
    results: list[Kill] = []
    directory = workdir
    for number in range(kills):
        if number % KILLS_PER_DATASET == 0:
            directory = Path(tempfile.mkdtemp(prefix=f"d{number:04d}-", dir=workdir))
            config = write_config(directory)
        raw = dataset_dir(directory)
        before = committed_rows(raw)
        draw = rng.random()
        has_spool = raw.exists() and any((raw / ".eva-work").glob("ep-*/spool.json"))
        if draw < recover_share and has_spool:
            kill = Kill(number, "recover")
            kill_recover(raw, rng, kill)
        elif draw < recover_share + console_share:
            kill = Kill(number, "console")
            kill_console(config, directory, rng, kill)
        else:
            kill = Kill(number, "collect")
            kill_collect(config, rng, kill)
        if kill.mode != "recover" and rng.random() < 0.3 and kill.phase != "starting":
            # Sometimes the kill is left for the next run to recover (or to kill again).
            results.append(kill)
            if progress:
                progress(kill)
            continue
        check_after(raw, before, kill)
        results.append(kill)
        if progress:
            progress(kill)
    return results


def summary(results: list[Kill]) -> dict[str, Any]:
    recording = [k for k in results if k.captured_s is not None]
    checked = [k for k in recording if k.recovered_frames is not None]
    # seconds of capture a kill lost, over the kills after more than the bound was captured
    lost = [
        (k.captured_s or 0.0) - (k.recovered_frames or 0) / FPS
        for k in checked
        if (k.captured_s or 0.0) > LOSS_BOUND_S
    ]
    return {
        "kills": len(results),
        "by_mode": dict(Counter(k.mode for k in results)),
        "by_phase": dict(Counter(k.phase for k in results)),
        "violations": sum(1 for k in results if k.problems),
        "problems": [
            f"kill {k.number} ({k.mode}/{k.phase}): {p}" for k in results for p in k.problems
        ],
        "kills_while_recording": len(recording),
        "recording_kills_checked": len(checked),
        "max_lost_s": round(max(lost, default=0.0), 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="write every kill's record here")
    parser.add_argument("--jobs", type=int, default=1, help="campaigns side by side")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="eva-faults-"))
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    done = [0]

    def progress(kill: Kill) -> None:
        mark = "FAIL " + "; ".join(kill.problems) if kill.problems else "ok"
        captured = ""
        if kill.captured_s is not None:
            captured = f" captured {kill.captured_s:.2f} s, kept {kill.recovered_frames} frames"
        done[0] += 1
        print(f"[{done[0]}/{args.kills}] {kill.mode}/{kill.phase} at {kill.at_s:.2f} s"
              f"{captured}: {mark}", flush=True)  # fmt: skip

    shares = [args.kills // args.jobs + (i < args.kills % args.jobs) for i in range(args.jobs)]
    parts: list[list[Kill]] = [[] for _ in shares]

    def run(i: int) -> None:
        part = workdir / f"job{i}"
        part.mkdir(exist_ok=True)
        parts[i] = campaign(shares[i], part, args.seed + i, progress=progress)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(args.jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    results = [kill for part in parts for kill in part]
    report = summary(results)
    report["seed"] = args.seed
    report["minutes"] = round((time.monotonic() - started) / 60, 1)
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps({**report, "kills_detail": [asdict(k) for k in results]}))
    return 1 if report["violations"] else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
