// DOM helpers shared by every panel: element lookup and creation, list re-render guard, small
// text formatters, and the toast. Every node is built with createElement and textContent (the
// page never parses text as HTML).

export const $ = (id) => document.getElementById(id);

export function el(tag, attrs = {}, ...children) {
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
export function unchanged(node, value) {
  const key = JSON.stringify(value);
  if (node.renderedKey === key) return true;
  node.renderedKey = key;
  return false;
}

export function fillSelect(select, values, selected) {
  select.replaceChildren(...values.map((v) => el("option", { value: v, text: v })));
  if (selected !== null && selected !== undefined && values.includes(selected)) {
    select.value = selected;
  }
}

export function badge(quality) {
  const q = quality || "unknown";
  return el("span", { class: `badge ${q}`, text: q });
}

export function fmtBytes(n) {
  if (n === null || n === undefined) return "?";
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i += 1; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

export function plural(n, word) {
  return `${n} ${word}${n === 1 ? "" : "s"}`;
}

let toastTimer = null;
export function toast(message, kind = "info") {
  const box = $("toast");
  box.textContent = message;
  box.className = kind;
  box.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => { box.hidden = true; }, kind === "error" ? 12000 : 5000);
}
