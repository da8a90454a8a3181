// How ACP objects look on the page: tool calls, permission requests, diffs,
// plans, content blocks. Everything goes in as text.

import { h, fill } from "./dom.js";

/** The text of content blocks (other kinds named in brackets). */
export function contentText(blocks) {
  return (blocks ?? [])
    .map((block) => {
      if (!block) return "";
      if (block.type === "text") return block.text ?? "";
      if (block.type === "resource_link") return `[${block.name ?? block.uri}]`;
      if (block.type === "resource") return `[${block.resource?.uri ?? "resource"}]`;
      return `[${block.type}]`;
    })
    .join("");
}

/**
 * A prompt as sent: its text, each image as a thumbnail, each file by its
 * name.
 */
export function promptContent(blocks) {
  return (blocks ?? []).map((block) => {
    if (block?.type === "image" && typeof block.data === "string" && /^image\/(png|jpeg|gif|webp)$/.test(block.mimeType)) {
      return h("img.sent", { src: `data:${block.mimeType};base64,${block.data}`, alt: "An image sent" });
    }
    if (block?.type === "resource") {
      return h("span.file", {}, `File: ${decodeURIComponent(String(block.resource?.uri ?? "file").split("/").pop())}`);
    }
    return contentText([block]);
  });
}

/** The command a tool call runs, where it says one. */
export function commandOf(toolCall) {
  const command = toolCall?.rawInput?.command;
  if (Array.isArray(command)) {
    // Codex's ["/bin/sh", "-lc", "..."]: the script is what runs.
    if (command.length === 3 && /(^|\/)(ba|z)?sh$/.test(command[0]) && /^-l?c$/.test(command[1])) {
      return command[2];
    }
    return command.join(" ");
  }
  if (typeof command === "string") return command;
  return null;
}

/** Lines of a git diff's file header ("diff --git …", "index …", "new file mode …"). */
const DIFF_HEADER = /^(diff --git |index |(new|deleted) file mode |old mode |new mode |similarity index |dissimilarity index |rename (from|to) |copy (from|to) |Binary files )/;

/** A unified diff's lines, coloured by their first character (a hunk's @@ line apart). */
export function unifiedDiff(text) {
  return h(
    "pre.diff",
    {},
    text.replace(/\n$/, "").split("\n").map((line) => {
      const kind = line.startsWith("@@")
        ? "meta.hunk"
        : line.startsWith("+++") || line.startsWith("---") || DIFF_HEADER.test(line)
          ? "meta"
          : line.startsWith("+")
            ? "add"
            : line.startsWith("-")
              ? "del"
              : "ctx";
      return h(`span.${kind}`, {}, line + "\n");
    }),
  );
}

/**
 * An ACP diff ({path, oldText, newText}) as lines: what the two share at
 * the start and the end is trimmed to three lines of context.
 */
export function acpDiff(diff) {
  const lines = (text) => {
    const split = text.split("\n");
    // A last newline ends the last line; it does not start another.
    if (split.length > 1 && split[split.length - 1] === "") split.pop();
    return split;
  };
  const old = diff.oldText == null ? [] : lines(diff.oldText);
  const now = lines(diff.newText ?? "");
  let start = 0;
  while (start < old.length && start < now.length && old[start] === now[start]) start++;
  let end = 0;
  while (
    end < old.length - start &&
    end < now.length - start &&
    old[old.length - 1 - end] === now[now.length - 1 - end]
  ) {
    end++;
  }
  const shown = [`--- ${diff.oldText == null ? "/dev/null" : diff.path}`, `+++ ${diff.path}`];
  for (const line of old.slice(Math.max(0, start - 3), start)) shown.push(` ${line}`);
  for (const line of old.slice(start, old.length - end)) shown.push(`-${line}`);
  for (const line of now.slice(start, now.length - end)) shown.push(`+${line}`);
  for (const line of now.slice(now.length - end, now.length - end + 3)) shown.push(` ${line}`);
  return unifiedDiff(shown.join("\n"));
}

/** What a tool call is about: kind, locations, command, diffs, other content. */
export function toolCallBody(toolCall) {
  const parts = [];
  const facts = [];
  if (toolCall.kind) facts.push(h("span.kind", {}, toolCall.kind));
  if (toolCall.status) facts.push(h(`span.status.${toolCall.status}`, {}, toolCall.status));
  if (facts.length) parts.push(h("p.facts", {}, facts));
  const locations = (toolCall.locations ?? []).filter((l) => l?.path);
  if (locations.length) {
    parts.push(
      h(
        "ul.locations",
        { "aria-label": "Locations" },
        locations.map((l) => h("li", {}, h("code", {}, l.line ? `${l.path}:${l.line}` : l.path))),
      ),
    );
  }
  const command = commandOf(toolCall);
  if (command) parts.push(h("pre.command", { "aria-label": "Command" }, h("code", {}, `$ ${command}`)));
  for (const item of toolCall.content ?? []) {
    if (item?.type === "diff") parts.push(acpDiff(item));
    else if (item?.type === "content") parts.push(h("pre.output", {}, contentText([item.content])));
    else if (item?.type === "terminal") parts.push(h("p.note", {}, `terminal ${item.terminalId}`));
  }
  return parts;
}

/** A plan's entries. */
export function planList(entries) {
  return h(
    "ol.plan",
    { "aria-label": "Plan" },
    (entries ?? []).map((entry) =>
      h(`li.${entry.status ?? "pending"}`, {}, h("span.sr", {}, `${entry.status}: `), entry.content),
    ),
  );
}

/** How a resolved request was decided, in words. */
export function decisionText(request) {
  const decision = request.decision;
  const option = (request.options ?? []).find((o) => o.optionId === decision?.option_id);
  const how = option ? option.name : request.status;
  const by = decision?.decided_by ? ` by ${decision.decided_by}` : "";
  return `${how}${by}`;
}

/**
 * "Add a reason": a box (closed until asked for) for why the person answers
 * as they do, sent with the answer (`reason`) and told to the agent when its
 * turn ends, or at once ("Tell the agent now": `steer`).
 */
function reasonBox(request) {
  const id = `reason-${request.id}`;
  const text = h("textarea.reason", { id, name: "reason", rows: 2, maxlength: 2000, "aria-describedby": `${id}-hint` });
  const now = h("input.steer", { type: "checkbox", id: `${id}-now` });
  // What was said about an earlier try goes once the person changes it.
  const clear = () => box.closest(".card")?.querySelector(".error")?.setAttribute("hidden", "");
  text.addEventListener("input", clear);
  now.addEventListener("change", clear);
  const box = h(
    "div.why",
    { id: `${id}-box`, hidden: true },
    h("label", { for: id }, "Reason"),
    h("p.hint", { id: `${id}-hint` }, "Optional. The agent is told it when its turn ends."),
    text,
    h("div.check", {}, now, h("label", { for: `${id}-now` }, "Tell the agent now (stops its turn)")),
  );
  const toggle = h(
    "button.quiet.add-reason",
    {
      type: "button",
      "aria-expanded": "false",
      "aria-controls": `${id}-box`,
      onclick: () => {
        box.hidden = !box.hidden;
        toggle.setAttribute("aria-expanded", String(!box.hidden));
        if (!box.hidden) text.focus();
      },
    },
    "Add a reason",
  );
  return [toggle, box];
}

/**
 * A permission request as a card: what the agent wants to do and one
 * button per option the agent offered, labelled with its name exactly.
 * `answer(request, optionId)` is called on a tap.
 */
export function permissionCard(request, answer, { conversation } = {}) {
  const toolCall = request.tool_call ?? {};
  const buttons = (request.options ?? []).map((option) =>
    h(
      `button.option.${String(option.kind ?? "").startsWith("allow") ? "allow" : "reject"}`,
      {
        type: "button",
        dataset: { optionId: option.optionId },
        onclick: () => answer(request, option.optionId, card),
      },
      option.name,
    ),
  );
  const card = h(
    "article.card.permission",
    { dataset: { requestId: request.id }, "aria-label": `Permission: ${toolCall.title ?? "tool call"}` },
    conversation
      ? h("p.where", {}, h("a", { href: `#/c/${request.conversation_id}` }, conversation))
      : null,
    h("h2", {}, toolCall.title ?? "The agent asks permission"),
    toolCallBody({ ...toolCall, status: undefined }),
    reasonBox(request),
    h("div.options", {}, buttons),
    h("p.error", { role: "alert", hidden: true }),
  );
  return card;
}

/**
 * A tool call's card, made (placed with `add`) or brought up to date by
 * `update` (its `tool_call` or `tool_call_update`: what it leaves out, or
 * sends as null, stays as it was); `calls` holds each call's card and what
 * is known of it, by id.
 */
export function showToolCall(calls, update, add) {
  const known = calls.get(update.toolCallId);
  const given = Object.fromEntries(Object.entries(update).filter(([, v]) => v !== null && v !== undefined));
  const merged = { ...(known?.data ?? {}), ...given };
  const el = known?.el ?? add(h("section.card.tool"));
  fill(el, h("h2", {}, merged.title ?? "Tool call"), toolCallBody(merged));
  el.setAttribute("aria-label", `Tool: ${merged.title ?? "tool call"}`);
  el.dataset.status = merged.status ?? "";
  calls.set(update.toolCallId, { el, data: merged });
}

/**
 * A turn's plan: it replaces `shown` (the last plan) where that is still
 * on the page and of the same turn, else is placed with `add`. The list.
 */
export function showPlan(shown, entries, turn, add) {
  const list = planList(entries);
  if (shown?.isConnected && shown.dataset.turn === String(turn)) shown.replaceWith(list);
  else add(list);
  list.dataset.turn = String(turn);
  return list;
}
