package io.cella;

import static org.junit.jupiter.api.Assertions.*;

import java.io.ByteArrayInputStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;

/** The parts that need no server: event streams, error envelopes, configuration. */
class UnitTest {
    static EventStream events(String text) {
        return new EventStream(new ByteArrayInputStream(text.getBytes(StandardCharsets.UTF_8)), "req1");
    }

    @Test
    void serverSentEvents() {
        EventStream s = events(": keep\r\nevent: stdout\ndata: \"a\"\n\nevent: stderr\ndata: {\"b64\":\"/wA=\"}\n\ndata: x\ndata: y\n\nevent: exit\ndata: {\"exit_code\":3}");
        List<String> seen = new ArrayList<>();
        for (EventStream.Event e; (e = s.next(Duration.ofSeconds(5))) != null; ) seen.add(e.event + "=" + e.data);
        assertTrue(s.ended());
        assertEquals(List.of(":=", "stdout=\"a\"", "stderr={\"b64\":\"/wA=\"}", "message=x\ny", "exit={\"exit_code\":3}"), seen);
        assertArrayEquals(new byte[] {(byte) 0xff, 0}, OutputChunk.decode("{\"b64\":\"/wA=\"}"));
        assertEquals("é", new String(OutputChunk.decode("\"é\""), StandardCharsets.UTF_8));
    }

    @Test
    void commandStreamFoldsOutputAndEndsOnError() {
        CommandStream ok = new CommandStream(events("event: stdout\ndata: \"hi \"\n\nevent: stdout\ndata: \"there\"\n\nevent: exit\ndata: {\"exit_code\":0,\"duration_ms\":5,\"timed_out\":false}\n\n"), "t", null);
        CommandResult r = ok.result();
        assertEquals("hi there", r.stdout());
        assertEquals(5, r.durationMs());
        assertTrue(r.ok());
        CommandStream bad = new CommandStream(events("event: error\ndata: {\"error\":{\"code\":\"INVALID_REQUEST\",\"message\":\"cwd does not exist\",\"details\":{\"field\":\"cwd\"}}}\n\n"), "t", null);
        InvalidRequestException e = assertThrows(InvalidRequestException.class, bad::result);
        assertEquals("cwd", e.field().orElseThrow());
        assertEquals("req1", e.requestId());
        CommandStream cut = new CommandStream(events("event: stdout\ndata: \"x\"\n\n"), "t", null);
        CellaException c = assertThrows(CellaException.class, cut::result);
        assertEquals("STREAM_ENDED", c.code());
    }

    @Test
    void flowPublisher() throws Exception {
        CommandStream s = new CommandStream(events("event: stdout\ndata: \"a\"\n\nevent: stdout\ndata: \"b\"\n\nevent: exit\ndata: {\"exit_code\":0}\n\n"), "t", null);
        java.util.concurrent.CompletableFuture<String> done = new java.util.concurrent.CompletableFuture<>();
        StringBuilder seen = new StringBuilder();
        s.publisher().subscribe(new java.util.concurrent.Flow.Subscriber<OutputChunk>() {
            public void onSubscribe(java.util.concurrent.Flow.Subscription sub) { sub.request(Long.MAX_VALUE); }
            public void onNext(OutputChunk c) { seen.append(c.text()); }
            public void onError(Throwable t) { done.completeExceptionally(t); }
            public void onComplete() { done.complete(seen.toString()); }
        });
        assertEquals("ab", done.get(10, java.util.concurrent.TimeUnit.SECONDS));
        CommandStream bad = new CommandStream(events("event: error\ndata: {\"error\":{\"code\":\"UNAVAILABLE\",\"message\":\"agent gone\"}}\n\n"), "t", null);
        java.util.concurrent.CompletableFuture<Throwable> failed = new java.util.concurrent.CompletableFuture<>();
        bad.publisher().subscribe(new java.util.concurrent.Flow.Subscriber<OutputChunk>() {
            public void onSubscribe(java.util.concurrent.Flow.Subscription sub) { sub.request(1); }
            public void onNext(OutputChunk c) { }
            public void onError(Throwable t) { failed.complete(t); }
            public void onComplete() { failed.complete(null); }
        });
        assertInstanceOf(UnavailableException.class, failed.get(10, java.util.concurrent.TimeUnit.SECONDS));
    }

    @Test
    void errorEnvelopesBecomeTypedExceptions() {
        byte[] body = "{\"error\":{\"code\":\"SANDBOX_NOT_RUNNING\",\"message\":\"paused\",\"details\":{\"state\":\"paused\"}}}".getBytes(StandardCharsets.UTF_8);
        CellaException e = Errors.fromBody(409, body, "r", null);
        assertInstanceOf(SandboxNotRunningException.class, e);
        assertInstanceOf(ConflictException.class, e);
        assertEquals("paused", e.details().path("state").asText());
        assertEquals("SANDBOX_NOT_RUNNING: paused (HTTP 409, request r)", e.getMessage());
        assertInstanceOf(UnknownRouteException.class, Errors.fromBody(404, "{\"error\":{\"code\":\"NOT_FOUND\",\"message\":\"no such route\"}}".getBytes(StandardCharsets.UTF_8), null, null));
        CellaException plain = Errors.fromBody(502, "bad gateway".getBytes(StandardCharsets.UTF_8), null, null);
        assertEquals("HTTP_502", plain.code());
        assertEquals("bad gateway", plain.serverMessage());
        CellaException limited = Errors.fromBody(429, "{\"error\":{\"code\":\"CONCURRENCY_LIMIT\",\"message\":\"cap\"}}".getBytes(StandardCharsets.UTF_8), null, Errors.parseRetryAfter("5"));
        assertInstanceOf(ConcurrencyLimitException.class, limited);
        assertEquals(Duration.ofSeconds(5), limited.retryAfter().orElseThrow());
        assertNull(Errors.parseRetryAfter("soon"));
    }

    @Test
    void configuration() {
        ConnectionConfig c = ConnectionConfig.builder().server("cella.example:7070/api/v1/").apiKey("k").build();
        assertEquals("http://cella.example:7070", c.server());
        assertEquals("http://cella.example:7070/api/v1", c.apiUrl());
        assertFalse(c.toString().contains("k}"), "the key is not printed");
        assertNull(c.toBuilder().apiKey("").build().apiKey());
        assertThrows(IllegalArgumentException.class, () -> ConnectionConfig.builder().maxRetries(-1));
        assertEquals("a%20b%2Fc", Transport.seg("a b/c"));
        assertEquals("?path=%2Fhome%2Fuser%2Fa%20b&recursive=true", Transport.Query.of().add("path", "/home/user/a b").add("user", null).flag("recursive", true).render());
        assertEquals(2, CreateOptions.seconds(Duration.ofMillis(1500)));
    }
}
