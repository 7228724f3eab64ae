package io.cella;

import static org.junit.jupiter.api.Assertions.*;

import java.io.IOException;
import java.math.BigDecimal;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;

/** A task run against a local repository, with a command agent that edits a file and commits; the workspace's wallet, ledger and usage. */
@ExtendWith(TestServer.class)
class TaskTest {
    static String git(Path dir, String... args) throws IOException, InterruptedException {
        List<String> cmd = new ArrayList<>(List.of("git", "-c", "user.name=test", "-c", "user.email=test@example.org", "-c", "init.defaultBranch=main"));
        cmd.addAll(List.of(args));
        Process p = new ProcessBuilder(cmd).directory(dir.toFile()).redirectErrorStream(true).start();
        String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
        assertEquals(0, p.waitFor(), String.join(" ", cmd) + ": " + out);
        return out;
    }

    /** A bare repository {@code acme/<name>} under the forge's root, with one commit on main. */
    static Path makeRepo(String name) throws Exception {
        Path work = java.nio.file.Files.createTempDirectory("cella-java-repo-");
        git(work, "init", "-q", "-b", "main");
        java.nio.file.Files.writeString(work.resolve("README.md"), "# demo\n");
        git(work, "add", "-A");
        git(work, "commit", "-q", "-m", "the first commit");
        Path bare = TestServer.repos.resolve("acme").resolve(name + ".git");
        java.nio.file.Files.createDirectories(bare.getParent());
        git(TestServer.repos, "clone", "-q", "--bare", work.toString(), bare.toString());
        CellaServer.deleteTree(work.toFile());
        return bare;
    }

    @Test
    void taskRunPushesTheAgentsBranch() throws Exception {
        CellaServer s = TestServer.get();
        String ws = s.defaultWorkspace();
        // Disabled by default: the typed 403.
        PermissionDeniedException off = assertThrows(PermissionDeniedException.class, () -> Task.start(TaskOptions.builder("acme/none", "x").connection(s.admin()).build()));
        assertEquals("tasks_disabled", off.details().path("reason").asText());
        assertTrue(Workspace.updateSettings(ws, Map.of("tasks_enabled", true), s.admin()).settings().path("tasks_enabled").asBoolean());

        Path bare = makeRepo("web");
        ConnectionConfig tasks = s.connection(s.makeKey("tasks:read", "tasks:write"));
        // The run's worst case is reserved at start: an empty wallet is the typed 402.
        InsufficientFundsException poor = assertThrows(InsufficientFundsException.class, () -> Task.start(TaskOptions.builder("acme/web", "x").connection(s.admin()).build()));
        assertEquals(402, poor.status());
        Workspace.addCredits(ws, "100", "task runs of the java sdk test", s.admin());
        TaskInfo t = Task.start(TaskOptions.builder("acme/web", "Add a greeting.").baseBranch("main").metadata("ticket", "WEB-1").connection(tasks).build());
        assertEquals("queued", t.state());
        assertEquals("cella/" + t.id(), t.branch());
        assertTrue(t.createdBy().startsWith("key"), t.createdBy());
        assertTrue(t.sessionLimitMin() > 0, t.toString());
        List<String> states = new ArrayList<>();
        TaskInfo end = Task.waitFor(t.id(), java.time.Duration.ofMinutes(3), e -> {
            if ("state".equals(e.event())) states.add(e.state());
        }, tasks);
        assertEquals("stopped", end.state(), end + "\n" + s.log().substring(Math.max(0, s.log().length() - 3000)));
        assertEquals("agent_exit", end.stopReason());
        assertEquals("stopped", states.get(states.size() - 1), states.toString());
        // The branch is in the repository, with the agent's commit on top of main.
        String logLine = git(bare, "log", "--format=%s", "-1", t.branch());
        assertEquals("Add the greeting\n", logLine);
        assertEquals("hello from the agent\n", git(bare, "show", t.branch() + ":GREETING.txt"));
        assertEquals(t.id(), Task.get(t.id(), tasks).id());
        assertEquals("WEB-1", Task.get(t.id(), tasks).metadata().get("ticket"));
        assertTrue(Task.list("stopped", "acme/web", null, tasks).stream().anyMatch(x -> x.id().equals(t.id())));
        assertEquals("stopped", Task.cancel(t.id(), s.admin()).state(), "cancel of an ended run changes nothing");
        assertThrows(GoneException.class, () -> {
            try (EventIterator<TaskLogChunk> log = Task.log(t.id(), s.admin())) {
                log.hasNext();
            }
        });
        // A second run, cancelled while it waits or runs.
        TaskInfo c = Task.start(TaskOptions.builder("acme/web", "Another.").connection(s.admin()).build());
        Task.cancel(c.id(), s.admin());
        TaskInfo ce = Task.waitFor(c.id(), java.time.Duration.ofMinutes(3), null, s.admin());
        assertTrue(ce.state().equals("cancelled") || ce.state().equals("stopped"), ce.toString());
    }

    @Test
    void walletLedgerAndUsage() {
        CellaServer s = TestServer.get();
        WorkspaceInfo w = Workspace.create("java-sdk-money", null, null, s.admin());
        WalletInfo before = Workspace.wallet(w.id(), s.admin());
        assertEquals("USD", before.currency());
        LedgerEntry credit = Workspace.addCredits(w.id(), "12.5", "java sdk test", s.admin());
        assertEquals("credit", credit.kind());
        assertEquals(0, new BigDecimal("12.5").compareTo(new BigDecimal(credit.amount())));
        WalletInfo after = Workspace.wallet(w.id(), s.admin());
        assertEquals(0, new BigDecimal(before.balance()).add(new BigDecimal("12.5")).compareTo(new BigDecimal(after.balance())));
        List<LedgerEntry> ledger = Workspace.ledger(w.id(), null, s.admin());
        assertEquals(credit.id(), ledger.get(0).id());
        assertEquals("java sdk test", ledger.get(0).reference());
        assertNull(ledger.get(0).computeSec(), "a credit has no compute figures");
        assertNull(ledger.get(0).model());
        UsageReport u = Workspace.usage(w.id(), null, null, s.admin());
        assertEquals("USD", u.currency());
        assertTrue(u.days().isArray());
        assertThrows(InvalidRequestException.class, () -> Workspace.addCredits(w.id(), "1e3", "bad", s.admin()));
        // A key of another workspace cannot credit (operator only).
        String key = ApiKey.create(w.id(), "admin", List.of("admin"), s.admin()).key();
        assertThrows(PermissionDeniedException.class, () -> Workspace.addCredits(w.id(), "1", "nope", s.connection(key)));
        assertEquals(after.balance(), Workspace.wallet(w.id(), s.connection(key)).balance());
    }
}
