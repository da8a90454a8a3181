// A client as a web team would write it: types generated from
// openapi/openapi.yaml (openapi-typescript), requests through openapi-fetch,
// live events over a WebSocket. Compiled with `tsc` (strict), then run
// against a live gateway by scripts/contract:
//
//   GATEWAY_URL=http://127.0.0.1:8080 GATEWAY_TOKEN=acpgw_… node dist/client.js
//
// It starts a conversation with the demo agent, prompts, answers the
// permission request the agent makes, changes the session mode, reads the
// events back, and adds and removes a notification target. Any unexpected
// answer fails it (exit code 1).

import createClient from "openapi-fetch";
import WebSocket from "ws";

import type { components, paths } from "./generated/api.js";

type Event = components["schemas"]["Event"];

const base = process.env.GATEWAY_URL;
const token = process.env.GATEWAY_TOKEN;
if (!base || !token) {
  throw new Error("set GATEWAY_URL and GATEWAY_TOKEN");
}
const auth = { Authorization: `Bearer ${token}` };
const api = createClient<paths>({ baseUrl: base, headers: auth });

/** How long any one wait may take. */
const WAIT_MS = 20_000;

function check(condition: unknown, what: string): asserts condition {
  if (!condition) {
    throw new Error(`unexpected: ${what}`);
  }
}

/** A conversation's events, live, one JSON frame each. */
class Events {
  private frames: Event[] = [];
  private waiting: (() => void) | null = null;
  private readonly socket: WebSocket;

  constructor(conversationId: string) {
    const url = `${base!.replace(/^http/, "ws")}/api/v1/conversations/${conversationId}/ws?after=0`;
    this.socket = new WebSocket(url, { headers: auth });
    this.socket.on("message", (data) => {
      this.frames.push(JSON.parse(data.toString()) as Event);
      this.waiting?.();
    });
  }

  /** Reads until an event of `type`; rejects after WAIT_MS. */
  async until<T extends Event["type"]>(type: T): Promise<Extract<Event, { type: T }>> {
    const deadline = Date.now() + WAIT_MS;
    for (;;) {
      const index = this.frames.findIndex((e) => e.type === type);
      if (index >= 0) {
        const [found] = this.frames.splice(0, index + 1).slice(-1);
        return found as Extract<Event, { type: T }>;
      }
      const left = deadline - Date.now();
      check(left > 0, `no ${type} event within ${WAIT_MS} ms`);
      await new Promise<void>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`no ${type} event in time`)), left);
        this.waiting = () => {
          clearTimeout(timer);
          resolve();
        };
      });
    }
  }

  close() {
    this.socket.close();
  }
}

const agents = await api.GET("/api/v1/agents");
check(agents.data?.items.some((a) => a.name === "demo" && a.available), "the demo agent is available");

const created = await api.POST("/api/v1/conversations", {
  body: { agent: "demo", title: "From TypeScript" },
});
check(created.response.status === 201 && created.data, `create: ${JSON.stringify(created.error)}`);
const conversation = created.data;
check(conversation.modes?.currentModeId === "default", "the demo agent reports its mode");
const id = conversation.id;
const events = new Events(id);

const prompted = await api.POST("/api/v1/conversations/{id}/prompts", {
  params: { path: { id } },
  body: { text: "tool" },
});
check(
  prompted.response.status === 202 && prompted.data,
  `prompt: ${prompted.response.status} ${JSON.stringify(prompted.error)}`,
);

const requested = await events.until("permission_requested");
check(requested.data.status === "pending", "a pending request");
const allow = requested.data.options.find((o) => (o as { kind?: string }).kind === "allow_once") as
  | { optionId: string }
  | undefined;
check(allow, "an allow_once option");
const answered = await api.POST("/api/v1/permissions/{id}/respond", {
  params: { path: { id: requested.data.id } },
  body: { option_id: allow.optionId },
});
check(answered.data?.status === "approved", `answer: ${JSON.stringify(answered.error)}`);
const ended = await events.until("turn_ended");
check(ended.data.stop_reason === "end_turn", `turn ended ${ended.data.stop_reason}`);

const moded = await api.POST("/api/v1/conversations/{id}/mode", {
  params: { path: { id } },
  body: { mode_id: "plan" },
});
check(moded.data?.modes?.currentModeId === "plan", "mode changed");
const changed = await events.until("mode_changed");
check(changed.data.mode_id === "plan", "mode_changed event");

const refused = await api.POST("/api/v1/conversations/{id}/mode", {
  params: { path: { id } },
  body: { mode_id: "no-such-mode" },
});
check(refused.response.status === 409 && refused.error?.code === "not_offered", "409 not_offered problem");
const malformed = await api.POST("/api/v1/conversations/{id}/mode", {
  params: { path: { id } },
  body: { mode_id: "" },
});
check(malformed.response.status === 422 && malformed.error?.code === "invalid_request", "422 problem");

const log = await api.GET("/api/v1/conversations/{id}/events", {
  params: { path: { id }, query: { after: 0, limit: 1000 } },
});
const types = new Set(log.data?.items.map((e) => e.type));
for (const type of ["turn_started", "permission_requested", "permission_resolved", "turn_ended", "mode_changed"]) {
  check(types.has(type as Event["type"]), `the log has ${type}`);
}
events.close();

const closed = await api.DELETE("/api/v1/conversations/{id}", { params: { path: { id } } });
check(closed.response.status === 204, "closed");
// A notification target (made once the conversation is closed, so nothing
// is due to it): the body is the object of its kind, and a member of another
// kind does not compile.
const target = await api.POST("/api/v1/notification-targets", {
  body: { kind: "webhook", url: "https://93.184.216.34/hook", label: "From TypeScript", events: ["turn_ended"] },
});
check(target.response.status === 201 && target.data?.secret, `target: ${JSON.stringify(target.error)}`);
// @ts-expect-error: `url` is no member of an fcm target.
const mixed: components["schemas"]["NewNotificationTarget"] = { kind: "fcm", device_token: "x", url: "" };
void mixed;
const removed = await api.DELETE("/api/v1/notification-targets/{id}", {
  params: { path: { id: target.data.id } },
});
check(removed.response.status === 204, "target removed");

console.log(`ts-client: ok (${log.data?.items.length} events, conversation ${id})`);
