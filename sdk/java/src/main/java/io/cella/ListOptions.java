package io.cella;

import java.util.LinkedHashMap;
import java.util.Map;

/** Filters of {@link Sandbox#list(ListOptions)}. */
public final class ListOptions {
    final String state;
    final Map<String, String> metadata;
    final Integer limit;
    final ConnectionConfig connection;

    private ListOptions(Builder b) {
        this.state = b.state;
        this.metadata = new LinkedHashMap<>(b.metadata);
        this.limit = b.limit;
        this.connection = b.connection;
    }

    public static Builder builder() { return new Builder(); }

    /** Builder of {@link ListOptions}. */
    public static final class Builder {
        private String state;
        private final Map<String, String> metadata = new LinkedHashMap<>();
        private Integer limit;
        private ConnectionConfig connection;

        private Builder() {}

        /** One state, or {@code "all"} (default: the live ones). */
        public Builder state(String state) { this.state = state; return this; }

        /** Keep the sandboxes whose metadata has this entry. */
        public Builder metadata(String key, String value) { metadata.put(key, value); return this; }

        /** At most this many. */
        public Builder limit(int limit) { this.limit = limit; return this; }

        public Builder connection(ConnectionConfig connection) { this.connection = connection; return this; }

        public ListOptions build() { return new ListOptions(this); }
    }
}
