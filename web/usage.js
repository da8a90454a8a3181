// What the agents spent (GET /api/v1/usage): the totals of a span of days,
// a small chart of each day's spend (plain SVG), and the spend per agent,
// per conversation and (for an operator, who sees everyone's) per user.
// Amounts in different currencies are never added up. Everything goes in
// as text.

import { api } from "./api.js";
import { h, fill } from "./dom.js";

/** "0.75 USD", with more digits for amounts under a cent. */
export function money(amount, currency) {
  const digits = amount !== 0 && Math.abs(amount) < 0.01 ? 4 : 2;
  return `${amount.toFixed(digits)} ${currency ?? ""}`.trimEnd();
}

/** "0.75 USD · 1.20 EUR" for a Conversation's `spend` (or the usage totals); "" for none. */
export function spendText(spend) {
  if (!Array.isArray(spend)) return "";
  return spend
    .filter((s) => typeof s?.amount === "number")
    .map((s) => money(s.amount, s.currency))
    .join(" · ");
}

/** The spans offered, in days. */
const SPANS = [7, 30, 90, 365];

const DAY_MS = 86400 * 1000;

const plural = (n, one, many = `${one}s`) => `${n} ${n === 1 ? one : many}`;

/** The page `#/usage`. `problemText(error)` says a problem in words. */
export class UsageView {
  constructor(main, { problemText }) {
    this.problemText = problemText;
    this.stopped = false;
    this.loads = 0;
    document.title = "Usage · acp-gateway";
    this.span = h(
      "select",
      { id: "usage-span", name: "span", onchange: () => this.load() },
      SPANS.map((days) => h("option", { value: days, selected: days === 30 }, `Last ${days} days`)),
    );
    this.totals = h("p.summary", { id: "usage-totals", role: "status" });
    this.error = h("p.error", { role: "alert", hidden: true });
    this.chart = h("figure.usage-chart", { id: "usage-chart" });
    this.agents = h("ul.usage-rows", { id: "usage-agents", "aria-labelledby": "agents-head" });
    this.conversations = h("ul.usage-rows", { id: "usage-conversations", "aria-labelledby": "conversations-head" });
    this.users = h("ul.usage-rows", { id: "usage-users", "aria-labelledby": "users-head" });
    this.usersPart = h("section.usage-part", { hidden: true }, h("h2", { id: "users-head" }, "By user"), this.users);
    fill(
      main,
      h("h1", {}, "Usage"),
      h("p.note", {}, "What the agents reported they spent, from every usage report, per currency."),
      h("div.stack.usage-span", {}, h("label", { for: "usage-span" }, "Span"), this.span),
      this.totals,
      this.error,
      h("section.usage-part", {}, h("h2", { id: "days-head" }, "Per day"), this.chart),
      h("section.usage-part", {}, h("h2", { id: "agents-head" }, "By agent"), this.agents),
      h("section.usage-part", {}, h("h2", { id: "conversations-head" }, "By conversation"), this.conversations),
      this.usersPart,
    );
    this.load();
  }

  stop() {
    this.stopped = true;
  }

  /** The span's sums, each grouping asked at once. */
  async load() {
    const load = ++this.loads;
    const days = Number(this.span.value);
    const to = new Date();
    const from = new Date(to.getTime() - days * DAY_MS);
    const query = (group) =>
      api(
        "GET",
        `/api/v1/usage?group_by=${group}&from=${encodeURIComponent(from.toISOString())}&to=${encodeURIComponent(to.toISOString())}`,
      );
    this.error.hidden = true;
    let answers;
    try {
      answers = await Promise.all(["day", "agent", "conversation", "user"].map(query));
    } catch (e) {
      if (this.stopped || load !== this.loads) return;
      this.error.textContent = this.problemText(e);
      this.error.hidden = false;
      return;
    }
    if (this.stopped || load !== this.loads) return;
    const [byDay, byAgent, byConversation, byUser] = answers;
    const total = spendText(byDay.totals);
    const reports = byDay.rows.reduce((n, r) => n + r.reports, 0);
    fill(
      this.totals,
      total ? `Spent ${total}` : "Nothing spent",
      ` in the last ${plural(days, "day")} (${plural(reports, "usage report")}).`,
    );
    this.showChart(byDay, from, days);
    this.showRows(this.agents, byAgent.rows, (key) => key);
    this.showRows(this.conversations, byConversation.rows, (key) =>
      h("a", { href: `#/c/${key}`, dataset: { conversation: key } }, "Conversation"),
    );
    this.titles(this.conversations);
    const users = new Set(byUser.rows.map((r) => r.key));
    this.usersPart.hidden = users.size < 2;
    this.showRows(this.users, byUser.rows, (key) => key ?? "(no user)");
  }

  /**
   * One list item per group: its name, what it spent per currency, how many
   * reports in how many turns; the biggest spender first.
   */
  showRows(list, rows, name) {
    const groups = new Map();
    for (const row of rows) {
      const group = groups.get(row.key) ?? { key: row.key, spend: [], reports: 0, turns: 0 };
      if (row.currency !== null) group.spend.push({ amount: row.amount, currency: row.currency });
      group.reports += row.reports;
      group.turns = Math.max(group.turns, row.turns);
      groups.set(row.key, group);
    }
    const sorted = [...groups.values()].sort(
      (a, b) => b.spend.reduce((n, s) => n + s.amount, 0) - a.spend.reduce((n, s) => n + s.amount, 0),
    );
    if (sorted.length === 0) {
      fill(list, h("li.empty", {}, "No usage reports in this span."));
      return;
    }
    fill(
      list,
      sorted.map((g) =>
        h(
          "li.usage-row",
          { dataset: { key: g.key ?? "" } },
          h("span.name", {}, name(g.key)),
          h("span.amount", {}, spendText(g.spend) || "no cost reported"),
          h("span.meta", {}, `${plural(g.reports, "report")} · ${plural(g.turns, "turn")}`),
        ),
      ),
    );
  }

  /** The conversations' titles in place of "Conversation", looked up one by one (the first 50). */
  async titles(list) {
    for (const link of [...list.querySelectorAll("a[data-conversation]")].slice(0, 50)) {
      try {
        const c = await api("GET", `/api/v1/conversations/${link.dataset.conversation}`);
        if (this.stopped) return;
        link.textContent = c.title || `${c.agent} conversation`;
      } catch {
        // Gone, or not the caller's: it stays "Conversation".
        link.textContent = "A removed conversation";
      }
    }
  }

  /**
   * A bar per day of the span (UTC days, as the API groups them) in the
   * currency spent most; the others are named under it.
   */
  showChart(byDay, from, days) {
    const currencies = [...byDay.totals].sort((a, b) => b.amount - a.amount);
    const main = currencies[0];
    if (!main) {
      fill(this.chart, h("p.empty", {}, "Nothing spent in this span."));
      return;
    }
    const amounts = new Map();
    for (const row of byDay.rows) {
      if (row.currency === main.currency) amounts.set(row.key, row.amount);
    }
    const first = Date.UTC(from.getUTCFullYear(), from.getUTCMonth(), from.getUTCDate());
    const dayKeys = [];
    for (let i = 0; i <= days; i++) dayKeys.push(new Date(first + i * DAY_MS).toISOString().slice(0, 10));
    const highest = Math.max(...dayKeys.map((d) => amounts.get(d) ?? 0));
    const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
    const height = 60;
    svg.setAttribute("viewBox", `0 0 ${dayKeys.length * 10} ${height}`);
    svg.setAttribute("preserveAspectRatio", "none");
    svg.setAttribute("role", "img");
    const busiest = dayKeys.reduce((a, d) => ((amounts.get(d) ?? 0) > (amounts.get(a) ?? 0) ? d : a), dayKeys[0]);
    svg.setAttribute(
      "aria-label",
      `Spend per day in ${main.currency}: ${money(main.amount, main.currency)} in all, the most on ${busiest} (${money(amounts.get(busiest) ?? 0, main.currency)}).`,
    );
    dayKeys.forEach((day, i) => {
      const amount = amounts.get(day) ?? 0;
      const bar = document.createElementNS("http://www.w3.org/2000/svg", "rect");
      const tall = highest > 0 ? Math.max((amount / highest) * height, amount > 0 ? 1 : 0) : 0;
      bar.setAttribute("x", String(i * 10 + 1));
      bar.setAttribute("width", "8");
      bar.setAttribute("y", String(height - tall));
      bar.setAttribute("height", String(tall));
      bar.dataset.day = day;
      bar.dataset.amount = String(amount);
      const title = document.createElementNS("http://www.w3.org/2000/svg", "title");
      title.textContent = `${day}: ${money(amount, main.currency)}`;
      bar.append(title);
      svg.append(bar);
    });
    const others = currencies.slice(1);
    fill(
      this.chart,
      svg,
      h(
        "figcaption.meta",
        {},
        `${dayKeys[0]} to ${dayKeys[dayKeys.length - 1]}, in ${main.currency}`,
        others.length ? `; also spent: ${spendText(others)}` : "",
      ),
    );
  }
}
