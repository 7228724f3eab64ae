// Analyse a CSV file with pandas inside a Cella sandbox, from Java.
//
// The pattern an agent uses to run untrusted analysis code: create a sandbox, upload the data,
// run code on it through the code interpreter, write a result file inside the sandbox, download
// it, and destroy the sandbox (try-with-resources does that, even on errors).
//
//   (cd sdk/java && mvn package)      # or run-tests.sh, which also runs this example
//   export CELLA_SERVER=http://127.0.0.1:7070 CELLA_API_KEY=...
//   java -cp sdk/java/target/cella-sdk-0.1.0.jar:jackson-databind.jar:jackson-core.jar:jackson-annotations.jar examples/java/CsvPandas.java

import io.cella.CommandStream;
import io.cella.CreateOptions;
import io.cella.Execution;
import io.cella.OutputChunk;
import io.cella.Sandbox;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Random;

public class CsvPandas {
    static final String ANALYSIS = String.join("\n",
            "import pandas as pd",
            "df = pd.read_csv('/home/user/data/sales.csv', parse_dates=['date'])",
            "df['revenue'] = df['units'] * df['unit_price']",
            "summary = (df.groupby('region')",
            "             .agg(orders=('units', 'size'), units=('units', 'sum'), revenue=('revenue', 'sum'))",
            "             .sort_values('revenue', ascending=False)",
            "             .round(2))",
            "summary.to_csv('/home/user/out/summary_by_region.csv')",
            "print(f\"{len(df)} rows, {df['revenue'].sum():.2f} total revenue\")",
            "summary");

    /** Some sales data to analyse (in a real agent: the user's file). */
    static String makeCsv(int rows) {
        Random rng = new Random(7);
        String[] regions = {"north", "south", "east", "west"};
        String[] products = {"widget", "gadget", "gizmo"};
        double[] prices = {2.5, 4.0, 9.99};
        StringBuilder sb = new StringBuilder("date,region,product,units,unit_price\n");
        for (int i = 0; i < rows; i++) {
            sb.append(String.format("2026-%02d-%02d,%s,%s,%d,%s%n", 1 + i % 12, 1 + i % 28, regions[rng.nextInt(4)],
                    products[rng.nextInt(3)], 1 + rng.nextInt(20), prices[rng.nextInt(3)]));
        }
        return sb.toString();
    }

    public static void main(String[] args) {
        String data = makeCsv(200);
        try (Sandbox sb = Sandbox.create(CreateOptions.builder().size("xs").timeout(Duration.ofMinutes(10)).metadata("example", "csv").build())) {
            System.out.println("sandbox " + sb.id() + " is " + sb.state());
            sb.files().makeDir("/home/user/out");
            sb.files().write("/home/user/data/sales.csv", data);

            Execution cell = sb.code().run(ANALYSIS);
            if (!cell.ok()) throw new IllegalStateException("the analysis failed: " + cell.error().orElseThrow().traceback());
            System.out.print(cell.stdout());
            boolean html = cell.output("text/html").isPresent();
            System.out.println("rich output: " + (html ? "an HTML table" : "none"));

            String summary = sb.files().read("/home/user/out/summary_by_region.csv");
            System.out.println("summary_by_region.csv:");
            System.out.print(summary);

            // A streamed command: each line as it comes.
            try (CommandStream out = sb.commands().stream("wc -l /home/user/data/sales.csv; sleep 0.2; echo done")) {
                for (OutputChunk c : out) System.out.print("| " + c.text());
                if (out.result().exitCode() != 0) throw new IllegalStateException("wc failed");
            }
            if (!summary.startsWith("region,orders,units,revenue") || summary.strip().split("\n").length != 5) {
                throw new IllegalStateException("unexpected summary:\n" + summary);
            }
            if (!html) throw new IllegalStateException("the DataFrame gave no text/html output");
            System.out.println("ok: " + data.getBytes(StandardCharsets.UTF_8).length + " bytes analysed");
        }
    }
}
