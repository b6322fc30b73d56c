// Shared by the console's pages: DOM building without innerHTML (text from the model or a
// stage is only ever set as text), the served model's id, and small formatters.
"use strict";

const strata = (() => {
  // el("div", {class: "x", text: "..."}, child, ...): an element with attributes and children.
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "text") e.textContent = v;
      else if (k === "class") e.className = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children) if (c !== null && c !== undefined) e.append(c);
    return e;
  }

  // The model id from /v1/models, shown in the header and sent with each request.
  async function model() {
    try {
      const r = await fetch("/v1/models");
      const j = await r.json();
      const id = j.data && j.data[0] ? j.data[0].id : "model";
      const slot = document.getElementById("model");
      if (slot) slot.textContent = id;
      return id;
    } catch (e) {
      return "model";
    }
  }

  // The message of an OpenAI-style error body, else the HTTP status line.
  async function errorText(response) {
    let body = "";
    try {
      body = await response.text();
      const j = JSON.parse(body);
      if (j.error && j.error.message) return `${response.status}: ${j.error.message}`;
    } catch (e) {
      /* not JSON: fall through */
    }
    return `${response.status} ${response.statusText}${body ? ": " + body.slice(0, 300) : ""}`;
  }

  function fmt(x, digits) {
    if (x === null || x === undefined || !isFinite(x)) return "–";
    return Number(x).toFixed(digits);
  }

  return { el, model, errorText, fmt };
})();
