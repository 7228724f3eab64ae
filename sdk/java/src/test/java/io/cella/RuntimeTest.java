package io.cella;

import static org.junit.jupiter.api.Assertions.*;

import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;

/** Isolation runtimes: a create names one, the sandbox says which it runs on, an unknown one is a 400 naming the field, templates list theirs. */
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
    void unknownRuntimeIsA400NamingTheField() {
        InvalidRequestException e = assertThrows(InvalidRequestException.class, () -> Sandbox.create(opts("vm").build()));
        assertEquals(400, e.status());
        assertEquals("INVALID_REQUEST", e.code());
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
}
