package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.List;
import java.util.Map;

/** A code interpreter context (a namespace). */
public final class CodeContext extends Model {
    CodeContext(JsonNode raw) {
        super(raw);
    }

    public String name() { return str("name"); }

    public String language() { return str("language"); }

    /** For create and reset: whether anything changed. */
    public boolean changed() { return bool("changed"); }
}
