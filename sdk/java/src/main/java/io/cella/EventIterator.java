package io.cella;

import java.util.Iterator;
import java.util.NoSuchElementException;
import java.util.Spliterator;
import java.util.Spliterators;
import java.util.function.Function;
import java.util.stream.Stream;
import java.util.stream.StreamSupport;

/**
 * Events of a stream as they come (a task run's events or live log): iterate, or {@link
 * #stream()}; the iteration ends with the stream. Close it to leave early.
 *
 * @param <T> the event type
 */
public final class EventIterator<T> implements Iterator<T>, Iterable<T>, AutoCloseable {
    private final EventStream events;
    private final Function<EventStream.Event, T> convert;
    private T pending;

    EventIterator(EventStream events, Function<EventStream.Event, T> convert) {
        this.events = events;
        this.convert = convert;
    }

    @Override
    public boolean hasNext() {
        while (pending == null) {
            EventStream.Event ev = events.next(null);
            if (ev == null) return false;
            if (ev == EventStream.KEEPALIVE) continue;
            if ("error".equals(ev.event)) {
                events.close();
                throw Errors.fromEvent(ev.data, events.requestId);
            }
            pending = convert.apply(ev);
        }
        return true;
    }

    @Override
    public T next() {
        if (!hasNext()) throw new NoSuchElementException();
        T t = pending;
        pending = null;
        return t;
    }

    @Override
    public Iterator<T> iterator() { return this; }

    public Stream<T> stream() {
        return StreamSupport.stream(Spliterators.spliteratorUnknownSize(this, Spliterator.ORDERED | Spliterator.NONNULL), false).onClose(this::close);
    }

    /** The same items as a {@link java.util.concurrent.Flow.Publisher} (one subscription: the stream is read once). */
    public java.util.concurrent.Flow.Publisher<T> publisher() { return Publishers.of(this, this); }

    @Override
    public void close() { events.close(); }
}
