// acp-gateway's built-in web client: the inbox (permission requests and
// the agents' questions), conversations,
// a conversation's live view. Plain modules, no build; everything it shows
// comes from the API described in openapi/openapi.yaml.

import { api, ApiError, token, whenUnauthorized } from "./api.js";
import { h, fill, when } from "./dom.js";
import { Live, connection } from "./live.js";
import { ChangesView, CHANGE_EVENTS, changesText } from "./changes.js";
import { markdown } from "./markdown.js";
import { MembersPanel, person, sharedBadge } from "./members.js";
import { SettingsView, serviceWorker } from "./notify.js";
import { questionCard, settleQuestion } from "./question.js";
import { UsageView, spendText } from "./usage.js";
import { SharePanel } from "./sharing.js";
import {
  contentText,
  promptContent,
  decisionText,
  permissionCard,
  showPlan,
  showToolCall,
  unifiedDiff,
} from "./render.js";

const main = document.getElementById("main");
const liveIndicator = document.getElementById("live");
const inboxCount = document.getElementById("inbox-count");
const signOut = document.getElementById("sign-out");

/** What the current view runs (its sockets), stopped when the view changes. */
let current = { stop() {} };

/** The inbox socket lives as long as the page, for the count in the bar. */
let inbox = null;

connection.listeners.add((up) => {
  liveIndicator.textContent = up ? "" : "Reconnecting…";
  liveIndicator.classList.toggle("down", !up);
});

whenUnauthorized(() => {
  if (location.hash !== "#/sign-in") {
    sessionStorage.setItem("acp-gateway.return", location.hash);
    location.hash = "#/sign-in";
  }
});

signOut.addEventListener("click", () => {
  token.clear();
  inbox?.stop();
  inbox = null;
  location.hash = "#/sign-in";
});

function route() {
  current.stop();
  current = { stop() {} };
  const hash = location.hash || "#/";
  signOut.hidden = !token.get();
  for (const link of document.querySelectorAll("[data-nav]")) {
    const here =
      (link.dataset.nav === "inbox" && hash === "#/") ||
      (link.dataset.nav === "conversations" && hash.startsWith("#/c")) ||
      (link.dataset.nav === "usage" && hash === "#/usage") ||
      (link.dataset.nav === "settings" && hash === "#/settings");
    if (here) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  if (hash === "#/sign-in") {
    inbox?.stop();
    inbox = null;
    return signInView();
  }
  inbox ??= new Inbox();
  const conversation = hash.match(/^#\/c\/([0-9a-f-]+)$/);
  const changes = hash.match(/^#\/c\/([0-9a-f-]+)\/changes$/);
  if (conversation) current = new ConversationView(conversation[1]);
  else if (changes) current = new ChangesView(main, changes[1], { problemText, onDenied: whenUnauthorizedNow });
  else if (hash === "#/conversations") current = new ConversationsView();
  else if (hash === "#/usage") current = new UsageView(main, { problemText });
  else if (hash === "#/settings") current = new SettingsView(main, problemText);
  else current = inbox.view();
  main.focus({ preventScroll: true });
}

/** A problem as words for a person. */
function problemText(error) {
  if (error instanceof ApiError) return error.message;
  return String(error?.message ?? error);
}

// ---------------------------------------------------------------- sign in

function signInView() {
  document.title = "Sign in · acp-gateway";
  const input = h("input", {
    id: "token",
    name: "token",
    type: "password",
    autocomplete: "current-password",
    required: true,
    spellcheck: "false",
  });
  const error = h("p.error", { role: "alert", hidden: true });
  const button = h("button.primary", { type: "submit" }, "Sign in");
  const form = h(
    "form.stack",
    {
      onsubmit: async (event) => {
        event.preventDefault();
        button.disabled = true;
        error.hidden = true;
        const previous = token.get();
        token.set(input.value.trim());
        try {
          await api("GET", "/api/v1/agents", undefined, { signIn: true });
          location.hash = sessionStorage.getItem("acp-gateway.return") || "#/";
          sessionStorage.removeItem("acp-gateway.return");
        } catch (e) {
          if (previous) token.set(previous);
          else token.clear();
          error.textContent =
            e instanceof ApiError && e.status === 401 ? "That token is not valid." : problemText(e);
          error.hidden = false;
        } finally {
          button.disabled = false;
        }
      },
    },
    h("h1", {}, "Sign in"),
    h("p", {}, "This gateway asks for a token. It stays in this browser until you sign out."),
    h("label", { for: "token" }, "Token"),
    input,
    error,
    button,
  );
  fill(main, form);
  input.focus();
}

// ------------------------------------------------------------------ inbox

/**
 * Every pending permission request and question the caller can see, live
 * over /api/v1/ws: the snapshot on each (re)connection, then requests and
 * questions as they come and go.
 */
class Inbox {
  constructor() {
    this.pending = new Map();
    this.questions = new Map();
    this.titles = new Map();
    this.list = null;
    // Others that follow every event the caller can see (the conversations' list).
    this.listeners = new Set();
    this.live = new Live({
      path: () => "/api/v1/ws",
      onFrame: (frame) => this.frame(frame),
      onDenied: () => whenUnauthorizedNow(),
    });
  }

  stop() {
    this.live.stop();
  }

  frame(frame) {
    for (const listener of this.listeners) listener(frame);
    if (frame.type === "snapshot") {
      this.pending = new Map(frame.pending_permissions.map((r) => [r.id, r]));
      this.questions = new Map((frame.pending_questions ?? []).map((q) => [q.id, q]));
    } else if (frame.type === "permission_requested") {
      this.pending.set(frame.data.id, frame.data);
    } else if (frame.type === "permission_resolved") {
      this.pending.delete(frame.data.id);
    } else if (frame.type === "question_asked") {
      this.questions.set(frame.data.id, frame.data);
    } else if (frame.type === "question_resolved") {
      this.questions.delete(frame.data.id);
    } else {
      return;
    }
    this.render();
  }

  /** The inbox as the page's view. */
  view() {
    document.title = "Inbox · acp-gateway";
    this.list = h("div.cards", { id: "inbox", "aria-live": "polite" });
    fill(main, h("h1", {}, "Waiting for you"), this.list);
    this.render();
    return { stop: () => (this.list = null) };
  }

  render() {
    const count = this.pending.size + this.questions.size;
    inboxCount.hidden = count === 0;
    inboxCount.textContent = String(count);
    inboxCount.setAttribute("aria-label", `${count} waiting`);
    if (!this.list) return;
    // Requests and questions in one list, the oldest first.
    const waiting = [
      ...[...this.pending.values()].map((item) => ({ item, question: false })),
      ...[...this.questions.values()].map((item) => ({ item, question: true })),
    ].sort((a, b) =>
      a.item.created_at < b.item.created_at ? -1 : a.item.created_at > b.item.created_at ? 1 : 0,
    );
    // Cards already shown stay (a tap in flight, or a form half filled in, keeps its state).
    const shown = new Map([
      ...[...this.list.querySelectorAll("[data-request-id]")].map((c) => [`r:${c.dataset.requestId}`, c]),
      ...[...this.list.querySelectorAll("[data-question-id]")].map((c) => [`q:${c.dataset.questionId}`, c]),
    ]);
    const cards = waiting.map(({ item, question }) => {
      const conversation = this.title(item.conversation_id);
      if (question) return shown.get(`q:${item.id}`) ?? questionCard(item, { conversation });
      return shown.get(`r:${item.id}`) ?? permissionCard(item, answer, { conversation });
    });
    if (cards.length === 0) {
      fill(this.list, h("p.empty", {}, "Nothing is waiting for an answer."));
    } else {
      fill(this.list, cards);
    }
  }

  /** A conversation's title, looked up once. */
  title(id) {
    if (!this.titles.has(id)) {
      this.titles.set(id, "Conversation");
      api("GET", `/api/v1/conversations/${id}`)
        .then((c) => {
          this.titles.set(id, c.title || `${c.agent} conversation`);
          for (const link of this.list?.querySelectorAll(`a[href="#/c/${id}"]`) ?? []) {
            link.textContent = this.titles.get(id);
          }
        })
        .catch(() => {});
    }
    return this.titles.get(id);
  }
}

function whenUnauthorizedNow() {
  sessionStorage.setItem("acp-gateway.return", location.hash);
  location.hash = "#/sign-in";
}

/**
 * Answers a request from its card, with the reason written there (if any,
 * and at once where "Tell the agent now" is ticked); the card says what
 * happened.
 */
async function answer(request, optionId, card) {
  const buttons = card.querySelectorAll("button");
  const error = card.querySelector(".error");
  const body = { option_id: optionId };
  const why = card.querySelector("textarea.reason");
  const now = card.querySelector("input.steer");
  if (why && why.value.trim()) body.reason = why.value;
  if (now?.checked) body.steer = true;
  error.hidden = true;
  if (body.steer && !body.reason) {
    error.textContent = "Write a reason to tell the agent now, or untick that.";
    error.hidden = false;
    return;
  }
  if (body.reason && [...body.reason].length > REASON_MAX) {
    error.textContent = `A reason is at most ${REASON_MAX} characters.`;
    error.hidden = false;
    return;
  }
  for (const button of buttons) button.disabled = true;
  try {
    const resolved = await api("POST", `/api/v1/permissions/${request.id}/respond`, body);
    settle(card, resolved);
  } catch (e) {
    if (e instanceof ApiError && e.code === "already_resolved" && e.problem?.request) {
      settle(card, e.problem.request);
    } else if (e instanceof ApiError && (e.status === 409 || e.status === 404)) {
      settle(card, null);
    } else {
      error.textContent = problemText(e);
      error.hidden = false;
      for (const button of buttons) button.disabled = false;
    }
  }
}

/** A card whose request is answered: its buttons go, the answer shows, with its reason. */
function settle(card, resolved) {
  // What was asked stays in the tool call's own card: this one shrinks to
  // the question and its answer.
  for (const detail of card.querySelectorAll(".options, .facts, .locations, pre, .why, .add-reason")) detail.remove();
  card.classList.add("resolved");
  const said = resolved ? `Answered: ${decisionText(resolved)}` : "Answered elsewhere";
  let note = card.querySelector(".decision");
  if (!note) {
    note = h("p.decision", { role: "status" });
    card.append(note);
  }
  note.textContent = said;
  const reason = resolved?.decision?.reason;
  let because = card.querySelector(".decision-reason");
  if (reason && !because) {
    because = h("p.decision-reason");
    note.after(because);
  }
  if (because) {
    because.hidden = !reason;
    fill(because, h("span.label", {}, "Reason: "), reason ?? "");
  }
}

/** At most this many characters in a reason given with an answer (the API's bound). */
const REASON_MAX = 2000;

// ---------------------------------------------------------- conversations

class ConversationsView {
  constructor() {
    document.title = "Conversations · acp-gateway";
    this.list = h("ul.conversations", { "aria-label": "Conversations" });
    this.more = h("button.quiet", { type: "button", hidden: true, onclick: () => this.load() }, "More");
    this.cursor = null;
    this.results = h("ul.conversations.results", { "aria-label": "Search results", hidden: true });
    this.found = h("p.meta", { role: "status", id: "search-status" });
    fill(main, h("h1", {}, "Conversations"), this.searchForm(), this.found, this.results, this.createForm(), this.list, this.more);
    this.load();
    // A conversation's changes, as its events record them (all of them
    // again on each connection: what came meanwhile was not heard).
    this.onFrame = (frame) => {
      if (frame.type === "snapshot") this.refreshChanges();
      if (!CHANGE_EVENTS.has(frame.type) || !frame.data?.totals) return;
      this.showRowChanges(frame.conversation_id, frame.data.totals);
    };
    inbox?.listeners.add(this.onFrame);
  }

  stop() {
    inbox?.listeners.delete(this.onFrame);
  }

  showRowChanges(id, totals) {
    for (const row of this.list.querySelectorAll("li.conversation")) {
      if (row.dataset.id === id) showChanges(row.querySelector(".changes"), totals);
    }
  }

  async refreshChanges() {
    try {
      const page = await api("GET", "/api/v1/conversations?limit=50");
      for (const c of page.items) if (c.worktree && c.changes) this.showRowChanges(c.id, c.changes);
    } catch {
      // The list's own load says what is wrong.
    }
  }

  /** Search across the caller's conversations: titles, and what was said. */
  searchForm() {
    const input = h("input", {
      type: "search",
      id: "search",
      name: "q",
      maxlength: 200,
      placeholder: "Words from a title or a message",
      autocapitalize: "off",
    });
    return h(
      "form.search",
      {
        role: "search",
        onsubmit: async (event) => {
          event.preventDefault();
          const q = input.value.trim();
          this.results.replaceChildren();
          this.results.hidden = !q;
          this.found.textContent = "";
          if (!q) return;
          try {
            const page = await api("GET", `/api/v1/search?limit=50&q=${encodeURIComponent(q)}`);
            for (const hit of page.items) this.results.append(this.hit(hit, q));
            this.found.textContent = page.items.length
              ? `${page.items.length}${page.next_cursor ? "+" : ""} found`
              : "Nothing found.";
          } catch (e) {
            this.found.textContent = problemText(e);
          }
        },
      },
      h("label", { for: "search" }, "Search conversations"),
      h("div.row", {}, input, h("button", { type: "submit" }, "Search")),
    );
  }

  hit({ conversation: c, matched, snippet }, q) {
    return h(
      "li.conversation",
      { dataset: { id: c.id } },
      h(
        "a",
        { href: `#/c/${c.id}` },
        h("strong", {}, c.title || "Untitled"),
        matched === "message" ? h("span.snippet", {}, marked(snippet, q)) : null,
        h("span.meta", {}, `${c.agent} · ${when(c.updated_at)}`),
      ),
    );
  }

  async load() {
    const query = this.cursor ? `&cursor=${encodeURIComponent(this.cursor)}` : "";
    try {
      const page = await api("GET", `/api/v1/conversations?limit=50${query}`);
      if (!this.cursor && page.items.length === 0) {
        this.list.append(h("li.empty", {}, "No conversations yet."));
      }
      for (const c of page.items) this.list.append(this.row(c));
      this.cursor = page.next_cursor;
      this.more.hidden = !this.cursor;
    } catch (e) {
      this.list.append(h("li.error", { role: "alert" }, problemText(e)));
    }
  }

  row(c) {
    const remove = h(
      "button.quiet.danger",
      {
        type: "button",
        "aria-label": `Delete ${c.title || "conversation"}`,
        onclick: async () => {
          // Two taps: the first asks, the second deletes.
          if (remove.dataset.armed !== "yes") {
            remove.dataset.armed = "yes";
            remove.textContent = "Really delete?";
            return;
          }
          remove.disabled = true;
          try {
            await api("DELETE", `/api/v1/conversations/${c.id}`);
            // Its history stays: the row stays, closed.
            item.replaceWith(this.row({ ...c, status: "closed" }));
          } catch (e) {
            remove.disabled = false;
            remove.textContent = problemText(e);
          }
        },
        onblur: () => {
          remove.dataset.armed = "";
          remove.textContent = "Delete";
        },
      },
      "Delete",
    );
    const item = h(
      "li.conversation",
      { dataset: { id: c.id } },
      h(
        "a",
        { href: `#/c/${c.id}` },
        h("strong", {}, c.title || "Untitled"),
        h("span.meta", {}, `${c.agent} · `, h(`span.status.${c.status}`, {}, c.status), ` · ${when(c.updated_at)}`),
        sharedBadge(c),
        showChanges(h("span.meta.changes"), c.worktree ? c.changes : null),
        showSpend(h("span.meta.spend"), c.spend),
      ),
      // Only its owner (or an operator) deletes it.
      c.status === "closed" || c.role ? null : remove,
    );
    return item;
  }

  createForm() {
    const agent = h("select", { id: "new-agent", name: "agent", required: true });
    const title = h("input", { id: "new-title", name: "title", maxlength: 200 });
    const cwd = h("input", {
      id: "new-cwd",
      name: "cwd",
      placeholder: "the agent's default",
      spellcheck: "false",
      autocapitalize: "off",
    });
    const error = h("p.error", { role: "alert", hidden: true });
    const button = h("button.primary", { type: "submit" }, "Start");
    // The agent's own sessions (begun elsewhere), to continue one.
    const sessions = h("ul.sessions", { id: "agent-sessions", "aria-label": "The agent's sessions", hidden: true });
    const more = h("button.quiet", { type: "button", id: "more-sessions", hidden: true }, "More sessions");
    let cursor = null;
    const listSessions = async (fresh) => {
      error.hidden = true;
      if (fresh) {
        fill(sessions);
        cursor = null;
      }
      const query = new URLSearchParams();
      if (cwd.value.trim()) query.set("cwd", cwd.value.trim());
      if (cursor) query.set("cursor", cursor);
      try {
        const page = await api("GET", `/api/v1/agents/${encodeURIComponent(agent.value)}/sessions?${query}`);
        for (const s of page.items) sessions.append(sessionItem(s));
        if (fresh && page.items.length === 0) sessions.append(h("li.empty", {}, "The agent keeps no session here."));
        sessions.hidden = false;
        cursor = page.next_cursor;
        more.hidden = !cursor;
      } catch (e) {
        error.textContent = problemText(e);
        error.hidden = false;
      }
    };
    more.addEventListener("click", () => listSessions(false));
    const sessionItem = (s) => {
      const action = s.held_by
        ? h("button.quiet", { type: "button", onclick: () => (location.hash = `#/c/${s.held_by}`) }, "Open")
        : h(
            "button.quiet",
            {
              type: "button",
              onclick: async (event) => {
                const go = event.currentTarget;
                go.disabled = true;
                error.hidden = true;
                const body = { agent: agent.value, cwd: s.cwd, adopt: s.session_id };
                if (title.value.trim()) body.title = title.value.trim();
                try {
                  const adopted = await api("POST", "/api/v1/conversations", body);
                  location.hash = `#/c/${adopted.id}`;
                } catch (e) {
                  error.textContent = problemText(e);
                  error.hidden = false;
                  go.disabled = false;
                }
              },
            },
            "Continue",
          );
      return h(
        "li.session",
        { dataset: { session: s.session_id } },
        h("strong", {}, s.title || s.session_id),
        h("span.meta", {}, `${s.cwd}${s.updated_at ? ` · ${when(s.updated_at)}` : ""}${s.held_by ? " · open here" : ""}`),
        action,
      );
    };
    const browse = h(
      "button.quiet",
      { type: "button", id: "list-sessions", onclick: () => listSessions(true) },
      "Continue a session…",
    );
    agent.addEventListener("change", () => {
      sessions.hidden = more.hidden = true;
    });
    api("GET", "/api/v1/agents")
      .then((agents) => {
        for (const a of agents.items) {
          const label = a.available ? a.title || a.name : `${a.title || a.name} (unavailable)`;
          agent.append(h("option", { value: a.name, disabled: !a.available }, label));
        }
      })
      .catch((e) => {
        error.textContent = problemText(e);
        error.hidden = false;
      });
    return h(
      "form.stack.create",
      {
        "aria-label": "New conversation",
        onsubmit: async (event) => {
          event.preventDefault();
          button.disabled = true;
          button.textContent = "Starting…";
          error.hidden = true;
          const body = { agent: agent.value };
          if (title.value.trim()) body.title = title.value.trim();
          if (cwd.value.trim()) body.cwd = cwd.value.trim();
          try {
            const created = await api("POST", "/api/v1/conversations", body);
            location.hash = `#/c/${created.id}`;
          } catch (e) {
            error.textContent = problemText(e);
            error.hidden = false;
            button.disabled = false;
            button.textContent = "Start";
          }
        },
      },
      h("h2", {}, "New conversation"),
      h("label", { for: "new-agent" }, "Agent"),
      agent,
      h("label", { for: "new-title" }, "Title"),
      title,
      h("label", { for: "new-cwd" }, "Directory"),
      cwd,
      error,
      button,
      browse,
      sessions,
      more,
    );
  }
}

/** `el` saying what a conversation's agent spent ("Spent 0.75 USD"), hidden where it reported no cost. */
function showSpend(el, spend) {
  const text = spendText(spend);
  el.textContent = text ? `Spent ${text}` : "";
  el.hidden = !text;
  return el;
}

/** `el` saying how much a conversation changed ("3 files · +12 −4"), hidden where nothing is known. */
function showChanges(el, totals) {
  el.textContent = changesText(totals);
  el.hidden = !el.textContent;
  return el;
}

// ----------------------------------------------------------- conversation

/** `text` with each of the search's words in it marked (as text, never markup). */
function marked(text, q) {
  const words = q.split(/[^\p{L}\p{N}]+/u).filter(Boolean);
  if (!words.length) return text;
  const escaped = words.map((w) => w.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
  const pattern = new RegExp(`(?<![\\p{L}\\p{N}])(${escaped.join("|")})(?![\\p{L}\\p{N}])`, "giu");
  const parts = [];
  let last = 0;
  for (const m of text.matchAll(pattern)) {
    parts.push(text.slice(last, m.index), h("mark", {}, m[0]));
    last = m.index + m[0].length;
  }
  parts.push(text.slice(last));
  return parts;
}

/** A file's bytes as base64. */
function base64Of(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(String(reader.result).replace(/^data:[^,]*,/, ""));
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

/** The ACP content block a picked file is sent as (see `attach`). */
async function blockOf(file, capabilities) {
  if (file.type.startsWith("image/")) {
    if (!capabilities.image) throw new Error("this agent does not take images.");
    return { type: "image", mimeType: file.type, data: await base64Of(file) };
  }
  const text = await file.text();
  if (text.includes("\u0000") || text.includes("\ufffd")) {
    throw new Error("only images and text files can be attached.");
  }
  const mimeType = file.type || "text/plain";
  if (capabilities.embeddedContext) {
    return { type: "resource", resource: { uri: `file:///${encodeURIComponent(file.name)}`, mimeType, text } };
  }
  return { type: "text", text: `${file.name}:\n\n${text}` };
}

/** Updates that change a conversation's settings, commands or usage. */
const SETTING_UPDATES = new Set([
  "current_mode_update",
  "config_option_update",
  "available_commands_update",
  "usage_update",
]);

/** "1,234 of 200,000 tokens · 0.12 USD", as far as the agent said. */
function usageText(usage) {
  if (!usage || typeof usage.used !== "number") return "";
  const n = (x) => x.toLocaleString("en-US");
  let text = typeof usage.size === "number" ? `${n(usage.used)} of ${n(usage.size)} tokens` : `${n(usage.used)} tokens`;
  if (usage.cost && typeof usage.cost.amount === "number") {
    text += ` · ${usage.cost.amount.toFixed(2)} ${usage.cost.currency ?? ""}`.trimEnd();
  }
  return text;
}

/**
 * One conversation, built from its events: every event since the first on
 * opening, then live ones; after a dropped connection it resumes after the
 * last event it showed.
 */
class ConversationView {
  constructor(id) {
    this.id = id;
    this.timeline = h("div.timeline", { id: "timeline", "aria-label": "Conversation" });
    this.toolCalls = new Map();
    this.requests = new Map();
    this.questions = new Map();
    this.terminals = new Map();
    this.plan = null;
    this.open = null; // the message being streamed: {kind, turn, el}
    this.rendered = new WeakMap(); // a Markdown message's text so far: {raw, queued}
    this.turn = null; // the running turn's id
    this.heading = h("h1", {}, "Conversation");
    this.status = h("span.status", { id: "status" });
    // Where this conversation came from (a fork, a session taken over).
    this.origin = h("p.meta.origin", { id: "origin", hidden: true });
    // Made on a repository: what its worktree changed, on a page of its own.
    this.changesCount = h("span.count-text");
    this.changesLink = h(
      "p.changes-link",
      { hidden: true },
      h("a", { href: `#/c/${id}/changes`, id: "changes-link" }, "Changes"),
      " ",
      this.changesCount,
    );
    // On the newest message: a new conversation forked from this one
    // (ACP forks a session whole, so only after the newest message).
    this.forkButton = h(
      "button.quiet.fork",
      { type: "button", id: "fork", hidden: true, onclick: () => this.fork() },
      "Fork from here",
    );
    this.cancel = h(
      "button.danger",
      { type: "button", id: "cancel", disabled: true, onclick: () => this.cancelTurn() },
      "Cancel",
    );
    this.error = h("p.error", { role: "alert", hidden: true });
    this.prompt = h("textarea", {
      id: "prompt",
      name: "text",
      rows: 2,
      required: true,
      placeholder: "Message the agent (Ctrl+Enter sends)",
    });
    this.send = h("button.primary", { type: "submit" }, "Send");
    // While a turn runs: what is sent waits in the queue; "Send now" steers
    // (cancels the turn and goes first).
    this.steer = h(
      "button",
      { type: "button", id: "send-now", hidden: true, onclick: () => this.submit(null, true) },
      "Send now",
    );
    this.queue = []; // the queued prompts, the next first
    this.queueSeen = 0; // queue_changed events handled (a GET answered after one is stale)
    this.held = null; // the queue_held event's data while the queue waits for a person
    this.editing = null; // the queued prompt being edited: {id, li}
    this.queueList = h("ol.queue-items", { id: "queue", "aria-label": "Queued prompts" });
    // A div, so that "form.prompt p.error" stays the prompt box's own message.
    this.queueError = h("div.error", { id: "queue-error", role: "alert", hidden: true });
    this.queueHead = h("h2", { id: "queue-head", tabindex: -1 }, "Queued");
    this.queuePanel = h("section.queue", { "aria-labelledby": "queue-head", hidden: true }, this.queueHead, this.queueList);
    this.heldText = h("span");
    this.heldPanel = h(
      "div.held",
      { role: "status", hidden: true },
      this.heldText,
      h("button", { type: "button", id: "resume", onclick: () => this.resumeQueue() }, "Resume"),
    );
    // Photos and files to send with the next prompt.
    this.attachments = [];
    this.capabilities = {};
    this.attached = h("ul.attached", { "aria-label": "Attachments", hidden: true });
    this.picker = h("input.sr", { type: "file", id: "attach", multiple: true });
    this.picker.addEventListener("change", () => this.attach([...this.picker.files]));
    const attach = h("label.button.attach", { for: "attach" }, "Attach");
    // The agent's slash commands, offered while the prompt is a "/" word.
    this.commands = [];
    this.suggestions = h("ul.commands", { id: "commands", "aria-label": "Commands", hidden: true });
    this.prompt.setAttribute("aria-controls", "commands");
    this.prompt.addEventListener("input", () => this.suggest());
    const form = h(
      "form.prompt",
      { onsubmit: (event) => this.submit(event) },
      h("label.sr", { for: "prompt" }, "Message"),
      this.suggestions,
      this.heldPanel,
      this.queuePanel,
      this.queueError,
      this.attached,
      this.prompt,
      h("div.actions", {}, this.picker, attach, this.cancel, this.steer, this.send),
      this.error,
    );
    this.prompt.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) form.requestSubmit();
      if (event.key === "Escape") this.suggestions.hidden = true;
    });
    // The session's settings (mode, the agent's options) and what it used.
    this.settings = h("div.settings", { role: "group", "aria-label": "Session settings" });
    this.usage = h("span.usage", { id: "usage" });
    this.spend = h("span.spend", { id: "spend", hidden: true });
    // A read-only link to this conversation, for its owner (see sharing.js).
    this.share = new SharePanel(id);
    // Who it is shared with (its owner manages them).
    this.members = new MembersPanel(id, { problemText });
    fill(
      main,
      h(
        "div.head",
        {},
        this.heading,
        h("p.meta", {}, this.status, this.usage, this.spend),
        this.origin,
        this.changesLink,
        this.members.el,
      ),
      this.share.el,
      this.settings,
      this.timeline,
      form,
    );
    // Followed to the newest until the reader scrolls up; again once back down.
    this.following = true;
    this.onScroll = () => {
      this.following = window.innerHeight + window.scrollY >= document.body.scrollHeight - 120;
    };
    window.addEventListener("scroll", this.onScroll, { passive: true });
    this.refresh();
    this.loadQueue();
    this.live = new Live({
      path: (after) => `/api/v1/conversations/${id}/ws?after=${after}`,
      onFrame: (event) => this.event(event),
      onDenied: () => whenUnauthorizedNow(),
      resumable: true,
    });
  }

  stop() {
    this.live.stop();
    window.removeEventListener("scroll", this.onScroll);
  }

  async refresh() {
    try {
      const c = await api("GET", `/api/v1/conversations/${this.id}`);
      this.heading.textContent = c.title || "Untitled";
      document.title = `${c.title || "Conversation"} · acp-gateway`;
      this.showStatus(c.status);
      this.showSettings(c);
      this.usage.textContent = usageText(c.usage);
      showSpend(this.spend, c.spend);
      this.commands = Array.isArray(c.available_commands) ? c.available_commands : [];
      this.capabilities = c.prompt_capabilities ?? {};
      // Unknown (never started) is offered: the gateway says if it cannot.
      this.forkButton.hidden = c.session_capabilities?.fork === false || c.status === "failed";
      this.showOrigin(c);
      this.changesLink.hidden = !c.worktree;
      this.changesCount.textContent = changesText(c.changes);
      this.members.show(c);
    } catch (e) {
      this.error.textContent = problemText(e);
      this.error.hidden = false;
      // Nothing to wait for: no such conversation (or not the caller's).
      if (e instanceof ApiError && e.status === 404) {
        this.live.stop();
        this.prompt.disabled = this.send.disabled = true;
      }
    }
  }

  /** "Forked from …" or "Continues the agent's session …". */
  showOrigin(c) {
    if (c.forked_from) {
      fill(
        this.origin,
        "Forked from ",
        h("a", { href: `#/c/${c.forked_from.conversation_id}` }, "another conversation"),
      );
    } else if (c.adopted_session) {
      fill(this.origin, `Continues the agent's session ${c.adopted_session}`);
    }
    this.origin.hidden = !(c.forked_from || c.adopted_session);
  }

  /** Forks the conversation after its newest message, and opens the fork. */
  async fork() {
    this.forkButton.disabled = true;
    this.forkButton.textContent = "Forking…";
    this.error.hidden = true;
    try {
      const forked = await api("POST", `/api/v1/conversations/${this.id}/fork`, {});
      location.hash = `#/c/${forked.id}`;
    } catch (e) {
      this.error.textContent = problemText(e);
      this.error.hidden = false;
    } finally {
      this.forkButton.disabled = false;
      this.forkButton.textContent = "Fork from here";
    }
  }

  /** A control per setting the agent offers: "Mode", then each option by its name. */
  showSettings(c) {
    const controls = [];
    const modes = c.modes?.availableModes ?? [];
    if (modes.length) {
      controls.push(
        this.choice(
          "Mode",
          "setting-mode",
          modes.map((m) => ({ value: m.id, name: m.name ?? m.id })),
          c.modes.currentModeId,
          (value) => api("POST", `/api/v1/conversations/${this.id}/mode`, { mode_id: value }),
        ),
      );
    }
    for (const [i, option] of (c.config_options ?? []).entries()) {
      const set = (value) =>
        api("POST", `/api/v1/conversations/${this.id}/config-options`, { config_id: option.id, value });
      const id = `setting-${i}`;
      if (option.type === "boolean") {
        const box = h("input", { type: "checkbox", id, checked: option.currentValue === true });
        box.addEventListener("change", () => this.apply(box, () => set(box.checked), () => (box.checked = !box.checked)));
        controls.push(h("div.setting.toggle", {}, box, h("label", { for: id }, option.name ?? option.id)));
      } else if (option.type === "select") {
        const choices = (option.options ?? []).flatMap((o) => (Array.isArray(o.options) ? o.options : [o]));
        controls.push(
          this.choice(option.name ?? option.id, id, choices.map((o) => ({ value: o.value, name: o.name ?? o.value })), option.currentValue, set),
        );
      }
    }
    // Not while a control is in use: a refresh must not take it from under a finger.
    if (this.settings.contains(document.activeElement)) return;
    fill(this.settings, controls);
    this.settings.hidden = controls.length === 0;
  }

  /** A labelled select of `choices`, `current` chosen; a change goes to `set`. */
  choice(label, id, choices, current, set) {
    const select = h(
      "select",
      { id },
      choices.map((o) => h("option", { value: o.value, selected: o.value === current }, o.name)),
    );
    let shown = current;
    select.addEventListener("change", () =>
      this.apply(select, () => set(select.value), () => (select.value = shown)).then((ok) => {
        if (ok) shown = select.value;
      }),
    );
    return h("div.setting", {}, h("label", { for: id }, label), select);
  }

  /** Sends a setting's change; where the agent refuses, says why and puts it back. */
  async apply(control, send, undo) {
    control.disabled = true;
    this.error.hidden = true;
    try {
      await send();
      return true;
    } catch (e) {
      undo();
      this.error.textContent = problemText(e);
      this.error.hidden = false;
      return false;
    } finally {
      control.disabled = false;
    }
  }

  /** While the prompt is a "/" and a word, the agent's commands that begin so. */
  suggest() {
    const typed = /^\/(\S*)$/.exec(this.prompt.value);
    const matching = typed ? this.commands.filter((c) => c.name.startsWith(typed[1])) : [];
    fill(
      this.suggestions,
      matching.map((c) =>
        h(
          "li",
          {},
          h(
            "button.command.quiet",
            {
              type: "button",
              onclick: () => {
                this.prompt.value = `/${c.name} `;
                this.suggestions.hidden = true;
                this.prompt.focus();
              },
            },
            h("span.name", {}, `/${c.name}`),
            c.description ? h("span.description", {}, c.description) : null,
          ),
        ),
      ),
    );
    this.suggestions.hidden = matching.length === 0;
  }

  showStatus(status) {
    this.status.className = `status ${status}`;
    this.status.textContent = status.replace("_", " ");
    this.prompt.disabled = status === "closed" || status === "failed";
    this.send.disabled = this.prompt.disabled;
    this.steer.disabled = this.prompt.disabled;
  }

  /** Whether a turn runs: what is typed then waits in the queue, or steers ("Send now"). */
  showRunning(running) {
    this.steer.hidden = !running;
    this.prompt.placeholder = running
      ? "The agent is working: what you send waits in the queue"
      : "Message the agent (Ctrl+Enter sends)";
  }

  /**
   * Sends the prompt box: it starts a turn, or (a turn running) waits in
   * the queue; with `steer` it cancels the running turn and goes first.
   */
  async submit(event, steer = false) {
    event?.preventDefault();
    const text = this.prompt.value;
    if (!text.trim() && this.attachments.length === 0) return;
    this.send.disabled = this.steer.disabled = true;
    this.error.hidden = true;
    const body = this.attachments.length
      ? { content: [...(text.trim() ? [{ type: "text", text }] : []), ...this.attachments.map((a) => a.block)] }
      : { text };
    if (steer) body.steer = true;
    try {
      await api("POST", `/api/v1/conversations/${this.id}/prompts`, body);
      this.prompt.value = "";
      this.attachments = [];
      this.showAttachments();
    } catch (e) {
      this.error.textContent =
        e instanceof ApiError && e.status === 413
          ? "That is too large to send: the gateway takes prompts up to its max_body_bytes. Remove an attachment, or send a smaller one."
          : problemText(e);
      this.error.hidden = false;
    } finally {
      this.send.disabled = this.steer.disabled = false;
    }
  }

  /** The queue as it is now (the events follow it from there). */
  async loadQueue() {
    const seen = this.queueSeen;
    try {
      const list = await api("GET", `/api/v1/conversations/${this.id}/queue`);
      // An event since has the queue as it is later.
      if (this.queueSeen === seen) this.showQueue(list.items ?? []);
    } catch {
      // The conversation's own load says what is wrong.
    }
  }

  /** Shows `queue` (the whole of it, the next first) above the prompt box. */
  showQueue(queue) {
    this.queue = queue;
    const ids = new Set(queue.map((p) => p.id));
    if (this.editing && !ids.has(this.editing.id)) {
      // Started, or removed elsewhere, while it was being edited.
      this.editing = null;
      this.queueError.textContent = "The prompt you were editing has started (or was removed): it is no longer queued.";
      this.queueError.hidden = false;
    }
    // A keyboard's place is kept: the same button of the same prompt (or
    // its first), else the queue's heading (not the prompt box: on a phone
    // that would bring up the keyboard).
    const active = document.activeElement;
    const focused = this.queueList.contains(active) && active.tagName === "BUTTON"
      ? { id: active.closest("li")?.dataset.promptId, name: active.textContent }
      : null;
    fill(
      this.queueList,
      queue.map((prompt, i) => (this.editing?.id === prompt.id ? this.editing.li : this.queued(prompt, i))),
    );
    if (focused) {
      const li = [...this.queueList.children].find((el) => el.dataset.promptId === focused.id);
      const buttons = li ? [...li.querySelectorAll("button")] : [];
      (buttons.find((b) => b.textContent === focused.name) ?? buttons[0] ?? this.queueHead).focus({ preventScroll: true });
    }
    this.queueHead.textContent = `Queued (${queue.length})`;
    this.queuePanel.hidden = queue.length === 0;
    this.showHeld();
  }

  /** One queued prompt: its text, and Up, Top, Edit and Remove. */
  queued(prompt, i) {
    const text = contentText(prompt.content);
    const short = text.length > 40 ? `${text.slice(0, 40)}…` : text;
    const editable = (prompt.content ?? []).every((b) => b?.type === "text");
    const li = h("li.queued", { dataset: { promptId: prompt.id } });
    const button = (label, attrs) => h("button.quiet", { type: "button", "aria-label": `${label}: ${short}`, ...attrs }, label);
    fill(
      li,
      prompt.reason_for ? h("p.meta", {}, "Your reason, for the agent") : null,
      prompt.steer ? h("p.meta", {}, "Next: the turn is being stopped") : null,
      h("p.text", {}, promptContent(prompt.content)),
      h(
        "div.row",
        {},
        i > 0 ? button("Up", { onclick: () => this.moveQueued(prompt, i - 1) }) : null,
        i > 1 ? button("Top", { onclick: () => this.moveQueued(prompt, 0) }) : null,
        editable ? button("Edit", { onclick: () => this.editQueued(prompt, li, text) }) : null,
        h(
          "button.quiet.danger",
          { type: "button", "aria-label": `Remove: ${short}`, onclick: () => this.removeQueued(prompt) },
          "Remove",
        ),
      ),
    );
    return li;
  }

  /** Turns a queued prompt's entry into a box to edit its text, saved with PATCH. */
  editQueued(prompt, li, text) {
    if (this.editing) {
      // One at a time: the other goes back as it was.
      this.editing = null;
      this.showQueue(this.queue);
      li = this.queueList.querySelector(`[data-prompt-id="${prompt.id}"]`) ?? li;
    }
    const id = `queue-edit-${prompt.id}`;
    const box = h("textarea", { id, rows: 2 });
    box.value = text;
    const save = async () => {
      if (!box.value.trim()) return;
      const ok = await this.changeQueued("PATCH", prompt, { text: box.value });
      if (ok) {
        this.editing = null;
        this.showQueue(this.queue);
      }
    };
    const keep = () => {
      this.editing = null;
      this.showQueue(this.queue);
    };
    // As in the prompt box: Ctrl+Enter saves; Escape keeps it as it was.
    box.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) save();
      if (event.key === "Escape") keep();
    });
    fill(
      li,
      h("label", { for: id }, "Edit the queued prompt"),
      box,
      h(
        "div.row",
        {},
        h("button.quiet", { type: "button", onclick: keep }, "Keep as it was"),
        h("button.primary", { type: "button", onclick: save }, "Save"),
      ),
    );
    this.editing = { id: prompt.id, li };
    box.focus();
  }

  moveQueued(prompt, position) {
    return this.changeQueued("PATCH", prompt, { position });
  }

  removeQueued(prompt) {
    return this.changeQueued("DELETE", prompt);
  }

  /**
   * Edits, moves or removes a queued prompt; the queue_changed event shows
   * the outcome. One that started meanwhile is said plainly.
   */
  async changeQueued(method, prompt, body) {
    this.queueError.hidden = true;
    try {
      await api(method, `/api/v1/conversations/${this.id}/queue/${prompt.id}`, body);
      return true;
    } catch (e) {
      this.queueError.textContent =
        e instanceof ApiError && e.code === "already_started"
          ? "That prompt has already started: it can no longer be changed."
          : e instanceof ApiError && e.status === 404
            ? "That prompt is no longer queued."
            : problemText(e);
      this.queueError.hidden = false;
      if (e instanceof ApiError && (e.code === "already_started" || e.status === 404)) {
        this.editing = null;
        this.loadQueue();
      }
      return false;
    }
  }

  /** Whether the queue waits for a person (after a turn that did not end with end_turn). */
  showHeld() {
    const waiting = this.held && this.queue.length > 0;
    this.heldPanel.hidden = !waiting;
    if (!waiting) return;
    const why = this.held.stop_reason ? ` (the turn ended: ${String(this.held.stop_reason).replace(/_/g, " ")})` : "";
    const n = this.queue.length;
    this.heldText.textContent = `The queue is paused${why}. ${n} ${n === 1 ? "prompt waits" : "prompts wait"}.`;
  }

  async resumeQueue() {
    const resume = this.heldPanel.querySelector("button");
    resume.disabled = true;
    this.queueError.hidden = true;
    try {
      await api("POST", `/api/v1/conversations/${this.id}/queue/resume`, {});
      this.held = null;
      this.showHeld();
    } catch (e) {
      if (e instanceof ApiError && e.code === "queue_empty") {
        this.held = null;
        this.showQueue([]);
      } else {
        this.queueError.textContent =
          e instanceof ApiError && e.code === "turn_in_progress"
            ? "A turn is running: the queue goes on when it ends."
            : problemText(e);
        this.queueError.hidden = false;
      }
    } finally {
      resume.disabled = false;
    }
  }

  /**
   * Files picked to send: an image becomes an ACP `image` block where the
   * agent takes images; a text file an embedded `resource` block where it
   * takes those, else a text block holding it. What cannot go is said.
   */
  async attach(files) {
    this.picker.value = "";
    const refused = [];
    for (const file of files) {
      try {
        const block = await blockOf(file, this.capabilities);
        this.attachments.push({ name: file.name, type: file.type, size: file.size, block });
      } catch (why) {
        refused.push(`${file.name}: ${why.message ?? why}`);
      }
    }
    this.showAttachments();
    this.error.textContent = refused.join(" ");
    this.error.hidden = refused.length === 0;
  }

  showAttachments() {
    fill(
      this.attached,
      this.attachments.map((a, i) =>
        h(
          "li",
          {},
          a.block.type === "image" ? h("img", { src: `data:${a.block.mimeType};base64,${a.block.data}`, alt: "" }) : null,
          h("span.name", {}, a.name),
          h(
            "button.quiet",
            {
              type: "button",
              "aria-label": `Remove ${a.name}`,
              onclick: () => {
                this.attachments.splice(i, 1);
                this.showAttachments();
              },
            },
            "×",
          ),
        ),
      ),
    );
    this.attached.hidden = this.attachments.length === 0;
  }

  async cancelTurn() {
    this.cancel.disabled = true;
    try {
      await api("POST", `/api/v1/conversations/${this.id}/cancel`);
    } catch (e) {
      this.error.textContent = problemText(e);
      this.error.hidden = false;
      this.cancel.disabled = false;
    }
  }

  /** Adds to the timeline, keeping the newest in view unless the reader scrolled up. */
  add(el) {
    this.timeline.append(el);
    this.follow();
    return el;
  }

  follow() {
    if (this.following) window.scrollTo(0, document.body.scrollHeight);
  }

  /**
   * Appends `text` to an agent's message or thought, shown as Markdown: the
   * whole of it rendered again once a frame while it streams.
   */
  markdown(el, text) {
    const shown = this.rendered.get(el) ?? { raw: "", queued: false };
    shown.raw += text;
    this.rendered.set(el, shown);
    if (shown.queued) return;
    shown.queued = true;
    requestAnimationFrame(() => {
      shown.queued = false;
      fill(el, markdown(shown.raw));
      this.follow();
    });
  }

  /** The message being streamed of this kind, or a new one. */
  message(kind, turn) {
    if (this.open && this.open.kind === kind && this.open.turn === turn) return this.open.el;
    const label = { agent: "Agent", thought: "Thought", user: "You" }[kind];
    const el = h(kind === "user" ? "div.text" : "div.text.md");
    // Not a landmark each (many share one label): the visible "who" says it.
    const section = this.add(h(`section.message.${kind}`, {}, h("p.who", {}, label), el));
    // The fork is offered on the newest message: it moves along.
    section.append(this.forkButton);
    this.open = { kind, turn, el };
    return el;
  }

  /** Names who sent the prompt just shown. */
  prompter(name) {
    const who = this.open?.el?.parentElement?.querySelector("p.who");
    if (who) who.textContent = name;
  }

  event(event) {
    const data = event.data ?? {};
    if (event.type !== "session_update") this.open = null;
    switch (event.type) {
      case "turn_started":
        this.turn = data.turn_id;
        this.cancel.disabled = false;
        this.showStatus("running");
        this.showRunning(true);
        // The queue goes on (a held one after this turn ends with end_turn).
        this.held = null;
        this.showHeld();
        fill(this.message("user", data.turn_id), promptContent(data.content));
        // Who prompted, where it was recorded (a shared conversation has
        // several people who may).
        if (data.by) this.prompter(person(data.by));
        this.open = null;
        break;
      case "member_added":
      case "member_changed":
      case "member_removed":
        this.members.load();
        this.add(h("p.note.member", {}, memberNote(event.type, data)));
        break;
      case "session_update":
        this.update(data.turn_id, data.update ?? {});
        break;
      case "permission_requested":
        this.showStatus("awaiting_permission");
        this.request(data);
        break;
      case "permission_resolved":
        if (this.turn) this.showStatus("running");
        this.request(data);
        break;
      case "question_asked":
        this.showStatus("awaiting_permission");
        this.question(data);
        break;
      case "question_resolved":
        if (this.turn) this.showStatus("running");
        this.question(data);
        break;
      case "turn_ended": {
        this.turn = null;
        this.cancel.disabled = true;
        this.showRunning(false);
        const why = data.stop_reason === "end_turn" ? "Done" : `Ended: ${data.stop_reason}`;
        this.add(h("p.turn-end", {}, data.error ? `${why} — ${data.error}` : why));
        this.refresh();
        break;
      }
      case "agent_status":
        this.add(
          h(
            "p.note",
            {},
            `Agent ${data.status}${data.context ? ` (${data.context})` : ""}${data.detail ? `: ${data.detail}` : ""}`,
          ),
        );
        if (data.status !== "starting") this.refresh();
        break;
      case "mode_changed":
      case "config_option_changed":
        this.refresh();
        break;
      case "file_written":
        this.add(h("section.card.file", { "aria-label": `Wrote ${data.path}` }, h("h2", {}, `Wrote ${data.path}`), unifiedDiff(data.diff ?? "")));
        break;
      case "terminal_output":
        this.terminalOutput(data);
        break;
      case "queue_changed":
        this.queueSeen++;
        this.showQueue(Array.isArray(data.queue) ? data.queue : []);
        break;
      case "queue_held":
        this.held = data;
        this.showHeld();
        break;
      case "budget_warning":
      case "budget_exceeded":
        this.add(h("p.note.budget", { role: "status" }, budgetNote(event.type, data)));
        break;
      case "changes_updated":
      case "changes_committed":
      case "changes_landed":
      case "changes_discarded":
        this.changesLink.hidden = false;
        this.changesCount.textContent = changesText(data.totals);
        if (event.type !== "changes_updated") this.add(h("p.note", {}, changeNote(event.type, data)));
        break;
      default:
        break;
    }
  }

  update(turn, update) {
    const kind = update.sessionUpdate;
    if (kind === "agent_message_chunk" || kind === "agent_thought_chunk" || kind === "user_message_chunk") {
      const who = kind === "agent_message_chunk" ? "agent" : kind === "user_message_chunk" ? "user" : "thought";
      const el = this.message(who, turn);
      const text = contentText([update.content]);
      if (who === "user") {
        el.append(text);
        this.follow();
      } else {
        this.markdown(el, text);
      }
      return;
    }
    this.open = null;
    if (SETTING_UPDATES.has(kind)) {
      // The conversation holds them as the agent last said: shown from there.
      this.refresh();
      return;
    }
    const add = (el) => this.add(el);
    if (kind === "tool_call" || kind === "tool_call_update") showToolCall(this.toolCalls, update, add);
    else if (kind === "plan") this.plan = showPlan(this.plan, update.entries, turn, add);
  }

  request(request) {
    const known = this.requests.get(request.id);
    if (request.status === "pending") {
      if (known) return;
      this.requests.set(request.id, this.add(permissionCard(request, answer)));
    } else if (known) {
      settle(known, request);
    }
  }

  /** A question asked (a card to answer it), or answered (its card shows how). */
  question(question) {
    const known = this.questions.get(question.id);
    if (known) {
      if (question.status !== "pending") settleQuestion(known, question);
      return;
    }
    this.questions.set(question.id, this.add(questionCard(question)));
  }

  terminalOutput(data) {
    let terminal = this.terminals.get(data.terminal_id);
    if (!terminal) {
      const output = h("pre.output");
      const title = data.command ? `$ ${data.command.join(" ")}` : "Terminal";
      this.add(h("section.card.terminal", { "aria-label": "Terminal" }, h("h2", {}, title), output));
      terminal = { output };
      this.terminals.set(data.terminal_id, terminal);
    }
    terminal.output.append(data.output ?? "");
    if (data.exit_status) {
      const { exitCode, signal } = data.exit_status;
      terminal.output.after(h("p.note", {}, signal ? `Killed (${signal})` : `Exit code ${exitCode}`));
    }
  }
}

/** What a budget's notice says: which budget, how much of it is spent, and when it resets. */
function budgetNote(type, data) {
  const limit = data.limit ?? {};
  const unit = limit.currency ? ` ${limit.currency}` : limit.turns !== undefined ? " turns" : " tokens in context";
  const of = limit.amount ?? limit.turns ?? limit.context;
  const figure = (n) => (typeof n === "number" ? String(Math.round(n * 100) / 100) : "?");
  const resets = data.resets_at ? `; it resets ${new Date(data.resets_at).toLocaleString()}` : "";
  const spent = `${figure(data.spent)} of ${figure(of)}${unit}`;
  if (type === "budget_warning") return `Budget ${data.budget}: ${spent} spent${resets}.`;
  const stop = data.on_exceed === "finish_turn" ? "the turn may finish" : "the turn was cancelled";
  return `Budget ${data.budget} is spent (${spent}): ${stop}; new prompts wait until it resets or an operator lifts it${resets}.`;
}

/** "alice shared it with bob (viewer)", and so on, for a `member_*` event. */
function memberNote(type, data) {
  const by = person(data.by);
  if (type === "member_added") return `${by} shared it with ${data.user} (${data.role})`;
  if (type === "member_changed") return `${by} made ${data.user} ${data.role === "approver" ? "an" : "a"} ${data.role}`;
  return `${by} removed ${data.user}`;
}

/** A commit, land or discard in the timeline, in words. */
function changeNote(type, data) {
  const by = data.by ? ` by ${data.by}` : "";
  if (type === "changes_committed") return `Committed${by}: ${data.commit?.summary ?? ""}`;
  if (type === "changes_landed") return `Landed on ${data.base} (${data.strategy})${by}`;
  return `Uncommitted changes discarded${by}`;
}

// Started once every class above is defined.
window.addEventListener("hashchange", route);
route();
// The service worker shows notifications and answers from them (web/sw.js).
serviceWorker();
