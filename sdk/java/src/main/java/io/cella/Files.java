package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.IOException;
import java.io.InputStream;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;

/** The sandbox's filesystem: {@code sandbox.files()}. Paths are absolute paths inside it. */
public final class Files {
    private final Sandbox sandbox;

    Files(Sandbox sandbox) {
        this.sandbox = sandbox;
    }

    private Transport t() { return sandbox.transport; }

    private String path(String... rest) { return Transport.sandboxPath(sandbox.id(), rest.length == 0 ? new String[] {"files"} : prepend(rest)); }

    private static String[] prepend(String[] rest) {
        String[] out = new String[rest.length + 1];
        out[0] = "files";
        System.arraycopy(rest, 0, out, 1, rest.length);
        return out;
    }

    /** A text file's content (UTF-8). */
    public String read(String path) { return new String(readBytes(path), StandardCharsets.UTF_8); }

    /** A file's bytes. */
    public byte[] readBytes(String path) {
        return t().request("GET", path(), Transport.Query.of().add("path", path), null, null);
    }

    /**
     * Part of a file: {@code range} is one range of bytes as HTTP writes it, {@code "10-19"} (bytes
     * 10 to 19; an end past the file is cut to it), {@code "10-"} (from byte 10 on) or {@code "-100"}
     * (the last 100 bytes); a {@code bytes=} prefix may be given. A range outside the file throws
     * {@link RangeNotSatisfiableException} (its {@code details().path("size")} is the file's size).
     */
    public byte[] readBytes(String path, String range) {
        String header = range.startsWith("bytes=") ? range : "bytes=" + range;
        HttpResponse<InputStream> resp = t().send("GET", path(), Transport.Query.of().add("path", path), null, t().config.requestTimeout(),
                "application/octet-stream", Map.of("Range", header));
        try (InputStream in = resp.body()) {
            return in.readAllBytes();
        } catch (IOException e) {
            throw Transport.wrapRead(e, resp.headers().firstValue("x-request-id").orElse(null));
        }
    }

    /**
     * A file's bytes as they come. Errors before the first byte (404, 409, ...) are thrown here;
     * reading throws {@link IOException} as streams do. Close it when done.
     */
    public InputStream openInputStream(String path) {
        HttpResponse<InputStream> resp = t().stream("GET", path(), Transport.Query.of().add("path", path), null, null, "application/octet-stream");
        return resp.body();
    }

    /** Download a file to a local path. */
    public void download(String path, Path local) throws IOException {
        try (InputStream in = openInputStream(path)) {
            java.nio.file.Files.copy(in, local, java.nio.file.StandardCopyOption.REPLACE_EXISTING);
        }
    }

    /** Write a text file (whole or nothing; missing parents are made). */
    public EntryInfo write(String path, String text) { return write(path, text.getBytes(StandardCharsets.UTF_8), null, null); }

    public EntryInfo write(String path, byte[] data) { return write(path, data, null, null); }

    /** Write a file owned by {@code user} ({@code user} or {@code root}; null: user) with {@code mode} (octal text like {@code "0755"}; null: 0644). */
    public EntryInfo write(String path, byte[] data, String user, String mode) {
        return new EntryInfo(t().data("PUT", path(), query(path, user, mode), Transport.Body.bytes(data)));
    }

    /** Write what {@code in} holds ({@code length} bytes, or -1 if unknown: sent chunked), streamed. */
    public EntryInfo write(String path, InputStream in, long length) {
        return new EntryInfo(t().data("PUT", path(), query(path, null, null), Transport.Body.stream(() -> in, length), null));
    }

    /** Upload a local file. */
    public EntryInfo upload(Path local, String path) throws IOException {
        long size = java.nio.file.Files.size(local);
        try (InputStream in = java.nio.file.Files.newInputStream(local)) {
            return write(path, in, size);
        }
    }

    private static Transport.Query query(String path, String user, String mode) {
        return Transport.Query.of().add("path", path).add("user", user).add("mode", mode);
    }

    /**
     * An output stream whose bytes are uploaded to {@code path} as they are written; the file is
     * in place (whole or nothing) once {@link FileUpload#close()} returns.
     */
    public FileUpload openOutputStream(String path) { return openOutputStream(path, null, null); }

    public FileUpload openOutputStream(String path, String user, String mode) {
        return new FileUpload(t(), path(), query(path, user, mode));
    }

    /** A directory's entries, sorted by path. */
    public List<EntryInfo> list(String path) { return list(path, false); }

    /** A directory's entries (the whole tree with {@code recursive}). */
    public List<EntryInfo> list(String path, boolean recursive) {
        JsonNode page = t().json("GET", path("list"), Transport.Query.of().add("path", path).flag("recursive", recursive), null, t().config.requestTimeout());
        return Json.list(page.path("data"), EntryInfo::new);
    }

    /** One path's entry (a symlink is described, not followed). */
    public EntryInfo stat(String path) { return new EntryInfo(t().data("GET", path("stat"), Transport.Query.of().add("path", path), null)); }

    public boolean exists(String path) {
        try {
            stat(path);
            return true;
        } catch (NotFoundException e) {
            return false;
        }
    }

    /** Remove a file, a link or an empty directory. */
    public void remove(String path) { remove(path, false); }

    /** Remove; with {@code recursive}, any directory. */
    public void remove(String path, boolean recursive) {
        t().request("DELETE", path(), Transport.Query.of().add("path", path).flag("recursive", recursive), null);
    }

    /** Make a directory and its missing parents (fine if it exists). */
    public EntryInfo makeDir(String path) {
        return new EntryInfo(t().data("POST", path("mkdir"), null, Transport.Body.json(Json.object().put("path", path))));
    }

    /** Move {@code from} to {@code to}; answers the entry at {@code to}. */
    public EntryInfo rename(String from, String to) {
        return new EntryInfo(t().data("POST", path("move"), null, Transport.Body.json(Json.object().put("from", from).put("to", to))));
    }

    /** Follow the changes in a directory (the watch is in place when this returns). */
    public WatchHandle watch(String path) { return watch(path, false); }

    public WatchHandle watch(String path, boolean recursive) {
        HttpResponse<InputStream> resp = t().stream("GET", path("watch"), Transport.Query.of().add("path", path).flag("recursive", recursive), null, null, "text/event-stream");
        return new WatchHandle(new EventStream(resp));
    }
}
