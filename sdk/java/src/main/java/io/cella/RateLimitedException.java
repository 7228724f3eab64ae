package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.time.Duration;

/** 429: the workspace used up its requests of a group; thrown once the retries allowed by {@link ConnectionConfig#maxRetries()} are used up. {@link #retryAfter()} is the server's {@code Retry-After}. */
public class RateLimitedException extends CellaException {
    private static final long serialVersionUID = 1L;

    public RateLimitedException(String message, String code, int status, String requestId, JsonNode details, Duration retryAfter, Throwable cause) {
        super(message, code, status, requestId, details, retryAfter, cause);
    }
}
