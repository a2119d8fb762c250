// The trajectory browser of `vime view`. Everything from the run is data: it reaches the DOM
// only through textContent and attribute setters, never as HTML.
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const meta = JSON.parse($("vime-meta").textContent);
  const idx = meta.index;
  const N = idx.task.length;
  const pieces = JSON.parse($("vime-pieces").textContent);
  const ROW = 26;
  const timings = (window.vimeTimings = {});
  const domReady = new Promise((resolve) => {
    if (document.readyState !== "loading") resolve();
    else document.addEventListener("DOMContentLoaded", resolve);
  });

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (k === "class") node.className = v;
      else if (k === "onclick") node.addEventListener("click", v);
      else node.setAttribute(k, v);
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      node.append(c instanceof Node ? c : String(c));
    }
    return node;
  }
  const signed = (d) => (d === 0 || Math.abs(d) >= 1e-3 ? d.toFixed(4) : d.toExponential(1));
  const fmt = (v, d = 3) => (v === null || v === undefined ? "n/a" : Number(v).toFixed(d));

  // ---- filters over the index -------------------------------------------------------------
  const controls = ["f-step-min", "f-step-max", "f-env", "f-task", "f-reward-min", "f-reward-max",
    "f-status", "f-text", "f-deep", "f-sort"].map($);
  for (const [select, names] of [[$("f-env"), idx.envs], [$("f-status"), idx.statuses]]) {
    for (const [code, name] of names.entries()) select.append(el("option", { value: code }, name || "(none)"));
  }
  let haystack = null; // lower-cased searchable text per episode, built on the first text query
  let fullText = null; // with "whole episodes": every message and tool call, filled chunk by chunk
  let view = new Int32Array(0);

  function num(id) {
    const v = $(id).value.trim();
    return v === "" ? null : Number(v);
  }

  function applyFilters() {
    const smin = num("f-step-min"), smax = num("f-step-max");
    const rmin = num("f-reward-min"), rmax = num("f-reward-max");
    const env = $("f-env").value === "" ? -1 : Number($("f-env").value);
    const status = $("f-status").value === "" ? -1 : Number($("f-status").value);
    const task = $("f-task").value.trim().toLowerCase();
    const text = $("f-text").value.trim().toLowerCase();
    if (text && !haystack) {
      haystack = new Array(N);
      for (let i = 0; i < N; i++) {
        haystack[i] = (idx.task[i] + "\u0000" + idx.preview[i] + "\u0000" + idx.error[i] + "\u0000" +
          idx.envs[idx.env[i]] + "\u0000" + idx.statuses[idx.status[i]]).toLowerCase();
      }
    }
    const out = new Int32Array(N);
    let n = 0;
    for (let i = 0; i < N; i++) {
      if (smin !== null && idx.step[i] < smin) continue;
      if (smax !== null && idx.step[i] > smax) continue;
      if (env >= 0 && idx.env[i] !== env) continue;
      if (status >= 0 && idx.status[i] !== status) continue;
      const r = idx.reward[i];
      if (rmin !== null && !(r !== null && r >= rmin)) continue;
      if (rmax !== null && !(r !== null && r <= rmax)) continue;
      if (task && !idx.task[i].toLowerCase().includes(task)) continue;
      if (text && !haystack[i].includes(text) && !(fullText && fullText[i] && fullText[i].includes(text))) continue;
      out[n++] = i;
    }
    view = out.slice(0, n);
    const sort = $("f-sort").value;
    if (sort) {
      const key = sort.slice(1), sign = sort[0] === "-" ? -1 : 1;
      const col = idx[key];
      const val = (i) => (col[i] === null ? -Infinity * sign : col[i]);
      view.sort((a, b) => sign * (val(a) - val(b)) || a - b);
    }
    $("count").textContent = `${n} of ${N} episodes`;
    $("list-inner").style.height = `${n * ROW}px`;
    $("list").scrollTop = 0;
    renderRows(true);
  }

  // ---- the virtual list: only the rows in sight exist in the DOM ----------------------------
  let selected = -1;
  let drawn = "";
  function renderRows(force) {
    const list = $("list");
    const first = Math.max(0, Math.floor(list.scrollTop / ROW) - 5);
    const last = Math.min(view.length, first + Math.ceil(list.clientHeight / ROW) + 10);
    const key = `${first}:${last}:${selected}`;
    if (!force && key === drawn) return;
    drawn = key;
    const rows = [];
    for (let k = first; k < last; k++) {
      const i = view[k];
      const status = idx.statuses[idx.status[i]];
      const row = el("div", { class: "row" + (i === selected ? " selected" : ""), "data-i": i },
        el("span", { class: "s" }, `s${idx.step[i]}`),
        el("span", { class: "r" }, fmt(idx.reward[i], 2)),
        el("span", { class: "t" }, `${idx.task[i]} #${idx.sample[i]}`),
        status !== "completed" ? el("span", { class: `st-${status}` }, `[${status}] `) : null,
        el("span", { class: "p" }, idx.preview[i] || idx.error[i]));
      row.style.top = `${k * ROW}px`;
      rows.push(row);
    }
    $("list-inner").replaceChildren(...rows);
  }
  $("list").addEventListener("scroll", () => renderRows(false));
  $("list-inner").addEventListener("click", (ev) => {
    const row = ev.target.closest(".row");
    if (row) openEpisode(Number(row.getAttribute("data-i")));
  });
  for (const c of controls) c.addEventListener(c.tagName === "SELECT" ? "change" : "input", applyFilters);
  for (const b of document.querySelectorAll(".task-link")) {
    b.addEventListener("click", () => {
      $("f-task").value = b.getAttribute("data-task");
      applyFilters();
      $("browser").scrollIntoView();
    });
  }

  // ---- episode bodies: gzip chunks decoded on demand ---------------------------------------
  const chunks = new Map();
  function base64Bytes(text) {
    if (Uint8Array.fromBase64) return Uint8Array.fromBase64(text.trim());
    const bin = atob(text.trim());
    const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }
  async function chunkBytes(n) {
    if (meta.chunk_url) {
      const res = await fetch(meta.chunk_url + n);
      if (!res.ok) throw new Error(`chunk ${n}: HTTP ${res.status}`);
      return new Uint8Array(await res.arrayBuffer());
    }
    let node = $("c" + n);
    if (!node) { await domReady; node = $("c" + n); }
    if (!node) throw new Error(`chunk ${n} is missing from the page`);
    return base64Bytes(node.textContent);
  }
  function loadChunk(n) {
    if (!chunks.has(n)) chunks.set(n, decodeChunk(n));
    return chunks.get(n);
  }
  async function decodeChunk(n) {
    const gz = await chunkBytes(n);
    const stream = new Blob([gz]).stream().pipeThrough(new DecompressionStream("gzip"));
    const buf = await new Response(stream).arrayBuffer();
    const dv = new DataView(buf);
    const len = dv.getUint32(0, true);
    const head = JSON.parse(new TextDecoder().decode(new Uint8Array(buf, 4, len)));
    let off = 4 + len;
    const take = (Type, count) => { const a = new Type(buf, off, count); off += count * Type.BYTES_PER_ELEMENT; return a; };
    const ids = take(Int32Array, head.n);
    const lp = take(Float32Array, head.m);
    const tlp = head.trainer ? take(Float32Array, head.m) : null;
    const ver = take(Int32Array, head.m);
    const mask = take(Uint8Array, head.n);
    return { head, ids, lp, tlp, ver, mask };
  }

  // Free text in whole episodes: every chunk is decoded once (and not kept), the text of its
  // messages and tool calls lower-cased; the list is filtered again once all are read.
  let scanning = false;
  async function scanAll() {
    if (fullText || scanning) return;
    scanning = true;
    const texts = new Array(N).fill("");
    const chunksTotal = Math.ceil(N / meta.chunk_size);
    for (let c = 0; c < chunksTotal; c++) {
      const { head } = await decodeChunk(c);
      head.items.forEach((b, k) => {
        texts[c * meta.chunk_size + k] = episodeText(b);
      });
      if (c % 50 === 49) $("deep-status").textContent = `searching ${Math.round((100 * c) / chunksTotal)}%`;
    }
    scanning = false;
    if (!$("f-deep").checked) return; // unticked while reading
    fullText = texts;
    $("deep-status").textContent = "";
    timings.scanned = performance.now();
    applyFilters();
  }
  function episodeText(b) {
    const parts = [b.response || "", b.error || ""];
    for (const m of b.messages || []) {
      parts.push(contentText(m.content));
      for (const call of m.tool_calls || []) {
        const fn = call.function || {};
        parts.push(String(fn.name || ""), typeof fn.arguments === "string" ? fn.arguments : JSON.stringify(fn.arguments || {}));
      }
    }
    return parts.join("\u0000").toLowerCase();
  }
  $("f-deep").addEventListener("change", () => {
    if ($("f-deep").checked) scanAll(); else { fullText = null; applyFilters(); }
  });
  async function episode(i) {
    const c = await loadChunk(Math.floor(i / meta.chunk_size));
    const body = c.head.items[i % meta.chunk_size];
    const [t0, n, s0, m] = body.tok;
    return { body, ids: c.ids.subarray(t0, t0 + n), mask: c.mask.subarray(t0, t0 + n),
      lp: c.lp.subarray(s0, s0 + m), tlp: c.tlp && body.has_trainer ? c.tlp.subarray(s0, s0 + m) : null,
      ver: c.ver.subarray(s0, s0 + m) };
  }

  // ---- one episode --------------------------------------------------------------------------
  function badges(i, b) {
    const out = el("div", { class: "badges" });
    const add = (text, warn) => out.append(el("span", warn ? { class: "warn" } : {}, text));
    add(`step ${idx.step[i]}`);
    add(`env ${idx.envs[idx.env[i]] || "?"}`);
    add(`reward ${fmt(idx.reward[i])}`);
    add(`status ${idx.statuses[idx.status[i]]}`, idx.statuses[idx.status[i]] !== "completed");
    if (idx.correct[i] >= 0) add(idx.correct[i] ? "correct" : "incorrect", !idx.correct[i]);
    if (idx.turns[i]) add(`${idx.turns[i]} turns`);
    if (idx.ntok[i]) add(`${idx.ntok[i]} tokens, ${idx.nresp[i]} sampled`);
    if (b.weight_versions && b.weight_versions.length) add(`weight versions ${b.weight_versions.join(", ")}`, idx.vmin[i] !== idx.vmax[i]);
    if (idx.drift[i]) add(`drift ×${idx.drift[i]}, ${(b.metrics || {}).drift_masked_tokens || 0} tokens unmasked`, true);
    if (b.metadata && b.metadata.segments) add(`split: ${b.metadata.segments} earlier segment(s)`, true);
    if (b.metadata && b.metadata.carried_over) add("carried over from an earlier step", true);
    if (b.group_kept === false) add("group left out by --group-filter", true);
    if (idx.mismatch[i] !== null) add(`max |trainer − rollout| ${signed(idx.mismatch[i])}`, idx.mismatch[i] > 0.5);
    if (b.turn_rewards && b.turn_rewards.length) add(`turn rewards ${b.turn_rewards.map((r) => fmt(r, 2)).join(", ")}`);
    for (const key of ["answer", "finish_reason", "seconds", "attempts"]) if (b[key] !== undefined && b[key] !== null && b[key] !== "") add(`${key} ${b[key]}`);
    return out;
  }

  function contentText(content) {
    if (Array.isArray(content)) return content.map((p) => (p && p.text) || "").join("");
    return content === null || content === undefined ? "" : String(content);
  }

  function messagesView(b) {
    const box = el("div", {});
    let turn = 0;
    for (const msg of b.messages || []) {
      const role = String(msg.role || "?");
      const who = [role];
      if (msg.name) who.push(String(msg.name));
      if (msg.tool_call_id) who.push(`for ${msg.tool_call_id}`);
      if (role === "assistant") {
        if (b.turn_rewards && turn < b.turn_rewards.length) who.push(`turn reward ${fmt(b.turn_rewards[turn], 3)}`);
        if (b.weight_versions && turn < b.weight_versions.length) who.push(`weights v${b.weight_versions[turn]}`);
        turn++;
      }
      const node = el("div", { class: `msg role-${role.replace(/[^a-z]/g, "")}` },
        el("div", { class: "who" }, who.join(" · ")), el("pre", {}, contentText(msg.content)));
      for (const call of msg.tool_calls || []) {
        const fn = call.function || {};
        const bad = call.status === "malformed";
        node.append(el("div", { class: "call" + (bad ? " malformed" : "") },
          `→ ${fn.name || call.name || "?"}(${typeof fn.arguments === "string" ? fn.arguments : JSON.stringify(fn.arguments ?? call.arguments ?? {})})` +
          (bad ? `  [malformed: ${call.error || ""}]` : "")));
      }
      box.append(node);
    }
    if (!(b.messages || []).length && b.response) box.append(el("div", { class: "msg role-assistant" },
      el("div", { class: "who" }, "last response"), el("pre", {}, b.response)));
    if (b.error) box.append(el("div", { class: "msg role-tool" }, el("div", { class: "who" }, "error"), el("pre", {}, b.error)));
    return box;
  }

  function tokenColour(lp) {
    const p = Math.exp(lp);
    return `hsl(${Math.round(120 * p)}, 75%, 84%)`;
  }
  function diffColour(d) {
    const a = Math.min(1, Math.abs(d) / 0.5);
    return `hsl(${d > 0 ? 210 : 0}, 80%, ${Math.round(97 - 35 * a)}%)`;
  }

  function tokensView(e, by) {
    const box = el("div", { class: "tokens" });
    let s = 0, lastVersion = null;
    const frag = document.createDocumentFragment();
    const drifts = new Set((e.body.metadata || {}).drift_at || []);
    for (let k = 0; k < e.ids.length; k++) {
      const id = e.ids[k];
      if (drifts.has(k)) {
        frag.append(el("span", { class: "drift", title: "drift: the engine's prompt diverged from " +
          "the ids so far here; what the model had sampled from this point was replaced by the " +
          "engine's ids and is not trained" }, "drift"));
      }
      const piece = pieces[id] !== undefined ? pieces[id] : `⟨${id}⟩`;
      const span = document.createElement("span");
      span.textContent = piece.replace(/\n/g, "↵\n");
      if (e.mask[k]) {
        const lp = e.lp[s], v = e.ver[s], t = e.tlp ? e.tlp[s] : NaN;
        if (lastVersion !== null && v !== lastVersion && v >= 0) frag.append(el("span", { class: "vmark", title: "weight update" }, `v${v}`));
        if (v >= 0) lastVersion = v;
        span.className = "tok m1";
        span.style.backgroundColor = by === "diff" && !Number.isNaN(t) ? diffColour(t - lp) : tokenColour(lp);
        let tip = `id ${id} · sampled · logprob ${lp.toFixed(4)} (p ${Math.exp(lp).toFixed(3)}) · weights v${v}`;
        if (!Number.isNaN(t)) tip += ` · trainer ${t.toFixed(4)} · Δ ${signed(t - lp)}`;
        span.title = tip;
        span.setAttribute("data-lp", lp);
        if (!Number.isNaN(t)) span.setAttribute("data-tlp", t);
        s++;
      } else {
        span.className = "tok m0";
        span.title = `id ${id} · not trained (prompt, env or tool)`;
      }
      frag.append(span);
    }
    box.append(frag);
    return box;
  }

  function legend(hasTrainer, by, onChange) {
    const box = el("div", { class: "legend" },
      el("span", { class: "tok m0" }, "not trained"), " ",
      el("span", { class: "tok m1", style: `background:${tokenColour(-3)}` }, "sampled, p≈0.05"), " ",
      el("span", { class: "tok m1", style: `background:${tokenColour(-0.01)}` }, "sampled, p≈1"), " · hover a token for its logprobs");
    if (hasTrainer) {
      const select = el("select", { class: "colour-by" },
        el("option", { value: "lp" }, "colour: sampled probability"),
        el("option", { value: "diff" }, "colour: trainer − rollout logprob"));
      select.value = by;
      select.addEventListener("change", () => onChange(select.value));
      box.append(" ", select);
    }
    return box;
  }

  function episodeView(i, e, opts = {}) {
    const box = el("div", {});
    box.append(el("h2", {}, `${idx.task[i]} #${idx.sample[i]}`), badges(i, e.body));
    const group = groupOf(i);
    if (!opts.compact && group.length > 1) {
      box.append(el("button", { class: "act compare-btn", onclick: () => compare(i) },
        `best vs worst of its group (${group.length} samples)`));
    }
    box.append(el("h2", {}, "messages"), messagesView(e.body));
    if (e.ids.length) {
      const holder = el("div", {});
      const draw = (by) => holder.replaceChildren(legend(!!e.tlp, by, draw), tokensView(e, by));
      draw("lp");
      box.append(el("h2", {}, "tokens"), holder);
    }
    return box;
  }

  function groupOf(i) {
    const out = [];
    for (let j = 0; j < N; j++) if (idx.step[j] === idx.step[i] && idx.task[j] === idx.task[i]) out.push(j);
    return out;
  }

  async function openEpisode(i) {
    if (!(i >= 0 && i < N)) return;
    selected = i;
    renderRows(true);
    history.replaceState(null, "", `#t=${i}`);
    const e = await episode(i);
    if (selected !== i) return;
    $("detail").replaceChildren(episodeView(i, e));
    $("detail").scrollTop = 0;
    timings.opened = performance.now();
  }

  async function compare(i) {
    const group = groupOf(i);
    const by = (a, b) => (idx.reward[a] ?? -Infinity) - (idx.reward[b] ?? -Infinity);
    const best = group.reduce((x, y) => (by(y, x) > 0 ? y : x));
    const worst = group.reduce((x, y) => (by(y, x) < 0 ? y : x));
    history.replaceState(null, "", `#t=${i}&cmp=1`);
    const [eb, ew] = await Promise.all([episode(best), episode(worst)]);
    $("detail").replaceChildren(
      el("button", { class: "act", onclick: () => openEpisode(i) }, "back"),
      el("div", { class: "compare" },
        el("div", { class: "best" }, el("h2", {}, "best"), episodeView(best, eb, { compact: true })),
        el("div", { class: "worst" }, el("h2", {}, "worst"), episodeView(worst, ew, { compact: true }))));
  }

  applyFilters();
  timings.listReady = performance.now();
  const hash = new URLSearchParams(location.hash.slice(1));
  if (hash.has("t")) {
    const i = Number(hash.get("t"));
    (hash.has("cmp") ? compare(i) : openEpisode(i)).then(() => { timings.hashOpened = performance.now(); });
  }
})();
