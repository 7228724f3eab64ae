package io.cella;

import com.fasterxml.jackson.databind.node.ObjectNode;
import java.util.List;

/** API keys (admin): make, list, revoke. */
public final class ApiKey {
    private ApiKey() {}

    /** Make a key of a workspace with these scopes; its secret is {@link ApiKeyInfo#key()}, shown only now. */
    public static ApiKeyInfo create(String workspaceId, String name, List<String> scopes, ConnectionConfig connection) {
        ObjectNode body = Json.object().put("workspace_id", workspaceId).put("name", name);
        body.set("scopes", Json.tree(scopes));
        return new ApiKeyInfo(new Transport(connection).data("POST", "/api-keys", null, Transport.Body.json(body)));
    }

    public static List<ApiKeyInfo> list(ConnectionConfig connection) {
        return Json.list(Json.tree(new Transport(connection).pages("/api-keys", null, null)), ApiKeyInfo::new);
    }

    /** Revoke a key: the next request made with it gets 401. */
    public static ApiKeyInfo revoke(String keyId, ConnectionConfig connection) {
        return new ApiKeyInfo(new Transport(connection).data("DELETE", "/api-keys/" + Transport.seg(keyId)));
    }
}
