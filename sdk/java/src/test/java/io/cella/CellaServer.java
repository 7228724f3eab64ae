package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.File;
import java.io.IOException;
import java.net.ServerSocket;
import java.net.URI;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.security.SecureRandom;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * A real Cella server for the tests and the example: the binary is {@code $CELLA_BIN} (else the
 * workspace's {@code target/debug/cella}); it listens on a free port of 127.0.0.1, keeps its
 * state in a temporary directory and has a random bootstrap (operator) key. {@link #close()}
 * destroys every sandbox left, stops the server with SIGTERM and removes its directory.
 *
 * <p>Also a launcher: {@code java io.cella.CellaServer COMMAND...} runs COMMAND with {@code
 * CELLA_SERVER} and {@code CELLA_API_KEY} set for a server started for it, and exits with its
 * exit code (non-zero too when it left sandboxes behind).
 */
public final class CellaServer implements AutoCloseable {
    /** Turns off the pool of pre-booted sandboxes (the tests make their own). */
    static final String BASE_CONFIG = "[pool]\ndefault = 0\nsizes = {}\n";

    public final String url;
    public final String key;
    public final Path work;
    public final Path dataDir;
    private final Process process;
    private boolean stopped;

    private CellaServer(String url, String key, Path work, Process process) {
        this.url = url;
        this.key = key;
        this.work = work;
        this.dataDir = work.resolve("data");
        this.process = process;
    }

    static String binary() {
        String bin = System.getenv("CELLA_BIN");
        if (bin == null || bin.isEmpty()) bin = Path.of("..", "..", "target", "debug", "cella").toAbsolutePath().normalize().toString();
        if (!new File(bin).canExecute()) throw new IllegalStateException("no Cella server binary at " + bin + ": set CELLA_BIN to target/debug/cella");
        return bin;
    }

    static int freePort() throws IOException {
        try (ServerSocket s = new ServerSocket(0, 1, java.net.InetAddress.getLoopbackAddress())) {
            return s.getLocalPort();
        }
    }

    /** Start a server with {@code extraConfig} added to its configuration; waits until /healthz answers. */
    public static CellaServer start(String extraConfig) throws IOException, InterruptedException {
        Path work = java.nio.file.Files.createTempDirectory("cella-java-sdk-");
        byte[] rnd = new byte[16];
        new SecureRandom().nextBytes(rnd);
        String key = "test-" + HexFormat.of().formatHex(rnd);
        Path config = work.resolve("config.toml");
        java.nio.file.Files.writeString(config, BASE_CONFIG + extraConfig);
        int port = freePort();
        ProcessBuilder pb = new ProcessBuilder(binary(), "serve", "--listen", "127.0.0.1:" + port, "--data-dir", work.resolve("data").toString(), "--config", config.toString());
        pb.environment().put("CELLA_BOOTSTRAP_KEY", key);
        pb.environment().remove("CELLA_API_KEY");
        pb.redirectErrorStream(true);
        pb.redirectOutput(work.resolve("server.log").toFile());
        pb.redirectInput(ProcessBuilder.Redirect.from(new File("/dev/null")));
        Process p = pb.start();
        String url = "http://127.0.0.1:" + port;
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
        while (System.nanoTime() < deadline && p.isAlive()) {
            try {
                HttpResponse<Void> r = Transport.HTTP.send(HttpRequest.newBuilder(URI.create(url + "/healthz")).timeout(Duration.ofSeconds(2)).build(), HttpResponse.BodyHandlers.discarding());
                if (r.statusCode() == 200) return new CellaServer(url, key, work, p);
            } catch (IOException e) {
                // not yet
            }
            Thread.sleep(50);
        }
        p.destroyForcibly();
        String log = java.nio.file.Files.readString(work.resolve("server.log"));
        throw new IllegalStateException("the Cella server did not start:\n" + log.substring(Math.max(0, log.length() - 3000)));
    }

    /** The operator's connection (the bootstrap key). */
    public ConnectionConfig admin() { return connection(key); }

    /** A connection with another key (no retries of 429 unless told). */
    public ConnectionConfig connection(String apiKey) {
        return ConnectionConfig.builder().server(url).apiKey(apiKey).build();
    }

    /** The default workspace's id. */
    public String defaultWorkspace() {
        for (WorkspaceInfo w : Workspace.list(admin())) if ("default".equals(w.name())) return w.id();
        throw new IllegalStateException("no default workspace");
    }

    /** A key of the default workspace with these scopes (its secret). */
    public String makeKey(String... scopes) {
        return ApiKey.create(defaultWorkspace(), "sdk-test", List.of(scopes), admin()).key();
    }

    /** Ids of the sandboxes not destroyed. */
    public List<String> liveSandboxes() {
        List<String> ids = new ArrayList<>();
        for (SandboxInfo s : Sandbox.list(ListOptions.builder().state("all").connection(admin()).build())) {
            if (!"destroyed".equals(s.state())) ids.add(s.id());
        }
        return ids;
    }

    public String log() {
        try {
            return java.nio.file.Files.readString(work.resolve("server.log"), StandardCharsets.UTF_8);
        } catch (IOException e) {
            return "";
        }
    }

    /** Destroy what is left, stop the server, remove its data; answers the sandboxes that were left. */
    public synchronized List<String> stop() {
        List<String> left = new ArrayList<>();
        if (stopped) return left;
        stopped = true;
        try {
            left = liveSandboxes();
            Transport t = new Transport(admin());
            for (String id : left) t.data("DELETE", Transport.sandboxPath(id));
        } catch (RuntimeException e) {
            System.err.println("CellaServer: cleanup of sandboxes failed: " + e);
        }
        process.destroy();
        try {
            if (!process.waitFor(20, TimeUnit.SECONDS)) {
                process.destroyForcibly();
                process.waitFor();
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        if (System.getenv("CELLA_KEEP_TEST_DATA") == null) deleteTree(work.toFile());
        else System.err.println("CellaServer: server data kept in " + work);
        return left;
    }

    @Override
    public void close() { stop(); }

    static void deleteTree(File f) {
        File[] kids = f.listFiles();
        if (kids != null && !java.nio.file.Files.isSymbolicLink(f.toPath())) for (File k : kids) deleteTree(k);
        f.delete();
    }

    static JsonNode get(CellaServer s, String path) {
        return new Transport(s.admin()).data("GET", path);
    }

    public static void main(String[] args) throws Exception {
        if (args.length == 0) {
            System.err.println("usage: java io.cella.CellaServer COMMAND...");
            System.exit(2);
        }
        int rc;
        List<String> left;
        try (CellaServer s = start("")) {
            ProcessBuilder pb = new ProcessBuilder(args).inheritIO();
            pb.environment().put("CELLA_SERVER", s.url);
            pb.environment().put("CELLA_API_KEY", s.key);
            rc = pb.start().waitFor();
            left = s.stop();
        }
        if (!left.isEmpty()) {
            System.err.println("CellaServer: the command left sandboxes behind: " + left);
            if (rc == 0) rc = 1;
        }
        System.exit(rc);
    }
}
