package io.cella;

import com.fasterxml.jackson.databind.node.ObjectNode;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.function.Consumer;

/** A template build in progress: {@link #waitFor} its end, following its log. */
public final class TemplateBuildHandle {
    private final Transport transport;
    private TemplateBuild info;
    private final StringBuilder log = new StringBuilder();
    private long offset;

    TemplateBuildHandle(TemplateBuild build, Transport transport) {
        this.info = build;
        this.transport = transport;
        if (build.logOffset() == 0) {
            log.append(build.log());
            offset = build.log().getBytes(StandardCharsets.UTF_8).length;
        }
    }

    public String id() { return info.id(); }

    public String templateId() { return info.templateId(); }

    public String state() { return info.state(); }

    public TemplateBuild info() { return info; }

    /** The log read so far. */
    public String log() { return log.toString(); }

    /** Read the build again, with the log written since the last read (given to {@code onLog}). */
    public TemplateBuild refresh(Consumer<String> onLog) {
        info = new TemplateBuild(transport.data("GET", "/templates/" + Transport.seg(templateId()) + "/builds/" + Transport.seg(id()), Transport.Query.of().add("log_offset", offset), null));
        String piece = info.log();
        if (!piece.isEmpty()) {
            log.append(piece);
            if (onLog != null) onLog.accept(piece);
        }
        offset = info.logOffset() + piece.getBytes(StandardCharsets.UTF_8).length;
        return info;
    }

    /**
     * Poll until the build is {@code ready} or {@code failed} and answer it, its log the whole
     * log. {@code check}: throw {@link CellaException} ({@code BUILD_FAILED}) for a failed build.
     */
    public TemplateBuild waitFor(Duration timeout, boolean check, Consumer<String> onLog) {
        if (onLog != null && log.length() > 0) onLog.accept(log.toString());
        long deadline = System.nanoTime() + timeout.toNanos();
        while (!info.finished()) {
            if (System.nanoTime() > deadline) throw new CellaTimeoutException("build " + id() + " of " + templateId() + " was not finished after " + timeout.toSeconds() + " s", "TIMEOUT", 0, null, null, null, null);
            Transport.sleep(Duration.ofMillis(250));
            refresh(onLog);
        }
        ObjectNode whole = info.raw().deepCopy();
        whole.put("log", log.toString()).put("log_offset", 0);
        info = new TemplateBuild(whole);
        if (check && !info.ok()) {
            throw new CellaException("build " + id() + " of template " + templateId() + " failed: " + (info.error() == null ? "no reason given" : info.error()), "BUILD_FAILED", 0, null,
                    Json.object().put("template_id", templateId()).put("build_id", id()), null, null);
        }
        return info;
    }
}
