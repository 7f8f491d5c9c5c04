// The console's HTTP API client. Every JSON shape is defined by python/eva/console/session.py;
// the routes are listed in docs/console.md.
import { toast } from "./dom.js";

export const enc = encodeURIComponent;

export class ApiError extends Error {
  constructor(status, error) {
    super(error.message);
    this.status = status;
    this.code = error.code;
    this.field = error.field;
  }
}

// Same-origin fetch: the HttpOnly cookie goes along, and the browser adds Origin to writes.
export async function api(method, path, body) {
  const init = { method, headers: {} };
  if (body !== undefined) {
    init.headers["content-type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (e) {
    throw new ApiError(0, { code: "network", message: `${method} ${path}: ${e.message}` });
  }
  const text = await response.text();
  let data = null;
  if (text) {
    try { data = JSON.parse(text); } catch { data = null; }
  }
  if (!response.ok) {
    const error = (data && data.error) || { code: String(response.status), message: text };
    if (response.status === 401) {
      error.message = "not signed in: open the URL with ?token=... that `eva console` printed";
    }
    throw new ApiError(response.status, error);
  }
  return data;
}

// Run an action; an API refusal is shown in the toast (and returned as null).
export async function attempt(fn) {
  try {
    return await fn();
  } catch (e) {
    toast(e.message || String(e), "error");
    return null;
  }
}
