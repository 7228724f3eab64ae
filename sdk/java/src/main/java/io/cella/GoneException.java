package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.time.Duration;

/** 410 {@code GONE}: the thing existed but is no more (a task run's live log once the run ended). */
public class GoneException extends CellaException {
    private static final long serialVersionUID = 1L;

    public GoneException(String message, String code, int status, String requestId, JsonNode details, Duration retryAfter, Throwable cause) {
        super(message, code, status, requestId, details, retryAfter, cause);
    }
}
