package io.cella;

import java.util.Iterator;
import java.util.concurrent.Flow;
import java.util.concurrent.SubmissionPublisher;

/** {@link Flow.Publisher}s over the SDK's iterators, for reactive code. */
final class Publishers {
    private Publishers() {}

    /**
     * A publisher that reads {@code items} on a thread of its own once subscribed to, and hands
     * each item to its subscribers (a slow subscriber holds the reading back); it completes at the
     * end, or with the {@link CellaException} that ended the stream. When every subscriber has
     * cancelled, the stream is closed.
     */
    static <T> Flow.Publisher<T> of(Iterator<T> items, AutoCloseable source) {
        return subscriber -> {
            SubmissionPublisher<T> pub = new SubmissionPublisher<>();
            pub.subscribe(subscriber);
            Thread t = new Thread(() -> {
                try {
                    while (items.hasNext()) {
                        if (!pub.hasSubscribers()) break;
                        pub.submit(items.next());
                    }
                    pub.close();
                } catch (RuntimeException e) {
                    pub.closeExceptionally(e);
                } finally {
                    try {
                        source.close();
                    } catch (Exception e) {
                        // nothing more to do
                    }
                }
            }, "cella-publisher");
            t.setDaemon(true);
            t.start();
        };
    }
}
