package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.time.Duration;
import java.util.Map;

/**
 * Options of {@link Sandbox#create(CreateOptions)}.
 *
 * <pre>{@code
 * CreateOptions opts = CreateOptions.builder().size("xs").timeout(Duration.ofMinutes(10)).metadata("team", "a").build();
 * }</pre>
 */
public final class CreateOptions {
    final ObjectNode body;
    final ConnectionConfig connection;

    private CreateOptions(Builder b) {
        this.body = b.body.deepCopy();
        this.connection = b.connection;
    }

    public static Builder builder() { return new Builder(); }

    static long seconds(Duration d) {
        long s = d.getSeconds();
        return d.getNano() > 0 ? s + 1 : s;
    }

    /** Builder of {@link CreateOptions}. */
    public static final class Builder {
        private final ObjectNode body = Json.object();
        private ConnectionConfig connection;

        private Builder() {}

        /** The template ({@code base} by default, or a custom template's id). */
        public Builder template(String templateId) { body.put("template_id", templateId); return this; }

        /** {@code xs}, {@code small}, {@code medium}, {@code large} or {@code xl}. */
        public Builder size(String size) { body.put("size", size); return this; }

        /**
         * The compatibility form of a size: vCPUs, memory and disk (MiB) equal to one size's resource
         * contract ({@code 1, 1024, 4096} is {@code xs}); other figures are an {@link InvalidRequestException}.
         */
        public Builder resources(int cpuCount, int memoryMb, int diskSizeMb) {
            body.put("cpu_count", cpuCount).put("memory_mb", memoryMb).put("disk_size_mb", diskSizeMb);
            return this;
        }

        /** The active-session timeout (default one hour; whole seconds, rounded up). */
        public Builder timeout(Duration timeout) { body.put("timeout_sec", seconds(timeout)); return this; }

        public Builder idleTimeout(Duration timeout) { body.put("idle_timeout_sec", seconds(timeout)); return this; }

        public Builder persistent(boolean persistent) { body.put("persistent", persistent); return this; }

        public Builder alwaysOn(boolean alwaysOn) { body.put("always_on", alwaysOn); return this; }

        public Builder metadata(String key, String value) { Json.child(body, "metadata").put(key, value); return this; }

        public Builder metadata(Map<String, String> metadata) { metadata.forEach(this::metadata); return this; }

        public Builder env(String key, String value) { Json.child(body, "env").put(key, value); return this; }

        public Builder env(Map<String, String> env) { env.forEach(this::env); return this; }

        /** The egress policy, e.g. {@code {"egress": "deny", "allow": ["packages.example.org"]}}. */
        public Builder network(JsonNode policy) { body.set("network", policy); return this; }

        /** Start from a snapshot's files. */
        public Builder snapshot(String snapshotId) { body.put("snapshot_id", snapshotId); return this; }

        /**
         * The isolation runtime, {@code namespace} or {@code gvisor} (default: the template's, then the
         * server's); {@code gvisor} needs {@code runsc} on the server.
         */
        public Builder runtime(String runtime) { body.put("runtime", runtime); return this; }

        /** {@code false}: answer at once, while the sandbox is still provisioning (see {@link Sandbox#waitReady}). */
        public Builder waitReady(boolean wait) { body.put("wait", wait); return this; }

        /** Previews need the sandbox's token ({@code false}) or not ({@code true}, the default). */
        public Builder publicPreview(boolean isPublic) { body.putObject("preview").put("public", isPublic); return this; }

        public Builder autoResume(boolean autoResume) { body.put("auto_resume", autoResume); return this; }

        /** The sandbox may use the model gateway. */
        public Builder modelAccess(boolean modelAccess) { body.put("model_access", modelAccess); return this; }

        /** A raw field of the request body. */
        public Builder extra(String field, Object value) { body.set(field, Json.tree(value)); return this; }

        /** Where the server is (default: the environment). */
        public Builder connection(ConnectionConfig connection) { this.connection = connection; return this; }

        public CreateOptions build() { return new CreateOptions(this); }
    }
}
