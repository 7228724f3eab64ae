package io.cella;

import java.io.BufferedInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

/**
 * A server-sent event stream, read by a daemon thread into a queue so that a reader can wait
 * with a timeout and another thread can close it. The subset the Cella server speaks:
 * {@code event:} and {@code data:} lines, a blank line ending an event, {@code :} comments.
 */
final class EventStream implements AutoCloseable {
    /** One event. {@code event} is {@code "message"} when the server named none. */
    static final class Event {
        final String event;
        final String data;

        Event(String event, String data) {
            this.event = event;
            this.data = data;
        }
    }

    static final Event KEEPALIVE = new Event(":", "");
    private static final Event END = new Event("", "");

    private final InputStream in;
    private final BlockingQueue<Object> queue = new LinkedBlockingQueue<>(1024);
    final String requestId;
    private volatile boolean closed;
    private boolean ended;

    EventStream(HttpResponse<InputStream> resp) {
        this(resp.body(), resp.headers().firstValue("x-request-id").orElse(null));
    }

    EventStream(InputStream in, String requestId) {
        this.in = in;
        this.requestId = requestId;
        Thread t = new Thread(this::pump, "cella-sse");
        t.setDaemon(true);
        t.start();
    }

    private void put(Object o) throws InterruptedException {
        while (!closed) {
            if (queue.offer(o, 100, TimeUnit.MILLISECONDS)) return;
        }
    }

    private void pump() {
        try (InputStream s = new BufferedInputStream(in, 65536)) {
            String event = "";
            List<String> data = new ArrayList<>();
            ByteArrayOutputStream line = new ByteArrayOutputStream();
            while (true) {
                int c = s.read();
                if (c == -1 || c == '\n') {
                    String l = line.toString(StandardCharsets.UTF_8);
                    line.reset();
                    if (l.endsWith("\r")) l = l.substring(0, l.length() - 1);
                    if (c == -1 && l.isEmpty()) {
                        if (!data.isEmpty() || !event.isEmpty()) put(new Event(event.isEmpty() ? "message" : event, String.join("\n", data)));
                        break;
                    }
                    if (l.isEmpty()) {
                        if (!data.isEmpty() || !event.isEmpty()) put(new Event(event.isEmpty() ? "message" : event, String.join("\n", data)));
                        event = "";
                        data = new ArrayList<>();
                    } else if (l.startsWith(":")) {
                        put(KEEPALIVE);
                    } else {
                        int i = l.indexOf(':');
                        String name = i < 0 ? l : l.substring(0, i);
                        String value = i < 0 ? "" : l.substring(i + 1);
                        if (value.startsWith(" ")) value = value.substring(1);
                        if (name.equals("event")) event = value;
                        else if (name.equals("data")) data.add(value);
                    }
                    if (c == -1) {
                        if (!data.isEmpty() || !event.isEmpty()) put(new Event(event.isEmpty() ? "message" : event, String.join("\n", data)));
                        break;
                    }
                } else {
                    line.write(c);
                }
            }
            put(END);
        } catch (IOException e) {
            try {
                put(closed ? END : Transport.wrapRead(e, requestId));
            } catch (InterruptedException ie) {
                Thread.currentThread().interrupt();
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    /**
     * The next event (or {@link #KEEPALIVE}); null at the end of the stream, or when {@code
     * timeout} (null: no limit) passed first (then {@link #ended()} is false).
     */
    Event next(Duration timeout) {
        if (ended) return null;
        Object o;
        try {
            o = timeout == null ? queue.take() : queue.poll(Math.max(0, timeout.toMillis()), TimeUnit.MILLISECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new CellaException("interrupted", "INTERRUPTED", 0, null, null, null, e);
        }
        if (o == null) return null;
        if (o == END) {
            ended = true;
            return null;
        }
        if (o instanceof CellaException) {
            ended = true;
            throw (CellaException) o;
        }
        return (Event) o;
    }

    boolean ended() { return ended; }

    @Override
    public void close() {
        if (closed) return;
        closed = true;
        ended = true;
        try {
            in.close();
        } catch (IOException e) {
            // nothing to do
        }
    }
}
