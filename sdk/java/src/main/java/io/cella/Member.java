package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.List;

/** A member of an organization workspace, with a role ({@code owner}, {@code admin}, {@code member}). */
public final class Member extends Model {
    Member(JsonNode raw) {
        super(raw);
    }

    public String userId() { return str("user_id"); }

    public String email() { return str("email"); }

    public String name() { return str("name"); }

    public String role() { return str("role"); }

    private static String path(String workspaceId, String userId) {
        return "/workspaces/" + Transport.seg(workspaceId) + "/members" + (userId == null ? "" : "/" + Transport.seg(userId));
    }

    /** A workspace's members, in the order they joined. */
    public static List<Member> list(String workspaceId, ConnectionConfig connection) {
        return Json.list(Json.tree(new Transport(connection).pages(path(workspaceId, null), null, null)), Member::new);
    }

    /** Add an existing user by email with a role (admin). */
    public static Member add(String workspaceId, String email, String role, ConnectionConfig connection) {
        return new Member(new Transport(connection).data("POST", path(workspaceId, null), null, Transport.Body.json(Json.object().put("email", email).put("role", role))));
    }

    /** Change a member's role (admin). */
    public static Member update(String workspaceId, String userId, String role, ConnectionConfig connection) {
        return new Member(new Transport(connection).data("PATCH", path(workspaceId, userId), null, Transport.Body.json(Json.object().put("role", role))));
    }

    /** Remove a member (admin), or leave (a signed-in user removing themselves). */
    public static Member remove(String workspaceId, String userId, ConnectionConfig connection) {
        return new Member(new Transport(connection).data("DELETE", path(workspaceId, userId)));
    }
}
