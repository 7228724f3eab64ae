package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.List;
import java.util.Map;

/** A snapshot: a copy of a sandbox's files (with {@link #memory()}, of its running state too), to start new sandboxes from. */
public final class SnapshotInfo extends Model {
    SnapshotInfo(JsonNode raw) {
        super(raw);
    }

    public String id() { return str("id"); }

    public String sandboxId() { return str("sandbox_id"); }

    public String templateId() { return str("template_id"); }

    public String size() { return str("size"); }

    public long sizeBytes() { return num("size_bytes"); }

    public String createdAt() { return str("created_at"); }

    /** Whether it holds the sandbox's memory and processes too (a gVisor checkpoint): sandboxes made from it continue where the sandbox was. */
    public boolean memory() { return bool("memory"); }
}
