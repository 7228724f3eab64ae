package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.time.Duration;

/** 403: the API key lacks the route's scope ({@code details.required_scope}), or the feature is off for the workspace. */
public class PermissionDeniedException extends CellaException {
    private static final long serialVersionUID = 1L;

    public PermissionDeniedException(String message, String code, int status, String requestId, JsonNode details, Duration retryAfter, Throwable cause) {
        super(message, code, status, requestId, details, retryAfter, cause);
    }
}
