#!/usr/bin/env node
// An ACP client for acp-gateway's integration tests, built on the official
// TypeScript SDK (@agentclientprotocol/sdk, pinned in package.json) and its
// WebSocket transport: it connects to the gateway's /api/v1/acp as an editor
// would, and a Rust test drives it.
//
// Launch: node --experimental-websocket tests/sdk-agents/acp-client.mjs WS_URL
// (run install.sh first; Node 20 needs the flag for its WebSocket).
//
// Commands, one JSON object per line on stdin:
//   {"id": N, "call": METHOD, "params": {...}}  a request to the gateway; its
//       answer is printed as {"id": N, "result": ...} or {"id": N, "error": {...}}
//   {"notify": METHOD, "params": {...}}         a notification to the gateway
//   {"answer": REQUEST_ID, "optionId": ID}      answers a permission request
//   {"close": true}                             closes the connection and exits
// What it receives, one JSON object per line on stdout:
//   {"event": "update", "params": ...}           a session/update
//   {"event": "permission", "requestId", "params"}  a session/request_permission
//   {"event": "cancelled", "requestId"}          the gateway withdrew that request
//   {"event": "closed"}                          the connection ended
// Logs go to stderr only.

import * as readline from "node:readline";
import * as acp from "@agentclientprotocol/sdk";
import { createWebSocketStream } from "@agentclientprotocol/sdk/experimental/ws-client";

const url = process.argv[2];
if (!url) {
  console.error("usage: acp-client.mjs WS_URL");
  process.exit(2);
}

const print = (value) => process.stdout.write(JSON.stringify(value) + "\n");
// Permission requests waiting for a command: request id -> resolve.
const waiting = new Map();

const app = acp
  .client()
  .onNotification(acp.methods.client.session.update, ({ params }) => {
    print({ event: "update", params });
  })
  .onRequest(acp.methods.client.session.requestPermission, ({ params, requestId, signal }) => {
    const key = JSON.stringify(requestId);
    return new Promise((resolve, reject) => {
      waiting.set(key, resolve);
      signal.addEventListener("abort", () => {
        if (waiting.delete(key)) {
          print({ event: "cancelled", requestId });
          reject(signal.reason ?? new Error("cancelled"));
        }
      });
      print({ event: "permission", requestId, params });
    });
  });

const connection = app.connect(createWebSocketStream(url));
connection.closed.then(() => {
  print({ event: "closed" });
  process.exit(0);
});

const lines = readline.createInterface({ input: process.stdin });
lines.on("line", async (line) => {
  if (!line.trim()) return;
  const command = JSON.parse(line);
  if (command.close) {
    connection.close();
    return;
  }
  if (command.answer !== undefined) {
    const key = JSON.stringify(command.answer);
    const resolve = waiting.get(key);
    waiting.delete(key);
    resolve?.({ outcome: { outcome: "selected", optionId: command.optionId } });
    return;
  }
  if (command.notify) {
    await connection.agent.notify(command.notify, command.params);
    return;
  }
  try {
    const result = await connection.agent.request(command.call, command.params);
    print({ id: command.id, result });
  } catch (e) {
    print({ id: command.id, error: { code: e.code, message: e.message, data: e.data } });
  }
});
lines.on("close", () => connection.close());
