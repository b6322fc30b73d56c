// The pipeline page: the ring drawn as it is, from GET /v1/stages (a describe round the ring;
// when it breaks, the server's 503 names the stage it could not reach and keeps the last whole
// ring), redrawn every second; beneath it tokens/s, time to first token and requests in
// flight over the last five minutes, from the counters of GET /metrics.
"use strict";

(() => {
  const { el, fmt } = strata;
  const $ = (id) => document.getElementById(id);
  const POLL_MS = 1000;
  const DESCRIBE_MS = 900; // the server's wait for the ring: a broken one is seen within ~2 s
  const HISTORY = 300; // samples kept per chart: five minutes at one a second
  const series = { tps: [], ttft: [], flight: [] };

  // ---- the ring ----
  function rangeText(s) {
    return `[${s.layers[0]}, ${s.layers[1]})`;
  }
  // The vision stage sits in front of stage 0, outside the ring (its entry is "front").
  function stageName(s) {
    return s.front ? "vision stage" : `stage ${s.stage}`;
  }
  function stageKey(s) {
    return s.front ? "v" : String(s.stage);
  }
  function stageCard(s) {
    const state = s.state || "up";
    const card = el("div", { class: `stage ${state}`, "data-stage": stageKey(s), "data-state": state },
      el("span", { class: "state", text: state === "unknown" ? "listening" : state }),
      el("h3", { text: stageName(s) }));
    const roles = el("div", {}, ...s.roles.map((r) => el("span", { class: "badge", text: r })));
    if (s.roles.length) card.append(roles);
    if (s.front) card.append(el("div", { class: "kv" }, "the vision tower; no decoder layers"));
    else card.append(el("div", { class: "kv" }, "layers ", el("b", { class: "range-text", text: rangeText(s) })));
    card.append(el("div", { class: "device", text: s.device || "(device not reported)" }));
    if (!s.front) card.append(el("div", { class: "kv" }, "grid ", el("b", { text: `TP ${s.tp} × KVP ${s.kvp}` }),
      ` · ${s.threads} thread${s.threads === 1 ? "" : "s"} · ${s.weights_dtype}`));
    if (s.front) {
      card.append(el("div", { class: "kv" }, "images encoding ", el("b", { text: `${s.queue_depth}` })));
      if (state !== "up" && s.reason) card.append(el("div", { class: "reason", text: s.reason }));
      return card;
    }
    if (s.kv_blocks > 0) {
      const pct = (n) => `${(100 * n) / s.kv_blocks}%`;
      const meter = el("div", { class: "meter", title: "KV blocks: used, cached, reserved" });
      for (const [cls, n] of [["used", s.kv_blocks_used], ["cached", s.kv_blocks_cached], ["reserved", s.kv_blocks_reserved]]) {
        const part = el("div", { class: cls });
        part.style.width = pct(n); // CSSOM, not an inline style attribute: allowed by the CSP
        meter.append(part);
      }
      card.append(meter);
      card.append(el("div", { class: "kv" }, "KV blocks ", el("b", { text: `${s.kv_blocks_used}` }), " used, ",
        el("b", { text: `${s.kv_blocks_cached}` }), " cached, ", el("b", { text: `${s.kv_blocks_reserved}` }),
        ` reserved of ${s.kv_blocks} (16 positions each)`));
    } else {
      card.append(el("div", { class: "kv" }, "KV slots ", el("b", { text: `${s.kv_slots_in_use} of ${s.max_batch}` }),
        ` × ${s.max_seq} positions`));
    }
    card.append(el("div", { class: "kv" }, "queue ", el("b", { text: `${s.queue_depth}` }), " work items",
      s.stage === 0 ? ` · ${s.requests_waiting} requests waiting` : ""));
    if (state !== "up" && s.reason) card.append(el("div", { class: "reason", text: s.reason }));
    return card;
  }
  function linkState(from, to) {
    if (from.state === "down" || to.state === "down") return "down";
    if (from.state !== "up" || to.state !== "up") return "unknown";
    return "up";
  }
  function linkNode(from, to) {
    return el("div", { class: `link ${linkState(from, to)}`, title: "the link onwards, as the stage dialled it" },
      el("div", { class: "arrow", text: "→" }), el("div", { text: from.next || "(down)" }));
  }
  function drawRing(stages) {
    const ring = $("ring");
    ring.replaceChildren();
    stages.forEach((s, i) => {
      if (i > 0) ring.append(linkNode(stages[i - 1], s));
      ring.append(stageCard(s));
    });
    const ring0 = stages.filter((s) => !s.front);
    const last = ring0[ring0.length - 1];
    $("back").textContent = ring0.length > 1
      ? `stage ${last.stage} → stage 0 at ${last.next || "(link down)"}: the ring closes (tokens go back to stage 0)`
      : "";
  }
  function drawLayers(stages) {
    const total = Math.max(1, ...stages.map((s) => s.layers[1]));
    const box = $("layers");
    box.replaceChildren();
    for (const s of stages) {
      if (s.front) continue; // no decoder layers
      const range = el("div", { class: `range ${s.state || "up"}`, text: rangeText(s), title: `stage ${s.stage}: layers ${rangeText(s)}` });
      range.style.left = `${(100 * s.layers[0]) / total}%`;
      range.style.width = `${Math.max(0.5, (100 * (s.layers[1] - s.layers[0])) / total)}%`;
      box.append(el("div", { class: "lane" }, el("div", { class: "name", text: `stage ${s.stage}` }),
        el("div", { class: "track" }, range)));
    }
    box.append(el("div", { class: "axis" }, el("span", { text: "layer 0" }), el("span", { text: `${total} layers` })));
  }
  function drawTotals(stages) {
    const s0 = stages.find((s) => !s.front && s.stage === 0);
    const t = s0 && s0.totals;
    if (!t) return;
    const hit = t.prefix_lookups ? (100 * t.prefix_hits) / t.prefix_lookups : 0;
    const wait = t.queue_admitted ? t.queue_wait_ms / t.queue_admitted / 1000 : 0;
    $("totals").replaceChildren(
      "Prefix cache: ", el("b", { text: `${t.prefix_hits} of ${t.prefix_lookups}` }), ` prompts reused (${fmt(hit, 0)}%), `,
      el("b", { text: `${t.prefix_cached_tokens}` }), ` of ${t.prefix_prompt_tokens} prompt tokens from cache. Queue: `,
      el("b", { text: `${t.requests_queued}` }), ` waited, ${t.queue_admitted} admitted (mean wait ${fmt(wait, 2)} s), `,
      `${t.queue_refused_full} refused as full, ${t.queue_expired} expired.`);
  }
  function setStatus(ok, text) {
    $("status").className = `status ${ok ? "up" : "down"}`;
    $("status-text").textContent = text;
  }

  async function pollStages() {
    try {
      const r = await fetch(`/v1/stages?timeout_ms=${DESCRIBE_MS}`, { cache: "no-store" });
      const j = await r.json();
      const stages = j.data || [];
      const when = new Date().toLocaleTimeString();
      const n = stages.filter((s) => !s.front).length;
      const front = stages.some((s) => s.front) ? " behind a vision stage" : "";
      if (r.ok) setStatus(true, `ring up: ${n} stage${n === 1 ? "" : "s"}${front} answered · ${when}`);
      else setStatus(false, `ring broken: ${j.error ? j.error.message : r.status} · ${when}`);
      if (stages.length) {
        drawLayers(stages);
        drawRing(stages);
        drawTotals(stages);
      } else if (!r.ok) {
        $("ring").replaceChildren(el("div", { class: "reason", text: "no stage has answered since this server started" }));
      }
      document.body.dataset.ring = r.ok ? "up" : "broken";
    } catch (e) {
      setStatus(false, `strata-serve does not answer: ${e.message}`);
      document.body.dataset.ring = "unreachable";
    }
  }

  // ---- the charts ----
  function parseMetrics(text) {
    const v = {};
    for (const line of text.split("\n")) {
      if (!line || line[0] === "#") continue;
      const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
      if (m && !m[2]) v[m[1]] = parseFloat(m[3]);
    }
    return v;
  }
  function push(name, value) {
    series[name].push(value);
    if (series[name].length > HISTORY) series[name].shift();
  }
  function drawChart(canvas, data, digits, floor) {
    const ctx = canvas.getContext("2d");
    const w = canvas.width, h = canvas.height, pad = 28;
    ctx.clearRect(0, 0, w, h);
    const values = data.filter((x) => x !== null);
    const max = Math.max(floor, ...values) * 1.15;
    ctx.strokeStyle = "#dde1e7";
    ctx.fillStyle = "#667080";
    ctx.font = "20px sans-serif";
    ctx.lineWidth = 1;
    for (let k = 0; k <= 2; k++) {
      const y = pad + ((h - 2 * pad) * k) / 2;
      ctx.beginPath();
      ctx.moveTo(0, y);
      ctx.lineTo(w, y);
      ctx.stroke();
      ctx.fillText(fmt((max * (2 - k)) / 2, digits), 4, y - 4);
    }
    ctx.fillText("5 min ago", 4, h - 4);
    ctx.fillText("now", w - 40, h - 4);
    ctx.strokeStyle = "#2f6fde";
    ctx.lineWidth = 3;
    ctx.beginPath();
    let pen = false;
    data.forEach((x, i) => {
      const px = w - ((data.length - 1 - i) * w) / (HISTORY - 1);
      if (x === null) {
        pen = false;
        return;
      }
      const py = h - pad - ((h - 2 * pad) * x) / max;
      if (pen) ctx.lineTo(px, py);
      else ctx.moveTo(px, py);
      pen = true;
    });
    ctx.stroke();
  }
  // Rates over the last WINDOW seconds of counter samples: completion tokens are counted as
  // requests finish, so per-second differences would be all spikes.
  const WINDOW = 5;
  const samples = [];
  async function pollMetrics() {
    try {
      const r = await fetch("/metrics", { cache: "no-store" });
      const v = parseMetrics(await r.text());
      const c = {
        t: performance.now() / 1000,
        tokens: v.strata_serve_completion_tokens_total || 0,
        ttftSum: v.strata_serve_time_to_first_token_seconds_sum || 0,
        ttftCount: v.strata_serve_time_to_first_token_seconds_count || 0,
      };
      samples.push(c);
      while (samples.length > 1 && c.t - samples[0].t > WINDOW + 0.5) samples.shift();
      const first = samples[0];
      if (samples.length > 1) {
        const dt = c.t - first.t;
        push("tps", dt > 0 ? (c.tokens - first.tokens) / dt : 0);
        const n = c.ttftCount - first.ttftCount;
        push("ttft", n > 0 ? (c.ttftSum - first.ttftSum) / n : null);
      }
      push("flight", v.strata_serve_requests_in_flight || 0);
      const lastOf = (a) => (a.length ? a[a.length - 1] : null);
      $("now-tps").textContent = fmt(lastOf(series.tps), 1);
      const ttfts = series.ttft.filter((x) => x !== null);
      $("now-ttft").textContent = ttfts.length ? fmt(ttfts[ttfts.length - 1], 2) : "–";
      $("now-flight").textContent = fmt(lastOf(series.flight), 0);
      drawChart($("chart-tps"), series.tps, 1, 1);
      drawChart($("chart-ttft"), series.ttft, 2, 0.1);
      drawChart($("chart-flight"), series.flight, 1, 1);
    } catch (e) {
      /* the stages poll reports an unreachable server */
    }
  }

  // Each poll waits for its answer before the next starts: a slow ring never piles requests up.
  function loop(fn) {
    const t0 = performance.now();
    fn().finally(() => setTimeout(() => loop(fn), Math.max(0, POLL_MS - (performance.now() - t0))));
  }
  document.addEventListener("DOMContentLoaded", () => {
    strata.model();
    loop(pollStages);
    loop(pollMetrics);
  });
})();
