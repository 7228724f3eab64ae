package io.cella;

import java.nio.file.Path;
import java.util.List;
import org.junit.jupiter.api.extension.BeforeAllCallback;
import org.junit.jupiter.api.extension.ExtensionContext;

/**
 * The test run's server, started once for every test class that uses this extension and stopped
 * (its sandboxes destroyed, asserting none was left) when the whole run ends. It has a {@code git}
 * forge over {@link #repos} and a {@code command} agent that writes a file and commits, for the
 * task runs.
 */
public final class TestServer implements BeforeAllCallback {
    static final String SIZE = "xs";
    static final String AGENT_SCRIPT = "printf 'hello from the agent\\n' > GREETING.txt && git add GREETING.txt && "
            + "git -c user.name=agent -c user.email=agent@example.org commit -q -m 'Add the greeting' && echo committed";
    /** The server's upload limit: above the 10 MiB round trip, low enough to test the 413 of uploads. */
    static final long MAX_UPLOAD = 16L * 1024 * 1024;
    private static CellaServer server;
    static Path repos;

    private static final class Holder implements ExtensionContext.Store.CloseableResource {
        @Override
        public void close() {
            List<String> left = server.stop();
            CellaServer.deleteTree(repos.toFile());
            if (!left.isEmpty()) throw new AssertionError("the tests left sandboxes behind: " + left);
        }
    }

    @Override
    public void beforeAll(ExtensionContext context) throws Exception {
        synchronized (TestServer.class) {
            if (server != null) return;
            repos = java.nio.file.Files.createTempDirectory("cella-java-repos-");
            String config = "\n[files]\nmax_upload_bytes = " + MAX_UPLOAD + "\n\n[tasks]\nrunners = 2\nheartbeat_interval_sec = 1\ngrace_sec = 2\n\n"
                    + "[[forges]]\nname = \"local\"\nkind = \"git\"\nurl_template = \"" + repos + "/{repository}.git\"\n\n"
                    + "[[agents]]\nname = \"editor\"\nkind = \"command\"\ncommand = [\"bash\", \"-c\", '''" + AGENT_SCRIPT + "''']\n";
            server = CellaServer.start(config);
            context.getRoot().getStore(ExtensionContext.Namespace.GLOBAL).put("cella-server", new Holder());
        }
    }

    static CellaServer get() { return server; }

    /** The operator's connection. */
    static ConnectionConfig admin() { return server.admin(); }

    /** A fresh running sandbox of the smallest size (close it to destroy it). */
    static Sandbox sandbox() {
        return Sandbox.create(CreateOptions.builder().size(SIZE).timeout(java.time.Duration.ofMinutes(10)).connection(admin()).build());
    }
}
