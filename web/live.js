// Live updates that survive a dropped network: a WebSocket that comes back
// by itself, and (for a conversation) resumes after the last event it
// handed out, so nothing is missed and nothing comes twice.

import { api, socket } from "./api.js";

const state = new Set();

/** Listeners for the page's connection indicator. */
export const connection = {
  listeners: new Set(),
  set(live, up) {
    if (up) state.delete(live);
    else state.add(live);
    for (const listener of this.listeners) listener(state.size === 0);
  },
};

/** Why a socket could not open, asked of the API: it sends the page to sign in if the token is the reason. */
function askWhy() {
  api("GET", "/api/v1/agents").catch(() => {});
}

export class Live {
  /**
   * path(after) gives the URL to open; onFrame gets every parsed frame;
   * onDenied is called when the gateway closes for a revoked token (1008).
   * With `resumable`, frames with a `seq` at or below the last one seen are
   * dropped and the next connection asks only for what follows. `connect`
   * opens the socket (by default with the page's token); `onRefused` is
   * called when a connection could not be opened at all (a browser does not
   * say why: by default the API is asked, which sends the page to sign in
   * if the token is the reason); it is tried again either way, unless
   * stopped meanwhile.
   */
  constructor({ path, onFrame, onDenied = () => {}, resumable = false, connect = socket, onRefused = askWhy }) {
    this.path = path;
    this.onFrame = onFrame;
    this.onDenied = onDenied;
    this.resumable = resumable;
    this.connect = connect;
    this.onRefused = onRefused;
    this.after = 0;
    this.ws = null;
    this.stopped = false;
    this.delay = 250;
    this.timer = null;
    this.wake = () => {
      if (!this.stopped && (!this.ws || this.ws.readyState > WebSocket.OPEN)) this.open();
      else this.presence();
    };
    window.addEventListener("online", this.wake);
    document.addEventListener("visibilitychange", this.wake);
    this.open();
  }

  open() {
    clearTimeout(this.timer);
    this.timer = null;
    if (this.ws) {
      this.ws.onclose = null;
      this.ws.close();
    }
    const ws = this.connect(this.path(this.after));
    this.ws = ws;
    let opened = false;
    ws.onopen = () => {
      opened = true;
      this.presence();
      this.delay = 250;
      connection.set(this, true);
    };
    ws.onmessage = (message) => {
      let frame;
      try {
        frame = JSON.parse(message.data);
      } catch {
        return;
      }
      if (this.resumable && typeof frame.seq === "number") {
        if (frame.seq <= this.after) return;
        this.after = frame.seq;
      }
      this.onFrame(frame);
    };
    ws.onclose = (event) => {
      if (this.ws !== ws || this.stopped) return;
      connection.set(this, false);
      if (event.code === 1008) {
        this.stop();
        this.onDenied();
        return;
      }
      if (!opened) this.onRefused();
      this.timer = setTimeout(() => this.open(), this.delay);
      this.delay = Math.min(this.delay * 2, 5000);
    };
  }

  /**
   * Tells the gateway whether a person sees this page: while one does, the
   * gateway notifies nobody of what it shows (notifications reach the
   * person once they look away).
   */
  presence() {
    if (this.ws?.readyState !== WebSocket.OPEN) return;
    this.ws.send(JSON.stringify({ type: "presence", visible: document.visibilityState === "visible" }));
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
    window.removeEventListener("online", this.wake);
    document.removeEventListener("visibilitychange", this.wake);
    connection.set(this, true);
    if (this.ws) {
      this.ws.onclose = null;
      this.ws.close();
    }
  }
}
