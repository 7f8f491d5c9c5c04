// EXPORT: the format and its options (generated from GET /api/formats), EXPORT DATASET, the
// running export's progress, its verify result, and the latest export per format.
import { api, attempt, enc } from "../lib/api.js";
import { clearBar, setBar, setFinishedBar, setStoppedBar } from "../lib/bars.js";
import { refreshDataset } from "../lib/datasets.js";
import { $, el, fillSelect, plural, toast, unchanged } from "../lib/dom.js";
import { notify } from "../lib/panels.js";
import { currentExport, jobActive, ui } from "../lib/state.js";

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
  // The panels now show this format's latest export (GET .../exports); a job of the format
  // left behind is no longer this page's to show.
  ui.exportJob = null;
  ui.uploadJob = null;
  const active = ui.status && ui.status.active_job;
  if (active) ui.ignoredJobs.add(active.job_id);
  buildOptions();
  notify("onExportState");
}

async function startExport() {
  const name = ui.dataset;
  const body = { format: ui.format, options: changedOptions() };
  const job = await attempt(() => api("POST", `/api/datasets/${enc(name)}/export`, body));
  if (!job) return;
  ui.exportJob = job;
  ui.uploadJob = null;
  toast(`export ${job.format} of ${job.dataset} started`);
  notify("onExportState");
}

function onJob(job) {
  if (job.kind !== "export") return;
  const previous = ui.exportJob && ui.exportJob.job_id === job.job_id ? ui.exportJob.state : null;
  ui.exportJob = job;
  if (job.state === "completed" && previous !== "completed") {
    toast(`export ${job.format} completed`);
    refreshDataset();
  } else if (job.state === "failed" && previous !== "failed") {
    toast(`export ${job.format} failed: ${job.error}`, "error");
    refreshDataset();
  }
  renderExport();
}

function totalsText(t) {
  if (!t || t.episodes === null || t.episodes === undefined) return "";
  return `${plural(t.episodes, "episode")}, ${plural(t.frames ?? 0, "frame")}`;
}

function verifyNode(id, v) {
  const node = $(id);
  if (!v) { node.textContent = ""; node.className = ""; return; }
  node.className = v.ok ? "ok" : "error-text";
  const took = v.elapsed_s === undefined ? "" : ` (${v.elapsed_s.toFixed(1)} s)`;
  node.textContent = v.ok ? `verify ok${took}` : `verify${took}: ${v.problems.join("; ")}`;
}

// The running step, and during eva verify its elapsed seconds (verify reports no finer
// progress: a 1 s timer redraws the count while it runs).
function currentText(p) {
  if (!p.verify_started_at) return `${p.current}`;
  const since = Math.max(0, (Date.now() - Date.parse(p.verify_started_at)) / 1000);
  return `${p.current} · ${Math.floor(since)} s`;
}

let verifyTimer = null;
function tickWhileVerifying(verifying) {
  if (verifying && !verifyTimer) verifyTimer = setInterval(renderExport, 1000);
  if (!verifying && verifyTimer) { clearInterval(verifyTimer); verifyTimer = null; }
}

function renderProgress(job) {
  const p = (job && job.progress) || {};
  if (job && job.state === "completed") {
    setFinishedBar("export-progress-episodes", "export-episodes-text", p.episodes);
    setFinishedBar("export-progress-files", "export-files-text", p.files);
    setFinishedBar("export-progress-bytes", "export-bytes-text", p.bytes, true);
  } else if (job && job.state === "failed") {
    setStoppedBar("export-progress-episodes", "export-episodes-text", p.episodes, p.total_episodes);
    setStoppedBar("export-progress-files", "export-files-text", p.files, p.total_files);
    setStoppedBar("export-progress-bytes", "export-bytes-text", p.bytes, p.total_bytes, true);
  } else if (job) {
    setBar("export-progress-episodes", "export-episodes-text", p.episodes, p.total_episodes);
    setBar("export-progress-files", "export-files-text", p.files, p.total_files);
    setBar("export-progress-bytes", "export-bytes-text", p.bytes, p.total_bytes, true);
  } else {
    for (const name of ["episodes", "files", "bytes"]) {
      clearBar(`export-progress-${name}`, `export-${name}-text`);
    }
  }
}

function renderExport() {
  const fmt = ui.format;
  const job = ui.exportJob;
  const entry = ui.exports && ui.exports.formats ? ui.exports.formats[fmt] : null;
  // Without a job of this page, the latest export of the format (what the EXPORT table shows).
  const seenEarlier = !job && currentExport(entry);
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
    currentText(job.progress) : job ? job.job_id : "";
  tickWhileVerifying(running && job.progress.verify_started_at);
  renderProgress(job);
  // The directories of a job that did not publish them (failed early) are not listed.
  const source = job ? (job.state === "failed" && !job.accepted_dir ? null : job) :
    seenEarlier ? entry : null;
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

export const exportPanel = {
  name: "export",
  setup() {
    $("format-select").addEventListener("change", onFormatChange);
    $("export-button").addEventListener("click", startExport);
  },
  load: loadFormats,
  onJob,
  onExportState: renderExport,
};
