package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Base64;
import java.util.Map;

/**
 * A one-shot run ({@link Sandbox#run(RunOptions)}): a sandbox is created, files written into it,
 * a command run, the files matching the artifact globs kept, and the sandbox destroyed, in one
 * request.
 *
 * <pre>{@code
 * RunResult r = Sandbox.run(RunOptions.command("sort data.txt > out/sorted.txt").file("data.txt", "b\na\n").artifact("out/*.txt").build());
 * }</pre>
 */
public final class RunOptions {
    final ObjectNode body;
    final Duration timeout;
    final boolean check;
    final ConnectionConfig connection;

    private RunOptions(Builder b) {
        this.body = b.body.deepCopy();
        this.timeout = b.timeout;
        this.check = b.check;
        this.connection = b.connection;
    }

    /** A run of a shell line. */
    public static Builder command(String command) { Builder b = new Builder(); b.body.put("command", command); return b; }

    /** A run of a program with its arguments. */
    public static Builder argv(java.util.List<String> argv) { Builder b = new Builder(); b.body.set("argv", Json.tree(argv)); return b; }

    /** Builder of {@link RunOptions}. */
    public static final class Builder {
        private final ObjectNode body = Json.object();
        private Duration timeout;
        private boolean check;
        private ConnectionConfig connection;

        private Builder() {}

        /** A text file to write before the command (a path absolute, or relative to the cwd). */
        public Builder file(String path, String content) { body.withArray("files").addObject().put("path", path).put("content", content); return this; }

        /** A binary file (sent as base64). */
        public Builder file(String path, byte[] content) {
            body.withArray("files").addObject().put("path", path).put("content", Base64.getEncoder().encodeToString(content)).put("encoding", "base64");
            return this;
        }

        /** A glob of files to keep as artifacts. */
        public Builder artifact(String glob) { body.withArray("artifacts").add(glob); return this; }

        public Builder timeout(Duration timeout) { this.timeout = timeout; body.put("timeout_sec", CreateOptions.seconds(timeout)); return this; }

        public Builder env(String key, String value) { Json.child(body, "env").put(key, value); return this; }

        public Builder env(Map<String, String> env) { env.forEach(this::env); return this; }

        public Builder cwd(String cwd) { body.put("cwd", cwd); return this; }

        public Builder user(String user) { body.put("user", user); return this; }

        public Builder stdin(String stdin) { body.put("stdin", stdin); return this; }

        public Builder stdin(byte[] stdin) { return stdin(new String(stdin, StandardCharsets.UTF_8)); }

        public Builder template(String templateId) { body.put("template_id", templateId); return this; }

        public Builder size(String size) { body.put("size", size); return this; }

        /** The isolation runtime of the run's sandbox, {@code namespace} or {@code gvisor}, as at create. */
        public Builder runtime(String runtime) { body.put("runtime", runtime); return this; }

        public Builder metadata(String key, String value) { Json.child(body, "metadata").put(key, value); return this; }

        public Builder network(JsonNode policy) { body.set("network", policy); return this; }

        /** Throw {@link CommandExitException} for an exit code other than 0. */
        public Builder check(boolean check) { this.check = check; return this; }

        public Builder connection(ConnectionConfig connection) { this.connection = connection; return this; }

        public RunOptions build() { return new RunOptions(this); }
    }
}
