/* llambda chat page: conversations kept in this browser (localStorage), answers streamed from this
   server's /v1/chat/completions (SSE). No dependencies, nothing fetched from anywhere else.
   Model text is never inserted as HTML: it is escaped first, and only the markup below is added.
   Images (a model with a vision tower: GET /v1/models' meta.vision) are attached with the button, pasted or
   dropped, kept in the message as data: URLs, sent as OpenAI's image_url parts, shown through blob: URLs. */
"use strict";

// ---- markdown: escape, then a few block and inline rules -------------------------------------

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
function escapeHtml(s) {
  return s.replace(/[&<>"']/g, (c) => ESCAPES[c]);
}

// Only these link targets become links; anything else (javascript:, data:, relative) stays text.
function safeHref(href) {
  return /^(https?:\/\/|mailto:)/i.test(href);
}

// Inline rules on one line or list item. Code spans and links become placeholders (\0N\0) so the
// emphasis rules cannot reach into them; \0 cannot occur in the input (renderMarkdown strips it).
function inline(text) {
  const held = [];
  const hold = (html) => `\0${held.push(html) - 1}\0`;
  let s = escapeHtml(text);
  s = s.replace(/`([^`]+)`/g, (_, code) => hold(`<code>${code}</code>`));
  // a code span inside the target (a placeholder) would be pasted into the href: such a link stays text
  s = s.replace(/\[([^\]]+)\]\(([^()\s]+)\)/g, (all, label, href) =>
    safeHref(href) && !href.includes("\0")
      ? hold(`<a href="${href}" target="_blank" rel="noopener noreferrer">${emphasis(label)}</a>`) : all);
  s = emphasis(s);
  // recursive: a link's label may hold a code span (held before the link)
  const unhold = (t) => t.replace(/\0(\d+)\0/g, (_, i) => unhold(held[+i]));
  return unhold(s);
}

function emphasis(s) {
  return s
    .replace(/\*\*(?=\S)(.+?)\*\*/g, "<strong>$1</strong>")
    .replace(/__(?=\S)(.+?)__/g, "<strong>$1</strong>")
    .replace(/(^|[^*\w])\*(?=\S)([^*]+?)\*(?!\w)/g, "$1<em>$2</em>")
    .replace(/(^|[^_\w])_(?=\S)([^_]+?)_(?!\w)/g, "$1<em>$2</em>")
    .replace(/~~(?=\S)(.+?)~~/g, "<del>$1</del>");
}

// Blocks: fenced code (``` or ~~~, highlighted; an unclosed fence runs to the end, as while streaming),
// headings, rules, lists, quotes, paragraphs (single newlines kept as <br>).
function renderMarkdown(src) {
  const lines = src.replace(/\0/g, "").replace(/\r\n?/g, "\n").split("\n");
  const out = [];
  let para = [];
  let quote = [];
  let list = null;
  const flushPara = () => {
    if (para.length) out.push(`<p>${para.map(inline).join("<br>")}</p>`);
    para = [];
  };
  const flushQuote = () => {
    if (quote.length) out.push(`<blockquote>${quote.map(inline).join("<br>")}</blockquote>`);
    quote = [];
  };
  const flushList = () => {
    if (!list) return;
    const start = list.tag === "ol" && list.start !== 1 ? ` start="${list.start}"` : "";
    out.push(`<${list.tag}${start}>${list.items.map((i) => `<li>${inline(i)}</li>`).join("")}</${list.tag}>`);
    list = null;
  };
  const flush = () => { flushPara(); flushQuote(); flushList(); };

  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    let m = line.match(/^\s*(`{3,}|~{3,})\s*([\w+#.-]*)/);
    if (m) {
      flush();
      const close = new RegExp(`^\\s*${m[1][0]}{${m[1].length},}\\s*$`);
      const body = [];
      for (i++; i < lines.length && !close.test(lines[i]); i++) body.push(lines[i]);
      const lang = m[2].toLowerCase();
      const cls = lang ? ` class="language-${escapeHtml(lang)}"` : "";
      out.push(`<pre><code${cls}>${highlight(body.join("\n"), lang)}</code></pre>`);
      continue;
    }
    if (!line.trim()) { flush(); continue; }
    if ((m = line.match(/^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/))) {
      flush();
      out.push(`<h${m[1].length}>${inline(m[2])}</h${m[1].length}>`);
      continue;
    }
    if (/^\s{0,3}([-*_])(\s*\1){2,}\s*$/.test(line)) { flush(); out.push("<hr>"); continue; }
    if ((m = line.match(/^\s*(?:([-*+])|(\d{1,9})[.)])\s+(.*)$/))) {
      const tag = m[1] ? "ul" : "ol";
      flushPara(); flushQuote();
      if (!list || list.tag !== tag) { flushList(); list = { tag, items: [], start: Number(m[2] || 1) }; }
      list.items.push(m[3]);
      continue;
    }
    if ((m = line.match(/^\s*>\s?(.*)$/))) { flushPara(); flushList(); quote.push(m[1]); continue; }
    if (list && /^\s+\S/.test(line)) { list.items[list.items.length - 1] += " " + line.trim(); continue; }
    flushQuote(); flushList();
    para.push(line);
  }
  flush();
  return out.join("\n");
}

// ---- code highlighting: comments, strings, numbers and keywords, per language family ---------------

const KEYWORDS = {
  python: "and as assert async await break class continue def del elif else except False finally for from " +
    "global if import in is lambda None nonlocal not or pass raise return True try while with yield match case self",
  js: "async await break case catch class const continue debugger default delete do else export extends false " +
    "finally for function if import in instanceof let new null of return static super switch this throw true try " +
    "typeof undefined var void while yield interface type enum",
  c: "auto bool break case char class const continue default delete do double else enum extern false float for " +
    "goto if include define inline int long namespace new NULL nullptr private protected public return short " +
    "signed sizeof static struct switch template this true typedef typename union unsigned using virtual void " +
    "volatile while import package final boolean String",
  rust: "as async await break const continue crate dyn else enum extern false fn for if impl in let loop match mod " +
    "move mut pub ref return self Self static struct super trait true type unsafe use where while Some None Ok Err",
  go: "break case chan const continue default defer else fallthrough false for func go goto if import interface " +
    "map nil package range return select struct switch true type var",
  sh: "case do done elif else esac export fi for function if in local return then until while echo exit set",
  sql: "select from where insert into values update set delete create table drop alter join left right inner " +
    "outer on group by order having limit and or not null as distinct union primary key",
};
const LANGS = {
  py: "python", python3: "python", javascript: "js", ts: "js", typescript: "js", jsx: "js", tsx: "js", json: "js",
  cpp: "c", "c++": "c", cc: "c", h: "c", hpp: "c", java: "c", cs: "c", csharp: "c", rs: "rust", golang: "go",
  bash: "sh", shell: "sh", zsh: "sh", console: "sh",
};
const PLAIN = new Set(["text", "txt", "plain", "plaintext", "markdown", "md"]);
const C_COMMENTS = String.raw`\/\/.*|\/\*[\s\S]*?(?:\*\/|$)`;
const COMMENTS = { python: "#.*", sh: "#.*", sql: "--.*", js: C_COMMENTS, c: C_COMMENTS, rust: C_COMMENTS, go: C_COMMENTS };
const STRINGS = String.raw`"(?:[^"\\\n]|\\.)*"?|'(?:[^'\\\n]|\\.)*'?|` + "`(?:[^`\\\\]|\\\\.)*`?";
const NUMBERS = String.raw`\b(?:0x[0-9a-fA-F]+|\d[\d_]*(?:\.\d+)?(?:[eE][+-]?\d+)?)\b`;
const ALL_WORDS = new Set(Object.values(KEYWORDS).join(" ").split(" "));

function highlight(code, lang) {
  const name = LANGS[lang] || lang;
  if (PLAIN.has(name)) return escapeHtml(code);
  const known = name in KEYWORDS;
  const words = known ? new Set(KEYWORDS[name].split(" ")) : ALL_WORDS;
  // an unknown language: C-style comments, and # comments only where a line or a word gap starts them
  const comment = COMMENTS[name] || `${C_COMMENTS}|(?:^|(?<=\\s))#.*`;
  const re = new RegExp(`(${comment})|(${STRINGS})|(${NUMBERS})|([A-Za-z_$][\\w$]*)`, "gm");
  const caseless = name === "sql";
  let out = "";
  let last = 0;
  for (const m of code.matchAll(re)) {
    const t = m[0];
    out += escapeHtml(code.slice(last, m.index));
    last = m.index + t.length;
    const kind = m[1] ? "com" : m[2] ? "str" : m[3] ? "num"
      : words.has(caseless ? t.toLowerCase() : t) ? "kw" : null;
    out += kind ? `<span class="tok-${kind}">${escapeHtml(t)}</span>` : escapeHtml(t);
  }
  return out + escapeHtml(code.slice(last));
}

// ---- storage -------------------------------------------------------------------------------

const STORE = "llambda.chat.v1";          // {conversations: [...], current: id}
const SETTINGS = "llambda.settings.v1";
const KEY = "llambda.apiKey";

function readJSON(name, fallback) {
  try {
    return JSON.parse(localStorage.getItem(name)) || fallback;
  } catch {
    return fallback;
  }
}

const state = {
  conversations: [],    // newest first: {id, title, messages: [{role, content, images, stats, status}]}
  images: [],           // the images attached to the message being written: data: URLs
  current: null,        // id of the open conversation, null for a new one
  settings: {},         // system, temperature, top_p, max_tokens, seed, extra
  model: null,          // the first card of GET /v1/models
  live: null,           // {conv, answer, controller} while an answer streams
};

function saveChats() {
  try {
    localStorage.setItem(STORE, JSON.stringify({ conversations: state.conversations, current: state.current }));
  } catch (e) {
    // over the browser's quota (a few MB), most likely with images: keep the conversations without them
    // rather than none at all; this page still holds them until it is closed
    const stripped = state.conversations.map((c) => ({ ...c, messages: c.messages.map((m) => m.images?.length
      ? { ...m, images: [], imagesNotKept: m.images.length + (m.imagesNotKept || 0) } : m) }));
    try {
      localStorage.setItem(STORE, JSON.stringify({ conversations: stripped, current: state.current }));
      showNotice("The images are too large to keep in this browser: the conversations are kept without them");
    } catch {
      showNotice(`Could not save the conversation in this browser: ${e.message}`);
    }
  }
}

function currentConv() {
  return state.conversations.find((c) => c.id === state.current) || null;
}

// ---- the server ----------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = localStorage.getItem(KEY);
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

async function apiError(resp) {
  let message = `${resp.status} ${resp.statusText}`;
  try {
    const body = await resp.json();
    if (body.error && body.error.message) message = body.error.message;
  } catch { /* not JSON: keep the status line */ }
  return new ApiError(resp.status, message);
}

async function loadModel() {
  const info = $("model-info");
  try {
    const resp = await fetch("v1/models", { headers: headers() });
    if (resp.status === 401) {
      info.textContent = "API key needed";
      askKey(localStorage.getItem(KEY) ? "The server refused this key." : "");
      return false;
    }
    if (!resp.ok) throw await apiError(resp);
    state.model = (await resp.json()).data[0];
    const meta = state.model.meta || {};
    info.textContent = `Model ${state.model.id}` + (meta.n_ctx ? ` · context ${meta.n_ctx}` : "") +
      (meta.slots ? ` · ${meta.slots} slots` : "") + (meta.vision ? " · images" : "");
    showImageInput();
    return true;
  } catch (e) {
    info.textContent = `Cannot reach the model: ${e.message}`;
    return false;
  }
}

function requestBody(conv) {
  const s = state.settings;
  const messages = [];
  if (s.system) messages.push({ role: "system", content: s.system });
  for (const m of conv.messages) {
    if (m === state.live?.answer || (m.role === "assistant" && m.status === "error")) continue;
    messages.push({ role: m.role, content: m.images?.length ? imageContent(m) : m.content });
  }
  const sampling = {};
  for (const k of ["temperature", "top_p", "max_tokens", "seed"]) if (s[k] !== undefined) sampling[k] = s[k];
  return { ...sampling, ...(s.extra || {}), model: state.model?.id, messages, stream: true,
    stream_options: { include_usage: true } };
}

// Reads the SSE body, calling onChunk per JSON event; an error event ends the answer with its message.
async function readEvents(resp, onChunk, onRead) {
  const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += value;
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new ApiError(chunk.error.code || 500, chunk.error.message);
        onChunk(chunk);
      }
    }
    onRead();
  }
}

function statsLine(usage, t0, tFirst, tEnd) {
  if (!usage) return "";
  const n = usage.completion_tokens;
  // tokens/s of decoding: from the first token to the last (the prompt's time is shown apart)
  const tps = tFirst !== null && n > 1 ? (n - 1) / ((tEnd - tFirst) / 1000) : n / ((tEnd - t0) / 1000);
  let line = `${n} tokens · ${tps.toFixed(1)} tokens/s`;
  if (tFirst !== null) line += ` · first token after ${Math.round(tFirst - t0)} ms`;
  return `${line} · prompt ${usage.prompt_tokens} tokens`;
}

// A message with images as OpenAI's content parts: the images (data: URLs), then the text.
function imageContent(m) {
  const parts = m.images.map((url) => ({ type: "image_url", image_url: { url } }));
  if (m.content) parts.push({ type: "text", text: m.content });
  return parts;
}

async function send(text, images = []) {
  if (state.live || (!text.trim() && !images.length)) return;
  let conv = currentConv();
  if (!conv) {
    conv = { id: `${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`, title: "", messages: [] };
    state.conversations.unshift(conv);
    state.current = conv.id;
  }
  if (!conv.title) conv.title = text.trim().replace(/\s+/g, " ").slice(0, 60) || "Image";
  conv.messages.push(images.length ? { role: "user", content: text, images } : { role: "user", content: text });
  const answer = { role: "assistant", content: "" };
  conv.messages.push(answer);
  const controller = new AbortController();
  state.live = { conv, answer, controller };
  const body = requestBody(conv);
  saveChats();
  render();
  setBusy(true);

  const t0 = performance.now();
  let tFirst = null;
  let usage = null;
  let lastSave = t0;
  try {
    const resp = await fetch("v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(body), signal: controller.signal,
    });
    if (!resp.ok) throw await apiError(resp);
    await readEvents(resp, (chunk) => {
      if (chunk.usage) usage = chunk.usage;
      const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
      if (delta && delta.reasoning_content) {      // a reasoning model's thought, before the answer
        if (tFirst === null) tFirst = performance.now();
        answer.reasoning = (answer.reasoning || "") + delta.reasoning_content;
      }
      if (delta && delta.content) {
        if (tFirst === null) tFirst = performance.now();
        answer.content += delta.content;
      }
    }, () => {
      updateLive();
      if (performance.now() - lastSave > 1000) { lastSave = performance.now(); saveChats(); }
    });
    answer.status = "done";
    answer.stats = statsLine(usage, t0, tFirst, performance.now());
  } catch (e) {
    if (e.name === "AbortError") {
      answer.status = "stopped";
      answer.stats = "Stopped.";
    } else {
      answer.status = "error";
      answer.stats = e.message;
      if (e.status === 401) askKey(localStorage.getItem(KEY) ? "The server refused this key." : "");
    }
  } finally {
    state.live = null;
    setBusy(false);
    saveChats();
    render();
  }
}

function stop() {
  if (state.live) state.live.controller.abort();
}

// ---- the page ------------------------------------------------------------------------------

function $(id) {
  return document.getElementById(id);
}

function showNotice(text) {
  $("model-info").textContent = text;
}

function setBusy(busy) {
  $("send").hidden = busy;
  $("stop").hidden = !busy;
}

function messageElement(m, live) {
  const el = document.createElement("article");
  el.className = `msg ${m.role}` + (live ? " streaming" : "");
  el.dataset.status = live ? "streaming" : m.status || "done";
  if (live) el.setAttribute("aria-busy", "true");   // screen readers read the answer once it is complete
  const who = document.createElement("div");
  who.className = "who";
  who.textContent = m.role === "user" ? "You" : "llambda";
  const thought = document.createElement("details");   // folded: the reasoning is there when wanted
  thought.className = "thinking";
  const summary = document.createElement("summary");
  summary.textContent = "Thinking";
  const thoughtText = document.createElement("div");
  thoughtText.className = "text";
  thought.append(summary, thoughtText);
  const body = document.createElement("div");
  body.className = "body";
  const stats = document.createElement("div");
  stats.className = "stats" + (m.status === "error" ? " error" : "");
  if (m.status === "error") stats.setAttribute("role", "alert");
  fillMessage(body, stats, m, thought);
  el.append(who, thought);
  if (m.images?.length || m.imagesNotKept) {
    const images = document.createElement("div");
    images.className = "images";
    (m.images || []).forEach((url, i) => images.append(thumbnail(url, `Image ${i + 1}`)));
    if (m.imagesNotKept) {
      const lost = document.createElement("span");
      lost.className = "lost";
      lost.textContent = `${m.imagesNotKept} image${m.imagesNotKept > 1 ? "s" : ""} not kept in this browser`;
      images.append(lost);
    }
    el.append(images);
    body.hidden = !m.content;
  }
  el.append(body, stats);
  return el;
}

function fillMessage(body, stats, m, thought) {
  if (m.role === "user") body.textContent = m.content;
  else body.innerHTML = renderMarkdown(m.content);   // escaped by renderMarkdown
  stats.textContent = m.stats || "";
  thought.hidden = !m.reasoning;
  thought.querySelector(".text").textContent = m.reasoning || "";
}

function render() {
  const conv = currentConv();
  $("chat-title").textContent = conv ? conv.title : "New chat";
  const list = $("conversations");
  list.replaceChildren();
  for (const c of state.conversations) {
    const li = document.createElement("li");
    if (c.id === state.current) li.setAttribute("aria-current", "true");
    const open = document.createElement("button");
    open.type = "button";
    open.className = "open";
    open.textContent = c.title || "Untitled";
    open.title = c.title;
    open.addEventListener("click", () => { state.current = c.id; saveChats(); render(); });
    const del = document.createElement("button");
    del.type = "button";
    del.className = "delete";
    del.textContent = "✕";
    del.setAttribute("aria-label", `Delete conversation: ${c.title || "Untitled"}`);
    del.addEventListener("click", () => deleteConv(c.id));
    li.append(open, del);
    list.append(li);
  }
  const box = $("messages");
  box.replaceChildren();
  if (!conv || !conv.messages.length) {
    const empty = document.createElement("p");
    empty.className = "empty";
    empty.textContent = "Ask anything. Enter sends, Shift+Enter starts a new line.";
    box.append(empty);
    return;
  }
  for (const m of conv.messages) box.append(messageElement(m, m === state.live?.answer));
  box.scrollTop = box.scrollHeight;
}

// Re-render only the streaming answer; follow it down unless the user scrolled up to read.
function updateLive() {
  const live = state.live;
  if (!live || live.conv.id !== state.current) return;
  const box = $("messages");
  const el = box.lastElementChild;
  if (!el || !el.classList.contains("streaming")) return;
  const follow = box.scrollHeight - box.scrollTop - box.clientHeight < 60;
  fillMessage(el.querySelector(".body"), el.querySelector(".stats"), live.answer, el.querySelector(".thinking"));
  if (follow) box.scrollTop = box.scrollHeight;
}

function deleteConv(id) {
  if (state.live && state.live.conv.id === id) stop();
  state.conversations = state.conversations.filter((c) => c.id !== id);
  if (state.current === id) state.current = null;
  saveChats();
  render();
}

function askKey(error) {
  const dialog = $("key-dialog");
  $("key-error").textContent = error;
  $("key-error").hidden = !error;
  if (!dialog.open) dialog.showModal();
  $("api-key").focus();
}

// ---- images --------------------------------------------------------------------------------

const MAX_IMAGE_BYTES = 20 * 1024 * 1024;   // the server's bound on one image's file
const objectUrls = new Map();               // data: URL -> blob: URL (the CSP shows no data: image)

function visionModel() {
  return state.model?.meta?.vision === true;
}

// The blob: URL showing a data: URL's image, made once per image.
function objectUrl(dataUrl) {
  let url = objectUrls.get(dataUrl);
  if (url) return url;
  const comma = dataUrl.indexOf(",");
  const type = dataUrl.slice(5, comma).split(";")[0];
  try {
    const bytes = Uint8Array.from(atob(dataUrl.slice(comma + 1)), (c) => c.charCodeAt(0));
    url = URL.createObjectURL(new Blob([bytes], { type: type.startsWith("image/") ? type : "image/png" }));
  } catch {
    url = "";       // not base64 (a damaged stored conversation): no picture, the alt text says what it was
  }
  objectUrls.set(dataUrl, url);
  return url;
}

function thumbnail(dataUrl, alt) {
  const img = document.createElement("img");
  img.className = "thumb";
  img.alt = alt;
  img.src = objectUrl(dataUrl);
  return img;
}

function showImageInput() {
  $("attach").hidden = !visionModel();
  renderAttachments();
}

function renderAttachments() {
  const box = $("attachments");
  box.replaceChildren();
  state.images.forEach((url, i) => {
    const fig = document.createElement("figure");
    const remove = document.createElement("button");
    remove.type = "button";
    remove.className = "remove";
    remove.textContent = "✕";
    remove.setAttribute("aria-label", `Remove image ${i + 1}`);
    remove.addEventListener("click", () => { state.images.splice(i, 1); renderAttachments(); });
    fig.append(thumbnail(url, `Image ${i + 1} to send`), remove);
    box.append(fig);
  });
  box.hidden = !state.images.length;
}

function readAsDataURL(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

// Attach the image files among `files` (the picker's, a paste's, a drop's); what cannot be sent is said.
async function attachFiles(files) {
  if (!visionModel()) {
    showNotice(`${state.model ? state.model.id : "This model"} takes no images (it has no vision tower)`);
    return;
  }
  for (const file of files) {
    if (!file.type.startsWith("image/")) {
      showNotice(`${file.name || "The file"} is not an image`);
      continue;
    }
    if (file.size > MAX_IMAGE_BYTES) {
      showNotice(`${file.name || "The image"} is larger than 20 MB`);
      continue;
    }
    try {
      state.images.push(await readAsDataURL(file));
    } catch (e) {
      showNotice(`Could not read ${file.name || "the image"}: ${e.message}`);
    }
  }
  renderAttachments();
}

function hasFiles(ev) {
  return [...(ev.dataTransfer?.types || [])].includes("Files");
}

// ---- settings ------------------------------------------------------------------------------

const NUMBER_FIELDS = { temperature: "temperature", top_p: "top-p", max_tokens: "max-tokens", seed: "seed" };

function fillSettings() {
  const s = state.settings;
  $("system-prompt").value = s.system || "";
  for (const [k, id] of Object.entries(NUMBER_FIELDS)) $(id).value = s[k] ?? "";
  $("extra").value = s.extra ? JSON.stringify(s.extra) : "";
  $("settings-error").hidden = true;
}

function saveSettings(ev) {
  ev.preventDefault();
  const s = { system: $("system-prompt").value.trim() };
  for (const [k, id] of Object.entries(NUMBER_FIELDS)) {
    const v = $(id).value.trim();
    if (v !== "") s[k] = Number(v);
  }
  const extra = $("extra").value.trim();
  if (extra) {
    try {
      s.extra = JSON.parse(extra);
      if (typeof s.extra !== "object" || s.extra === null || Array.isArray(s.extra)) throw new Error("not an object");
    } catch (e) {
      $("settings-error").textContent = `Extra request fields must be a JSON object (${e.message}).`;
      $("settings-error").hidden = false;
      return;
    }
  }
  state.settings = s;
  localStorage.setItem(SETTINGS, JSON.stringify(s));
  toggleSettings(false);
}

function toggleSettings(open) {
  const panel = $("settings");
  if (open) fillSettings();
  panel.hidden = !open;
  $("settings-toggle").setAttribute("aria-expanded", String(open));
  if (open) $("system-prompt").focus();
}

// ---- wiring --------------------------------------------------------------------------------

function init() {
  const saved = readJSON(STORE, {});
  state.conversations = Array.isArray(saved.conversations) ? saved.conversations : [];
  state.current = saved.current || null;
  // an answer cut off by a reload mid-stream is kept as it was, marked as stopped
  for (const c of state.conversations) for (const m of c.messages) if (m.status === undefined && m.role === "assistant") m.status = "stopped";
  state.settings = readJSON(SETTINGS, {});
  render();

  const input = $("input");
  $("composer").addEventListener("submit", (ev) => {
    ev.preventDefault();
    if (state.live) return;
    const text = input.value;
    const images = state.images;
    if (!text.trim() && !images.length) return;
    input.value = "";
    state.images = [];
    renderAttachments();
    send(text, images);
  });
  $("attach").addEventListener("click", () => $("image-input").click());
  $("image-input").addEventListener("change", (ev) => {
    attachFiles([...ev.target.files]);
    ev.target.value = "";       // the same file may be picked again
  });
  input.addEventListener("paste", (ev) => {
    const files = [...(ev.clipboardData?.files || [])].filter((f) => f.type.startsWith("image/"));
    if (!files.length || !visionModel()) return;      // text is pasted as usual
    ev.preventDefault();
    attachFiles(files);
  });
  const chat = document.querySelector(".chat");
  chat.addEventListener("dragover", (ev) => {
    if (!hasFiles(ev)) return;
    ev.preventDefault();      // (not opening the file in place of the page)
    ev.dataTransfer.dropEffect = "copy";      // a text model's drop too: attachFiles says it takes no images
    chat.classList.toggle("dragging", visionModel());
  });
  chat.addEventListener("dragleave", (ev) => {
    if (!chat.contains(ev.relatedTarget)) chat.classList.remove("dragging");
  });
  chat.addEventListener("drop", (ev) => {
    if (!hasFiles(ev)) return;
    ev.preventDefault();
    chat.classList.remove("dragging");
    attachFiles([...ev.dataTransfer.files]);
  });
  input.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
      ev.preventDefault();
      $("composer").requestSubmit();
    } else if (ev.key === "Escape") {
      stop();
    }
  });
  $("stop").addEventListener("click", stop);
  $("new-chat").addEventListener("click", () => {
    state.current = null;
    saveChats();
    render();
    input.focus();
  });
  $("settings-toggle").addEventListener("click", () => toggleSettings($("settings").hidden));
  $("settings").addEventListener("submit", saveSettings);
  $("forget-key").addEventListener("click", () => { localStorage.removeItem(KEY); loadModel(); });
  $("key-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const key = $("api-key").value.trim();
    // keys are printable ASCII (the server refuses others); any other character makes every fetch throw,
    // and kept, it left the page unable to reach the server with no key dialog after a reload
    if (!/^[\x20-\x7e]+$/.test(key)) {
      askKey("An API key is made of printable ASCII characters only.");
      return;
    }
    localStorage.setItem(KEY, key);
    if (await loadModel()) {
      $("key-dialog").close();
      input.focus();
    }
  });
  window.addEventListener("beforeunload", saveChats);
  loadModel();
}

document.addEventListener("DOMContentLoaded", init);
