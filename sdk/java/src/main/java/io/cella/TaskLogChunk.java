package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.List;
import java.util.Map;

/** A chunk of a task run's live log. */
public final class TaskLogChunk extends Model {
    TaskLogChunk(JsonNode raw) {
        super(raw);
    }

    /** {@code stdout} or {@code stderr}. */
    public String stream() { return str("stream"); }

    public String text() { return raw.path("text").asText(""); }
}
