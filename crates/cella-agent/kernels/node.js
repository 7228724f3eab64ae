'use strict';
/*
 * Cella code-interpreter driver for JavaScript (installed in a sandbox as /run/cella/kernel.js).
 * Protocol as in python.py: JSON lines in on stdin, answers on fd 3 with the request's id, one
 * request at a time: run, reset, contexts, create, ping (-> "language":"javascript","version");
 * a line that is not a JSON object, or an unknown op, gets {"ok":false,"error"}. Exits 0 at EOF.
 * A context is a vm context plus Node's globals (console, process, require from the working
 * directory, timers, Buffer, URL, fetch, ...) and display(value, mime?).
 *
 * How cells run, with no parser package (a small lexer below finds top-level statements):
 *  - Top-level `let`/`const` become `var` and `class C {}` becomes `var C = class C {};`, so all
 *    top-level bindings live on the context's global: they persist, and a later cell may declare
 *    the same name again (as the REPL allows). Function declarations are global already.
 *  - A cell without top-level await is a vm.Script run with the vm timeout and breakOnSigint; its
 *    completion value is the result (null if the last statement is a declaration).
 *  - A cell with top-level await is the body of `(async function () { with (scope) { ... } })`:
 *    `scope` is a Proxy of the global claiming the names the cell declares, so `var` initialisers
 *    assign to the global (closures see them there); top-level functions are copied to the
 *    global; a last expression statement becomes `return (...)` (if that guess does not compile,
 *    the result is null). A timer and SIGINT race the promise.
 * Limits: const bindings are writable, without temporal dead zone; an error excerpt may show the
 * rewritten line; await cells run in sloppy mode through `with` (slower global access). Only the
 * synchronous part of a cell (up to its first await) can be stopped: a busy loop after an await or
 * in a timer callback blocks the driver until the agent kills it, and an abandoned promise may
 * still run later. Output written after a cell ended goes to the driver's own stdout/stderr, that
 * of children with inherited stdio is not captured; a cell reading process.stdin competes with
 * the driver. Main-realm objects (require(), fetch, Buffer) fail `instanceof` against the
 * context's own Array/Object. import() needs vm.constants.USE_MAIN_CONTEXT_DEFAULT_LOADER (in 20.20).
 */
const fs = require('fs');
const path = require('path');
const util = require('util');
const vm = require('vm');
const { createRequire } = require('module');

// ---- Protocol channel: answers go to a close-on-exec reopening of fd 3 (so child processes do
// not inherit it), blocking whatever mode the agent's pipe has; fd 1 when started by hand.
let answerFd = 3;
try { answerFd = fs.openSync('/proc/self/fd/3', fs.constants.O_WRONLY); fs.closeSync(3); } catch {
  try { fs.fstatSync(3); } catch { answerFd = 1; }
}
const clean = (s) => (typeof s === 'string' && s.toWellFormed ? s.toWellFormed() : s);
function send(obj) {
  const buf = Buffer.from(JSON.stringify(obj) + '\n');
  for (let off = 0; off < buf.length;) {
    try { off += fs.writeSync(answerFd, buf, off); } catch (e) {
      if (e.code !== 'EAGAIN') throw e;
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 5);
    }
  }
}

// ---- Output capture: while a cell runs, writes to process.stdout/stderr (console included) are
// collected in `cap`; otherwise they go to the real streams.
const CAP = 4 << 20; // bytes kept per stream (the answer must fit one agent frame)
let cap = null; // { out: [Buffer], err: [Buffer], sizes, outputs: [{mime, data}] }
for (const [stream, key] of [[process.stdout, 'out'], [process.stderr, 'err']]) {
  const write = stream.write.bind(stream);
  stream.write = function (chunk, encoding, cb) {
    if (!cap) return write(chunk, encoding, cb);
    if (typeof encoding === 'function') [cb, encoding] = [encoding, undefined];
    const buf = typeof chunk === 'string' ? Buffer.from(chunk, encoding || 'utf8') : Buffer.from(chunk);
    cap.sizes[key] += buf.length;
    if (cap.sizes[key] - buf.length < CAP) cap[key].push(buf);
    if (typeof cb === 'function') process.nextTick(cb);
    return true;
  };
}
const collected = (key) => {
  const text = Buffer.concat(cap[key]).subarray(0, CAP).toString('utf8');
  return cap.sizes[key] > CAP ? `${text}\n[cella: output cut, the cell wrote ${cap.sizes[key]} bytes]\n` : text;
};

// ---- The driver survives what cells do: errors in callbacks and unhandled rejections are
// reported on stderr, process.exit() throws, SIGINT only interrupts a running cell. Stacks lose
// the driver's and Node's own frames (and a source excerpt pointing into the driver).
function cleanStack(stack) {
  let lines = String(stack).split('\n');
  if (lines[0].includes(__filename) && lines.includes('')) lines = lines.slice(lines.indexOf('') + 1);
  return lines.filter((l) => !/^\s+at .*(node:vm|node:internal|\(node:)/.test(l) && !l.includes(__filename)).join('\n');
}
process.on('uncaughtException', (e) => process.stderr.write(`Uncaught ${cleanStack(util.inspect(e))}\n`));
process.on('unhandledRejection', (e) => process.stderr.write(`Unhandled promise rejection: ${cleanStack(util.inspect(e))}\n`));
const realExit = process.exit.bind(process);
process.exit = function exit(code) {
  const e = new Error(`process.exit(${code === undefined ? '' : code}) was called; the kernel keeps running`);
  e.name = 'ProcessExit';
  throw e;
};
let interrupt = null; // rejects the running await cell
process.on('SIGINT', () => interrupt && interrupt());
const emitWarning = process.emitWarning;
process.emitWarning = function (warning, ...rest) { // the dynamic-import loader warns on first use
  if (!String(warning && warning.message || warning).includes('USE_MAIN_CONTEXT_DEFAULT_LOADER')) emitWarning.call(process, warning, ...rest);
};

// ---- Contexts
const GLOBALS = ['Buffer', 'URL', 'URLSearchParams', 'TextEncoder', 'TextDecoder', 'fetch', 'Headers', 'Request',
  'Response', 'FormData', 'Blob', 'AbortController', 'AbortSignal', 'Event', 'EventTarget', 'structuredClone',
  'queueMicrotask', 'setTimeout', 'setInterval', 'setImmediate', 'clearTimeout', 'clearInterval', 'clearImmediate',
  'atob', 'btoa', 'performance', 'crypto'];
const userRequire = createRequire(path.join(process.cwd(), '[cella]'));
const userConsole = new console.Console({ stdout: process.stdout, stderr: process.stderr, colorMode: false });
const contexts = new Map(); // name -> { ctx, global }

function display(value, mime) {
  if (!cap) return;
  let data;
  if (util.types.isAnyArrayBuffer(value) || ArrayBuffer.isView(value)) {
    const bytes = ArrayBuffer.isView(value) ? Buffer.from(value.buffer, value.byteOffset, value.byteLength) : Buffer.from(value);
    [data, mime] = [bytes.toString('base64'), mime || 'application/octet-stream'];
  } else if (typeof value === 'string') [data, mime] = [value, mime || 'text/plain'];
  else {
    try { data = JSON.stringify(value); } catch { /* cyclic or BigInt */ }
    [data, mime] = data === undefined ? [util.inspect(value), 'text/plain'] : [data, mime || 'application/json'];
  }
  cap.outputs.push({ mime: String(mime), data: clean(data) });
}

function context(name) {
  if (!contexts.has(name)) {
    const sandbox = { console: userConsole, process, require: userRequire, display };
    for (const key of GLOBALS) if (key in globalThis) sandbox[key] = globalThis[key];
    const ctx = vm.createContext(sandbox, { name: `cella:${name}` }), global = vm.runInContext('globalThis', ctx);
    contexts.set(name, { ctx, global: Object.assign(global, { global }) });
  }
  return contexts.get(name);
}

// ---- A small lexer. Tokens: {t: 'id'|'num'|'str'|'p', v: text, s: start, e: end, d: bracket
// depth outside the token, nl: a line break precedes it}. Strings, templates and regex literals
// are single 'str' tokens; a template's ${...} parts are lexed recursively and dropped.
const PUNCT = ['>>>=', '...', '===', '!==', '**=', '<<=', '>>=', '>>>', '&&=', '||=', '??=', '=>', '==', '!=', '<=',
  '>=', '&&', '||', '??', '?.', '++', '--', '+=', '-=', '*=', '/=', '%=', '&=', '|=', '^=', '**', '<<', '>>'];
const REGEX_AFTER = new Set(['return', 'typeof', 'instanceof', 'in', 'of', 'new', 'delete', 'void', 'throw', 'case',
  'do', 'else', 'yield', 'await']);

function skipQuoted(src, i, quote) { // string literal from its opening quote; returns the end
  for (i++; i < src.length && src[i] !== quote && src[i] !== '\n'; i++) if (src[i] === '\\') i++;
  return i + 1;
}
function skipRegex(src, i) {
  let inClass = false;
  for (i++; i < src.length && src[i] !== '\n'; i++) {
    if (src[i] === '\\') i++;
    else if (src[i] === '[') inClass = true;
    else if (src[i] === ']') inClass = false;
    else if (src[i] === '/' && !inClass) break;
  }
  for (i++; /[a-z]/.test(src[i] || '');) i++;
  return i;
}
function skipTemplate(src, i) {
  for (i++; i < src.length && src[i] !== '`'; i++) {
    if (src[i] === '\\') i++;
    else if (src[i] === '$' && src[i + 1] === '{') i = lex(src, i + 2, true).end - 1;
  }
  return i + 1;
}
function lex(src, i = 0, nested = false) {
  const toks = [];
  let depth = 0, nl = false;
  while (i < src.length) {
    const c = src[i], s = i, prev = toks[toks.length - 1];
    let t = 'p';
    if (c === '\n' || c === '\u2028' || c === '\u2029') { nl = true; i++; continue; }
    if (/\s/.test(c)) { i++; continue; }
    if (src.startsWith('//', i)) { while (i < src.length && src[i] !== '\n') i++; continue; }
    if (src.startsWith('/*', i)) {
      const end = src.indexOf('*/', i + 2) < 0 ? src.length : src.indexOf('*/', i + 2) + 2;
      [nl, i] = [nl || src.slice(i, end).includes('\n'), end];
      continue;
    }
    if (/[A-Za-z_$#\\\u0080-\uffff]/.test(c)) { for (i++; /[\w$\\\u0080-\uffff]/.test(src[i] || '');) i++; t = 'id'; }
    else if (/[0-9]/.test(c) || (c === '.' && /[0-9]/.test(src[i + 1] || ''))) { for (i++; /[\w.]/.test(src[i] || '');) i++; t = 'num'; }
    else if (c === '"' || c === "'") { i = skipQuoted(src, i, c); t = 'str'; }
    else if (c === '`') { i = skipTemplate(src, i); t = 'str'; }
    else if (c === '/' && (!prev || (prev.t === 'p' && !/^[)\]}]$|^\+\+$|^--$/.test(prev.v)) ||
      (prev.t === 'id' && REGEX_AFTER.has(prev.v)))) { i = skipRegex(src, i); t = 'str'; }
    else if (nested && depth === 0 && c === '}') return { toks, end: i + 1 };
    else i += (PUNCT.find((p) => src.startsWith(p, i)) || c).length;
    const v = src.slice(s, i);
    if (')]}'.includes(v)) depth = Math.max(0, depth - 1);
    toks.push({ t, v, s, e: i, d: depth, nl });
    if ('([{'.includes(v)) depth++;
    nl = false;
  }
  return { toks, end: i };
}

// ---- Statement boundaries at the top level (depth 0), from tokens and line breaks (ASI).
const canEnd = (p) => (p.t === 'id' && !REGEX_AFTER.has(p.v)) || p.t === 'num' || p.t === 'str' || /^([)\]}]|\+\+|--)$/.test(p.v);
const canStart = (t) => (t.t === 'id' && !['in', 'instanceof', 'of', 'else', 'catch', 'finally'].includes(t.v)) || t.t === 'num' ||
  (t.t === 'str' && !'`/'.includes(t.v[0])) || ['!', '~', '++', '--'].includes(t.v);
function stmtStart(toks, i) {
  const tok = toks[i], prev = toks[i - 1];
  if (tok.d !== 0) return false;
  return !prev || prev.v === ';' || (canStart(tok) && (prev.v === '}' || (tok.nl && canEnd(prev))));
}
const NOT_EXPR = new Set(['var', 'let', 'const', 'function', 'class', 'if', 'for', 'while', 'do', 'switch', 'try',
  'return', 'throw', 'break', 'continue', 'debugger', 'with', 'import', 'export', '{', ';']);
const isDecl = (toks, i) => ['var', 'let', 'const', 'function', 'class'].includes(toks[i].v) ||
  (toks[i].v === 'async' && toks[i + 1] && toks[i + 1].v === 'function' && !toks[i + 1].nl);

// Skip an expression inside a declaration: up to a ',' or ';' at its own depth or the closing
// bracket around it. Over-reaching past a line break only adds names, which is harmless.
function skipExpr(toks, i) {
  const d = toks[i] ? toks[i].d : 0;
  while (toks[i] && toks[i].d >= d && !(toks[i].d === d && (toks[i].v === ',' || toks[i].v === ';'))) i++;
  return i;
}
// Collect the names bound by a binding pattern starting at toks[i]; returns the index after it.
function pattern(toks, i, names) {
  const open = toks[i];
  if (!open) return i;
  if (open.t === 'id') { names.add(open.v); return i + 1; }
  if (open.v !== '[' && open.v !== '{') return i + 1;
  const close = open.v === '[' ? ']' : '}';
  for (i++; toks[i] && !(toks[i].d === open.d && toks[i].v === close);) {
    const k = toks[i];
    if (k.v === ',') { i++; continue; }
    if (k.v === '...') { i = pattern(toks, i + 1, names); continue; }
    if (open.v === '[') i = pattern(toks, i, names);
    else {
      if (k.v === '[') { for (i++; toks[i] && !(toks[i].v === ']' && toks[i].d === k.d);) i++; } // [computed] key
      i++;
      if (toks[i] && toks[i].v === ':') i = pattern(toks, i + 1, names);
      else if (k.t === 'id') names.add(k.v); // shorthand
    }
    if (toks[i] && toks[i].v === '=') i = skipExpr(toks, i + 1); // default value
  }
  return i + 1;
}

// Rewrite a cell's top-level declarations; see the comment at the top of the file.
function rewrite(src) {
  const toks = lex(src).toks, edits = [], names = new Set(), funcs = [];
  toks.forEach((tok, i) => {
    const prev = toks[i - 1], next = toks[i + 1];
    if (tok.d !== 0 || tok.t !== 'id' || !next || (prev && (prev.v === '.' || prev.v === '?.'))) return;
    if (['let', 'const', 'var'].includes(tok.v) && (next.t === 'id' || next.v === '[' || next.v === '{')) {
      if (tok.v !== 'var') edits.push([tok.s, tok.e, 'var']);
      for (let j = i + 1; toks[j];) { // declarators: pattern [= init], ...
        j = pattern(toks, j, names);
        if (toks[j] && toks[j].v === '=') j = skipExpr(toks, j + 1);
        if (!toks[j] || toks[j].v !== ',') break;
        j++;
      }
    } else if (tok.v === 'class' && next.t === 'id' && next.v !== 'extends' && stmtStart(toks, i)) {
      const open = toks.findIndex((t, j) => j > i && t.d === 0 && t.v === '{');
      const close = toks.findIndex((t, j) => j > open && t.d === 0 && t.v === '}');
      if (open < 0 || close < 0) return;
      edits.push([tok.s, tok.s, `var ${next.v} = `], [toks[close].e, toks[close].e, ';']);
      names.add(next.v);
    } else if (tok.v === 'function' && (stmtStart(toks, i) || (prev && prev.v === 'async' && stmtStart(toks, i - 1)))) {
      const name = next.v === '*' ? toks[i + 2] : next;
      if (name && name.t === 'id') funcs.push(name.v);
    }
  });
  let last = -1; // start of the last top-level statement
  toks.forEach((tok, i) => { if (stmtStart(toks, i)) last = i; });
  const end = toks.length - (toks.length && toks[toks.length - 1].v === ';' ? 2 : 1); // last token before a final ';'
  const lastExpr = last >= 0 && last <= end && !NOT_EXPR.has(toks[last].v) && !isDecl(toks, last) &&
    !(toks[last + 1] && toks[last + 1].v === ':'); // not a label
  const ret = lastExpr ? [[toks[last].s, toks[last].s, 'return ('], [toks[end].e, toks[end].e, ')']] : [];
  return { toks, edits, names, funcs, ret, lastDecl: last >= 0 && isDecl(toks, last) };
}
const apply = (src, edits) => [...edits].sort((a, b) => b[0] - a[0]).reduce((s, [from, to, text]) => s.slice(0, from) + text + s.slice(to), src);

const dynamicImport = vm.constants && vm.constants.USE_MAIN_CONTEXT_DEFAULT_LOADER;
// A cell with `await` runs as an async function body, unless it compiles as a script and no
// `await` is followed by ( [ or ` (which a script would read as a call of a function `await`).
function compile(src, filename) {
  const r = rewrite(src), opts = { filename, importModuleDynamically: dynamicImport };
  const script = () => ({ script: new vm.Script(apply(src, r.edits), opts), lastDecl: r.lastDecl });
  // The wrapper's first line is line 0, so that the cell's lines keep their numbers.
  const wrap = (edits) => new vm.Script(`(async function () { with (__cellaScope) { ${r.funcs.map((f) => `this.${f} = ${f}; `).join('')}\n` +
    `${apply(src, edits)}\n} }).call(this)`, { ...opts, lineOffset: -1 });
  const asyncBody = () => {
    try { return { script: wrap([...r.edits, ...r.ret]), names: r.names, isAsync: true }; } catch (e) { if (!r.ret.length) throw e; }
    return { script: wrap(r.edits), names: r.names, isAsync: true }; // the guessed `return` did not compile
  };
  const awaits = r.toks.flatMap((t, i) => (t.t === 'id' && t.v === 'await' ? [r.toks[i + 1]] : [])); // token after each
  if (!awaits.length) return script();
  if (awaits.some((next) => next && /^[([`]/.test(next.v))) {
    try { return asyncBody(); } catch { return script(); } // `await` was a name after all
  }
  try { return script(); } catch { return asyncBody(); }
}

// ---- Running cells
class CellStop extends Error {} // a timeout or SIGINT of an await cell
function describe(e, timeout) { // -> {name, value, traceback}
  const code = e && e.code;
  if (code === 'ERR_SCRIPT_EXECUTION_TIMEOUT' || (e instanceof CellStop && e.name === 'TimeoutError')) {
    return { name: 'TimeoutError', value: `cell exceeded its timeout of ${timeout}s and was interrupted`, traceback: '' };
  }
  if (code === 'ERR_SCRIPT_EXECUTION_INTERRUPTED' || e instanceof CellStop) {
    return { name: 'KeyboardInterrupt', value: 'cell interrupted by SIGINT', traceback: '' };
  }
  if (util.types.isNativeError(e) || e instanceof Error) { // the first also for errors of other realms
    return { name: clean(String(e.name)), value: clean(String(e.message)), traceback: clean(cleanStack(e.stack)) };
  }
  let value; // a thrown non-Error
  try { value = String(e); } catch { value = util.inspect(e); }
  return { name: 'Error', value: clean(value), traceback: clean(`Uncaught ${util.inspect(e)}`) };
}

function race(promise, ms) { // settle with the cell's promise, or reject on timeout / SIGINT
  return new Promise((resolve, reject) => {
    let timer = null, settled = false;
    const done = (settle, v) => {
      if (settled) return;
      [settled, interrupt] = [true, null];
      clearTimeout(timer);
      settle(v);
    };
    const stop = (name) => Object.assign(new CellStop(name), { name });
    if (ms > 0) timer = setTimeout(() => done(reject, stop('TimeoutError')), ms);
    interrupt = () => done(reject, stop('KeyboardInterrupt'));
    Promise.resolve(promise).then((v) => done(resolve, v), (e) => done(reject, e));
  });
}

let cellNo = 0;
async function run(req) {
  const c = context(String(req.context || 'default'));
  const timeout = Number(req.timeout) > 0 ? Number(req.timeout) : 0;
  const ms = timeout ? Math.min(2 ** 31 - 1, Math.max(1, Math.round(timeout * 1000))) : 0; // what timers accept
  const started = Date.now();
  cap = { out: [], err: [], sizes: { out: 0, err: 0 }, outputs: [] };
  let result = null, error = null;
  try {
    const plan = compile(String(req.code || ''), `<cell ${++cellNo}>`);
    const opts = { breakOnSigint: true, ...(ms ? { timeout: ms } : {}) };
    let value;
    if (!plan.isAsync) {
      value = plan.script.runInContext(c.ctx, opts); // the completion value
      if (plan.lastDecl) value = undefined;
    } else {
      const scope = new Proxy(c.global, {
        has: (t, k) => typeof k === 'string' && (plan.names.has(k) || Reflect.has(t, k)),
        get: (t, k) => (k === Symbol.unscopables ? undefined : Reflect.get(t, k)),
      });
      Object.defineProperty(c.global, '__cellaScope', { value: scope, configurable: true });
      let promise;
      try { promise = plan.script.runInContext(c.ctx, opts); } finally { delete c.global.__cellaScope; }
      value = await race(promise, ms ? Math.max(1, ms - (Date.now() - started)) : 0);
    }
    if (value !== undefined) result = clean(util.inspect(value));
  } catch (e) {
    error = describe(e, timeout);
  }
  await new Promise((resolve) => setImmediate(resolve)); // output of callbacks already due lands here
  const answer = { ok: error === null, stdout: clean(collected('out')), stderr: clean(collected('err')), result, error, outputs: cap.outputs };
  cap = null;
  return answer;
}

async function handle(req) {
  const name = String(req.context || 'default');
  switch (req.op) {
    case 'run': return run(req);
    case 'ping': return { ok: true, language: 'javascript', version: process.version };
    case 'contexts': return { ok: true, contexts: [...contexts.keys()] };
    case 'create': { const created = !contexts.has(name); context(name); return { ok: true, created }; }
    case 'reset': contexts.delete(name); return { ok: true };
    default: throw new Error(`unknown op ${JSON.stringify(req.op)}`);
  }
}

// ---- Request loop: one request at a time, in order; exit 0 once stdin is closed and drained.
const queue = [];
let busy = false, closed = false;
async function pump() {
  if (busy) return;
  busy = true;
  while (queue.length) {
    const line = queue.shift();
    if (!line.trim()) continue;
    let req = {}, answer;
    try {
      const parsed = JSON.parse(line);
      if (!parsed || typeof parsed !== 'object' || Array.isArray(parsed)) throw new Error('a request must be a JSON object');
      req = parsed;
      answer = await handle(req);
    } catch (e) {
      [cap, answer] = [null, { ok: false, error: describe(e, 0) }];
    }
    try { send({ id: req.id === undefined ? null : req.id, ...answer }); } catch { realExit(1); } // the agent is gone
  }
  busy = false;
  if (closed) realExit(0);
}
const lines = require('readline').createInterface({ input: process.stdin, crlfDelay: Infinity });
lines.on('line', (line) => { queue.push(line); pump(); });
lines.on('close', () => { closed = true; pump(); });
