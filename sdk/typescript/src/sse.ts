// Server-sent events over a fetch body, and the output chunks the exec and process streams carry.

import { ConnectionError, errorFromEnvelope } from './errors.js';

import type { OutputChunk } from './types.js';

/** One server-sent event. */
export interface SSEMessage {
  event: string;
  data: string;
  id: string | null;
}

/**
 * Parses a `text/event-stream` body into `{event, data, id}` messages. Comments (`:` lines,
 * the server's keep-alives) are skipped. Breaking out of the loop cancels the body.
 */
export async function* parseSSE(body: ReadableStream<Uint8Array> | null): AsyncGenerator<SSEMessage, void, undefined> {
  if (!body) throw new ConnectionError('the event stream has no body', { code: 'CONNECTION' });
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  let event = '';
  let data: string[] = [];
  let id: string | null = null;
  let finished = false;
  try {
    for (;;) {
      let chunk: ReadableStreamReadResult<Uint8Array>;
      try {
        chunk = await reader.read();
      } catch (e: any) {
        // fetch reports a broken connection as a TypeError; an abort comes as its reason.
        if (!(e instanceof TypeError)) throw e;
        const why = (e as { cause?: { message?: string } }).cause?.message ?? e.message;
        throw new ConnectionError(`the event stream broke off: ${why}`, {
          code: 'CONNECTION',
          cause: e,
        });
      }
      const { value, done } = chunk;
      if (done) {
        buf += decoder.decode();
        finished = true;
      } else {
        buf += decoder.decode(value, { stream: true });
      }
      let nl;
      while ((nl = buf.indexOf('\n')) >= 0) {
        let line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        if (line.endsWith('\r')) line = line.slice(0, -1);
        if (line === '') {
          if (data.length > 0) yield { event: event || 'message', data: data.join('\n'), id };
          event = '';
          data = [];
          continue;
        }
        if (line.startsWith(':')) continue;
        const colon = line.indexOf(':');
        const field = colon < 0 ? line : line.slice(0, colon);
        let val = colon < 0 ? '' : line.slice(colon + 1);
        if (val.startsWith(' ')) val = val.slice(1);
        if (field === 'event') event = val;
        else if (field === 'data') data.push(val);
        else if (field === 'id') id = val;
      }
      if (finished) break;
    }
  } finally {
    if (!finished) {
      try {
        await reader.cancel();
      } catch {
        // already closed
      }
    }
    reader.releaseLock();
  }
}

/** Decodes base64 (atob exists in browsers and in Node 16 and newer). */
export function b64ToBytes(b64: string): Uint8Array {
  const bin = atob(b64);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

const encoder = new TextEncoder();

/** Encodes bytes as base64. */
export function bytesToB64(bytes: Uint8Array): string {
  let bin = '';
  for (let i = 0; i < bytes.length; i += 0x8000) {
    bin += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  }
  return btoa(bin);
}

/**
 * Decodes the data of a `stdout`/`stderr` event: a JSON string, or `{"b64": ...}` for bytes
 * that are not UTF-8 (which the text form shows with U+FFFD).
 */
export function decodeChunk(raw: string): { data: string; bytes: Uint8Array } {
  const v = JSON.parse(raw);
  if (typeof v === 'string') return { data: v, bytes: encoder.encode(v) };
  if (v && typeof v.b64 === 'string') {
    const bytes = b64ToBytes(v.b64);
    return { data: new TextDecoder('utf-8', { fatal: false }).decode(bytes), bytes };
  }
  throw new ConnectionError(`unexpected output event data: ${raw}`, { code: 'PROTOCOL' });
}

/** The `exit` event's data. */
export interface ExitData {
  exit_code: number;
  duration_ms?: number;
  timed_out?: boolean;
  [field: string]: unknown;
}

/** Parses an SSE `error` event's data into its typed error. */
export function sseError(data: string, requestId: string | null) {
  let env: unknown;
  try {
    env = JSON.parse(data);
  } catch {
    env = null;
  }
  return errorFromEnvelope(env, { requestId });
}

/**
 * Reads an output stream (streamed exec, a process's output): yields `{type, data, bytes}`
 * for `stdout`/`stderr` and returns the `exit` event's data. An `error` event throws its typed
 * error; a stream that ends without `exit` throws a ConnectionError.
 */
export async function* outputEvents(res: Response): AsyncGenerator<OutputChunk, ExitData, undefined> {
  const requestId = res.headers.get('x-request-id');
  for await (const msg of parseSSE(res.body)) {
    if (msg.event === 'stdout' || msg.event === 'stderr') {
      yield { type: msg.event, ...decodeChunk(msg.data) };
    } else if (msg.event === 'exit') {
      return JSON.parse(msg.data);
    } else if (msg.event === 'error') {
      throw sseError(msg.data, requestId);
    }
    // other events: ignored, for forward compatibility
  }
  throw new ConnectionError('the output stream ended before the exit event', { code: 'CONNECTION', requestId });
}
