package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.time.Duration;

/** 429 {@code CONCURRENCY_LIMIT}: the workspace holds its plan's cap of concurrent sandboxes. */
public class ConcurrencyLimitException extends RateLimitedException {
    private static final long serialVersionUID = 1L;

    public ConcurrencyLimitException(String message, String code, int status, String requestId, JsonNode details, Duration retryAfter, Throwable cause) {
        super(message, code, status, requestId, details, retryAfter, cause);
    }
}
