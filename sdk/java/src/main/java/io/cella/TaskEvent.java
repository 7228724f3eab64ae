package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.List;
import java.util.Map;

/** An event of a task run: a {@code state} change or {@code progress} counts. */
public final class TaskEvent extends Model {
    TaskEvent(JsonNode raw) {
        super(raw);
    }

    /** {@code state} or {@code progress}. */
    public String event() { return str("event"); }

    /** For a {@code state} event: the new state. */
    public String state() { return str("state"); }

    public String at() { return str("at"); }

    public String failureReason() { return str("failure_reason"); }

    public String stopReason() { return str("stop_reason"); }

    public long steps() { return num("steps"); }

    public long commits() { return num("commits"); }

    public long filesChanged() { return num("files_changed"); }

    /** A {@code state} event of a terminal state. */
    public boolean terminal() { String s = state(); return "state".equals(event()) && ("stopped".equals(s) || "failed".equals(s) || "cancelled".equals(s)); }
}
