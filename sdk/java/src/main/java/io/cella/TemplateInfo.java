package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.List;
import java.util.Map;

/** A template of the catalog (the built-in {@code base}, or a custom one). */
public final class TemplateInfo extends Model {
    TemplateInfo(JsonNode raw) {
        super(raw);
    }

    public String id() { return str("id"); }

    public String name() { return str("name"); }

    public String defaultSize() { return str("default_size"); }

    /** {@code fast_ready} (warm sandboxes wait), {@code cold_boot_only} or {@code missing}, for its default size. */
    public String readiness() { return str("readiness"); }

    /** What it makes ({@code sandbox}). */
    public String product() { return str("product"); }

    public String primitive() { return str("primitive"); }

    /** The name the SDKs know it by. */
    public String sdkName() { return str("sdk_name"); }

    /** The name the CLI knows it by. */
    public String cliName() { return str("cli_name"); }

    /** Each size and its readiness ({@code fast_ready}, {@code cold_boot_only}, {@code missing}). */
    public JsonNode sizes() { return raw.path("sizes"); }

    /** The runtimes its sandboxes can run on on this server, its default first. */
    public List<String> runtimes() { return Json.stringList(raw.path("runtimes")); }
}
