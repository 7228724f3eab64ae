package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.List;
import java.util.Map;

/** An API key. {@link #key()} (the secret) is there only in the answer to its creation. */
public final class ApiKeyInfo extends Model {
    ApiKeyInfo(JsonNode raw) {
        super(raw);
    }

    public String id() { return str("id"); }

    public String workspaceId() { return str("workspace_id"); }

    public String name() { return str("name"); }

    public List<String> scopes() { return Json.stringList(raw.path("scopes")); }

    public String prefix() { return str("prefix"); }

    /** The secret, or null (it is shown only once). */
    public String key() { return str("key"); }

    public String expiresAt() { return str("expires_at"); }

    public String createdAt() { return str("created_at"); }

    /** When it was last used, or null. */
    public String lastUsedAt() { return str("last_used_at"); }
}
