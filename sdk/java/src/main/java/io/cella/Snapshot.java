package io.cella;

import java.util.List;

/**
 * The workspace's snapshots. Take one with {@link Sandbox#createSnapshot()}, start a sandbox from
 * one with {@code CreateOptions.builder().snapshot(id)}. Each method has a variant with a {@link
 * ConnectionConfig} (without: the environment's).
 */
public final class Snapshot {
    private Snapshot() {}

    /** The snapshots, newest first. */
    public static List<SnapshotInfo> list() { return list(null); }

    public static List<SnapshotInfo> list(ConnectionConfig connection) {
        return Json.list(Json.tree(new Transport(connection).pages("/snapshots", null, null)), SnapshotInfo::new);
    }

    public static SnapshotInfo get(String snapshotId) { return get(snapshotId, null); }

    public static SnapshotInfo get(String snapshotId, ConnectionConfig connection) {
        return new SnapshotInfo(new Transport(connection).data("GET", "/snapshots/" + Transport.seg(snapshotId)));
    }

    /** Delete a snapshot (sandboxes made from it keep their files); answers it as it was. */
    public static SnapshotInfo delete(String snapshotId) { return delete(snapshotId, null); }

    public static SnapshotInfo delete(String snapshotId, ConnectionConfig connection) {
        return new SnapshotInfo(new Transport(connection).data("DELETE", "/snapshots/" + Transport.seg(snapshotId)));
    }
}
