package io.cella;

import static org.junit.jupiter.api.Assertions.*;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;

@ExtendWith(TestServer.class)
class RunsTest {
    @Test
    void oneShotRunWithArtifacts() {
        RunResult r = Sandbox.run(RunOptions.command("mkdir -p out && sort data.txt > out/sorted.txt && wc -l < data.txt")
                .file("data.txt", "b\nc\na\n").artifact("out/*.txt").size(TestServer.SIZE).timeout(Duration.ofMinutes(2)).connection(TestServer.admin()).build());
        assertTrue(r.ok(), r.toString());
        assertEquals("3\n", r.stdout());
        assertEquals(1, r.artifacts().size());
        ArtifactInfo a = r.artifacts().get(0);
        assertEquals("/home/user/out/sorted.txt", a.path());
        assertEquals("a\nb\nc\n", new String(Artifact.download(a.id(), TestServer.admin()), StandardCharsets.UTF_8));
        try (java.io.InputStream in = Artifact.openInputStream(a.id(), TestServer.admin())) {
            assertEquals("a\nb\nc\n", new String(in.readAllBytes(), StandardCharsets.UTF_8));
        } catch (java.io.IOException e) {
            throw new java.io.UncheckedIOException(e);
        }
        assertTrue(Artifact.list(r.sandboxId(), TestServer.admin()).stream().anyMatch(x -> x.id().equals(a.id())));
        assertEquals(a.id(), Artifact.delete(a.id(), TestServer.admin()).id());
        assertThrows(NotFoundException.class, () -> Artifact.download(a.id(), TestServer.admin()));
        assertThrows(CommandExitException.class, () -> Sandbox.run(RunOptions.command("exit 9").check(true).size(TestServer.SIZE).connection(TestServer.admin()).build()));
    }

    @Test
    void collectArtifactsFromASandbox() {
        try (Sandbox sb = TestServer.sandbox()) {
            sb.files().write("/home/user/report.txt", "report");
            List<ArtifactInfo> kept = sb.collectArtifacts(List.of("report.txt"));
            assertEquals(1, kept.size());
            assertEquals("report", new String(Artifact.download(kept.get(0).id(), TestServer.admin()), StandardCharsets.UTF_8));
        }
    }

    @Test
    void customTemplate() {
        List<TemplateInfo> catalog = Template.list(TestServer.admin());
        assertTrue(catalog.stream().anyMatch(t -> t.id().equals("base")));
        assertEquals("base", Template.get("base", TestServer.admin()).id());
        var spec = Json.object().put("id", "java-sdk-tpl").put("from", "base").put("default_size", "xs");
        spec.putArray("steps").addObject().put("run", "echo built-by-java > /opt/marker");
        TemplateBuildHandle h = Template.build(spec, TestServer.admin());
        StringBuilder log = new StringBuilder();
        TemplateBuild b = h.waitFor(Duration.ofMinutes(5), true, log::append);
        assertEquals("ready", b.state(), b.log());
        assertEquals(b.log(), log.toString());
        assertEquals("ready", Template.getBuild("java-sdk-tpl", b.id(), TestServer.admin()).state());
        assertFalse(Template.builds("java-sdk-tpl", TestServer.admin()).isEmpty());
        try (Sandbox sb = Sandbox.create(CreateOptions.builder().template("java-sdk-tpl").connection(TestServer.admin()).build())) {
            assertEquals("built-by-java\n", sb.files().read("/opt/marker"));
            assertThrows(ConflictException.class, () -> Template.delete("java-sdk-tpl", TestServer.admin()));
        }
        Template.delete("java-sdk-tpl", TestServer.admin());
        assertThrows(NotFoundException.class, () -> Template.get("java-sdk-tpl", TestServer.admin()));
    }
}
