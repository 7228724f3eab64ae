package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.nio.charset.StandardCharsets;
import java.util.Base64;

/** A rich output of a code cell: an image, HTML, JSON, ... */
public final class RichOutput extends Model {
    RichOutput(JsonNode raw) {
        super(raw);
    }

    /** Its MIME type, e.g. {@code image/png}, {@code text/html}. */
    public String mime() { return str("mime"); }

    /** Its data as sent: text, or base64 for binary types. */
    public String data() { return raw.path("data").asText(""); }

    /** True for types sent as base64 (images other than SVG, octet streams). */
    public boolean isBinary() {
        String m = mime() == null ? "" : mime();
        return (m.startsWith("image/") && !m.equals("image/svg+xml")) || m.equals("application/octet-stream") || m.equals("application/pdf");
    }

    /** The bytes: decoded from base64 for binary types, else the text's UTF-8 bytes. */
    public byte[] bytes() {
        return isBinary() ? Base64.getMimeDecoder().decode(data()) : data().getBytes(StandardCharsets.UTF_8);
    }
}
