package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.net.HttpCookie;
import java.util.List;

/**
 * People: make a user (the operator, or anyone on a server with open sign-up), sign in for a
 * session, read who is signed in, sign out. Programs normally use API keys instead.
 */
public final class User extends Model {
    User(JsonNode raw) {
        super(raw);
    }

    public String id() { return str("id"); }

    public String email() { return str("email"); }

    public String name() { return str("name"); }

    /** Make a user (and their personal workspace). */
    public static User create(String email, String name, String password, ConnectionConfig connection) {
        ObjectNode body = Json.object().put("email", email).put("name", name).put("password", password);
        return new User(new Transport(connection).data("POST", "/users", null, Transport.Body.json(body)));
    }

    /** Sign in with an email and a password; the session's {@link Session#connection()} acts as that user. */
    public static Session signIn(String email, String password, ConnectionConfig connection) {
        ConnectionConfig anonymous = (connection == null ? ConnectionConfig.fromEnv() : connection).toBuilder().apiKey("").build();
        var resp = new Transport(anonymous).send("POST", "/sessions", null, Transport.Body.json(Json.object().put("email", email).put("password", password)), anonymous.requestTimeout(), "application/json");
        String token = null;
        for (String h : resp.headers().allValues("set-cookie")) {
            for (HttpCookie c : HttpCookie.parse(h)) if (c.getName().equals("cella_session")) token = c.getValue();
        }
        JsonNode data;
        try (var in = resp.body()) {
            data = Json.parse(in.readAllBytes()).path("data");
        } catch (java.io.IOException e) {
            throw Transport.wrapRead(e, null);
        }
        return new Session(data, token, anonymous);
    }

    /** A signed-in session: its user, CSRF token and a connection that uses it. */
    public static final class Session extends Model {
        private final String token;
        private final ConnectionConfig base;

        Session(JsonNode raw, String token, ConnectionConfig base) {
            super(raw);
            this.token = token;
            this.base = base;
        }

        public User user() { return new User(raw.path("user")); }

        public String csrfToken() { return str("csrf_token"); }

        public String expiresAt() { return str("expires_at"); }

        /** A connection that sends the session cookie and the CSRF token. */
        public ConnectionConfig connection() {
            return base.toBuilder().apiKey("").header("Cookie", "cella_session=" + token).header("x-csrf-token", csrfToken()).build();
        }

        /** The user, their workspaces with their role in each, and the CSRF token. */
        public JsonNode me() { return new Transport(connection()).data("GET", "/me"); }

        /** The workspaces of the signed-in user, as {@code {"workspace", "role"}} objects. */
        public List<JsonNode> workspaces() { return Json.list(me().path("workspaces"), n -> n); }

        /** End the session. */
        public void signOut() { new Transport(connection()).data("DELETE", "/sessions/current"); }
    }
}
