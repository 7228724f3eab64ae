package io.cella;

import java.io.IOException;
import java.io.InputStream;
import java.nio.file.Path;
import java.util.List;

/** Container images uploaded from disk (an OCI archive or a {@code docker save} tarball), for custom templates. */
public final class Image {
    private Image() {}

    /** Upload an image archive under {@code name}. */
    public static ImageInfo importTar(String name, Path archive, ConnectionConfig connection) throws IOException {
        long size = java.nio.file.Files.size(archive);
        try (InputStream in = java.nio.file.Files.newInputStream(archive)) {
            return new ImageInfo(new Transport(connection).data("POST", "/images", Transport.Query.of().add("name", name), Transport.Body.stream(() -> in, size), null));
        }
    }

    /** The workspace's images, oldest first. */
    public static List<ImageInfo> list(ConnectionConfig connection) {
        return Json.list(new Transport(connection).data("GET", "/images"), ImageInfo::new);
    }

    /** Delete an image (templates built on it keep working). */
    public static ImageInfo delete(String imageId, ConnectionConfig connection) {
        return new ImageInfo(new Transport(connection).data("DELETE", "/images/" + Transport.seg(imageId)));
    }
}
