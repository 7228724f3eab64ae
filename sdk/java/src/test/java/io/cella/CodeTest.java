package io.cella;

import static org.junit.jupiter.api.Assertions.*;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;

@ExtendWith(TestServer.class)
class CodeTest {
    @Test
    void cellsContextsAndRichOutputs() {
        try (Sandbox sb = TestServer.sandbox()) {
            Execution a = sb.runCode("total = sum(range(10))\ntotal");
            assertTrue(a.ok());
            assertEquals("45", a.result());
            assertEquals("90", sb.code().run("total * 2").result());
            Execution png = sb.code().run("import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.show()");
            assertTrue(png.ok(), png.toString());
            RichOutput img = png.output("image/png").orElseThrow(() -> new AssertionError("no PNG: " + png));
            byte[] bytes = img.bytes();
            assertTrue(bytes.length > 100);
            assertArrayEquals(new byte[] {(byte) 0x89, 'P', 'N', 'G'}, java.util.Arrays.copyOf(bytes, 4));
            Execution err = sb.code().run("1/0");
            assertFalse(err.ok());
            assertEquals("ZeroDivisionError", err.error().orElseThrow().name());
            assertEquals("6", sb.code().run("[1,2,3].reduce((a, b) => a + b)", "javascript", "js", null).result());
            sb.code().createContext("work", null);
            assertTrue(sb.code().contexts(null).stream().anyMatch(c -> c.name().equals("work")));
            assertTrue(sb.code().state().stream().anyMatch(k -> k.language().equals("python") && k.running()));
            assertTrue(sb.code().resetContext("default", null));
            assertFalse(sb.code().run("total").ok());
            assertThrows(UnknownLanguageException.class, () -> sb.code().run("x", "cobol", null, null));
            sb.code().reset("python");
        }
    }
}
