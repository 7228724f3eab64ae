package io.cella;

import com.fasterxml.jackson.databind.JsonNode;

/** A container image uploaded to the workspace; templates build on it with {@code "image": reference()}. */
public final class ImageInfo extends Model {
    ImageInfo(JsonNode raw) {
        super(raw);
    }

    public String id() { return str("id"); }

    /** {@code upload:<id>}: what a template spec's {@code image} names. */
    public String reference() { return str("reference"); }

    public String name() { return str("name"); }

    public String digest() { return str("digest"); }

    public JsonNode layers() { return raw.path("layers"); }
}
