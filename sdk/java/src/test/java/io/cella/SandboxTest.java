package io.cella;

import static org.junit.jupiter.api.Assertions.*;

import java.math.BigDecimal;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;

@ExtendWith(TestServer.class)
class SandboxTest {
    @Test
    void createExecListAndCloseDestroys() {
        String tag = UUID.randomUUID().toString().substring(0, 12);
        String id;
        try (Sandbox sb = Sandbox.create(CreateOptions.builder().size(TestServer.SIZE).metadata("tag", tag).env("GREETING", "hi").connection(TestServer.admin()).build())) {
            id = sb.id();
            assertEquals("running", sb.state());
            assertTrue(sb.info().ready());
            assertEquals("xs", sb.info().size());
            assertEquals(Map.of("tag", tag), sb.info().metadata());
            CommandResult r = sb.commands().run("echo $GREETING; echo oops >&2; exit 3");
            assertEquals(3, r.exitCode());
            assertEquals("hi\n", r.stdout());
            assertEquals("oops\n", r.stderr());
            assertFalse(r.ok());
            CommandResult argv = sb.commands().run(List.of("printf", "%s|", "a b", "c"), ExecOptions.builder().build());
            assertEquals("a b|c|", argv.stdout());
            List<SandboxInfo> mine = Sandbox.list(ListOptions.builder().metadata("tag", tag).connection(TestServer.admin()).build());
            assertEquals(1, mine.size());
            assertEquals(id, mine.get(0).id());
        }
        // Closing destroyed it.
        Sandbox again = Sandbox.connect(id, TestServer.admin(), false);
        assertEquals("destroyed", again.state());
        assertTrue(Sandbox.list(ListOptions.builder().metadata("tag", tag).connection(TestServer.admin()).build()).isEmpty());
    }

    @Test
    void fieldsOfTheSandboxAndKillById() {
        try (Sandbox sb = Sandbox.create(CreateOptions.builder().size(TestServer.SIZE).publicPreview(false).autoResume(true).connection(TestServer.admin()).build())) {
            SandboxInfo i = sb.info();
            assertEquals(TestServer.get().defaultWorkspace(), i.tenantId());
            assertNotNull(i.ownerId());
            assertNotNull(i.startedAt());
            assertNotNull(i.readyAt());
            assertNull(i.totalRuntimeSec(), "not before it is destroyed");
            assertEquals("sandbox/xs@v1", i.resourceContract().path("contract_id").asText());
            assertEquals(i.memoryMb(), i.resourceContract().path("memory_mb").asLong());
            assertEquals(0, new BigDecimal("0").compareTo(new BigDecimal(i.modelCost())));
            assertFalse(i.previewPublic());
            assertTrue(i.autoResume());
            assertEquals("paused", sb.pause().state());
            // By its id alone: destroyed without being resumed first; again is the same answer.
            SandboxInfo gone = Sandbox.kill(sb.id(), TestServer.admin());
            assertEquals("destroyed", gone.state());
            assertNotNull(gone.totalRuntimeSec());
            assertEquals("destroyed", Sandbox.connect(sb.id(), TestServer.admin(), false).state());
            assertEquals("destroyed", Sandbox.kill(sb.id(), TestServer.admin()).state());
            assertThrows(NotFoundException.class, () -> Sandbox.kill("sbnosuchsandbox000000", TestServer.admin()));
        }

        TemplateInfo base = Template.get("base", TestServer.admin());
        assertEquals("sandbox", base.product());
        assertEquals("base", base.sdkName());
        assertEquals("base", base.cliName());
        assertTrue(List.of("fast_ready", "cold_boot_only", "missing").contains(base.readiness()), base.readiness());
    }

    @Test
    void createByResources() {
        try (Sandbox sb = Sandbox.create(CreateOptions.builder().resources(1, 1024, 4096).timeout(Duration.ofMinutes(5)).connection(TestServer.admin()).build())) {
            assertEquals("xs", sb.info().size());
            assertEquals(1, sb.info().cpuCount());
            assertEquals("sandbox/xs@v1", sb.info().resourceContract().path("contract_id").asText());
        }
        InvalidRequestException e = assertThrows(InvalidRequestException.class,
                () -> Sandbox.create(CreateOptions.builder().resources(3, 1024, 4096).connection(TestServer.admin()).build()));
        assertEquals("cpu_count", e.field().orElse(null));
        assertTrue(e.details().path("contracts").isArray(), e.details().toString());
    }

    @Test
    void keepOnCloseLeavesItRunning() {
        String id;
        try (Sandbox sb = Sandbox.create(CreateOptions.builder().size(TestServer.SIZE).waitReady(false).connection(TestServer.admin()).build())) {
            assertTrue(sb.waitReady(Duration.ofSeconds(120)).ready());
            id = sb.id();
            sb.keepOnClose();
        }
        try (Sandbox sb = Sandbox.connect(id, TestServer.admin(), true)) {
            assertTrue(sb.isRunning());
        }
    }

    @Test
    void lifecycleTimeoutAndUsage() {
        try (Sandbox sb = TestServer.sandbox()) {
            assertEquals("paused", sb.pause().state());
            assertThrows(SandboxNotRunningException.class, () -> sb.commands().run("true"));
            // connect resumes a paused sandbox
            Sandbox other = Sandbox.connect(sb.id(), TestServer.admin(), true);
            assertEquals("running", other.state());
            assertEquals(120, sb.setTimeout(Duration.ofSeconds(120)).timeoutSec());
            sb.files().write("/home/user/kept.txt", "across a stop");
            assertEquals("stopped", sb.stop().state());
            assertEquals("running", sb.resume().state());
            assertEquals("across a stop", sb.files().read("/home/user/kept.txt"));
            SandboxUsage u = sb.usage();
            assertEquals(sb.id(), u.sandboxId());
            assertTrue(u.runningSec() > 0, u.toString());
            assertEquals("destroyed", sb.kill().state());
        }
    }

    @Test
    void snapshotsAndForks() {
        try (Sandbox sb = TestServer.sandbox()) {
            sb.files().write("/home/user/note.txt", "kept");
            SnapshotInfo snap = sb.createSnapshot();
            assertTrue(snap.id().startsWith("snap"), snap.toString());
            assertFalse(snap.memory(), snap.toString());
            assertEquals(snap, Snapshot.get(snap.id(), TestServer.admin()));
            assertTrue(Snapshot.list(TestServer.admin()).stream().anyMatch(s -> s.id().equals(snap.id())));
            try (Sandbox copy = Sandbox.create(CreateOptions.builder().snapshot(snap.id()).connection(TestServer.admin()).build())) {
                assertEquals("kept", copy.files().read("/home/user/note.txt"));
            }
            List<Sandbox> forks = sb.fork(1, Map.of("attempt", "b"));
            assertEquals(1, forks.size());
            try (Sandbox fork = forks.get(0)) {
                assertNotEquals(sb.id(), fork.id());
                assertEquals("b", fork.info().metadata().get("attempt"));
                assertEquals("kept", fork.files().read("/home/user/note.txt"));
            }
            assertEquals(snap.id(), Snapshot.delete(snap.id(), TestServer.admin()).id());
            assertThrows(NotFoundException.class, () -> Snapshot.get(snap.id(), TestServer.admin()));
        }
    }

    @Test
    void previewThroughExpose() throws Exception {
        try (Sandbox sb = TestServer.sandbox()) {
            sb.files().write("/home/user/site/index.html", "<h1>preview works</h1>");
            CommandHandle web = sb.commands().start("cd /home/user/site && exec python3 -m http.server 8000", ExecOptions.builder().tag("web").build());
            ExposedPort e = sb.exposeInfo(8000);
            assertEquals(8000, e.port());
            String body = null;
            for (int i = 0; i < 100 && body == null; i++) {
                var r = Transport.HTTP.send(java.net.http.HttpRequest.newBuilder(java.net.URI.create(e.url())).build(), java.net.http.HttpResponse.BodyHandlers.ofString());
                if (r.statusCode() == 200) body = r.body();
                else Thread.sleep(100);
            }
            assertNotNull(body, "the preview never answered 200");
            assertTrue(body.contains("preview works"), body);
            assertNotNull(sb.getHost(8000));
            assertNotNull(sb.previewToken(Duration.ofMinutes(5), false).token());
            assertTrue(web.kill());
        }
    }

    @Test
    void terminal() {
        try (Sandbox sb = TestServer.sandbox(); Pty pty = Pty.create(sb, Pty.Options.builder().size(100, 30).command("read line; echo got:$line; stty size; exit 3"))) {
            pty.write("hello\n");
            String out = pty.readUntil("30 100", Duration.ofSeconds(30));
            assertTrue(out.contains("got:hello"), out);
            assertEquals(3, pty.waitFor(Duration.ofSeconds(30)));
        }
    }
}
