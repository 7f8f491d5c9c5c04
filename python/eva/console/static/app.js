// eva operator console: COLLECT, QUALITY CHECK, EXPORT, UPLOAD ACCEPTED.
// Plain ES2020, no dependencies. Every JSON shape is defined by python/eva/console/session.py.
// Live state comes from the event stream (/api/events); the only timer is the ~4 Hz preview.
"use strict";

const $ = (id) => document.getElementById(id);
const enc = encodeURIComponent;
const PANELS = ["collect", "quality", "export", "upload"];
const PALETTE = ["#4e9cff", "#ff9f43", "#2ed573", "#ff4d6d", "#c56cf0", "#f6e05e", "#22d3ee",
  "#a3e635", "#fb7185", "#94a3b8"];

const ui = {
  panel: "collect",
  status: null,
  version: null,
  dataset: null, // the dataset of QUALITY CHECK / EXPORT / UPLOAD
  episodes: null, // GET /api/datasets/{name}/episodes
  exports: null, // GET /api/datasets/{name}/exports
  formats: {}, // GET /api/formats
  format: null,
  // The export this page accepts as current for (dataset, format): one it saw complete, or the
  // completed one found at load. Changing the format selector clears it (upload needs a new one).
  exportSeen: null,
  acceptAtLoad: true,
  ignoredJobs: new Set(), // jobs that existed when the format selector changed
  exportJob: null,
  uploadJob: null,
  selected: null, // episode index under review
};

// ---- small helpers ----------------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k.startsWith("data-")) node.setAttribute(k, String(v));
    else if (k in node) node[k] = v;
    else node.setAttribute(k, String(v));
  }
  for (const child of children) {
    if (child !== null && child !== undefined) node.append(child);
  }
  return node;
}

// True when ``node`` already shows ``value`` (so a list is not rebuilt under the pointer on
// every status event); otherwise remembers ``value`` for the next call.
function unchanged(node, value) {
  const key = JSON.stringify(value);
  if (node.renderedKey === key) return true;
  node.renderedKey = key;
  return false;
}

function badge(quality) {
  const q = quality || "unknown";
  return el("span", { class: `badge ${q}`, text: q });
}

function fmtBytes(n) {
  if (n === null || n === undefined) return "?";
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i += 1; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function plural(n, word) {
  return `${n} ${word}${n === 1 ? "" : "s"}`;
}

let toastTimer = null;
function toast(message, kind = "info") {
  const box = $("toast");
  box.textContent = message;
  box.className = kind;
  box.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => { box.hidden = true; }, kind === "error" ? 12000 : 5000);
}

class ApiError extends Error {
  constructor(status, error) {
    super(error.message);
    this.status = status;
    this.code = error.code;
    this.field = error.field;
  }
}

// Same-origin fetch: the HttpOnly cookie goes along, and the browser adds Origin to writes.
async function api(method, path, body) {
  const init = { method, headers: {} };
  if (body !== undefined) {
    init.headers["content-type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (e) {
    throw new ApiError(0, { code: "network", message: `${method} ${path}: ${e.message}` });
  }
  const text = await response.text();
  let data = null;
  if (text) {
    try { data = JSON.parse(text); } catch { data = null; }
  }
  if (!response.ok) {
    const error = (data && data.error) || { code: String(response.status), message: text };
    if (response.status === 401) {
      error.message = "not signed in: open the URL with ?token=... that `eva console` printed";
    }
    throw new ApiError(response.status, error);
  }
  return data;
}

// Run an action; an API refusal is shown in the toast (and returned as null).
async function attempt(fn) {
  try {
    return await fn();
  } catch (e) {
    toast(e.message || String(e), "error");
    return null;
  }
}

// ---- panels and keys --------------------------------------------------------------------

function showPanel(name) {
  if (!PANELS.includes(name)) return;
  ui.panel = name;
  for (const section of document.querySelectorAll(".panel")) {
    section.classList.toggle("active", section.id === name);
  }
  for (const tab of document.querySelectorAll("#tabs button")) {
    tab.classList.toggle("active", tab.dataset.panel === name);
  }
  if (history.replaceState) history.replaceState(null, "", `#${name}`);
  if (name === "collect") startPreview(); else stopPreview();
  if (name !== "quality") pauseReplay();
  if (name === "quality" && ui.selected === null && ui.episodes && ui.episodes.episodes.length) {
    selectEpisode(ui.episodes.episodes[0].episode_index);
  }
  if (name === "quality") redrawPlots();
}

function isTyping(target) {
  if (!target || target === document.body) return false;
  if (target.isContentEditable) return true;
  const tag = target.tagName;
  if (tag === "TEXTAREA" || tag === "SELECT") return true;
  return tag === "INPUT" && !["range", "checkbox", "radio", "button"].includes(target.type);
}

let swallowSpaceKeyup = false;
function onKey(e) {
  if (e.ctrlKey || e.metaKey || e.altKey) return;
  const target = e.target;
  if (isTyping(target)) {
    if (target.id === "note" && e.key === "Enter") {
      e.preventDefault();
      saveReview(undefined);
    } else if (e.key === "Escape") {
      target.blur();
    }
    return;
  }
  const key = e.key;
  let handled = true;
  if (key >= "1" && key <= "4") showPanel(PANELS[Number(key) - 1]);
  else if (ui.panel === "collect" && !e.repeat && key === "s") startRecording();
  else if (ui.panel === "collect" && !e.repeat && key === "e") stopRecording();
  else if (ui.panel === "collect" && !e.repeat && key === "c") cancelRecording();
  else if (ui.panel === "quality" && !e.repeat && key === "p") saveReview("pass");
  else if (ui.panel === "quality" && !e.repeat && key === "f") saveReview("fail");
  else if (ui.panel === "quality" && !e.repeat && key === "x") saveReview(null);
  else if (ui.panel === "quality" && key === "n") $("note").focus();
  else if (ui.panel === "quality" && key === " ") { if (!e.repeat) togglePlay(); }
  else if (ui.panel === "quality" && (key === "," || key === "ArrowLeft")) step(-1);
  else if (ui.panel === "quality" && (key === "." || key === "ArrowRight")) step(1);
  else if (ui.panel === "quality" && key === "j") nextEpisode(1);
  else if (ui.panel === "quality" && key === "k") nextEpisode(-1);
  else handled = false;
  if (handled) {
    e.preventDefault();
    // A focused button would otherwise also "click" on the space key's keyup.
    swallowSpaceKeyup = key === " ";
  }
}

function onKeyUp(e) {
  if (e.key === " " && swallowSpaceKeyup) {
    e.preventDefault();
    swallowSpaceKeyup = false;
  }
}

// ---- status (event stream) --------------------------------------------------------------

function jobActive(job) {
  return Boolean(job) && (job.state === "queued" || job.state === "running");
}

function onStatus(s) {
  const first = ui.status === null;
  ui.status = s;
  if (first) initFromStatus(s);
  renderCollect(s);
  if (s.active_job) onJob(s.active_job);
  renderExport();
  renderUpload();
  if (s.version !== ui.version) {
    ui.version = s.version;
    // A running job bumps the version on every progress step: refetch when it has finished.
    if (!jobActive(s.active_job)) refreshDataset();
  }
}

function fillSelect(select, values, selected) {
  select.replaceChildren(...values.map((v) => el("option", { value: v, text: v })));
  if (selected !== null && selected !== undefined && values.includes(selected)) {
    select.value = selected;
  }
}

function initFromStatus(s) {
  const names = s.datasets.map((d) => d.name);
  const initial = s.dataset || names[0] || null;
  fillSelect($("dataset-select"), names, initial);
  fillTasks();
  for (const select of document.querySelectorAll(".dataset-choice")) fillSelect(select, names, initial);
  ui.dataset = initial;
  $("source").textContent = s.source;
  $("source-note").textContent = s.source_note || "";
  // each stream and where it comes from (a config's sources can differ per stream)
  const streams = Object.entries(s.streams || {});
  const list = $("stream-sources");
  if (!unchanged(list, streams)) {
    list.replaceChildren(...streams.map(([name, text]) => el("li", {}, el("code", {}, name), " ← " + text)));
  }
  const previews = $("previews");
  previews.replaceChildren();
  for (const cam of s.cameras) {
    previews.append(el("figure", { class: "camera" },
      el("img", { id: `preview-${cam.key}`, alt: cam.key, width: cam.width, height: cam.height,
        "data-camera": cam.key }),
      el("figcaption", {}, cam.key, " ", el("span", { class: "muted", id: `fps-${cam.key}` }))));
  }
}

function fillTasks() {
  const dataset = (ui.status.datasets || []).find((d) => d.name === $("dataset-select").value);
  const tasks = dataset ? dataset.tasks : [];
  const recordingTask = ui.status.state === "recording" ? ui.status.task : null;
  fillSelect($("task-select"), tasks, recordingTask);
}

function renderCollect(s) {
  const recording = s.state === "recording";
  const state = $("rec-state");
  state.textContent = s.state;
  state.className = `pill ${s.state}`;
  $("frames").textContent = String(s.frames);
  $("elapsed").textContent = `${s.elapsed_s.toFixed(1)} s`;
  $("backlog").textContent = `${s.backlog_mb.toFixed(1)} MB`;
  $("dropped").textContent = String(s.dropped);
  $("dropped").classList.toggle("error-text", s.dropped > 0);
  $("save-queue").textContent = String(s.save_queue);
  $("start").disabled = recording;
  $("stop").disabled = !recording;
  $("cancel").disabled = !recording;
  $("dataset-select").disabled = recording;
  $("task-select").disabled = recording;
  if (recording && s.dataset && $("dataset-select").value !== s.dataset) {
    $("dataset-select").value = s.dataset;
    fillTasks();
  }
  const errors = [s.source_error, s.consumer_error].filter(Boolean).join(" · ");
  $("source-error").textContent = errors;
  for (const cam of s.cameras) {
    const fps = $(`fps-${cam.key}`);
    const samples = s.samples ? s.samples[cam.key] : undefined;
    if (fps) {
      fps.textContent = recording ? `${(s.camera_fps[cam.key] || 0).toFixed(1)} fps` +
        (samples === undefined ? "" : ` · ${samples} images`) : "";
    }
  }
  const warnings = s.warnings.slice(-5).reverse();
  if (!unchanged($("warnings"), warnings)) {
    $("warnings").replaceChildren(...warnings.map((w) =>
      el("li", { class: w.level, text: `${w.time.slice(11, 19)} ${w.message}` })));
  }
  renderSaved(s.save_jobs);
}

function renderSaved(jobs) {
  const list = $("saved-list");
  if (unchanged(list, jobs)) return;
  if (!jobs.length) {
    list.replaceChildren(el("li", { class: "empty", text: "nothing saved yet" }));
    return;
  }
  list.replaceChildren(...jobs.slice().reverse().map((job) => {
    const codes = (job.quality_issues || []).map((i) => i.code).join(", ");
    const index = job.episode_index === null ? "…" : `#${job.episode_index}`;
    return el("li", {
      class: "saved", "data-job-id": job.job_id, "data-state": job.state,
      "data-episode": job.episode_index ?? "", "data-dataset": job.dataset ?? "",
      title: "open in QUALITY CHECK",
      onclick: () => openEpisode(job.dataset, job.episode_index),
    },
    el("span", { class: "state", text: job.state }), " ",
    job.state === "saved" ? badge(job.quality) : null, " ",
    el("b", { text: `${job.dataset || "?"} ${index}` }),
    ` · ${plural(job.frames, "frame")} · ${job.task || ""}`,
    codes ? el("span", { class: "issues-codes", text: ` · ${codes}` }) : null,
    job.error ? el("span", { class: "error-text", text: ` · ${job.error}` }) : null);
  }));
}

// ---- COLLECT ----------------------------------------------------------------------------

async function refreshStatus() {
  const s = await attempt(() => api("GET", "/api/status"));
  if (s) onStatus(s);
}

async function startRecording() {
  if ($("start").disabled) return;
  const body = { dataset: $("dataset-select").value, task: $("task-select").value || null };
  const r = await attempt(() => api("POST", "/api/collect/start", body));
  if (r) toast(`recording ${r.dataset}: ${body.task || "default task"}`);
  await refreshStatus();
}

async function stopRecording() {
  if ($("stop").disabled) return;
  const r = await attempt(() => api("POST", "/api/collect/stop"));
  if (r) toast(`saving the episode of ${r.dataset}`);
  await refreshStatus();
}

async function cancelRecording() {
  if ($("cancel").disabled) return;
  const r = await attempt(() => api("POST", "/api/collect/cancel"));
  if (r) toast("recording cancelled: nothing saved");
  await refreshStatus();
}

// Camera previews: one request per camera about 4 times a second, only while COLLECT shows.
const preview = { generation: 0, seq: {}, urls: {}, failed: false };

function startPreview() {
  if (ui.status === null || document.hidden) return;
  const generation = ++preview.generation;
  (async () => {
    while (generation === preview.generation) {
      const began = performance.now();
      await Promise.all(ui.status.cameras.map((cam) => fetchPreview(cam.key)));
      const wait = Math.max(50, 250 - (performance.now() - began));
      await new Promise((resolve) => setTimeout(resolve, wait));
    }
  })();
}

function stopPreview() {
  preview.generation += 1;
}

async function fetchPreview(key) {
  const seq = preview.seq[key];
  const url = `/api/preview/${enc(key)}${seq === undefined ? "" : `?after=${seq}`}`;
  try {
    const r = await fetch(url);
    if (r.status === 204) return;
    if (!r.ok) throw new Error(`preview ${key}: HTTP ${r.status}`);
    preview.seq[key] = Number(r.headers.get("x-preview-seq"));
    const objectUrl = URL.createObjectURL(await r.blob());
    const img = $(`preview-${key}`);
    if (img) img.src = objectUrl;
    if (preview.urls[key]) URL.revokeObjectURL(preview.urls[key]);
    preview.urls[key] = objectUrl;
    preview.failed = false;
  } catch (e) {
    if (!preview.failed) toast(e.message, "error");
    preview.failed = true;
  }
}

// ---- datasets: episodes and exports -----------------------------------------------------

function setDataset(name) {
  for (const select of document.querySelectorAll(".dataset-choice")) select.value = name;
  if (name === ui.dataset) return;
  ui.dataset = name;
  ui.episodes = null;
  ui.exports = null;
  ui.selected = null;
  ui.exportSeen = null;
  ui.exportJob = null;
  ui.uploadJob = null;
  ui.acceptAtLoad = true;
  clearReplay();
  renderEpisodes();
  renderExport();
  renderUpload();
  refreshDataset();
}

let refreshing = null;
let refreshAgain = false;
function refreshDataset() {
  if (refreshing) {
    refreshAgain = true;
    return refreshing;
  }
  refreshing = (async () => {
    try {
      await Promise.all([loadEpisodes(), loadExports()]);
    } finally {
      refreshing = null;
      if (refreshAgain) {
        refreshAgain = false;
        refreshDataset();
      }
    }
  })();
  return refreshing;
}

async function loadEpisodes() {
  const name = ui.dataset;
  if (!name) return;
  const data = await attempt(() => api("GET", `/api/datasets/${enc(name)}/episodes`));
  if (!data || name !== ui.dataset) return;
  ui.episodes = data;
  renderEpisodes();
  const ep = currentEpisode();
  if (ep) renderVerdict(ep);
  else if (ui.selected !== null) { ui.selected = null; clearReplay(); }
  if (ui.panel === "quality" && ui.selected === null && data.episodes.length) {
    selectEpisode(data.episodes[0].episode_index);
  }
}

async function loadExports() {
  const name = ui.dataset;
  if (!name) return;
  const data = await attempt(() => api("GET", `/api/datasets/${enc(name)}/exports`));
  if (!data || name !== ui.dataset) return;
  ui.exports = data;
  if (ui.acceptAtLoad && ui.format) {
    ui.acceptAtLoad = false;
    const entry = data.formats[ui.format];
    if (entry && entry.state === "completed") ui.exportSeen = { dataset: name, format: ui.format };
  }
  renderExport();
  renderUpload();
}

function openEpisode(dataset, index) {
  if (!dataset || index === null || index === undefined) return;
  setDataset(dataset);
  showPanel("quality");
  refreshDataset().then(() => selectEpisode(index));
}

// ---- QUALITY CHECK: list, issues, review ------------------------------------------------

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
      "data-verdict": ep.qc_verdict || "", onclick: () => selectEpisode(ep.episode_index),
    },
    badge(ep.quality), " ", el("b", { text: `#${ep.episode_index}` }),
    ` ${plural(ep.length ?? 0, "frame")} `,
    el("span", { class: `verdict ${ep.qc_verdict || "none"}`, text: ep.qc_verdict || "–" }), " ",
    el("span", { class: `subset ${ep.subset}`, text: ep.subset }),
    ep.qc_note ? el("div", { class: "note muted", text: ep.qc_note }) : null)));
  }
  const split = $("split");
  if (data && data.split && data.split.accepted) {
    split.replaceChildren(
      el("span", { class: "subset accepted", id: "split-accepted",
        text: `accepted ${data.split.accepted.length}: [${data.split.accepted.join(", ")}]` }), " ",
      el("span", { class: "subset rejected", id: "split-rejected",
        text: `rejected ${data.split.rejected.length}: [${data.split.rejected.join(", ")}]` }));
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

// ---- QUALITY CHECK: synchronised replay and plots ---------------------------------------

const replay = { generation: 0, fps: 30, length: 0, frame: 0, videos: [], master: null,
  playing: false, plots: [] };

function clearReplay() {
  pauseReplay();
  replay.generation += 1;
  for (const v of replay.videos) { v.removeAttribute("src"); v.load(); }
  replay.videos = [];
  replay.master = null;
  replay.length = 0;
  replay.plots = [];
  $("videos").replaceChildren();
  $("plots").replaceChildren();
  $("issues").replaceChildren();
  $("episode-title").textContent = "select an episode";
  $("episode-verdict").replaceChildren();
  $("note").value = "";
  $("scrubber").max = "0";
  $("scrubber").value = "0";
  $("scrubber").dataset.frame = "0";
  $("frame-label").textContent = "frame – / –";
}

async function loadReplay(ep) {
  const generation = ++replay.generation;
  pauseReplay();
  const name = ui.dataset;
  const base = `/api/datasets/${enc(name)}/episodes/${ep.episode_index}`;
  const series = await attempt(() => api("GET", `${base}/series`));
  if (!series || generation !== replay.generation) return;
  for (const v of replay.videos) { v.removeAttribute("src"); v.load(); }
  replay.fps = series.fps;
  replay.length = Math.max(1, series.length);
  replay.frame = 0;
  replay.videos = (ep.video_keys || []).map((key) => {
    const video = el("video", { muted: true, playsInline: true, preload: "auto",
      "data-key": key, "data-frame": "" });
    video.muted = true;
    video.src = `${base}/video/${enc(key)}`;
    video.addEventListener("ended", () => { if (video === replay.master) pauseReplay(); });
    video.addEventListener("error", () =>
      toast(`video ${key}: ${video.error ? video.error.message || video.error.code : "error"}`,
        "error"));
    watchFrames(video);
    return video;
  });
  replay.master = replay.videos[0] || null;
  $("videos").replaceChildren(...replay.videos.map((v) =>
    el("figure", { class: "camera" }, v, el("figcaption", { text: v.dataset.key }))));
  const scrubber = $("scrubber");
  scrubber.max = String(replay.length - 1);
  buildPlots(series);
  seekAll(0);
}

// Each video reports the frame it shows (data-frame) from the presented frame's media time.
function watchFrames(video) {
  if (!video.requestVideoFrameCallback) {
    const update = () => { video.dataset.frame = String(frameAt(video.currentTime)); };
    video.addEventListener("seeked", update);
    video.addEventListener("timeupdate", update);
    return;
  }
  const onFrame = (now, meta) => {
    if (!replay.videos.includes(video)) return;
    const frame = Math.round(meta.mediaTime * replay.fps);
    video.dataset.frame = String(frame);
    if (video === replay.master && replay.playing) onMasterFrame(frame);
    video.requestVideoFrameCallback(onFrame);
  };
  video.requestVideoFrameCallback(onFrame);
}

function frameAt(seconds) {
  return Math.min(replay.length - 1, Math.max(0, Math.floor(seconds * replay.fps + 1e-6)));
}

function showCursor(frame) {
  const scrubber = $("scrubber");
  scrubber.value = String(frame);
  scrubber.dataset.frame = String(frame);
  $("frame-label").textContent = `frame ${frame} / ${replay.length - 1}`;
  drawCursors();
}

function onMasterFrame(frame) {
  replay.frame = frame;
  showCursor(frame);
  const master = replay.master;
  const tolerance = 0.5 / replay.fps;
  for (const v of replay.videos) {
    if (v !== master && !v.seeking && Math.abs(v.currentTime - master.currentTime) > tolerance) {
      v.currentTime = master.currentTime;
    }
    if (v !== master && v.paused && !master.paused) v.play().catch(() => {});
  }
}

// Frame-exact positioning: the middle of the frame's display interval.
function seekAll(frame) {
  if (!replay.videos.length && !replay.plots.length) return;
  frame = Math.min(replay.length - 1, Math.max(0, Math.round(frame)));
  replay.frame = frame;
  for (const v of replay.videos) v.currentTime = (frame + 0.5) / replay.fps;
  showCursor(frame);
}

function pauseReplay() {
  const wasPlaying = replay.playing;
  replay.playing = false;
  $("play").textContent = "▶ play";
  for (const v of replay.videos) v.pause();
  if (wasPlaying && replay.master) seekAll(frameAt(replay.master.currentTime));
}

function togglePlay() {
  if (!replay.master) return;
  if (replay.playing) {
    pauseReplay();
    return;
  }
  if (replay.frame >= replay.length - 1) seekAll(0);
  replay.playing = true;
  $("play").textContent = "❚❚ pause";
  for (const v of replay.videos) {
    v.play().catch((e) => {
      if (replay.playing) toast(`play: ${e.message}`, "error");
    });
  }
}

function step(delta) {
  if (!replay.master) return;
  const from = replay.playing ? frameAt(replay.master.currentTime) : replay.frame;
  replay.playing = false;
  $("play").textContent = "▶ play";
  for (const v of replay.videos) v.pause();
  seekAll(from + delta);
}

// One canvas per vector feature, one line per dimension; the lines are drawn once into an
// offscreen canvas and the cursor is drawn over a copy of it.
function buildPlots(series) {
  const container = $("plots");
  container.replaceChildren();
  replay.plots = [];
  for (const [key, s] of Object.entries(series.series)) {
    const canvas = el("canvas", { class: "plot", height: 150, "data-key": key });
    const legend = el("div", { class: "legend" }, ...s.names.map((name, i) =>
      el("span", { style: `color:${PALETTE[i % PALETTE.length]}`, text: name })));
    container.append(el("div", { class: "plot-box" }, el("div", { class: "plot-title", text: key }),
      canvas, legend));
    replay.plots.push({ canvas, series: s, frames: series.frame_index, base: null });
  }
  redrawPlots();
}

const PAD = { left: 44, right: 8, top: 8, bottom: 16 };

function xOf(plot, frame) {
  const w = plot.canvas.width - PAD.left - PAD.right;
  return PAD.left + (replay.length > 1 ? (frame / (replay.length - 1)) * w : 0);
}

function redrawPlots() {
  for (const plot of replay.plots) {
    const width = Math.max(200, plot.canvas.parentElement.clientWidth || 600);
    plot.canvas.width = width;
    plot.base = renderPlotBase(plot);
  }
  drawCursors();
}

function renderPlotBase(plot) {
  const { canvas, series, frames } = plot;
  const base = document.createElement("canvas");
  base.width = canvas.width;
  base.height = canvas.height;
  const ctx = base.getContext("2d");
  let lo = Infinity;
  let hi = -Infinity;
  for (const dim of series.values) {
    for (const v of dim) {
      if (v === null) continue;
      if (v < lo) lo = v;
      if (v > hi) hi = v;
    }
  }
  if (!Number.isFinite(lo)) { lo = -1; hi = 1; }
  if (hi - lo < 1e-9) { lo -= 1; hi += 1; }
  const h = base.height - PAD.top - PAD.bottom;
  const yOf = (v) => PAD.top + (1 - (v - lo) / (hi - lo)) * h;
  ctx.fillStyle = "#11151c";
  ctx.fillRect(0, 0, base.width, base.height);
  ctx.strokeStyle = "#2a3140";
  ctx.fillStyle = "#8b95a7";
  ctx.font = "10px sans-serif";
  ctx.lineWidth = 1;
  for (const v of [lo, (lo + hi) / 2, hi]) {
    const y = Math.round(yOf(v)) + 0.5;
    ctx.beginPath();
    ctx.moveTo(PAD.left, y);
    ctx.lineTo(base.width - PAD.right, y);
    ctx.stroke();
    const label = Math.abs(v) < (hi - lo) * 1e-3 ? "0" : String(Number(v.toPrecision(3)));
    ctx.fillText(label, 2, y + 3);
  }
  ctx.fillText("0", PAD.left, base.height - 3);
  const last = String(replay.length - 1);
  ctx.fillText(last, base.width - PAD.right - ctx.measureText(last).width, base.height - 3);
  ctx.lineWidth = 1.5;
  series.values.forEach((dim, i) => {
    ctx.strokeStyle = PALETTE[i % PALETTE.length];
    ctx.beginPath();
    let pen = false;
    dim.forEach((v, j) => {
      if (v === null) { pen = false; return; }
      const x = xOf(plot, frames[j]);
      const y = yOf(v);
      if (pen) ctx.lineTo(x, y); else ctx.moveTo(x, y);
      pen = true;
    });
    ctx.stroke();
  });
  return base;
}

function drawCursors() {
  for (const plot of replay.plots) {
    if (!plot.base) continue;
    const ctx = plot.canvas.getContext("2d");
    ctx.drawImage(plot.base, 0, 0);
    const x = Math.round(xOf(plot, replay.frame)) + 0.5;
    ctx.strokeStyle = "#ffffff";
    ctx.lineWidth = 1;
    ctx.beginPath();
    ctx.moveTo(x, PAD.top);
    ctx.lineTo(x, plot.canvas.height - PAD.bottom);
    ctx.stroke();
  }
}

// ---- EXPORT -----------------------------------------------------------------------------

async function loadFormats() {
  const data = await attempt(() => api("GET", "/api/formats"));
  if (!data) return;
  ui.formats = data.formats;
  const names = Object.keys(data.formats);
  fillSelect($("format-select"), names, names[0]);
  ui.format = $("format-select").value || null;
  buildOptions();
}

function buildOptions() {
  const box = $("format-options");
  const specs = ui.formats[ui.format] || [];
  box.replaceChildren(el("legend", { text: `${ui.format} options` }));
  for (const spec of specs) {
    let input;
    const common = { id: `opt-${spec.name}`, "data-option": spec.name, "data-type": spec.type,
      title: spec.help };
    if (spec.type === "bool") {
      input = el("input", { ...common, type: "checkbox", checked: Boolean(spec.default) });
    } else if (spec.type === "int" || spec.type === "float") {
      input = el("input", { ...common, type: "number", value: String(spec.default),
        step: spec.type === "int" ? "1" : "any",
        min: spec.minimum === null ? null : String(spec.minimum) });
    } else if (spec.type === "choice") {
      input = el("select", common);
      fillSelect(input, spec.choices, spec.default);
    } else {
      input = el("input", { ...common, type: "text", value: spec.default ?? "" });
    }
    box.append(el("label", { class: "option" }, el("span", { class: "name", text: spec.name }),
      input, el("span", { class: "muted help", text: spec.help })));
  }
  if (!specs.length) box.append(el("span", { class: "muted", text: "no options" }));
}

// Only the options changed from their defaults go to the server.
function changedOptions() {
  const options = {};
  for (const spec of ui.formats[ui.format] || []) {
    const input = $(`opt-${spec.name}`);
    if (!input) continue;
    let value;
    if (spec.type === "bool") value = input.checked;
    else if (spec.type === "int" || spec.type === "float") {
      if (input.value.trim() === "") continue;
      value = Number(input.value);
    } else value = input.value;
    if (value !== spec.default) options[spec.name] = value;
  }
  return options;
}

function onFormatChange() {
  ui.format = $("format-select").value;
  // Product rule: a new format needs a new export before anything can be uploaded.
  ui.exportSeen = null;
  ui.exportJob = null;
  ui.uploadJob = null;
  ui.acceptAtLoad = false;
  const active = ui.status && ui.status.active_job;
  if (active) ui.ignoredJobs.add(active.job_id);
  buildOptions();
  renderExport();
  renderUpload();
}

async function startExport() {
  const name = ui.dataset;
  const body = { format: ui.format, options: changedOptions() };
  const job = await attempt(() => api("POST", `/api/datasets/${enc(name)}/export`, body));
  if (!job) return;
  ui.exportSeen = null;
  ui.exportJob = job;
  ui.uploadJob = null;
  toast(`export ${job.format} of ${job.dataset} started`);
  renderExport();
  renderUpload();
}

function onJob(job) {
  if (!job || ui.ignoredJobs.has(job.job_id)) return;
  if (job.dataset !== ui.dataset || job.format !== ui.format) return;
  if (job.kind === "export") {
    const previous = ui.exportJob && ui.exportJob.job_id === job.job_id ? ui.exportJob.state : null;
    ui.exportJob = job;
    if (job.state === "completed" && previous !== "completed") {
      ui.exportSeen = { dataset: job.dataset, format: job.format };
      toast(`export ${job.format} completed`);
      refreshDataset();
    } else if (job.state === "failed" && previous !== "failed") {
      ui.exportSeen = null;
      toast(`export ${job.format} failed: ${job.error}`, "error");
      refreshDataset();
    }
    renderExport();
  } else if (job.kind === "upload") {
    const previous = ui.uploadJob && ui.uploadJob.job_id === job.job_id ? ui.uploadJob.state : null;
    ui.uploadJob = job;
    if ((job.state === "completed" || job.state === "failed") && previous !== job.state) {
      if (job.state === "failed") toast(`upload failed: ${job.error}`, "error");
      else toast(`uploaded to ${job.remote_path}`);
      refreshDataset();
    }
  }
  renderUpload();
}

function setBar(id, textId, done, total, bytes = false) {
  const bar = $(id);
  const show = bytes ? fmtBytes : String;
  if (total === null || total === undefined) {
    bar.removeAttribute("value"); // indeterminate
    bar.removeAttribute("max");
    $(textId).textContent = done === null || done === undefined ? "" : show(done);
  } else {
    bar.max = Math.max(1, total);
    bar.value = Math.min(done || 0, total);
    $(textId).textContent = `${show(done || 0)} / ${show(total)}`;
  }
}

function setFinishedBar(id, textId, done, bytes = false) {
  const bar = $(id);
  bar.max = 1;
  bar.value = done === null || done === undefined ? 0 : 1;
  $(textId).textContent = done === null || done === undefined ? "" :
    (bytes ? fmtBytes(done) : String(done));
}

function totalsText(t) {
  if (!t || t.episodes === null || t.episodes === undefined) return "";
  return `${plural(t.episodes, "episode")}, ${plural(t.frames ?? 0, "frame")}`;
}

function verifyNode(id, v) {
  const node = $(id);
  if (!v) { node.textContent = ""; node.className = ""; return; }
  node.className = v.ok ? "ok" : "error-text";
  node.textContent = v.ok ? "verify ok" : `verify: ${v.problems.join("; ")}`;
}

function renderExport() {
  const fmt = ui.format;
  const job = ui.exportJob;
  const entry = ui.exports && ui.exports.formats ? ui.exports.formats[fmt] : null;
  const seenEarlier = !job && ui.exportSeen && entry && entry.state === "completed";
  const state = $("export-state");
  const running = jobActive(job);
  const busy = running || jobActive(ui.status && ui.status.active_job);
  $("export-button").disabled = busy || !ui.dataset || !fmt;
  let text;
  if (job) text = job.state;
  else if (seenEarlier) text = "completed (earlier export)";
  else text = `export required for ${fmt}`;
  state.textContent = text;
  state.dataset.state = job ? job.state : seenEarlier ? "completed" : "required";
  state.className = `pill ${state.dataset.state}`;
  $("export-current").textContent = job && running && job.progress.current ?
    `${job.progress.current}` : job ? job.job_id : "";
  const p = (job && job.progress) || {};
  if (job && job.state === "completed") {
    setFinishedBar("export-progress-episodes", "export-episodes-text", p.episodes);
    setFinishedBar("export-progress-files", "export-files-text", p.files);
    setFinishedBar("export-progress-bytes", "export-bytes-text", p.bytes, true);
  } else if (job) {
    setBar("export-progress-episodes", "export-episodes-text", p.episodes, p.total_episodes);
    setBar("export-progress-files", "export-files-text", p.files, p.total_files);
    setBar("export-progress-bytes", "export-bytes-text", p.bytes, p.total_bytes, true);
  } else {
    for (const [bar, label] of [["episodes", "episodes"], ["files", "files"], ["bytes", "bytes"]]) {
      $(`export-progress-${bar}`).value = 0;
      $(`export-progress-${bar}`).max = 1;
      $(`export-${label}-text`).textContent = "";
    }
  }
  const source = job || (seenEarlier ? entry : null);
  $("accepted-dir").textContent = (source && source.accepted_dir) || "–";
  $("rejected-dir").textContent = (source && source.rejected_dir) || "–";
  const totals = (source && source.totals) || {};
  $("totals-accepted").textContent = totalsText(totals.accepted);
  $("totals-rejected").textContent = totalsText(totals.rejected);
  verifyNode("verify-accepted", job && job.verify ? job.verify.accepted : null);
  verifyNode("verify-rejected", job && job.verify ? job.verify.rejected : null);
  $("export-error").textContent = job && job.error ? `export failed: ${job.error}` : "";
  const stale = entry && entry.stale;
  $("export-stale").hidden = !stale;
  $("export-stale").textContent = "export stale: re-export (the review changed since this export)";
  renderExportsTable();
}

function renderExportsTable() {
  const formats = (ui.exports && ui.exports.formats) || {};
  const body = $("exports-table").tBodies[0];
  if (unchanged(body, [ui.formats, formats])) return;
  body.replaceChildren(...Object.keys(ui.formats).map((fmt) => {
    const e = formats[fmt] || {};
    const t = e.totals || {};
    const up = e.last_upload;
    return el("tr", { "data-format": fmt },
      el("td", { text: fmt }),
      el("td", { text: (e.state || "none") + (e.stale ? " (stale)" : "") }),
      el("td", { text: totalsText(t.accepted) }),
      el("td", { text: totalsText(t.rejected) }),
      el("td", { text: up ? `${up.state} ${up.remote_path || up.error || ""}` : "–" }));
  }));
}

// ---- UPLOAD -----------------------------------------------------------------------------

function uploadBlockers() {
  const fmt = ui.format;
  const reasons = [];
  const entry = ui.exports && ui.exports.formats ? ui.exports.formats[fmt] : null;
  const gate = entry ? entry.upload : null;
  if (gate && !gate.allowed) reasons.push(`${gate.reason}: ${gate.message}`);
  if (!gate && ui.status && !ui.status.upload_backend) {
    reasons.push("no_backend: no upload backend configured: add a [collection.storage.sftp] " +
      "table to the config");
  }
  const seen = ui.exportSeen;
  if (!seen || seen.dataset !== ui.dataset || seen.format !== fmt) {
    reasons.unshift(`export required for ${fmt}`);
  }
  if (!gate && !reasons.length) reasons.push("no export information yet");
  return reasons;
}

function renderUpload() {
  $("upload-dataset").textContent = ui.dataset || "–";
  $("upload-format").textContent = ui.format || "–";
  $("upload-backend").textContent = (ui.status && ui.status.upload_backend) || "no backend";
  const job = ui.uploadJob;
  const running = jobActive(job) || jobActive(ui.status && ui.status.active_job);
  const reasons = uploadBlockers();
  const button = $("upload-button");
  button.disabled = running || reasons.length > 0;
  const reason = $("upload-reason");
  reason.textContent = reasons.length ? reasons.join(" · ") : "ready: the accepted export passed the gate";
  reason.className = reasons.length ? "error-text" : "ok";
  reason.dataset.reason = reasons.length ? reasons[0].split(":")[0] : "";
  const state = $("upload-state");
  state.textContent = job ? job.state : "–";
  state.dataset.state = job ? job.state : "";
  state.className = `pill ${job ? job.state : ""}`;
  $("upload-current").textContent = job && job.progress && job.progress.current ?
    job.progress.current : "";
  const p = (job && job.progress) || {};
  if (job && job.state === "completed") {
    const totals = job.totals || {};
    setBar("upload-progress-files", "upload-files-text", totals.files ?? p.files,
      totals.files ?? p.total_files);
    setBar("upload-progress-bytes", "upload-bytes-text", totals.bytes ?? p.bytes,
      totals.bytes ?? p.total_bytes, true);
  } else if (job) {
    setBar("upload-progress-files", "upload-files-text", p.files, p.total_files);
    setBar("upload-progress-bytes", "upload-bytes-text", p.bytes, p.total_bytes, true);
  } else {
    for (const name of ["files", "bytes"]) {
      $(`upload-progress-${name}`).value = 0;
      $(`upload-progress-${name}`).max = 1;
      $(`upload-${name}-text`).textContent = "";
    }
  }
  $("remote-path").textContent = (job && job.remote_path) || "–";
  $("upload-error").textContent = job && job.error ? `upload failed: ${job.error}` : "";
  const entry = ui.exports && ui.exports.formats ? ui.exports.formats[ui.format] : null;
  const last = entry ? entry.last_upload : null;
  $("last-upload").textContent = last ?
    `${last.state} ${last.remote_path || last.error || ""} ${last.finished_at || ""}` : "none";
}

async function startUpload() {
  if ($("upload-button").disabled) return;
  const name = ui.dataset;
  try {
    const job = await api("POST", `/api/datasets/${enc(name)}/upload`, { format: ui.format });
    ui.uploadJob = job;
    toast(`upload of the accepted ${job.format} export started`);
  } catch (e) {
    $("upload-error").textContent = `upload refused: ${e.code ? `${e.code}: ` : ""}${e.message}`;
    toast(e.message, "error");
    await refreshDataset();
  }
  renderUpload();
}

// ---- start ------------------------------------------------------------------------------

function connectEvents() {
  const source = new EventSource("/api/events");
  const connection = $("connection");
  source.addEventListener("open", () => {
    connection.textContent = "live";
    connection.className = "pill good";
  });
  source.addEventListener("error", () => {
    connection.textContent = source.readyState === EventSource.CLOSED ? "offline" : "reconnecting";
    connection.className = "pill bad";
  });
  source.addEventListener("status", (e) => onStatus(JSON.parse(e.data)));
  source.addEventListener("job", (e) => onJob(JSON.parse(e.data)));
}

async function main() {
  for (const tab of document.querySelectorAll("#tabs button")) {
    tab.addEventListener("click", () => showPanel(tab.dataset.panel));
  }
  document.addEventListener("keydown", onKey);
  document.addEventListener("keyup", onKeyUp);
  document.addEventListener("visibilitychange", () => {
    if (document.hidden) stopPreview(); else if (ui.panel === "collect") startPreview();
  });
  window.addEventListener("resize", () => { if (ui.panel === "quality") redrawPlots(); });
  $("start").addEventListener("click", startRecording);
  $("stop").addEventListener("click", stopRecording);
  $("cancel").addEventListener("click", cancelRecording);
  $("dataset-select").addEventListener("change", () => {
    fillTasks();
    setDataset($("dataset-select").value);
  });
  for (const select of document.querySelectorAll(".dataset-choice")) {
    select.addEventListener("change", () => setDataset(select.value));
  }
  $("pass").addEventListener("click", () => saveReview("pass"));
  $("fail").addEventListener("click", () => saveReview("fail"));
  $("clear").addEventListener("click", () => saveReview(null));
  $("save-note").addEventListener("click", () => saveReview(undefined));
  $("play").addEventListener("click", togglePlay);
  $("step-back").addEventListener("click", () => step(-1));
  $("step-forward").addEventListener("click", () => step(1));
  $("scrubber").addEventListener("input", () => {
    pauseReplay();
    seekAll(Number($("scrubber").value));
  });
  $("format-select").addEventListener("change", onFormatChange);
  $("export-button").addEventListener("click", startExport);
  $("upload-button").addEventListener("click", startUpload);

  await loadFormats();
  const status = await attempt(() => api("GET", "/api/status"));
  if (status) onStatus(status);
  const wanted = location.hash.slice(1);
  showPanel(PANELS.includes(wanted) ? wanted : "collect");
  connectEvents();
}

main();
