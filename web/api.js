// The gateway's REST API, with the token this browser signed in with.

const TOKEN_KEY = "acp-gateway.token";

export const token = {
  get: () => localStorage.getItem(TOKEN_KEY),
  set: (value) => localStorage.setItem(TOKEN_KEY, value),
  clear: () => localStorage.removeItem(TOKEN_KEY),
};

/** A failed call: its status and the problem details the gateway sent. */
export class ApiError extends Error {
  constructor(status, problem) {
    super(problem?.detail || problem?.title || `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
    this.code = problem?.code ?? null;
  }
}

/** Called when the gateway says the caller is not (or no longer) signed in. */
let onUnauthorized = () => {};
export function whenUnauthorized(handler) {
  onUnauthorized = handler;
}

export async function api(method, path, body, { signIn = false } = {}) {
  const headers = { Accept: "application/json" };
  const bearer = token.get();
  if (bearer) headers.Authorization = `Bearer ${bearer}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch {
    throw new ApiError(0, { detail: "The gateway cannot be reached. Check the connection." });
  }
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = { detail: text };
  }
  if (!response.ok) {
    const error = new ApiError(response.status, data);
    if (response.status === 401 && !signIn) onUnauthorized(error);
    throw error;
  }
  return data;
}

/** A WebSocket URL on this origin, and the subprotocols that carry the token. */
export function socket(path) {
  const url = new URL(path, location.href);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  const bearer = token.get();
  return new WebSocket(url, bearer ? [`bearer.${bearer}`] : []);
}
