package io.cella;

import java.time.Duration;

/** A background process: follow its {@link #output()}, {@link #waitFor()} its end, signal it. */
public final class CommandHandle {
    private final Sandbox sandbox;
    private ProcessInfo info;
    private CommandResult result;

    CommandHandle(Sandbox sandbox, ProcessInfo info) {
        this.sandbox = sandbox;
        this.info = info;
    }

    public int pid() { return info.pid(); }

    public String tag() { return info.tag(); }

    /** The process as last read. */
    public ProcessInfo info() { return info; }

    /** Read the process again. */
    public ProcessInfo refresh() {
        info = sandbox.commands().get(pid());
        return info;
    }

    /** The exit code once known, else null. */
    public Integer exitCode() {
        if (result != null) return result.exitCode();
        return "exited".equals(info.state()) ? info.exitCode() : null;
    }

    /** Follow the output until the process exits: what the buffer holds first, then each new piece. */
    public CommandStream output() { return output(true, null); }

    /** Follow the output ({@code fromStart=false}: only what comes from now on) for at most {@code timeout} (null: no limit). */
    public CommandStream output(boolean fromStart, Duration timeout) { return sandbox.commands().output(pid(), fromStart, timeout); }

    /** Wait for the process to exit and answer its result (output from the start of its buffer). */
    public CommandResult waitFor() { return waitFor(null); }

    /** Wait at most {@code timeout} ({@link CellaTimeoutException} after). */
    public CommandResult waitFor(Duration timeout) {
        try (CommandStream s = output(true, timeout)) {
            result = s.result();
            return result;
        }
    }

    public ProcessInfo signal(String signal) { return sandbox.commands().signal(pid(), signal); }

    /** SIGKILL; false if it had exited already. */
    public boolean kill() { return sandbox.commands().kill(pid()); }

    public ProcessInfo sendStdin(String text, boolean close) { return sandbox.commands().sendStdin(pid(), text, close); }

    public ProcessInfo sendStdin(byte[] data, boolean close) { return sandbox.commands().sendStdin(pid(), data, close); }

    public ProcessInfo closeStdin() { return sandbox.commands().sendStdin(pid(), new byte[0], true); }

    @Override
    public String toString() { return "CommandHandle{pid=" + pid() + ", sandbox=" + sandbox.id() + "}"; }
}
