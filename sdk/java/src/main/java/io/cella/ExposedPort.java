package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.List;
import java.util.Map;

/** The addresses of a port inside a sandbox. */
public final class ExposedPort extends Model {
    ExposedPort(JsonNode raw) {
        super(raw);
    }

    public int port() { return raw.path("port").asInt(); }

    /** The address to hand out. */
    public String url() { return str("url"); }

    /** Its host-form address (the sandbox's own origin). */
    public String hostUrl() { return str("host_url"); }

    /** Its path-form address, for programs. */
    public String pathUrl() { return str("path_url"); }

    /** A preview token when the preview is private, else null. */
    public String token() { return str("token"); }

    public String tokenExpiresAt() { return str("token_expires_at"); }
}
