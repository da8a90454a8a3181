// A conversation's changes, where it was made on a repository (its own git
// worktree and branch): the branch and its base, each file that differs
// with its status and the lines added and removed, a file's diff, the
// branch's commits, and Commit, Land and Discard, each confirmed in the
// page first. Live on changes_updated, changes_committed, changes_landed
// and changes_discarded. Everything goes in as text.

import { api, ApiError } from "./api.js";
import { h, fill, when } from "./dom.js";
import { Live } from "./live.js";
import { unifiedDiff } from "./render.js";

/** The events after which what differs is shown again. */
export const CHANGE_EVENTS = new Set(["changes_updated", "changes_committed", "changes_landed", "changes_discarded"]);

const plural = (n, one, many = `${one}s`) => `${n} ${n === 1 ? one : many}`;

/** "3 files · +12 −4" (and "· 2 commits"), or "No changes", for a Conversation's `changes`; "" for none. */
export function changesText(totals) {
  if (!totals || typeof totals.files !== "number") return "";
  const commits = totals.commits ? ` · ${plural(totals.commits, "commit")}` : "";
  if (totals.files === 0) return `No changes${commits}`;
  return `${plural(totals.files, "file")} · +${totals.added} −${totals.removed}${commits}`;
}

/** The words for a file's status. */
const STATUS_WORDS = {
  added: "added",
  modified: "modified",
  deleted: "deleted",
  renamed: "renamed",
  copied: "copied",
  type_changed: "type changed",
};

/** How to land, as offered. */
const STRATEGIES = [
  { value: "merge", title: "Merge", hint: "a merge commit on the base" },
  { value: "squash", title: "Squash", hint: "one commit of everything" },
  { value: "rebase", title: "Rebase", hint: "the commits replayed on the base" },
];

const short = (hash) => String(hash ?? "").slice(0, 8);

/**
 * The page `#/c/{id}/changes`. `problemText(error)` says a problem in
 * words; `onDenied()` is called when the gateway closes for a revoked token.
 */
export class ChangesView {
  constructor(main, id, { problemText, onDenied }) {
    this.id = id;
    this.problemText = problemText;
    this.conversation = null;
    this.changes = null;
    this.open = new Set(); // the paths whose diff is shown
    this.loading = false;
    this.again = false;
    this.stopped = false;
    document.title = "Changes · acp-gateway";
    this.back = h("a", { href: `#/c/${id}` }, "Back to the conversation");
    this.branch = h("p.meta.branch", { id: "branch" });
    this.summary = h("p.summary", { id: "changes-summary", role: "status" });
    this.commitButton = h("button", { type: "button", onclick: () => this.ask("commit") }, "Commit");
    this.landButton = h("button.primary", { type: "button", onclick: () => this.ask("land") }, "Land");
    this.discardButton = h("button.danger", { type: "button", onclick: () => this.ask("discard") }, "Discard");
    this.actions = h(
      "div.change-actions",
      { role: "group", "aria-label": "What to do with the changes", hidden: true },
      this.commitButton,
      this.landButton,
      this.discardButton,
    );
    // The in-page confirmation of Commit, Land or Discard.
    this.panel = h("form.card.confirm", { id: "change-confirm", "aria-labelledby": "confirm-head", hidden: true });
    this.panel.addEventListener("keydown", (event) => {
      if (event.key === "Escape") this.dismiss();
    });
    this.error = h("div.error.change-error", { id: "change-error", role: "alert", hidden: true });
    this.done = h("p.done", { id: "change-done", role: "status", hidden: true });
    this.files = h("ul.changed-files", { id: "changed-files", "aria-labelledby": "files-head" });
    this.more = h("p.note", { hidden: true }, "More files differ than are listed here.");
    this.commits = h("ol.branch-commits", { id: "branch-commits", "aria-labelledby": "commits-head" });
    fill(
      main,
      h(
        "div.head",
        {},
        h("p.back", {}, this.back),
        h("h1", {}, "Changes"),
        this.branch,
        this.summary,
      ),
      this.actions,
      this.panel,
      this.error,
      this.done,
      h("section.changes-part", {}, h("h2", { id: "files-head" }, "Files"), this.files, this.more),
      h("section.changes-part", {}, h("h2", { id: "commits-head" }, "Commits"), this.commits),
    );
    this.live = null;
    this.start(onDenied);
  }

  stop() {
    this.stopped = true;
    this.live?.stop();
  }

  /** The conversation, then its events from now on, then what differs. */
  async start(onDenied) {
    let c;
    try {
      c = await api("GET", `/api/v1/conversations/${this.id}`);
    } catch (e) {
      this.say(e);
      return;
    }
    if (this.stopped) return;
    this.conversation = c;
    this.back.textContent = `Back to ${c.title || "the conversation"}`;
    document.title = `Changes · ${c.title || "Conversation"} · acp-gateway`;
    if (!c.worktree) {
      fill(this.summary, "This conversation was not made on a repository: it has no changes to show.");
      return;
    }
    fill(this.branch, "Branch ", h("code", {}, c.worktree.branch), " from ", h("code", {}, c.worktree.base));
    this.landButton.textContent = `Land on ${c.worktree.base}`;
    this.showStatus(c.status);
    this.actions.hidden = false;
    const since = c.last_seq ?? 0;
    this.live = new Live({
      path: (after) => `/api/v1/conversations/${this.id}/ws?after=${Math.max(after, since)}`,
      onFrame: (event) => this.event(event),
      onDenied,
      resumable: true,
    });
    this.reload();
  }

  event(event) {
    // A turn changed the work since what was last done here.
    if (event.type === "changes_updated") this.done.hidden = true;
    if (CHANGE_EVENTS.has(event.type)) this.reload();
    else if (event.type === "agent_status" && event.data?.status === "closed") this.showStatus("closed");
  }

  /** A closed conversation's worktree is gone: its branch can still land. */
  showStatus(status) {
    const closed = status === "closed";
    this.commitButton.hidden = closed;
    this.discardButton.hidden = closed;
  }

  /** What differs, again (one load at a time; one more after it where asked meanwhile). */
  async reload() {
    if (this.loading) {
      this.again = true;
      return;
    }
    this.loading = true;
    try {
      do {
        this.again = false;
        const changes = await api("GET", `/api/v1/conversations/${this.id}/changes`);
        if (this.stopped) return;
        this.show(changes);
      } while (this.again);
    } catch (e) {
      this.say(e);
    } finally {
      this.loading = false;
    }
  }

  show(changes) {
    this.changes = changes;
    const t = changes.totals;
    const uncommitted = changes.uncommitted ? ` · ${plural(changes.uncommitted, "file")} not committed` : "";
    this.summary.textContent = changesText(t) + uncommitted;
    fill(
      this.files,
      changes.files.length
        ? changes.files.map((file, i) => this.file(file, i))
        : h("li.empty", {}, `Nothing differs from ${changes.base}.`),
    );
    this.more.hidden = !changes.truncated;
    fill(
      this.commits,
      changes.commits.length
        ? changes.commits.map((c) =>
            h(
              "li.branch-commit",
              { dataset: { commit: c.id } },
              h("strong", {}, c.summary),
              h("span.meta", {}, `${short(c.id)} · ${c.author} · ${when(c.authored_at)}`),
            ),
          )
        : h("li.empty", {}, `No commits yet on ${changes.branch}.`),
    );
    // A diff shown stays shown, as it is now.
    for (const path of [...this.open]) {
      if (!changes.files.some((f) => f.path === path)) this.open.delete(path);
    }
  }

  /** One file: a button that shows (or hides) its diff under it. */
  file(file, i) {
    const diffId = `diff-${i}`;
    const diff = h("div.file-diff", { id: diffId, hidden: true });
    const from = file.old_path ? h("span.from", {}, ` from ${file.old_path}`) : null;
    const lines = file.binary
      ? h("span.lines", {}, "binary")
      : h("span.lines", {}, h("span.added", {}, `+${file.added}`), " ", h("span.removed", {}, `−${file.removed}`));
    const button = h(
      "button.file",
      { type: "button", "aria-expanded": "false", "aria-controls": diffId },
      h("span.path", {}, file.path),
      from,
      " ",
      h(`span.file-status.${file.status}`, {}, STATUS_WORDS[file.status] ?? file.status),
      " ",
      lines,
    );
    const li = h("li.changed-file", { dataset: { path: file.path } }, button, diff);
    const toggle = (shown) => {
      button.setAttribute("aria-expanded", String(shown));
      diff.hidden = !shown;
      if (shown) this.open.add(file.path);
      else this.open.delete(file.path);
      if (shown) this.loadDiff(file, diff);
    };
    button.addEventListener("click", () => toggle(diff.hidden));
    if (this.open.has(file.path)) toggle(true);
    return li;
  }

  async loadDiff(file, el) {
    fill(el, h("p.note", {}, "Loading the diff…"));
    try {
      const got = await api(
        "GET",
        `/api/v1/conversations/${this.id}/changes/diff?path=${encodeURIComponent(file.path)}`,
      );
      const pre = unifiedDiff(got.diff || "");
      // Long lines scroll sideways, within the diff (by keyboard too).
      pre.setAttribute("tabindex", "0");
      pre.setAttribute("role", "region");
      pre.setAttribute("aria-label", `Diff of ${file.path}`);
      fill(
        el,
        got.diff ? pre : h("p.note", {}, "No lines to show."),
        got.truncated ? h("p.note", {}, "The diff is cut here: it is longer than a page.") : null,
      );
    } catch (e) {
      fill(el, h("p.error", {}, this.problemText(e)));
    }
  }

  /** Shows the confirmation of `what` (commit, land or discard) in place of the buttons. */
  ask(what) {
    this.error.hidden = true;
    this.done.hidden = true;
    const head = h("h2", { id: "confirm-head" });
    const cancel = h("button", { type: "button", onclick: () => this.dismiss() }, "Cancel");
    let controls;
    let confirm;
    let send;
    if (what === "commit") {
      head.textContent = "Commit the work";
      const message = h("textarea", { id: "commit-message", name: "message", rows: 3, required: true, maxlength: 10000 });
      controls = [
        h("p.hint", {}, `Everything in the worktree is committed on ${this.changes?.branch ?? "the branch"}, with you as its author.`),
        h("label", { for: "commit-message" }, "Commit message"),
        message,
      ];
      confirm = h("button.primary", { type: "submit" }, "Commit");
      send = () => {
        if (!message.value.trim()) {
          this.showProblem("Write a commit message.");
          message.focus();
          return null;
        }
        return api("POST", `/api/v1/conversations/${this.id}/changes/commit`, { message: message.value });
      };
    } else if (what === "land") {
      const base = this.conversation?.worktree?.base ?? "the base";
      head.textContent = `Land ${this.changes?.branch ?? "the branch"} on ${base}`;
      const radios = STRATEGIES.map((s, i) =>
        h("input", { type: "radio", id: `strategy-${s.value}`, name: "strategy", value: s.value, checked: i === 0 }),
      );
      const message = h("input", { id: "land-message", name: "message", maxlength: 10000 });
      controls = [
        h(
          "fieldset.choices",
          {},
          h("legend", {}, "How"),
          radios.map((radio, i) =>
            h(
              "div.check",
              {},
              radio,
              h("label", { for: radio.id }, STRATEGIES[i].title, h("span.hint", {}, ` (${STRATEGIES[i].hint})`)),
            ),
          ),
        ),
        h("label", { for: "land-message" }, "Message (optional)"),
        message,
      ];
      confirm = h("button.primary", { type: "submit" }, "Land");
      send = () => {
        const body = { strategy: radios.find((r) => r.checked)?.value ?? "merge" };
        if (message.value.trim()) body.message = message.value;
        return api("POST", `/api/v1/conversations/${this.id}/changes/land`, body);
      };
    } else {
      head.textContent = "Discard the uncommitted changes?";
      const n = this.changes?.uncommitted ?? 0;
      controls = [
        h(
          "p",
          {},
          n
            ? `${plural(n, "file")} not committed will be thrown away. Commits stay. This cannot be undone.`
            : "What is not committed will be thrown away. Commits stay. This cannot be undone.",
        ),
      ];
      confirm = h("button.danger", { type: "submit" }, "Discard");
      send = () => api("POST", `/api/v1/conversations/${this.id}/changes/discard`);
    }
    this.panel.onsubmit = async (event) => {
      event.preventDefault();
      this.error.hidden = true;
      const call = send();
      if (!call) return;
      confirm.disabled = cancel.disabled = true;
      try {
        const result = await call;
        this.dismiss();
        this.said(what, result);
        this.reload();
      } catch (e) {
        this.say(e);
      } finally {
        confirm.disabled = cancel.disabled = false;
      }
    };
    fill(this.panel, head, controls, h("div.options", {}, confirm, cancel));
    this.actions.hidden = true;
    this.panel.hidden = false;
    (this.panel.querySelector("textarea, input:checked, input") ?? confirm).focus();
  }

  /** Closes the confirmation: the buttons are back. */
  dismiss() {
    this.panel.hidden = true;
    this.panel.replaceChildren();
    this.actions.hidden = false;
    (this.actions.querySelector("button:not([hidden])") ?? this.back).focus({ preventScroll: true });
  }

  /** What a commit, land or discard did, in words. */
  said(what, result) {
    let text;
    if (what === "commit") {
      text = `Committed ${short(result.commit?.id)}: ${result.commit?.summary ?? ""}`;
    } else if (what === "land") {
      const where = result.working_tree ? ` (checked out in ${result.working_tree})` : "";
      text = `Landed on ${result.base} (${result.strategy}): ${result.base} is now at ${short(result.to)}${where}.`;
    } else {
      text = `Discarded: the worktree is back at ${short(result.head)}.`;
    }
    this.done.textContent = text;
    this.done.hidden = false;
  }

  showProblem(text, files = []) {
    fill(
      this.error,
      h("p", {}, text),
      files.length ? h("ul.problem-files", { "aria-label": "Files" }, files.map((f) => h("li", {}, h("code", {}, f)))) : null,
    );
    this.error.hidden = false;
  }

  /** The gateway's problem: its detail, and the files it names (uncommitted ones, conflicts). */
  say(e) {
    const files = e instanceof ApiError && Array.isArray(e.problem?.files) ? e.problem.files.map(String) : [];
    this.showProblem(this.problemText(e), files);
  }
}
