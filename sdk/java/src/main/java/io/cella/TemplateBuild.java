package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.List;
import java.util.Map;

/** A build of a custom template. */
public final class TemplateBuild extends Model {
    TemplateBuild(JsonNode raw) {
        super(raw);
    }

    public String id() { return str("id"); }

    public String templateId() { return str("template_id"); }

    /** {@code queued}, {@code building}, {@code ready} or {@code failed}. */
    public String state() { return str("state"); }

    public boolean finished() { return "ready".equals(state()) || "failed".equals(state()); }

    public boolean ok() { return "ready".equals(state()); }

    /** The log from {@link #logOffset()} on (the whole log after {@link TemplateBuildHandle#waitFor}). */
    public String log() { return raw.path("log").asText(""); }

    public long logOffset() { return num("log_offset"); }

    public String error() { return str("error"); }

    public JsonNode steps() { return raw.path("steps"); }

    public String createdAt() { return str("created_at"); }

    public String finishedAt() { return str("finished_at"); }
}
