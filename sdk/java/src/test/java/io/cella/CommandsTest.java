package io.cella;

import static org.junit.jupiter.api.Assertions.*;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.stream.Collectors;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;

@ExtendWith(TestServer.class)
class CommandsTest {
    static Sandbox sb;

    @BeforeAll
    static void up() { sb = TestServer.sandbox(); }

    @AfterAll
    static void down() { sb.close(); }

    @Test
    void streamedCommandComesInPieces() {
        List<OutputChunk> chunks = new ArrayList<>();
        CommandResult r;
        try (CommandStream s = sb.commands().stream("for i in 1 2 3; do echo line$i; sleep 0.2; done; echo err >&2; printf '\\377' >&2; exit 4")) {
            for (OutputChunk c : s) chunks.add(c);
            r = s.result();
        }
        String out = chunks.stream().filter(OutputChunk::isStdout).map(OutputChunk::text).collect(Collectors.joining());
        assertEquals("line1\nline2\nline3\n", out);
        assertTrue(chunks.stream().filter(OutputChunk::isStdout).count() >= 2, "the output came in one piece: " + chunks);
        assertEquals(4, r.exitCode());
        assertEquals("line1\nline2\nline3\n", r.stdout());
        byte[] err = chunks.stream().filter(OutputChunk::isStderr).map(OutputChunk::bytes).reduce(new byte[0], (a, b) -> {
            byte[] c = java.util.Arrays.copyOf(a, a.length + b.length);
            System.arraycopy(b, 0, c, a.length, b.length);
            return c;
        });
        assertArrayEquals(new byte[] {'e', 'r', 'r', '\n', (byte) 0xff}, err);
    }

    @Test
    void callbacksCheckAndStdin() {
        StringBuilder seen = new StringBuilder();
        CommandResult r = sb.commands().run("cat; echo done", ExecOptions.builder().stdin("from stdin\n").onStdout(seen::append).build());
        assertEquals("from stdin\ndone\n", seen.toString());
        assertEquals(0, r.exitCode());
        CommandExitException e = assertThrows(CommandExitException.class, () -> sb.commands().run("echo bad >&2; exit 2", ExecOptions.builder().check(true).build()));
        assertEquals(2, e.exitCode());
        assertEquals("COMMAND_EXIT", e.code());
        CommandResult t = sb.commands().run("sleep 30", ExecOptions.builder().timeout(Duration.ofSeconds(1)).build());
        assertTrue(t.timedOut());
        assertEquals(137, t.exitCode());
        assertEquals("/tmp\n", sb.commands().run("pwd", ExecOptions.builder().cwd("/tmp").build()).stdout());
        assertEquals("root\n", sb.commands().run("whoami", ExecOptions.builder().user("root").build()).stdout());
    }

    @Test
    void backgroundProcesses() {
        CommandHandle h = sb.commands().start("read x; echo got:$x; exit 5", ExecOptions.builder().tag("reader").build());
        assertEquals("reader", h.tag());
        assertTrue(sb.commands().list().stream().anyMatch(p -> p.pid() == h.pid()));
        h.sendStdin("value\n", true);
        CommandResult r = h.waitFor(Duration.ofSeconds(60));
        assertEquals(5, r.exitCode());
        assertEquals("got:value\n", r.stdout());
        assertEquals("exited", h.refresh().state());
        assertEquals(Integer.valueOf(5), h.exitCode());

        CommandHandle sleeper = sb.commands().start("echo started; sleep 600");
        try (CommandStream out = sleeper.output()) {
            assertEquals("started\n", out.next().text());
        }
        assertTrue(sleeper.kill());
        assertEquals(128 + 9, sleeper.waitFor(Duration.ofSeconds(60)).exitCode());
        assertFalse(sleeper.kill(), "an exited process cannot be killed again");
        assertThrows(NotFoundException.class, () -> sb.commands().get(999999));
    }
}
