package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.time.Duration;

/** 503: a sandbox failed to start, or its agent did not answer. */
public class UnavailableException extends CellaException {
    private static final long serialVersionUID = 1L;

    public UnavailableException(String message, String code, int status, String requestId, JsonNode details, Duration retryAfter, Throwable cause) {
        super(message, code, status, requestId, details, retryAfter, cause);
    }
}
