// Analyse a CSV with pandas inside a Cella sandbox.
//
//   CELLA_SERVER=http://127.0.0.1:7070 CELLA_API_KEY=... node csv_pandas.mjs
//
// Creates a sandbox, uploads a CSV, runs pandas on it through the code interpreter, which
// writes a result file inside the sandbox, downloads that file, prints it, and destroys the
// sandbox. Build the SDK first (`npm ci && npm run build` in sdk/typescript), then `npm install`
// in this folder (it links ../../sdk/typescript).

import { Sandbox, CellaError } from '@cella/sdk';

const SALES_CSV = `date,region,product,units,unit_price
2026-01-03,north,widget,12,2.50
2026-01-03,south,widget,7,2.50
2026-01-04,north,gadget,3,10.00
2026-01-05,east,widget,20,2.40
2026-01-05,south,gadget,5,9.50
2026-01-06,east,gadget,2,10.00
2026-01-07,north,widget,8,2.50
`;

// Server and key come from CELLA_SERVER and CELLA_API_KEY.
const sandbox = await Sandbox.create({ size: 'small', timeoutSec: 600, metadata: { example: 'csv_pandas' } });
console.log(`sandbox ${sandbox.id} is ${sandbox.state}`);

try {
  // 1. Upload the data.
  await sandbox.files.write('/home/user/data/sales.csv', SALES_CSV);

  // 2. Analyse it with pandas; the cell writes its result next to the input.
  const execution = await sandbox.runCode(`
import pandas as pd

df = pd.read_csv("/home/user/data/sales.csv", parse_dates=["date"])
df["revenue"] = df["units"] * df["unit_price"]
summary = (
    df.groupby("region")
      .agg(orders=("units", "size"), units=("units", "sum"), revenue=("revenue", "sum"))
      .sort_values("revenue", ascending=False)
)
summary.to_csv("/home/user/data/summary.csv")
print(f"{len(df)} rows, {df['region'].nunique()} regions")
round(df["revenue"].sum(), 2)
`);
  if (!execution.ok) {
    throw new Error(`the analysis failed: ${execution.error.name}: ${execution.error.value}\n${execution.error.traceback}`);
  }
  console.log(`pandas says: ${execution.stdout.trim()}; total revenue ${execution.result}`);

  // 3. Download the result and show it.
  const summary = await sandbox.files.read('/home/user/data/summary.csv');
  console.log('summary.csv:');
  console.log(summary.trimEnd());
} catch (err) {
  if (err instanceof CellaError) {
    console.error(`Cella error ${err.code} (HTTP ${err.status}, request ${err.requestId}): ${err.message}`);
  }
  process.exitCode = 1;
  throw err;
} finally {
  // 4. Destroy the sandbox.
  await sandbox.kill();
  console.log(`sandbox ${sandbox.id} destroyed`);
}
