package io.cella;

import static org.junit.jupiter.api.Assertions.*;

import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;

/** The server, users and sessions, members, API keys and images. */
@ExtendWith(TestServer.class)
class AdminTest {
    @Test
    void serverHealthAndOpenapi() {
        assertEquals("ok", Server.health(TestServer.admin()).path("status").asText());
        assertTrue(Server.openapi(TestServer.admin()).path("paths").has("/api/v1/sandboxes"));
    }

    @Test
    void usersSessionsAndMembers() {
        CellaServer s = TestServer.get();
        User ann = User.create("ann-java@example.org", "Ann", "correct horse battery", s.admin());
        assertTrue(ann.id().startsWith("usr"), ann.toString());
        assertThrows(AuthenticationException.class, () -> User.signIn("ann-java@example.org", "wrong password", s.admin()));
        User.Session session = User.signIn("ann-java@example.org", "correct horse battery", s.admin());
        assertEquals(ann.id(), session.user().id());
        assertEquals("ann-java@example.org", session.me().path("user").path("email").asText());
        assertEquals("owner", session.workspaces().get(0).path("role").asText());

        WorkspaceInfo org = Workspace.create("java-org", "business", "organization", s.admin());
        Member m = Workspace.addMember(org.id(), "ann-java@example.org", "member", s.admin());
        assertEquals("member", m.role());
        assertEquals("admin", Workspace.updateMember(org.id(), ann.id(), "admin", s.admin()).role());
        assertEquals(List.of(ann.id()), Workspace.members(org.id(), s.admin()).stream().map(Member::userId).toList());
        assertThrows(ConflictException.class, () -> Workspace.addMember(org.id(), "ann-java@example.org", "member", s.admin()));
        assertEquals(ann.id(), Workspace.removeMember(org.id(), ann.id(), s.admin()).userId());

        session.signOut();
        assertThrows(AuthenticationException.class, session::me);
    }

    @Test
    void apiKeysAndImages() {
        CellaServer s = TestServer.get();
        ApiKeyInfo k = ApiKey.create(s.defaultWorkspace(), "temp", List.of("sandboxes:read"), s.admin());
        assertTrue(k.key().startsWith("cella_"));
        assertTrue(ApiKey.list(s.admin()).stream().anyMatch(x -> x.id().equals(k.id())));
        assertNotNull(k.createdAt());
        assertNull(k.lastUsedAt());
        Sandbox.list(ListOptions.builder().connection(s.connection(k.key())).build());
        assertNotNull(ApiKey.list(s.admin()).stream().filter(x -> x.id().equals(k.id())).findFirst().orElseThrow().lastUsedAt());
        ApiKey.revoke(k.id(), s.admin());
        assertThrows(AuthenticationException.class, () -> Sandbox.list(ListOptions.builder().connection(s.connection(k.key())).build()));

        assertTrue(Image.list(s.admin()).isEmpty());
        assertThrows(NotFoundException.class, () -> Image.delete("img000000000000000000", s.admin()));
        assertNotNull(Workspace.storage(s.defaultWorkspace(), s.admin()).get("used_bytes"));
        assertEquals("default", Workspace.get(s.defaultWorkspace(), s.admin()).name());
    }
}
