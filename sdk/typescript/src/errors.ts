import type { TemplateBuildInfo } from './types.js';

// Typed errors: every error envelope of the Cella API becomes one of these classes.

/** The base class of every error this SDK throws for the API. */
/** What an error carries beside its message. */
export interface CellaErrorFields {
  code?: string | null;
  details?: any;
  status?: number | null;
  requestId?: string | null;
  retryAfter?: number | null;
  cause?: unknown;
}

export class CellaError extends Error {
  /** Upper-snake error code, e.g. `NOT_FOUND`; `CONNECTION`/`TIMEOUT` for client-side failures. */
  readonly code: string;
  /** The envelope's `details` (an object or null). */
  readonly details: Record<string, any> | null;
  /** HTTP status, or null for errors that did not come from a response. */
  readonly status: number | null;
  /** The response's `x-request-id`, to find the request in the server's log. */
  readonly requestId: string | null;

  constructor(message: string, fields: CellaErrorFields = {}) {
    super(message, fields.cause === undefined ? undefined : { cause: fields.cause });
    this.name = new.target.name;
    this.code = fields.code ?? 'UNKNOWN';
    this.details = fields.details ?? null;
    this.status = fields.status ?? null;
    this.requestId = fields.requestId ?? null;
  }
}

/** 400 `INVALID_REQUEST`: bad JSON, wrong type, unknown field, value out of range. */
export class InvalidRequestError extends CellaError {
  /** The field the server named in `details.field`, if any. */
  get field(): string | null {
    return this.details && typeof this.details === 'object' ? (this.details.field ?? null) : null;
  }
}
/** 400 `UNKNOWN_LANGUAGE`: the code interpreter does not know the language. */
export class UnknownLanguageError extends InvalidRequestError {}
/** 400 `SIZE_UNAVAILABLE`: the size is `missing` on this server. */
export class SizeUnavailableError extends InvalidRequestError {}
/** 401 `UNAUTHORIZED`: no key, or one that is unknown, revoked or expired. */
export class AuthenticationError extends CellaError {}
/** 402 `INSUFFICIENT_FUNDS`. */
export class InsufficientFundsError extends CellaError {}
/** 403 `FORBIDDEN`: the key lacks the route's scope (`details.required_scope`). */
export class PermissionDeniedError extends CellaError {}
/** 404 `NOT_FOUND`: no such sandbox, path, process or route. */
export class NotFoundError extends CellaError {}
/** 405 `METHOD_NOT_ALLOWED`. */
export class MethodNotAllowedError extends CellaError {}
/** 409 `CONFLICT`: the sandbox's state or the path's type does not allow the call. */
export class ConflictError extends CellaError {}
/** 409 `SANDBOX_NOT_RUNNING`: the sandbox is paused, stopped, destroyed or failed. */
export class SandboxNotRunningError extends CellaError {}
/** 410 `GONE`: what was asked for existed and is gone for good (a task run's log once it ended). */
export class GoneError extends CellaError {}
/** 413 `PAYLOAD_TOO_LARGE`. */
export class PayloadTooLargeError extends CellaError {}
/** 416 `RANGE_NOT_SATISFIABLE`: a download's range lies outside the file. */
export class RangeNotSatisfiableError extends CellaError {}
/** 429 `RATE_LIMITED`, after the SDK's own retries ran out. */
export class RateLimitedError extends CellaError {
  /** Seconds the server asked to wait (`Retry-After`). */
  readonly retryAfter: number | null;

  constructor(message: string, fields: CellaErrorFields = {}) {
    super(message, fields);
    this.retryAfter = fields.retryAfter ?? null;
  }
}
/** 429 `CONCURRENCY_LIMIT`: the workspace holds its plan's cap of sandboxes. */
export class ConcurrencyLimitError extends RateLimitedError {}
/** 500 `INTERNAL`. */
export class InternalServerError extends CellaError {}
/** 503 `UNAVAILABLE`: a sandbox failed to start, or its agent did not answer. */
export class UnavailableError extends CellaError {}
/** The server could not be reached, or the connection broke. */
export class ConnectionError extends CellaError {}
/** The SDK gave up waiting for an answer (`requestTimeoutMs`). */
export class TimeoutError extends CellaError {}

/**
 * A template build waited for with `check: true` ended `failed`; `build` is its last state
 * (its `log` whole, `error` saying why).
 */
export class TemplateBuildError extends CellaError {
  /** The failed build (null when made from a message). */
  readonly build: TemplateBuildInfo | null;

  constructor(buildOrMessage: TemplateBuildInfo | string, fields: CellaErrorFields = {}) {
    const build = buildOrMessage && typeof buildOrMessage === 'object' ? buildOrMessage : null;
    const message = build
      ? `build ${build.id} of template ${build.templateId} failed: ${build.error ?? 'no reason given'}`
      : String(buildOrMessage);
    super(message, { code: 'BUILD_FAILED', ...fields });
    this.build = build;
  }
}

type ErrorClass = new (message: string, fields?: CellaErrorFields) => CellaError;

const BY_CODE: Record<string, [ErrorClass, number]> = {
  INVALID_REQUEST: [InvalidRequestError, 400],
  UNKNOWN_LANGUAGE: [UnknownLanguageError, 400],
  SIZE_UNAVAILABLE: [SizeUnavailableError, 400],
  UNAUTHORIZED: [AuthenticationError, 401],
  INSUFFICIENT_FUNDS: [InsufficientFundsError, 402],
  FORBIDDEN: [PermissionDeniedError, 403],
  NOT_FOUND: [NotFoundError, 404],
  METHOD_NOT_ALLOWED: [MethodNotAllowedError, 405],
  CONFLICT: [ConflictError, 409],
  SANDBOX_NOT_RUNNING: [SandboxNotRunningError, 409],
  GONE: [GoneError, 410],
  PAYLOAD_TOO_LARGE: [PayloadTooLargeError, 413],
  RANGE_NOT_SATISFIABLE: [RangeNotSatisfiableError, 416],
  RATE_LIMITED: [RateLimitedError, 429],
  CONCURRENCY_LIMIT: [ConcurrencyLimitError, 429],
  INTERNAL: [InternalServerError, 500],
  UNAVAILABLE: [UnavailableError, 503],
};

const BY_STATUS: Record<number, string> = {
  400: 'INVALID_REQUEST',
  401: 'UNAUTHORIZED',
  402: 'INSUFFICIENT_FUNDS',
  403: 'FORBIDDEN',
  404: 'NOT_FOUND',
  405: 'METHOD_NOT_ALLOWED',
  409: 'CONFLICT',
  410: 'GONE',
  413: 'PAYLOAD_TOO_LARGE',
  416: 'RANGE_NOT_SATISFIABLE',
  429: 'RATE_LIMITED',
  500: 'INTERNAL',
  503: 'UNAVAILABLE',
};

export interface ErrorParts {
  code: string | null;
  message: string;
  details?: any;
  status?: number | null;
  requestId?: string | null;
  retryAfter?: number | null;
}

/** Builds the typed error for an error code (and status, when the code is unknown to the SDK). */
export function errorFor({ code, message, details = null, status = null, requestId = null, retryAfter = null }: ErrorParts): CellaError {
  if (!code && status != null) code = BY_STATUS[status] ?? `HTTP_${status}`;
  const known = code ? BY_CODE[code] : undefined;
  let Cls: ErrorClass | null = known ? known[0] : null;
  if (!Cls && status != null) {
    // A code this SDK does not know yet: fall back on the status's class.
    const name = BY_STATUS[status];
    const byStatus = name ? BY_CODE[name] : undefined;
    Cls = byStatus ? byStatus[0] : CellaError;
  }
  Cls ??= CellaError;
  if (status == null && known) status = known[1];
  return new Cls(message || code || 'request failed', { code, details, status, requestId, retryAfter });
}

/**
 * Builds the typed error for an envelope `{"error": {...}}` (as a response body or an SSE
 * `error` event's data).
 */
export function errorFromEnvelope(
  envelope: unknown,
  { status = null, requestId = null, retryAfter = null }: { status?: number | null; requestId?: string | null; retryAfter?: number | null } = {},
): CellaError {
  const e = envelope && typeof envelope === 'object' ? (envelope as { error?: any }).error : null;
  if (!e || typeof e !== 'object') {
    return errorFor({ code: null, message: `unexpected error body: ${JSON.stringify(envelope)}`, status, requestId });
  }
  return errorFor({
    code: typeof e.code === 'string' ? e.code : null,
    message: typeof e.message === 'string' ? e.message : '',
    details: e.details ?? null,
    status,
    requestId,
    retryAfter,
  });
}
