// An agent's Markdown on the page, safely: parsed by marked, every piece of
// raw HTML in it escaped (shown as text, never markup), the result sanitized
// by DOMPurify (HTML profile only: no SVG, no MathML, no event handlers, no
// javascript: or data: links), links opened in a new tab without a referrer
// or an opener, code blocks given a copy button and a horizontal scroll,
// tables a scroll of their own. Both libraries are vendored (web/vendor/):
// the page's strict CSP stays.

import { Marked } from "./vendor/marked.esm.js";
import DOMPurify from "./vendor/purify.es.mjs";
import { h } from "./dom.js";

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };

function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => ESCAPES[c]);
}

const parser = new Marked({ gfm: true, breaks: false, async: false });
parser.use({
  renderer: {
    // Raw HTML (a block or inline): shown as the text it is.
    html(token) {
      return escapeHtml(token.text ?? token.raw ?? "");
    },
  },
});

/** Links that may stay: the web's, mail, and those within the page. */
const SAFE_LINK = /^(?:https?:|mailto:|#|\/(?!\/))/i;

const purifier = DOMPurify(window);
purifier.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A") {
    const href = node.getAttribute("href");
    if (href !== null && !SAFE_LINK.test(href.trim())) node.removeAttribute("href");
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
  if (node.tagName === "IMG") {
    // Only images of the page's own origin or inline ones (the CSP's img-src).
    const src = node.getAttribute("src") ?? "";
    if (!/^(?:data:image\/(?:png|gif|jpeg|webp);|\/(?!\/))/i.test(src)) node.removeAttribute("src");
  }
});

const CONFIG = {
  USE_PROFILES: { html: true },
  FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select", "option", "iframe"],
  FORBID_ATTR: ["style"],
  RETURN_DOM_FRAGMENT: true,
};

/** A code block's copy button: copies the block's text. */
function copyButton(pre) {
  const button = h(
    "button.copy.quiet",
    {
      type: "button",
      "aria-label": "Copy code",
      onclick: async () => {
        try {
          await navigator.clipboard.writeText(pre.textContent);
          button.textContent = "Copied";
        } catch {
          // No clipboard outside a secure context: the text is selected instead.
          const range = document.createRange();
          range.selectNodeContents(pre);
          const selection = window.getSelection();
          selection.removeAllRanges();
          selection.addRange(range);
          button.textContent = "Selected";
        }
      },
    },
    "Copy",
  );
  return button;
}

/** The Markdown `text` as a fragment of safe elements. */
export function markdown(text) {
  const html = parser.parse(String(text ?? "")).trim();
  const fragment = purifier.sanitize(html, CONFIG);
  for (const pre of fragment.querySelectorAll("pre")) {
    const box = h("div.code");
    pre.replaceWith(box);
    box.append(copyButton(pre), pre);
    pre.tabIndex = 0; // scrollable with the keyboard
  }
  for (const table of fragment.querySelectorAll("table")) {
    const box = h("div.table", { tabindex: "0", role: "region", "aria-label": "Table" });
    table.replaceWith(box);
    box.append(table);
  }
  return fragment;
}
