package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.List;
import java.util.Map;

/** A task run: an agent working on a repository in a sandbox, on a branch of its own. */
public final class TaskInfo extends Model {
    TaskInfo(JsonNode raw) {
        super(raw);
    }

    public String id() { return str("id"); }

    public String workspaceId() { return str("workspace_id"); }

    /** The user or API key that started it ({@code usr_...} / {@code key_...}). */
    public String createdBy() { return str("created_by"); }

    /** Its session limit in minutes, from the workspace's settings when it started. */
    public long sessionLimitMin() { return num("session_limit_min"); }

    /** Compute price per running second (a decimal string). */
    public String computeRate() { return str("compute_rate"); }

    public String repository() { return str("repository"); }

    public String baseBranch() { return str("base_branch"); }

    /** The branch the run works on ({@code cella/<task id>}). */
    public String branch() { return str("branch"); }

    public String forge() { return str("forge"); }

    public String agent() { return str("agent"); }

    /** {@code queued}, {@code provisioning}, {@code running}, {@code stopped}, {@code failed} or {@code cancelled}. */
    public String state() { return str("state"); }

    public boolean finished() { String s = state(); return "stopped".equals(s) || "failed".equals(s) || "cancelled".equals(s); }

    public String failureReason() { return str("failure_reason"); }

    public String stopReason() { return str("stop_reason"); }

    /** The draft pull request ({@code number}, {@code url}, {@code draft}), or a null node. */
    public JsonNode pullRequest() { return raw.path("pull_request"); }

    public String queuedAt() { return str("queued_at"); }

    public String startedAt() { return str("started_at"); }

    public String endedAt() { return str("ended_at"); }

    public long computeSec() { return num("compute_sec"); }

    public String computeCost() { return str("compute_cost"); }

    public String modelCost() { return str("model_cost"); }

    public long modelRequests() { return num("model_requests"); }

    public Map<String, String> metadata() { return Json.stringMap(raw.path("metadata")); }
}
