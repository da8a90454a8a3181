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
// session/cancel cancels any running turn of that session.
//
// With ACP_TEST_AGENT_STATE=<dir> in its environment it also advertises
// loadSession: every session's history (the user's prompts and the agent's
// chunks, as session/update objects) is kept in <dir>/<sessionId>.json, and
// session/load replays it as session/update notifications before answering,
// as the protocol asks. A session it has no file for is "not found".

import { Readable, Writable } from "node:stream";
import { randomUUID } from "node:crypto";
import * as path from "node:path";
import * as fs from "node:fs";
import * as acp from "@agentclientprotocol/sdk";

const AGENT_NAME = "acp-gateway-sdk-node-agent";

const log = (...args) => console.error(`[${AGENT_NAME}]`, ...args);

/** sessionId -> { cwd, turn: { cancelled: boolean, wake: () => void } | null } */
const sessions = new Map();

/** Where session histories are kept (loadSession), or null. */
const STATE_DIR = process.env.ACP_TEST_AGENT_STATE || null;

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

const app = acp
  .agent({ name: AGENT_NAME })
  .onRequest(acp.methods.agent.initialize, ({ params }) => {
    log("initialize, client protocolVersion", params.protocolVersion);
    return {
      protocolVersion: acp.PROTOCOL_VERSION,
      agentCapabilities: {
        loadSession: STATE_DIR !== null,
        promptCapabilities: { image: false, audio: false, embeddedContext: false },
      },
      authMethods: [],
      agentInfo: { name: AGENT_NAME, version: "0.1.0" },
    };
  })
  .onRequest(acp.methods.agent.session.new, ({ params }) => {
    const sessionId = `sess_${randomUUID()}`;
    sessions.set(sessionId, { cwd: params.cwd, turn: null });
    if (STATE_DIR) fs.writeFileSync(historyFile(sessionId), "[]");
    log("session/new", sessionId, "cwd", params.cwd);
    return { sessionId };
  })
  .onRequest(acp.methods.agent.session.load, async ({ params, client }) => {
    const { sessionId } = params;
    const history = STATE_DIR ? readHistory(sessionId) : null;
    if (!history) throw acp.RequestError.resourceNotFound(sessionId);
    log("session/load", sessionId, "replaying", history.length, "updates");
    for (const update of history) {
      await client.notify(acp.methods.client.session.update, { sessionId, update });
    }
    sessions.set(sessionId, { cwd: params.cwd, turn: null });
    return {};
  })
  .onRequest(acp.methods.agent.session.prompt, async ({ params, client }) => {
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
      remember(sessionId, {
        sessionUpdate: "user_message_chunk",
        content: { type: "text", text },
      });
      const firstWord = text.trim().split(/\s+/)[0] ?? "";
      log("session/prompt", sessionId, "mode", JSON.stringify(firstWord));
      let stopReason;
      if (firstWord === "tool") stopReason = await toolTurn(client, session, sessionId, turn);
      else if (firstWord === "hang") stopReason = await hangTurn(client, sessionId, turn);
      else stopReason = await echoTurn(client, sessionId, text, turn);
      log("turn done", sessionId, stopReason);
      return { stopReason };
    } finally {
      session.turn = null;
    }
  })
  .onNotification(acp.methods.agent.session.cancel, ({ params }) => {
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
