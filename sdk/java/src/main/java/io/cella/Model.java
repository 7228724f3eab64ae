package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.Objects;

/**
 * Base of the objects the server answers: each keeps the JSON it was read from ({@link #raw()}),
 * so fields this SDK has no getter for yet are still at hand.
 */
public abstract class Model {
    protected final JsonNode raw;

    protected Model(JsonNode raw) {
        this.raw = raw == null ? Json.MISSING : raw;
    }

    /** The object as the server sent it. */
    public JsonNode raw() { return raw; }

    protected String str(String f) { return Json.text(raw, f); }

    protected long num(String f) { return raw.path(f).asLong(0); }

    protected Long numOrNull(String f) { return Json.longOrNull(raw, f); }

    protected boolean bool(String f) { return raw.path(f).asBoolean(false); }

    @Override
    public boolean equals(Object o) {
        return o != null && o.getClass() == getClass() && raw.equals(((Model) o).raw);
    }

    @Override
    public int hashCode() { return Objects.hash(getClass(), raw); }

    @Override
    public String toString() { return getClass().getSimpleName() + raw; }
}
