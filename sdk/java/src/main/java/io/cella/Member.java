package io.cella;

import com.fasterxml.jackson.databind.JsonNode;

/** A member of an organization workspace, with a role ({@code owner}, {@code admin}, {@code member}). */
public final class Member extends Model {
    Member(JsonNode raw) {
        super(raw);
    }

    public String userId() { return str("user_id"); }

    public String email() { return str("email"); }

    public String name() { return str("name"); }

    public String role() { return str("role"); }
}
