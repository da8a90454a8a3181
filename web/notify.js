// Notifications on this device, and where else they go: the settings view.
// "Notify me on this device" registers the service worker (web/sw.js),
// subscribes with the gateway's VAPID key and makes a web_push target;
// the list shows every target of the signed-in user with its last
// delivery, and tests and deletes them.

import { api, ApiError } from "./api.js";
import { h, fill, when } from "./dom.js";

/** The service worker, registered once per page (scope: the whole app). */
export function serviceWorker() {
  if (!("serviceWorker" in navigator)) return Promise.resolve(null);
  return navigator.serviceWorker.register("/sw.js", { scope: "/" }).catch(() => null);
}

/** The VAPID key as PushManager.subscribe wants it. */
function keyBytes(base64url) {
  const base64 = base64url.replace(/-/g, "+").replace(/_/g, "/");
  const raw = atob(base64 + "=".repeat((4 - (base64.length % 4)) % 4));
  return Uint8Array.from(raw, (c) => c.charCodeAt(0));
}

/** Subscribes this browser and makes it a target; the target made. */
export async function notifyThisDevice() {
  if (!("serviceWorker" in navigator) || !("PushManager" in window)) {
    throw new Error("This browser cannot receive notifications (no Push API here).");
  }
  if ("Notification" in window && Notification.permission !== "granted") {
    const answer = await Notification.requestPermission();
    if (answer !== "granted") throw new Error("Notifications are blocked for this site.");
  }
  await serviceWorker();
  const registration = await navigator.serviceWorker.ready;
  const { public_key } = await api("GET", "/api/v1/notifications/vapid-public-key");
  let subscription = await registration.pushManager.getSubscription();
  if (!subscription) {
    subscription = await registration.pushManager.subscribe({
      userVisibleOnly: true,
      applicationServerKey: keyBytes(public_key),
    });
  }
  const { endpoint, keys } = subscription.toJSON();
  return api("POST", "/api/v1/notification-targets", {
    kind: "web_push",
    label: deviceLabel(),
    subscription: { endpoint, keys: { p256dh: keys.p256dh, auth: keys.auth } },
  });
}

function deviceLabel() {
  const ua = navigator.userAgent;
  const os = /Android/.test(ua) ? "Android" : /iPhone|iPad/.test(ua) ? "iOS" : /Mac/.test(ua) ? "Mac" : /Windows/.test(ua) ? "Windows" : /Linux/.test(ua) ? "Linux" : "browser";
  return `This device (${os})`;
}

const KINDS = { web_push: "Browser", ntfy: "ntfy", webhook: "Webhook", fcm: "App (FCM)" };

function lastDelivery(target) {
  if (target.gone) return "Gone: the service no longer knows this device";
  const last = target.last_delivery;
  if (!last) return "Nothing sent yet";
  return `Last: ${last.outcome}${last.detail ? ` (${last.detail})` : ""}, ${when(last.at)}`;
}

/** The settings view: notifications on this device, and every target. */
export class SettingsView {
  constructor(main, problemText) {
    document.title = "Settings · acp-gateway";
    this.problemText = problemText;
    this.status = h("p.status", { role: "status" });
    this.list = h("ul.targets", { "aria-label": "Notification targets" });
    const enable = h(
      "button.primary",
      {
        type: "button",
        onclick: async () => {
          enable.disabled = true;
          this.say("");
          try {
            await notifyThisDevice();
            this.say("This device gets notifications.");
            await this.load();
          } catch (e) {
            this.say(e instanceof ApiError ? problemText(e) : e.message);
          } finally {
            enable.disabled = false;
          }
        },
      },
      "Notify me on this device",
    );
    fill(
      main,
      h("h1", {}, "Settings"),
      h(
        "section.notifications",
        { "aria-labelledby": "notifications-heading" },
        h("h2", { id: "notifications-heading" }, "Notifications"),
        h("p.hint", {}, "When an agent waits for an answer and no page of yours is open, a notification reaches you, with the answers one tap away."),
        enable,
        this.status,
        this.list,
      ),
    );
    this.load();
  }

  stop() {}

  say(text) {
    this.status.textContent = text;
  }

  async load() {
    try {
      const { items } = await api("GET", "/api/v1/notification-targets");
      fill(this.list, items.length ? items.map((t) => this.row(t)) : h("li.empty", {}, "No notification targets yet."));
    } catch (e) {
      fill(this.list, h("li.error", { role: "alert" }, this.problemText(e)));
    }
  }

  row(target) {
    const name = target.label || KINDS[target.kind] || target.kind;
    const outcome = h("span.meta", {}, `${KINDS[target.kind] ?? target.kind} · ${lastDelivery(target)}`);
    const test = h(
      "button.quiet",
      {
        type: "button",
        "aria-label": `Test ${name}`,
        disabled: target.gone,
        onclick: async () => {
          test.disabled = true;
          try {
            const result = await api("POST", `/api/v1/notification-targets/${target.id}/test`);
            outcome.textContent = `${KINDS[target.kind] ?? target.kind} · Test: ${result.outcome ?? "sent"}${result.detail ? ` (${result.detail})` : ""}`;
          } catch (e) {
            outcome.textContent = this.problemText(e);
          } finally {
            test.disabled = false;
          }
        },
      },
      "Test",
    );
    const remove = h(
      "button.quiet.danger",
      {
        type: "button",
        "aria-label": `Delete ${name}`,
        onclick: async () => {
          remove.disabled = true;
          try {
            await api("DELETE", `/api/v1/notification-targets/${target.id}`);
            item.remove();
          } catch (e) {
            remove.disabled = false;
            outcome.textContent = this.problemText(e);
          }
        },
      },
      "Delete",
    );
    const item = h(
      "li.target",
      { dataset: { id: target.id, kind: target.kind } },
      h("strong", {}, name),
      outcome,
      h("span.actions", {}, test, remove),
    );
    return item;
  }
}
