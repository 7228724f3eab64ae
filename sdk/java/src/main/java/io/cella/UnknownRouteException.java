package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.time.Duration;

/** 404 for the route itself: this server does not serve the call (an older server). */
public class UnknownRouteException extends NotFoundException {
    private static final long serialVersionUID = 1L;

    public UnknownRouteException(String message, String code, int status, String requestId, JsonNode details, Duration retryAfter, Throwable cause) {
        super(message, code, status, requestId, details, retryAfter, cause);
    }
}
