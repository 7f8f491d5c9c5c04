// QUALITY CHECK's synchronised replay: one <video> per camera kept on the first camera's frame,
// the scrubber, frame stepping, and the plots' cursor. Each video reports the frame it shows in
// data-frame.
import { api, attempt, enc } from "../lib/api.js";
import { $, el, toast } from "../lib/dom.js";
import { buildPlots, drawCursors, redrawPlots } from "../lib/plots.js";
import { ui } from "../lib/state.js";

const replay = { generation: 0, fps: 30, length: 0, frame: 0, videos: [], master: null,
  playing: false, plots: [], trim: null };

export const replayFrame = () => replay.frame;
export const replayLength = () => replay.length;

// The kept frames [start, end) of the episode's trim (null: all) on the scrubber and the plots.
export function setReplayTrim(trim) {
  replay.trim = trim || null;
  const range = $("trim-range");
  range.hidden = !replay.trim || !replay.length;
  if (!range.hidden) {
    range.style.left = `${(100 * replay.trim[0]) / replay.length}%`;
    range.style.width = `${(100 * (replay.trim[1] - replay.trim[0])) / replay.length}%`;
  }
  range.dataset.start = replay.trim ? String(replay.trim[0]) : "";
  range.dataset.end = replay.trim ? String(replay.trim[1]) : "";
  drawCursors(replay.plots, replay.length, replay.frame, replay.trim);
}

export function clearReplay() {
  pauseReplay();
  replay.generation += 1;
  for (const v of replay.videos) { v.removeAttribute("src"); v.load(); }
  replay.videos = [];
  replay.master = null;
  replay.length = 0;
  replay.plots = [];
  setReplayTrim(null);
  $("videos").replaceChildren();
  $("plots").replaceChildren();
  $("issues").replaceChildren();
  $("episode-title").textContent = "select an episode";
  $("episode-verdict").replaceChildren();
  $("note").value = "";
  $("scrubber").max = "0";
  $("scrubber").value = "0";
  $("scrubber").dataset.frame = "0";
  $("frame-label").textContent = "frame – / –";
}

export async function loadReplay(ep) {
  const generation = ++replay.generation;
  pauseReplay();
  const name = ui.dataset;
  const base = `/api/datasets/${enc(name)}/episodes/${ep.episode_index}`;
  const series = await attempt(() => api("GET", `${base}/series`));
  if (!series || generation !== replay.generation) return;
  for (const v of replay.videos) { v.removeAttribute("src"); v.load(); }
  replay.fps = series.fps;
  replay.length = Math.max(1, series.length);
  replay.frame = 0;
  replay.videos = (ep.video_keys || []).map((key) => cameraVideo(key, `${base}/video/${enc(key)}`));
  replay.master = replay.videos[0] || null;
  $("videos").replaceChildren(...replay.videos.map((v) =>
    el("figure", { class: "camera" }, v, el("figcaption", { text: v.dataset.key }))));
  const scrubber = $("scrubber");
  scrubber.max = String(replay.length - 1);
  replay.plots = buildPlots($("plots"), series);
  setReplayTrim(ep.edit_trim);
  redrawReplayPlots();
  seekAll(0);
}

function cameraVideo(key, src) {
  const video = el("video", { muted: true, playsInline: true, preload: "auto",
    "data-key": key, "data-frame": "" });
  video.muted = true;
  video.src = src;
  video.addEventListener("ended", () => { if (video === replay.master) pauseReplay(); });
  video.addEventListener("error", () =>
    toast(`video ${key}: ${video.error ? video.error.message || video.error.code : "error"}`,
      "error"));
  watchFrames(video);
  return video;
}

// Each video reports the frame it shows (data-frame) from the presented frame's media time.
function watchFrames(video) {
  if (!video.requestVideoFrameCallback) {
    const update = () => { video.dataset.frame = String(frameAt(video.currentTime)); };
    video.addEventListener("seeked", update);
    video.addEventListener("timeupdate", update);
    return;
  }
  const onFrame = (now, meta) => {
    if (!replay.videos.includes(video)) return;
    const frame = Math.round(meta.mediaTime * replay.fps);
    video.dataset.frame = String(frame);
    if (video === replay.master && replay.playing) onMasterFrame(frame);
    video.requestVideoFrameCallback(onFrame);
  };
  video.requestVideoFrameCallback(onFrame);
}

function frameAt(seconds) {
  return Math.min(replay.length - 1, Math.max(0, Math.floor(seconds * replay.fps + 1e-6)));
}

function showCursor(frame) {
  const scrubber = $("scrubber");
  scrubber.value = String(frame);
  scrubber.dataset.frame = String(frame);
  $("frame-label").textContent = `frame ${frame} / ${replay.length - 1}`;
  drawCursors(replay.plots, replay.length, replay.frame, replay.trim);
}

function onMasterFrame(frame) {
  replay.frame = frame;
  showCursor(frame);
  const master = replay.master;
  const tolerance = 0.5 / replay.fps;
  for (const v of replay.videos) {
    if (v !== master && !v.seeking && Math.abs(v.currentTime - master.currentTime) > tolerance) {
      v.currentTime = master.currentTime;
    }
    if (v !== master && v.paused && !master.paused) v.play().catch(() => {});
  }
}

// Frame-exact positioning: the middle of the frame's display interval.
export function seekAll(frame) {
  if (!replay.videos.length && !replay.plots.length) return;
  frame = Math.min(replay.length - 1, Math.max(0, Math.round(frame)));
  replay.frame = frame;
  for (const v of replay.videos) v.currentTime = (frame + 0.5) / replay.fps;
  showCursor(frame);
}

export function pauseReplay() {
  const wasPlaying = replay.playing;
  replay.playing = false;
  $("play").textContent = "▶ play";
  for (const v of replay.videos) v.pause();
  if (wasPlaying && replay.master) seekAll(frameAt(replay.master.currentTime));
}

export function togglePlay() {
  if (!replay.master) return;
  if (replay.playing) {
    pauseReplay();
    return;
  }
  if (replay.frame >= replay.length - 1) seekAll(0);
  replay.playing = true;
  $("play").textContent = "❚❚ pause";
  for (const v of replay.videos) {
    v.play().catch((e) => {
      if (replay.playing) toast(`play: ${e.message}`, "error");
    });
  }
}

export function step(delta) {
  if (!replay.master) return;
  const from = replay.playing ? frameAt(replay.master.currentTime) : replay.frame;
  replay.playing = false;
  $("play").textContent = "▶ play";
  for (const v of replay.videos) v.pause();
  seekAll(from + delta);
}

export function redrawReplayPlots() {
  redrawPlots(replay.plots, replay.length, replay.frame, replay.trim);
}

// The transport row's buttons and scrubber.
export function setupReplay() {
  $("play").addEventListener("click", togglePlay);
  $("step-back").addEventListener("click", () => step(-1));
  $("step-forward").addEventListener("click", () => step(1));
  $("scrubber").addEventListener("input", () => {
    pauseReplay();
    seekAll(Number($("scrubber").value));
  });
}
