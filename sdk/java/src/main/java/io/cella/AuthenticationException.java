package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.time.Duration;

/** 401: no API key, or one that is unknown, revoked or expired. */
public class AuthenticationException extends CellaException {
    private static final long serialVersionUID = 1L;

    public AuthenticationException(String message, String code, int status, String requestId, JsonNode details, Duration retryAfter, Throwable cause) {
        super(message, code, status, requestId, details, retryAfter, cause);
    }
}
