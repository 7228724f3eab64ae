package io.cella;

import com.fasterxml.jackson.databind.node.ObjectNode;
import java.time.Duration;
import java.util.Map;
import java.util.function.Consumer;

/**
 * Options of a command: {@link Commands#run(String, ExecOptions)}, {@link Commands#stream},
 * {@link Commands#start}.
 *
 * <pre>{@code
 * sandbox.commands().run("make test", ExecOptions.builder().cwd("/home/user/app").env("CI", "1").timeout(Duration.ofMinutes(5)).build());
 * }</pre>
 */
public final class ExecOptions {
    final ObjectNode fields;
    final Duration timeout;
    final boolean check;
    final Consumer<String> onStdout;
    final Consumer<String> onStderr;

    private ExecOptions(Builder b) {
        this.fields = b.fields.deepCopy();
        this.timeout = b.timeout;
        this.check = b.check;
        this.onStdout = b.onStdout;
        this.onStderr = b.onStderr;
    }

    public static Builder builder() { return new Builder(); }

    static final ExecOptions NONE = builder().build();

    /** Builder of {@link ExecOptions}. */
    public static final class Builder {
        private final ObjectNode fields = Json.object();
        private Duration timeout;
        private boolean check;
        private Consumer<String> onStdout;
        private Consumer<String> onStderr;

        private Builder() {}

        public Builder env(String key, String value) { Json.child(fields, "env").put(key, value); return this; }

        public Builder env(Map<String, String> env) { env.forEach(this::env); return this; }

        /** The working directory (an absolute path). */
        public Builder cwd(String cwd) { fields.put("cwd", cwd); return this; }

        /** {@code user} (the default) or {@code root}. */
        public Builder user(String user) { fields.put("user", user); return this; }

        /** The command's timeout (server default one hour); not for background processes. */
        public Builder timeout(Duration timeout) { this.timeout = timeout; fields.put("timeout_sec", CreateOptions.seconds(timeout)); return this; }

        /** Text written to the command's standard input, which is then closed. */
        public Builder stdin(String stdin) { fields.put("stdin", stdin); return this; }

        /** A label for a background process. */
        public Builder tag(String tag) { fields.put("tag", tag); return this; }

        /** Throw {@link CommandExitException} for an exit code other than 0. */
        public Builder check(boolean check) { this.check = check; return this; }

        /** Stream the output and give each piece of stdout text to this callback as it comes. */
        public Builder onStdout(Consumer<String> cb) { this.onStdout = cb; return this; }

        public Builder onStderr(Consumer<String> cb) { this.onStderr = cb; return this; }

        public ExecOptions build() { return new ExecOptions(this); }
    }
}
