package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.List;
import java.util.Map;

/** One language's interpreter in a sandbox. */
public final class KernelInfo extends Model {
    KernelInfo(JsonNode raw) {
        super(raw);
    }

    public String language() { return str("language"); }

    public boolean running() { return bool("running"); }

    public boolean busy() { return bool("busy"); }

    public List<String> contexts() { return Json.stringList(raw.path("contexts")); }
}
