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

    /** A compute charge's billed seconds, else null. */
    public Long computeSec() { return numOrNull("compute_sec"); }

    /** A compute charge's rate per second, else null. */
    public String computeRate() { return str("compute_rate"); }

    /** A model charge's model, else null. */
    public String model() { return str("model"); }

    /** A model charge's tokens, else null. */
    public Long inputTokens() { return numOrNull("input_tokens"); }

    public Long outputTokens() { return numOrNull("output_tokens"); }
}
