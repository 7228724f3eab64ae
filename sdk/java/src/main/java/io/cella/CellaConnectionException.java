package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.time.Duration;

/** The server could not be reached, or the connection broke. */
public class CellaConnectionException extends CellaException {
    private static final long serialVersionUID = 1L;

    public CellaConnectionException(String message, String code, int status, String requestId, JsonNode details, Duration retryAfter, Throwable cause) {
        super(message, code, status, requestId, details, retryAfter, cause);
    }
}
