// QUALITY CHECK: the dataset's episodes and split, the selected episode's issues and verdict,
// PASS / FAIL / CLEAR and the note, and the keys; the replay itself is panels/replay.js.
import { api, attempt, enc } from "../lib/api.js";
import { refreshDataset, setDataset } from "../lib/datasets.js";
import { $, badge, el, plural, toast, unchanged } from "../lib/dom.js";
import { showPanel } from "../lib/panels.js";
import { ui } from "../lib/state.js";
import { onEditKey, renderEdits, setupEdits, trimText } from "./edits.js";
import {
  clearReplay, loadReplay, pauseReplay, redrawReplayPlots, seekAll, setupReplay, step, togglePlay,
} from "./replay.js";

function currentEpisode() {
  if (!ui.episodes || ui.selected === null) return null;
  return ui.episodes.episodes.find((e) => e.episode_index === ui.selected) || null;
}

function renderEpisodes() {
  const list = $("episode-list");
  const data = ui.episodes;
  const episodes = data ? data.episodes : [];
  if (unchanged(list, [ui.selected, episodes, data && data.split, data && data.stale])) return;
  if (!episodes.length) list.replaceChildren(el("li", { class: "empty", text: "no episodes" }));
  else {
    list.replaceChildren(...episodes.map((ep) => el("li", {
      class: `episode${ep.episode_index === ui.selected ? " selected" : ""}`,
      "data-index": ep.episode_index, "data-subset": ep.subset,
      "data-verdict": ep.qc_verdict || "", "data-trim": ep.edit_trim ? ep.edit_trim.join(":") : "",
      onclick: () => selectEpisode(ep.episode_index),
    },
    badge(ep.quality), " ", el("b", { text: `#${ep.episode_index}` }),
    ` ${plural(ep.length ?? 0, "frame")} `,
    el("span", { class: `verdict ${ep.qc_verdict || "none"}`, text: ep.qc_verdict || "–" }), " ",
    el("span", { class: `subset ${ep.subset}`, text: ep.subset }),
    ep.edit_trim ? el("span", { class: "edit muted", text: ` ${trimText(ep.edit_trim)}` }) : null,
    ep.edit_task ? el("div", { class: "edit muted", text: `task: ${ep.edit_task}` }) : null,
    ep.qc_note ? el("div", { class: "note muted", text: ep.qc_note }) : null)));
  }
  const split = $("split");
  if (data && data.split && data.split.accepted) {
    split.replaceChildren(
      el("span", { class: "subset accepted", id: "split-accepted",
        text: `accepted ${data.split.accepted.length}: [${data.split.accepted.join(", ")}]` }), " ",
      el("span", { class: "subset rejected", id: "split-rejected",
        text: `rejected ${data.split.rejected.length}: [${data.split.rejected.join(", ")}]` }),
      (data.split.dropped || []).length ? el("span", { class: "subset dropped", id: "split-dropped",
        text: ` dropped ${data.split.dropped.length}: [${data.split.dropped.join(", ")}]` }) : "");
  } else split.textContent = "";
  const stale = data ? data.stale || [] : [];
  $("stale-warning").hidden = !stale.length;
  $("stale-warning").textContent = `export stale: re-export (${stale.join(", ")}): the review ` +
    "changed since the last export";
}

function renderVerdict(ep) {
  const v = $("episode-verdict");
  v.replaceChildren(el("span", { class: `verdict ${ep.qc_verdict || "none"}`,
    text: `verdict: ${ep.qc_verdict || "none"}` }), " → ",
  el("span", { class: `subset ${ep.subset}`, id: "episode-subset", text: ep.subset }),
  el("span", { class: "muted", text: ` (${ep.reason})` }));
  for (const id of ["pass", "fail", "clear"]) $(id).classList.remove("current");
  if (ep.qc_verdict) $(ep.qc_verdict).classList.add("current");
}

function renderEpisodeDetail(ep) {
  $("episode-title").textContent =
    `episode ${ep.episode_index} · ${plural(ep.length ?? 0, "frame")} · ${(ep.tasks || []).join(", ")}`;
  renderVerdict(ep);
  renderEdits(ep);
  $("note").value = ep.qc_note || "";
  const issues = ep.quality_issues || [];
  if (!issues.length) {
    $("issues").replaceChildren(el("li", { class: "muted", text: "no quality issues" }));
    return;
  }
  $("issues").replaceChildren(...issues.map((issue) => el("li", { "data-code": issue.code },
    badge(issue.severity), " ", el("b", { text: issue.code }), `: ${issue.detail ?? ""} `,
    ...(issue.frames || []).map((f) => el("button", {
      type: "button", class: "frame-link", "data-frame": f, text: `frame ${f}`,
      onclick: () => { pauseReplay(); seekAll(f); },
    })))));
}

async function selectEpisode(index) {
  if (!ui.episodes) return;
  const ep = ui.episodes.episodes.find((e) => e.episode_index === index);
  if (!ep) return;
  ui.selected = index;
  renderEpisodes();
  renderEpisodeDetail(ep);
  const item = document.querySelector(`#episode-list li[data-index="${index}"]`);
  if (item) item.scrollIntoView({ block: "nearest" });
  await loadReplay(ep);
}

function nextEpisode(delta) {
  if (!ui.episodes || !ui.episodes.episodes.length) return;
  const list = ui.episodes.episodes;
  const at = list.findIndex((e) => e.episode_index === ui.selected);
  const next = at < 0 ? 0 : Math.min(list.length - 1, Math.max(0, at + delta));
  if (list[next].episode_index !== ui.selected) selectEpisode(list[next].episode_index);
}

function selectFirstEpisode() {
  if (ui.selected === null && ui.episodes && ui.episodes.episodes.length) {
    selectEpisode(ui.episodes.episodes[0].episode_index);
  }
}

// Another panel's link to an episode (COLLECT's saved list).
export function openEpisode(dataset, index) {
  if (!dataset || index === null || index === undefined) return;
  setDataset(dataset);
  showPanel("quality");
  refreshDataset().then(() => selectEpisode(index));
}

// verdict: "pass" | "fail" | null (clear) | undefined (note only)
async function saveReview(verdict) {
  const ep = currentEpisode();
  if (!ep) {
    toast("select an episode first", "error");
    return;
  }
  const note = $("note").value;
  const body = {};
  if (verdict !== undefined) body.verdict = verdict;
  if (verdict === undefined || note !== (ep.qc_note || "")) body.note = note;
  const name = ui.dataset;
  const r = await attempt(() =>
    api("PUT", `/api/datasets/${enc(name)}/episodes/${ep.episode_index}/qc`, body));
  if (!r || name !== ui.dataset) return;
  Object.assign(ep, { qc_verdict: r.qc_verdict, qc_note: r.qc_note, subset: r.subset });
  renderEpisodes();
  renderVerdict(ep);
  toast(`episode ${r.episode_index}: verdict ${r.qc_verdict || "none"} → ${r.subset}` +
    (r.changed ? "" : " (unchanged)"));
  await refreshDataset();
}

// ---- the panel --------------------------------------------------------------------------

function onKey(e) {
  const key = e.key;
  if (onEditKey(e)) return true;
  if (!e.repeat && key === "p") saveReview("pass");
  else if (!e.repeat && key === "f") saveReview("fail");
  else if (!e.repeat && key === "x") saveReview(null);
  else if (key === "n") $("note").focus();
  else if (key === " ") { if (!e.repeat) togglePlay(); }
  else if (key === "," || key === "ArrowLeft") step(-1);
  else if (key === "." || key === "ArrowRight") step(1);
  else if (key === "j") nextEpisode(1);
  else if (key === "k") nextEpisode(-1);
  else return false;
  return true;
}

export const qualityPanel = {
  name: "quality",
  setup() {
    $("pass").addEventListener("click", () => saveReview("pass"));
    $("fail").addEventListener("click", () => saveReview("fail"));
    $("clear").addEventListener("click", () => saveReview(null));
    $("save-note").addEventListener("click", () => saveReview(undefined));
    $("note").addEventListener("keydown", (e) => {
      if (e.ctrlKey || e.metaKey || e.altKey || e.key !== "Enter") return;
      e.preventDefault();
      saveReview(undefined);
    });
    setupReplay();
    setupEdits({ current: currentEpisode, saved: renderEpisodes });
    window.addEventListener("resize", () => { if (ui.panel === "quality") redrawReplayPlots(); });
  },
  show() {
    selectFirstEpisode();
    redrawReplayPlots();
  },
  hide: pauseReplay,
  onKey,
  onDataset() {
    clearReplay();
    renderEdits(null);
    renderEpisodes();
  },
  onEpisodes() {
    renderEpisodes();
    const ep = currentEpisode();
    if (ep) { renderVerdict(ep); renderEdits(ep); }
    else if (ui.selected !== null) { ui.selected = null; clearReplay(); renderEdits(null); }
    if (ui.panel === "quality") selectFirstEpisode();
  },
};
