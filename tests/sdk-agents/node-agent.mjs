#!/usr/bin/env node
// Test agent for acp-gateway integration tests, built on the official
// TypeScript SDK (@agentclientprotocol/sdk, pinned in package.json).
//
// Launch: node tests/sdk-agents/node-agent.mjs   (any cwd; run install.sh first)
//
// Speaks ACP v1 (JSON-RPC 2.0, one message per line) on stdin/stdout; logs go
// to stderr only. Behaviour of session/prompt depends on the first word of the
// prompt's text:
//   tool  -> tool_call update, session/request_permission, then
//            tool_call_update completed (allow) / failed (reject or cancelled),
//            stopReason end_turn, or cancelled if the permission was cancelled
//            or session/cancel arrived
//   hang  -> one agent_message_chunk, then waits for session/cancel,
//            stopReason cancelled
//   other -> agent_message_chunk updates "You " + "said: " + "<text>",
//            stopReason end_turn
//   settings -> one agent_message_chunk "mode=<mode> model=<model> brave=<bool>"
//            (the session's mode and configuration options as it holds them)
//   usage -> a usage_update and a session_info_update (title "Usage report"),
//            then echoes
//   cost <a>[:<currency>] <b>… -> for each figure a usage_update with the
//            session's cost so far {amount: <a>, currency: <currency> (USD
//            when not given)}, used growing by 100 a report, size 200000,
//            each followed by an agent_message_chunk "cost <a> "; stopReason
//            end_turn (cancelled once session/cancel arrived)
//   capabilities -> one agent_message_chunk: the clientCapabilities the
//            gateway sent in initialize, as JSON
//   work  -> a thought, a plan, an edit tool call with a diff that asks
//            permission (options "Allow once", "Always allow", "Reject"),
//            its update (completed or failed), then the message "Done."
//   gated <n> -> n chunks "a1 " .. "a<n> ", then a permission request for
//            the command `echo go` (the same options), then n chunks "b1 " ..
//            "b<n> ", stopReason end_turn (the chunks come whatever the answer)
//   calls <json> -> <json> is an array of [method, params]; each is sent to
//            the gateway in turn with client.request(method, {sessionId,
//            ...params}) (fs/*, terminal/*), a "$terminal" string in params
//            standing for the terminalId the last terminal/create answered;
//            one agent_message_chunk per call: a JSON line {"method", "result"}
//            or {"method", "error": {"code", "message"}}
//   question <json> -> elicitation/create with {sessionId, ...<json>} (a
//            form or URL question); one agent_message_chunk: the answer as
//            JSON ({"action", "content"?}, or {"error": {"code", "message"}});
//            with "complete": true in <json>, for a URL question, it also
//            sends elicitation/complete {elicitationId} right after asking
//            (the interaction done elsewhere); stopReason end_turn, or
//            cancelled if session/cancel arrived
//   probe <json> -> <json> is an array of steps the agent does itself (not
//            through the gateway): ["read", path], ["write", path, text],
//            ["list", dir], ["run", program, ...args] (its stdout),
//            ["connect", host, port], ["env", name], ["shim", socket] (connects
//            to a shim's socket as an intruder would: asks for its output from
//            0 and sends a line for its agent; the value is the kinds of the
//            frames the shim sent, until it closed or sent output, and how
//            the connection failed if it did, "error ECONNRESET"); one
//            agent_message_chunk
//            per step: a JSON line {"step", "ok": true, "value"} or
//            {"step", "ok": false, "code"} (EACCES, ENOENT, ...)
// session/cancel cancels any running turn of that session.
//
// Every session offers the modes "ask" (current), "plan" and "broken" (which
// session/set_mode refuses), and the configuration options "model" (select:
// fast, deep, refused; "refused" is refused) and "brave" (boolean). A mode
// change is reported back with current_mode_update. Right after session/new
// it sends available_commands_update.
//
// With ACP_TEST_AGENT_STATE=<dir> in its environment it also advertises
// loadSession: every session's history (the user's prompts and the agent's
// chunks, as session/update objects) is kept in <dir>/<sessionId>.json, and
// session/load replays it as session/update notifications before answering,
// as the protocol asks. A session it has no file for is "not found". Every
// request and notification it receives is appended to <dir>/calls.jsonl
// ({"method", "params"}), so tests can see what the gateway sent.
//
// More, from the environment:
//   ACP_TEST_AGENT_RESUME=1  advertises sessionCapabilities.resume (needs STATE)
//   ACP_TEST_AGENT_NO_LOAD=1 does not advertise loadSession (with STATE: an
//                            agent that only resumes)
//   ACP_TEST_AGENT_CLOSE=1   advertises sessionCapabilities.close
//   ACP_TEST_AGENT_IMAGES=1  advertises promptCapabilities image and embeddedContext
//   ACP_TEST_AGENT_AUTH=<id> offers the auth methods "api-key" and "browser";
//                            session/new, load and resume answer auth_required
//                            until authenticate with <id> succeeded
//   ACP_TEST_AGENT_FORK=1    advertises sessionCapabilities.fork (needs STATE):
//                            session/fork copies the session's history and
//                            settings to a new session "fork_<uuid>"
//   ACP_TEST_AGENT_LIST=1    advertises sessionCapabilities.list (needs STATE):
//                            session/list pages through the sessions kept in
//                            STATE (each with cwd, title: its first prompt,
//                            updatedAt), newest first, filtered by cwd;
//                            ACP_TEST_AGENT_LIST_PAGE=<n> sessions a page
//                            (default 50), the cursor an offset
//   ACP_TEST_AGENT_PIDS=1    appends its pid to STATE/pids when it starts
//                            (tests check that every agent started ended)
// ACP_TEST_AGENT_STATE=home keeps the state in $HOME/.node-agent-state: each
// gateway user's home for the profile, so each user's sessions apart.

import { Readable, Writable } from "node:stream";
import { randomUUID } from "node:crypto";
import * as path from "node:path";
import * as fs from "node:fs";
import * as acp from "@agentclientprotocol/sdk";
import { z } from "zod";

const AGENT_NAME = "acp-gateway-sdk-node-agent";

const log = (...args) => console.error(`[${AGENT_NAME}]`, ...args);

/**
 * sessionId -> { cwd, turn: { cancelled: boolean, wake: () => void } | null,
 *                settings: { mode, model, brave } }
 */
const sessions = new Map();

/** Where session histories are kept (loadSession), or null. */
const STATE_DIR = (() => {
  const dir = process.env.ACP_TEST_AGENT_STATE || null;
  if (dir !== "home") return dir;
  const inHome = path.join(process.env.HOME, ".node-agent-state");
  fs.mkdirSync(inHome, { recursive: true });
  return inHome;
})();
if (STATE_DIR && process.env.ACP_TEST_AGENT_PIDS === "1") {
  fs.appendFileSync(path.join(STATE_DIR, "pids"), `${process.pid}\n`);
}
const FORK = process.env.ACP_TEST_AGENT_FORK === "1";
const LIST = process.env.ACP_TEST_AGENT_LIST === "1";
const LIST_PAGE = Number.parseInt(process.env.ACP_TEST_AGENT_LIST_PAGE ?? "50", 10);
const RESUME = process.env.ACP_TEST_AGENT_RESUME === "1";
const NO_LOAD = process.env.ACP_TEST_AGENT_NO_LOAD === "1";
const CLOSE = process.env.ACP_TEST_AGENT_CLOSE === "1";
const AUTH = process.env.ACP_TEST_AGENT_AUTH || null;
const IMAGES = process.env.ACP_TEST_AGENT_IMAGES === "1";
let authenticated = false;
/** What the gateway offered in initialize. */
let clientCapabilities = null;

/** Records a call the gateway made (only with STATE_DIR). */
function record(method, params) {
  if (!STATE_DIR) return;
  fs.appendFileSync(path.join(STATE_DIR, "calls.jsonl"), JSON.stringify({ method, params }) + "\n");
}

function requireAuth() {
  if (AUTH && !authenticated) throw acp.RequestError.authRequired();
}

const MODES = [
  { id: "ask", name: "Ask", description: "Asks before it edits" },
  { id: "plan", name: "Plan", description: "Plans only" },
  { id: "broken", name: "Broken", description: "Refused by session/set_mode" },
];

function defaultSettings() {
  return { mode: "ask", model: "fast", brave: false };
}

function modeState(settings) {
  return { currentModeId: settings.mode, availableModes: MODES };
}

function configOptions(settings) {
  return [
    {
      id: "model",
      name: "Model",
      category: "model",
      type: "select",
      currentValue: settings.model,
      options: [
        { value: "fast", name: "Fast" },
        { value: "deep", name: "Deep" },
        { value: "refused", name: "Refused by session/set_config_option" },
      ],
    },
    { id: "brave", name: "Brave", type: "boolean", currentValue: settings.brave },
  ];
}

function settingsFile(sessionId) {
  return historyFile(sessionId).replace(/\.json$/, ".settings.json");
}

/** The session's settings, as kept across restarts (with STATE_DIR). */
function savedSettings(sessionId) {
  try {
    return JSON.parse(fs.readFileSync(settingsFile(sessionId), "utf8"));
  } catch {
    return defaultSettings();
  }
}

function saveSettings(sessionId, settings) {
  if (STATE_DIR) fs.writeFileSync(settingsFile(sessionId), JSON.stringify(settings));
}

function liveSession(sessionId) {
  const session = sessions.get(sessionId);
  if (!session) throw acp.RequestError.sessionNotFound(sessionId);
  return session;
}

function historyFile(sessionId) {
  return path.join(STATE_DIR, `${sessionId.replace(/[^A-Za-z0-9_-]/g, "_")}.json`);
}

function readHistory(sessionId) {
  try {
    return JSON.parse(fs.readFileSync(historyFile(sessionId), "utf8"));
  } catch {
    return null;
  }
}

function metaFile(sessionId) {
  return historyFile(sessionId).replace(/\.json$/, ".meta.json");
}

/** What session/list says of a session: { sessionId, cwd, title, updatedAt }. */
function readMeta(sessionId) {
  try {
    return JSON.parse(fs.readFileSync(metaFile(sessionId), "utf8"));
  } catch {
    return null;
  }
}

/** Records the session for session/list (only with STATE_DIR). */
function touchMeta(sessionId, cwd, title) {
  if (!STATE_DIR) return;
  const meta = readMeta(sessionId) ?? { sessionId, cwd, title: null };
  if (cwd) meta.cwd = cwd;
  if (!meta.title && title) meta.title = title;
  meta.updatedAt = new Date().toISOString();
  fs.writeFileSync(metaFile(sessionId), JSON.stringify(meta));
}

/** Every session kept, newest first. */
function keptSessions() {
  return fs
    .readdirSync(STATE_DIR)
    .filter((f) => f.endsWith(".meta.json"))
    .map((f) => JSON.parse(fs.readFileSync(path.join(STATE_DIR, f), "utf8")))
    .sort((a, b) => (b.updatedAt ?? "").localeCompare(a.updatedAt ?? "") || a.sessionId.localeCompare(b.sessionId));
}

/** Remembers an update of the session's history (only with STATE_DIR). */
function remember(sessionId, update) {
  if (!STATE_DIR) return;
  const history = readHistory(sessionId) ?? [];
  history.push(update);
  fs.writeFileSync(historyFile(sessionId), JSON.stringify(history));
}

function promptText(prompt) {
  return prompt
    .filter((block) => block.type === "text")
    .map((block) => block.text)
    .join("");
}

function chunk(sessionId, text) {
  return {
    sessionId,
    update: {
      sessionUpdate: "agent_message_chunk",
      content: { type: "text", text },
    },
  };
}

async function echoTurn(client, sessionId, text, turn) {
  for (const piece of ["You ", "said: ", text]) {
    if (turn.cancelled) return "cancelled";
    if (piece === "") continue;
    const message = chunk(sessionId, piece);
    remember(sessionId, message.update);
    await client.notify(acp.methods.client.session.update, message);
  }
  return turn.cancelled ? "cancelled" : "end_turn";
}

async function hangTurn(client, sessionId, turn) {
  await client.notify(
    acp.methods.client.session.update,
    chunk(sessionId, "Hanging until session/cancel."),
  );
  // No timer: a pending promise does not keep node alive, so EOF on stdin
  // still lets the process exit.
  await new Promise((resolve) => {
    if (turn.cancelled) resolve();
    else turn.wake = resolve;
  });
  return "cancelled";
}

/** The `calls` scenario: requests to the gateway, one after the other. */
async function callsTurn(client, sessionId, json) {
  let terminal = null;
  const substitute = (value) =>
    JSON.parse(JSON.stringify(value), (_, v) => (v === "$terminal" ? terminal : v));
  for (const [method, params] of JSON.parse(json)) {
    let line;
    try {
      const result = await client.request(method, { sessionId, ...substitute(params ?? {}) });
      if (method === "terminal/create") terminal = result.terminalId;
      line = { method, result: result ?? null };
    } catch (e) {
      line = { method, error: { code: e.code ?? null, message: e.message ?? String(e) } };
    }
    await client.notify(
      acp.methods.client.session.update,
      chunk(sessionId, JSON.stringify(line) + "\n"),
    );
  }
  return "end_turn";
}

/** One `probe` step, done by the agent's own process. */
async function probeStep([what, ...args]) {
  switch (what) {
    case "read":
      return fs.readFileSync(args[0], "utf8");
    case "write":
      fs.writeFileSync(args[0], args[1]);
      return null;
    case "list":
      return fs.readdirSync(args[0]);
    case "run": {
      const { execFileSync } = await import("node:child_process");
      return execFileSync(args[0], args.slice(1), { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
    }
    case "connect": {
      const net = await import("node:net");
      return await new Promise((resolve, reject) => {
        const socket = net.connect({ host: args[0], port: args[1] }, () => {
          socket.end();
          resolve("connected");
        });
        socket.on("error", reject);
      });
    }
    case "env":
      return process.env[args[0]] ?? null;
    case "shim": {
      const net = await import("node:net");
      const frame = (kind, body) => {
        const head = Buffer.alloc(5);
        head.writeUInt32BE(body.length + 1, 0);
        head[4] = kind;
        return Buffer.concat([head, body]);
      };
      const attach = Buffer.alloc(8); // ATTACH from 0
      const input = Buffer.alloc(8); // INPUT at 0
      const line = Buffer.from('{"jsonrpc":"2.0","method":"session/cancel","params":{}}\n');
      return await new Promise((resolve, reject) => {
        const kinds = [];
        let pending = Buffer.alloc(0);
        const socket = net.connect({ path: args[0] });
        socket.on("data", (data) => {
          pending = Buffer.concat([pending, data]);
          while (pending.length >= 5 && pending.length >= 4 + pending.readUInt32BE(0)) {
            const kind = { 1: "hello", 2: "output", 3: "stderr", 4: "exit", 5: "refused" }[pending[4]] ?? pending[4];
            kinds.push(kind);
            pending = pending.subarray(4 + pending.readUInt32BE(0));
            // As a gateway would, once greeted.
            if (kind === "hello") {
              socket.write(frame(10, attach));
              socket.write(frame(11, Buffer.concat([input, line])));
            }
          }
          if (kinds.includes("output")) socket.destroy();
        });
        socket.on("close", () => resolve(kinds));
        // Closed on it with what it sent still unread: what came is told.
        socket.on("error", (e) => kinds.push(`error ${e.code}`));
      });
    }
    default:
      throw Object.assign(new Error(`unknown probe step ${what}`), { code: "EINVAL" });
  }
}

/** The `question` scenario: the agent asks a person (ACP elicitation). */
async function questionTurn(client, sessionId, json, turn) {
  const { complete, ...params } = JSON.parse(json);
  const asked = client.request(acp.methods.client.elicitation.create, { sessionId, ...params });
  if (complete) {
    await client.notify(acp.methods.client.elicitation.complete, {
      elicitationId: params.elicitationId,
    });
  }
  let said;
  try {
    said = await asked;
  } catch (e) {
    said = { error: { code: e.code, message: e.message } };
  }
  log("elicitation answer:", JSON.stringify(said));
  await client.notify(acp.methods.client.session.update, chunk(sessionId, JSON.stringify(said)));
  return turn.cancelled ? "cancelled" : "end_turn";
}

/** The `probe` scenario: what the agent itself can reach. */
async function probeTurn(client, sessionId, json) {
  for (const step of JSON.parse(json)) {
    let line;
    try {
      line = { step, ok: true, value: await probeStep(step) };
    } catch (e) {
      // A program that failed: its exit status and what it said.
      const code = e.code ?? (e.status != null ? `exit ${e.status}` : String(e));
      line = { step, ok: false, code, stderr: e.stderr ? String(e.stderr) : undefined };
    }
    await client.notify(
      acp.methods.client.session.update,
      chunk(sessionId, JSON.stringify(line) + "\n"),
    );
  }
  return "end_turn";
}

async function toolTurn(client, session, sessionId, turn) {
  const target = path.join(session.cwd, "hello.txt");
  const toolCall = {
    toolCallId: "call_1",
    title: "Write hello.txt",
    kind: "edit",
    status: "pending",
    locations: [{ path: target }],
    rawInput: { path: target, content: "hello" },
  };
  await client.notify(acp.methods.client.session.update, {
    sessionId,
    update: { sessionUpdate: "tool_call", ...toolCall },
  });

  const response = await client.request(acp.methods.client.session.requestPermission, {
    sessionId,
    toolCall,
    options: [
      { optionId: "allow-once", name: "Allow once", kind: "allow_once" },
      { optionId: "allow-always", name: "Always allow", kind: "allow_always" },
      { optionId: "reject-once", name: "Reject", kind: "reject_once" },
    ],
  });
  log("permission response:", JSON.stringify(response));

  const outcome = response.outcome;
  const allowed =
    outcome.outcome === "selected" &&
    (outcome.optionId === "allow-once" || outcome.optionId === "allow-always");
  const cancelled = outcome.outcome === "cancelled" || turn.cancelled;
  const status = allowed && !cancelled ? "completed" : "failed";
  await client.notify(acp.methods.client.session.update, {
    sessionId,
    update: { sessionUpdate: "tool_call_update", toolCallId: "call_1", status },
  });
  return cancelled ? "cancelled" : "end_turn";
}

const OPTIONS = [
  { optionId: "allow-once", name: "Allow once", kind: "allow_once" },
  { optionId: "allow-always", name: "Always allow", kind: "allow_always" },
  { optionId: "reject-once", name: "Reject", kind: "reject_once" },
];

async function update(client, sessionId, update) {
  remember(sessionId, update);
  await client.notify(acp.methods.client.session.update, { sessionId, update });
}

/** The `work` scenario: what a phone shows of an agent at work. */
async function workTurn(client, session, sessionId, turn) {
  const target = path.join(session.cwd, "src", "main.rs");
  await update(client, sessionId, {
    sessionUpdate: "agent_thought_chunk",
    content: { type: "text", text: "The greeting should name the world." },
  });
  await update(client, sessionId, {
    sessionUpdate: "plan",
    entries: [
      { content: "Read src/main.rs", priority: "high", status: "completed" },
      { content: "Change the greeting", priority: "high", status: "in_progress" },
      { content: "Run the tests", priority: "medium", status: "pending" },
    ],
  });
  const toolCall = {
    toolCallId: "call_edit",
    title: "Edit src/main.rs",
    kind: "edit",
    status: "pending",
    locations: [{ path: target, line: 2 }],
    content: [
      {
        type: "diff",
        path: target,
        oldText: 'fn main() {\n    println!("hello");\n}\n',
        newText: 'fn main() {\n    println!("hello, world");\n}\n',
      },
    ],
  };
  await update(client, sessionId, { sessionUpdate: "tool_call", ...toolCall });
  const response = await client.request(acp.methods.client.session.requestPermission, {
    sessionId,
    toolCall,
    options: OPTIONS,
  });
  const outcome = response.outcome;
  const allowed = outcome.outcome === "selected" && outcome.optionId.startsWith("allow");
  const cancelled = outcome.outcome === "cancelled" || turn.cancelled;
  await update(client, sessionId, {
    sessionUpdate: "tool_call_update",
    toolCallId: "call_edit",
    status: allowed && !cancelled ? "completed" : "failed",
  });
  if (cancelled) return "cancelled";
  await update(client, sessionId, chunk(sessionId, allowed ? "Done." : "Left as it was.").update);
  return "end_turn";
}

/** The `gated` scenario: a stream, a question, and more stream. */
async function gatedTurn(client, sessionId, n, turn) {
  for (let i = 1; i <= n; i++) await update(client, sessionId, chunk(sessionId, `a${i} `).update);
  const toolCall = {
    toolCallId: "call_gate",
    title: "Run echo go",
    kind: "execute",
    status: "pending",
    rawInput: { command: ["echo", "go"] },
  };
  await update(client, sessionId, { sessionUpdate: "tool_call", ...toolCall });
  const response = await client.request(acp.methods.client.session.requestPermission, {
    sessionId,
    toolCall,
    options: OPTIONS,
  });
  if (response.outcome.outcome === "cancelled" || turn.cancelled) return "cancelled";
  await update(client, sessionId, {
    sessionUpdate: "tool_call_update",
    toolCallId: "call_gate",
    status: "completed",
  });
  for (let i = 1; i <= n; i++) await update(client, sessionId, chunk(sessionId, `b${i} `).update);
  return "end_turn";
}

const app = acp
  .agent({ name: AGENT_NAME })
  .onRequest(acp.methods.agent.initialize, ({ params }) => {
    record("initialize", params);
    clientCapabilities = params.clientCapabilities ?? null;
    log("initialize, client protocolVersion", params.protocolVersion);
    const sessionCapabilities = {};
    if (RESUME && STATE_DIR) sessionCapabilities.resume = {};
    if (FORK && STATE_DIR) sessionCapabilities.fork = {};
    if (LIST && STATE_DIR) sessionCapabilities.list = {};
    if (CLOSE) sessionCapabilities.close = {};
    return {
      protocolVersion: acp.PROTOCOL_VERSION,
      agentCapabilities: {
        loadSession: STATE_DIR !== null && !NO_LOAD,
        promptCapabilities: { image: IMAGES, audio: false, embeddedContext: IMAGES },
        sessionCapabilities,
      },
      authMethods: AUTH
        ? [
            { id: "api-key", name: "API key" },
            { id: "browser", name: "Browser login" },
          ]
        : [],
      agentInfo: { name: AGENT_NAME, version: "0.1.0" },
    };
  })
  .onRequest(acp.methods.agent.authenticate, ({ params }) => {
    record("authenticate", params);
    if (params.methodId !== AUTH) {
      throw acp.RequestError.invalidParams({ methodId: params.methodId }, "that method fails here");
    }
    authenticated = true;
    return {};
  })
  .onRequest(acp.methods.agent.session.new, ({ params, client }) => {
    record("session/new", params);
    requireAuth();
    const sessionId = `sess_${randomUUID()}`;
    const settings = defaultSettings();
    sessions.set(sessionId, { cwd: params.cwd, turn: null, settings });
    if (STATE_DIR) fs.writeFileSync(historyFile(sessionId), "[]");
    touchMeta(sessionId, params.cwd, null);
    log("session/new", sessionId, "cwd", params.cwd);
    // As real agents do: the commands follow the answer.
    setImmediate(() =>
      client.notify(acp.methods.client.session.update, {
        sessionId,
        update: {
          sessionUpdate: "available_commands_update",
          availableCommands: [
            { name: "init", description: "Write an AGENTS.md" },
            { name: "review", description: "Review a change", input: { hint: "what to review" } },
          ],
        },
      }),
    );
    return { sessionId, modes: modeState(settings), configOptions: configOptions(settings) };
  })
  .onRequest(acp.methods.agent.session.load, async ({ params, client }) => {
    record("session/load", params);
    requireAuth();
    const { sessionId } = params;
    const history = STATE_DIR ? readHistory(sessionId) : null;
    if (!history) throw acp.RequestError.resourceNotFound(sessionId);
    log("session/load", sessionId, "replaying", history.length, "updates");
    for (const update of history) {
      await client.notify(acp.methods.client.session.update, { sessionId, update });
    }
    const settings = savedSettings(sessionId);
    sessions.set(sessionId, { cwd: params.cwd, turn: null, settings });
    return { modes: modeState(settings), configOptions: configOptions(settings) };
  })
  .onRequest(acp.methods.agent.session.resume, ({ params }) => {
    record("session/resume", params);
    requireAuth();
    const { sessionId } = params;
    if (!(STATE_DIR && readHistory(sessionId))) throw acp.RequestError.resourceNotFound(sessionId);
    const settings = savedSettings(sessionId);
    sessions.set(sessionId, { cwd: params.cwd, turn: null, settings });
    log("session/resume", sessionId);
    return { modes: modeState(settings), configOptions: configOptions(settings) };
  })
  // Unstable in the SDK: its stable builder needs the params' parser.
  .onRequest("session/fork", z.looseObject({ sessionId: z.string(), cwd: z.string() }), ({ params }) => {
    record("session/fork", params);
    requireAuth();
    const history = STATE_DIR ? readHistory(params.sessionId) : null;
    if (!FORK || !history) throw acp.RequestError.resourceNotFound(params.sessionId);
    const sessionId = `fork_${randomUUID()}`;
    const settings = savedSettings(params.sessionId);
    fs.writeFileSync(historyFile(sessionId), JSON.stringify(history));
    saveSettings(sessionId, settings);
    const title = readMeta(params.sessionId)?.title;
    touchMeta(sessionId, params.cwd, title ? `${title} (forked)` : null);
    sessions.set(sessionId, { cwd: params.cwd, turn: null, settings });
    log("session/fork", params.sessionId, "->", sessionId);
    return { sessionId, modes: modeState(settings), configOptions: configOptions(settings) };
  })
  .onRequest(acp.methods.agent.session.list, ({ params }) => {
    record("session/list", params);
    requireAuth();
    if (!LIST || !STATE_DIR) throw acp.RequestError.methodNotFound("session/list");
    const all = keptSessions().filter((s) => !params.cwd || s.cwd === params.cwd);
    const from = params.cursor ? Number.parseInt(params.cursor, 10) : 0;
    if (!Number.isInteger(from) || from < 0) {
      throw acp.RequestError.invalidParams({ cursor: params.cursor }, "no such cursor");
    }
    const page = all.slice(from, from + LIST_PAGE);
    const next = from + LIST_PAGE < all.length ? String(from + LIST_PAGE) : undefined;
    return { sessions: page, ...(next ? { nextCursor: next } : {}) };
  })
  .onRequest(acp.methods.agent.session.close, ({ params }) => {
    record("session/close", params);
    const session = liveSession(params.sessionId);
    if (session.turn) {
      session.turn.cancelled = true;
      session.turn.wake?.();
    }
    sessions.delete(params.sessionId);
    return {};
  })
  .onRequest(acp.methods.agent.session.setMode, async ({ params, client }) => {
    record("session/set_mode", params);
    const session = liveSession(params.sessionId);
    if (!MODES.some((m) => m.id === params.modeId) || params.modeId === "broken") {
      throw acp.RequestError.invalidParams({ modeId: params.modeId }, "this mode cannot be entered");
    }
    session.settings.mode = params.modeId;
    saveSettings(params.sessionId, session.settings);
    await client.notify(acp.methods.client.session.update, {
      sessionId: params.sessionId,
      update: { sessionUpdate: "current_mode_update", currentModeId: params.modeId },
    });
    return {};
  })
  .onRequest(acp.methods.agent.session.setConfigOption, ({ params }) => {
    record("session/set_config_option", params);
    const session = liveSession(params.sessionId);
    if (params.configId === "model" && ["fast", "deep"].includes(params.value)) {
      session.settings.model = params.value;
    } else if (params.configId === "brave" && typeof params.value === "boolean") {
      session.settings.brave = params.value;
    } else {
      throw acp.RequestError.invalidParams(
        { configId: params.configId, value: params.value },
        "this value cannot be set",
      );
    }
    saveSettings(params.sessionId, session.settings);
    return { configOptions: configOptions(session.settings) };
  })
  .onRequest(acp.methods.agent.session.prompt, async ({ params, client }) => {
    record("session/prompt", params);
    const { sessionId } = params;
    const session = sessions.get(sessionId);
    if (!session) throw acp.RequestError.sessionNotFound(sessionId);
    if (session.turn) {
      throw acp.RequestError.invalidRequest(
        { sessionId },
        "a prompt turn is already running in this session",
      );
    }
    const turn = { cancelled: false, wake: null };
    session.turn = turn;
    try {
      const text = promptText(params.prompt);
      touchMeta(sessionId, null, text.slice(0, 80));
      remember(sessionId, {
        sessionUpdate: "user_message_chunk",
        content: { type: "text", text },
      });
      const firstWord = text.trim().split(/\s+/)[0] ?? "";
      log("session/prompt", sessionId, "mode", JSON.stringify(firstWord));
      let stopReason;
      if (firstWord === "tool") stopReason = await toolTurn(client, session, sessionId, turn);
      else if (firstWord === "hang") stopReason = await hangTurn(client, sessionId, turn);
      else if (firstWord === "work") stopReason = await workTurn(client, session, sessionId, turn);
      else if (firstWord === "gated") {
        const n = Number.parseInt(text.trim().split(/\s+/)[1] ?? "10", 10);
        stopReason = await gatedTurn(client, sessionId, n, turn);
      } else if (firstWord === "calls") {
        stopReason = await callsTurn(client, sessionId, text.trim().slice("calls".length));
      } else if (firstWord === "question") {
        stopReason = await questionTurn(client, sessionId, text.trim().slice("question".length), turn);
      } else if (firstWord === "probe") {
        stopReason = await probeTurn(client, sessionId, text.trim().slice("probe".length));
      } else if (firstWord === "capabilities") {
        await client.notify(
          acp.methods.client.session.update,
          chunk(sessionId, JSON.stringify(clientCapabilities)),
        );
        stopReason = "end_turn";
      }
      else if (firstWord === "settings") {
        const { mode, model, brave } = session.settings;
        await client.notify(
          acp.methods.client.session.update,
          chunk(sessionId, `mode=${mode} model=${model} brave=${brave}`),
        );
        stopReason = "end_turn";
      } else if (firstWord === "cost") {
        let used = 0;
        stopReason = "end_turn";
        for (const figure of text.trim().split(/\s+/).slice(1)) {
          if (turn.cancelled) break;
          const [amount, currency = "USD"] = figure.split(":");
          used += 100;
          const update = {
            sessionUpdate: "usage_update",
            used,
            size: 200000,
            cost: { amount: Number(amount), currency },
          };
          await client.notify(acp.methods.client.session.update, { sessionId, update });
          await client.notify(
            acp.methods.client.session.update,
            chunk(sessionId, `cost ${figure} `),
          );
        }
        if (turn.cancelled) stopReason = "cancelled";
      } else if (firstWord === "usage") {
        for (const update of [
          {
            sessionUpdate: "usage_update",
            used: 1234,
            size: 200000,
            cost: { amount: 0.12, currency: "USD" },
          },
          { sessionUpdate: "session_info_update", title: "Usage report" },
        ]) {
          await client.notify(acp.methods.client.session.update, { sessionId, update });
        }
        stopReason = await echoTurn(client, sessionId, text, turn);
      }
      else stopReason = await echoTurn(client, sessionId, text, turn);
      log("turn done", sessionId, stopReason);
      return { stopReason };
    } finally {
      session.turn = null;
    }
  })
  .onNotification(acp.methods.agent.session.cancel, ({ params }) => {
    record("session/cancel", params);
    const turn = sessions.get(params.sessionId)?.turn;
    log("session/cancel", params.sessionId, turn ? "(turn running)" : "(no turn)");
    if (!turn) return;
    turn.cancelled = true;
    turn.wake?.();
  });

const stream = acp.ndJsonStream(Writable.toWeb(process.stdout), Readable.toWeb(process.stdin));
const connection = app.connect(stream);
connection.closed.then(() => {
  log("connection closed (stdin EOF or stream error); exiting");
  process.exit(0);
});
