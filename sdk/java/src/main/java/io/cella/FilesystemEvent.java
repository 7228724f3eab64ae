package io.cella;

import com.fasterxml.jackson.databind.JsonNode;

/** A change in a watched directory. */
public final class FilesystemEvent extends Model {
    private final String type;

    FilesystemEvent(String type, JsonNode raw) {
        super(raw);
        this.type = type;
    }

    /** {@code create}, {@code modify}, {@code delete} or {@code rename}. */
    public String type() { return type; }

    public String path() { return str("path"); }

    /** For a {@code rename}: where it was. */
    public String from() { return str("from"); }

    public boolean dir() { return bool("dir"); }

    @Override
    public String toString() { return "FilesystemEvent{" + type + " " + path() + "}"; }
}
