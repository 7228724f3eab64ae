package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.IOException;
import java.io.InputStream;
import java.net.URI;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpConnectTimeoutException;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.net.http.HttpTimeoutException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.function.Supplier;

/**
 * HTTP plumbing shared by every call: the bearer key, error envelopes turned into typed
 * exceptions, 429 answers retried after {@code Retry-After}, and one resend of a request that
 * failed on a kept-alive connection the server had closed.
 */
final class Transport {
    static final String VERSION = "0.1.0";
    static final Duration CONNECT_TIMEOUT = Duration.ofSeconds(10);
    private static final Set<String> IDEMPOTENT = Set.of("GET", "HEAD", "PUT", "DELETE", "OPTIONS");

    static final HttpClient HTTP = HttpClient.newBuilder()
            .version(HttpClient.Version.HTTP_1_1)
            .connectTimeout(CONNECT_TIMEOUT)
            .followRedirects(HttpClient.Redirect.NEVER)
            .build();

    final ConnectionConfig config;

    Transport(ConnectionConfig config) {
        this.config = config == null ? ConnectionConfig.fromEnv() : config;
    }

    /** Query parameters; null values are left out. */
    static final class Query {
        final List<String[]> items = new ArrayList<>();

        static Query of() { return new Query(); }

        Query add(String key, Object value) {
            if (value != null) items.add(new String[] {key, String.valueOf(value)});
            return this;
        }

        Query flag(String key, boolean value) {
            if (value) items.add(new String[] {key, "true"});
            return this;
        }

        String render() {
            if (items.isEmpty()) return "";
            StringBuilder sb = new StringBuilder("?");
            for (String[] kv : items) {
                if (sb.length() > 1) sb.append('&');
                sb.append(enc(kv[0])).append('=').append(enc(kv[1]));
            }
            return sb.toString();
        }
    }

    /** A request body. */
    static final class Body {
        final Supplier<HttpRequest.BodyPublisher> publisher;
        final String contentType;
        final boolean replayable;

        private Body(Supplier<HttpRequest.BodyPublisher> publisher, String contentType, boolean replayable) {
            this.publisher = publisher;
            this.contentType = contentType;
            this.replayable = replayable;
        }

        static Body json(Object value) {
            byte[] b = Json.bytes(Json.tree(value));
            return new Body(() -> HttpRequest.BodyPublishers.ofByteArray(b), "application/json", true);
        }

        static Body bytes(byte[] b) {
            return new Body(() -> HttpRequest.BodyPublishers.ofByteArray(b), "application/octet-stream", true);
        }

        static Body stream(Supplier<InputStream> in, long length) {
            Supplier<HttpRequest.BodyPublisher> p = length >= 0
                    ? () -> HttpRequest.BodyPublishers.fromPublisher(HttpRequest.BodyPublishers.ofInputStream(in), length)
                    : () -> HttpRequest.BodyPublishers.ofInputStream(in);
            return new Body(p, "application/octet-stream", false);
        }
    }

    static String enc(String s) {
        return URLEncoder.encode(s, StandardCharsets.UTF_8).replace("+", "%20");
    }

    /** One path segment, escaped. */
    static String seg(Object value) {
        return enc(String.valueOf(value));
    }

    static String sandboxPath(String id, String... rest) {
        StringBuilder sb = new StringBuilder("/sandboxes/").append(seg(id));
        for (String r : rest) sb.append('/').append(r);
        return sb.toString();
    }

    private HttpRequest build(String method, String path, Query query, Body body, Duration timeout, String accept, Map<String, String> extra) {
        HttpRequest.Builder b = HttpRequest.newBuilder(URI.create(config.apiUrl() + path + (query == null ? "" : query.render())));
        b.header("User-Agent", "cella-java/" + VERSION);
        b.header("Accept", accept);
        if (config.apiKey() != null) b.header("Authorization", "Bearer " + config.apiKey());
        for (Map.Entry<String, String> h : config.headers().entrySet()) b.header(h.getKey(), h.getValue());
        for (Map.Entry<String, String> h : extra.entrySet()) b.header(h.getKey(), h.getValue());
        if (timeout != null) b.timeout(timeout);
        if (body != null) {
            b.header("Content-Type", body.contentType);
            b.method(method, body.publisher.get());
        } else if (method.equals("POST") || method.equals("PUT") || method.equals("PATCH")) {
            b.method(method, HttpRequest.BodyPublishers.noBody());
        } else {
            b.method(method, HttpRequest.BodyPublishers.noBody());
        }
        return b.build();
    }

    /** Send a request; answers 2xx/3xx responses, throws the typed error of the others. */
    HttpResponse<InputStream> send(String method, String path, Query query, Body body, Duration timeout, String accept) {
        return send(method, path, query, body, timeout, accept, Map.of());
    }

    /** {@link #send} with headers of this request only (e.g. {@code Range}). */
    HttpResponse<InputStream> send(String method, String path, Query query, Body body, Duration timeout, String accept, Map<String, String> extra) {
        int attempt = 0;
        boolean resent = false;
        while (true) {
            HttpRequest req = build(method, path, query, body, timeout, accept, extra);
            long started = System.nanoTime();
            HttpResponse<InputStream> resp;
            try {
                resp = HTTP.send(req, HttpResponse.BodyHandlers.ofInputStream());
            } catch (HttpConnectTimeoutException e) {
                throw new CellaTimeoutException("timed out connecting to the Cella server at " + config.server() + ": " + e.getMessage(), "TIMEOUT", 0, null, null, null, e);
            } catch (HttpTimeoutException e) {
                throw new CellaTimeoutException("timed out waiting for the Cella server: " + e.getMessage(), "TIMEOUT", 0, null, null, null, e);
            } catch (IOException e) {
                boolean quick = System.nanoTime() - started < 1_000_000_000L;
                if (!resent && (body == null || body.replayable) && (IDEMPOTENT.contains(method) || quick)) {
                    resent = true;
                    continue;
                }
                throw new CellaConnectionException("could not talk to the Cella server at " + config.server() + ": " + e, "CONNECTION_ERROR", 0, null, null, null, e);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new CellaException("interrupted", "INTERRUPTED", 0, null, null, null, e);
            }
            int status = resp.statusCode();
            String requestId = resp.headers().firstValue("x-request-id").orElse(null);
            if (status < 400) return resp;
            byte[] data;
            try (InputStream in = resp.body()) {
                data = in.readAllBytes();
            } catch (IOException e) {
                data = new byte[0];
            }
            Duration retryAfter = Errors.parseRetryAfter(resp.headers().firstValue("retry-after").orElse(null));
            CellaException err = Errors.fromBody(status, data, requestId, retryAfter);
            if (status == 429 && attempt < config.maxRetries() && (body == null || body.replayable)) {
                attempt++;
                Duration wait = retryAfter == null ? Duration.ofSeconds(1) : retryAfter;
                if (wait.compareTo(config.maxRetryWait()) > 0) wait = config.maxRetryWait();
                sleep(wait);
                continue;
            }
            throw err;
        }
    }

    static CellaException wrapRead(Throwable e, String requestId) {
        Throwable c = e;
        while (c.getCause() != null && !(c instanceof IOException) && !(c instanceof CellaException)) c = c.getCause();
        if (c instanceof CellaException) return (CellaException) c;
        if (c instanceof HttpTimeoutException) return new CellaTimeoutException("timed out reading the answer: " + c.getMessage(), "TIMEOUT", 0, requestId, null, null, c);
        return new CellaConnectionException("the connection to the Cella server broke: " + c, "CONNECTION_ERROR", 0, requestId, null, null, c);
    }

    static void sleep(Duration d) {
        try {
            Thread.sleep(Math.max(0, d.toMillis()));
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new CellaException("interrupted", "INTERRUPTED", 0, null, null, null, e);
        }
    }

    /** The answer's bytes. */
    byte[] request(String method, String path, Query query, Body body, Duration timeout) {
        HttpResponse<InputStream> resp = send(method, path, query, body, timeout, "application/json");
        try (InputStream in = resp.body()) {
            return in.readAllBytes();
        } catch (IOException e) {
            throw wrapRead(e, resp.headers().firstValue("x-request-id").orElse(null));
        }
    }

    byte[] request(String method, String path, Query query, Body body) {
        return request(method, path, query, body, config.requestTimeout());
    }

    /** The whole JSON answer. */
    JsonNode json(String method, String path, Query query, Body body, Duration timeout) {
        return Json.parse(request(method, path, query, body, timeout));
    }

    /** The {@code data} of a JSON answer. */
    JsonNode data(String method, String path, Query query, Body body, Duration timeout) {
        return json(method, path, query, body, timeout).path("data");
    }

    JsonNode data(String method, String path, Query query, Body body) {
        return data(method, path, query, body, config.requestTimeout());
    }

    JsonNode data(String method, String path) {
        return data(method, path, null, null);
    }

    /** An answer whose body is read as it comes (events, downloads). */
    HttpResponse<InputStream> stream(String method, String path, Query query, Body body, Duration timeout, String accept) {
        return send(method, path, query, body, timeout, accept);
    }

    /** Every item of a paginated list, or the first {@code limit}. */
    List<JsonNode> pages(String path, Query base, Integer limit) {
        List<JsonNode> found = new ArrayList<>();
        String cursor = null;
        while (true) {
            Query q = new Query();
            q.items.addAll(base == null ? List.of() : base.items);
            if (limit != null) q.add("limit", Math.max(1, Math.min(1000, limit - found.size())));
            q.add("cursor", cursor);
            JsonNode page = json("GET", path, q, null, config.requestTimeout());
            page.path("data").forEach(found::add);
            cursor = Json.text(page, "next_cursor");
            if (cursor == null || cursor.isEmpty() || (limit != null && found.size() >= limit)) {
                return limit != null && found.size() > limit ? found.subList(0, limit) : found;
            }
        }
    }
}
