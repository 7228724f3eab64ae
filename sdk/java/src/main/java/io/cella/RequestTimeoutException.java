package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.time.Duration;

/** 408: the request body stalled. */
public class RequestTimeoutException extends CellaException {
    private static final long serialVersionUID = 1L;

    public RequestTimeoutException(String message, String code, int status, String requestId, JsonNode details, Duration retryAfter, Throwable cause) {
        super(message, code, status, requestId, details, retryAfter, cause);
    }
}
