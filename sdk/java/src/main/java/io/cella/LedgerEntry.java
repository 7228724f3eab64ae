package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.List;
import java.util.Map;

/** An entry of a workspace's ledger: a credit, a charge or a refund. */
public final class LedgerEntry extends Model {
    LedgerEntry(JsonNode raw) {
        super(raw);
    }

    public String id() { return str("id"); }

    public String at() { return str("at"); }

    /** {@code credit}, {@code compute}, {@code model} or {@code refund}. */
    public String kind() { return str("kind"); }

    /** Positive for credits and refunds, negative for charges. */
    public String amount() { return str("amount"); }

    public String balanceAfter() { return str("balance_after"); }

    public String sandboxId() { return str("sandbox_id"); }

    public String taskId() { return str("task_id"); }

    public String reference() { return str("reference"); }
}
