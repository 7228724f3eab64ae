package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.List;
import java.util.Map;

/** A sandbox's resource usage (CPU, memory, disk, network) as the server reports it. */
public final class SandboxUsage extends Model {
    SandboxUsage(JsonNode raw) {
        super(raw);
    }

    public String sandboxId() { return str("sandbox_id"); }

    public String state() { return str("state"); }

    /** Seconds spent running, over every boot. */
    public double runningSec() { return raw.path("running_sec").asDouble(); }

    public double pausedSec() { return raw.path("paused_sec").asDouble(); }

    public long billedSec() { return num("billed_sec"); }

    /** CPU time used by the sandbox's processes. */
    public double cpuSec() { return raw.path("cpu_sec").asDouble(); }

    public double memoryMibSec() { return raw.path("memory_mib_sec").asDouble(); }

    /** Memory in use now, in MiB, or null without processes. */
    public Double memoryMibNow() { return raw.path("memory_mib_now").isNumber() ? raw.get("memory_mib_now").asDouble() : null; }

    public String measuredAt() { return str("measured_at"); }

    /** A figure by name (e.g. {@code billed_sec}), or 0. */
    public long get(String field) { return num(field); }
}
