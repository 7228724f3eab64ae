package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.time.Duration;
import java.util.Optional;

/**
 * Base of every error this SDK throws (unchecked).
 *
 * <p>{@link #code()} is the server's error code ({@code NOT_FOUND}, {@code SANDBOX_NOT_RUNNING},
 * ...), or one of this SDK's own ({@code TIMEOUT}, {@code CONNECTION_ERROR}, {@code COMMAND_EXIT},
 * {@code STREAM_ENDED}) for failures that never reached an answer. {@link #status()} is the HTTP
 * status (0 when there was no answer), {@link #requestId()} the answer's {@code x-request-id},
 * which the server's log is keyed on. Subclasses name the error families: catch {@link
 * NotFoundException}, {@link ConflictException}, {@link RateLimitedException}, ...
 */
public class CellaException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    private final String code;
    private final int status;
    private final String requestId;
    private final transient JsonNode details;
    private final Duration retryAfter;
    private final String serverMessage;

    public CellaException(String message) {
        this(message, null, 0, null, null, null, null);
    }

    public CellaException(String message, String code, int status, String requestId, JsonNode details, Duration retryAfter, Throwable cause) {
        super(render(message, code, status, requestId), cause);
        this.serverMessage = message;
        this.code = code;
        this.status = status;
        this.requestId = requestId;
        this.details = details;
        this.retryAfter = retryAfter;
    }

    private static String render(String message, String code, int status, String requestId) {
        StringBuilder sb = new StringBuilder();
        if (code != null) sb.append(code).append(": ");
        sb.append(message);
        if (status != 0 || requestId != null) {
            sb.append(" (");
            if (status != 0) sb.append("HTTP ").append(status);
            if (requestId != null) sb.append(status != 0 ? ", " : "").append("request ").append(requestId);
            sb.append(")");
        }
        return sb.toString();
    }

    /** The server's error code, e.g. {@code NOT_FOUND}. */
    public String code() { return code; }

    /** The HTTP status, or 0 when no answer came. */
    public int status() { return status; }

    /** The answer's {@code x-request-id}, or null. */
    public String requestId() { return requestId; }

    /** The message as the server gave it (without code and status). */
    public String serverMessage() { return serverMessage; }

    /** The envelope's {@code details} (a JSON object, or a missing node). */
    public JsonNode details() { return details == null ? Json.MISSING : details; }

    /** {@code details.field}, when the server named the field at fault. */
    public Optional<String> field() {
        JsonNode f = details().path("field");
        return f.isTextual() ? Optional.of(f.asText()) : Optional.empty();
    }

    /** The server's {@code Retry-After}, if it sent one (429 answers do). */
    public Optional<Duration> retryAfter() { return Optional.ofNullable(retryAfter); }
}
