// UPLOAD ACCEPTED: why an upload is not possible yet (the gate, the backend, the format rule),
// UPLOAD ACCEPTED, the running upload's progress, and the last upload of this export.
import { api, attempt, enc } from "../lib/api.js";
import { clearBar, setBar, setStoppedBar } from "../lib/bars.js";
import { refreshDataset } from "../lib/datasets.js";
import { $, toast } from "../lib/dom.js";
import { currentExport, jobActive, ui } from "../lib/state.js";

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
  if (!currentExport(entry)) reasons.unshift(`export required for ${fmt}`);
  if (!gate && !reasons.length) reasons.push("no export information yet");
  return reasons;
}

function renderProgress(job) {
  const p = (job && job.progress) || {};
  if (job && job.state === "completed") {
    const totals = job.totals || {};
    setBar("upload-progress-files", "upload-files-text", totals.files ?? p.files,
      totals.files ?? p.total_files);
    setBar("upload-progress-bytes", "upload-bytes-text", totals.bytes ?? p.bytes,
      totals.bytes ?? p.total_bytes, true);
  } else if (job && job.state === "failed") {
    setStoppedBar("upload-progress-files", "upload-files-text", p.files, p.total_files);
    setStoppedBar("upload-progress-bytes", "upload-bytes-text", p.bytes, p.total_bytes, true);
  } else if (job) {
    setBar("upload-progress-files", "upload-files-text", p.files, p.total_files);
    setBar("upload-progress-bytes", "upload-bytes-text", p.bytes, p.total_bytes, true);
  } else {
    for (const name of ["files", "bytes"]) {
      clearBar(`upload-progress-${name}`, `upload-${name}-text`);
    }
  }
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
  const asking = $("upload-again");
  if (button.disabled || asking.dataset.for !== `${ui.dataset}/${ui.format}`) asking.hidden = true;
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
  renderProgress(job);
  $("remote-path").textContent = (job && job.remote_path) || "–";
  $("upload-error").textContent = job && job.error ? `upload failed: ${job.error}` : "";
  renderHostKey(job);
  const entry = ui.exports && ui.exports.formats ? ui.exports.formats[ui.format] : null;
  const last = entry ? entry.last_upload : null;
  $("last-upload").textContent = last ?
    `${last.state} ${last.remote_path || last.error || ""} ${last.finished_at || ""}` : "none";
}

// A host key the upload refused: its server and SHA-256 fingerprint; TRUST only for a key
// known_hosts lists nothing for (a changed or revoked key is fixed in known_hosts by hand).
const HOST_KEY_ADVICE = {
  unknown: "First contact: compare this fingerprint with the server's own (on the server: " +
    "ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub). TRUST records it in known_hosts; " +
    "then upload again.",
  changed: "Refused: known_hosts lists another key for this server (a reinstalled server, or " +
    "someone in between). Check with its administrator and fix known_hosts by hand; this page " +
    "cannot override it.",
  revoked: "Refused: known_hosts marks this key @revoked.",
};
let trustedFor = null; // the failed upload whose host key was trusted since

function renderHostKey(job) {
  const key = job && job.state === "failed" ? job.host_key : null;
  const shown = Boolean(key) && job.job_id !== trustedFor;
  $("host-key").hidden = !shown;
  if (!shown) return;
  $("host-key").dataset.state = key.state;
  $("host-key-server").textContent = key.server;
  $("host-key-fingerprint").textContent = key.fingerprint;
  $("host-key-state").textContent = key.state === "unknown" ? "not in known_hosts" : key.state;
  $("host-key-advice").textContent = HOST_KEY_ADVICE[key.state] || "";
  $("trust-host-key").hidden = key.state !== "unknown";
}

async function trustHostKey() {
  const fingerprint = $("host-key-fingerprint").textContent;
  const job = ui.uploadJob;
  const report = await attempt(() => api("POST", "/api/upload/host-key", { fingerprint }));
  if (!report) return;
  trustedFor = job ? job.job_id : null;
  toast(`host key of ${report.server} trusted: recorded in ${report.known_hosts}`);
  renderUpload();
}

// The export already went to this server: the server says where, and the page asks before a
// second copy (published under a copy name beside the first).
async function startUpload(again = false) {
  if ($("upload-button").disabled) return;
  $("upload-again").hidden = true;
  const name = ui.dataset;
  const body = again ? { format: ui.format, again: true } : { format: ui.format };
  try {
    const job = await api("POST", `/api/datasets/${enc(name)}/upload`, body);
    ui.uploadJob = job;
    toast(`upload of the accepted ${job.format} export started`);
  } catch (e) {
    if (e.code === "already_uploaded") {
      $("upload-again-text").textContent = `${e.message.split("; ")[0]}. Upload a second copy?`;
      $("upload-again").hidden = false;
      $("upload-again").dataset.for = `${name}/${body.format}`;
      return;
    }
    $("upload-error").textContent = `upload refused: ${e.code ? `${e.code}: ` : ""}${e.message}`;
    toast(e.message, "error");
    await refreshDataset();
  }
  renderUpload();
}

// Every job of the page's dataset and format redraws this panel (an export changes the gate).
function onJob(job) {
  if (job.kind === "upload") {
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

export const uploadPanel = {
  name: "upload",
  setup() {
    $("upload-button").addEventListener("click", () => startUpload(false));
    $("upload-again-yes").addEventListener("click", () => startUpload(true));
    $("upload-again-no").addEventListener("click", () => { $("upload-again").hidden = true; });
    $("trust-host-key").addEventListener("click", trustHostKey);
  },
  onJob,
  onExportState: renderUpload,
};
