package io.cella;

import static org.junit.jupiter.api.Assertions.*;

import java.io.InputStream;
import java.io.OutputStream;
import java.security.MessageDigest;
import java.time.Duration;
import java.util.HexFormat;
import java.util.List;
import java.util.Optional;
import java.util.Random;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;

@ExtendWith(TestServer.class)
class FilesTest {
    static Sandbox sb;

    @BeforeAll
    static void up() { sb = TestServer.sandbox(); }

    @AfterAll
    static void down() { sb.close(); }

    static String sha256(byte[] b) throws Exception {
        return HexFormat.of().formatHex(MessageDigest.getInstance("SHA-256").digest(b));
    }

    @Test
    void tenMebibytesRoundTripWithChecksum() throws Exception {
        byte[] data = new byte[10 * 1024 * 1024];
        new Random(21).nextBytes(data);
        String sum = sha256(data);
        EntryInfo e = sb.files().write("/home/user/big.bin", data);
        assertEquals(data.length, e.size());
        // The sandbox computes the same checksum.
        assertEquals(sum, sb.commands().run("sha256sum /home/user/big.bin | cut -d' ' -f1").stdout().trim());
        assertEquals(sum, sha256(sb.files().readBytes("/home/user/big.bin")));
        // Streamed both ways.
        try (FileUpload out = sb.files().openOutputStream("/home/user/big2.bin")) {
            for (int off = 0; off < data.length; off += 100_000) out.write(data, off, Math.min(100_000, data.length - off));
            out.close();
            assertEquals(data.length, out.entry().size());
        }
        MessageDigest md = MessageDigest.getInstance("SHA-256");
        try (InputStream in = sb.files().openInputStream("/home/user/big2.bin")) {
            byte[] buf = new byte[65536];
            for (int n; (n = in.read(buf)) > 0; ) md.update(buf, 0, n);
        }
        assertEquals(sum, HexFormat.of().formatHex(md.digest()));
        // Local files both ways.
        java.nio.file.Path dir = java.nio.file.Files.createTempDirectory("cella-java-files-");
        try {
            sb.files().download("/home/user/big2.bin", dir.resolve("down.bin"));
            assertEquals(sum, sha256(java.nio.file.Files.readAllBytes(dir.resolve("down.bin"))));
            assertEquals(data.length, sb.files().upload(dir.resolve("down.bin"), "/home/user/big3.bin").size());
            assertEquals(sum, sb.commands().run("sha256sum /home/user/big3.bin | cut -d' ' -f1").stdout().trim());
        } finally {
            CellaServer.deleteTree(dir.toFile());
        }
    }

    @Test
    void uploadsOverTheLimitAre413() throws Exception {
        byte[] big = new byte[(int) TestServer.MAX_UPLOAD + 1024];
        PayloadTooLargeException e = assertThrows(PayloadTooLargeException.class, () -> sb.files().write("/home/user/too-big.bin", big));
        assertEquals(413, e.status());
        assertEquals(TestServer.MAX_UPLOAD, e.details().path("limit").asLong());
        // Streamed without a length: cut off at the limit, the same typed error (the server
        // drains what follows for a while, so the client reads the answer).
        assertThrows(PayloadTooLargeException.class, () -> {
            try (FileUpload out = sb.files().openOutputStream("/home/user/too-big.bin")) {
                for (int i = 0; i < 20; i++) out.write(big, 0, 1024 * 1024);
            }
        });
        assertFalse(sb.files().exists("/home/user/too-big.bin"), "a refused upload leaves nothing behind");
    }

    @Test
    void rangedReads() {
        sb.files().write("/home/user/digits.txt", "0123456789");
        assertEquals("234", new String(sb.files().readBytes("/home/user/digits.txt", "2-4")));
        assertEquals("789", new String(sb.files().readBytes("/home/user/digits.txt", "bytes=7-")));
        assertEquals("789", new String(sb.files().readBytes("/home/user/digits.txt", "-3")));
        assertEquals("89", new String(sb.files().readBytes("/home/user/digits.txt", "8-99")));
        RangeNotSatisfiableException e = assertThrows(RangeNotSatisfiableException.class, () -> sb.files().readBytes("/home/user/digits.txt", "10-"));
        assertEquals(416, e.status());
        assertEquals(10, e.details().path("size").asLong());
    }

    @Test
    void directoriesAndEntries() {
        sb.files().makeDir("/home/user/d/sub");
        sb.files().write("/home/user/d/a.txt", "a");
        sb.files().write("/home/user/d/run.sh", "#!/bin/sh\necho ran\n".getBytes(), null, "0755");
        assertEquals("ran\n", sb.commands().run("/home/user/d/run.sh").stdout());
        assertEquals("0755", sb.files().stat("/home/user/d/run.sh").mode());
        List<EntryInfo> l = sb.files().list("/home/user/d");
        assertEquals(List.of("a.txt", "run.sh", "sub"), l.stream().map(EntryInfo::name).toList());
        assertTrue(l.get(2).isDir());
        assertEquals("/home/user/d/b.txt", sb.files().rename("/home/user/d/a.txt", "/home/user/d/b.txt").path());
        assertFalse(sb.files().exists("/home/user/d/a.txt"));
        assertEquals("a", sb.files().read("/home/user/d/b.txt"));
        assertThrows(ConflictException.class, () -> sb.files().remove("/home/user/d"));
        sb.files().remove("/home/user/d", true);
        assertFalse(sb.files().exists("/home/user/d"));
        NotFoundException nf = assertThrows(NotFoundException.class, () -> sb.files().read("/home/user/nope"));
        assertEquals(404, nf.status());
        assertNotNull(nf.requestId());
    }

    @Test
    void watch() {
        sb.files().makeDir("/home/user/w");
        try (WatchHandle w = sb.files().watch("/home/user/w", true)) {
            sb.files().write("/home/user/w/new.txt", "x");
            Optional<FilesystemEvent> e = w.next(Duration.ofSeconds(20));
            assertTrue(e.isPresent(), "no event");
            assertEquals("create", e.get().type());
            assertEquals("/home/user/w/new.txt", e.get().path());
            sb.files().remove("/home/user/w/new.txt");
            FilesystemEvent d = w.next(Duration.ofSeconds(20)).orElseThrow();
            while (!d.type().equals("delete")) d = w.next(Duration.ofSeconds(20)).orElseThrow();
            assertEquals("/home/user/w/new.txt", d.path());
        }
    }
}
