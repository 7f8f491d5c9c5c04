// COLLECT: the source and its streams, START / STOP / CANCEL, the recording's counters and
// warnings, the camera previews (~4 Hz, only while this panel shows) and the saved episodes.
import { api, attempt, enc } from "../lib/api.js";
import { setDataset } from "../lib/datasets.js";
import { $, badge, el, fillSelect, plural, toast, unchanged } from "../lib/dom.js";
import { ui } from "../lib/state.js";
import { refreshStatus } from "../lib/status.js";
import { openEpisode } from "./quality.js";

function init(s) {
  const names = s.datasets.map((d) => d.name);
  fillSelect($("dataset-select"), names, s.dataset || names[0] || null);
  fillTasks();
  $("source").textContent = s.source;
  $("source-note").textContent = restates(s.source_note, s.source) ? "" : s.source_note || "";
  // Where the streams come from: one line per distinct source (a config's sources can differ
  // per stream), none when every stream comes from the source line's own source.
  const bySource = new Map();
  for (const [name, text] of Object.entries(s.streams || {})) {
    bySource.set(text, [...(bySource.get(text) || []), name]);
  }
  const groups = [...bySource].filter(([text]) => !(bySource.size === 1 && text === s.source));
  const list = $("stream-sources");
  if (!unchanged(list, groups)) {
    list.replaceChildren(...groups.map(([text, names]) =>
      el("li", {}, el("code", {}, names.join(", ")), " ← " + text)));
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

// A note that only says again what the source line says (every word of it already there).
function restates(note, source) {
  if (!note) return true;
  const words = (text) => text.toLowerCase().match(/[a-z0-9]+/g) || [];
  const said = new Set(words(note));
  return words(source).every((w) => said.has(w));
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
    if (fps) fps.textContent = recording ? fpsCaption(s, cam.key, samples) : "";
  }
  const warnings = repeatsFolded(s.warnings).slice(-5).reverse();
  if (!unchanged($("warnings"), warnings)) {
    $("warnings").replaceChildren(...warnings.map((w) =>
      el("li", { class: w.level, text: `${clockTime(w.time)} ${w.message}` +
        (w.count > 1 ? ` (×${w.count})` : "") })));
  }
  renderSaved(s.save_jobs);
}

// The rate the caption shows is the camera's images over the recording's duration, so that the
// three figures agree (the status's camera_fps, a rate between two status readings, until the
// image count is known).
function fpsCaption(s, key, samples) {
  if (samples === undefined || !(s.elapsed_s > 0)) {
    return `${(s.camera_fps[key] || 0).toFixed(1)} fps`;
  }
  return `${(samples / s.elapsed_s).toFixed(1)} fps · ${samples} images in ` +
    `${s.elapsed_s.toFixed(1)} s`;
}

// The operator's local wall-clock time of a status timestamp (ISO UTC), e.g. 14:03:27.
function clockTime(iso) {
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? "" : date.toLocaleTimeString([], { hour12: false });
}

// The same message again: one line with the count and the latest time.
function repeatsFolded(warnings) {
  const folded = [];
  for (const w of warnings) {
    const last = folded[folded.length - 1];
    if (last && last.message === w.message) folded[folded.length - 1] = { ...w, count: last.count + 1 };
    else folded.push({ ...w, count: 1 });
  }
  return folded;
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

// ---- recording --------------------------------------------------------------------------

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

// ---- camera previews: one request per camera about 4 times a second ---------------------

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

// ---- the panel --------------------------------------------------------------------------

export const collectPanel = {
  name: "collect",
  setup() {
    $("start").addEventListener("click", startRecording);
    $("stop").addEventListener("click", stopRecording);
    $("cancel").addEventListener("click", cancelRecording);
    $("dataset-select").addEventListener("change", () => {
      fillTasks();
      setDataset($("dataset-select").value);
    });
    document.addEventListener("visibilitychange", () => {
      if (document.hidden) stopPreview(); else if (ui.panel === "collect") startPreview();
    });
  },
  init,
  onStatus: renderCollect,
  show: startPreview,
  hide: stopPreview,
  onKey(e) {
    if (e.repeat) return false;
    if (e.key === "s") startRecording();
    else if (e.key === "e") stopRecording();
    else if (e.key === "c") cancelRecording();
    else return false;
    return true;
  },
};
