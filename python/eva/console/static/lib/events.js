// The live event stream (/api/events, server-sent events): "status" and "job" events, and the
// connection pill in the header.
import { $ } from "./dom.js";

export function connectEvents({ onStatus, onJob }) {
  const source = new EventSource("/api/events");
  const connection = $("connection");
  source.addEventListener("open", () => {
    connection.textContent = "live";
    connection.className = "pill good";
  });
  source.addEventListener("error", () => {
    connection.textContent = source.readyState === EventSource.CLOSED ? "offline" : "reconnecting";
    connection.className = "pill bad";
  });
  source.addEventListener("status", (e) => onStatus(JSON.parse(e.data)));
  source.addEventListener("job", (e) => onJob(JSON.parse(e.data)));
}
