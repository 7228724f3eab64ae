package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.time.Duration;

/** The client gave up waiting (an HTTP timeout, or the timeout of a wait). */
public class CellaTimeoutException extends CellaException {
    private static final long serialVersionUID = 1L;

    public CellaTimeoutException(String message, String code, int status, String requestId, JsonNode details, Duration retryAfter, Throwable cause) {
        super(message, code, status, requestId, details, retryAfter, cause);
    }
}
