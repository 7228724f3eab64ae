package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.List;
import java.util.Map;

/** A preview token of a sandbox. */
public final class PreviewToken extends Model {
    PreviewToken(JsonNode raw) {
        super(raw);
    }

    public String token() { return str("token"); }

    public String expiresAt() { return str("expires_at"); }
}
