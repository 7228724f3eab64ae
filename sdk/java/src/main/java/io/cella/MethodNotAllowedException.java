package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.time.Duration;

/** 405: a known path with a method it does not serve. */
public class MethodNotAllowedException extends CellaException {
    private static final long serialVersionUID = 1L;

    public MethodNotAllowedException(String message, String code, int status, String requestId, JsonNode details, Duration retryAfter, Throwable cause) {
        super(message, code, status, requestId, details, retryAfter, cause);
    }
}
