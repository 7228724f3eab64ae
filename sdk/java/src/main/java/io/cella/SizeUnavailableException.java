package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.time.Duration;

/** 400 {@code SIZE_UNAVAILABLE}: the size is missing on this server. */
public class SizeUnavailableException extends InvalidRequestException {
    private static final long serialVersionUID = 1L;

    public SizeUnavailableException(String message, String code, int status, String requestId, JsonNode details, Duration retryAfter, Throwable cause) {
        super(message, code, status, requestId, details, retryAfter, cause);
    }
}
