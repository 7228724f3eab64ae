package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.List;
import java.util.Map;

/** A sandbox as the server last described it. */
public final class SandboxInfo extends Model {
    SandboxInfo(JsonNode raw) {
        super(raw);
    }

    public String id() { return str("id"); }

    /** {@code provisioning}, {@code running}, {@code paused}, {@code stopped}, {@code destroyed} or {@code error}. */
    public String state() { return str("state"); }

    /** Why the server (not a call) moved the sandbox, or null. */
    public String stateReason() { return str("state_reason"); }

    public String templateId() { return str("template_id"); }

    public String size() { return str("size"); }

    public boolean ready() { return bool("ready"); }

    public long cpuCount() { return num("cpu_count"); }

    public long memoryMb() { return num("memory_mb"); }

    public long diskSizeMb() { return num("disk_size_mb"); }

    public long timeoutSec() { return num("timeout_sec"); }

    public Long timeoutRemainingMs() { return numOrNull("timeout_remaining_ms"); }

    public long idleTimeoutSec() { return num("idle_timeout_sec"); }

    public boolean persistent() { return bool("persistent"); }

    public boolean alwaysOn() { return bool("always_on"); }

    public Map<String, String> metadata() { return Json.stringMap(raw.path("metadata")); }

    /** The base of its preview addresses (path form), or null. */
    public String previewUrl() { return str("preview_url"); }

    public String createdAt() { return str("created_at"); }

    /** When it last started running, or null. */
    public String startedAt() { return str("started_at"); }

    /** When it was first ready for commands, or null. */
    public String readyAt() { return str("ready_at"); }

    /** Seconds it ran in all, once it is destroyed; null before. */
    public Long totalRuntimeSec() { return numOrNull("total_runtime_sec"); }

    /** The workspace it belongs to. */
    public String tenantId() { return str("tenant_id"); }

    /** The API key or user that made it. */
    public String ownerId() { return str("owner_id"); }

    /** Its size's resource contract: {@code contract_id}, {@code vcpus}, {@code memory_mb}, {@code disk_size_mb}... */
    public JsonNode resourceContract() { return raw.path("resource_contract"); }

    public String destroyedAt() { return str("destroyed_at"); }

    /** Its compute charge so far (a decimal string). */
    public String computeCost() { return str("compute_cost"); }

    public String computeRate() { return str("compute_rate"); }

    /** What its model gateway requests cost so far (a decimal string). */
    public String modelCost() { return str("model_cost"); }

    /** {@code false}: its previews need its preview token (see {@link Sandbox#previewToken}). */
    public boolean previewPublic() { return raw.path("preview").path("public").asBoolean(true); }

    /** Preview traffic resumes it when it is paused. */
    public boolean autoResume() { return bool("auto_resume"); }

    public JsonNode network() { return raw.path("network"); }

    /** The isolation runtime it runs on: {@code namespace} or {@code gvisor}. */
    public String runtime() { return str("runtime"); }

    /** Where a paused sandbox's memory is ({@code in_ram} or {@code on_disk}), or null when the server does not say. */
    public String memory() { return str("memory"); }
}
