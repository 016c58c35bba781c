// ragline's page: pick an index, ask, watch the answer stream in (POST /v1/query/stream).
// EventSource cannot POST, so the stream is read with fetch and parsed here; a dropped stream is
// resumed (GET /v1/query/stream/{id} with Last-Event-ID). Text from the server goes into text
// nodes only: the answer's Markdown through markdown.js, which builds elements, never HTML.
"use strict";

const $ = (id) => document.getElementById(id);
const KEY_STORAGE = "ragline.apiKey";
// Reconnections in a row with no new event before the page gives up on a stream: the first at
// once (a blip), then backing off, as the Python client does.
const MAX_DROPS = 5;
const BACKOFF_MS = 500;
const BACKOFF_MAX_MS = 8000;
let sources = [];
let answerText = ""; // the tokens so far (since the last restart)
let renderPending = false;

function requestHeaders(extra = {}) {
  const headers = { ...extra };
  const key = $("key").value.trim();
  if (key) headers.Authorization = `Bearer ${key}`;
  return headers;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

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

// Citation [n] as a button that opens source n, while there is such a source.
function citation(n) {
  if (!sources[n - 1]) return null;
  const cite = document.createElement("button");
  cite.type = "button";
  cite.className = "cite";
  cite.textContent = `[${n}]`;
  cite.addEventListener("click", () => showPassage(n - 1));
  return cite;
}

// The answer as Markdown, each citation a button.
function renderAnswer(text) {
  $("answer").replaceChildren(RaglineMarkdown.render(text, { cite: citation }));
}

// Tokens come faster than a frame: the answer is rendered again at most once a frame.
function scheduleRender() {
  if (renderPending) return;
  renderPending = true;
  requestAnimationFrame(() => {
    renderPending = false;
    if ($("answer").dataset.state !== "done") renderAnswer(answerText);
  });
}

// Whether the answer came from the cache: the same question's (cached: true), or a close one's
// (cached: "semantic", with the question it matched).
function renderBadge(done) {
  const badge = $("badge");
  if (done.cached === "semantic") {
    badge.textContent = "semantic cache";
    const matched = done.semantic_match && done.semantic_match.question;
    badge.title = matched ? `Answer to a similar question: ${matched}` : "";
  } else if (done.cached) {
    badge.textContent = "cached";
    badge.title = "The answer to this same question, from the cache";
  }
  badge.dataset.kind = done.cached === "semantic" ? "semantic" : "exact";
  badge.hidden = !done.cached;
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
  $("timings").replaceChildren(...cells);
}

function handle({ event, data }) {
  const answer = $("answer");
  if (event === "sources") {
    sources = data.sources;
    renderSources();
  } else if (event === "token") {
    answerText += data.text;
    scheduleRender();
  } else if (event === "restart") {
    // A worker stopped mid-answer and another began again: its tokens replace these.
    answerText = "";
    scheduleRender();
  } else if (event === "done") {
    answer.dataset.state = "done";
    renderAnswer(data.answer ?? "(no answer was generated: the sources are below)");
    renderBadge(data);
    renderTimings(data);
    if (data.degraded) show("notice", data.notice || "Generation was busy: these are the sources only.");
  } else if (event === "error") {
    const what = data.status === 499 ? "The request was cancelled." : `The request failed (${data.status}): ${data.message}`;
    show("message", what);
    answer.dataset.state = "error";
  }
}

// Reads a stream's events until it ends; returns whether any came with an id (progress).
async function read(response, stream) {
  let progressed = false;
  for await (const event of events(response.body)) {
    if (event.id) {
      stream.lastEventId = event.id;
      progressed = true;
    }
    handle(event);
  }
  return progressed;
}

function finished() {
  return ["done", "error"].includes($("answer").dataset.state);
}

// Reconnects to the stream after its last whole event, until it finishes or MAX_DROPS
// reconnections in a row bring nothing new; says so when it cannot.
async function resume(stream, response) {
  let drops = 0;
  let resumes = 0;
  for (;;) {
    let progressed = false;
    if (response) {
      try {
        progressed = await read(response, stream);
      } catch (err) {
        stream.failure = err.message;
      }
    }
    if (finished()) return;
    drops = progressed ? 1 : drops + 1;
    if (!stream.requestId || drops > MAX_DROPS) {
      const why = stream.failure ? `: ${stream.failure}` : "";
      show("message", `The connection was lost before the answer was complete${why}.`);
      $("answer").dataset.state = "error";
      return;
    }
    $("answer").dataset.state = "resuming";
    show("notice", "The connection dropped: resuming the answer where it stopped…");
    await sleep(drops === 1 ? 0 : Math.min(BACKOFF_MAX_MS, BACKOFF_MS * 2 ** (drops - 2)));
    const headers = requestHeaders(stream.lastEventId ? { "Last-Event-ID": stream.lastEventId } : {});
    response = null;
    try {
      const reply = await fetch(`/v1/query/stream/${encodeURIComponent(stream.requestId)}`, { headers });
      if (reply.ok) {
        response = reply;
      } else if (reply.status === 404) {
        show("message", "The answer is no longer available to resume: ask again.");
        $("answer").dataset.state = "error";
        return;
      } else if (reply.status < 500 && reply.status !== 429) {
        show("message", await explain(reply));
        $("answer").dataset.state = "error";
        return;
      }
    } catch (err) {
      stream.failure = err.message;
    }
    if (response) {
      resumes += 1;
      $("answer").dataset.resumes = String(resumes);
      $("answer").dataset.state = "streaming";
      show("notice", "");
    }
  }
}

async function ask(submitted) {
  submitted.preventDefault();
  const question = $("question").value.trim();
  if (!question) return;
  sources = [];
  answerText = "";
  show("message", "");
  show("notice", "");
  $("answer").replaceChildren();
  $("answer").dataset.state = "waiting";
  delete $("answer").dataset.resumes;
  $("badge").hidden = true;
  $("sources").replaceChildren();
  $("timings").replaceChildren();
  $("passage").hidden = true;
  $("submit").disabled = true;
  try {
    // The answer keeps being generated if the connection drops, so that the page can resume it.
    const body = { query: question, abort_on_disconnect: false };
    if ($("index").value) body.index = $("index").value;
    const response = await fetch("/v1/query/stream", {
      method: "POST",
      headers: requestHeaders({ "Content-Type": "application/json" }),
      body: JSON.stringify(body),
    });
    if (!response.ok) {
      show("message", await explain(response));
      $("answer").dataset.state = "error";
      return;
    }
    $("result").hidden = false;
    $("answer").dataset.state = "streaming";
    await resume({ requestId: response.headers.get("X-Request-Id"), lastEventId: null, failure: "" }, response);
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
