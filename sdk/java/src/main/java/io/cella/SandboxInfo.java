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

    public String destroyedAt() { return str("destroyed_at"); }

    /** Its compute charge so far (a decimal string). */
    public String computeCost() { return str("compute_cost"); }

    public String computeRate() { return str("compute_rate"); }

    public JsonNode network() { return raw.path("network"); }

    /** The isolation runtime it runs on: {@code namespace} or {@code gvisor}. */
    public String runtime() { return str("runtime"); }

    /** Where a paused sandbox's memory is ({@code in_ram} or {@code on_disk}), or null when the server does not say. */
    public String memory() { return str("memory"); }
}
