// The progress bars of EXPORT and UPLOAD: a <progress> and its text, by element id.
import { $, fmtBytes } from "./dom.js";

export function setBar(id, textId, done, total, bytes = false) {
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

export function setFinishedBar(id, textId, done, bytes = false) {
  const bar = $(id);
  bar.max = 1;
  bar.value = done === null || done === undefined ? 0 : 1;
  $(textId).textContent = done === null || done === undefined ? "" :
    (bytes ? fmtBytes(done) : String(done));
}

// An empty bar: no job yet.
export function clearBar(id, textId) {
  $(id).value = 0;
  $(id).max = 1;
  $(textId).textContent = "";
}

// A bar of a job that failed: it stops where the job stopped (an unknown total leaves it
// empty, never an endless indeterminate animation).
export function setStoppedBar(id, textId, done, total, bytes = false) {
  if (total === null || total === undefined) {
    clearBar(id, textId);
    if (done !== null && done !== undefined) $(textId).textContent = (bytes ? fmtBytes : String)(done);
  } else {
    setBar(id, textId, done, total, bytes);
  }
  $(textId).textContent += " (stopped)";
}
