// The page's shared state: what every panel reads. Each field is written by the module named
// beside it; panels redraw from it when lib/panels.js notifies them.

export const ui = {
  panel: "collect", // lib/panels.js: the panel shown
  status: null, // app.js: the last status event (GET /api/status)
  version: null, // app.js: status.version when the dataset was last fetched
  dataset: null, // lib/datasets.js: the dataset of QUALITY CHECK / EXPORT / UPLOAD
  episodes: null, // lib/datasets.js: GET /api/datasets/{name}/episodes
  exports: null, // lib/datasets.js: GET /api/datasets/{name}/exports
  formats: {}, // panels/export.js: GET /api/formats
  format: null, // panels/export.js
  ignoredJobs: new Set(), // jobs that existed when the format selector changed
  exportJob: null,
  uploadJob: null,
  selected: null, // panels/quality.js: episode index under review
};

export function jobActive(job) {
  return Boolean(job) && (job.state === "queued" || job.state === "running");
}

// The latest export of a format (an entry of GET .../exports) when it completed: the one EXPORT
// shows and UPLOAD offers (the server's gate then says whether it may go: stale, review, marker).
export function currentExport(entry) {
  return Boolean(entry) && entry.state === "completed";
}
