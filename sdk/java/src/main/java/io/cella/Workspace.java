package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.util.List;

/**
 * Workspaces and their money: settings, members, wallet, ledger, usage and storage. Reading the wallet,
 * the ledger and the usage needs an admin key of the workspace (or the operator's); credits are
 * the operator's. Each method has a variant with a {@link ConnectionConfig}.
 */
public final class Workspace {
    private Workspace() {}

    private static String path(String id, String rest) { return "/workspaces/" + Transport.seg(id) + rest; }

    /** The workspaces the key may see (the operator: all). */
    public static List<WorkspaceInfo> list(ConnectionConfig connection) {
        return Json.list(Json.tree(new Transport(connection).pages("/workspaces", null, null)), WorkspaceInfo::new);
    }

    /** Make a workspace (operator). {@code plan}, {@code kind}: null for the defaults. */
    public static WorkspaceInfo create(String name, String plan, String kind, ConnectionConfig connection) {
        ObjectNode body = Json.object().put("name", name);
        if (plan != null) body.put("plan", plan);
        if (kind != null) body.put("kind", kind);
        return new WorkspaceInfo(new Transport(connection).data("POST", "/workspaces", null, Transport.Body.json(body)));
    }

    public static WorkspaceInfo get(String workspaceId) { return get(workspaceId, null); }

    public static WorkspaceInfo get(String workspaceId, ConnectionConfig connection) {
        return new WorkspaceInfo(new Transport(connection).data("GET", path(workspaceId, "")));
    }

    /** Change a workspace: {@code {"name"?, "plan"?, "settings"?: {...}}} (settings are merged). */
    public static WorkspaceInfo update(String workspaceId, Object changes, ConnectionConfig connection) {
        return new WorkspaceInfo(new Transport(connection).data("PATCH", path(workspaceId, ""), null, Transport.Body.json(Json.tree(changes))));
    }

    /** Change some settings ({@code tasks_enabled}, {@code compute_rate}, ...), the others kept. */
    public static WorkspaceInfo updateSettings(String workspaceId, Object settings, ConnectionConfig connection) {
        ObjectNode body = Json.object();
        body.set("settings", Json.tree(settings));
        return update(workspaceId, body, connection);
    }

    /** The balance, what is reserved and what is available. */
    public static WalletInfo wallet(String workspaceId) { return wallet(workspaceId, null); }

    public static WalletInfo wallet(String workspaceId, ConnectionConfig connection) {
        return new WalletInfo(new Transport(connection).data("GET", path(workspaceId, "/wallet")));
    }

    /** Add funds (operator): {@code amount} a decimal string ({@code "12.5"}), {@code reference} a note. Answers the ledger entry. */
    public static LedgerEntry addCredits(String workspaceId, String amount, String reference, ConnectionConfig connection) {
        ObjectNode body = Json.object().put("amount", amount).put("reference", reference);
        return new LedgerEntry(new Transport(connection).data("POST", path(workspaceId, "/wallet/credits"), null, Transport.Body.json(body)));
    }

    /** The ledger, newest first ({@code limit} null: every entry). */
    public static List<LedgerEntry> ledger(String workspaceId) { return ledger(workspaceId, null, null); }

    public static List<LedgerEntry> ledger(String workspaceId, Integer limit, ConnectionConfig connection) {
        return Json.list(Json.tree(new Transport(connection).pages(path(workspaceId, "/ledger"), null, limit)), LedgerEntry::new);
    }

    /** Usage per UTC day in {@code [from, to)} (RFC 3339 times or dates; null: the last 30 days). */
    public static UsageReport usage(String workspaceId, String from, String to) { return usage(workspaceId, from, to, null); }

    public static UsageReport usage(String workspaceId, String from, String to, ConnectionConfig connection) {
        return new UsageReport(new Transport(connection).data("GET", path(workspaceId, "/usage"), Transport.Query.of().add("from", from).add("to", to), null));
    }

    /** What the workspace stores against its storage quota, in bytes. */
    public static JsonNode storage(String workspaceId, ConnectionConfig connection) {
        return new Transport(connection).data("GET", path(workspaceId, "/storage"));
    }

    private static String memberPath(String workspaceId, String userId) {
        return "/workspaces/" + Transport.seg(workspaceId) + "/members" + (userId == null ? "" : "/" + Transport.seg(userId));
    }

    /** A workspace's members, in the order they joined. */
    public static List<Member> members(String workspaceId, ConnectionConfig connection) {
        return Json.list(Json.tree(new Transport(connection).pages(memberPath(workspaceId, null), null, null)), Member::new);
    }

    /** Add an existing user by email with a role (admin). */
    public static Member addMember(String workspaceId, String email, String role, ConnectionConfig connection) {
        return new Member(new Transport(connection).data("POST", memberPath(workspaceId, null), null, Transport.Body.json(Json.object().put("email", email).put("role", role))));
    }

    /** Change a member's role (admin). */
    public static Member updateMember(String workspaceId, String userId, String role, ConnectionConfig connection) {
        return new Member(new Transport(connection).data("PATCH", memberPath(workspaceId, userId), null, Transport.Body.json(Json.object().put("role", role))));
    }

    /** Remove a member (admin), or leave (a signed-in user removing themselves). */
    public static Member removeMember(String workspaceId, String userId, ConnectionConfig connection) {
        return new Member(new Transport(connection).data("DELETE", memberPath(workspaceId, userId)));
    }
}
