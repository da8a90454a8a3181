// The conversation page's "Share link" control, for its owner: make a
// read-only link with an expiry, copy its URL (shown once), and see and
// revoke the links made before.

import { api, ApiError } from "./api.js";
import { h, fill, when } from "./dom.js";

const EXPIRIES = [
  ["1h", "1 hour"],
  ["24h", "24 hours"],
  ["7d", "7 days"],
  ["30d", "30 days"],
];

export class SharePanel {
  constructor(conversationId) {
    this.id = conversationId;
    this.toggle = h(
      "button.quiet",
      { type: "button", id: "share", "aria-expanded": "false", "aria-controls": "share-panel", onclick: () => this.flip() },
      "Share link",
    );
    this.expiry = h(
      "select",
      { id: "share-expiry" },
      EXPIRIES.map(([value, name]) => h("option", { value, selected: value === "24h" }, name)),
    );
    this.create = h("button.primary", { type: "button", id: "share-create", onclick: () => this.make() }, "Create link");
    this.url = h("input", { id: "share-url", type: "text", readonly: true, "aria-label": "The new link" });
    this.copy = h("button", { type: "button", id: "share-copy", onclick: () => this.copyUrl() }, "Copy");
    this.made = h(
      "div.share-made",
      { hidden: true },
      h("p.hint", {}, "Anyone with this link sees this conversation, read-only, until it expires or you revoke it. It is shown only now."),
      h("div.row", {}, this.url, this.copy),
    );
    this.error = h("p.error", { role: "alert", id: "share-error", hidden: true });
    this.list = h("ul.share-links", { id: "share-links", "aria-label": "Share links" });
    this.panel = h(
      "section.share",
      { id: "share-panel", "aria-label": "Share link", hidden: true },
      h("div.row", {}, h("label", { for: "share-expiry" }, "Expires after"), this.expiry, this.create),
      this.made,
      this.error,
      this.list,
    );
    this.el = h("div.share-control", {}, this.toggle, this.panel);
  }

  flip() {
    this.panel.hidden = !this.panel.hidden;
    this.toggle.setAttribute("aria-expanded", String(!this.panel.hidden));
    if (!this.panel.hidden) this.load();
  }

  say(e) {
    this.error.textContent =
      e instanceof ApiError && e.code === "share_links_disabled"
        ? "Share links are off on this gateway: an operator can enable them (share_links = true)."
        : e instanceof ApiError && e.status === 403
          ? "Only the conversation's owner or an operator can share it."
          : e.message;
    this.error.hidden = false;
  }

  async make() {
    this.create.disabled = true;
    this.error.hidden = true;
    try {
      const link = await api("POST", `/api/v1/conversations/${this.id}/share-links`, { expires_in: this.expiry.value });
      this.url.value = new URL(link.url, location.href).href;
      this.made.hidden = false;
      this.url.select();
      this.load();
    } catch (e) {
      this.say(e);
    } finally {
      this.create.disabled = false;
    }
  }

  async copyUrl() {
    try {
      await navigator.clipboard.writeText(this.url.value);
      this.copy.textContent = "Copied";
    } catch {
      this.url.select();
      this.copy.textContent = "Select and copy";
    }
  }

  async load() {
    try {
      const links = await api("GET", `/api/v1/conversations/${this.id}/share-links`);
      fill(this.list, links.items.slice().reverse().map((link) => this.item(link)));
    } catch (e) {
      this.say(e);
    }
  }

  item(link) {
    const state = link.state === "active" ? `expires ${new Date(link.expires_at).toLocaleString()}` : link.state;
    return h(
      "li",
      { dataset: { linkId: link.id, state: link.state } },
      h("span", {}, `Made ${when(link.created_at)} by ${link.created_by}: ${state}`),
      link.state === "active"
        ? h("button.danger", { type: "button", onclick: (event) => this.revoke(link, event.target) }, "Revoke")
        : null,
    );
  }

  async revoke(link, button) {
    button.disabled = true;
    this.error.hidden = true;
    try {
      await api("DELETE", `/api/v1/conversations/${this.id}/share-links/${link.id}`);
      this.load();
    } catch (e) {
      this.say(e);
      button.disabled = false;
    }
  }
}
