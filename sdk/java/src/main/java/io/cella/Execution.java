package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.List;
import java.util.Optional;

/** The answer of a code cell. */
public final class Execution extends Model {
    Execution(JsonNode raw) {
        super(raw);
    }

    /** True when the cell ran to its end without raising. */
    public boolean ok() { return bool("ok"); }

    public String stdout() { return raw.path("stdout").asText(""); }

    public String stderr() { return raw.path("stderr").asText(""); }

    /** The value of the cell's last expression as the language's REPL shows it, or null. */
    public String result() { return str("result"); }

    public String language() { return str("language"); }

    /** True when the kernel had to be restarted (every context of the language was lost). */
    public boolean restarted() { return bool("restarted"); }

    /** The rich outputs (images, HTML, ...) in the order they were made. */
    public List<RichOutput> outputs() { return Json.list(raw.path("outputs"), RichOutput::new); }

    /** The first output of a MIME type. */
    public Optional<RichOutput> output(String mime) {
        return outputs().stream().filter(o -> mime.equals(o.mime())).findFirst();
    }

    /** The error of a failed cell. */
    public Optional<Error> error() { return raw.path("error").isObject() ? Optional.of(new Error(raw.get("error"))) : Optional.empty(); }

    /** A cell's error: the exception's class, message and traceback. */
    public static final class Error extends Model {
        Error(JsonNode raw) {
            super(raw);
        }

        public String name() { return str("name"); }

        public String value() { return str("value"); }

        public String traceback() { return str("traceback"); }
    }
}
