package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.time.Duration;

/** 500: a failure on the server; its log has it under {@link #requestId()}. */
public class InternalServerException extends CellaException {
    private static final long serialVersionUID = 1L;

    public InternalServerException(String message, String code, int status, String requestId, JsonNode details, Duration retryAfter, Throwable cause) {
        super(message, code, status, requestId, details, retryAfter, cause);
    }
}
