package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.time.Duration;

/** 507: the sandbox's disk or the workspace's storage quota is full. */
public class InsufficientStorageException extends CellaException {
    private static final long serialVersionUID = 1L;

    public InsufficientStorageException(String message, String code, int status, String requestId, JsonNode details, Duration retryAfter, Throwable cause) {
        super(message, code, status, requestId, details, retryAfter, cause);
    }
}
