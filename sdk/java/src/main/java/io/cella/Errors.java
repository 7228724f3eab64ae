package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.regex.Pattern;

/** Error envelopes turned into typed exceptions. */
final class Errors {
    private Errors() {}

    interface Ctor {
        CellaException make(String message, String code, int status, String requestId, JsonNode details, Duration retryAfter, Throwable cause);
    }

    private static final Pattern UNKNOWN_ROUTE = Pattern.compile("no such route|unknown route|route (does not|doesn't) exist|route not found", Pattern.CASE_INSENSITIVE);

    static Ctor byCode(String code) {
        if (code == null) return null;
        switch (code) {
            case "INVALID_REQUEST": return InvalidRequestException::new;
            case "UNKNOWN_LANGUAGE": return UnknownLanguageException::new;
            case "SIZE_UNAVAILABLE": return SizeUnavailableException::new;
            case "UNAUTHORIZED": return AuthenticationException::new;
            case "INSUFFICIENT_FUNDS": return InsufficientFundsException::new;
            case "FORBIDDEN": return PermissionDeniedException::new;
            case "NOT_FOUND": return NotFoundException::new;
            case "METHOD_NOT_ALLOWED": return MethodNotAllowedException::new;
            case "REQUEST_TIMEOUT": return RequestTimeoutException::new;
            case "CONFLICT": return ConflictException::new;
            case "SANDBOX_NOT_RUNNING": return SandboxNotRunningException::new;
            case "GONE": return GoneException::new;
            case "PAYLOAD_TOO_LARGE": return PayloadTooLargeException::new;
            case "RANGE_NOT_SATISFIABLE": return RangeNotSatisfiableException::new;
            case "RATE_LIMITED": return RateLimitedException::new;
            case "CONCURRENCY_LIMIT": return ConcurrencyLimitException::new;
            case "INTERNAL": return InternalServerException::new;
            case "UNAVAILABLE": return UnavailableException::new;
            case "INSUFFICIENT_STORAGE": return InsufficientStorageException::new;
            default: return null;
        }
    }

    static Ctor byStatus(int status) {
        switch (status) {
            case 400: return InvalidRequestException::new;
            case 401: return AuthenticationException::new;
            case 402: return InsufficientFundsException::new;
            case 403: return PermissionDeniedException::new;
            case 404: return NotFoundException::new;
            case 405: return MethodNotAllowedException::new;
            case 408: return RequestTimeoutException::new;
            case 409: return ConflictException::new;
            case 410: return GoneException::new;
            case 413: return PayloadTooLargeException::new;
            case 416: return RangeNotSatisfiableException::new;
            case 429: return RateLimitedException::new;
            case 500: return InternalServerException::new;
            case 503: return UnavailableException::new;
            case 507: return InsufficientStorageException::new;
            default: return CellaException::new;
        }
    }

    /** The exception for an error envelope ({@code {"error": {...}}} or the inner object). */
    static CellaException fromEnvelope(JsonNode envelope, int status, String requestId, Duration retryAfter) {
        JsonNode err = envelope.has("error") ? envelope.get("error") : envelope;
        if (!err.isObject()) {
            return byStatus(status).make(envelope.toString(), status == 0 ? null : "HTTP_" + status, status, requestId, null, retryAfter, null);
        }
        String code = err.path("code").isTextual() ? err.get("code").asText() : null;
        String message = err.path("message").isTextual() ? err.get("message").asText() : (code == null ? "error" : code);
        JsonNode details = err.path("details");
        Ctor c = byCode(code);
        if (c == null) c = byStatus(status);
        if (status == 404 && "NOT_FOUND".equals(code) && UNKNOWN_ROUTE.matcher(message).find()) c = UnknownRouteException::new;
        return c.make(message, code, status, requestId, details, retryAfter, null);
    }

    /** The exception for an HTTP error answer's body (a JSON envelope, or anything else). */
    static CellaException fromBody(int status, byte[] body, String requestId, Duration retryAfter) {
        JsonNode parsed = null;
        try {
            if (body != null && body.length > 0) parsed = Json.MAPPER.readTree(body);
        } catch (Exception e) {
            parsed = null;
        }
        if (parsed != null && parsed.path("error").isObject()) return fromEnvelope(parsed, status, requestId, retryAfter);
        String text = body == null ? "" : new String(body, StandardCharsets.UTF_8).trim();
        if (text.length() > 500) text = text.substring(0, 500);
        if (text.isEmpty()) text = "HTTP " + status;
        return byStatus(status).make(text, "HTTP_" + status, status, requestId, null, retryAfter, null);
    }

    static Duration parseRetryAfter(String value) {
        if (value == null) return null;
        try {
            double s = Double.parseDouble(value.trim());
            return Duration.ofMillis((long) (Math.max(s, 0) * 1000));
        } catch (NumberFormatException e) {
            return null;
        }
    }

    /** The exception of an {@code error} event of a stream (its data is an error envelope). */
    static CellaException fromEvent(String data, String requestId) {
        try {
            JsonNode n = Json.MAPPER.readTree(data);
            if (n != null && n.isObject()) return fromEnvelope(n, 0, requestId, null);
        } catch (Exception e) {
            // fall through
        }
        return new CellaException(data == null || data.isEmpty() ? "the stream ended with an error" : data, "STREAM_ERROR", 0, requestId, null, null, null);
    }
}
