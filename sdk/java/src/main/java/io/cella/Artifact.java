package io.cella;

import java.io.InputStream;
import java.util.List;

/**
 * Files kept from sandboxes (by {@link Sandbox#run} or {@link Sandbox#collectArtifacts}) until
 * they expire. Each method has a variant with a {@link ConnectionConfig}.
 */
public final class Artifact {
    private Artifact() {}

    /** The workspace's artifacts, newest first ({@code sandboxId} null: every sandbox's). */
    public static List<ArtifactInfo> list(String sandboxId) { return list(sandboxId, null); }

    public static List<ArtifactInfo> list(String sandboxId, ConnectionConfig connection) {
        return Json.list(Json.tree(new Transport(connection).pages("/artifacts", Transport.Query.of().add("sandbox_id", sandboxId), null)), ArtifactInfo::new);
    }

    /** The artifact's bytes. */
    public static byte[] download(String artifactId) { return download(artifactId, null); }

    public static byte[] download(String artifactId, ConnectionConfig connection) {
        return new Transport(connection).request("GET", "/artifacts/" + Transport.seg(artifactId), null, null, null);
    }

    /** The artifact's bytes as they come (close the stream when done). */
    public static InputStream openInputStream(String artifactId, ConnectionConfig connection) {
        return new Transport(connection).stream("GET", "/artifacts/" + Transport.seg(artifactId), null, null, null, "application/octet-stream").body();
    }

    public static ArtifactInfo delete(String artifactId) { return delete(artifactId, null); }

    public static ArtifactInfo delete(String artifactId, ConnectionConfig connection) {
        return new ArtifactInfo(new Transport(connection).data("DELETE", "/artifacts/" + Transport.seg(artifactId)));
    }
}
