package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.time.Duration;
import java.util.List;

/**
 * Persistent Python and JavaScript interpreters: {@code sandbox.code()}. Variables, imports and
 * definitions live on between cells of one context.
 */
public final class CodeInterpreter {
    static final Duration CAP = Duration.ofSeconds(300);
    private final Sandbox sandbox;

    CodeInterpreter(Sandbox sandbox) {
        this.sandbox = sandbox;
    }

    private Transport t() { return sandbox.transport; }

    private String path(String... rest) {
        String[] r = new String[rest.length + 1];
        r[0] = "code";
        System.arraycopy(rest, 0, r, 1, rest.length);
        return Transport.sandboxPath(sandbox.id(), r);
    }

    /** Run a Python cell in the default context. */
    public Execution run(String code) { return run(code, null, null, null); }

    /**
     * Run a cell. {@code language} is {@code "python"} (null: the default) or {@code
     * "javascript"}; {@code context} names the namespace (null: {@code default}); {@code timeout}
     * (null: 300 s, the server's cap) interrupts the cell, the context survives.
     */
    public Execution run(String code, String language, String context, Duration timeout) {
        ObjectNode body = Json.object().put("code", code);
        if (language != null) body.put("language", language);
        if (context != null) body.put("context", context);
        if (timeout != null) body.put("timeout", timeout.toMillis() / 1000.0);
        Duration cell = timeout == null || timeout.compareTo(CAP) > 0 ? CAP : timeout;
        return new Execution(t().data("POST", path("run"), null, Transport.Body.json(body), cell.plus(Duration.ofSeconds(60))));
    }

    /** Which interpreters run, their contexts, busy or idle. */
    public List<KernelInfo> state() { return Json.list(t().data("GET", path()).path("kernels"), KernelInfo::new); }

    /** A language's contexts (null: python). */
    public List<CodeContext> contexts(String language) {
        return Json.list(t().data("GET", path("contexts"), Transport.Query.of().add("language", language), null), CodeContext::new);
    }

    /** Make a context (null name: {@code default}; null language: python). */
    public CodeContext createContext(String name, String language) {
        ObjectNode body = Json.object();
        if (name != null) body.put("context", name);
        if (language != null) body.put("language", language);
        return new CodeContext(t().data("POST", path("contexts"), null, Transport.Body.json(body)));
    }

    /** Forget a context's variables; true if it existed. */
    public boolean resetContext(String name, String language) {
        JsonNode d = t().data("DELETE", path("contexts", Transport.seg(name)), Transport.Query.of().add("language", language), null);
        return d.path("changed").asBoolean(false);
    }

    /** End a language's interpreter (null: python) and every context of it, for a fresh start. */
    public List<KernelInfo> reset(String language) {
        return Json.list(t().data("DELETE", path(), Transport.Query.of().add("language", language), null).path("kernels"), KernelInfo::new);
    }
}
