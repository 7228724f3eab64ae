package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.time.Duration;

/** 413: the body is over the server's limit ({@code details.limit}). */
public class PayloadTooLargeException extends CellaException {
    private static final long serialVersionUID = 1L;

    public PayloadTooLargeException(String message, String code, int status, String requestId, JsonNode details, Duration retryAfter, Throwable cause) {
        super(message, code, status, requestId, details, retryAfter, cause);
    }
}
