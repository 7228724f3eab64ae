package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.time.Duration;

/** 400: bad JSON, a wrong type, an unknown field, a value out of range ({@link #field()} names it). */
public class InvalidRequestException extends CellaException {
    private static final long serialVersionUID = 1L;

    public InvalidRequestException(String message, String code, int status, String requestId, JsonNode details, Duration retryAfter, Throwable cause) {
        super(message, code, status, requestId, details, retryAfter, cause);
    }
}
