package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.ByteArrayOutputStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Iterator;
import java.util.NoSuchElementException;
import java.util.Spliterator;
import java.util.Spliterators;
import java.util.stream.Stream;
import java.util.stream.StreamSupport;

/**
 * The output of a command as it comes: iterate over it (or {@link #stream()} it) for {@link
 * OutputChunk}s, then read {@link #result()}. Close it to leave early (a streamed exec's command
 * is then killed; a background process goes on).
 *
 * <pre>{@code
 * try (CommandStream out = sandbox.commands().stream("make")) {
 *     for (OutputChunk c : out) System.out.print(c.text());
 *     System.out.println("exit " + out.result().exitCode());
 * }
 * }</pre>
 */
public final class CommandStream implements Iterator<OutputChunk>, Iterable<OutputChunk>, AutoCloseable {
    private final EventStream events;
    private final String what;
    private final Duration timeout;
    private final long deadline;
    private final ByteArrayOutputStream stdout = new ByteArrayOutputStream();
    private final ByteArrayOutputStream stderr = new ByteArrayOutputStream();
    private JsonNode exit;
    private OutputChunk next;
    private boolean done;

    CommandStream(EventStream events, String what, Duration timeout) {
        this.events = events;
        this.what = what;
        this.timeout = timeout;
        this.deadline = timeout == null ? 0 : System.nanoTime() + timeout.toNanos();
    }

    private void advance() {
        while (next == null && !done) {
            Duration wait = null;
            if (timeout != null) {
                long left = deadline - System.nanoTime();
                if (left <= 0) {
                    close();
                    throw new CellaTimeoutException(what + " did not end within " + timeout.toSeconds() + " s", "TIMEOUT", 0, events.requestId, null, null, null);
                }
                wait = Duration.ofNanos(left);
            }
            EventStream.Event ev = events.next(wait);
            if (ev == null) {
                if (!events.ended()) continue; // the deadline check above throws
                done = true;
                events.close();
                if (exit == null) throw new CellaException("the output stream of " + what + " ended before its exit", "STREAM_ENDED", 0, events.requestId, null, null, null);
                return;
            }
            switch (ev.event) {
                case "stdout":
                case "stderr": {
                    byte[] b = OutputChunk.decode(ev.data);
                    (ev.event.equals("stdout") ? stdout : stderr).write(b, 0, b.length);
                    next = new OutputChunk(ev.event, b);
                    break;
                }
                case "exit":
                    exit = Json.parse(ev.data);
                    done = true;
                    events.close();
                    return;
                case "error":
                    done = true;
                    events.close();
                    throw Errors.fromEvent(ev.data, events.requestId);
                default:
                    break; // keep-alives and events this SDK does not know
            }
        }
    }

    @Override
    public boolean hasNext() {
        advance();
        return next != null;
    }

    @Override
    public OutputChunk next() {
        if (!hasNext()) throw new NoSuchElementException();
        OutputChunk c = next;
        next = null;
        return c;
    }

    @Override
    public Iterator<OutputChunk> iterator() { return this; }

    /** The chunks as a {@link Stream} (close it, or this, when leaving early). */
    public Stream<OutputChunk> stream() {
        return StreamSupport.stream(Spliterators.spliteratorUnknownSize(this, Spliterator.ORDERED | Spliterator.NONNULL), false).onClose(this::close);
    }

    /** Read to the end and answer the result: exit code and all the output read. */
    public CommandResult result() {
        while (hasNext()) next();
        return new CommandResult(exit.path("exit_code").asInt(-1), stdout.toString(StandardCharsets.UTF_8), stderr.toString(StandardCharsets.UTF_8),
                exit.path("duration_ms").asLong(0), exit.path("timed_out").asBoolean(false), exit);
    }

    /** The exit code once the end was read, else null. */
    public Integer exitCode() { return exit == null ? null : exit.path("exit_code").asInt(-1); }

    /** The same items as a {@link java.util.concurrent.Flow.Publisher} (one subscription: the stream is read once). */
    public java.util.concurrent.Flow.Publisher<OutputChunk> publisher() { return Publishers.of(this, this); }

    @Override
    public void close() { events.close(); }
}
