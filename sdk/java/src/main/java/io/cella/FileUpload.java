package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.TimeUnit;

/**
 * An upload written as a stream ({@link Files#openOutputStream}): bytes go to the server as they
 * are written; {@link #close()} ends the body and waits for the answer, then {@link #entry()} is
 * the new file's entry. A failure of the server (413, 409, ...) is thrown by {@code write} or
 * {@code close} as its {@link CellaException}. An upload whose length is not known is sent
 * chunked: past the server's limit it is cut off and answered 413 once the server has drained up
 * to 16 MiB more; a writer that goes on beyond that sees the connection close instead ({@link
 * CellaConnectionException}), since {@code java.net.http} reads no answer once a write failed.
 */
public final class FileUpload extends OutputStream {
    private static final byte[] EOF = new byte[0];
    private final BlockingQueue<byte[]> queue = new ArrayBlockingQueue<>(16);
    private final CompletableFuture<JsonNode> answer;
    private byte[] buf = new byte[64 * 1024];
    private int len;
    private boolean closed;
    private EntryInfo entry;

    FileUpload(Transport t, String path, Transport.Query query) {
        InputStream body = new InputStream() {
            private byte[] cur = new byte[0];
            private int pos;
            private boolean end;

            private boolean fill() throws IOException {
                while (!end && pos >= cur.length) {
                    try {
                        cur = queue.take();
                    } catch (InterruptedException e) {
                        Thread.currentThread().interrupt();
                        throw new IOException("interrupted", e);
                    }
                    pos = 0;
                    if (cur == EOF) end = true;
                }
                return !end;
            }

            @Override
            public int read() throws IOException {
                return fill() ? cur[pos++] & 0xff : -1;
            }

            @Override
            public int read(byte[] b, int off, int n) throws IOException {
                if (n == 0) return 0;
                if (!fill()) return -1;
                int k = Math.min(n, cur.length - pos);
                System.arraycopy(cur, pos, b, off, k);
                pos += k;
                return k;
            }
        };
        answer = CompletableFuture.supplyAsync(() -> {
            try {
                return t.data("PUT", path, query, Transport.Body.stream(() -> body, -1), null);
            } catch (CellaConnectionException e) {
                throw new CellaConnectionException("the server closed the connection during the upload (an upload that goes far past the server's upload limit ends so, "
                        + "as the JDK's HTTP client cannot read the 413 it sent): " + e.serverMessage(), e.code(), 0, null, null, null, e);
            }
        });
    }

    private void push(byte[] chunk) throws IOException {
        while (true) {
            if (answer.isDone()) {
                failIfFailed();
                if (chunk != EOF) throw new IOException("the server answered before the upload's end");
                return;
            }
            try {
                if (queue.offer(chunk, 100, TimeUnit.MILLISECONDS)) return;
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new IOException("interrupted", e);
            }
        }
    }

    private void failIfFailed() {
        if (answer.isCompletedExceptionally()) {
            closed = true; // the error is thrown once: close() after it does nothing
            try {
                answer.join();
            } catch (CompletionException e) {
                if (e.getCause() instanceof CellaException) throw (CellaException) e.getCause();
                throw e;
            }
        }
    }

    private void flushBuf() throws IOException {
        if (len > 0) {
            byte[] chunk = java.util.Arrays.copyOf(buf, len);
            len = 0;
            push(chunk);
        }
    }

    @Override
    public void write(int b) throws IOException {
        if (closed) throw new IOException("the upload is closed");
        if (len == buf.length) flushBuf();
        buf[len++] = (byte) b;
    }

    @Override
    public void write(byte[] b, int off, int n) throws IOException {
        if (closed) throw new IOException("the upload is closed");
        while (n > 0) {
            if (len == buf.length) flushBuf();
            int k = Math.min(n, buf.length - len);
            System.arraycopy(b, off, buf, len, k);
            len += k;
            off += k;
            n -= k;
        }
    }

    @Override
    public void flush() throws IOException {
        flushBuf();
    }

    /** End the upload and wait for the server's answer. */
    @Override
    public void close() throws IOException {
        if (closed) return;
        failIfFailed();
        closed = true;
        flushBuf();
        push(EOF);
        try {
            entry = new EntryInfo(answer.join());
        } catch (CompletionException e) {
            if (e.getCause() instanceof CellaException) throw (CellaException) e.getCause();
            throw new IOException(e.getCause());
        }
    }

    /** The new file's entry, once closed. */
    public EntryInfo entry() { return entry; }
}
