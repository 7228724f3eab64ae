package io.cella;

import java.nio.charset.StandardCharsets;
import java.util.Base64;

/** A piece of a command's output: which stream, and its bytes. */
public final class OutputChunk {
    private final String stream;
    private final byte[] data;

    OutputChunk(String stream, byte[] data) {
        this.stream = stream;
        this.data = data;
    }

    /** The bytes of a {@code stdout}/{@code stderr} event: a JSON string, or {@code {"b64": ...}}. */
    static byte[] decode(String json) {
        com.fasterxml.jackson.databind.JsonNode n = Json.parse(json);
        if (n.isTextual()) return n.asText().getBytes(StandardCharsets.UTF_8);
        if (n.has("b64")) return Base64.getDecoder().decode(n.get("b64").asText());
        return new byte[0];
    }

    /** {@code "stdout"} or {@code "stderr"}. */
    public String stream() { return stream; }

    public boolean isStdout() { return "stdout".equals(stream); }

    public boolean isStderr() { return "stderr".equals(stream); }

    /** The raw bytes. */
    public byte[] bytes() { return data.clone(); }

    /** The bytes as UTF-8 text (bytes that are not UTF-8 become U+FFFD). */
    public String text() { return new String(data, StandardCharsets.UTF_8); }

    @Override
    public String toString() { return stream + ": " + text(); }
}
