// Time-series plots on canvas: one canvas per vector feature, one line per dimension. The lines
// are drawn once into an offscreen canvas; the frame cursor is drawn over a copy of it.
import { el } from "./dom.js";

const PALETTE = ["#4e9cff", "#ff9f43", "#2ed573", "#ff4d6d", "#c56cf0", "#f6e05e", "#22d3ee",
  "#a3e635", "#fb7185", "#94a3b8"];
const PAD = { left: 44, right: 8, top: 8, bottom: 16 };

// One plot per feature of ``series`` (GET .../episodes/{i}/series) into ``container``.
export function buildPlots(container, series) {
  container.replaceChildren();
  const plots = [];
  for (const [key, s] of Object.entries(series.series)) {
    const canvas = el("canvas", { class: "plot", height: 120, "data-key": key });
    const legend = el("div", { class: "legend" }, ...s.names.map((name, i) =>
      el("span", { style: `color:${PALETTE[i % PALETTE.length]}`, text: name })));
    container.append(el("div", { class: "plot-box" }, el("div", { class: "plot-title", text: key }),
      canvas, legend));
    plots.push({ canvas, series: s, frames: series.frame_index, base: null });
  }
  return plots;
}

function xOf(plot, frame, length) {
  const w = plot.canvas.width - PAD.left - PAD.right;
  return PAD.left + (length > 1 ? (frame / (length - 1)) * w : 0);
}

// Fit each plot to its box's width and draw its lines again (an episode of ``length`` frames;
// ``trim``: the kept frames [start, end), or null).
export function redrawPlots(plots, length, frame, trim = null) {
  for (const plot of plots) {
    const width = Math.max(200, plot.canvas.parentElement.clientWidth || 600);
    plot.canvas.width = width;
    plot.base = renderPlotBase(plot, length);
  }
  drawCursors(plots, length, frame, trim);
}

function valueRange(series) {
  let lo = Infinity;
  let hi = -Infinity;
  for (const dim of series.values) {
    for (const v of dim) {
      if (v === null) continue;
      if (v < lo) lo = v;
      if (v > hi) hi = v;
    }
  }
  if (!Number.isFinite(lo)) { lo = -1; hi = 1; }
  if (hi - lo < 1e-9) { lo -= 1; hi += 1; }
  return [lo, hi];
}

function renderPlotBase(plot, length) {
  const { canvas, series, frames } = plot;
  const base = document.createElement("canvas");
  base.width = canvas.width;
  base.height = canvas.height;
  const ctx = base.getContext("2d");
  const [lo, hi] = valueRange(series);
  const h = base.height - PAD.top - PAD.bottom;
  const yOf = (v) => PAD.top + (1 - (v - lo) / (hi - lo)) * h;
  ctx.fillStyle = "#11151c";
  ctx.fillRect(0, 0, base.width, base.height);
  ctx.strokeStyle = "#2a3140";
  ctx.fillStyle = "#8b95a7";
  ctx.font = "10px sans-serif";
  ctx.lineWidth = 1;
  for (const v of [lo, (lo + hi) / 2, hi]) {
    const y = Math.round(yOf(v)) + 0.5;
    ctx.beginPath();
    ctx.moveTo(PAD.left, y);
    ctx.lineTo(base.width - PAD.right, y);
    ctx.stroke();
    const label = Math.abs(v) < (hi - lo) * 1e-3 ? "0" : String(Number(v.toPrecision(3)));
    ctx.fillText(label, 2, y + 3);
  }
  ctx.fillText("0", PAD.left, base.height - 3);
  const last = String(length - 1);
  ctx.fillText(last, base.width - PAD.right - ctx.measureText(last).width, base.height - 3);
  ctx.lineWidth = 1.5;
  series.values.forEach((dim, i) => {
    ctx.strokeStyle = PALETTE[i % PALETTE.length];
    ctx.beginPath();
    let pen = false;
    dim.forEach((v, j) => {
      if (v === null) { pen = false; return; }
      const x = xOf(plot, frames[j], length);
      const y = yOf(v);
      if (pen) ctx.lineTo(x, y); else ctx.moveTo(x, y);
      pen = true;
    });
    ctx.stroke();
  });
  return base;
}

// The frame cursor over each plot, and the frames a trim leaves out shaded.
export function drawCursors(plots, length, frame, trim = null) {
  for (const plot of plots) {
    if (!plot.base) continue;
    const ctx = plot.canvas.getContext("2d");
    ctx.drawImage(plot.base, 0, 0);
    if (trim) shadeTrimmed(plot, ctx, length, trim);
    const x = Math.round(xOf(plot, frame, length)) + 0.5;
    ctx.strokeStyle = "#ffffff";
    ctx.lineWidth = 1;
    ctx.beginPath();
    ctx.moveTo(x, PAD.top);
    ctx.lineTo(x, plot.canvas.height - PAD.bottom);
    ctx.stroke();
  }
}

function shadeTrimmed(plot, ctx, length, [start, end]) {
  const top = PAD.top;
  const height = plot.canvas.height - PAD.top - PAD.bottom;
  const half = length > 1 ? (plot.canvas.width - PAD.left - PAD.right) / (length - 1) / 2 : 0;
  const from = xOf(plot, start, length) - half;
  const to = xOf(plot, end - 1, length) + half;
  ctx.fillStyle = "rgba(0, 0, 0, 0.6)";
  if (from > PAD.left) ctx.fillRect(PAD.left, top, from - PAD.left, height);
  const right = plot.canvas.width - PAD.right;
  if (to < right) ctx.fillRect(to, top, right - to, height);
}
