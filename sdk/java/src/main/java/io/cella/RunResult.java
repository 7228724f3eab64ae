package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.List;

/** The answer of a one-shot run ({@link Sandbox#run}): the command's result and the artifacts kept. */
public final class RunResult extends Model {
    RunResult(JsonNode raw) {
        super(raw);
    }

    public int exitCode() { return raw.path("exit_code").asInt(-1); }

    public String stdout() { return raw.path("stdout").asText(""); }

    public String stderr() { return raw.path("stderr").asText(""); }

    public long durationMs() { return num("duration_ms"); }

    public boolean timedOut() { return bool("timed_out"); }

    public boolean ok() { return exitCode() == 0 && !timedOut(); }

    /** The id of the run's sandbox (destroyed by now). */
    public String sandboxId() { return str("sandbox_id"); }

    public List<ArtifactInfo> artifacts() { return Json.list(raw.path("artifacts"), ArtifactInfo::new); }

    /** The command's part, as a {@link CommandResult}. */
    public CommandResult commandResult() { return new CommandResult(raw); }
}
