// The dataset that QUALITY CHECK, EXPORT and UPLOAD show: its selectors, and its episodes and
// exports, fetched again (coalesced) whenever the server's version moves.
import { api, attempt, enc } from "./api.js";
import { fillSelect } from "./dom.js";
import { notify } from "./panels.js";
import { ui } from "./state.js";

// The first status: every dataset selector gets the datasets, on the recording's or the first.
export function initDatasets(s) {
  const names = s.datasets.map((d) => d.name);
  const initial = s.dataset || names[0] || null;
  for (const select of document.querySelectorAll(".dataset-choice")) fillSelect(select, names, initial);
  ui.dataset = initial;
}

export function setupDatasets() {
  for (const select of document.querySelectorAll(".dataset-choice")) {
    select.addEventListener("change", () => setDataset(select.value));
  }
}

export function setDataset(name) {
  for (const select of document.querySelectorAll(".dataset-choice")) select.value = name;
  if (name === ui.dataset) return;
  ui.dataset = name;
  ui.episodes = null;
  ui.exports = null;
  ui.selected = null;
  ui.exportJob = null;
  ui.uploadJob = null;
  notify("onDataset");
  notify("onExportState");
  refreshDataset();
}

let refreshing = null;
let refreshAgain = false;
export function refreshDataset() {
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

// GET /api/datasets/{name}/{what} of the shown dataset; null when refused (the toast says
// why) or when another dataset was chosen meanwhile.
async function fetchShown(what) {
  const name = ui.dataset;
  if (!name) return null;
  const data = await attempt(() => api("GET", `/api/datasets/${enc(name)}/${what}`));
  return data && name === ui.dataset ? data : null;
}

async function loadEpisodes() {
  const data = await fetchShown("episodes");
  if (!data) return;
  ui.episodes = data;
  notify("onEpisodes");
}

async function loadExports() {
  const data = await fetchShown("exports");
  if (!data) return;
  ui.exports = data;
  notify("onExportState");
}
