// Follow a conversation live and answer its permission requests, the way a
// phone does. Node.js 20 and the `ws` package; GATEWAY_URL and GATEWAY_TOKEN
// in the environment. It starts a conversation with the demo agent, asks for
// something that needs a tool, approves the request from the inbox, then
// drops its socket and resumes with `after`: no event lost, none twice.
import WebSocket from "ws";

const base = process.env.GATEWAY_URL; // e.g. https://gateway.example.com
const headers = { Authorization: `Bearer ${process.env.GATEWAY_TOKEN}` };
const wsBase = base.replace(/^http/, "ws");

async function call(method, path, body) {
  const response = await fetch(base + path, {
    method,
    headers: { ...headers, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const answer = response.status === 204 ? null : await response.json();
  if (!response.ok) throw new Error(`${method} ${path}: ${answer.code}: ${answer.detail}`);
  return answer;
}

// The permission inbox: a snapshot of what waits, then every event live.
function inbox(onRequest) {
  const socket = new WebSocket(`${wsBase}/api/v1/ws`, { headers });
  socket.on("message", (data) => {
    const frame = JSON.parse(data);
    if (frame.type === "snapshot") frame.pending_permissions.forEach(onRequest);
    if (frame.type === "permission_requested") onRequest(frame.data);
  });
  return socket;
}

// One conversation's events from `after` on; resolves with the socket once open.
function follow(id, after, onEvent) {
  const socket = new WebSocket(`${wsBase}/api/v1/conversations/${id}/ws?after=${after}`, {
    headers,
  });
  socket.on("message", (data) => onEvent(JSON.parse(data)));
  socket.on("close", (code) => {
    // 4008: too slow; 1001: the gateway restarts. Either way, come back with `after`.
    if (code === 4008 || code === 1001) console.log(`closed ${code}: reconnect with after`);
  });
  return new Promise((resolve) => socket.on("open", () => resolve(socket)));
}

/** Resolves once `predicate` holds, polled on every event; fails after 20 s. */
function until(predicate) {
  if (predicate()) return Promise.resolve();
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("timed out")), 20_000);
    waiters.push(() => predicate() && (clearTimeout(timer), resolve(), true));
  });
}
let waiters = [];
const notify = () => (waiters = waiters.filter((check) => !check()));

// Every request the agent makes is approved with its allow_once option.
const approver = inbox(async (request) => {
  const allow = request.options.find((o) => o.kind === "allow_once");
  await call("POST", `/api/v1/permissions/${request.id}/respond`, { option_id: allow.optionId });
  console.log(`approved: ${request.tool_call.title}`);
});
await new Promise((resolve) => approver.on("open", resolve));

const conversation = await call("POST", "/api/v1/conversations", { agent: "demo" });
let lastSeq = 0;
const seen = [];
const onEvent = (event) => {
  if (event.seq !== lastSeq + 1) throw new Error(`seq ${event.seq} after ${lastSeq}`);
  lastSeq = event.seq;
  seen.push(event.type);
  notify();
};

let socket = await follow(conversation.id, lastSeq, onEvent);
await call("POST", `/api/v1/conversations/${conversation.id}/prompts`, { text: "tool" });
await until(() => seen.includes("turn_ended"));

// Away for a while (a phone asleep); the next turn runs meanwhile.
socket.close();
const ended = seen.filter((type) => type === "turn_ended").length;
await call("POST", `/api/v1/conversations/${conversation.id}/prompts`, { text: "hello" });
socket = await follow(conversation.id, lastSeq, onEvent); // everything after lastSeq, once
await until(() => seen.filter((type) => type === "turn_ended").length > ended);

console.log(`events 1..${lastSeq}, in order, none twice: ${seen.join(" ")}`);
socket.close();
approver.close();
