package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.time.Duration;

/** 416: the requested byte range lies outside the file. */
public class RangeNotSatisfiableException extends CellaException {
    private static final long serialVersionUID = 1L;

    public RangeNotSatisfiableException(String message, String code, int status, String requestId, JsonNode details, Duration retryAfter, Throwable cause) {
        super(message, code, status, requestId, details, retryAfter, cause);
    }
}
