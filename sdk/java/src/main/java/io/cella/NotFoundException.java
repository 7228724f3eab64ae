package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.time.Duration;

/** 404: the sandbox, process, path or other object does not exist (or is another workspace's). */
public class NotFoundException extends CellaException {
    private static final long serialVersionUID = 1L;

    public NotFoundException(String message, String code, int status, String requestId, JsonNode details, Duration retryAfter, Throwable cause) {
        super(message, code, status, requestId, details, retryAfter, cause);
    }
}
