#!/usr/bin/env node
// Drives Debian's Chromium (headless, through playwright-core) for the web
// client's end-to-end tests. The Rust test says what to do, one JSON command
// per line on stdin; each gets one JSON line on stdout:
// {"ok": true, "value": ...} or {"ok": false, "error": "..."}.
//
// The browser reaches the gateway through a TCP proxy of this script's own,
// so a test can drop the network ("cut": every connection closed, new ones
// refused) and bring it back ("restore").
//
// Environment: GATEWAY (e.g. http://127.0.0.1:8080), CHROMIUM (default
// /usr/bin/chromium), HTTPS=1 where the gateway serves TLS. Every wait is bounded (WAIT_MS, default 20000).
//
// Commands ({"do": ..., ...}):
//   goto {path}                 opens the proxy's origin + path
//   click {role, name}          clicks the element with that role and exact accessible name
//   fill {label, value}         types into the field with that label
//   press {key}                 presses a key on the focused element
//   focus {label}               focuses the field with that label
//   select {label, value}       picks an option
//   wait {selector, text?, state?}  waits for an element (with the text, or gone: state "detached")
//   wait_text {selector, text}  waits until the element's whole text is exactly `text`
//   texts {selector}            the text of every match
//   names {selector, role}      the accessible names of the elements of `role` inside `selector`
//   tags {selector}             the tag names of every match
//   attrs {selector, name}      the value of attribute `name` of every match (null where absent)
//   values {selector}           the current value of every matching field
//   upload {label, paths}       picks these files in the file field with that label
//   axe                         runs axe-core (npm axe-core) on the page: its violations
//                               [{id, impact, help, nodes: [target…]}]
//   global {name}               the page's window[name] (null where unset): a flag hostile
//                               content would set if it ran
//   cut / restore               the network
//   hold_events / release_events  the page's WebSockets get nothing from the gateway (what
//                               comes is kept) until released (then all of it, in order);
//                               its HTTP requests go on
//   width                       the page's {client, scroll} width (scroll > client: it scrolls sideways)
//   screenshot {path, full?}    the whole page (or, with full: false, the screen), as PNG
//   errors                      what the page logged as errors, and its uncaught exceptions
//   upstream {url}              the gateway new connections go to (GATEWAY may be left out at start)
//   stub_push {endpoint}        PushManager.subscribe answers a subscription of this endpoint with
//                               real P-256 keys (made in the page): a browser offline has no push
//                               service to subscribe with; set before goto
//   sw_ready                    waits until the page's service worker is active
//   push {data}                 delivers a push message to the service worker (DevTools)
//   notifications               the notifications the service worker shows: title, body, tag, actions
//   notification_click {action} taps an action of the first notification shown (in the worker)
//   close

import * as fs from "node:fs";
import * as net from "node:net";
import { createRequire } from "node:module";
import * as readline from "node:readline";
import { chromium } from "playwright-core";

const WAIT_MS = Number(process.env.WAIT_MS ?? 20000);
let gateway = new URL(process.env.GATEWAY ?? "http://127.0.0.1:9");

// ---------------------------------------------------------------- the proxy
const sockets = new Set();
let cut = false;
// While events are held: what the gateway sends on WebSocket connections
// (those whose first request is an upgrade), kept to be sent on release.
let holding = false;
const held = [];
const proxy = net.createServer((client) => {
  if (cut) return client.destroy();
  const upstream = net.connect(Number(gateway.port), gateway.hostname);
  for (const s of [client, upstream]) {
    sockets.add(s);
    s.on("close", () => sockets.delete(s));
    s.on("error", () => {});
  }
  let websocket = null;
  client.on("data", (chunk) => {
    websocket ??= /^GET [^\r\n]*\r\n[\s\S]*upgrade: websocket/i.test(chunk.toString("latin1"));
    upstream.write(chunk);
  });
  upstream.on("data", (chunk) => {
    if (holding && websocket) held.push([client, chunk]);
    else client.write(chunk);
  });
  client.on("close", () => upstream.destroy());
  upstream.on("close", () => client.destroy());
});
await new Promise((resolve) => proxy.listen(0, "127.0.0.1", resolve));
// With HTTPS=1 the gateway speaks TLS (through the proxy, untouched): the
// page is https:// and its sockets wss://, its test certificate accepted.
const https = process.env.HTTPS === "1";
const origin = `${https ? "https" : "http"}://127.0.0.1:${proxy.address().port}`;

// -------------------------------------------------------------- the browser
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  args: [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    // The test certificate, for the service worker's script too.
    ...(https ? ["--ignore-certificate-errors"] : []),
  ],
});
const context = await browser.newContext({
  ignoreHTTPSErrors: https,
  permissions: ["notifications"],
  viewport: { width: 375, height: 812 },
  deviceScaleFactor: 2,
  isMobile: true,
  hasTouch: true,
});
const page = await context.newPage();
page.setDefaultTimeout(WAIT_MS);
const errors = [];
page.on("pageerror", (e) => errors.push(`exception: ${e.message}`));
page.on("console", (m) => {
  // A refused connection while the network is cut is expected.
  if (m.type() === "error" && !/ERR_CONNECTION|WebSocket connection|Failed to load resource/.test(m.text())) {
    errors.push(`console: ${m.text()}`);
  }
});

// The service worker's registration, as DevTools names it (for pushes).
let cdp = null;
const registrations = new Map();
async function devtools() {
  if (cdp) return cdp;
  cdp = await context.newCDPSession(page);
  cdp.on("ServiceWorker.workerRegistrationUpdated", ({ registrations: updated }) => {
    for (const r of updated) registrations.set(r.scopeURL, r.registrationId);
  });
  await cdp.send("ServiceWorker.enable");
  return cdp;
}

async function worker() {
  const running = context.serviceWorkers();
  if (running.length) return running[0];
  return context.waitForEvent("serviceworker", { timeout: WAIT_MS });
}

const commands = {
  goto: ({ path }) => page.goto(origin + path).then(() => null),
  click: ({ role, name }) => page.getByRole(role, { name, exact: true }).click(),
  fill: ({ label, value }) => page.getByLabel(label, { exact: true }).fill(value),
  focus: ({ label }) => page.getByLabel(label, { exact: true }).focus(),
  press: ({ key }) => page.keyboard.press(key),
  select: ({ label, value }) => page.getByLabel(label, { exact: true }).selectOption(value).then(() => null),
  wait: async ({ selector, text, state }) => {
    let locator = page.locator(selector);
    if (text !== undefined) locator = locator.filter({ hasText: text });
    await locator.first().waitFor({ state: state ?? "visible" });
  },
  wait_text: async ({ selector, text }) => {
    try {
      await page.waitForFunction(
        ([selector, text]) => document.querySelector(selector)?.textContent === text,
        [selector, text],
        { timeout: WAIT_MS },
      );
    } catch {
      const now = await page.locator(selector).first().textContent().catch(() => null);
      throw new Error(`${selector} never read ${JSON.stringify(text)}; it reads ${JSON.stringify(now)}`);
    }
  },
  texts: ({ selector }) => page.locator(selector).allTextContents(),
  names: async ({ selector, role }) => {
    const found = page.locator(selector).getByRole(role);
    const names = [];
    for (const el of await found.all()) names.push((await el.textContent()).trim());
    return names;
  },
  tags: ({ selector }) => page.locator(selector).evaluateAll((els) => els.map((e) => e.tagName.toLowerCase())),
  attrs: ({ selector, name }) =>
    page.locator(selector).evaluateAll((els, name) => els.map((e) => e.getAttribute(name)), name),
  global: ({ name }) => page.evaluate((name) => window[name] ?? null, name),
  values: ({ selector }) => page.locator(selector).evaluateAll((els) => els.map((e) => e.value)),
  axe: async () => {
    // Evaluated through DevTools, which the page's CSP does not govern (a
    // script tag would be refused, as it should be).
    const source = fs.readFileSync(createRequire(import.meta.url).resolve("axe-core/axe.min.js"), "utf8");
    return page.evaluate(async (source) => {
      if (!window.axe) (0, eval)(source);
      const result = await window.axe.run(document, { resultTypes: ["violations"] });
      return result.violations.map((v) => ({
        id: v.id,
        impact: v.impact,
        help: v.help,
        nodes: v.nodes.map((n) => n.target.join(" ")),
      }));
    }, source);
  },
  upload: ({ label, paths }) => page.getByLabel(label, { exact: true }).setInputFiles(paths).then(() => null),
  cut: () => {
    cut = true;
    for (const s of sockets) s.destroy();
  },
  restore: () => {
    cut = false;
  },
  hold_events: () => {
    holding = true;
  },
  release_events: () => {
    holding = false;
    for (const [client, chunk] of held.splice(0)) if (!client.destroyed) client.write(chunk);
  },
  width: () =>
    page.evaluate(() => ({
      client: document.documentElement.clientWidth,
      scroll: document.documentElement.scrollWidth,
    })),
  screenshot: ({ path, full }) => page.screenshot({ path, fullPage: full ?? true }).then(() => null),
  errors: () => errors,
  upstream: ({ url }) => {
    gateway = new URL(url);
  },
  stub_push: ({ endpoint }) =>
    context.addInitScript((endpoint) => {
      if (!self.PushManager) return;
      let subscription = null;
      const b64 = (bytes) =>
        btoa(String.fromCharCode(...bytes)).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
      const make = async () => {
        const pair = await crypto.subtle.generateKey({ name: "ECDH", namedCurve: "P-256" }, true, ["deriveBits"]);
        const raw = new Uint8Array(await crypto.subtle.exportKey("raw", pair.publicKey));
        const auth = crypto.getRandomValues(new Uint8Array(16));
        const json = { endpoint, expirationTime: null, keys: { p256dh: b64(raw), auth: b64(auth) } };
        return { endpoint, toJSON: () => json, unsubscribe: async () => true };
      };
      PushManager.prototype.subscribe = async function (options) {
        // What the page asked with: the gateway's VAPID key, 65 bytes.
        self.__pushKeyBytes = new Uint8Array(options.applicationServerKey).length;
        subscription ??= await make();
        return subscription;
      };
      PushManager.prototype.getSubscription = async function () {
        return subscription;
      };
    }, endpoint),
  sw_ready: async () => {
    await devtools();
    await page.evaluate(() => navigator.serviceWorker.ready.then(() => null));
    await worker();
  },
  push: async ({ data }) => {
    const session = await devtools();
    const scope = `${origin}/`;
    const deadline = Date.now() + WAIT_MS;
    while (!registrations.has(scope)) {
      if (Date.now() > deadline) throw new Error(`no service worker registration for ${scope}`);
      await new Promise((resolve) => {
        session.once("ServiceWorker.workerRegistrationUpdated", resolve);
        setTimeout(resolve, Math.max(0, deadline - Date.now()));
      });
    }
    await session.send("ServiceWorker.deliverPushMessage", {
      origin,
      registrationId: registrations.get(scope),
      data: typeof data === "string" ? data : JSON.stringify(data),
    });
  },
  notifications: () =>
    page.evaluate(() =>
      navigator.serviceWorker.ready
        .then((r) => r.getNotifications())
        .then((shown) =>
          shown.map((n) => ({ title: n.title, body: n.body, tag: n.tag, actions: n.actions.map((a) => a.action) })),
        ),
    ),
  notification_click: async ({ action }) =>
    (await worker()).evaluate(async (action) => {
      const [notification] = await self.registration.getNotifications();
      if (!notification) throw new Error("no notification is shown");
      self.dispatchEvent(new NotificationEvent("notificationclick", { notification, action }));
    }, action),
  close: async () => {
    await browser.close();
    proxy.close();
  },
};

const say = (line) => process.stdout.write(JSON.stringify(line) + "\n");
say({ ok: true, value: { origin } });
for await (const line of readline.createInterface({ input: process.stdin })) {
  if (!line.trim()) continue;
  let command;
  try {
    command = JSON.parse(line);
    const run = commands[command.do];
    if (!run) throw new Error(`unknown command ${command.do}`);
    const value = await run(command);
    say({ ok: true, value: value ?? null });
  } catch (e) {
    say({ ok: false, error: `${command?.do ?? "?"}: ${e.message.split("\n")[0]}` });
  }
  if (command?.do === "close") break;
}
process.exit(0);
