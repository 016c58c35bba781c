// ragline's page: pick an index, ask, watch the answer stream in (POST /v1/query/stream).
// EventSource cannot POST, so the stream is read with fetch and parsed here. Text from the
// server only ever goes into textContent, never into HTML.
"use strict";

const $ = (id) => document.getElementById(id);
const KEY_STORAGE = "ragline.apiKey";
let sources = [];

function requestHeaders() {
  const headers = { "Content-Type": "application/json" };
  const key = $("key").value.trim();
  if (key) headers.Authorization = `Bearer ${key}`;
  return headers;
}

function show(id, text) {
  $(id).textContent = text || "";
  $(id).hidden = !text;
}

// What a refusal means for the person at the page, with the server's own message.
async function explain(response) {
  let body = null;
  try { body = await response.json(); } catch { /* not JSON: the status says enough */ }
  const message = (body && body.message) || response.statusText || "no message";
  const retry = response.headers.get("Retry-After");
  const later = retry ? ` Try again in ${retry} s.` : "";
  switch (response.status) {
    case 401: return `The API key was refused (${message}). Enter a key made with "ragline keys create".`;
    case 429: return `Too many requests (${message}).${later}`;
    case 503: return `The server cannot answer now (${message}).${later}`;
    default: return `The request failed with ${response.status} (${message}).`;
  }
}

async function loadIndexes() {
  let response;
  try {
    response = await fetch("/v1/indexes", { headers: requestHeaders() });
  } catch (err) {
    show("message", `Cannot reach the server: ${err.message}`);
    return;
  }
  if (response.status === 401 && !$("key").value.trim()) {
    // A first visit, not a refusal: nothing was entered yet.
    show("message", 'Enter an API key (made with "ragline keys create") to see the indexes and ask.');
    return;
  }
  if (!response.ok) {
    show("message", await explain(response));
    return;
  }
  show("message", "");
  const body = await response.json();
  const select = $("index");
  const chosen = select.value || body.default_index;
  select.replaceChildren(...body.indexes.map((ix) => new Option(
    `${ix.name} (${ix.documents ?? "?"} documents, ${ix.chunks} chunks)`, ix.name)));
  if (body.indexes.some((ix) => ix.name === chosen)) select.value = chosen;
  if (!body.indexes.length) show("message", 'No index yet: ingest some with "ragline ingest DIR --index NAME".');
}

// The server-sent events of a response body, each {id, event, data} once its blank line came.
async function* events(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = { id: null, event: "message", data: [] };
      for (const line of buffer.slice(0, end).split("\n")) {
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
        if (field === "id") event.id = text;
        else if (field === "event") event.event = text;
        else if (field === "data") event.data.push(text);
      }
      buffer = buffer.slice(end + 2);
      if (event.data.length) yield { ...event, data: JSON.parse(event.data.join("\n")) };
    }
  }
}

function showPassage(n) {
  const source = sources[n];
  if (!source) return;
  $("passage-title").textContent = `[${n + 1}] ${source.title}`;
  $("passage-source").textContent = `${source.source} · score ${source.score.toFixed(2)}`;
  $("passage-text").textContent = source.text;
  $("passage").hidden = false;
}

function renderSources() {
  $("sources").replaceChildren(...sources.map((source, n) => {
    const item = document.createElement("li");
    const button = document.createElement("button");
    button.type = "button";
    button.className = "source";
    button.textContent = source.title || source.source;
    button.addEventListener("click", () => showPassage(n));
    const where = document.createElement("span");
    where.className = "where";
    where.textContent = `${source.source.split("/").pop()} · ${source.score.toFixed(2)}`;
    item.append(button, where);
    return item;
  }));
}

// The final answer, each citation [n] a button that opens source n.
function renderAnswer(text) {
  const parts = [];
  let last = 0;
  for (const match of text.matchAll(/\[(\d+)\]/g)) {
    const n = Number(match[1]) - 1;
    if (!sources[n]) continue;
    parts.push(text.slice(last, match.index));
    const cite = document.createElement("button");
    cite.type = "button";
    cite.className = "cite";
    cite.textContent = match[0];
    cite.addEventListener("click", () => showPassage(n));
    parts.push(cite);
    last = match.index + match[0].length;
  }
  parts.push(text.slice(last));
  $("answer").replaceChildren(...parts);
}

function renderTimings(done) {
  const t = done.timings;
  const rows = [["queue", t.queue_ms], ["retrieval", t.retrieval_ms], ["first token", t.first_token_ms],
    ["generation", t.generation_ms], ["total", t.total_ms]];
  const cells = [];
  for (const [name, ms] of rows) {
    if (ms === null || ms === undefined) continue;
    const dt = document.createElement("dt");
    dt.textContent = name;
    const dd = document.createElement("dd");
    dd.textContent = `${Math.round(ms)} ms`;
    cells.push(dt, dd);
  }
  if (done.cached) {
    const dt = document.createElement("dt");
    dt.textContent = "cached";
    cells.push(dt);
  }
  $("timings").replaceChildren(...cells);
}

function handle({ event, data }) {
  const answer = $("answer");
  if (event === "sources") {
    sources = data.sources;
    renderSources();
  } else if (event === "token") {
    answer.textContent += data.text;
  } else if (event === "done") {
    renderAnswer(data.answer ?? "(no answer was generated: the sources are below)");
    renderTimings(data);
    if (data.degraded) show("notice", data.notice || "Generation was busy: these are the sources only.");
    answer.dataset.state = "done";
  } else if (event === "error") {
    const what = data.status === 499 ? "The request was cancelled." : `The request failed (${data.status}): ${data.message}`;
    show("message", what);
    answer.dataset.state = "error";
  }
}

async function ask(submitted) {
  submitted.preventDefault();
  const question = $("question").value.trim();
  if (!question) return;
  sources = [];
  show("message", "");
  show("notice", "");
  $("answer").replaceChildren();
  $("answer").dataset.state = "waiting";
  $("sources").replaceChildren();
  $("timings").replaceChildren();
  $("passage").hidden = true;
  $("submit").disabled = true;
  try {
    const body = { query: question };
    if ($("index").value) body.index = $("index").value;
    const response = await fetch("/v1/query/stream", {
      method: "POST", headers: requestHeaders(), body: JSON.stringify(body),
    });
    if (!response.ok) {
      show("message", await explain(response));
      $("answer").dataset.state = "error";
      return;
    }
    $("result").hidden = false;
    $("answer").dataset.state = "streaming";
    for await (const event of events(response.body)) handle(event);
    if ($("answer").dataset.state === "streaming") {
      show("message", "The connection closed before the answer was complete.");
      $("answer").dataset.state = "error";
    }
  } catch (err) {
    show("message", `The connection failed: ${err.message}`);
    $("answer").dataset.state = "error";
  } finally {
    $("submit").disabled = false;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("key").value = localStorage.getItem(KEY_STORAGE) || "";
  $("key").addEventListener("change", () => {
    localStorage.setItem(KEY_STORAGE, $("key").value.trim());
    loadIndexes();
  });
  $("ask").addEventListener("submit", ask);
  loadIndexes();
});
