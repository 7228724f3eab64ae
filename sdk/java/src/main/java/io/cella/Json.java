package io.cella;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.MissingNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.function.Function;

/** JSON helpers (Jackson) shared by the SDK. */
public final class Json {
    /** The one mapper of the SDK. */
    public static final ObjectMapper MAPPER = new ObjectMapper();
    static final JsonNode MISSING = MissingNode.getInstance();

    private Json() {}

    /** A new empty JSON object, to build request bodies such as a template spec. */
    public static ObjectNode object() { return MAPPER.createObjectNode(); }

    /** A new empty JSON array. */
    public static ArrayNode array() { return MAPPER.createArrayNode(); }

    /** Any value (maps, lists, strings, numbers, JsonNode) as a JSON tree. */
    public static JsonNode tree(Object value) { return value instanceof JsonNode ? (JsonNode) value : MAPPER.valueToTree(value); }

    /** The object under {@code field} of {@code parent}, made if it is not there. */
    static ObjectNode child(ObjectNode parent, String field) {
        JsonNode n = parent.get(field);
        return n instanceof ObjectNode ? (ObjectNode) n : parent.putObject(field);
    }

    /** Parse JSON text. */
    public static JsonNode parse(String text) {
        try {
            return MAPPER.readTree(text);
        } catch (JsonProcessingException e) {
            throw new CellaException("not JSON: " + e.getOriginalMessage(), "INVALID_JSON", 0, null, null, null, e);
        }
    }

    static JsonNode parse(byte[] bytes) {
        try {
            JsonNode n = MAPPER.readTree(bytes);
            return n == null ? MISSING : n;
        } catch (IOException e) {
            throw new CellaException("the server answered something that is not JSON: " + new String(bytes, 0, Math.min(bytes.length, 200), StandardCharsets.UTF_8), "INVALID_JSON", 0, null, null, null, e);
        }
    }

    static byte[] bytes(JsonNode node) {
        try {
            return MAPPER.writeValueAsBytes(node);
        } catch (JsonProcessingException e) {
            throw new IllegalArgumentException(e);
        }
    }

    static String text(JsonNode n, String field) {
        JsonNode v = n.path(field);
        return v.isNull() || v.isMissingNode() ? null : v.asText();
    }

    static Long longOrNull(JsonNode n, String field) {
        JsonNode v = n.path(field);
        return v.isNumber() ? v.asLong() : null;
    }

    static Map<String, String> stringMap(JsonNode n) {
        if (!n.isObject()) return Collections.emptyMap();
        Map<String, String> out = new LinkedHashMap<>();
        n.fields().forEachRemaining(e -> out.put(e.getKey(), e.getValue().asText()));
        return Collections.unmodifiableMap(out);
    }

    static List<String> stringList(JsonNode n) {
        List<String> out = new ArrayList<>();
        if (n.isArray()) n.forEach(x -> out.add(x.asText()));
        return Collections.unmodifiableList(out);
    }

    static <T> List<T> list(JsonNode n, Function<JsonNode, T> f) {
        List<T> out = new ArrayList<>();
        if (n != null && n.isArray()) n.forEach(x -> out.add(f.apply(x)));
        return Collections.unmodifiableList(out);
    }
}
