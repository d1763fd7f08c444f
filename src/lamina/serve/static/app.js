// lamina playground: stream a generation over server-sent events (fetch + POST), then fetch the
// attention maps and next-token tables of the whole text and make every token clickable.
// Plain JavaScript, no libraries, nothing loaded from outside this server.
"use strict";

const $ = (id) => document.getElementById(id);
const output = $("output");
let controller = null;
let inspected = null; // the /api/attention answer for the current text

function setStatus(text, isError) {
  $("status").textContent = text;
  $("status").className = isError ? "error" : "muted";
}

function numberOrNull(id) {
  const v = $(id).value.trim();
  return v === "" ? null : Number(v);
}

function tokenSpan(text, cls) {
  const span = document.createElement("span");
  span.className = "tok " + cls + (text === "\n" ? " nl" : "");
  span.textContent = text;
  return span;
}

async function readEvents(response, onEvent) {
  // Parse "event: NAME\ndata: JSON\n\n" blocks as they arrive.
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let name = "message", data = "";
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) name = line.slice(7);
        else if (line.startsWith("data: ")) data += line.slice(6);
      }
      onEvent(name, data ? JSON.parse(data) : {});
    }
  }
}

async function generate() {
  const prompt = $("prompt").value;
  const body = {
    prompt,
    max_tokens: numberOrNull("max_tokens"),
    temperature: numberOrNull("temperature"),
    top_k: numberOrNull("top_k"),
    top_p: numberOrNull("top_p"),
    seed: numberOrNull("seed"),
  };
  for (const k of Object.keys(body)) if (body[k] === null && k !== "prompt") delete body[k];
  output.textContent = "";
  output.classList.remove("ready");
  $("inspector").hidden = true;
  inspected = null;
  output.appendChild(tokenSpan(prompt, "prompt"));
  $("generate").disabled = true;
  $("stop").disabled = false;
  setStatus("waiting for the model...");
  controller = new AbortController();
  const started = performance.now();
  let firstAt = null, count = 0, finalText = "";
  try {
    const response = await fetch("/api/generate", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (!response.ok) {
      const err = await response.json().catch(() => ({ error: response.statusText }));
      throw new Error(err.error || response.statusText);
    }
    await readEvents(response, (name, data) => {
      if (name === "token") {
        if (firstAt === null) firstAt = performance.now() - started;
        count += 1;
        if (data.text) output.appendChild(tokenSpan(data.text, "gen"));
        setStatus(`${count} tokens, first after ${firstAt.toFixed(0)} ms`);
      } else if (name === "done") {
        finalText = data.text;
        setStatus(`${data.tokens} tokens at ${data.tokens_per_s} tokens/s (first after ${
          (firstAt || 0).toFixed(0)} ms); looking inside...`);
      } else if (name === "error") {
        throw new Error(data.error);
      }
    });
    await inspect(prompt + finalText);
  } catch (e) {
    if (e.name === "AbortError") setStatus("stopped");
    else setStatus(String(e.message || e), true);
  } finally {
    $("generate").disabled = false;
    $("stop").disabled = true;
    controller = null;
  }
}

async function inspect(text) {
  const response = await fetch("/api/attention", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ text }),
  });
  const data = await response.json();
  if (!response.ok) throw new Error(data.error || response.statusText);
  inspected = data;
  const shown = data.tokens.join("");
  output.textContent = "";
  if (data.cut > 0 && text.endsWith(shown)) {
    const before = tokenSpan(text.slice(0, text.length - shown.length), "cut");
    before.title = `only the last ${data.tokens.length} tokens (the model's context) are inspected`;
    output.appendChild(before);
  }
  const promptLen = $("prompt").value.length;
  let at = text.length - shown.length;
  data.tokens.forEach((t, i) => {
    const span = tokenSpan(t, at < promptLen ? "prompt" : "gen");
    span.dataset.pos = String(i);
    span.addEventListener("click", () => showToken(i, span));
    output.appendChild(span);
    at += t.length;
  });
  output.classList.add("ready");
  setStatus($("status").textContent.replace("looking inside...", "click a token"));
}

function altTable(title, row, actual) {
  const table = document.createElement("table");
  table.className = "alts";
  table.innerHTML = `<tr><th colspan="2"></th></tr>`;
  table.querySelector("th").textContent = title;
  for (const alt of row.top) {
    const tr = document.createElement("tr");
    if (actual !== null && alt.token === actual) tr.className = "actual";
    tr.innerHTML = "<td></td><td></td>";
    tr.children[0].textContent = JSON.stringify(alt.token);
    tr.children[1].textContent = (alt.p * 100).toFixed(1) + "%";
    table.appendChild(tr);
  }
  if (actual !== null && row.p_actual !== null && !row.top.some((a) => a.token === actual)) {
    const tr = document.createElement("tr");
    tr.className = "actual";
    tr.innerHTML = "<td></td><td></td>";
    tr.children[0].textContent = JSON.stringify(actual);
    tr.children[1].textContent = (row.p_actual * 100).toFixed(2) + "%";
    table.appendChild(tr);
  }
  return table;
}

function showToken(pos, span) {
  const d = inspected;
  document.querySelectorAll(".tok.selected").forEach((s) => s.classList.remove("selected"));
  span.classList.add("selected");
  $("inspector").hidden = false;
  $("inspector-title").textContent =
    `token ${JSON.stringify(d.tokens[pos])} at position ${pos}: where each head looks from it`;
  const alts = $("alternatives");
  alts.textContent = "";
  if (pos > 0) {
    const prev = d.table[pos - 1];
    alts.appendChild(altTable(`the model's top-${prev.top.length} for this token`, prev, prev.actual));
  }
  const here = d.table[pos];
  alts.appendChild(altTable(`and for the next one`, here, here.actual));
  const heads = $("heads");
  heads.textContent = "";
  for (let l = 0; l < d.layers; l++) {
    for (let h = 0; h < d.heads; h++) {
      const box = document.createElement("div");
      box.className = "head";
      box.dataset.layer = String(l);
      box.dataset.head = String(h);
      const name = document.createElement("div");
      name.className = "name";
      name.textContent = `layer ${l} head ${h}`;
      const cap = document.createElement("div");
      cap.className = "caption";
      cap.textContent = d.patterns[l][h].caption;
      const keys = document.createElement("div");
      keys.className = "keys";
      const row = d.maps[l][h][pos];
      row.forEach((w, j) => {
        const k = document.createElement("span");
        k.className = "key";
        const t = d.tokens[j];
        k.textContent = t === "\n" ? "\u21b5" : t === " " ? "\u2423" : t;
        k.style.background = `rgba(30, 100, 220, ${Math.min(1, w).toFixed(3)})`;
        if (w > 0.5) k.style.color = "#fff";
        k.title = `${(w * 100).toFixed(1)}%`;
        keys.appendChild(k);
      });
      box.append(name, cap, keys);
      heads.appendChild(box);
    }
  }
}

$("generate").addEventListener("click", generate);
$("stop").addEventListener("click", () => controller && controller.abort());
fetch("/api/info").then((r) => r.json()).then((info) => {
  $("model-info").textContent =
    `${info.layers} layers x ${info.heads} heads, context ${info.block_size} tokens, ` +
    `vocabulary ${info.vocab_size}; at most ${info.limits.max_tokens} tokens per request`;
  $("max_tokens").max = String(info.limits.max_tokens);
}).catch(() => setStatus("could not reach the server", true));
