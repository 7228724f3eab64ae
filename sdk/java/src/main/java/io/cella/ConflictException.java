package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.time.Duration;

/** 409: the call is not allowed in the object's state ({@code details.state}), or a file operation on a path of the wrong type. */
public class ConflictException extends CellaException {
    private static final long serialVersionUID = 1L;

    public ConflictException(String message, String code, int status, String requestId, JsonNode details, Duration retryAfter, Throwable cause) {
        super(message, code, status, requestId, details, retryAfter, cause);
    }
}
