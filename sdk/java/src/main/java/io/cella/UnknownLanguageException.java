package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.time.Duration;

/** 400 {@code UNKNOWN_LANGUAGE}: the code interpreter does not know the language. */
public class UnknownLanguageException extends InvalidRequestException {
    private static final long serialVersionUID = 1L;

    public UnknownLanguageException(String message, String code, int status, String requestId, JsonNode details, Duration retryAfter, Throwable cause) {
        super(message, code, status, requestId, details, retryAfter, cause);
    }
}
