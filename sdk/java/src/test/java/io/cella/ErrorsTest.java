package io.cella;

import static org.junit.jupiter.api.Assertions.*;

import java.time.Duration;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;

/** One error case per family, each asserting the typed exception a user would catch. */
@ExtendWith(TestServer.class)
class ErrorsTest {
    @Test
    void unauthorized401() {
        AuthenticationException e = assertThrows(AuthenticationException.class,
                () -> Sandbox.list(ListOptions.builder().connection(TestServer.get().connection("cella_not_a_key")).build()));
        assertEquals(401, e.status());
        assertEquals("UNAUTHORIZED", e.code());
        assertNotNull(e.requestId());
    }

    @Test
    void forbidden403() {
        String key = TestServer.get().makeKey("sandboxes:read");
        PermissionDeniedException e = assertThrows(PermissionDeniedException.class,
                () -> Sandbox.create(CreateOptions.builder().size(TestServer.SIZE).connection(TestServer.get().connection(key)).build()));
        assertEquals(403, e.status());
        assertEquals("sandboxes:write", e.details().path("required_scope").asText());
        assertTrue(Sandbox.list(ListOptions.builder().connection(TestServer.get().connection(key)).build()) != null);
    }

    @Test
    void notFound404() {
        NotFoundException e = assertThrows(NotFoundException.class, () -> Sandbox.connect("sb000000000000000000", TestServer.admin(), false));
        assertEquals(404, e.status());
        assertEquals("NOT_FOUND", e.code());
        assertThrows(NotFoundException.class, () -> Artifact.download("art000000000000000000", TestServer.admin()));
        Sandbox ghost = new Sandbox(new SandboxInfo(Json.object().put("id", "sb000000000000000000").put("state", "running")), new Transport(TestServer.admin()));
        assertThrows(NotFoundException.class, () -> ghost.pty(null));
        assertThrows(NotFoundException.class, () -> ghost.commands().stream("true"));
        assertThrows(NotFoundException.class, () -> ghost.files().watch("/"));
    }

    @Test
    void conflict409AndPayloadTooLarge413AndInvalid400() {
        try (Sandbox sb = TestServer.sandbox()) {
            ConflictException c = assertThrows(ConflictException.class, sb::resume);
            assertEquals(409, c.status());
            assertEquals("running", c.details().path("state").asText());
            PayloadTooLargeException big = assertThrows(PayloadTooLargeException.class,
                    () -> sb.commands().run("wc -c", ExecOptions.builder().stdin("x".repeat(5 * 1024 * 1024)).build()));
            assertEquals(413, big.status());
            InvalidRequestException bad = assertThrows(InvalidRequestException.class, () -> sb.setTimeout(Duration.ofDays(30)));
            assertEquals("timeout_sec", bad.field().orElse(null));
            sb.pause();
            SandboxNotRunningException nr = assertThrows(SandboxNotRunningException.class, () -> sb.files().read("/etc/hostname"));
            assertEquals("SANDBOX_NOT_RUNNING", nr.code());
            // The terminal's errors come before the WebSocket upgrade, typed the same way.
            assertThrows(SandboxNotRunningException.class, () -> sb.pty(null));
        }
    }

    @Test
    void rateLimited429() throws Exception {
        try (CellaServer limited = CellaServer.start("\n[rate_limits]\nread = { per_second = 0.5, burst = 2 }\n")) {
            ConnectionConfig noRetry = limited.admin().toBuilder().maxRetries(0).build();
            RateLimitedException err = null;
            for (int i = 0; i < 20 && err == null; i++) {
                try {
                    Sandbox.list(ListOptions.builder().limit(1).connection(noRetry).build());
                } catch (RateLimitedException e) {
                    err = e;
                }
            }
            assertNotNull(err, "the read limit never answered 429");
            assertEquals(429, err.status());
            assertEquals("RATE_LIMITED", err.code());
            assertTrue(err.retryAfter().orElseThrow().toMillis() >= 1000);
            assertEquals("read", err.details().path("group").asText());
            // With retries (the default) the same calls wait for the bucket and succeed.
            for (int i = 0; i < 3; i++) Sandbox.list(ListOptions.builder().limit(1).connection(limited.admin()).build());
            assertTrue(limited.stop().isEmpty());
        }
    }
}
