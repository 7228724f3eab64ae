package io.cella;

import java.time.Duration;
import java.util.Iterator;
import java.util.NoSuchElementException;
import java.util.Optional;

/**
 * An open watch on a directory: iterate for {@link FilesystemEvent}s (the iteration blocks until
 * the next change), or {@link #next(Duration)} with a timeout. Close it when done.
 */
public final class WatchHandle implements Iterator<FilesystemEvent>, Iterable<FilesystemEvent>, AutoCloseable {
    private final EventStream events;
    private FilesystemEvent pending;

    WatchHandle(EventStream events) {
        this.events = events;
    }

    /** The next change, or empty when none came within {@code timeout} or the watch ended. */
    public Optional<FilesystemEvent> next(Duration timeout) {
        if (pending != null) {
            FilesystemEvent e = pending;
            pending = null;
            return Optional.of(e);
        }
        long deadline = System.nanoTime() + timeout.toNanos();
        while (true) {
            long left = deadline - System.nanoTime();
            if (left <= 0) return Optional.empty();
            EventStream.Event ev = events.next(Duration.ofNanos(left));
            if (ev == null) return Optional.empty();
            Optional<FilesystemEvent> e = convert(ev);
            if (e.isPresent()) return e;
        }
    }

    private Optional<FilesystemEvent> convert(EventStream.Event ev) {
        switch (ev.event) {
            case "create":
            case "modify":
            case "delete":
            case "rename":
                return Optional.of(new FilesystemEvent(ev.event, Json.parse(ev.data)));
            case "error":
                throw Errors.fromEvent(ev.data, events.requestId);
            default:
                return Optional.empty();
        }
    }

    @Override
    public boolean hasNext() {
        while (pending == null) {
            EventStream.Event ev = events.next(null);
            if (ev == null) return false;
            pending = convert(ev).orElse(null);
        }
        return true;
    }

    @Override
    public FilesystemEvent next() {
        if (!hasNext()) throw new NoSuchElementException();
        FilesystemEvent e = pending;
        pending = null;
        return e;
    }

    @Override
    public Iterator<FilesystemEvent> iterator() { return this; }

    /** The same items as a {@link java.util.concurrent.Flow.Publisher} (one subscription: the stream is read once). */
    public java.util.concurrent.Flow.Publisher<FilesystemEvent> publisher() { return Publishers.of(this, this); }

    @Override
    public void close() { events.close(); }
}
