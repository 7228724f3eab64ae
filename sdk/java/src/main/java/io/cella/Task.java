package io.cella;

import java.time.Duration;
import java.util.List;
import java.util.function.Consumer;

/**
 * Task runs: an agent works on a repository in a fresh sandbox, on a branch of its own, which is
 * handed back at the end (pushed, and opened as a draft pull request on GitHub and GitLab). Each
 * method has a variant with a {@link ConnectionConfig}.
 */
public final class Task {
    private Task() {}

    /** Start a run; answers it {@code queued}. */
    public static TaskInfo start(TaskOptions options) {
        return new TaskInfo(new Transport(options.connection).data("POST", "/tasks", null, Transport.Body.json(options.body)));
    }

    /** The workspace's runs, newest first ({@code state}, {@code repository}: filters, null for none). */
    public static List<TaskInfo> list(String state, String repository) { return list(state, repository, null, null); }

    public static List<TaskInfo> list(String state, String repository, Integer limit, ConnectionConfig connection) {
        Transport.Query q = Transport.Query.of().add("state", state).add("repository", repository);
        return Json.list(Json.tree(new Transport(connection).pages("/tasks", q, limit)), TaskInfo::new);
    }

    public static TaskInfo get(String taskId) { return get(taskId, null); }

    public static TaskInfo get(String taskId, ConnectionConfig connection) {
        return new TaskInfo(new Transport(connection).data("GET", "/tasks/" + Transport.seg(taskId)));
    }

    /** Stop a run (idempotent); answers it as it is then (follow the events for the end). */
    public static TaskInfo cancel(String taskId) { return cancel(taskId, null); }

    public static TaskInfo cancel(String taskId, ConnectionConfig connection) {
        return new TaskInfo(new Transport(connection).data("POST", "/tasks/" + Transport.seg(taskId) + "/cancel"));
    }

    /** The run's {@code state} and {@code progress} events: its current state first, then every change; ends after a terminal state. */
    public static EventIterator<TaskEvent> events(String taskId) { return events(taskId, null); }

    public static EventIterator<TaskEvent> events(String taskId, ConnectionConfig connection) {
        var resp = new Transport(connection).stream("GET", "/tasks/" + Transport.seg(taskId) + "/events", null, null, null, "text/event-stream");
        return new EventIterator<>(new EventStream(resp), ev -> {
            com.fasterxml.jackson.databind.node.ObjectNode n = Json.parse(ev.data).isObject() ? (com.fasterxml.jackson.databind.node.ObjectNode) Json.parse(ev.data) : Json.object();
            if (!n.has("event")) n.put("event", ev.event);
            return new TaskEvent(n);
        });
    }

    /** The agent's output while the run is alive ({@link GoneException} once it has ended). */
    public static EventIterator<TaskLogChunk> log(String taskId) { return log(taskId, null); }

    public static EventIterator<TaskLogChunk> log(String taskId, ConnectionConfig connection) {
        var resp = new Transport(connection).stream("GET", "/tasks/" + Transport.seg(taskId) + "/log", null, null, null, "text/event-stream");
        return new EventIterator<>(new EventStream(resp), ev -> new TaskLogChunk(Json.parse(ev.data)));
    }

    /**
     * Follow a run's events to its end (each given to {@code onEvent}, may be null) and answer the
     * run as it ended. {@link CellaTimeoutException} after {@code timeout}.
     */
    public static TaskInfo waitFor(String taskId, Duration timeout, Consumer<TaskEvent> onEvent, ConnectionConfig connection) {
        long deadline = System.nanoTime() + timeout.toNanos();
        while (true) {
            try (EventIterator<TaskEvent> events = events(taskId, connection)) {
                for (TaskEvent e : events) {
                    if (onEvent != null) onEvent.accept(e);
                    if (e.terminal()) return get(taskId, connection);
                    if (System.nanoTime() > deadline) break;
                }
            }
            TaskInfo t = get(taskId, connection);
            if (t.finished()) return t;
            if (System.nanoTime() > deadline) throw new CellaTimeoutException("task run " + taskId + " did not end within " + timeout.toSeconds() + " s (state " + t.state() + ")", "TIMEOUT", 0, null, null, null, null);
        }
    }
}
