// The chat page: the conversation lives here and is sent whole to /v1/chat/completions, whose
// answer streams back as server-sent events; the server's KV cache reuses what it saw last time.
"use strict";
const $ = (id) => document.getElementById(id);
let history = [];       // {role, content} messages, without the system prompt
let controller = null;  // the AbortController of the reply being streamed

function bubble(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  div.textContent = text;
  $("conversation").appendChild(div);
  div.scrollIntoView({block: "end"});
  return div;
}

function busy(on) {
  $("send").disabled = on;
  $("stop").disabled = !on;
}

async function send(text) {
  history.push({role: "user", content: text});
  bubble("user", text);
  const out = bubble("assistant", "");
  const system = $("system").value.trim();
  const messages = (system ? [{role: "system", content: system}] : []).concat(history);
  const body = {
    model: "lamina", messages, stream: true,
    temperature: Number($("temperature").value || 0),
    max_tokens: Number($("max_tokens").value || 256),
    stream_options: {include_usage: true},
  };
  controller = new AbortController();
  busy(true);
  $("status").textContent = "…";
  let reply = "";
  const started = performance.now();
  try {
    const res = await fetch("/v1/chat/completions", {
      method: "POST", headers: {"Content-Type": "application/json"},
      body: JSON.stringify(body), signal: controller.signal,
    });
    if (!res.ok) {
      const err = await res.json().catch(() => ({}));
      throw new Error((err.error && err.error.message) || res.statusText);
    }
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, {stream: true});
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const line = buffer.slice(0, cut).trim();
        buffer = buffer.slice(cut + 2);
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") continue;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message);  // the generation failed mid-stream
        if (chunk.usage) {
          const s = (performance.now() - started) / 1000;
          $("status").textContent = `${chunk.usage.completion_tokens} tokens in ${s.toFixed(1)} s ` +
            `(${chunk.usage.prompt_tokens_details.cached_tokens} of ${chunk.usage.prompt_tokens} prompt tokens cached)`;
        }
        const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
        if (delta && delta.content) {
          reply += delta.content;
          out.textContent = reply;
        }
      }
    }
  } catch (e) {
    if (e.name === "AbortError") {
      $("status").textContent = "stopped";
    } else {
      out.classList.add("error");
      out.textContent = "error: " + e.message;
      $("status").textContent = "";
    }
  } finally {
    history.push({role: "assistant", content: reply});
    controller = null;
    busy(false);
  }
}

$("composer").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const text = $("message").value.trim();
  if (!text || controller) return;
  $("message").value = "";
  send(text);
});
$("message").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey) {
    ev.preventDefault();
    $("composer").requestSubmit();
  }
});
$("stop").addEventListener("click", () => controller && controller.abort());
$("clear").addEventListener("click", () => {
  if (controller) controller.abort();
  history = [];
  $("conversation").textContent = "";
  $("status").textContent = "cleared";
});
fetch("/v1/models").then((r) => r.json()).then((m) => {
  $("model-name").textContent = m.data && m.data[0] ? m.data[0].id : "";
}).catch(() => {});
