package io.cella;

import static org.junit.jupiter.api.Assertions.*;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import java.io.File;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Arrays;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;

/**
 * Isolation runtimes: a create names one, the sandbox says which it runs on, an unknown one is a 400 naming the field,
 * templates list theirs; snapshots with memory on gVisor.
 */
@ExtendWith(TestServer.class)
class RuntimeTest {
    private static CreateOptions.Builder opts(String runtime) {
        return CreateOptions.builder().size(TestServer.SIZE).timeout(Duration.ofMinutes(5)).runtime(runtime).connection(TestServer.admin());
    }

    @Test
    void namespaceRuntime() {
        try (Sandbox sb = Sandbox.create(opts("namespace").build())) {
            assertEquals("namespace", sb.info().runtime());
            assertNull(sb.info().memory()); // this server does not send it
            assertEquals("namespace", sb.refresh().runtime());
        }
    }

    @Test
    void gvisorRuntimeRunsOnGvisorsKernel() throws Exception {
        String id;
        try (Sandbox sb = Sandbox.create(opts("gvisor").build())) {
            id = sb.id();
            assertEquals("gvisor", sb.info().runtime());
            assertEquals("gvisor", sb.refresh().runtime());
            String inside = sb.commands().run("cat /proc/version; dmesg 2>/dev/null | head -3").stdout();
            String host = Files.readString(Path.of("/proc/version")).trim();
            assertNotEquals(host, inside.split("\n", 2)[0]);
            assertTrue(inside.contains("gVisor") || inside.contains("4.4.0"), "not gVisor's kernel: " + inside);
        }
        assertEquals("destroyed", Sandbox.connect(id, TestServer.admin(), false).state());
    }

    @Test
    void memoryWhilePaused() {
        for (String[] c : new String[][] {{"namespace", "in_ram"}, {"gvisor", "on_disk"}}) {
            try (Sandbox sb = Sandbox.create(opts(c[0]).build())) {
                SandboxInfo paused = sb.pause();
                assertEquals("paused", paused.state());
                assertEquals(c[1], paused.memory(), c[0]);
                SandboxInfo resumed = sb.resume();
                assertEquals("running", resumed.state());
                assertNull(resumed.memory(), c[0]);
                assertEquals("ok\n", sb.commands().run("echo ok").stdout(), c[0]);
            }
        }
    }

    @Test
    void unknownRuntimeIsA400NamingTheField() {
        InvalidRequestException e = assertThrows(InvalidRequestException.class, () -> Sandbox.create(opts("vm").build()));
        assertEquals(400, e.status());
        assertEquals("INVALID_REQUEST", e.code());
        assertEquals("runtime", e.field().orElse(null));
        assertTrue(e.getMessage().contains("vm"), e.getMessage());
    }

    @Test
    void oneShotRunOnGvisor() throws Exception {
        RunResult r = Sandbox.run(RunOptions.command("echo hi > out.txt; cat /proc/version; dmesg 2>/dev/null | head -3")
                .runtime("gvisor").size(TestServer.SIZE).artifact("out.txt").timeout(Duration.ofMinutes(2)).connection(TestServer.admin()).build());
        assertTrue(r.ok(), r.toString());
        String host = Files.readString(Path.of("/proc/version")).trim();
        assertNotEquals(host, r.stdout().split("\n", 2)[0]);
        assertTrue(r.stdout().contains("gVisor") || r.stdout().contains("4.4.0"), "not gVisor's kernel: " + r.stdout());
        assertEquals(1, r.artifacts().size());
        assertEquals("hi\n", new String(Artifact.download(r.artifacts().get(0).id(), TestServer.admin()), java.nio.charset.StandardCharsets.UTF_8));
        SandboxInfo gone = Sandbox.connect(r.sandboxId(), TestServer.admin(), false).info();
        assertEquals("gvisor", gone.runtime());
        assertEquals("destroyed", gone.state());

        InvalidRequestException e = assertThrows(InvalidRequestException.class,
                () -> Sandbox.run(RunOptions.command("true").runtime("vm").size(TestServer.SIZE).connection(TestServer.admin()).build()));
        assertEquals(400, e.status());
        assertEquals("runtime", e.field().orElse(null));
        assertTrue(e.getMessage().contains("vm"), e.getMessage());
    }

    @Test
    void templatesListTheirRuntimes() {
        TemplateInfo base = Template.get("base", TestServer.admin());
        assertEquals("namespace", base.runtimes().get(0));
        TemplateInfo listed = Template.list(TestServer.admin()).stream().filter(t -> t.id().equals("base")).findFirst().orElseThrow();
        assertTrue(listed.runtimes().contains("gvisor"), listed.runtimes().toString());
    }

    /** Whether runsc (gVisor) is on the PATH; the gVisor-only tests are skipped, saying so, without it. */
    private static boolean runsc() {
        boolean found = Arrays.stream(System.getenv().getOrDefault("PATH", "").split(File.pathSeparator))
                .anyMatch(dir -> !dir.isEmpty() && Files.isExecutable(Path.of(dir, "runsc")));
        if (!found) System.out.println("skipped: runsc (gVisor) is not installed: no gvisor sandboxes here");
        return found;
    }

    @Test
    void snapshotWithMemoryContinuesWhereTheSourceWas() {
        assumeTrue(runsc(), "runsc (gVisor) is not installed: no gvisor sandboxes here");
        try (Sandbox sb = Sandbox.create(opts("gvisor").build())) {
            assertTrue(sb.runCode("counter = 41").ok());
            SnapshotInfo snap = sb.createSnapshot(true);
            try {
                assertTrue(snap.memory(), snap.toString());
                assertEquals(sb.id(), snap.sandboxId());
                assertTrue(Snapshot.get(snap.id(), TestServer.admin()).memory());
                assertTrue(sb.runCode("counter = 0").ok()); // the source goes on; the snapshot does not
                try (Sandbox copy = Sandbox.create(CreateOptions.builder().snapshot(snap.id()).timeout(Duration.ofMinutes(5)).connection(TestServer.admin()).build())) {
                    assertNotEquals(sb.id(), copy.id());
                    assertEquals("gvisor", copy.info().runtime());
                    assertEquals("42", copy.runCode("counter + 1").result());
                }
                assertEquals("0", sb.runCode("counter").result());
            } finally {
                assertEquals(snap.id(), Snapshot.delete(snap.id(), TestServer.admin()).id());
            }
            try (Sandbox fork = sb.fork()) { // a fork of a gVisor sandbox carries its memory too, as it is now
                assertEquals("gvisor", fork.info().runtime());
                assertEquals("2", fork.runCode("counter + 2").result());
            }
        }
    }

    @Test
    void snapshotWithMemoryOfANamespaceSandboxIsA400() {
        try (Sandbox sb = Sandbox.create(opts("namespace").build())) {
            InvalidRequestException e = assertThrows(InvalidRequestException.class, () -> sb.createSnapshot(true));
            assertEquals(400, e.status());
            assertEquals("INVALID_REQUEST", e.code());
            assertEquals("memory", e.field().orElse(null));
            assertTrue(e.getMessage().contains("namespace"), e.getMessage());
            assertTrue(Snapshot.list(TestServer.admin()).stream().noneMatch(s -> s.sandboxId().equals(sb.id())), "a snapshot was made");
            assertEquals("running", sb.refresh().state());
        }
    }
}
