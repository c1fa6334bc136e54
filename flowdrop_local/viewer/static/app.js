// flowdrop-local viewer: reads the viewer's JSON endpoints and draws them.
// Stored content is data, never markup: every stored string reaches the page
// through textContent (or an <img> src limited to data: URLs). No innerHTML.
"use strict";

const PAGE = 100;

// The printed link's one-time code is traded for a cookie at "/" and redirected
// away; should an address with a query or fragment still reach the page, it
// leaves the address bar and this history entry.
if (location.search || location.hash) history.replaceState(null, "", "/");
const state = { address: null, before: null, after: null };

function $(id) {
  return document.getElementById(id);
}

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

async function api(path, params) {
  const query = new URLSearchParams(params || {});
  const response = await fetch(`/api/${path}?${query}`, { credentials: "same-origin" });
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function showError(error) {
  const box = $("error");
  box.textContent = error ? String(error.message || error) : "";
  box.hidden = !error;
}

// ------------------------------------------------------------ conversations

// "2026-12-01T08:48:51.070Z" -> "2026-12-01 08:48:51" (the full value as a tooltip).
function timeElement(className, value, prefix) {
  const node = el("time", className, `${prefix}${String(value).replace("T", " ").slice(0, 19)}`);
  node.dateTime = value;
  node.title = value;
  return node;
}

function addressText(address) {
  return address.join(" / ");
}

async function loadConversations() {
  try {
    const page = await api("conversations", { limit: 50, after: state.after || "" });
    const list = $("conversations");
    for (const item of page.items) {
      const row = el("li", "conversation");
      const button = el("button", "open");
      button.type = "button";
      button.dataset.scope = item.address[0];
      button.dataset.scopeId = item.address[1];
      button.dataset.key = item.address[2];
      button.append(el("span", "title", item.title || addressText(item.address)));
      const meta = el("span", "meta", `${item.count} messages`);
      if (item.updated_at) meta.append(timeElement("updated", item.updated_at, " · "));
      button.append(meta);
      button.addEventListener("click", () => openConversation(item.address, item.title));
      row.append(button);
      list.append(row);
    }
    state.after = page.next;
    $("more-conversations").hidden = !page.next;
    $("no-conversations").hidden = list.children.length > 0;
  } catch (error) {
    showError(error);
  }
}

// --------------------------------------------------------------- transcript

function drawParts(parts) {
  const box = el("div", "content");
  for (const part of parts) {
    if (part.kind === "text") {
      box.append(el("div", "text", part.text));
    } else if (part.kind === "image" && String(part.src).startsWith("data:image/")) {
      const image = el("img", "image");
      image.alt = "image";
      image.src = part.src;
      box.append(image);
    } else if (part.kind === "link" || part.kind === "image") {
      // A remote image is shown as its address, never fetched.
      const link = el("div", "link", `[${part.label || "image"}: `);
      link.append(el("span", "url", part.text || part.src), document.createTextNode("]"));
      box.append(link);
    } else {
      const pre = el("pre", "json", part.text);
      pre.title = part.type || "";
      box.append(pre);
    }
  }
  return box;
}

function mark(node, interrupted) {
  if (interrupted) node.append(" ", el("span", "interrupted", "interrupted"));
}

function drawCall(call) {
  const box = el("div", "call");
  const args = el("div", "args");
  const head = el("div", "label", "call ");
  head.append(el("span", "name", call.name), " ", el("span", "call-id", call.id));
  args.append(head, el("pre", "arguments", call.arguments));
  box.append(args);
  const result = el("div", "result");
  if (call.result) {
    const label = el("div", "label", "result");
    mark(label, call.result.interrupted);
    result.dataset.id = call.result.id;
    result.append(label, drawParts(call.result.content));
    if (call.result.interrupted) result.classList.add("is-interrupted");
  } else {
    result.append(el("div", "label pending", "no result yet"));
  }
  box.append(result);
  return box;
}

function drawEntry(entry) {
  const item = el("li", `message role-${entry.role}`);
  item.dataset.id = entry.id;
  item.dataset.position = entry.position;
  const head = el("div", "head");
  head.append(el("span", "role", entry.role));
  if (entry.answers !== null) head.append(" ", el("span", "answers", `answers ${entry.answers}`));
  mark(head, entry.interrupted);
  if (entry.created_at) head.append(" ", timeElement("created", entry.created_at, ""));
  item.append(head, drawParts(entry.content));
  for (const call of entry.calls) item.append(drawCall(call));
  if (entry.interrupted) item.classList.add("is-interrupted");
  return item;
}

async function openConversation(address, title) {
  showError(null);
  state.address = address;
  state.before = null;
  $("search-results").hidden = true;
  $("placeholder").hidden = true;
  $("conversation").hidden = false;
  $("conversation-title").textContent = title || addressText(address);
  $("transcript").replaceChildren();
  for (const button of document.querySelectorAll("#conversations .open")) {
    const same =
      button.dataset.scope === address[0] &&
      button.dataset.scopeId === address[1] &&
      button.dataset.key === address[2];
    button.classList.toggle("selected", same);
  }
  await loadPage(true);
}

async function loadPage(first) {
  const [scope, scope_id, key] = state.address;
  const params = { scope, scope_id, key, limit: PAGE };
  if (!first) params.before = state.before;
  try {
    const page = await api("transcript", params);
    const list = $("transcript");
    const anchor = list.firstElementChild;
    const top = anchor ? anchor.getBoundingClientRect().top : 0;
    list.prepend(...page.entries.map(drawEntry));
    $("conversation-count").textContent = `${page.count} messages, ${list.children.length} shown`;
    state.before = page.before;
    $("older").hidden = !page.before;
    $("start").hidden = Boolean(page.before);
    if (first) {
      window.scrollTo(0, document.body.scrollHeight);
    } else if (anchor) {
      window.scrollBy(0, anchor.getBoundingClientRect().top - top);
    }
  } catch (error) {
    showError(error);
  }
}

// ------------------------------------------------------------------- search

async function runSearch(event) {
  event.preventDefault();
  showError(null);
  const query = $("search").value;
  $("placeholder").hidden = true;
  $("conversation").hidden = true;
  $("search-results").hidden = false;
  const hits = $("hits");
  hits.replaceChildren();
  try {
    const result = await api("search", { q: query, limit: 20 });
    const hint = $("search-hint");
    if (!result.enabled) {
      hint.textContent = result.hint;
    } else if (result.hits.length === 0) {
      hint.textContent = query.trim() ? "No messages match." : "Type words to search for.";
    } else {
      hint.textContent = "";
    }
    hint.hidden = !hint.textContent;
    for (const hit of result.hits) {
      const item = el("li", "hit");
      const button = el("button", "open-hit");
      button.type = "button";
      button.append(el("span", "title", addressText(hit.address)), " ", el("span", "role", hit.role));
      const snippet = el("div", "snippet");
      for (const segment of hit.segments) {
        snippet.append(segment.mark ? el("mark", null, segment.text) : document.createTextNode(segment.text));
      }
      button.append(snippet);
      button.addEventListener("click", () => openConversation(hit.address, ""));
      item.append(button);
      hits.append(item);
    }
  } catch (error) {
    showError(error);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("more-conversations").addEventListener("click", loadConversations);
  $("older").addEventListener("click", () => loadPage(false));
  $("search-form").addEventListener("submit", runSearch);
  loadConversations();
});
