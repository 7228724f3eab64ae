package io.cella;

import com.fasterxml.jackson.databind.node.ObjectNode;
import java.util.Map;

/**
 * A task run to start ({@link Task#start(TaskOptions)}).
 *
 * <pre>{@code
 * TaskInfo run = Task.start(TaskOptions.builder("acme/web", "Make the greeting greet the tasks.").baseBranch("main").build());
 * }</pre>
 */
public final class TaskOptions {
    final ObjectNode body;
    final ConnectionConfig connection;

    private TaskOptions(Builder b) {
        this.body = b.body.deepCopy();
        this.connection = b.connection;
    }

    /** A run on {@code repository} ({@code owner/name}) with the task message. */
    public static Builder builder(String repository, String task) { return new Builder(repository, task); }

    /** Builder of {@link TaskOptions}. */
    public static final class Builder {
        private final ObjectNode body = Json.object();
        private ConnectionConfig connection;

        private Builder(String repository, String task) {
            body.put("repository", repository).put("task", task);
        }

        /** The branch to start from (default: the repository's default branch). */
        public Builder baseBranch(String branch) { body.put("base_branch", branch); return this; }

        /** The forge's name (default: the first configured). */
        public Builder forge(String forge) { body.put("forge", forge); return this; }

        /** The agent's name (default: the first configured). */
        public Builder agent(String agent) { body.put("agent", agent); return this; }

        public Builder metadata(String key, String value) { Json.child(body, "metadata").put(key, value); return this; }

        public Builder metadata(Map<String, String> metadata) { metadata.forEach(this::metadata); return this; }

        public Builder connection(ConnectionConfig connection) { this.connection = connection; return this; }

        public TaskOptions build() { return new TaskOptions(this); }
    }
}
