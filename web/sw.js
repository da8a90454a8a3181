// The service worker of acp-gateway's web client.
//
// - The app shell (the page and what it loads from /ui/) is kept in a cache,
//   so the app opens at once, and opens at all when the gateway cannot be
//   reached: each is answered from the cache and fetched again behind it
//   (the next opening has what the gateway serves now). The API is never
//   cached here, nor anything else.
// - It shows a notification for each push the gateway sends (Web Push,
//   end-to-end encrypted), with the request's options (a question's one-tap
//   answers) as buttons; a tap on one answers the request through its
//   single-use action URL, a tap elsewhere opens the conversation.

const SHELL_CACHE = "acp-gateway-shell-v1";
/** Everything the page loads (src/web.rs embeds the same list). */
const SHELL = [
  "/",
  "/ui/app.css",
  "/ui/app.js",
  "/ui/api.js",
  "/ui/dom.js",
  "/ui/live.js",
  "/ui/render.js",
  "/ui/question.js",
  "/ui/changes.js",
  "/ui/usage.js",
  "/ui/members.js",
  "/ui/markdown.js",
  "/ui/notify.js",
  "/ui/sharing.js",
  "/ui/shared.html",
  "/ui/shared.js",
  "/ui/manifest.webmanifest",
  "/ui/icon-192.png",
  "/ui/icon-512.png",
  "/ui/icon-maskable-512.png",
  "/ui/vendor/marked.esm.js",
  "/ui/vendor/purify.es.mjs",
];

self.addEventListener("install", (event) => {
  event.waitUntil(
    caches
      .open(SHELL_CACHE)
      .then((cache) => cache.addAll(SHELL))
      // Offline at install: the shell is cached as it is next fetched.
      .catch(() => null)
      .then(() => self.skipWaiting()),
  );
});

self.addEventListener("activate", (event) => {
  event.waitUntil(
    caches
      .keys()
      .then((keys) => Promise.all(keys.filter((k) => k !== SHELL_CACHE).map((k) => caches.delete(k))))
      .then(() => self.clients.claim()),
  );
});

/** Whether a request is for the app shell (never the API). */
function isShell(request) {
  if (request.method !== "GET") return false;
  const url = new URL(request.url);
  if (url.origin !== self.location.origin) return false;
  return url.pathname === "/" || url.pathname.startsWith("/ui/");
}

self.addEventListener("fetch", (event) => {
  if (!isShell(event.request)) return;
  const url = new URL(event.request.url);
  // The page is one document whatever its #route.
  const key = url.pathname === "/" ? "/" : url.pathname;
  event.respondWith(
    caches.open(SHELL_CACHE).then(async (cache) => {
      const cached = await cache.match(key);
      const fresh = fetch(event.request)
        .then((response) => {
          if (response.ok) cache.put(key, response.clone());
          return response;
        })
        .catch(() => null);
      if (cached) {
        event.waitUntil(fresh);
        return cached;
      }
      return (await fresh) ?? Response.error();
    }),
  );
});

/** Title and body for a notification (the gateway's JSON body). */
function headline(n) {
  const where = n.conversation?.title || n.conversation?.agent || "acp-gateway";
  const what = n.request?.command || n.request?.title || "a tool call";
  // An agent's question: what it asks (its actions, where it has any, are the answers).
  if (n.request?.kind === "question" && n.count <= 1) {
    if (n.event === "permission_waiting") return [`The agent asks: ${what}`, where];
    if (n.event === "permission_reminder") return [`Still waiting: ${what}`, `${where}: cancelled soon if not answered`];
  }
  switch (n.event) {
    case "permission_waiting":
      return n.count > 1
        ? [`${n.count} requests waiting`, where]
        : [`Waiting for you: ${what}`, where];
    case "permission_reminder":
      return [`Still waiting: ${what}`, `${where}: answered automatically soon`];
    case "turn_ended":
      return [`Turn ended in ${where}`, n.turn?.summary || n.turn?.stop_reason || ""];
    case "agent_failed":
      return [`The agent failed in ${where}`, n.turn?.stop_reason || ""];
    case "test":
      return ["acp-gateway", "Notifications reach this device."];
    default:
      return ["acp-gateway", where];
  }
}

self.addEventListener("push", (event) => {
  let n;
  try {
    n = event.data?.json();
  } catch {
    n = null;
  }
  if (!n) return;
  const [title, body] = headline(n);
  const actions = (n.actions ?? []).map((a) => ({ action: a.option_id, title: a.label }));
  event.waitUntil(
    self.registration.showNotification(title, {
      body,
      // The same conversation's next notification replaces this one.
      tag: n.conversation?.id ?? n.event,
      renotify: true,
      requireInteraction: n.event === "permission_waiting" || n.event === "permission_reminder",
      actions,
      data: { notification: n },
    }),
  );
});

self.addEventListener("notificationclick", (event) => {
  const n = event.notification.data?.notification ?? {};
  const action = (n.actions ?? []).find((a) => a.option_id === event.action);
  event.notification.close();
  if (action) {
    // One tap answers: the URL is a single-use capability for this option.
    event.waitUntil(
      fetch(action.url, { method: "POST", credentials: "omit" })
        .then(async (response) => {
          const said = response.ok
            ? `Answered: ${action.label}`
            : response.status === 409
              ? "Already answered"
              : response.status === 410
                ? "This answer has expired"
                : `Not answered (${response.status})`;
          await self.registration.showNotification("acp-gateway", {
            body: said,
            tag: `answered-${n.request?.id ?? ""}`,
            data: { answered: response.status },
          });
        })
        .catch(() =>
          self.registration.showNotification("acp-gateway", {
            body: "The gateway cannot be reached: open the app to answer.",
            tag: `answered-${n.request?.id ?? ""}`,
          }),
        ),
    );
    return;
  }
  const path = n.conversation?.id ? `/#/c/${n.conversation.id}` : "/#/";
  event.waitUntil(
    self.clients.matchAll({ type: "window", includeUncontrolled: true }).then((windows) => {
      const open = windows.find((w) => new URL(w.url).origin === self.location.origin);
      if (open) {
        open.navigate(path).catch(() => {});
        return open.focus();
      }
      return self.clients.openWindow(path);
    }),
  );
});
