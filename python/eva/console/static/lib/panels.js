// The panel registry: tabs, the panel shown, the keyboard, and the hooks through which shared
// code tells every panel what changed (so no panel imports the modules that call it).
//
// A panel is an object with a ``name`` (its <section> id and data-panel of its tab) and any of:
//   setup()          wire the panel's DOM listeners, once at page start
//   load()           async, before the first status (e.g. the export formats)
//   init(status)     the first status arrived
//   onStatus(status) every status event
//   onJob(job)       a job of the current dataset and format (see app.js)
//   onDataset()      the selected dataset changed; its episodes and exports are cleared
//   onEpisodes()     the dataset's episodes were (re)loaded into ui.episodes
//   onExportState()  ui.exports, the format or an export/upload job changed: redraw
//   show() / hide()  this panel became visible / another one did (hide runs on every switch)
//   onKey(event)     a key while this panel shows and no field has focus; true when handled
import { ui } from "./state.js";

const registered = [];

export function registerPanels(panels) {
  registered.push(...panels);
}

export function panelNames() {
  return registered.map((p) => p.name);
}

// Call ``hook`` on every panel that has it, in tab order.
export function notify(hook, ...args) {
  for (const panel of registered) {
    if (panel[hook]) panel[hook](...args);
  }
}

export async function notifyAsync(hook) {
  for (const panel of registered) {
    if (panel[hook]) await panel[hook]();
  }
}

export function showPanel(name) {
  if (!panelNames().includes(name)) return;
  ui.panel = name;
  for (const section of document.querySelectorAll(".panel")) {
    section.classList.toggle("active", section.id === name);
  }
  for (const tab of document.querySelectorAll("#tabs button")) {
    tab.classList.toggle("active", tab.dataset.panel === name);
  }
  if (history.replaceState) history.replaceState(null, "", `#${name}`);
  for (const panel of registered) {
    if (panel.name === name) {
      if (panel.show) panel.show();
    } else if (panel.hide) {
      panel.hide();
    }
  }
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
    // a field's own keys (Enter in the note) are its own listeners'
    if (e.key === "Escape") target.blur();
    return;
  }
  const key = e.key;
  const names = panelNames();
  let handled = true;
  if (/^[1-9]$/.test(key) && Number(key) <= names.length) showPanel(names[Number(key) - 1]);
  else {
    const panel = registered.find((p) => p.name === ui.panel);
    handled = Boolean(panel && panel.onKey && panel.onKey(e));
  }
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

export function setupPanels() {
  for (const tab of document.querySelectorAll("#tabs button")) {
    tab.addEventListener("click", () => showPanel(tab.dataset.panel));
  }
  document.addEventListener("keydown", onKey);
  document.addEventListener("keyup", onKeyUp);
}
