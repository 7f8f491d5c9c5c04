// QUALITY CHECK's edits of the selected episode: trim in/out marks at the replay's frame (keys
// [ and ]), the exported task, drop / undrop. Each is one PUT .../edit; the recording is never
// touched (docs/console.md, "Edits").
import { api, attempt, enc } from "../lib/api.js";
import { refreshDataset } from "../lib/datasets.js";
import { $, toast } from "../lib/dom.js";
import { ui } from "../lib/state.js";
import { replayFrame, replayLength, setReplayTrim } from "./replay.js";

let hooks = { current: () => null, saved: () => {} };

export function trimText(trim) {
  return trim ? `trim ${trim[0]}–${trim[1]}` : "";
}

// The selected episode's edits into the controls (and its trim onto the scrubber and plots).
export function renderEdits(ep) {
  const trim = ep ? ep.edit_trim : null;
  $("trim-label").textContent = !ep ? "" : trim
    ? `${trimText(trim)} (keeps ${trim[1] - trim[0]} of ${ep.length} frames)` : "no trim";
  $("trim-label").dataset.trim = trim ? trim.join(":") : "";
  // Not under the operator's typing: a refresh of the list leaves the field being edited alone.
  if (document.activeElement !== $("edit-task")) {
    $("edit-task").value = ep && ep.edit_task ? ep.edit_task : "";
  }
  $("edit-task").placeholder = ep && ep.tasks && ep.tasks.length
    ? `task for the export (recorded: ${ep.tasks.join(", ")})` : "task for the export";
  $("drop").textContent = ep && ep.edit_drop ? "UNDROP" : "DROP";
  $("drop").classList.toggle("current", Boolean(ep && ep.edit_drop));
  setReplayTrim(trim);
}

async function saveEdit(body, what) {
  const ep = hooks.current();
  if (!ep) {
    toast("select an episode first", "error");
    return;
  }
  const name = ui.dataset;
  const r = await attempt(() =>
    api("PUT", `/api/datasets/${enc(name)}/episodes/${ep.episode_index}/edit`, body));
  if (!r || name !== ui.dataset) return;
  Object.assign(ep, { edit_trim: r.edit_trim, edit_task: r.edit_task, edit_drop: r.edit_drop,
    subset: r.subset });
  hooks.saved(ep);
  renderEdits(ep);
  toast(`episode ${r.episode_index}: ${what} → ${r.subset}` + (r.changed ? "" : " (unchanged)"));
  await refreshDataset();
}

// "[" keeps frames from the current one, "]" up to and including it; the other mark stays
// unless it would leave nothing, then it goes back to the episode's first or last frame.
function setMark(side) {
  const ep = hooks.current();
  if (!ep) return;
  const frame = replayFrame();
  const length = replayLength();
  let [start, end] = ep.edit_trim || [0, length];
  if (side === "in") {
    start = frame;
    if (end <= start) end = length;
  } else {
    end = frame + 1;
    if (start >= end) start = 0;
  }
  saveEdit({ trim: [start, end] }, `trim ${start}–${end}`);
}

function saveTask() {
  const task = $("edit-task").value;
  saveEdit({ task: task.trim() ? task : null }, task.trim() ? `task "${task}"` : "task cleared");
}

export function onEditKey(e) {
  if (e.repeat) return false;
  if (e.key === "[") setMark("in");
  else if (e.key === "]") setMark("out");
  else return false;
  return true;
}

// ``current``: the selected episode (or null); ``saved(ep)``: its row changed.
export function setupEdits(callbacks) {
  hooks = callbacks;
  $("trim-in").addEventListener("click", () => setMark("in"));
  $("trim-out").addEventListener("click", () => setMark("out"));
  $("clear-trim").addEventListener("click", () => saveEdit({ trim: null }, "trim cleared"));
  $("save-task").addEventListener("click", saveTask);
  $("clear-task").addEventListener("click", () => saveEdit({ task: null }, "task cleared"));
  $("edit-task").addEventListener("keydown", (e) => {
    if (e.ctrlKey || e.metaKey || e.altKey || e.key !== "Enter") return;
    e.preventDefault();
    saveTask();
  });
  $("drop").addEventListener("click", () => {
    const ep = hooks.current();
    const drop = !(ep && ep.edit_drop);
    saveEdit({ drop }, drop ? "dropped" : "undropped");
  });
}
