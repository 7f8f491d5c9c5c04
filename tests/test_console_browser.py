"""The operator console in a real headless Chromium, against the real ``eva console`` server.

One server (simulated rig, no upload backend) and one browser serve the module; the upload test
starts a second server whose config names the real OpenSSH fixture of ``sftp_server.py``. Each
test opens the printed URL afresh and sets up what it is not about through the HTTP API (Bearer
token), so the tests do not depend on their order. Screenshots of every panel go to
``$EVA_TEST_ARTIFACTS`` (default: a pytest temp directory); ``EVA_UPDATE_SCREENSHOT=1`` also
writes ``docs/console-quality-check.png``.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
    # `make test` installs them (scripts/system_deps.sh): a missing browser is an error, never a
    # silently skipped UI.
    raise RuntimeError(
        f"the console's browser tests need Debian's chromium and chromium-driver ({CHROMIUM}, "
        f"{CHROMEDRIVER}): run `make test` as root, or apt-get install chromium chromium-driver"
    )

import av  # noqa: E402
import httpx  # noqa: E402
import numpy as np  # noqa: E402
import paramiko  # noqa: E402
from console_server import ConsoleServer, record_episode, wait_job  # noqa: E402
from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402
from sftp_server import SshdServer  # noqa: E402

from eva.capture.synthetic import write_synthetic_dataset  # noqa: E402

pytest_plugins = ["sftp_server"]

pytestmark = pytest.mark.realtime

REPO = Path(__file__).resolve().parents[1]
VARIANT = "pure" if os.environ.get("EVA_PUREPYTHON") == "1" else "native"

CONFIG = """\
[collection]
log_dir = "logs"
fps = 30
min_episode_frames = 10

[collection.tasks]
pick_cube = ["pick up the red cube"]
fold_towel = ["fold the towel in half", "fold the towel in thirds"]
sort_parts = ["sort the parts by colour"]  # written by write_synthetic_dataset, never recorded

[[collection.cameras]]
key = "observation.images.cam_high"
width = 160
height = 120

[[collection.cameras]]
key = "observation.images.cam_wrist"
width = 160
height = 120

[[collection.vectors]]
name = "observation.state"
dim = 6

[[collection.vectors]]
name = "action"
dim = 6
"""


# ---- the server ---------------------------------------------------------------------------


@dataclass
class Console:
    """A running ``eva console`` (tests/console_server.py) and an API client with its token."""

    server: ConsoleServer
    api: httpx.Client

    @property
    def url(self) -> str:  # http://127.0.0.1:PORT/?token=...
        return self.server.url

    @property
    def base(self) -> str:
        return self.server.base

    def record(self, dataset: str, seconds: float, task: str | None = None) -> int:
        """Record one episode through the API; the saved episode's index."""
        job = record_episode(self.api, dataset, seconds, task)
        assert job["state"] == "saved", job
        return job["episode_index"]

    def export(self, dataset: str, fmt: str) -> dict[str, Any]:
        response = self.api.post(f"/api/datasets/{dataset}/export", json={"format": fmt})
        assert response.status_code == 202, response.text
        return wait_job(self.api, response.json()["job_id"], timeout=60)


def start_console(workdir: Path, config_text: str) -> Console:
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "rig.toml"
    config.write_text(config_text)
    server = ConsoleServer(config, workdir / "token").start()
    assert server.url.startswith("http://127.0.0.1:"), server.url
    assert server.token == (workdir / "token").read_text().strip()
    return Console(server, server.client())


FROZEN_DETAIL = (
    "camera observation.images.cam_high: identical images from sample 12 (t=0.400 s) near "
    "frame 12 for at least 1.0 s"
)


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    workdir = tmp_path_factory.mktemp("console")
    # A dataset with a red episode whose issue names a frame, as the recorder would write it.
    write_synthetic_dataset(
        workdir / "logs" / "sort_parts" / "raw",
        episodes=2,
        frames=[40, 45],
        cameras=["observation.images.cam_high", "observation.images.cam_wrist"],
        width=160,
        height=120,
        fps=30,
        state_dim=6,
        quality=["green", "red"],
        quality_issues=[
            None,
            [{"severity": "red", "code": "frozen_camera", "detail": FROZEN_DETAIL}],
        ],
        tasks=["sort the parts by colour"],
    )
    server = start_console(workdir, CONFIG)
    try:
        yield server
    finally:
        server.server.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--autoplay-policy=no-user-gesture-required",
        "--window-size=1400,1000",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_script_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    configured = os.environ.get("EVA_TEST_ARTIFACTS")
    path = Path(configured) / "console" if configured else tmp_path_factory.mktemp("artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


# ---- page helpers -------------------------------------------------------------------------


def wait_until(driver: WebDriver, condition: Callable[[], Any], what: str, timeout: float = 20):
    """Poll ``condition`` (stale elements count as "not yet") until it is truthy."""

    def check(_driver: WebDriver) -> Any:
        try:
            return condition()
        except StaleElementReferenceException:
            return False

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.1).until(check)
    except Exception as e:
        toast = driver.execute_script("return document.getElementById('toast').textContent")
        raise AssertionError(f"timed out waiting for {what} (toast: {toast!r})") from e


def wait_finished(d: Any, element_id: str, what: str, timeout: float = 60) -> None:
    """Until the job shown in ``element_id`` is completed or failed (its ``data-state``)."""
    wait_until(
        d,
        lambda: by_id(d, element_id).get_attribute("data-state") in ("completed", "failed"),
        what,
        timeout=timeout,
    )


def by_id(driver: WebDriver, element_id: str):
    return driver.find_element(By.ID, element_id)


def text(driver: WebDriver, element_id: str) -> str:
    # The page re-renders panels as events arrive: an element found an instant before it was
    # replaced is stale; look it up again.
    for _ in range(20):
        try:
            return by_id(driver, element_id).text
        except StaleElementReferenceException:
            time.sleep(0.05)
    return by_id(driver, element_id).text


def toast_text(driver: WebDriver) -> str:
    """The latest message (textContent: the toast hides itself after a few seconds)."""
    return by_id(driver, "toast").get_attribute("textContent")


def open_console(driver: WebDriver, server: Console) -> None:
    driver.get(server.url)
    # The server trades the token for a cookie and redirects: it leaves the address bar.
    assert driver.current_url.split("#")[0] == f"{server.base}/", driver.current_url
    wait_until(driver, lambda: text(driver, "connection") == "live", "the event stream")
    wait_until(driver, lambda: by_id(driver, "dataset-select").get_attribute("value"), "status")


def show_panel(driver: WebDriver, panel: str) -> None:
    driver.find_element(By.CSS_SELECTOR, f'#tabs button[data-panel="{panel}"]').click()
    wait_until(driver, lambda: by_id(driver, panel).is_displayed(), f"panel {panel}")


def select(driver: WebDriver, element_id: str, value: str) -> None:
    Select(by_id(driver, element_id)).select_by_value(value)


def png_pixels(png: bytes) -> np.ndarray:
    with av.open(io.BytesIO(png)) as container:
        frame = next(container.decode(video=0))
        return frame.to_ndarray(format="rgb24")


def screenshot(driver: WebDriver, artifacts: Path, name: str) -> Path:
    """Save the window as ``<name>-<variant>.png`` and check it is not blank."""
    png = driver.get_screenshot_as_png()
    path = artifacts / f"{name}-{VARIANT}.png"
    path.write_bytes(png)
    pixels = png_pixels(png)
    assert pixels.std() > 10, f"{path}: nearly uniform screenshot"
    colours = np.unique(pixels.reshape(-1, 3)[::13], axis=0)
    assert len(colours) > 50, f"{path}: only {len(colours)} distinct colours"
    return path


def episode_item(driver: WebDriver, index: int):
    return driver.find_element(By.CSS_SELECTOR, f'#episode-list li[data-index="{index}"]')


def click_episode(driver: WebDriver, index: int) -> None:
    """Click an episode of the list (retried while the list is being re-rendered)."""
    wait_until(
        driver, lambda: episode_item(driver, index).click() or True, f"episode {index} clicked"
    )


def episode_attr(driver: WebDriver, index: int, name: str) -> str | None:
    """An attribute of an episode's list item, read in one step (the list is re-rendered)."""
    return driver.execute_script(
        "const li = document.querySelector(`#episode-list li[data-index='${arguments[0]}']`);"
        "return li ? li.getAttribute(arguments[1]) : null",
        index,
        name,
    )


def press(driver: WebDriver, key: str) -> None:
    """One key press on the focused element (a fresh chain: a chain replays earlier keys)."""
    ActionChains(driver).send_keys(key).perform()


def video_frames(driver: WebDriver) -> list[str | None]:
    return driver.execute_script(
        "return [...document.querySelectorAll('#videos video')].map(v => v.dataset.frame)"
    )


def scrubber_frame(driver: WebDriver) -> str:
    return by_id(driver, "scrubber").get_attribute("data-frame")


def wait_all_on_frame(driver: WebDriver, expected: int | None, what: str) -> int:
    """Wait until every video shows the same frame as the scrubber's cursor (``expected`` if
    given); that frame."""

    def same() -> int | None:
        frames = video_frames(driver)
        cursor = scrubber_frame(driver)
        if len(frames) != 2 or any(f != cursor for f in frames):
            return None
        if expected is not None and cursor != str(expected):
            return None
        return int(cursor) + 1  # truthy even for frame 0

    try:
        return wait_until(driver, same, what, timeout=15) - 1
    except AssertionError as e:
        raise AssertionError(
            f"{e}: videos {video_frames(driver)}, cursor {scrubber_frame(driver)}"
        ) from None


def open_episode(driver: WebDriver, dataset: str, index: int) -> None:
    show_panel(driver, "quality")
    select(driver, "review-dataset", dataset)
    click_episode(driver, index)
    wait_until(
        driver,
        lambda: (
            "selected" in episode_attr(driver, index, "class")
            and len(driver.find_elements(By.CSS_SELECTOR, "#videos video")) == 2
        ),
        f"episode {index} selected",
    )


def browser_errors(driver: WebDriver) -> list[str]:
    return [
        entry["message"]
        for entry in driver.get_log("browser")
        if entry["level"] == "SEVERE" and "/api/" not in entry["message"]
    ]


# ---- tests --------------------------------------------------------------------------------


def test_operator_flow(console: Console, browser: WebDriver, artifacts: Path) -> None:
    """Record two episodes with START / STOP, fail one in QUALITY CHECK, export lerobot_v3."""
    d = browser
    open_console(d, console)
    assert text(d, "source") == "simulated rig (the config names no sources)"
    # Every camera's live preview arrives.
    wait_until(
        d,
        lambda: (
            d.execute_script(
                "return [...document.querySelectorAll('#previews img')]"
                ".filter(i => i.naturalWidth === 160).length"
            )
            == 2
        ),
        "both camera previews",
    )

    select(d, "dataset-select", "fold_towel")
    tasks = [o.get_attribute("value") for o in Select(by_id(d, "task-select")).options]
    assert tasks == ["fold the towel in half", "fold the towel in thirds"]
    select(d, "task-select", "fold the towel in thirds")
    for _ in range(2):
        by_id(d, "start").click()
        wait_until(d, lambda: text(d, "rec-state") == "recording", "recording")
        wait_until(d, lambda: int(text(d, "frames")) > 0, "frames counting")
        time.sleep(1.5)
        assert by_id(d, "stop").is_enabled()
        by_id(d, "stop").click()
        wait_until(d, lambda: text(d, "rec-state") != "recording", "recording stopped")

    def saved() -> list[dict[str, str]]:
        return d.execute_script(
            "return [...document.querySelectorAll('#saved-list li[data-state=\"saved\"]')]"
            ".map(li => ({dataset: li.dataset.dataset, episode: li.dataset.episode,"
            " text: li.textContent}))"
        )

    wait_until(
        d, lambda: sum(i["dataset"] == "fold_towel" for i in saved()) == 2, "both saves listed"
    )
    items = [i for i in saved() if i["dataset"] == "fold_towel"]
    assert {i["episode"] for i in items} == {"0", "1"}
    assert all("green" in i["text"] for i in items), items
    screenshot(d, artifacts, "collect")
    rows = console.api.get("/api/datasets/fold_towel/episodes").json()["episodes"]
    assert [r["tasks"] for r in rows] == [["fold the towel in thirds"]] * 2
    assert all(r["length"] >= 30 for r in rows), [r["length"] for r in rows]

    # QUALITY CHECK follows the dataset chosen for collection.
    show_panel(d, "quality")
    assert Select(by_id(d, "review-dataset")).first_selected_option.text == "fold_towel"
    wait_until(d, lambda: episode_item(d, 1), "episode 1")
    assert episode_attr(d, 1, "data-subset") == "accepted"
    click_episode(d, 1)
    wait_until(d, lambda: "episode 1" in text(d, "episode-title"), "episode 1 selected")
    by_id(d, "note").send_keys("gripper slipped")
    by_id(d, "fail").click()
    wait_until(d, lambda: episode_attr(d, 1, "data-subset") == "rejected", "rejected")
    assert episode_attr(d, 1, "data-verdict") == "fail"
    wait_until(d, lambda: text(d, "split-rejected") == "rejected 1: [1]", "the split")
    assert text(d, "split-accepted") == "accepted 1: [0]"
    assert text(d, "episode-subset") == "rejected"
    row = console.api.get("/api/datasets/fold_towel/episodes").json()["episodes"][1]
    assert (row["qc_verdict"], row["qc_note"], row["subset"]) == (
        "fail",
        "gripper slipped",
        "rejected",
    )
    wait_all_on_frame(d, 0, "the replay at frame 0")
    by_id(d, "scrubber").click()  # the middle of the range: a representative frame
    wait_all_on_frame(d, None, "the replay after scrubbing")
    screenshot(d, artifacts, "quality")

    show_panel(d, "export")
    select(d, "format-select", "lerobot_v3")
    assert text(d, "export-state") == "export required for lerobot_v3"
    options = d.find_elements(By.CSS_SELECTOR, "#format-options [data-option]")
    assert {o.get_attribute("data-option") for o in options} >= {"verify_decode"}
    by_id(d, "export-button").click()
    wait_finished(d, "export-state", "the export")
    assert text(d, "export-state") == "completed", text(d, "export-error")
    assert text(d, "totals-accepted").startswith("1 episode, ")
    assert text(d, "totals-rejected").startswith("1 episode, ")
    assert re.fullmatch(r"verify ok \(\d+\.\d s\)", text(d, "verify-accepted"))
    assert re.fullmatch(r"verify ok \(\d+\.\d s\)", text(d, "verify-rejected"))
    assert text(d, "accepted-dir").endswith("fold_towel/export/lerobot_v3/accepted")
    assert text(d, "rejected-dir").endswith("fold_towel/export/lerobot_v3/rejected")
    assert by_id(d, "export-progress-episodes").get_attribute("value") == "1"
    screenshot(d, artifacts, "export")

    show_panel(d, "upload")
    assert not by_id(d, "upload-button").is_enabled()
    assert "no_backend" in text(d, "upload-reason")
    screenshot(d, artifacts, "upload")

    # A verdict change after the export marks it stale.
    show_panel(d, "quality")
    by_id(d, "clear").click()
    wait_until(d, lambda: episode_attr(d, 1, "data-subset") == "accepted", "cleared")
    wait_until(d, lambda: by_id(d, "stale-warning").is_displayed(), "the stale warning")
    assert "export stale: re-export" in text(d, "stale-warning")
    assert "lerobot_v3" in text(d, "stale-warning")
    show_panel(d, "export")
    assert by_id(d, "export-stale").is_displayed()
    assert browser_errors(d) == []


def test_replay_keeps_cameras_in_step(console: Console, browser: WebDriver) -> None:
    d = browser
    index = console.record("pick_cube", 2.5)
    open_console(d, console)
    open_episode(d, "pick_cube", index)
    length = console.api.get(f"/api/datasets/pick_cube/episodes/{index}/series").json()["length"]
    assert int(by_id(d, "scrubber").get_attribute("max")) == length - 1
    assert len(d.find_elements(By.CSS_SELECTOR, "#plots canvas")) == 2
    wait_all_on_frame(d, 0, "frame 0 after loading")

    by_id(d, "play").click()
    time.sleep(1.0)
    by_id(d, "play").click()
    played = wait_all_on_frame(d, None, "all cameras on one frame after play/pause")
    assert 5 < played < length - 1, played

    by_id(d, "step-forward").click()
    wait_all_on_frame(d, played + 1, "one frame forward")
    by_id(d, "step-back").click()
    by_id(d, "step-back").click()
    wait_all_on_frame(d, played - 1, "two frames back")

    # Keys: "." / "," step, space toggles play (once, even with a button focused).
    body = d.find_element(By.TAG_NAME, "body")
    press(d, ".")
    wait_all_on_frame(d, played, "'.' steps forward")
    body.send_keys(",")
    wait_all_on_frame(d, played - 1, "',' steps back")
    by_id(d, "play").click()  # focus the button, start playing
    time.sleep(0.3)
    press(d, " ")
    paused = wait_all_on_frame(d, None, "paused by the space key")
    assert paused > played - 1
    assert by_id(d, "play").text == "▶ play"
    time.sleep(0.3)
    assert wait_all_on_frame(d, None, "still paused") == paused

    # The scrubber puts every camera on the chosen frame.
    d.execute_script(
        "const s = document.getElementById('scrubber'); s.value = 20;"
        "s.dispatchEvent(new Event('input'))"
    )
    wait_all_on_frame(d, 20, "the scrubbed frame")
    by_id(d, "scrubber").send_keys(Keys.ARROW_LEFT)  # one frame back, not two
    wait_all_on_frame(d, 19, "ArrowLeft on the scrubber")
    # Playing to the end stops on the last frame.
    d.execute_script(
        "const s = document.getElementById('scrubber'); s.value = arguments[0];"
        "s.dispatchEvent(new Event('input'))",
        length - 8,
    )
    wait_all_on_frame(d, length - 8, "near the end")
    by_id(d, "play").click()
    wait_until(d, lambda: by_id(d, "play").text == "▶ play", "the end of the episode")
    wait_all_on_frame(d, length - 1, "the last frame")
    assert browser_errors(d) == []


def test_issue_frames_and_review_keys(
    console: Console, browser: WebDriver, artifacts: Path
) -> None:
    d = browser
    open_console(d, console)
    open_episode(d, "sort_parts", 1)
    issue = d.find_element(By.CSS_SELECTOR, '#issues li[data-code="frozen_camera"]')
    assert "RED" in issue.text and "near frame 12" in issue.text
    assert episode_attr(d, 1, "data-subset") == "rejected"
    wait_all_on_frame(d, 0, "frame 0 after loading")
    issue.find_element(By.CSS_SELECTOR, 'button.frame-link[data-frame="12"]').click()
    wait_all_on_frame(d, 12, "the frame the issue names")
    path = screenshot(d, artifacts, "quality-issue")
    if os.environ.get("EVA_UPDATE_SCREENSHOT") == "1":  # the README's picture
        (REPO / "docs" / "console-quality-check.png").write_bytes(path.read_bytes())

    # Review keys: p pass, x clear, f fail; k / j previous / next episode.
    press(d, "p")
    wait_until(d, lambda: episode_attr(d, 1, "data-verdict") == "pass", "'p'")
    assert episode_attr(d, 1, "data-subset") == "accepted"  # red + pass
    press(d, "x")
    wait_until(d, lambda: episode_attr(d, 1, "data-verdict") == "", "'x'")
    assert episode_attr(d, 1, "data-subset") == "rejected"
    press(d, "k")
    wait_until(d, lambda: "episode 0" in text(d, "episode-title"), "'k'")
    press(d, "f")
    wait_until(d, lambda: episode_attr(d, 0, "data-verdict") == "fail", "'f'")
    # "n" goes to the note box, where keys are text ("p" is no PASS); Enter saves the note only.
    press(d, "n")
    wait_until(d, lambda: d.execute_script("return document.activeElement.id") == "note", "'n'")
    press(d, "please re-record\n")
    wait_until(
        d,
        lambda: (
            console.api.get("/api/datasets/sort_parts/episodes").json()["episodes"][0]["qc_note"]
            == "please re-record"
        ),
        "the note saved",
    )
    assert episode_attr(d, 0, "data-verdict") == "fail"
    assert by_id(d, "note").get_attribute("value") == "please re-record"
    press(d, Keys.ESCAPE)  # leaves the note box: keys are shortcuts again
    press(d, "j")
    wait_until(d, lambda: "episode 1" in text(d, "episode-title"), "'j'")
    console.api.put("/api/datasets/sort_parts/episodes/0/qc", json={"verdict": None, "note": ""})
    assert browser_errors(d) == []


def scrub_to(driver: WebDriver, frame: int) -> None:
    driver.execute_script(
        "const s = document.getElementById('scrubber'); s.value = arguments[0];"
        "s.dispatchEvent(new Event('input'))",
        frame,
    )
    wait_all_on_frame(driver, frame, f"frame {frame}")


def trim_range(driver: WebDriver) -> dict[str, Any]:
    return driver.execute_script(
        "const r = document.getElementById('trim-range');"
        "return {hidden: r.hidden, start: r.dataset.start, end: r.dataset.end,"
        " width: r.getBoundingClientRect().width,"
        " bar: r.parentElement.getBoundingClientRect().width}"
    )


def test_trim_marks_task_and_drop(console: Console, browser: WebDriver, artifacts: Path) -> None:
    """Keys [ and ] set the trim at the replay's frame, shown on the scrubber and the list;
    the task and DROP are one request each, and every edit is undone from the panel."""
    d = browser
    open_console(d, console)
    open_episode(d, "sort_parts", 0)
    wait_all_on_frame(d, 0, "frame 0 after loading")
    assert trim_range(d)["hidden"] and text(d, "trim-label") == "no trim"

    scrub_to(d, 5)
    press(d, "[")  # keep from frame 5
    wait_until(d, lambda: trim_range(d)["start"] == "5", "the in mark")
    assert trim_range(d)["end"] == "40"
    scrub_to(d, 24)
    press(d, "]")  # up to and including frame 24
    wait_until(d, lambda: trim_range(d)["end"] == "25", "the out mark")
    shown = trim_range(d)
    assert not shown["hidden"] and shown["start"] == "5"
    assert abs(shown["width"] / shown["bar"] - 20 / 40) < 0.02, shown  # 20 of 40 frames
    assert "trim 5–25 (keeps 20 of 40 frames)" in text(d, "trim-label")
    wait_until(d, lambda: episode_attr(d, 0, "data-trim") == "5:25", "the list's trim")
    row = console.api.get("/api/datasets/sort_parts/episodes").json()["episodes"][0]
    assert row["edit_trim"] == [5, 25]
    # The plots shade the frames the trim leaves out: the left edge of a plot is dark now.
    dark = d.execute_script(
        "const c = document.querySelector('#plots canvas');"
        "const p = c.getContext('2d').getImageData(48, 40, 1, 1).data; return p[0] + p[1] + p[2]"
    )
    assert dark < 3 * 0x20, dark
    screenshot(d, artifacts, "quality-trim")

    # The task: typed into its field, Enter saves; keys there are text ("[" sets no mark).
    by_id(d, "edit-task").click()
    press(d, "sort [red] parts\n")
    wait_until(
        d,
        lambda: (
            console.api.get("/api/datasets/sort_parts/episodes").json()["episodes"][0]["edit_task"]
            == "sort [red] parts"
        ),
        "the task saved",
    )
    assert trim_range(d)["start"] == "5"
    press(d, Keys.ESCAPE)
    by_id(d, "drop").click()
    wait_until(d, lambda: episode_attr(d, 0, "data-subset") == "dropped", "DROP")
    assert "dropped 1: [0]" in text(d, "split")
    assert by_id(d, "drop").text == "UNDROP"

    # Undone from the panel: UNDROP, clear task, clear trim.
    by_id(d, "drop").click()
    wait_until(d, lambda: episode_attr(d, 0, "data-subset") == "accepted", "UNDROP")
    by_id(d, "clear-task").click()
    by_id(d, "clear-trim").click()
    wait_until(d, lambda: trim_range(d)["hidden"], "the trim cleared")
    wait_until(d, lambda: episode_attr(d, 0, "data-trim") == "", "the list's trim cleared")
    row = console.api.get("/api/datasets/sort_parts/episodes").json()["episodes"][0]
    assert row["edit_trim"] is None and row["edit_task"] is None and row["edit_drop"] is False
    assert browser_errors(d) == []


def test_collect_keys_cancel_and_api_errors(console: Console, browser: WebDriver) -> None:
    d = browser
    open_console(d, console)
    before = console.api.get("/api/status").json()["saved"]
    select(d, "dataset-select", "pick_cube")
    d.find_element(By.TAG_NAME, "body").click()
    press(d, "s")
    wait_until(d, lambda: text(d, "rec-state") == "recording", "'s' starts")
    assert not by_id(d, "start").is_enabled() and by_id(d, "cancel").is_enabled()
    wait_until(d, lambda: int(text(d, "frames")) > 5, "frames counting")
    press(d, "c")
    wait_until(d, lambda: text(d, "rec-state") == "idle", "'c' cancels")
    assert "cancelled" in toast_text(d)
    status = console.api.get("/api/status").json()
    assert (status["state"], status["saved"], status["save_queue"]) == ("idle", before, 0)

    # A refused request shows the server's message.
    show_panel(d, "export")
    select(d, "format-select", "lerobot_v3")
    size = by_id(d, "opt-data_files_size_in_mb")
    size.clear()
    size.send_keys("-1")
    by_id(d, "export-button").click()
    wait_until(d, lambda: "must be > 0" in toast_text(d), "the error message")
    assert "options.data_files_size_in_mb" in toast_text(d)
    assert "error" in by_id(d, "toast").get_attribute("class")
    assert text(d, "export-state") == "export required for lerobot_v3"


def test_upload_needs_a_backend(console: Console, browser: WebDriver) -> None:
    d = browser
    if not console.api.get("/api/datasets/pick_cube/episodes").json()["episodes"]:
        console.record("pick_cube", 0.8)
    assert console.export("pick_cube", "lerobot_v21")["state"] == "completed"
    open_console(d, console)
    select(d, "review-dataset", "pick_cube")
    show_panel(d, "export")
    # A completed export found at load counts as this page's export.
    wait_until(
        d,
        lambda: by_id(d, "export-state").get_attribute("data-state") == "completed",
        "the completed export",
    )
    show_panel(d, "upload")
    assert text(d, "upload-format") == "lerobot_v21"
    assert text(d, "upload-backend") == "no backend"
    assert not by_id(d, "upload-button").is_enabled()
    reason = text(d, "upload-reason")
    assert reason.startswith("no_backend: no upload backend configured"), reason
    assert by_id(d, "upload-reason").get_attribute("data-reason") == "no_backend"
    # The server refuses as well (the page shows such a refusal in its toast).
    refused = console.api.post("/api/datasets/pick_cube/upload", json={"format": "lerobot_v21"})
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "no_backend"


def sftp_console_config(sshd_server: SshdServer, remote_root: Path, known_hosts: Path) -> str:
    return CONFIG + (
        "\n[collection.storage.sftp]\n"
        'host = "127.0.0.1"\n'
        f"port = {sshd_server.port}\n"
        f'user = "{sshd_server.user}"\n'
        f'identity_file = "{sshd_server.client_key}"\n'
        f'remote_dir = "{remote_root}"\n'
        f'known_hosts = "{known_hosts}"\n'
    )


@pytest.fixture
def sftp_console(
    sshd_server: SshdServer,
    known_hosts: Path,
    remote_root: Path,
    tmp_path: Path,
    browser: WebDriver,
) -> Iterator[Console]:
    config = sftp_console_config(sshd_server, remote_root, known_hosts)
    server = start_console(tmp_path / "sftp-console", config)
    try:
        yield server
    finally:
        browser.get("about:blank")  # close the event stream: the server then stops at once
        server.server.stop()


def test_first_contact_trusts_an_unknown_host_key_once(
    sshd_server: SshdServer,
    remote_root: Path,
    tmp_path: Path,
    browser: WebDriver,
    artifacts: Path,
) -> None:
    """An unknown host key: the page shows the server and its SHA-256 fingerprint, TRUST
    appends it to the configured known_hosts (hashed, as the file is), and the upload then
    goes; a changed key is refused with no trust button, and the API refuses to trust it."""
    d = browser
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(
        "other.example ssh-ed25519 "
        "AAAAC3NzaC1lZDI1NTE5AAAAIHJpVbBbrSqCLhJeyEXiH9ILtW9e+Mcq1xZaiFHeeU3e\n"
    )
    subprocess.run(["ssh-keygen", "-H", "-f", str(known_hosts)], check=True, capture_output=True)
    before = known_hosts.read_text()
    server = start_console(
        tmp_path / "first-contact", sftp_console_config(sshd_server, remote_root, known_hosts)
    )
    try:
        server.record("pick_cube", 0.8)
        assert server.export("pick_cube", "lerobot_v21")["state"] == "completed"
        key = paramiko.Ed25519Key.from_private_key_file(
            str(sshd_server.workdir / "ssh_host_ed25519_key")
        )
        status = server.api.get("/api/upload/host-key").json()
        assert status == {
            "server": f"[127.0.0.1]:{sshd_server.port}",
            "key_type": "ssh-ed25519",
            "fingerprint": key.fingerprint,
            "state": "unknown",
            "known_hosts": str(known_hosts),
        }
        open_console(d, server)
        show_panel(d, "upload")
        wait_until(d, lambda: by_id(d, "upload-button").is_enabled(), "upload enabled")
        by_id(d, "upload-button").click()
        wait_finished(d, "upload-state", "the refused upload")
        assert text(d, "upload-state") == "failed"
        wait_until(d, lambda: by_id(d, "host-key").is_displayed(), "the host key shown")
        assert text(d, "host-key-server") == f"[127.0.0.1]:{sshd_server.port}"
        assert text(d, "host-key-fingerprint") == key.fingerprint
        assert "--accept-new-host-key" not in text(d, "upload-error")
        assert "compare" in text(d, "host-key-advice")
        screenshot(d, artifacts, "upload-host-key")
        assert known_hosts.read_text() == before

        by_id(d, "trust-host-key").click()
        wait_until(d, lambda: not by_id(d, "host-key").is_displayed(), "trusted")
        assert "trusted" in toast_text(d)
        added = known_hosts.read_text()[len(before) :]
        assert added.startswith("|1|") and added.split()[1:] == ["ssh-ed25519", key.get_base64()]
        by_id(d, "upload-button").click()
        wait_until(d, lambda: text(d, "upload-state") == "completed", "the upload", timeout=60)

        # The server's key changes (reinstalled, or someone in between): refused, no TRUST.
        other = paramiko.Ed25519Key.from_private_key_file(str(sshd_server.client_key))
        known_hosts.write_text(f"[127.0.0.1]:{sshd_server.port} ssh-ed25519 {other.get_base64()}\n")
        by_id(d, "upload-button").click()
        wait_until(d, lambda: by_id(d, "upload-again").is_displayed(), "already uploaded")
        by_id(d, "upload-again-yes").click()
        wait_until(d, lambda: text(d, "upload-state") == "failed", "the refused upload")
        wait_until(d, lambda: by_id(d, "host-key").is_displayed(), "the changed key shown")
        assert by_id(d, "host-key").get_attribute("data-state") == "changed"
        assert not by_id(d, "trust-host-key").is_displayed()
        assert "cannot override" in text(d, "host-key-advice")
        refused = server.api.post("/api/upload/host-key", json={"fingerprint": key.fingerprint})
        assert refused.status_code == 409
        assert refused.json()["error"]["code"] == "host_key_changed"
        assert known_hosts.read_text().split()[-1] == other.get_base64()
        assert browser_errors(d) == []
    finally:
        d.get("about:blank")
        server.server.stop()


def export_rows(driver: WebDriver) -> dict[str, str]:
    """The EXPORT table: format -> its state cell."""
    return driver.execute_script(
        "return Object.fromEntries([...document.querySelectorAll('#exports-table tbody tr')]"
        ".map(r => [r.dataset.format, r.cells[1].textContent]))"
    )


def choose_format(driver: WebDriver, fmt: str) -> None:
    show_panel(driver, "export")
    select(driver, "format-select", fmt)


def assert_panels_agree(driver: WebDriver, fmt: str) -> None:
    """EXPORT's state, its table and UPLOAD say the same of ``fmt``'s latest export."""
    done = export_rows(driver)[fmt] == "completed"
    state = by_id(driver, "export-state").get_attribute("data-state")
    assert state == ("completed" if done else "required"), (fmt, state)
    show_panel(driver, "upload")
    assert text(driver, "upload-format") == fmt
    wait_until(
        driver, lambda: by_id(driver, "upload-button").is_enabled() == done, f"upload of {fmt}"
    )
    assert ("export required" in text(driver, "upload-reason")) != done


def test_upload_offers_the_latest_export_of_the_chosen_format(
    sftp_console: Console, browser: WebDriver, remote_root: Path, artifacts: Path
) -> None:
    """EXPORT, its table and UPLOAD show the latest export of the chosen format, after a reload
    and after changing the selector; that export is what UPLOAD sends."""
    d = browser
    server = sftp_console
    server.record("pick_cube", 0.8)
    open_console(d, server)
    show_panel(d, "export")
    assert Select(by_id(d, "format-select")).first_selected_option.text == "lerobot_v21"
    assert text(d, "export-state") == "export required for lerobot_v21"
    assert_panels_agree(d, "lerobot_v21")

    show_panel(d, "export")
    by_id(d, "export-button").click()
    wait_finished(d, "export-state", "the export", timeout=60)
    assert re.fullmatch(r"verify ok \(\d+\.\d s\)", text(d, "verify-accepted"))
    assert_panels_agree(d, "lerobot_v21")
    backend = server.api.get("/api/status").json()["upload_backend"]
    assert backend.startswith("sftp://") and text(d, "upload-backend") == backend

    # Exported elsewhere (the CLI, another page), then the page reloaded: a format that is not
    # the selector's default is offered as well.
    assert server.export("pick_cube", "hdf5")["state"] == "completed"
    open_console(d, server)
    for fmt in ("hdf5", "lerobot_v3", "lerobot_v21", "hdf5"):
        choose_format(d, fmt)
        wait_until(d, lambda: "hdf5" in export_rows(d), "the exports table")
        assert_panels_agree(d, fmt)
    choose_format(d, "hdf5")
    assert text(d, "export-state") == "completed (earlier export)"
    assert text(d, "accepted-dir").endswith("pick_cube/export/hdf5/accepted")

    show_panel(d, "upload")
    by_id(d, "upload-button").click()
    wait_finished(d, "upload-state", "the upload")
    assert text(d, "upload-state") == "completed", text(d, "upload-error")
    remote_path = Path(text(d, "remote-path"))
    assert remote_path.is_relative_to(remote_root), remote_path
    uploaded = sorted(p.relative_to(remote_path) for p in remote_path.rglob("*") if p.is_file())
    exports = server.api.get("/api/datasets/pick_cube/exports").json()["formats"]
    exported = Path(exports["hdf5"]["accepted_dir"])
    assert uploaded == sorted(p.relative_to(exported) for p in exported.rglob("*") if p.is_file())
    assert by_id(d, "upload-progress-files").get_attribute("value") == by_id(
        d, "upload-progress-files"
    ).get_attribute("max")
    assert remote_path.name == "pick_cube-hdf5"  # the remote name says the format
    screenshot(d, artifacts, "upload-done")

    # The same export again: the page says where it already is and asks before a second copy.
    by_id(d, "upload-button").click()
    wait_until(d, lambda: by_id(d, "upload-again").is_displayed(), "the question")
    assert "already on sftp://" in text(d, "upload-again-text")
    assert f"at {remote_path} (uploaded " in text(d, "upload-again-text")
    by_id(d, "upload-again-no").click()
    assert not by_id(d, "upload-again").is_displayed()
    assert sorted(p.name for p in remote_root.iterdir()) == ["pick_cube-hdf5"]
    by_id(d, "upload-button").click()
    wait_until(d, lambda: by_id(d, "upload-again").is_displayed(), "the question again")
    by_id(d, "upload-again-yes").click()
    wait_until(d, lambda: text(d, "remote-path") != str(remote_path), "the second copy")
    wait_finished(d, "upload-state", "the second upload")
    assert text(d, "remote-path").startswith(f"{remote_path}.copy_")
    assert browser_errors(d) == []


def test_dataset_text_is_never_parsed_as_html(console: Console, browser: WebDriver) -> None:
    """A note (and a prompt) holding markup is shown as text: the page creates no element, and
    no handler of it runs."""
    d = browser
    note = '<img src=x onerror="window.evaPwned=1"><b id="pwned">bold</b>'
    put = console.api.put("/api/datasets/sort_parts/episodes/0/qc", json={"note": note})
    assert put.status_code == 200, put.text
    try:
        open_console(d, console)
        open_episode(d, "sort_parts", 0)
        wait_until(d, lambda: by_id(d, "note").get_attribute("value") == note, "the note shown")
        found = d.execute_script(
            "return [document.querySelectorAll('img[src=\"x\"], [onerror], #pwned').length,"
            " window.evaPwned === undefined]"
        )
        assert found == [0, True]
        assert browser_errors(d) == []
    finally:
        console.api.put("/api/datasets/sort_parts/episodes/0/qc", json={"note": ""})


# The parts of QUALITY CHECK an operator needs at once: every camera, the transport, the verdict
# buttons and the first plot.
ONE_SCREEN = (
    "#videos video, #step-back, #play, #step-forward, #scrubber, #pass, #fail, #plots canvas"
)


def viewport(driver: WebDriver, width: int, height: int) -> None:
    """The page's viewport in CSS pixels, exactly (the window's own size includes no chrome in
    headless mode, but this does not depend on it)."""
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
    )


def boxes(driver: WebDriver, selector: str) -> list[dict[str, Any]]:
    return driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(e => {"
        " const r = e.getBoundingClientRect();"
        " return {id: e.id || e.tagName + ':' + (e.dataset.key || ''), left: r.left, top: r.top,"
        " right: r.right, bottom: r.bottom, width: r.width, height: r.height}; })",
        selector,
    )


def outside(driver: WebDriver, box: dict[str, Any]) -> bool:
    width, height = driver.execute_script("return [innerWidth, innerHeight]")
    return (
        box["width"] <= 0
        or box["height"] <= 0
        or box["left"] < 0
        or box["top"] < 0
        or box["right"] > width
        or box["bottom"] > height
    )


def test_quality_check_fits_one_screen(
    console: Console, browser: WebDriver, artifacts: Path
) -> None:
    """At 1280x800 every camera, the transport, PASS / FAIL and the first plot are in view at
    once, without scrolling; at 800x600 every control can be scrolled into view and used."""
    d = browser
    try:
        viewport(d, 1280, 800)
        open_console(d, console)
        open_episode(d, "sort_parts", 1)  # a red episode: its issue line shows as well
        wait_all_on_frame(d, 0, "frame 0 after loading")
        d.execute_script("window.scrollTo(0, 0)")
        shown = boxes(d, ONE_SCREEN)
        assert sum(b["id"].startswith("VIDEO") for b in shown) == 2
        assert any(b["id"].startswith("CANVAS") for b in shown)
        first_plot = next(b for b in shown if b["id"].startswith("CANVAS"))
        needed = [b for b in shown if not b["id"].startswith("CANVAS")] + [first_plot]
        assert [b for b in needed if outside(d, b)] == []
        assert d.execute_script("return scrollY") == 0
        screenshot(d, artifacts, "quality-1280x800")

        viewport(d, 800, 600)
        d.execute_script("window.scrollTo(0, 0)")
        assert d.execute_script("return document.documentElement.scrollWidth <= innerWidth"), (
            "the page scrolls sideways at 800x600"
        )
        controls = d.find_elements(
            By.CSS_SELECTOR, "#quality button, #quality input, #quality select, #quality video"
        )
        for control in controls:
            if not control.is_displayed():
                continue  # e.g. an issue's frame link of another episode
            d.execute_script("arguments[0].scrollIntoView({block: 'center'})", control)
            box = d.execute_script(
                "const r = arguments[0].getBoundingClientRect();"
                "return {id: arguments[0].id, left: r.left, top: r.top, right: r.right,"
                " bottom: r.bottom, width: r.width, height: r.height}",
                control,
            )
            assert not outside(d, box), box
        by_id(d, "pass").click()  # reachable and usable
        wait_until(d, lambda: episode_attr(d, 1, "data-verdict") == "pass", "PASS at 800x600")
        screenshot(d, artifacts, "quality-800x600")
        console.api.put("/api/datasets/sort_parts/episodes/1/qc", json={"verdict": None})
    finally:
        d.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def test_collect_warnings_source_line_and_fps_caption(
    tmp_path: Path, browser: WebDriver, artifacts: Path
) -> None:
    """COLLECT: one short source line; a warning shows the local clock time (never epoch
    seconds) and is cleared at the next START; the fps caption is images over duration."""
    d = browser
    workdir = tmp_path / "collect"
    first = start_console(workdir, CONFIG)
    try:
        first.record("pick_cube", 0.8)
    finally:
        first.server.stop()
    # A crash's trace the writer removes when the next recording opens the dataset: a warning.
    (workdir / "logs" / "pick_cube" / "raw" / ".eva-work" / "saving-9.lock").write_bytes(b"")
    server = start_console(workdir, CONFIG)
    try:
        open_console(d, server)
        assert text(d, "source") == "simulated rig (the config names no sources)"
        assert text(d, "source-note") == ""  # the note would say the same again
        assert d.find_elements(By.CSS_SELECTOR, "#stream-sources li") == []
        select(d, "dataset-select", "pick_cube")
        by_id(d, "start").click()
        wait_until(d, lambda: text(d, "rec-state") == "recording", "recording")
        wait_until(d, lambda: "stale saving marker" in text(d, "warnings"), "the warning")
        [line] = [w.text for w in d.find_elements(By.CSS_SELECTOR, "#warnings li")]
        assert re.fullmatch(r"\d\d:\d\d:\d\d \S+: removed stale saving marker saving-9\.lock", line)
        assert not re.search(r"\d{9,}", line), line

        def caption() -> re.Match[str] | None:
            return re.fullmatch(
                r"(\d+\.\d) fps · (\d+) images in (\d+\.\d) s",
                text(d, "fps-observation.images.cam_high"),
            )

        m = wait_until(d, lambda: (m := caption()) and float(m[3]) >= 1.0 and m, "the caption")
        fps, images, seconds = float(m[1]), int(m[2]), float(m[3])
        # One status gives all three: the rate is images / duration, to the digits shown.
        assert abs(fps - images / seconds) <= 0.06 + fps * 0.05 / seconds, m[0]
        by_id(d, "stop").click()
        wait_until(d, lambda: text(d, "rec-state") != "recording", "stopped")
        screenshot(d, artifacts, "collect-warning")
        assert "stale saving marker" in text(d, "warnings")  # kept until the next START
        by_id(d, "start").click()
        wait_until(d, lambda: text(d, "rec-state") == "recording", "recording again")
        wait_until(d, lambda: text(d, "warnings") == "", "the warnings cleared at START")
        by_id(d, "cancel").click()
        wait_until(d, lambda: text(d, "rec-state") == "idle", "cancelled")
        assert browser_errors(d) == []
    finally:
        d.get("about:blank")
        server.server.stop()


def test_export_failure_stops_and_verify_shows_elapsed_time(
    tmp_path: Path, browser: WebDriver
) -> None:
    """A failed export: its bars stop (none left running) and the directories it never wrote
    are not listed. A completed one: eva verify's step and elapsed seconds while it runs, and
    each subset's time after."""
    d = browser
    server = start_console(tmp_path / "export-failure", CONFIG)
    try:
        server.record("pick_cube", 0.8)
        [entry] = [
            e for e in server.api.get("/api/status").json()["datasets"] if e["name"] == "pick_cube"
        ]
        blocker = Path(entry["dir"]).parent / "export"  # a file where the exports go
        blocker.write_text("in the way")
        open_console(d, server)
        show_panel(d, "export")
        select(d, "export-dataset", "pick_cube")
        select(d, "format-select", "hdf5")
        d.execute_script(
            "window.evaCurrent = []; new MutationObserver(() => window.evaCurrent.push("
            "document.getElementById('export-current').textContent)).observe("
            "document.getElementById('export-current'), {childList: true, characterData: true,"
            " subtree: true})"
        )
        by_id(d, "export-button").click()
        wait_finished(d, "export-state", "the failed export")
        assert text(d, "export-state") == "failed"
        assert text(d, "export-error").startswith("export failed: ")
        assert text(d, "accepted-dir") == "–" and text(d, "rejected-dir") == "–"
        bars = d.execute_script(
            "return [...document.querySelectorAll('#export .bars progress')].map(p =>"
            " [p.hasAttribute('value'), p.nextElementSibling.textContent])"
        )
        assert bars and all(determinate for determinate, _ in bars), bars
        assert all(words.endswith("(stopped)") for _, words in bars), bars
        job = server.api.get("/api/jobs").json()["jobs"][-1]
        assert job["state"] == "failed" and job["accepted_dir"] is None

        blocker.unlink()
        by_id(d, "export-button").click()
        wait_until(d, lambda: text(d, "export-state") == "completed", "the export", timeout=60)
        for subset in ("accepted", "rejected"):
            assert re.fullmatch(r"verify ok \(\d+\.\d s\)", text(d, f"verify-{subset}"))
        seen = [t for t in d.execute_script("return window.evaCurrent") if "verify" in t]
        assert all(
            re.fullmatch(r"eva verify (accepted|rejected) \([12] of 2\) · \d+ s", t) for t in seen
        ), seen
        assert browser_errors(d) == []
    finally:
        d.get("about:blank")
        server.server.stop()
