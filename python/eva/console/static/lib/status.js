// The server's status and job events, handed to every panel (lib/panels.js hooks), and the
// dataset fetched again when the server's version moves.
import { api, attempt } from "./api.js";
import { initDatasets, refreshDataset } from "./datasets.js";
import { notify } from "./panels.js";
import { jobActive, ui } from "./state.js";

export function onStatus(s) {
  const first = ui.status === null;
  ui.status = s;
  if (first) {
    initDatasets(s);
    notify("init", s);
  }
  notify("onStatus", s);
  if (s.active_job) onJob(s.active_job);
  notify("onExportState");
  if (s.version !== ui.version) {
    ui.version = s.version;
    // A running job bumps the version on every progress step: refetch when it has finished.
    if (!jobActive(s.active_job)) refreshDataset();
  }
}

// Only the jobs of the dataset and format the page shows, and none it chose to ignore.
export function onJob(job) {
  if (!job || ui.ignoredJobs.has(job.job_id)) return;
  if (job.dataset !== ui.dataset || job.format !== ui.format) return;
  notify("onJob", job);
}

export async function refreshStatus() {
  const s = await attempt(() => api("GET", "/api/status"));
  if (s) onStatus(s);
}
