"""``eva collect`` on a terminal: keys start, stop and cancel episodes under a live status line."""

from __future__ import annotations

import sys
from typing import Any

from eva.cli.collect_screen import (
    CaptureLogHandler,
    EpisodeNumbers,
    JobReporter,
    StatusScreen,
    collect_status_line,
)

KEYS_HELP = (
    "keys: s START  e STOP  c CANCEL  q quit  d next dataset  t next task  "
    "(Ctrl-C cancels and quits)"
)


class InteractiveCollect:
    """The screen's choices (dataset, task prompt) and what each key does to the recorder."""

    def __init__(
        self, recorder: Any, rec_source: Any, dataset: str | None, task: str | None
    ) -> None:
        self.recorder = recorder
        self.rec_source = rec_source
        self.datasets = list(recorder.config.tasks)
        self.name = dataset if dataset is not None else recorder.default_dataset
        self.prompt = task or recorder.config.tasks[self.name][0]
        self.numbers = EpisodeNumbers(recorder)
        self.screen = StatusScreen()

    def announce_dataset(self) -> None:
        root = self.recorder.dataset_dir(self.name)
        self.screen.say(
            f"dataset {self.name} -> {root} (next episode {self.numbers.next_index(root)})"
        )

    def handle(self, key: str) -> bool:
        """One key; True to quit."""
        from eva.capture.recorder import RecorderError

        recorder, screen = self.recorder, self.screen
        try:
            if key in ("d", "t") and recorder.recording:
                screen.say("STOP or CANCEL before changing the dataset or task")
            elif key == "d":
                self.name = self.datasets[(self.datasets.index(self.name) + 1) % len(self.datasets)]
                self.prompt = recorder.config.tasks[self.name][0]
                self.announce_dataset()
                screen.say(f"task: {self.prompt}")
            elif key == "t":
                prompts = recorder.config.tasks[self.name]
                position = prompts.index(self.prompt) if self.prompt in prompts else -1
                self.prompt = prompts[(position + 1) % len(prompts)]
                screen.say(f"task: {self.prompt}")
            elif key == "s":
                for (
                    message
                ) in self.rec_source.before_start():  # stopped source processes: restarted
                    screen.say(f"eva: note: {message}")
                recorder.start(self.name, self.prompt)
            elif key == "e":
                recorder.stop()
            elif key == "c":
                recorder.cancel()
                screen.say("episode cancelled")
            elif key == "q":
                if not recorder.recording:
                    return True
                screen.say("STOP (e) or CANCEL (c) the episode before quitting")
        except RecorderError as e:
            screen.say(str(e))
        return False

    def refresh(self, handler: CaptureLogHandler, reporter: JobReporter) -> None:
        """Log lines and saved episodes above the status line, then the status line."""
        for line in handler.pending():
            self.screen.say(line)
        for job in reporter.new(self.recorder.jobs):
            self.screen.say(reporter.line(job))
        episode = self.numbers.next_index(self.recorder.dataset_dir(self.name))
        self.screen.draw(collect_status_line(self.recorder.status(), episode))


def collect_interactive(
    recorder: Any,
    rec_source: Any,
    reporter: JobReporter,
    handler: CaptureLogHandler,
    dataset: str | None,
    task: str | None,
) -> None:
    """Run the screen until ``q`` (or the source ends); Ctrl-C or a closed terminal raise
    KeyboardInterrupt (the caller cancels a recording episode)."""
    import os
    import select
    import termios
    import time
    import tty

    session = InteractiveCollect(recorder, rec_source, dataset, task)
    screen = session.screen
    fd = sys.stdin.fileno()
    saved_mode = termios.tcgetattr(fd)
    tty.setcbreak(fd)  # before the banner: keys typed right after it must not sit in a line buffer
    handler.held = True  # log lines go above the status line, never into it
    try:
        session.announce_dataset()
        screen.say(f"task: {session.prompt}")
        screen.say(KEYS_HELP)
        while True:
            ready, _, _ = select.select([sys.stdin], [], [], 0.25)
            # Every key typed since the last turn (a buffered read(1) would hide the rest from
            # select until the next key arrives).
            data = os.read(fd, 64) if ready else b"-"
            if not data:  # the terminal is gone: as Ctrl-C (cancel a recording, exit 130)
                raise KeyboardInterrupt
            keys = data.decode(errors="ignore").lower() if ready else ""
            if any(session.handle(key) for key in keys):
                break
            session.refresh(handler, reporter)
            if rec_source.finished.is_set():
                screen.say("source ended")
                break
            time.sleep(0)
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved_mode)
        screen.end()
        handler.resume()
    recorder.wait_idle()
    reporter.flush(recorder.jobs)
