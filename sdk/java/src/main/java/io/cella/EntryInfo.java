package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.List;
import java.util.Map;

/** A file, directory or link inside a sandbox. */
public final class EntryInfo extends Model {
    EntryInfo(JsonNode raw) {
        super(raw);
    }

    public String path() { return str("path"); }

    public String name() { return str("name"); }

    /** {@code file}, {@code dir}, {@code symlink}, ... */
    public String type() { return str("type"); }

    public boolean isDir() { return "dir".equals(type()) || "directory".equals(type()); }

    public long size() { return num("size"); }

    /** The permission bits as octal text, e.g. {@code "0644"}. */
    public String mode() { return str("mode"); }

    public long uid() { return num("uid"); }

    public long gid() { return num("gid"); }

    public String modifiedAt() { return str("modified_at"); }

    public String symlinkTarget() { return str("symlink_target"); }
}
