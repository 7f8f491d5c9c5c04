// eva operator console: COLLECT, QUALITY CHECK, EXPORT, UPLOAD ACCEPTED.
// Plain ES modules, no dependencies and no build step: index.html loads this file as a module.
// lib/ holds the shared parts (API client, event stream, state, panel registry, DOM helpers,
// plots); panels/ one module per panel, each an object of hooks (see lib/panels.js). Live state
// comes from the event stream (/api/events); the only timer is COLLECT's ~4 Hz preview.
import { setupDatasets } from "./lib/datasets.js";
import { connectEvents } from "./lib/events.js";
import {
  notify, notifyAsync, panelNames, registerPanels, setupPanels, showPanel,
} from "./lib/panels.js";
import { onJob, onStatus, refreshStatus } from "./lib/status.js";
import { collectPanel } from "./panels/collect.js";
import { exportPanel } from "./panels/export.js";
import { qualityPanel } from "./panels/quality.js";
import { uploadPanel } from "./panels/upload.js";

// In tab order: the keys 1-4 and index.html's tabs follow it.
registerPanels([collectPanel, qualityPanel, exportPanel, uploadPanel]);

async function main() {
  setupPanels();
  setupDatasets();
  notify("setup");
  await notifyAsync("load");
  await refreshStatus();
  const wanted = location.hash.slice(1);
  showPanel(panelNames().includes(wanted) ? wanted : "collect");
  connectEvents({ onStatus, onJob });
}

main();
