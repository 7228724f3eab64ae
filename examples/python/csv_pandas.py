"""Analyse a CSV file with pandas inside a Cella sandbox.

The pattern an agent uses to run untrusted analysis code: create a sandbox, upload the data,
run code on it through the code interpreter, write a result file inside the sandbox,
download it, and destroy the sandbox (the `with` block does that, even on errors).

    pip install ./sdk/python
    export CELLA_SERVER=http://127.0.0.1:7070 CELLA_API_KEY=...
    python examples/python/csv_pandas.py
"""

import csv
import io
import random
import sys

from cella import Sandbox


def make_csv(rows: int = 200) -> bytes:
    """Some sales data to analyse (in a real agent: the user's file)."""
    rng = random.Random(7)
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["date", "region", "product", "units", "unit_price"])
    for i in range(rows):
        writer.writerow([
            f"2026-{1 + i % 12:02d}-{1 + i % 28:02d}",
            rng.choice(["north", "south", "east", "west"]),
            rng.choice(["widget", "gadget", "gizmo"]),
            rng.randint(1, 20),
            rng.choice([2.5, 4.0, 9.99]),
        ])
    return out.getvalue().encode()


ANALYSIS = """
import pandas as pd

df = pd.read_csv("/home/user/data/sales.csv", parse_dates=["date"])
df["revenue"] = df["units"] * df["unit_price"]
summary = (df.groupby("region")
             .agg(orders=("units", "size"), units=("units", "sum"), revenue=("revenue", "sum"))
             .sort_values("revenue", ascending=False)
             .round(2))
summary.to_csv("/home/user/out/summary_by_region.csv")
print(f"{len(df)} rows, {df['revenue'].sum():.2f} total revenue")
summary
"""


def main() -> int:
    with Sandbox.create(timeout=600, metadata={"example": "csv_pandas"}) as sandbox:
        print(f"sandbox {sandbox.id} is {sandbox.state}")

        sandbox.files.write("/home/user/data/sales.csv", make_csv())
        sandbox.files.make_dir("/home/user/out")

        execution = sandbox.run_code(ANALYSIS, timeout=120)
        if execution.error:
            print(f"the analysis failed: {execution.error.name}: {execution.error.value}", file=sys.stderr)
            print(execution.error.traceback, file=sys.stderr)
            return 1
        print(execution.stdout, end="")
        print(execution.text)

        result = sandbox.files.read("/home/user/out/summary_by_region.csv")
        print("\nsummary_by_region.csv, downloaded from the sandbox:")
        print(result)
    # the sandbox is destroyed here
    return 0


if __name__ == "__main__":
    sys.exit(main())
