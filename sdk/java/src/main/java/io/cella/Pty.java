package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.net.URI;
import java.net.http.WebSocket;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Map;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

/**
 * An interactive terminal in a sandbox, over a WebSocket ({@link Sandbox#pty}). Type with {@link
 * #write}, read what the program prints from {@link #getInputStream()}, {@link #resize} it, and
 * {@link #waitFor} its exit code. Closing it hangs the program up.
 */
public final class Pty implements AutoCloseable {
    private static final byte[] END = new byte[0];
    private final WebSocket ws;
    private final BlockingQueue<byte[]> output = new LinkedBlockingQueue<>();
    private final CompletableFuture<Integer> exit = new CompletableFuture<>();
    private final InputStream in;

    private Pty(WebSocket ws, Listener l) {
        this.ws = ws;
        l.pty = this;
        this.in = new InputStream() {
            private byte[] cur = new byte[0];
            private int pos;
            private boolean end;

            private boolean fill() throws IOException {
                while (!end && pos >= cur.length) {
                    try {
                        cur = output.take();
                    } catch (InterruptedException e) {
                        Thread.currentThread().interrupt();
                        throw new IOException("interrupted", e);
                    }
                    pos = 0;
                    if (cur == END) end = true;
                }
                return !end;
            }

            @Override
            public int read() throws IOException { return fill() ? cur[pos++] & 0xff : -1; }

            @Override
            public int read(byte[] b, int off, int n) throws IOException {
                if (n == 0) return 0;
                if (!fill()) return -1;
                int k = Math.min(n, cur.length - pos);
                System.arraycopy(cur, pos, b, off, k);
                pos += k;
                return k;
            }

            @Override
            public int available() { return pos < cur.length ? cur.length - pos : 0; }
        };
    }

    /** Options of a terminal: size, program, user, working directory. */
    public static final class Options {
        final Transport.Query query = Transport.Query.of();

        public static Options builder() { return new Options(); }

        public Options size(int cols, int rows) { query.add("cols", cols).add("rows", rows); return this; }

        /** A shell line to run instead of the login shell. */
        public Options command(String command) { query.add("command", command); return this; }

        public Options user(String user) { query.add("user", user); return this; }

        public Options cwd(String cwd) { query.add("cwd", cwd); return this; }

        public Options build() { return this; }
    }

    private static final class Listener implements WebSocket.Listener {
        Pty pty;
        private final ByteArrayOutputStream bin = new ByteArrayOutputStream();
        private final StringBuilder text = new StringBuilder();
        private final CompletableFuture<Pty> opened = new CompletableFuture<>();

        @Override
        public void onOpen(WebSocket webSocket) { webSocket.request(1); }

        @Override
        public CompletionStage<?> onBinary(WebSocket webSocket, ByteBuffer data, boolean last) {
            byte[] b = new byte[data.remaining()];
            data.get(b);
            bin.write(b, 0, b.length);
            if (last) {
                pty.output.add(bin.toByteArray());
                bin.reset();
            }
            webSocket.request(1);
            return null;
        }

        @Override
        public CompletionStage<?> onText(WebSocket webSocket, CharSequence data, boolean last) {
            text.append(data);
            if (last) {
                String t = text.toString();
                text.setLength(0);
                try {
                    JsonNode n = Json.MAPPER.readTree(t);
                    if (n != null && n.path("exit").isObject()) pty.exit.complete(n.get("exit").path("exit_code").asInt(-1));
                } catch (IOException e) {
                    pty.output.add(t.getBytes(StandardCharsets.UTF_8));
                }
            }
            webSocket.request(1);
            return null;
        }

        @Override
        public CompletionStage<?> onClose(WebSocket webSocket, int statusCode, String reason) {
            pty.output.add(END);
            pty.exit.completeExceptionally(new CellaException("the terminal closed without an exit code (" + statusCode + " " + reason + ")", "STREAM_ENDED", 0, null, null, null, null));
            return null;
        }

        @Override
        public void onError(WebSocket webSocket, Throwable error) {
            pty.output.add(END);
            pty.exit.completeExceptionally(new CellaConnectionException("the terminal's connection broke: " + error, "CONNECTION_ERROR", 0, null, null, null, error));
        }
    }

    /** Open a terminal in a sandbox (null options: a login shell, 80x24); {@code sandbox.pty(options)} does the same. */
    public static Pty create(Sandbox sandbox, Options options) { return open(sandbox.transport, sandbox.id(), options); }

    static Pty open(Transport t, String sandboxId, Options o) {
        String base = t.config.apiUrl().replaceFirst("^http", "ws");
        URI uri = URI.create(base + Transport.sandboxPath(sandboxId, "pty") + (o == null ? "" : o.query.render()));
        Listener l = new Listener();
        WebSocket.Builder b = Transport.HTTP.newWebSocketBuilder().connectTimeout(Transport.CONNECT_TIMEOUT);
        if (t.config.apiKey() != null) b.header("Authorization", "Bearer " + t.config.apiKey());
        for (Map.Entry<String, String> h : t.config.headers().entrySet()) b.header(h.getKey(), h.getValue());
        // The listener needs the Pty before the first frame: frames are only requested once it is set.
        Pty[] holder = new Pty[1];
        WebSocket.Listener gate = new WebSocket.Listener() {
            @Override
            public void onOpen(WebSocket ws) { }

            @Override
            public CompletionStage<?> onBinary(WebSocket ws, ByteBuffer data, boolean last) { return l.onBinary(ws, data, last); }

            @Override
            public CompletionStage<?> onText(WebSocket ws, CharSequence data, boolean last) { return l.onText(ws, data, last); }

            @Override
            public CompletionStage<?> onClose(WebSocket ws, int code, String reason) { return l.onClose(ws, code, reason); }

            @Override
            public void onError(WebSocket ws, Throwable error) { l.onError(ws, error); }
        };
        WebSocket ws;
        try {
            ws = b.buildAsync(uri, gate).join();
        } catch (CompletionException e) {
            Throwable c = e.getCause();
            if (c instanceof java.net.http.WebSocketHandshakeException) {
                java.net.http.HttpResponse<?> r = ((java.net.http.WebSocketHandshakeException) c).getResponse();
                Object body = r.body();
                byte[] bytes = body instanceof byte[] ? (byte[]) body : body == null ? new byte[0] : body.toString().getBytes(StandardCharsets.UTF_8);
                throw Errors.fromBody(r.statusCode(), bytes, r.headers().firstValue("x-request-id").orElse(null), null);
            }
            throw new CellaConnectionException("could not open the terminal: " + c, "CONNECTION_ERROR", 0, null, null, null, c);
        }
        holder[0] = new Pty(ws, l);
        ws.request(1);
        return holder[0];
    }

    /** Type bytes into the terminal. */
    public void write(byte[] data) {
        ws.sendBinary(ByteBuffer.wrap(data), true).join();
    }

    /** Type text (UTF-8) into the terminal. */
    public void write(String text) { write(text.getBytes(StandardCharsets.UTF_8)); }

    /** Resize the terminal. */
    public void resize(int cols, int rows) {
        ws.sendText(Json.object().set("resize", Json.object().put("cols", cols).put("rows", rows)).toString(), true).join();
    }

    /** What the program writes, as it comes; ends when the terminal closes. */
    public InputStream getInputStream() { return in; }

    /** Read what the program writes until {@code marker} appears, or {@code timeout} passes; answers what was read. */
    public String readUntil(String marker, Duration timeout) {
        StringBuilder sb = new StringBuilder();
        ByteArrayOutputStream raw = new ByteArrayOutputStream();
        long deadline = System.nanoTime() + timeout.toNanos();
        while (!sb.toString().contains(marker)) {
            long left = deadline - System.nanoTime();
            if (left <= 0) throw new CellaTimeoutException("the terminal did not print " + marker + " within " + timeout.toSeconds() + " s; it printed: " + sb, "TIMEOUT", 0, null, null, null, null);
            byte[] b;
            try {
                b = output.poll(left, TimeUnit.NANOSECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new CellaException("interrupted", "INTERRUPTED", 0, null, null, null, e);
            }
            if (b == null) continue;
            if (b == END) {
                output.add(END);
                break;
            }
            raw.write(b, 0, b.length);
            sb.setLength(0);
            sb.append(raw.toString(StandardCharsets.UTF_8));
        }
        return sb.toString();
    }

    /** Wait for the program's exit code ({@link CellaTimeoutException} after {@code timeout}). */
    public int waitFor(Duration timeout) {
        try {
            return exit.get(timeout.toMillis(), TimeUnit.MILLISECONDS);
        } catch (java.util.concurrent.TimeoutException e) {
            throw new CellaTimeoutException("the terminal's program did not exit within " + timeout.toSeconds() + " s", "TIMEOUT", 0, null, null, null, e);
        } catch (java.util.concurrent.ExecutionException e) {
            throw (CellaException) e.getCause();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new CellaException("interrupted", "INTERRUPTED", 0, null, null, null, e);
        }
    }

    /** Close the socket (the program is hung up). */
    @Override
    public void close() {
        try {
            ws.sendClose(WebSocket.NORMAL_CLOSURE, "").get(5, TimeUnit.SECONDS);
        } catch (Exception e) {
            // already closed
        }
        ws.abort();
    }
}
