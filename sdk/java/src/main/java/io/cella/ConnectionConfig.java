package io.cella;

import java.time.Duration;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * How a client reaches a Cella server: the server's URL, the API key, retries and timeouts.
 *
 * <p>Unset values come from the environment ({@code CELLA_SERVER}, {@code CELLA_API_KEY}), then
 * the defaults ({@code http://127.0.0.1:7070}, 3 retries of a 429, 120 s per request).
 *
 * <pre>{@code
 * ConnectionConfig conn = ConnectionConfig.builder().server("http://cella:7070").apiKey(key).build();
 * }</pre>
 */
public final class ConnectionConfig {
    public static final String DEFAULT_SERVER = "http://127.0.0.1:7070";
    public static final String ENV_SERVER = "CELLA_SERVER";
    public static final String ENV_API_KEY = "CELLA_API_KEY";

    private final String server;
    private final String apiKey;
    private final int maxRetries;
    private final Duration requestTimeout;
    private final Duration maxRetryWait;
    private final Map<String, String> headers;

    private ConnectionConfig(Builder b) {
        String s = b.server != null ? b.server : System.getenv(ENV_SERVER);
        this.server = normalize(s == null || s.isBlank() ? DEFAULT_SERVER : s);
        String k = b.apiKey != null ? b.apiKey : System.getenv(ENV_API_KEY);
        this.apiKey = k == null || k.isEmpty() ? null : k;
        this.maxRetries = b.maxRetries;
        this.requestTimeout = b.requestTimeout;
        this.maxRetryWait = b.maxRetryWait;
        this.headers = Collections.unmodifiableMap(new LinkedHashMap<>(b.headers));
    }

    /** The configuration from the environment and the defaults. */
    public static ConnectionConfig fromEnv() { return builder().build(); }

    public static Builder builder() { return new Builder(); }

    /** A builder that starts from this configuration. */
    public Builder toBuilder() {
        Builder b = new Builder().server(server).maxRetries(maxRetries).requestTimeout(requestTimeout).maxRetryWait(maxRetryWait);
        b.apiKey = apiKey == null ? "" : apiKey;
        b.headers.putAll(headers);
        return b;
    }

    static String normalize(String server) {
        String s = server.trim();
        while (s.endsWith("/")) s = s.substring(0, s.length() - 1);
        if (!s.contains("://")) s = "http://" + s;
        if (s.endsWith("/api/v1")) s = s.substring(0, s.length() - "/api/v1".length());
        return s;
    }

    /** The server's base URL, without {@code /api/v1}. */
    public String server() { return server; }

    /** The API base URL: {@code server() + "/api/v1"}. */
    public String apiUrl() { return server + "/api/v1"; }

    /** The API key, or null. */
    public String apiKey() { return apiKey; }

    /** How many times a request answered 429 is sent again after its {@code Retry-After}. */
    public int maxRetries() { return maxRetries; }

    /** The HTTP timeout of calls that run no command (those wait as long as the command may run). */
    public Duration requestTimeout() { return requestTimeout; }

    /** The longest wait before a retry of a 429. */
    public Duration maxRetryWait() { return maxRetryWait; }

    /** Extra headers sent with every request. */
    public Map<String, String> headers() { return headers; }

    @Override
    public String toString() { return "ConnectionConfig{server=" + server + ", apiKey=" + (apiKey == null ? "none" : "***") + "}"; }

    /** Builder of a {@link ConnectionConfig}. */
    public static final class Builder {
        private String server;
        private String apiKey;
        private int maxRetries = 3;
        private Duration requestTimeout = Duration.ofSeconds(120);
        private Duration maxRetryWait = Duration.ofSeconds(60);
        private final Map<String, String> headers = new LinkedHashMap<>();

        private Builder() {}

        /** The server's base URL ({@code http://host:port}; a trailing {@code /api/v1} is fine). */
        public Builder server(String server) { this.server = server; return this; }

        public Builder apiKey(String apiKey) { this.apiKey = apiKey; return this; }

        public Builder maxRetries(int maxRetries) {
            if (maxRetries < 0) throw new IllegalArgumentException("maxRetries must be 0 or more");
            this.maxRetries = maxRetries;
            return this;
        }

        public Builder requestTimeout(Duration timeout) { this.requestTimeout = timeout; return this; }

        public Builder maxRetryWait(Duration wait) { this.maxRetryWait = wait; return this; }

        public Builder header(String name, String value) { this.headers.put(name, value); return this; }

        public ConnectionConfig build() { return new ConnectionConfig(this); }
    }
}
