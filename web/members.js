// Who a conversation is shared with: the Members panel of a conversation
// (its owner or an operator lists, adds, changes and removes members; a
// member sees the list and their own role), and the badge a shared
// conversation wears in the list. Everything goes in as text.

import { api } from "./api.js";
import { h, fill } from "./dom.js";

/** The roles, each allowing all the one before it does. */
const ROLES = [
  { value: "viewer", title: "Viewer", hint: "sees everything" },
  { value: "approver", title: "Approver", hint: "also answers its requests and questions" },
  { value: "collaborator", title: "Collaborator", hint: "also prompts, cancels and changes settings" },
];

/** "Shared with me (viewer)" or "Shared", for a Conversation; null where it is not shared. */
export function sharedBadge(c) {
  if (c.role) return h("span.badge.shared", { title: `Shared with you as ${c.role}` }, `Shared with me · ${c.role}`);
  if (c.members > 0) return h("span.badge.shared", { title: `Shared with ${c.members}` }, `Shared · ${c.members}`);
  return null;
}

/** "alice" for "user:alice"; what it was for anything else. */
export function person(by) {
  return typeof by === "string" && by.startsWith("user:") ? by.slice(5) : by;
}

/**
 * The Members panel of conversation `id`: `el` to place, `show(c)` with the
 * conversation as GET answers it, `load()` again after a `member_*` event.
 * `problemText(error)` says a problem in words.
 */
export class MembersPanel {
  constructor(id, { problemText }) {
    this.id = id;
    this.problemText = problemText;
    this.owns = false;
    this.count = h("span.count-text", { id: "members-count" });
    this.list = h("ul.members", { id: "members", "aria-label": "Members" });
    this.error = h("p.error", { role: "alert", hidden: true });
    this.user = h("input", {
      id: "member-user",
      name: "user",
      required: true,
      maxlength: 64,
      pattern: "[A-Za-z0-9._@\\-]+",
      autocomplete: "off",
      placeholder: "User name",
    });
    this.role = roleSelect("member-role", "viewer");
    this.form = h(
      "form.member-add",
      { onsubmit: (event) => this.add(event), hidden: true },
      h("label.sr", { for: "member-user" }, "User"),
      this.user,
      h("label.sr", { for: "member-role" }, "Role"),
      this.role,
      h("button", { type: "submit", id: "member-add" }, "Share"),
    );
    this.mine = h("p.meta", { id: "my-role", hidden: true });
    this.body = h("div.members-body", { id: "members-body", hidden: true }, this.mine, this.list, this.form, this.error);
    this.toggle = h(
      "button.quiet",
      {
        type: "button",
        id: "members-toggle",
        "aria-expanded": "false",
        "aria-controls": "members-body",
        onclick: () => this.flip(),
      },
      "Members",
    );
    this.el = h("div.members-panel", { id: "members-panel" }, this.toggle, " ", this.count, this.body);
  }

  /** Shows or hides the list. */
  flip() {
    const open = this.body.hidden;
    this.body.hidden = !open;
    this.toggle.setAttribute("aria-expanded", String(open));
  }

  /** The conversation as GET answers it: who the reader is to it. */
  show(c) {
    // Its owner (role null) or an operator: they manage its members.
    this.owns = !c.role;
    this.form.hidden = !this.owns;
    this.mine.hidden = !c.role;
    this.mine.textContent = c.role ? `Shared with you as ${c.role}` : "";
    this.count.textContent = c.members > 0 ? `(${c.members})` : "";
    this.load();
  }

  async load() {
    try {
      const page = await api("GET", `/api/v1/conversations/${this.id}/members`);
      const members = page.items ?? [];
      this.count.textContent = members.length ? `(${members.length})` : "";
      fill(this.list, members.length ? members.map((m) => this.row(m)) : h("li.meta", {}, "Not shared"));
    } catch (e) {
      this.fail(e);
    }
  }

  row(m) {
    const name = h("strong", {}, m.user);
    if (!this.owns) return h("li.member", { dataset: { user: m.user } }, name, " ", h("span.meta", {}, m.role));
    const role = roleSelect(`member-role-${m.user}`, m.role);
    role.setAttribute("aria-label", `Role of ${m.user}`);
    role.addEventListener("change", () =>
      this.call("PATCH", `/members/${encodeURIComponent(m.user)}`, { role: role.value }),
    );
    const remove = h(
      "button.quiet.danger",
      {
        type: "button",
        "aria-label": `Remove ${m.user}`,
        onclick: () => this.call("DELETE", `/members/${encodeURIComponent(m.user)}`),
      },
      "Remove",
    );
    return h("li.member", { dataset: { user: m.user } }, name, " ", role, " ", remove);
  }

  async add(event) {
    event.preventDefault();
    const ok = await this.call("POST", "/members", { user: this.user.value.trim(), role: this.role.value });
    if (ok) this.user.value = "";
  }

  /** A change of members; the list again after it. Whether it was made. */
  async call(method, path, body) {
    this.error.hidden = true;
    try {
      await api(method, `/api/v1/conversations/${this.id}${path}`, body);
      await this.load();
      return true;
    } catch (e) {
      this.fail(e);
      return false;
    }
  }

  fail(e) {
    this.error.textContent = this.problemText(e);
    this.error.hidden = false;
  }
}

function roleSelect(id, current) {
  return h(
    "select",
    { id, name: "role" },
    ROLES.map((r) => h("option", { value: r.value, title: r.hint, selected: r.value === current }, r.title)),
  );
}
