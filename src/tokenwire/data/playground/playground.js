// tokenwire playground: chat over JSON-SSE or Codec frames, decoded here, and a status view.
// No build step and no library: the frame decoders below follow codec-spec §1.1 (msgpack
// maps, concatenated; the 4-byte-prefixed form is accepted too) and §1.2 (4-byte big-endian
// length, then a proto3 CodecFrame). Served by src/tokenwire/gateway/http/playground.py.
"use strict";

const KEY_STORE = "tokenwire.key"; // sessionStorage: gone with the tab, never in a URL
const MAX_FRAME_BYTES = 16 * 1024 * 1024; // the draft's default frame-size cap (§1.2)
const MAX_DEPTH = 8; // frames are flat; deeper nesting is refused, not recursed into
const STATUS_POLL_MS = 2000;
const CHART_POINTS = 60;
// The coding is chosen with these (gateway/http/generation.py): scripts cannot set
// Accept-Encoding, and never see the bytes of a Content-Encoding body.
const ACCEPT_HEADER = "Tokenwire-Accept-Encoding";
const RAW_HEADER = "Tokenwire-Raw-Body";
const RAW_CODING_HEADER = "Tokenwire-Content-Encoding";

const $ = (id) => document.getElementById(id);
const state = { key: sessionStorage.getItem(KEY_STORE) || "", models: [], maps: new Map(),
  busy: false, poll: null, tpsSeries: [], lastTokens: null };

// -- errors ---------------------------------------------------------------------------------

class PageError extends Error {}

function showError(message) {
  const box = $("error");
  box.textContent = message;
  box.hidden = !message;
}

async function apiError(resp) {
  let message = "";
  try {
    const body = await resp.json();
    message = (body.error && (body.error.message || body.error)) || JSON.stringify(body);
  } catch (e) {
    message = resp.statusText || "no message";
  }
  const hint = resp.status === 401 ? " Enter the gateway's API key at the top right." : "";
  return new PageError(`The server answered ${resp.status}: ${message}${hint}`);
}

function authHeaders(extra) {
  const h = Object.assign({}, extra || {});
  if (state.key) h.Authorization = "Bearer " + state.key;
  return h;
}

async function getJSON(path) {
  const resp = await fetch(path, { headers: authHeaders(), cache: "no-store" });
  if (!resp.ok) throw await apiError(resp);
  return resp.json();
}

// -- msgpack (codec-spec §1.1) ----------------------------------------------------------------

const NEED_MORE = Symbol("need more bytes");

class Reader {
  constructor(buf, pos, end) { this.buf = buf; this.pos = pos; this.end = end; }
  need(n) { if (this.pos + n > this.end) throw NEED_MORE; }
  u8() { this.need(1); return this.buf[this.pos++]; }
  uint(n) {
    this.need(n);
    let v = 0;
    for (let i = 0; i < n; i++) v = v * 256 + this.buf[this.pos++];
    return v;
  }
  bytes(n) { this.need(n); const out = this.buf.subarray(this.pos, this.pos + n); this.pos += n; return out; }
}

const utf8 = new TextDecoder("utf-8", { fatal: true });

function mpValue(r, depth) {
  if (depth > MAX_DEPTH) throw new PageError("msgpack: nesting deeper than frames have");
  const b = r.u8();
  if (b <= 0x7f) return b;
  if (b >= 0xe0) return b - 0x100;
  if (b >= 0x80 && b <= 0x8f) return mpMap(r, b & 0x0f, depth);
  if (b >= 0x90 && b <= 0x9f) return mpArray(r, b & 0x0f, depth);
  if (b >= 0xa0 && b <= 0xbf) return utf8.decode(r.bytes(b & 0x1f));
  switch (b) {
    case 0xc0: return null;
    case 0xc2: return false;
    case 0xc3: return true;
    case 0xc4: return r.bytes(r.uint(1));
    case 0xc5: return r.bytes(r.uint(2));
    case 0xc6: return r.bytes(r.uint(4));
    case 0xca: { r.need(4); const v = new DataView(r.buf.buffer, r.buf.byteOffset + r.pos, 4); r.pos += 4; return v.getFloat32(0); }
    case 0xcb: { r.need(8); const v = new DataView(r.buf.buffer, r.buf.byteOffset + r.pos, 8); r.pos += 8; return v.getFloat64(0); }
    case 0xcc: return r.uint(1);
    case 0xcd: return r.uint(2);
    case 0xce: return r.uint(4);
    case 0xcf: { const v = r.uint(8); if (v > Number.MAX_SAFE_INTEGER) throw new PageError("msgpack: uint64 too large"); return v; }
    case 0xd0: { const v = r.uint(1); return v >= 0x80 ? v - 0x100 : v; }
    case 0xd1: { const v = r.uint(2); return v >= 0x8000 ? v - 0x10000 : v; }
    case 0xd2: { const v = r.uint(4); return v >= 0x80000000 ? v - 0x100000000 : v; }
    case 0xd9: return utf8.decode(r.bytes(r.uint(1)));
    case 0xda: return utf8.decode(r.bytes(r.uint(2)));
    case 0xdb: return utf8.decode(r.bytes(r.uint(4)));
    case 0xdc: return mpArray(r, r.uint(2), depth);
    case 0xdd: return mpArray(r, r.uint(4), depth);
    case 0xde: return mpMap(r, r.uint(2), depth);
    case 0xdf: return mpMap(r, r.uint(4), depth);
    default: throw new PageError(`msgpack: type byte 0x${b.toString(16)} cannot appear in a Codec frame`);
  }
}

function mpArray(r, n, depth) {
  if (n > r.end - r.pos) r.need(n); // every element takes at least one byte
  const out = new Array(n);
  for (let i = 0; i < n; i++) out[i] = mpValue(r, depth + 1);
  return out;
}

function mpMap(r, n, depth) {
  if (2 * n > r.end - r.pos) r.need(2 * n);
  const out = {};
  for (let i = 0; i < n; i++) {
    const k = mpValue(r, depth + 1);
    if (typeof k !== "string") throw new PageError("msgpack: frame keys are strings");
    out[k] = mpValue(r, depth + 1);
  }
  return out;
}

// A streaming decoder: feed(bytes) returns the complete frames, each {frame, size}.
class MsgpackFrames {
  constructor() { this.buf = new Uint8Array(0); }
  feed(chunk) {
    const buf = concat(this.buf, chunk);
    const out = [];
    let pos = 0;
    while (pos < buf.length) {
      let r, start = pos;
      if (buf[pos] === 0x00) { // a 4-byte length prefix (the overview's form): never a map byte
        if (buf.length - pos < 4) break;
        const n = new DataView(buf.buffer, buf.byteOffset + pos, 4).getUint32(0);
        if (n > MAX_FRAME_BYTES) throw new PageError(`msgpack: a ${n}-byte frame is over the limit`);
        if (buf.length - pos - 4 < n) break;
        r = new Reader(buf, pos + 4, pos + 4 + n);
      } else {
        r = new Reader(buf, pos, buf.length);
      }
      let value;
      try { value = mpValue(r, 0); } catch (e) {
        if (e !== NEED_MORE) throw e;
        if (buf.length - pos > MAX_FRAME_BYTES) throw new PageError("msgpack: frame over the size limit");
        break;
      }
      out.push({ frame: checkFrame(value), size: r.pos - start });
      pos = r.pos;
    }
    this.buf = buf.subarray(pos);
    return out;
  }
  finish() { if (this.buf.length) throw new PageError(`the stream ended inside a frame (${this.buf.length} bytes left)`); }
}

function checkFrame(v) {
  if (v === null || typeof v !== "object" || Array.isArray(v)) throw new PageError("a Codec frame must be a map");
  const ids = v.ids === undefined ? [] : v.ids;
  if (!Array.isArray(ids) || ids.some((i) => !Number.isInteger(i) || i < 0 || i > 0xffffffff)) {
    throw new PageError("a Codec frame's ids must be unsigned 32-bit integers");
  }
  return { ids, done: v.done === true, finish_reason: v.finish_reason ?? null, tool_calls: v.tool_calls || [] };
}

// -- protobuf (codec-spec §1.2) ---------------------------------------------------------------

function pbVarint(r, maxBytes) {
  let v = 0, mul = 1;
  for (let i = 0; i < maxBytes; i++) {
    const b = r.u8();
    v += (b & 0x7f) * mul;
    if (b < 0x80) return v;
    mul *= 128;
  }
  throw new PageError(`protobuf: varint longer than ${maxBytes} bytes`);
}

function pbFields(bytes, onField) {
  const r = new Reader(bytes, 0, bytes.length);
  try {
    while (r.pos < r.end) {
      const key = pbVarint(r, 5), field = Math.floor(key / 8), wire = key & 7;
      if (wire === 0) onField(field, wire, r);
      else if (wire === 2) onField(field, wire, r.bytes(pbVarint(r, 5)));
      else if (wire === 1) r.bytes(8);
      else if (wire === 5) r.bytes(4);
      else throw new PageError(`protobuf: wire type ${wire} is not allowed`);
    }
  } catch (e) {
    if (e === NEED_MORE) throw new PageError("protobuf: a field runs past its frame");
    throw e;
  }
}

function pbString(bytes) { return utf8.decode(bytes); }

function pbFrame(bytes) {
  const frame = { ids: [], done: false, finish_reason: null, tool_calls: [] };
  pbFields(bytes, (field, wire, val) => {
    if (field === 1 && wire === 2) { // packed ids
      const r = new Reader(val, 0, val.length);
      try { while (r.pos < r.end) frame.ids.push(pbUint32(r)); } catch (e) {
        throw e === NEED_MORE ? new PageError("protobuf: a packed id is cut short") : e;
      }
    } else if (field === 1 && wire === 0) frame.ids.push(pbUint32(val)); // unpacked, also legal
    else if (field === 2 && wire === 0) frame.done = pbVarint(val, 10) !== 0;
    else if (field === 3 && wire === 2) frame.finish_reason = pbString(val);
    else if (field === 4 && wire === 2) frame.tool_calls.push(pbToolCall(val));
    else if (wire === 0) pbVarint(val, 10); // unknown field: skipped (§1.1 liberal acceptance)
  });
  return frame;
}

function pbUint32(r) {
  const v = pbVarint(r, 5);
  if (v > 0xffffffff) throw new PageError("protobuf: an id is over 32 bits");
  return v;
}

function pbToolCall(bytes) {
  const call = { name: null, arguments_json: "", id: null };
  pbFields(bytes, (field, wire, val) => {
    if (wire === 0) { pbVarint(val, 10); return; }
    if (field === 1) call.name = pbString(val);
    else if (field === 2) call.arguments_json = pbString(val);
    else if (field === 3) call.id = pbString(val);
  });
  return call;
}

class ProtobufFrames {
  constructor() { this.buf = new Uint8Array(0); }
  feed(chunk) {
    const buf = concat(this.buf, chunk);
    const out = [];
    let pos = 0;
    while (buf.length - pos >= 4) {
      const n = new DataView(buf.buffer, buf.byteOffset + pos, 4).getUint32(0);
      if (n > MAX_FRAME_BYTES) throw new PageError(`protobuf: a ${n}-byte frame is over the limit`);
      if (buf.length - pos - 4 < n) break;
      out.push({ frame: pbFrame(buf.subarray(pos + 4, pos + 4 + n)), size: 4 + n });
      pos += 4 + n;
    }
    this.buf = buf.subarray(pos);
    return out;
  }
  finish() { if (this.buf.length) throw new PageError(`the stream ended inside a frame (${this.buf.length} bytes left)`); }
}

function concat(a, b) {
  if (!a.length) return b;
  const out = new Uint8Array(a.length + b.length);
  out.set(a, 0);
  out.set(b, a.length);
  return out;
}

// -- tokenizer maps (codec-spec §3.2, §3.3) -----------------------------------------------

// GPT-2's bytes_to_unicode, inverted: code point -> byte.
function byteLevelTable() {
  const inv = new Map();
  let extra = 0;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    inv.set(printable ? b : 0x100 + extra++, b);
  }
  return inv;
}

function hex(buf) { return Array.from(new Uint8Array(buf), (b) => b.toString(16).padStart(2, "0")).join(""); }

async function loadMap(model) {
  const ref = model.codec_tokenizer_map;
  const cached = state.maps.get(ref.hash);
  if (cached) return cached;
  if (!(window.crypto && crypto.subtle)) {
    throw new PageError("This page cannot check the map's sha256: crypto.subtle needs a secure context (open the page over HTTPS or on localhost).");
  }
  const resp = await fetch(`/.well-known/codec/maps/${ref.id}.json`);
  if (!resp.ok) throw await apiError(resp);
  const raw = await resp.arrayBuffer();
  const got = "sha256:" + hex(await crypto.subtle.digest("SHA-256", raw));
  if (got !== ref.hash.toLowerCase()) {
    throw new PageError(`Refused the tokenizer map ${ref.id}: its sha256 is ${got}, but the server names ${ref.hash}. The map was changed on the way; nothing was detokenized.`);
  }
  const map = buildDetokenizer(JSON.parse(new TextDecoder().decode(raw)), ref.hash);
  state.maps.set(ref.hash, map);
  return map;
}

function buildDetokenizer(doc, hash) {
  const table = new Map(); // id -> Uint8Array
  const enc = new TextEncoder();
  const special = new Set(Object.values(doc.special_tokens || {}));
  const inv = doc.encoder === "byte_level" ? byteLevelTable() : null;
  const lo = doc.byte_fallback_start, hi = doc.byte_fallback_end;
  for (const [text, id] of Object.entries(doc.vocab || {})) {
    if (inv) {
      const bytes = [];
      for (const ch of text) {
        const b = inv.get(ch.codePointAt(0));
        bytes.push(b === undefined ? 0x3f : b);
      }
      table.set(id, Uint8Array.from(bytes));
    } else if (doc.encoder === "metaspace") {
      if (lo !== undefined && id >= lo && id <= hi) table.set(id, Uint8Array.of(id - lo));
      else table.set(id, enc.encode(text.replaceAll("\u2581", " ")));
    } else {
      table.set(id, enc.encode(text));
    }
  }
  return { id: doc.id, hash, table, special };
}

// Streaming detokenizer: a multi-byte character split over tokens waits for its last byte.
class Detokenizer {
  constructor(map) { this.map = map; this.dec = new TextDecoder("utf-8"); }
  push(id) {
    if (this.map.special.has(id)) return { text: "", bytes: new Uint8Array(0) };
    const bytes = this.map.table.get(id);
    if (!bytes) return { text: "\ufffd", bytes: new Uint8Array(0) };
    return { text: this.dec.decode(bytes, { stream: true }), bytes };
  }
  end() { return this.dec.decode(); }
}

// -- reading a response ---------------------------------------------------------------------

// The body as the wire carried it: counted before any decoding. `onBytes(total)` sees the
// running count; for gzip the counted bytes are then inflated by DecompressionStream.
function countedBody(resp, coding, onBytes) {
  let total = 0;
  const counter = new TransformStream({
    transform(chunk, ctl) { total += chunk.byteLength; onBytes(total); ctl.enqueue(chunk); },
  });
  let body = resp.body.pipeThrough(counter);
  if (coding === "gzip") body = body.pipeThrough(new DecompressionStream("gzip"));
  return body.getReader();
}

// Brotli cannot be inflated by DecompressionStream in Chromium (150 has no "brotli" format),
// so br goes as Content-Encoding and the browser decodes it: the page reads decoded bytes,
// and the wire size comes from Resource Timing when the response has ended.
async function encodedSize(startedAt) {
  for (let i = 0; i < 50; i++) {
    const entries = performance.getEntriesByType("resource").filter(
      (e) => e.name.endsWith("/v1/chat/completions") && e.startTime >= startedAt);
    if (entries.length) return entries[entries.length - 1].encodedBodySize;
    await new Promise((ok) => setTimeout(ok, 20));
  }
  return null;
}

function requestBody(wire) {
  const body = {
    model: $("model").value, stream: true, temperature: 0, seed: 0,
    max_tokens: Number($("max-tokens").value) || 64,
    messages: [{ role: "user", content: $("prompt").value }],
  };
  if (wire === "json") body.stream_options = { include_usage: true };
  else body.stream_format = wire;
  return body;
}

async function post(wire, coding) {
  if (coding === "br" && !window.isSecureContext) {
    throw new PageError("br needs HTTPS (or localhost): browsers accept brotli only there, and a page script cannot inflate it itself (DecompressionStream has no brotli format). Choose gzip, or serve tokenwire with --tls-cert and --tls-key.");
  }
  const headers = authHeaders({ "Content-Type": "application/json", [ACCEPT_HEADER]: coding });
  if (coding === "gzip") headers[RAW_HEADER] = "1"; // counted as sent, inflated here
  const resp = await fetch("/v1/chat/completions", {
    method: "POST", headers, body: JSON.stringify(requestBody(wire)), cache: "no-store" });
  if (!resp.ok) throw await apiError(resp);
  const got = coding === "gzip" ? resp.headers.get(RAW_CODING_HEADER)
    : (resp.headers.get("Content-Encoding") || "identity");
  if (got !== coding) throw new PageError(`Asked for ${coding}, but the server sent ${got}.`);
  return resp;
}

// One streamed answer in `wire` + `coding`; `view` gets tokens and counters as they come.
async function runStream(wire, coding, map, view) {
  const t0 = performance.now();
  const run = { wire: 0, tokens: 0, ttft: null, tFirst: null, tLast: null, text: "", finish: null };
  const resp = await post(wire, coding);
  if (wire !== "json") {
    const named = resp.headers.get("Codec-Tokenizer-Map");
    if (named && named.toLowerCase() !== map.hash.toLowerCase()) {
      throw new PageError(`The stream names tokenizer map ${named}, not the verified ${map.hash}; refused.`);
    }
  }
  const reader = countedBody(resp, coding, (n) => { run.wire = n; view.update(run); });
  const onToken = (id, text, bytes, frameSize) => {
    const now = performance.now();
    if (run.ttft === null) { run.ttft = now - t0; run.tFirst = now; }
    run.tLast = now;
    run.tokens += 1;
    run.text += text;
    view.token(id, text, bytes, frameSize);
  };
  if (wire === "json") await readSSE(reader, run, onToken);
  else await readFrames(reader, wire, map, run, onToken);
  if (coding === "br") run.wire = await encodedSize(t0);
  view.update(run);
  return run;
}

async function readFrames(reader, wire, map, run, onToken) {
  const frames = wire === "msgpack" ? new MsgpackFrames() : new ProtobufFrames();
  const detok = new Detokenizer(map);
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    for (const { frame, size } of frames.feed(value)) {
      if (run.finish !== null) throw new PageError("bytes after the terminal frame (§1.1)");
      for (const id of frame.ids) {
        const { text, bytes } = detok.push(id);
        onToken(id, text, bytes, size);
      }
      if (frame.done) run.finish = frame.finish_reason || "";
    }
  }
  frames.finish();
  run.text += detok.end();
  if (run.finish === null) throw new PageError("the stream ended without its terminal frame");
  if (run.finish === "error") throw new PageError("the server ended the stream with finish_reason \"error\"");
}

async function readSSE(reader, run, onToken) {
  const dec = new TextDecoder();
  let buf = "";
  const handle = (data) => {
    if (data === "[DONE]") { run.finish = run.finish || "stop"; return; }
    const chunk = JSON.parse(data);
    if (chunk.error) throw new PageError(`The server failed the stream: ${chunk.error.message}`);
    if (chunk.usage) run.usageTokens = chunk.usage.completion_tokens;
    for (const choice of chunk.choices || []) {
      const text = (choice.delta && choice.delta.content) || "";
      if (text) onToken(null, text, new TextEncoder().encode(text), data.length);
      if (choice.finish_reason) run.finish = choice.finish_reason;
    }
  };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      for (const line of event.split("\n")) if (line.startsWith("data: ")) handle(line.slice(6));
    }
  }
  if (run.usageTokens !== undefined) run.tokens = run.usageTokens; // deltas can hold several
}

// -- the playground view --------------------------------------------------------------------

function fmtBytes(n) { return n === null || n === undefined ? "?" : `${n} B`; }

function statsRow(rowId, label) {
  const row = $(rowId);
  if (label) row.querySelector("th").textContent = label;
  const cell = (c) => row.querySelector("." + c);
  return {
    row,
    update(run) {
      cell("bytes").textContent = fmtBytes(run.wire);
      cell("tokens").textContent = String(run.tokens);
      cell("per").textContent = run.tokens && run.wire !== null ? (run.wire / run.tokens).toFixed(1) : "";
      cell("ttft").textContent = run.ttft === null ? "" : `${run.ttft.toFixed(0)} ms`;
      const span = run.tLast - run.tFirst;
      cell("tps").textContent = run.tokens > 1 && span > 0 ? ((run.tokens - 1) / span * 1000).toFixed(1) : "";
      row.dataset.wireBytes = run.wire === null ? "" : String(run.wire);
      row.dataset.tokens = String(run.tokens);
    },
    clear() { for (const c of ["bytes", "tokens", "per", "ttft", "tps"]) cell(c).textContent = ""; delete row.dataset.wireBytes; },
  };
}

function answerView(answer, shade) {
  return {
    token(id, text, bytes, frameSize) {
      const span = document.createElement("span");
      span.textContent = text;
      if (shade && id !== null) {
        span.className = "tok";
        span.dataset.id = String(id);
        span.style.backgroundColor = `hsl(${(id * 137.508) % 360} 70% 85%)`;
        const hexBytes = Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join(" ");
        span.title = `id ${id} · token bytes ${hexBytes || "(none)"} · frame ${frameSize} B`;
      }
      answer.append(span);
    },
  };
}

async function send(ev) {
  ev.preventDefault();
  if (state.busy) return;
  showError("");
  const wire = $("wire").value, coding = $("coding").value, compare = $("compare").checked;
  const answer = $("answer");
  answer.replaceChildren();
  answer.dataset.state = "running";
  $("ratio").textContent = "";
  const main = statsRow("row-main", wire === "json" ? `JSON-SSE ${coding}` : `${wire} ${coding}`);
  const json = statsRow("row-json", `JSON-SSE ${coding}`);
  main.clear(); json.clear();
  json.row.hidden = wire === "json" || !compare;
  state.busy = true;
  $("send").disabled = true;
  try {
    const model = state.models.find((m) => m.id === $("model").value);
    if (!model) throw new PageError("Choose a model first.");
    let map = null;
    if (wire !== "json") {
      if (!model.codec_tokenizer_map) throw new PageError(`Model ${model.id} has no tokenizer map: only JSON-SSE can carry its text.`);
      map = await loadMap(model);
    }
    const shown = answerView(answer, wire !== "json");
    const run = await runStream(wire, coding, map, { update: (r) => main.update(r), token: shown.token });
    answer.dataset.text = run.text;
    if (wire !== "json" && compare) {
      const other = await runStream("json", coding, null, { update: (r) => json.update(r), token: () => {} });
      answer.dataset.jsonText = other.text;
      const ratio = other.wire && run.wire ? (other.wire / run.wire).toFixed(2) : "?";
      const same = other.text === run.text ? "the same text" : "a different text (check temperature 0)";
      $("ratio").textContent = `JSON-SSE took ${ratio}x the bytes of ${wire} ${coding} for ${same}.`;
    }
    answer.dataset.finish = run.finish;
    answer.dataset.state = "done";
  } catch (e) {
    answer.dataset.state = "error";
    showError(e instanceof PageError ? e.message : `The page failed: ${e.message || e}`);
  } finally {
    state.busy = false;
    $("send").disabled = false;
  }
}

function codingNote() {
  const c = $("coding").value;
  $("note").textContent = c === "br"
    ? "br: DecompressionStream has no brotli, so the browser decodes it (Content-Encoding; HTTPS or localhost only) and the wire byte count arrives when the answer ends (Resource Timing)."
    : c === "gzip" ? "gzip: counted as received, inflated here with DecompressionStream." : "";
}

// -- status view ----------------------------------------------------------------------------

function cells(tr, values) {
  for (const v of values) { const td = document.createElement("td"); td.textContent = v; tr.append(td); }
  return tr;
}

function renderModels() {
  const body = $("models").querySelector("tbody");
  body.replaceChildren(...state.models.map((m) => cells(document.createElement("tr"), [
    m.id, m.owned_by, m.codec_tokenizer_map ? m.codec_tokenizer_map.id : "(none)",
    m.codec_tokenizer_map ? m.codec_tokenizer_map.hash.slice(0, 19) + "…" : "",
    m.max_model_len ? `${m.max_model_len} (${m.context_length_source || "?"})` : "?",
    m.codec_ids_source || ""])));
}

function renderHealth(h) {
  $("overall").textContent = `(${h.status})`;
  const body = $("upstreams").querySelector("tbody");
  body.replaceChildren(...h.upstreams.map((u) => {
    const reps = (u.replicas || []).map((r) => `${r.name}: breaker ${r.breaker}, ${r.in_flight}/${r.limit} in flight, ${r.completed} done, ${r.failed} failed`);
    const tr = cells(document.createElement("tr"), [u.name, u.kind, u.state, reps.join("; ") || "-", u.detail || ""]);
    tr.className = "state-" + u.state;
    return tr;
  }));
  $("capacity").textContent = `running ${h.running} · queued ${h.queued}`;
}

// Prometheus text: sums of one metric family, grouped by a label (or "" for the total).
function promSums(text, name, label) {
  const sums = new Map();
  for (const line of text.split("\n")) {
    if (!line.startsWith(name)) continue;
    const m = line.match(/^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)/);
    if (!m || m[1] !== name) continue;
    const lab = label && m[2] ? (m[2].match(new RegExp(`${label}="([^"]*)"`)) || [])[1] || "" : "";
    sums.set(lab, (sums.get(lab) || 0) + Number(m[3]));
  }
  return sums;
}

const SVG = "http://www.w3.org/2000/svg";
function svgEl(tag, attrs) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  return el;
}

function drawLine(svg, series) {
  const max = Math.max(1, ...series);
  const pts = series.map((v, i) => `${(i / (CHART_POINTS - 1)) * 300},${76 - (v / max) * 70}`).join(" ");
  const label = svgEl("text", { x: 4, y: 12, class: "chart-label" });
  label.textContent = `now ${(series[series.length - 1] || 0).toFixed(1)} · max ${max.toFixed(1)}`;
  svg.replaceChildren(svgEl("polyline", { points: pts, class: "chart-line" }), label);
}

function drawBars(svg, counts) {
  const items = [...counts].filter(([, v]) => v > 0).sort((a, b) => b[1] - a[1]).slice(0, 6);
  const max = Math.max(1, ...items.map(([, v]) => v));
  const kids = items.flatMap(([k, v], i) => {
    const y = 4 + i * 12, w = (v / max) * 125;
    const t = svgEl("text", { x: 4, y: y + 9, class: "chart-label" });
    t.textContent = `${k} ${v}`;
    return [svgEl("rect", { x: 170, y, width: Math.max(w, 1), height: 9, class: "chart-bar" }), t];
  });
  if (!kids.length) { const t = svgEl("text", { x: 4, y: 14, class: "chart-label" }); t.textContent = "none so far"; kids.push(t); }
  svg.replaceChildren(...kids);
}

async function refreshStatus() {
  try {
    const [models, health, metrics] = await Promise.all([
      getJSON("/v1/models"), fetchHealth(), fetchText("/metrics")]);
    state.models = models.data;
    renderModels();
    renderHealth(health);
    const tokens = promSums(metrics, "tokenwire_completion_tokens_total", "").get("") || 0;
    const now = performance.now();
    if (state.lastTokens) {
      const dt = (now - state.lastTokens.t) / 1000;
      state.tpsSeries.push(dt > 0 ? Math.max(0, tokens - state.lastTokens.n) / dt : 0);
    }
    state.lastTokens = { t: now, n: tokens };
    while (state.tpsSeries.length < CHART_POINTS) state.tpsSeries.unshift(0);
    state.tpsSeries = state.tpsSeries.slice(-CHART_POINTS);
    drawLine($("chart-tps"), state.tpsSeries);
    const errors = promSums(metrics, "tokenwire_request_failures_total", "failure_class");
    for (const [k, v] of promSums(metrics, "tokenwire_requests_rejected_total", "reason")) {
      errors.set("refused " + k, v);
    }
    drawBars($("chart-errors"), errors);
    $("status").dataset.state = "ready";
  } catch (e) {
    $("status").dataset.state = "error";
    showError(e instanceof PageError ? e.message : `The page failed: ${e.message || e}`);
  }
}

async function fetchHealth() { // 503 still carries the body: the gateway is reachable but down
  const resp = await fetch("/health", { headers: authHeaders(), cache: "no-store" });
  if (resp.status === 503) return resp.json();
  if (!resp.ok) throw await apiError(resp);
  return resp.json();
}

async function fetchText(path) {
  const resp = await fetch(path, { headers: authHeaders(), cache: "no-store" });
  if (!resp.ok) throw await apiError(resp);
  return resp.text();
}

function showTab(name) {
  const status = name === "status";
  $("play").hidden = status;
  $("status").hidden = !status;
  $("tab-play").classList.toggle("active", !status);
  $("tab-status").classList.toggle("active", status);
  clearInterval(state.poll);
  state.poll = null;
  if (status) { refreshStatus(); state.poll = setInterval(refreshStatus, STATUS_POLL_MS); }
}

// -- start ----------------------------------------------------------------------------------

async function loadModels() {
  showError("");
  const select = $("model");
  try {
    state.models = (await getJSON("/v1/models")).data;
    select.replaceChildren(...state.models.map((m) => {
      const o = document.createElement("option");
      o.value = m.id;
      o.textContent = m.codec_tokenizer_map ? m.id : `${m.id} (JSON only)`;
      return o;
    }));
    document.body.dataset.ready = "models";
  } catch (e) {
    document.body.dataset.ready = "error";
    showError(e instanceof PageError ? e.message : `The page failed: ${e.message || e}`);
  }
}

function start() {
  performance.setResourceTimingBufferSize(1000);
  $("key").value = state.key;
  $("key-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    state.key = $("key").value.trim();
    if (state.key) sessionStorage.setItem(KEY_STORE, state.key); else sessionStorage.removeItem(KEY_STORE);
    loadModels();
  });
  $("key-clear").addEventListener("click", () => {
    state.key = ""; $("key").value = ""; sessionStorage.removeItem(KEY_STORE); loadModels();
  });
  $("chat-form").addEventListener("submit", send);
  $("coding").addEventListener("change", codingNote);
  $("tab-play").addEventListener("click", () => showTab("play"));
  $("tab-status").addEventListener("click", () => showTab("status"));
  $("tip").textContent = "Codec answers are shaded by token id; hover a token for its id and bytes.";
  codingNote();
  loadModels();
}

start();
