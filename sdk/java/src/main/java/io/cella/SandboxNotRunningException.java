package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.time.Duration;

/** 409 {@code SANDBOX_NOT_RUNNING}: the sandbox is not running (paused, stopped, ...); it was not woken. */
public class SandboxNotRunningException extends ConflictException {
    private static final long serialVersionUID = 1L;

    public SandboxNotRunningException(String message, String code, int status, String requestId, JsonNode details, Duration retryAfter, Throwable cause) {
        super(message, code, status, requestId, details, retryAfter, cause);
    }
}
