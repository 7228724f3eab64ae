package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.IOException;
import java.io.InputStream;

/** The server itself: its health and its OpenAPI document. */
public final class Server {
    private Server() {}

    /** {@code GET /healthz}: {@code {"status": "ok", "version"}}. */
    public static JsonNode health(ConnectionConfig connection) {
        Transport t = new Transport(connection);
        java.net.http.HttpRequest req = java.net.http.HttpRequest.newBuilder(java.net.URI.create(t.config.server() + "/healthz")).timeout(t.config.requestTimeout()).build();
        try {
            java.net.http.HttpResponse<byte[]> r = Transport.HTTP.send(req, java.net.http.HttpResponse.BodyHandlers.ofByteArray());
            if (r.statusCode() >= 400) throw Errors.fromBody(r.statusCode(), r.body(), r.headers().firstValue("x-request-id").orElse(null), null);
            return Json.parse(r.body());
        } catch (IOException e) {
            throw new CellaConnectionException("could not reach the Cella server at " + t.config.server() + ": " + e, "CONNECTION_ERROR", 0, null, null, null, e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new CellaException("interrupted", "INTERRUPTED", 0, null, null, null, e);
        }
    }

    /** The server's OpenAPI document. */
    public static JsonNode openapi(ConnectionConfig connection) {
        Transport t = new Transport(connection);
        try (InputStream in = t.send("GET", "/openapi.json", null, null, t.config.requestTimeout(), "application/json").body()) {
            return Json.parse(in.readAllBytes());
        } catch (IOException e) {
            throw Transport.wrapRead(e, null);
        }
    }
}
