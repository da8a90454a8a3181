// An agent's question to a person (ACP elicitation) as a card: its message
// and, in form mode, a form built from the schema it asked with (checked
// here first, the gateway's 422 shown on the field it names); in URL mode
// the link, its host shown plainly. Answered through
// POST /api/v1/questions/{id}/respond; an answered card shows the answer.

import { api, ApiError } from "./api.js";
import { h, fill } from "./dom.js";

/** The choices of a string field (or a multi-select's items): [{value, title}], or null. */
function choicesOf(schema) {
  if (Array.isArray(schema?.enum)) {
    return schema.enum.filter((v) => typeof v === "string").map((v) => ({ value: v, title: v }));
  }
  const titled = Array.isArray(schema?.oneOf) ? schema.oneOf : Array.isArray(schema?.anyOf) ? schema.anyOf : null;
  if (!titled) return null;
  return titled
    .filter((o) => typeof o?.const === "string")
    .map((o) => ({ value: o.const, title: typeof o.title === "string" ? o.title : o.const }));
}

/** At most this many choices are radio buttons; more are a select. */
const RADIO_MAX = 4;

/** The input type of a string field, by its format. */
const INPUT_TYPES = { email: "email", uri: "url", date: "date", "date-time": "datetime-local" };

/** The fields of a form question: [{name, schema, required, title}], in the schema's order. */
function fieldsOf(question) {
  const schema = question.requested_schema ?? {};
  const required = new Set(Array.isArray(schema.required) ? schema.required : []);
  return Object.entries(schema.properties ?? {}).map(([name, property]) => ({
    name,
    schema: property ?? {},
    required: required.has(name),
    title: typeof property?.title === "string" && property.title ? property.title : name,
  }));
}

/**
 * One field of the form: its label (required ones marked), its control,
 * its description and the place for what is wrong with it. `read()` gives
 * the value to send (undefined: nothing), `check()` what is wrong, if
 * anything, and `say(text)` shows that.
 */
function formField(question, field, index) {
  const id = `q-${question.id}-${index}`;
  const hintId = `${id}-hint`;
  const errorId = `${id}-error`;
  const s = field.schema;
  const mark = field.required ? h("span.required", {}, " (required)") : null;
  const hint = typeof s.description === "string" && s.description ? h("p.hint", { id: hintId }, s.description) : null;
  const error = h("p.field-error", { id: errorId, hidden: true });
  const describedBy = [hint ? hintId : null, errorId].filter(Boolean).join(" ");
  const choices = s.type === "string" ? choicesOf(s) : null;
  let controls = [];
  let read;
  let body;
  if (s.type === "boolean") {
    const box = h("input", { type: "checkbox", id, name: field.name, "aria-describedby": describedBy });
    box.checked = s.default === true;
    controls = [box];
    read = () => box.checked;
    body = h("div.check", {}, box, h("label", { for: id }, field.title, mark));
  } else if (s.type === "array") {
    const items = choicesOf(s.items) ?? [];
    const chosen = new Set(Array.isArray(s.default) ? s.default : []);
    controls = items.map((choice, i) => {
      const box = h("input", { type: "checkbox", id: `${id}-${i}`, name: field.name, value: choice.value });
      box.checked = chosen.has(choice.value);
      return box;
    });
    read = () => controls.filter((c) => c.checked).map((c) => c.value);
    body = h(
      "fieldset.choices",
      { "aria-describedby": describedBy },
      h("legend", {}, field.title, mark),
      controls.map((box, i) => h("div.check", {}, box, h("label", { for: box.id }, items[i].title))),
    );
  } else if (choices && choices.length <= RADIO_MAX) {
    controls = choices.map((choice, i) => {
      const radio = h("input", { type: "radio", id: `${id}-${i}`, name: id, value: choice.value });
      radio.checked = s.default === choice.value;
      return radio;
    });
    read = () => controls.find((c) => c.checked)?.value;
    body = h(
      "fieldset.choices",
      { "aria-describedby": describedBy, role: "radiogroup" },
      h("legend", {}, field.title, mark),
      controls.map((radio, i) => h("div.check", {}, radio, h("label", { for: radio.id }, choices[i].title))),
    );
  } else if (choices) {
    const select = h(
      "select",
      { id, name: field.name, "aria-describedby": describedBy, required: field.required },
      h("option", { value: "" }, "Choose…"),
      choices.map((c) => h("option", { value: c.value, selected: s.default === c.value }, c.title)),
    );
    controls = [select];
    read = () => select.value || undefined;
    body = [h("label", { for: id }, field.title, mark), select];
  } else {
    const numeric = s.type === "number" || s.type === "integer";
    const input = h("input", {
      id,
      name: field.name,
      type: numeric ? "number" : INPUT_TYPES[s.format] ?? "text",
      required: field.required,
      min: numeric ? s.minimum : undefined,
      max: numeric ? s.maximum : undefined,
      step: s.type === "integer" ? 1 : numeric ? "any" : undefined,
      inputmode: s.type === "integer" ? "numeric" : undefined,
      minlength: numeric ? undefined : s.minLength,
      maxlength: numeric ? undefined : s.maxLength,
      autocomplete: s.format === "email" ? "email" : "off",
      "aria-describedby": describedBy,
    });
    if (s.default !== undefined && s.default !== null) {
      input.value = s.format === "date-time" ? localTime(String(s.default)) : String(s.default);
    }
    controls = [input];
    read = () => {
      const raw = input.value;
      if (raw.trim() === "") return undefined;
      if (numeric) return Number(raw);
      if (s.format === "date-time") {
        const at = new Date(raw);
        return Number.isNaN(at.getTime()) ? raw : at.toISOString();
      }
      return raw;
    };
    body = [h("label", { for: id }, field.title, mark), input];
  }
  const check = () => {
    // A number field whose text is not a number reads as empty: say so.
    const bad = controls.find((c) => c.validity?.badInput);
    if (bad) return "Enter a number";
    return wrongWith(field, read(), controls);
  };
  const say = (text) => {
    error.textContent = text ?? "";
    error.hidden = !text;
    for (const c of controls) {
      if (text) c.setAttribute("aria-invalid", "true");
      else c.removeAttribute("aria-invalid");
    }
  };
  for (const c of controls) c.addEventListener(c.type === "checkbox" || c.type === "radio" ? "change" : "input", () => say(null));
  const el = h("div.field", { dataset: { field: field.name } }, body, hint, error);
  return { field, el, read, check, say, focus: () => controls[0]?.focus() };
}

/** "2026-12-02T10:00:00Z" as a datetime-local input's value (the browser's time zone). */
function localTime(text) {
  const at = new Date(text);
  if (Number.isNaN(at.getTime())) return "";
  const pad = (n) => String(n).padStart(2, "0");
  return `${at.getFullYear()}-${pad(at.getMonth() + 1)}-${pad(at.getDate())}T${pad(at.getHours())}:${pad(at.getMinutes())}`;
}

/**
 * What is wrong with `value` for `field`, in words, or null. The gateway
 * checks again (its word is final: a 422 shows on the field it names).
 */
function wrongWith(field, value, controls) {
  const s = field.schema;
  const empty = value === undefined || (Array.isArray(value) && value.length === 0 && field.required);
  if (empty) return field.required ? "Required" : null;
  if (s.type === "number" || s.type === "integer") {
    if (!Number.isFinite(value)) return "Enter a number";
    if (s.type === "integer" && !Number.isInteger(value)) return "Must be a whole number";
    if (typeof s.minimum === "number" && value < s.minimum) return `Must be at least ${s.minimum}`;
    if (typeof s.maximum === "number" && value > s.maximum) return `Must be at most ${s.maximum}`;
    return null;
  }
  if (s.type === "array") {
    if (typeof s.minItems === "number" && value.length < s.minItems) return `Choose at least ${s.minItems}`;
    if (typeof s.maxItems === "number" && value.length > s.maxItems) return `Choose at most ${s.maxItems}`;
    return null;
  }
  if (s.type === "string") {
    const length = [...value].length;
    if (typeof s.minLength === "number" && length < s.minLength) return `At least ${s.minLength} characters`;
    if (typeof s.maxLength === "number" && length > s.maxLength) return `At most ${s.maxLength} characters`;
    if (controls[0]?.validity?.typeMismatch) {
      return s.format === "email" ? "Enter an email address" : "Enter a full address (https://…)";
    }
    if (typeof s.pattern === "string") {
      // As written (Unicode), else as older patterns are; a pattern this
      // browser cannot read is left to the gateway.
      let re = null;
      for (const flags of ["u", ""]) {
        try {
          re = new RegExp(s.pattern, flags);
          break;
        } catch {
          re = null;
        }
      }
      if (re && !re.test(value)) return `Must match the pattern ${s.pattern}`;
    }
  }
  return null;
}

/** The words for a question's status. */
const STATUS_WORDS = {
  accepted: "Accepted",
  declined: "Declined",
  cancelled: "Cancelled",
  expired: "Expired",
  timed_out: "Timed out",
};

/** How a question was answered, in words: "Accepted by user:ann". */
export function answerText(question) {
  const how = STATUS_WORDS[question.status] ?? question.status;
  const by = question.answer?.decided_by ? ` by ${question.answer.decided_by}` : "";
  return `${how}${by}`;
}

/** A value of the answer's content as a person reads it (a choice by its title). */
function shownValue(schema, value) {
  if (typeof value === "boolean") return value ? "Yes" : "No";
  const titles = choicesOf(schema?.type === "array" ? schema.items : schema) ?? [];
  const titled = (v) => titles.find((c) => c.value === v)?.title ?? String(v);
  if (Array.isArray(value)) return value.length ? value.map(titled).join(", ") : "None";
  return titled(value);
}

/** The content of an answer as a list of field: value. */
function contentList(question) {
  const content = question.answer?.content;
  if (!content || typeof content !== "object") return null;
  const fields = new Map(fieldsOf(question).map((f) => [f.name, f]));
  return h(
    "dl.answer",
    { "aria-label": "Answer" },
    Object.entries(content).map(([name, value]) => [
      h("dt", {}, fields.get(name)?.title ?? name),
      h("dd", {}, shownValue(fields.get(name)?.schema, value)),
    ]),
  );
}

/** The host of a URL, or null where it is not one. */
function hostOf(url) {
  try {
    return new URL(url).host;
  } catch {
    return null;
  }
}

/**
 * A question as a card. A pending one can be answered from it; any other
 * shows its answer. `conversation` (a title) links the card to its
 * conversation (the inbox).
 */
export function questionCard(question, { conversation } = {}) {
  const card = h(
    "article.card.question",
    { dataset: { questionId: question.id }, "aria-label": `Question: ${question.message}` },
    conversation
      ? h("p.where", {}, h("a", { href: `#/c/${question.conversation_id}` }, conversation))
      : null,
    h("p.asks", {}, "The agent asks"),
    h("h2", {}, question.message),
  );
  if (question.status !== "pending") {
    settleQuestion(card, question);
    return card;
  }
  const error = h("p.error", { role: "alert", hidden: true });
  const send = (body, fields) => respond(card, question, body, fields, error);
  if (question.mode === "url") {
    const host = hostOf(question.url);
    card.append(
      h(
        "div.link",
        {},
        h("a.url", { href: question.url, target: "_blank", rel: "noopener noreferrer" }, "Open the page"),
        host ? h("p.host", {}, "On ", h("strong", {}, host)) : null,
        h("p.url-text", {}, question.url),
      ),
      h(
        "div.options",
        {},
        h("button.primary", { type: "button", onclick: () => send({ action: "accept" }) }, "I opened it"),
        h("button.danger", { type: "button", onclick: () => send({ action: "decline" }) }, "Decline"),
      ),
      error,
    );
    return card;
  }
  const fields = fieldsOf(question).map((field, i) => formField(question, field, i));
  const submit = (event) => {
    event.preventDefault();
    error.hidden = true;
    let first = null;
    const content = {};
    for (const f of fields) {
      const wrong = f.check();
      f.say(wrong);
      if (wrong && !first) first = f;
      const value = f.read();
      if (value !== undefined) content[f.field.name] = value;
    }
    if (first) {
      first.focus();
      return;
    }
    send({ action: "accept", content }, fields);
  };
  card.append(
    h(
      "form.question-form",
      { novalidate: true, onsubmit: submit },
      fields.map((f) => f.el),
      error,
      h(
        "div.options",
        {},
        h("button.primary", { type: "submit" }, "Submit"),
        h("button.danger", { type: "button", onclick: () => send({ action: "decline" }, fields) }, "Decline"),
        h("button", { type: "button", onclick: () => send({ action: "cancel" }, fields) }, "Cancel"),
      ),
    ),
  );
  return card;
}

/**
 * Sends an answer from a card; the card says what happened. A 422 whose
 * detail names fields (`content.<name> …`) shows each on its field.
 */
async function respond(card, question, body, fields, error) {
  const buttons = card.querySelectorAll("button");
  error.hidden = true;
  for (const button of buttons) button.disabled = true;
  try {
    const answered = await api("POST", `/api/v1/questions/${question.id}/respond`, body);
    settleQuestion(card, answered);
  } catch (e) {
    if (e instanceof ApiError && e.code === "already_resolved" && e.problem?.question) {
      settleQuestion(card, e.problem.question);
      return;
    }
    if (e instanceof ApiError && (e.status === 409 || e.status === 404)) {
      settleQuestion(card, null);
      return;
    }
    for (const button of buttons) button.disabled = false;
    const rest = e instanceof ApiError && e.status === 422 ? sayOnFields(e.message, fields ?? []) : [e.message];
    if (rest.length) {
      error.textContent = rest.join("; ");
      error.hidden = false;
    }
  }
}

/**
 * Puts each part of a 422's detail that names a field of the form on that
 * field (its first such field focused); the parts that name none.
 */
function sayOnFields(detail, fields) {
  const rest = [];
  let first = null;
  // The longest name first: "content.a b" is the field "a b", not "a".
  const byName = [...fields].sort((a, b) => b.field.name.length - a.field.name.length);
  for (const part of String(detail ?? "").split("; ")) {
    const f = byName.find((f) => part.startsWith(`content.${f.field.name} `));
    if (!f) {
      rest.push(part);
      continue;
    }
    const why = part.slice(`content.${f.field.name} `.length);
    f.say(why.charAt(0).toUpperCase() + why.slice(1));
    first ??= f;
  }
  first?.focus();
  return rest;
}

/**
 * A card whose question is answered (null: elsewhere, not known how): its
 * form or link goes, the answer shows, with its content.
 */
export function settleQuestion(card, question) {
  for (const detail of card.querySelectorAll("form, .options, .link, .error")) detail.remove();
  card.classList.add("resolved");
  let note = card.querySelector(".decision");
  if (!note) {
    note = h("p.decision", { role: "status" });
    card.append(note);
  }
  note.textContent = question ? `Answered: ${answerText(question)}` : "Answered elsewhere";
  card.querySelector("dl.answer")?.remove();
  const content = question ? contentList(question) : null;
  if (content) note.after(content);
  let url = card.querySelector(".url-answered");
  if (question?.mode === "url" && question.url && !url) {
    url = h("p.url-answered.meta", {}, question.url);
    note.before(url);
  }
  if (question?.answer?.reason && question.answer.decided_by === "system") {
    const why = card.querySelector(".decision-reason") ?? h("p.decision-reason");
    fill(why, h("span.label", {}, "Why: "), question.answer.reason);
    (content ?? note).after(why);
  }
}
