package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.List;
import java.util.Map;

/** A file kept from a sandbox until it expires; download it with {@link Artifact#download(String)}. */
public final class ArtifactInfo extends Model {
    ArtifactInfo(JsonNode raw) {
        super(raw);
    }

    public String id() { return str("id"); }

    public String sandboxId() { return str("sandbox_id"); }

    /** Its path inside the sandbox. */
    public String path() { return str("path"); }

    /** Its size in bytes. */
    public long size() { return num("size"); }

    /** Where to download it with an API key. */
    public String url() { return str("url"); }

    public String createdAt() { return str("created_at"); }

    public String expiresAt() { return str("expires_at"); }
}
