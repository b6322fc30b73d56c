// The chat page: a multi-turn conversation streamed token by token through
// POST /v1/chat/completions, the same path as any OpenAI client. Conversations and settings
// live in this browser's localStorage only; the server keeps nothing between requests (its
// prefix cache makes the next turn's prompt cheap, not the page).
"use strict";

const chat = (() => {
  const { el, fmt } = strata;
  const STORE = "strata.conversations", SETTINGS = "strata.settings";
  const $ = (id) => document.getElementById(id);
  let modelId = "model";
  let modelReady = null; // the /v1/models answer: every request waits for it
  let convs = []; // [{id, title, messages: [{role, content, images, stats, error, stopped}]}]
  let current = null;
  let pending = []; // data: URLs of the images and videos attached to the next message
  let running = null; // {controller} while an answer streams

  // ---- storage ----
  function load() {
    try {
      convs = JSON.parse(localStorage.getItem(STORE) || "[]");
      const s = JSON.parse(localStorage.getItem(SETTINGS) || "{}");
      if (s.system !== undefined) $("system").value = s.system;
      if (s.maxTokens) $("max-tokens").value = s.maxTokens;
      if (s.temperature !== undefined) $("temperature").value = s.temperature;
      $("thinking").checked = !!s.thinking;
    } catch (e) {
      convs = [];
    }
    current = convs[0] || newConversation();
  }
  function save() {
    const settings = {
      system: $("system").value,
      maxTokens: $("max-tokens").value,
      temperature: $("temperature").value,
      thinking: $("thinking").checked,
    };
    try {
      localStorage.setItem(SETTINGS, JSON.stringify(settings));
      localStorage.setItem(STORE, JSON.stringify(convs));
    } catch (e) {
      // Over the browser's quota (images are large): keep the newest conversations.
      while (convs.length > 1) {
        convs.pop();
        try {
          localStorage.setItem(STORE, JSON.stringify(convs));
          return;
        } catch (e2) {
          /* still too big */
        }
      }
    }
  }
  function newConversation() {
    const c = { id: Date.now().toString(36) + Math.random().toString(36).slice(2, 6), title: "", messages: [] };
    convs.unshift(c);
    return c;
  }

  // ---- rendering ----
  // Qwen3's thinking block (<think>...</think>) apart from the answer.
  function splitThinking(text) {
    const m = /^\s*<think>([\s\S]*?)(<\/think>|$)([\s\S]*)$/.exec(text);
    if (!m) return { think: null, answer: text };
    return { think: m[1].trim(), answer: m[3].replace(/^\s+/, "") };
  }
  function statsLine(s) {
    if (!s) return null;
    const parts = [`${s.tokens} tokens`];
    if (s.tokensPerSecond !== null) parts.push(`${fmt(s.tokensPerSecond, 1)} tokens/s`);
    if (s.ttft !== null) parts.push(`first token ${fmt(s.ttft, 2)} s`);
    if (s.cached) parts.push(`${s.cached} prompt tokens cached`);
    if (s.drafted) parts.push(`${s.accepted} of ${s.drafted} draft tokens accepted`);
    return el("div", { class: "stats", text: parts.join(" · ") });
  }
  // A video is a data:video/... URL (MP4 or WebM): shown as a muted, paused <video>.
  const isVideo = (u) => u.startsWith("data:video/");
  function thumb(u, what) {
    return isVideo(u)
      ? el("video", { src: u, muted: "", preload: "metadata", title: `video ${what}` })
      : el("img", { src: u, alt: `image ${what}` });
  }
  function renderMessage(m, i, last) {
    const cls = ["msg", m.role];
    if (m.error) cls.push("error");
    const bubble = el("div", { class: "bubble" + (m.streaming ? " cursor" : "") });
    if (m.images && m.images.length)
      bubble.append(el("div", { class: "thumbs" }, ...m.images.map((u) => thumb(u, "attached"))));
    if (m.role === "assistant" && !m.error) {
      const { think, answer } = splitThinking(m.content);
      if (think !== null) bubble.append(el("div", { class: "think", text: think || "…" }));
      bubble.append(document.createTextNode(answer));
    } else {
      bubble.append(document.createTextNode(m.error || m.content));
    }
    if (m.stopped) bubble.append(el("span", { class: "stats", text: "  (stopped)" }));
    const node = el("div", { class: cls.join(" "), "data-index": i },
      el("div", { class: "who", text: m.role === "user" ? "You" : m.role === "assistant" ? modelId : m.role }),
      bubble,
      m.role === "assistant" ? statsLine(m.stats) : null);
    if (last && m.role === "assistant" && !m.streaming)
      node.append(el("div", { class: "actions" }, el("button", { type: "button", class: "regenerate", text: "Regenerate", onclick: regenerate })));
    if (m.role === "assistant") node.dataset.done = m.streaming ? "0" : "1";
    return node;
  }
  function render() {
    const box = $("messages");
    box.replaceChildren();
    if (!current.messages.length)
      box.append(el("div", { class: "empty", text: "Ask something. Answers stream from the pipeline token by token." }));
    current.messages.forEach((m, i) => box.append(renderMessage(m, i, i === current.messages.length - 1)));
    box.scrollTop = box.scrollHeight;
    const list = $("convs");
    list.replaceChildren(...convs.map((c) => el("li", {
      class: c === current ? "current" : "",
      title: c.title || "New chat",
      text: c.title || "New chat",
      onclick: () => { if (!running) { current = c; render(); } },
    })));
    $("send").classList.toggle("hidden", !!running);
    $("stop").classList.toggle("hidden", !running);
    $("pending").replaceChildren(...pending.map((u, k) => el("span", { class: "pending" },
      thumb(u, "to send"),
      el("button", { type: "button", text: "×", title: "remove", onclick: () => { pending.splice(k, 1); render(); } }))));
  }
  // Redraws only the streaming message (cheap per token).
  function renderLast() {
    const box = $("messages");
    const i = current.messages.length - 1;
    const old = box.querySelector(`.msg[data-index="${i}"]`);
    const node = renderMessage(current.messages[i], i, true);
    if (old) old.replaceWith(node);
    else box.append(node);
    box.scrollTop = box.scrollHeight;
  }

  // ---- the request ----
  function requestBody() {
    const messages = [];
    const system = $("system").value.trim();
    if (system) messages.push({ role: "system", content: system });
    for (const m of current.messages) {
      if (m.error || m.streaming) continue;
      if (m.role === "user" && m.images && m.images.length) {
        const parts = m.images.map((u) => (isVideo(u)
          ? { type: "video_url", video_url: { url: u } }
          : { type: "image_url", image_url: { url: u } }));
        parts.push({ type: "text", text: m.content });
        messages.push({ role: "user", content: parts });
      } else {
        messages.push({ role: m.role, content: m.content });
      }
    }
    const body = {
      model: modelId,
      messages,
      stream: true,
      stream_options: { include_usage: true },
      max_tokens: Math.max(1, parseInt($("max-tokens").value, 10) || 256),
      temperature: Math.max(0, parseFloat($("temperature").value) || 0),
      chat_template_kwargs: { enable_thinking: $("thinking").checked },
    };
    return body;
  }

  // Server-sent events from the response body: calls onEvent(json) per data line.
  async function readEvents(response, onEvent) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const event = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") return;
          onEvent(JSON.parse(data));
        }
      }
    }
  }

  async function answer() {
    modelId = await modelReady;
    const body = requestBody();
    const m = { role: "assistant", content: "", streaming: true, stats: null };
    current.messages.push(m);
    const controller = new AbortController();
    running = { controller };
    render();
    const t0 = performance.now();
    let tFirst = null, usage = null;
    try {
      const r = await fetch("/v1/chat/completions", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(body),
        signal: controller.signal,
      });
      if (!r.ok) throw new Error(await strata.errorText(r));
      await readEvents(r, (ev) => {
        if (ev.error) throw new Error(ev.error.message || "the server reported an error");
        if (ev.usage) usage = ev.usage;
        for (const ch of ev.choices || []) {
          const piece = ch.delta && ch.delta.content;
          if (piece) {
            if (tFirst === null) tFirst = performance.now();
            m.content += piece;
          }
        }
        renderLast();
      });
    } catch (e) {
      if (e.name === "AbortError") m.stopped = true;
      else m.error = e.message;
    }
    m.streaming = false;
    const tDone = performance.now();
    const n = usage ? usage.completion_tokens : null;
    const predicted = usage ? usage.completion_tokens_details : null; // speculative decoding
    // The decode rate after the first token; when the tokens came in one burst (a fast model,
    // a buffering proxy) the gap is too short to time, so the whole request's rate instead.
    let rate = null;
    if (n > 1 && tFirst !== null && tDone - tFirst >= 5) rate = ((n - 1) * 1000) / (tDone - tFirst);
    else if (n > 0) rate = (n * 1000) / Math.max(1, tDone - t0);
    if (!m.error)
      m.stats = {
        tokens: n !== null ? n : "?",
        ttft: tFirst !== null ? (tFirst - t0) / 1000 : null,
        tokensPerSecond: rate,
        cached: usage && usage.prompt_tokens_details ? usage.prompt_tokens_details.cached_tokens : 0,
        accepted: predicted ? predicted.accepted_prediction_tokens : 0,
        drafted: predicted
          ? predicted.accepted_prediction_tokens + predicted.rejected_prediction_tokens
          : 0,
      };
    running = null;
    save();
    render();
  }

  function send(ev) {
    if (ev) ev.preventDefault();
    if (running) return;
    const text = $("prompt").value;
    if (!text.trim() && !pending.length) return;
    if (!current.title) current.title = text.trim().slice(0, 60) || "Image";
    current.messages.push({ role: "user", content: text, images: pending });
    pending = [];
    $("prompt").value = "";
    answer();
  }
  function regenerate() {
    if (running) return;
    const last = current.messages[current.messages.length - 1];
    if (last && last.role === "assistant") current.messages.pop();
    if (current.messages.length) answer();
  }
  function stop() {
    if (running) running.controller.abort();
  }

  // ---- images and videos: picker, drag and drop, paste ----
  function addFiles(files) {
    for (const f of files) {
      if (!/^(image\/(png|jpeg)|video\/(mp4|webm))$/.test(f.type)) continue;
      const reader = new FileReader();
      reader.onload = () => {
        pending.push(reader.result);
        render();
      };
      reader.readAsDataURL(f);
    }
  }

  function start() {
    load();
    modelReady = strata.model();
    modelReady.then((id) => {
      modelId = id;
      render();
    });
    $("composer").addEventListener("submit", send);
    $("prompt").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey) send(e);
    });
    $("stop").addEventListener("click", stop);
    $("new-chat").addEventListener("click", () => {
      if (running) return;
      current = current.messages.length ? newConversation() : current;
      save();
      render();
    });
    for (const id of ["system", "max-tokens", "temperature", "thinking"]) $(id).addEventListener("change", save);
    $("attach").addEventListener("click", () => $("file").click());
    $("file").addEventListener("change", (e) => {
      addFiles(e.target.files);
      e.target.value = "";
    });
    const form = $("composer");
    form.addEventListener("dragover", (e) => {
      e.preventDefault();
      form.classList.add("drag");
    });
    form.addEventListener("dragleave", () => form.classList.remove("drag"));
    form.addEventListener("drop", (e) => {
      e.preventDefault();
      form.classList.remove("drag");
      addFiles(e.dataTransfer.files);
    });
    document.addEventListener("paste", (e) => {
      const files = [...(e.clipboardData ? e.clipboardData.files : [])];
      if (files.length) addFiles(files);
    });
    render();
  }

  document.addEventListener("DOMContentLoaded", start);
  // For the browser tests and the curious: the conversation as the page holds it.
  return { current: () => current, addFiles, requestBody };
})();
window.strataChat = chat;
