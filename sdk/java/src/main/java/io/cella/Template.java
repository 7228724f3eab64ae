package io.cella;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.List;

/**
 * Custom templates: build one from a spec (see the API reference), read it, delete it. A spec
 * is JSON; build it with {@link Json#object()} or pass a {@code Map}.
 *
 * <pre>{@code
 * ObjectNode spec = Json.object().put("id", "webapp").put("from", "base");
 * spec.putArray("steps").addObject().put("run", "pip install flask");
 * TemplateBuild b = Template.build(spec).waitFor(Duration.ofMinutes(30), true, System.out::print);
 * }</pre>
 */
public final class Template {
    private Template() {}

    /** Start a build and answer its handle at once; {@link TemplateBuildHandle#waitFor} waits for its end. */
    public static TemplateBuildHandle build(Object spec) { return build(spec, null); }

    public static TemplateBuildHandle build(Object spec, ConnectionConfig connection) {
        Transport t = new Transport(connection);
        return new TemplateBuildHandle(new TemplateBuild(t.data("POST", "/templates", null, Transport.Body.json(Json.tree(spec)))), t);
    }

    /** The catalog: {@code base} and the workspace's custom templates. */
    public static List<TemplateInfo> list() { return list(null); }

    public static List<TemplateInfo> list(ConnectionConfig connection) {
        return Json.list(new Transport(connection).data("GET", "/templates"), TemplateInfo::new);
    }

    public static TemplateInfo get(String templateId) { return get(templateId, null); }

    public static TemplateInfo get(String templateId, ConnectionConfig connection) {
        return new TemplateInfo(new Transport(connection).data("GET", "/templates/" + Transport.seg(templateId)));
    }

    /** A template's builds, newest first (without their logs). */
    public static List<TemplateBuild> builds(String templateId, ConnectionConfig connection) {
        return Json.list(new Transport(connection).data("GET", "/templates/" + Transport.seg(templateId) + "/builds"), TemplateBuild::new);
    }

    public static TemplateBuild getBuild(String templateId, String buildId) { return getBuild(templateId, buildId, null); }

    public static TemplateBuild getBuild(String templateId, String buildId, ConnectionConfig connection) {
        return new TemplateBuild(new Transport(connection).data("GET", "/templates/" + Transport.seg(templateId) + "/builds/" + Transport.seg(buildId)));
    }

    /** Delete one of the workspace's templates (a {@link ConflictException} while sandboxes or snapshots use it). */
    public static TemplateInfo delete(String templateId) { return delete(templateId, null); }

    public static TemplateInfo delete(String templateId, ConnectionConfig connection) {
        JsonNode d = new Transport(connection).data("DELETE", "/templates/" + Transport.seg(templateId));
        return new TemplateInfo(d);
    }
}
