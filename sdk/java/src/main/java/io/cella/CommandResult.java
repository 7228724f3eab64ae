package io.cella;

import com.fasterxml.jackson.databind.JsonNode;

/** A command's end: exit code, output, duration. */
public final class CommandResult extends Model {
    private final int exitCode;
    private final String stdout;
    private final String stderr;
    private final long durationMs;
    private final boolean timedOut;

    CommandResult(JsonNode raw) {
        super(raw);
        this.exitCode = raw.path("exit_code").asInt(-1);
        this.stdout = raw.path("stdout").asText("");
        this.stderr = raw.path("stderr").asText("");
        this.durationMs = raw.path("duration_ms").asLong(0);
        this.timedOut = raw.path("timed_out").asBoolean(false);
    }

    CommandResult(int exitCode, String stdout, String stderr, long durationMs, boolean timedOut, JsonNode raw) {
        super(raw);
        this.exitCode = exitCode;
        this.stdout = stdout;
        this.stderr = stderr;
        this.durationMs = durationMs;
        this.timedOut = timedOut;
    }

    public int exitCode() { return exitCode; }

    public String stdout() { return stdout; }

    public String stderr() { return stderr; }

    public long durationMs() { return durationMs; }

    /** True when the command's timeout ran out (it was killed; exit code 137). */
    public boolean timedOut() { return timedOut; }

    /** True when the server cut the stdout at its cap (buffered exec only). */
    public boolean stdoutTruncated() { return bool("stdout_truncated"); }

    public boolean stderrTruncated() { return bool("stderr_truncated"); }

    /** Exit code 0 and not timed out. */
    public boolean ok() { return exitCode == 0 && !timedOut; }

    @Override
    public String toString() { return "CommandResult{exitCode=" + exitCode + ", stdout=" + stdout.length() + " chars, stderr=" + stderr.length() + " chars, timedOut=" + timedOut + "}"; }
}
