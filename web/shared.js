// The read-only page of a shared conversation (/s/<token>): its history and
// live events, as a share link shows them, with no token and no controls.
// The link's token is the page's address; it goes only to this gateway's
// /api/v1/shared/<token> routes.

import { h, fill } from "./dom.js";
import { markdown } from "./markdown.js";
import { contentText, promptContent, toolCallBody, showPlan, showToolCall, unifiedDiff, decisionText } from "./render.js";
import { answerText } from "./question.js";
import { Live, connection } from "./live.js";

const main = document.getElementById("main");
const liveIndicator = document.getElementById("live");
const token = decodeURIComponent(location.pathname.replace(/^\/s\//, "").split("/")[0] ?? "");
const base = `/api/v1/shared/${encodeURIComponent(token)}`;

/** The page once the link no longer works (or never did). */
function ended(text) {
  live?.stop();
  liveIndicator.textContent = "";
  fill(
    main,
    h("div.head", {}, h("h1", {}, "This link does not work")),
    h("p.error", { role: "alert", id: "ended" }, text),
  );
}

const ENDED = "The link is unknown, expired or revoked. Ask whoever shared it for a new one.";

/** The timeline: what the conversation view shows, without anything to press. */
class Timeline {
  constructor(conversation) {
    this.el = h("div.timeline", { id: "timeline", "aria-label": "Conversation" });
    this.status = h("span.status", { id: "status" });
    this.toolCalls = new Map();
    this.cards = new Map();
    this.terminals = new Map();
    this.open = null;
    this.plan = null;
    const expires = new Date(conversation.link_expires_at);
    fill(
      main,
      h(
        "div.head",
        {},
        h("h1", { id: "title" }, conversation.title || "Untitled"),
        h(
          "p.meta",
          {},
          this.status,
          " ",
          h("span.agent", {}, conversation.agent),
          " · ",
          h("span", { id: "expires" }, `Link works until ${expires.toLocaleString()}`),
        ),
      ),
      this.el,
    );
    document.title = `${conversation.title || "Shared conversation"} · acp-gateway`;
    this.showStatus(conversation.status);
  }

  showStatus(status) {
    this.status.className = `status ${status}`;
    this.status.textContent = String(status).replace("_", " ");
  }

  add(el) {
    const following = window.innerHeight + window.scrollY >= document.body.scrollHeight - 120;
    this.el.append(el);
    if (following) window.scrollTo(0, document.body.scrollHeight);
    return el;
  }

  message(kind, turn) {
    if (this.open && this.open.kind === kind && this.open.turn === turn) return this.open;
    const label = { agent: "Agent", thought: "Thought", user: "Prompt" }[kind];
    const el = h(kind === "user" ? "div.text" : "div.text.md");
    this.add(h(`section.message.${kind}`, {}, h("p.who", {}, label), el));
    this.open = { kind, turn, el, raw: "" };
    return this.open;
  }

  event(event) {
    const data = event.data ?? {};
    if (event.type !== "session_update") this.open = null;
    switch (event.type) {
      case "turn_started":
        this.showStatus("running");
        fill(this.message("user", data.turn_id).el, promptContent(data.content));
        this.open = null;
        break;
      case "session_update":
        this.update(data.turn_id, data.update ?? {});
        break;
      case "permission_requested":
      case "permission_resolved":
      case "question_asked":
      case "question_resolved":
        this.waiting(event.type, data);
        break;
      case "turn_ended": {
        this.showStatus("idle");
        const why = data.stop_reason === "end_turn" ? "Done" : `Ended: ${data.stop_reason}`;
        this.add(h("p.turn-end", {}, data.error ? `${why} — ${data.error}` : why));
        break;
      }
      case "agent_status":
        this.add(h("p.note", {}, `Agent ${data.status}`));
        break;
      case "file_written":
        this.add(h("section.card.file", { "aria-label": `Wrote ${data.path}` }, h("h2", {}, `Wrote ${data.path}`), unifiedDiff(data.diff ?? "")));
        break;
      case "terminal_output":
        this.terminal(data);
        break;
      default:
        break;
    }
  }

  update(turn, update) {
    const kind = update.sessionUpdate;
    if (kind === "agent_message_chunk" || kind === "agent_thought_chunk" || kind === "user_message_chunk") {
      const who = kind === "agent_message_chunk" ? "agent" : kind === "user_message_chunk" ? "user" : "thought";
      const open = this.message(who, turn);
      const text = contentText([update.content]);
      if (who === "user") {
        open.el.append(text);
      } else {
        open.raw += text;
        fill(open.el, markdown(open.raw));
      }
      return;
    }
    this.open = null;
    const add = (el) => this.add(el);
    if (kind === "tool_call" || kind === "tool_call_update") showToolCall(this.toolCalls, update, add);
    else if (kind === "plan") this.plan = showPlan(this.plan, update.entries, turn, add);
  }

  /** A permission request or a question, and later how it was answered: no buttons. */
  waiting(type, data) {
    const question = type.startsWith("question");
    const title = question ? data.message ?? "The agent asks a question" : data.tool_call?.title ?? "The agent asks permission";
    const outcome = data.status === "pending" ? "Waiting for an answer" : question ? answerText(data) : decisionText(data);
    this.showStatus(data.status === "pending" ? "awaiting_permission" : "running");
    const card = this.cards.get(data.id) ?? this.add(h("article.card.permission", { "aria-label": question ? "Question" : "Permission" }));
    fill(card, h("h2", {}, title), question ? null : toolCallBody({ ...(data.tool_call ?? {}), status: undefined }), h("p.decision", {}, outcome));
    this.cards.set(data.id, card);
  }

  terminal(data) {
    let terminal = this.terminals.get(data.terminal_id);
    if (!terminal) {
      const output = h("pre.output");
      const title = data.command ? `$ ${data.command.join(" ")}` : "Terminal";
      this.add(h("section.card.terminal", { "aria-label": "Terminal" }, h("h2", {}, title), output));
      terminal = { output };
      this.terminals.set(data.terminal_id, terminal);
    }
    terminal.output.append(data.output ?? "");
  }
}

let live = null;

async function start() {
  const response = await fetch(base, { headers: { Accept: "application/json" } }).catch(() => null);
  if (!response) return ended("The gateway cannot be reached. Check the connection and reload.");
  if (!response.ok) {
    return ended(response.status === 429 ? "Too many tries from this address: wait a minute and reload." : ENDED);
  }
  const timeline = new Timeline(await response.json());
  connection.listeners.add((up) => {
    liveIndicator.textContent = up ? "Live" : "Reconnecting…";
  });
  live = new Live({
    path: (after) => `${base}/ws?after=${after}`,
    onFrame: (event) => timeline.event(event),
    resumable: true,
    // No token goes with it: the link is all it needs.
    connect: (path) => {
      const url = new URL(path, location.href);
      url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
      return new WebSocket(url);
    },
    // Revoked or expired: the gateway closes with 1008.
    onDenied: () => ended(ENDED),
    // A browser does not say why an upgrade failed: ask.
    onRefused: async () => {
      const response = await fetch(base, { headers: { Accept: "application/json" } }).catch(() => null);
      if (response?.status === 404) ended(ENDED);
    },
  });
}

start();
