package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.List;
import java.util.Map;

/** A workspace (tenant). */
public final class WorkspaceInfo extends Model {
    WorkspaceInfo(JsonNode raw) {
        super(raw);
    }

    public String id() { return str("id"); }

    public String name() { return str("name"); }

    public String plan() { return str("plan"); }

    public String kind() { return str("kind"); }

    /** {@code tasks_enabled}, {@code compute_rate}, {@code session_limit_min}, {@code heartbeat_timeout_sec}, {@code model_allowlist}, {@code task_runtime}. */
    public JsonNode settings() { return raw.path("settings"); }
}
