package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;

/**
 * A sandbox on a Cella server.
 *
 * <p>Make one with {@link #create(CreateOptions)} (or attach to one with {@link #connect}); used
 * in try-with-resources it is destroyed when the block ends, unless {@link #keepOnClose()} was
 * called:
 *
 * <pre>{@code
 * try (Sandbox sb = Sandbox.create()) {
 *     System.out.println(sb.commands().run("echo hi").stdout());
 * }
 * }</pre>
 */
public final class Sandbox implements AutoCloseable {
    final Transport transport;
    private volatile SandboxInfo info;
    private final Commands commands;
    private final Files files;
    private final CodeInterpreter code;
    private volatile boolean keep;

    Sandbox(SandboxInfo info, Transport transport) {
        this.info = info;
        this.transport = transport;
        this.commands = new Commands(this);
        this.files = new Files(this);
        this.code = new CodeInterpreter(this);
    }

    // ------------------------------------------------------------------ making and finding

    /** Create a sandbox of the default template and size, and wait until it runs. */
    public static Sandbox create() { return create(CreateOptions.builder().build()); }

    /** Create a sandbox and (unless {@code waitReady(false)}) wait until it runs. */
    public static Sandbox create(CreateOptions options) {
        Transport t = new Transport(options.connection);
        boolean wait = options.body.path("wait").asBoolean(true);
        Duration timeout = wait ? t.config.requestTimeout().plus(Duration.ofSeconds(180)) : t.config.requestTimeout();
        return new Sandbox(new SandboxInfo(t.data("POST", "/sandboxes", null, Transport.Body.json(options.body), timeout)), t);
    }

    /** Destroy a sandbox by its id, without attaching or resuming it (idempotent). */
    public static SandboxInfo kill(String sandboxId) { return kill(sandboxId, null); }

    /** Destroy a sandbox by its id on a connection; a missing id is a {@link NotFoundException}. */
    public static SandboxInfo kill(String sandboxId, ConnectionConfig connection) {
        return new SandboxInfo(new Transport(connection).data("DELETE", Transport.sandboxPath(sandboxId)));
    }

    /** Attach to an existing sandbox (resumed first if it is paused or stopped). */
    public static Sandbox connect(String sandboxId) { return connect(sandboxId, null, true); }

    /** Attach to an existing sandbox; {@code resume}: resume a paused or stopped one first. */
    public static Sandbox connect(String sandboxId, ConnectionConfig connection, boolean resume) {
        Transport t = new Transport(connection);
        Sandbox sb = new Sandbox(new SandboxInfo(t.data("GET", Transport.sandboxPath(sandboxId))), t);
        if (resume && ("paused".equals(sb.state()) || "stopped".equals(sb.state()))) sb.resume();
        return sb;
    }

    /** The workspace's live sandboxes (not destroyed or failed), newest first. */
    public static List<SandboxInfo> list() { return list(ListOptions.builder().build()); }

    /** The workspace's sandboxes that match the filters, every page read. */
    public static List<SandboxInfo> list(ListOptions options) {
        Transport t = new Transport(options.connection);
        Transport.Query q = Transport.Query.of().add("state", options.state);
        for (Map.Entry<String, String> e : options.metadata.entrySet()) q.add("metadata." + e.getKey(), e.getValue());
        return Json.list(Json.tree(t.pages("/sandboxes", q, options.limit)), SandboxInfo::new);
    }

    /** A one-shot run: create, write files, run, keep artifacts, destroy, in one request. */
    public static RunResult run(RunOptions options) {
        Transport t = new Transport(options.connection);
        Duration timeout = (options.timeout == null ? Duration.ofHours(1) : options.timeout).plus(Duration.ofSeconds(150));
        RunResult r = new RunResult(t.data("POST", "/sandboxes/run", null, Transport.Body.json(options.body), timeout));
        if (options.check && !r.ok()) throw new CommandExitException(r.commandResult());
        return r;
    }

    // ------------------------------------------------------------------ what it is

    public String id() { return info.id(); }

    /** The sandbox as last seen (updated by every call that answers it; see {@link #refresh()}). */
    public SandboxInfo info() { return info; }

    public String state() { return info.state(); }

    public ConnectionConfig connection() { return transport.config; }

    public Commands commands() { return commands; }

    public Files files() { return files; }

    public CodeInterpreter code() { return code; }

    /** Read the sandbox again from the server. */
    public SandboxInfo refresh() { return set(transport.data("GET", Transport.sandboxPath(id()))); }

    public boolean isRunning() { return "running".equals(refresh().state()); }

    /** Poll until the sandbox runs (after {@code waitReady(false)}). */
    public SandboxInfo waitReady(Duration timeout) {
        long deadline = System.nanoTime() + timeout.toNanos();
        while (true) {
            SandboxInfo i = refresh();
            if ("running".equals(i.state()) && i.ready()) return i;
            if ("error".equals(i.state()) || "destroyed".equals(i.state()) || "stopped".equals(i.state())) {
                throw new UnavailableException("sandbox " + id() + " is " + i.state() + (i.stateReason() == null ? "" : ": " + i.stateReason()), "UNAVAILABLE", 0, null, Json.object().put("sandbox_id", id()).put("state", i.state()), null, null);
            }
            if (System.nanoTime() > deadline) throw new CellaTimeoutException("sandbox " + id() + " was not running after " + timeout.toSeconds() + " s (state " + i.state() + ")", "TIMEOUT", 0, null, null, null, null);
            Transport.sleep(Duration.ofMillis(100));
        }
    }

    private SandboxInfo set(JsonNode data) {
        info = new SandboxInfo(data);
        return info;
    }

    // ------------------------------------------------------------------ lifecycle

    /** Freeze every process (memory kept). Only from {@code running}. */
    public SandboxInfo pause() { return set(transport.data("POST", Transport.sandboxPath(id(), "pause"))); }

    /** Thaw a paused sandbox, or boot a stopped one again on its kept files. */
    public SandboxInfo resume() {
        return set(transport.data("POST", Transport.sandboxPath(id(), "resume"), null, null, transport.config.requestTimeout().plus(Duration.ofSeconds(180))));
    }

    /** End every process and keep the files (persistent sandboxes only). */
    public SandboxInfo stop() { return set(transport.data("POST", Transport.sandboxPath(id(), "stop"))); }

    /** Destroy the sandbox (idempotent). Its files are gone. */
    public SandboxInfo kill() { return set(transport.data("DELETE", Transport.sandboxPath(id()))); }

    /** Set the active-session timeout; on a running sandbox the timer restarts from now. */
    public SandboxInfo setTimeout(Duration timeout) {
        return set(transport.data("POST", Transport.sandboxPath(id(), "timeout"), null, Transport.Body.json(Json.object().put("timeout_sec", CreateOptions.seconds(timeout)))));
    }

    /** Its resource usage (CPU, memory, running time). */
    public SandboxUsage usage() { return new SandboxUsage(transport.data("GET", Transport.sandboxPath(id(), "usage"))); }

    /** Copy the sandbox's files into a snapshot, from which {@code CreateOptions.snapshot(id)} starts new sandboxes. */
    public SnapshotInfo createSnapshot() { return snapshot(null); }

    /**
     * A snapshot; with {@code memory} true (gVisor sandboxes) it keeps the sandbox's memory and processes too,
     * so sandboxes made from it continue where it was. On a namespace sandbox {@code true} is an
     * {@link InvalidRequestException} naming {@code memory}.
     */
    public SnapshotInfo createSnapshot(boolean memory) {
        ObjectNode body = Json.object();
        body.put("memory", memory);
        return snapshot(Transport.Body.json(body));
    }

    private SnapshotInfo snapshot(Transport.Body body) {
        return new SnapshotInfo(transport.data("POST", Transport.sandboxPath(id(), "snapshots"), null, body, transport.config.requestTimeout().plus(Duration.ofSeconds(300))));
    }

    /** Keep files of the running sandbox as artifacts (globs or paths, relative to {@code /home/user} or absolute). */
    public List<ArtifactInfo> collectArtifacts(List<String> paths) {
        ObjectNode body = Json.object();
        body.set("paths", Json.tree(paths));
        return Json.list(transport.data("POST", Transport.sandboxPath(id(), "artifacts"), null, Transport.Body.json(body)), ArtifactInfo::new);
    }

    /** One copy of this sandbox's files, a new sandbox. */
    public Sandbox fork() { return fork(1, null).get(0); }

    /** {@code count} copies (1-10) of this sandbox's files, each a new sandbox; {@code metadata} is merged over this one's. */
    public List<Sandbox> fork(int count, Map<String, String> metadata) {
        ObjectNode body = Json.object().put("count", count);
        if (metadata != null) body.set("metadata", Json.tree(metadata));
        JsonNode data = transport.data("POST", Transport.sandboxPath(id(), "fork"), null, Transport.Body.json(body), transport.config.requestTimeout().plus(Duration.ofSeconds(300)));
        List<Sandbox> out = new ArrayList<>();
        if (data.isArray()) data.forEach(d -> out.add(new Sandbox(new SandboxInfo(d), new Transport(transport.config))));
        else out.add(new Sandbox(new SandboxInfo(data), new Transport(transport.config)));
        return out;
    }

    /** The URL at which a port inside the sandbox is reachable through the server's preview proxy. */
    public String expose(int port) { return exposeInfo(port).url(); }

    /** Every address of a port inside the sandbox. */
    public ExposedPort exposeInfo(int port) {
        return new ExposedPort(transport.data("POST", Transport.sandboxPath(id(), "expose"), null, Transport.Body.json(Json.object().put("port", port))));
    }

    /** The {@code host[:port]} of a port's own preview origin. */
    public String getHost(int port) {
        ExposedPort e = exposeInfo(port);
        return java.net.URI.create(e.hostUrl() != null ? e.hostUrl() : e.url()).getRawAuthority();
    }

    /** Mint a preview token ({@code ttl} null: the server's default; {@code rotate}: revoke the earlier ones). */
    public PreviewToken previewToken(Duration ttl, boolean rotate) {
        ObjectNode body = Json.object();
        if (ttl != null) body.put("ttl_sec", CreateOptions.seconds(ttl));
        if (rotate) body.put("rotate", true);
        return new PreviewToken(transport.data("POST", Transport.sandboxPath(id(), "preview-token"), null, Transport.Body.json(body)));
    }

    /** Run a Python cell in the sandbox's code interpreter (see {@link CodeInterpreter}). */
    public Execution runCode(String code) { return this.code.run(code); }

    /** Open an interactive terminal (a login shell, 80x24, unless told). */
    public Pty pty(Pty.Options options) { return Pty.open(transport, id(), options); }

    // ------------------------------------------------------------------ the client

    /** Leave the sandbox as it is when this object is closed (it is destroyed otherwise). */
    public Sandbox keepOnClose() {
        keep = true;
        return this;
    }

    /** Destroy the sandbox, unless {@link #keepOnClose()} was called (a sandbox already gone is fine). */
    @Override
    public void close() {
        if (keep) return;
        try {
            kill();
        } catch (NotFoundException e) {
            // already gone
        }
    }

    @Override
    public String toString() { return "Sandbox{id=" + id() + ", state=" + state() + "}"; }
}
