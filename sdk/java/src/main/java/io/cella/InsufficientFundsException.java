package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.time.Duration;

/** 402: the workspace's wallet does not cover the request ({@code details.needed}, {@code details.available}). */
public class InsufficientFundsException extends CellaException {
    private static final long serialVersionUID = 1L;

    public InsufficientFundsException(String message, String code, int status, String requestId, JsonNode details, Duration retryAfter, Throwable cause) {
        super(message, code, status, requestId, details, retryAfter, cause);
    }
}
