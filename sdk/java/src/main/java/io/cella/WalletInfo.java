package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.List;
import java.util.Map;

/** A workspace's wallet. Amounts are decimal strings with 6 decimals ({@code "12.500000"}); use {@link java.math.BigDecimal} to compute with them. */
public final class WalletInfo extends Model {
    WalletInfo(JsonNode raw) {
        super(raw);
    }

    public String balance() { return str("balance"); }

    public String reserved() { return str("reserved"); }

    public String available() { return str("available"); }

    public String currency() { return str("currency"); }
}
