package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.List;
import java.util.Map;

/** A background process. */
public final class ProcessInfo extends Model {
    ProcessInfo(JsonNode raw) {
        super(raw);
    }

    public int pid() { return raw.path("pid").asInt(); }

    public List<String> argv() { return Json.stringList(raw.path("argv")); }

    public String tag() { return str("tag"); }

    public String user() { return str("user"); }

    public String cwd() { return str("cwd"); }

    /** {@code running} or {@code exited}. */
    public String state() { return str("state"); }

    public boolean running() { return "running".equals(state()); }

    /** Once exited: its exit status, else null. */
    public Integer exitCode() { return raw.path("exit_code").isNumber() ? raw.get("exit_code").asInt() : null; }

    public String startedAt() { return str("started_at"); }

    public String endedAt() { return str("ended_at"); }

    public long outputDroppedBytes() { return num("output_dropped_bytes"); }
}
