package io.cella;

/** A command run with {@code check(true)} exited with a code other than 0. */
public class CommandExitException extends CellaException {
    private static final long serialVersionUID = 1L;
    private final transient CommandResult result;

    public CommandExitException(CommandResult result) {
        super(message(result), "COMMAND_EXIT", 0, null, Json.object().put("exit_code", result.exitCode()), null, null);
        this.result = result;
    }

    private static String message(CommandResult r) {
        String m = "command exited with code " + r.exitCode() + (r.timedOut() ? " (timed out)" : "");
        String tail = (r.stderr().isBlank() ? r.stdout() : r.stderr()).strip();
        String[] lines = tail.split("\n");
        if (!tail.isEmpty()) m += ": " + String.join(" | ", java.util.Arrays.copyOfRange(lines, Math.max(0, lines.length - 3), lines.length));
        return m;
    }

    public CommandResult result() { return result; }

    public int exitCode() { return result.exitCode(); }
}
