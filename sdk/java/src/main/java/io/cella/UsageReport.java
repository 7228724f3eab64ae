package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.List;
import java.util.Map;

/** A workspace's usage per UTC day, from its ledger. */
public final class UsageReport extends Model {
    UsageReport(JsonNode raw) {
        super(raw);
    }

    public String from() { return str("from"); }

    public String to() { return str("to"); }

    public String currency() { return str("currency"); }

    /** The days with usage, oldest first: {@code date}, {@code compute_sec}, {@code compute_cost}, {@code model_requests}, ... */
    public JsonNode days() { return raw.path("days"); }

    public JsonNode totals() { return raw.path("totals"); }
}
