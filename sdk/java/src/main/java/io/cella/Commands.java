package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;

/** Commands inside a sandbox: {@code sandbox.commands()}. */
public final class Commands {
    static final Duration MARGIN = Duration.ofSeconds(30);
    private final Sandbox sandbox;

    Commands(Sandbox sandbox) {
        this.sandbox = sandbox;
    }

    private Transport t() { return sandbox.transport; }

    private String path(String... rest) { return Transport.sandboxPath(sandbox.id(), rest); }

    static ObjectNode body(Object cmd, ExecOptions o) {
        ObjectNode body = Json.object();
        if (cmd instanceof String) {
            body.put("command", (String) cmd);
        } else if (cmd instanceof List) {
            body.set("argv", Json.tree(cmd));
        } else {
            throw new IllegalArgumentException("a command is a shell line (String) or a list of arguments");
        }
        body.setAll(o.fields);
        return body;
    }

    static Duration httpTimeout(ExecOptions o) {
        return (o.timeout == null ? Duration.ofHours(1) : o.timeout).plus(MARGIN);
    }

    /** Run a shell line (with {@code bash -c}) to its end. */
    public CommandResult run(String command) { return run(command, ExecOptions.NONE); }

    /** Run a shell line to its end. With {@code onStdout}/{@code onStderr} the output is streamed to them. */
    public CommandResult run(String command, ExecOptions options) { return exec(command, options); }

    /** Run a program with its arguments (no shell) to its end. */
    public CommandResult run(List<String> argv, ExecOptions options) { return exec(argv, options); }

    private CommandResult exec(Object cmd, ExecOptions o) {
        CommandResult r;
        if (o.onStdout != null || o.onStderr != null) {
            try (CommandStream s = streamed(cmd, o)) {
                for (OutputChunk c : s) {
                    if (c.isStdout() && o.onStdout != null) o.onStdout.accept(c.text());
                    if (c.isStderr() && o.onStderr != null) o.onStderr.accept(c.text());
                }
                r = s.result();
            }
        } else {
            r = new CommandResult(t().data("POST", path("exec"), null, Transport.Body.json(body(cmd, o)), httpTimeout(o)));
        }
        if (o.check && !r.ok()) throw new CommandExitException(r);
        return r;
    }

    /** Run a shell line and follow its output as it comes (server-sent events). */
    public CommandStream stream(String command) { return stream(command, ExecOptions.NONE); }

    public CommandStream stream(String command, ExecOptions options) { return streamed(command, options); }

    public CommandStream stream(List<String> argv, ExecOptions options) { return streamed(argv, options); }

    private CommandStream streamed(Object cmd, ExecOptions o) {
        var resp = t().stream("POST", path("exec", "stream"), null, Transport.Body.json(body(cmd, o)), httpTimeout(o), "text/event-stream");
        return new CommandStream(new EventStream(resp), "the command", null);
    }

    /** Start a background process (no timeout of its own) and answer its handle. */
    public CommandHandle start(String command) { return start(command, ExecOptions.NONE); }

    public CommandHandle start(String command, ExecOptions options) { return started(command, options); }

    public CommandHandle start(List<String> argv, ExecOptions options) { return started(argv, options); }

    private CommandHandle started(Object cmd, ExecOptions o) {
        ObjectNode body = body(cmd, o);
        JsonNode stdin = body.remove("stdin");
        body.remove("timeout_sec");
        CommandHandle h = new CommandHandle(sandbox, new ProcessInfo(t().data("POST", path("processes"), null, Transport.Body.json(body))));
        if (stdin != null) h.sendStdin(stdin.asText(), true);
        return h;
    }

    /** The background processes started through the API (running, and the last ones that exited). */
    public List<ProcessInfo> list() { return Json.list(t().data("GET", path("processes")), ProcessInfo::new); }

    public ProcessInfo get(int pid) { return new ProcessInfo(t().data("GET", path("processes", String.valueOf(pid)))); }

    /** A handle on a background process started earlier. */
    public CommandHandle connect(int pid) { return new CommandHandle(sandbox, get(pid)); }

    /** Send a signal ({@code "TERM"}, {@code "KILL"}, {@code "15"}, ...). */
    public ProcessInfo signal(int pid, String signal) {
        return new ProcessInfo(t().data("POST", path("processes", String.valueOf(pid), "signal"), null, Transport.Body.json(Json.object().put("signal", signal))));
    }

    /** SIGKILL a background process; false if it had exited already. */
    public boolean kill(int pid) {
        try {
            signal(pid, "KILL");
            return true;
        } catch (ConflictException e) {
            return false;
        }
    }

    /** Write to a background process's standard input ({@code close}: close it after). */
    public ProcessInfo sendStdin(int pid, byte[] data, boolean close) {
        Transport.Query q = Transport.Query.of().flag("close", close);
        return new ProcessInfo(t().data("POST", path("processes", String.valueOf(pid), "stdin"), q, Transport.Body.bytes(data)));
    }

    public ProcessInfo sendStdin(int pid, String text, boolean close) { return sendStdin(pid, text.getBytes(StandardCharsets.UTF_8), close); }

    CommandStream output(int pid, boolean fromStart, Duration timeout) {
        Transport.Query q = Transport.Query.of().add("from", fromStart ? "start" : "now");
        var resp = t().stream("GET", path("processes", String.valueOf(pid), "output"), q, null, null, "text/event-stream");
        return new CommandStream(new EventStream(resp), "process " + pid, timeout);
    }
}
