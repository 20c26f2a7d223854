"""Runs the DMTF Redfish-Protocol-Validator against a simulated BMC and reads its report.

Usage: validate.py VALIDATOR --rhost URL --user USER --password PASSWORD
                   --ca-bundle CA.pem --report-dir DIR

VALIDATOR is the validator's console script (`rf_protocol_validator`). It is run with a TSV
report and `--avoid-http-redirect` (the BMC serves HTTPS only). Every result is printed as
`RESULT ASSERTION METHOD URI: message`, then the assertions that were not tested. Exits 1 when
the validator fails or reports a FAIL, 0 otherwise.
"""

import csv
import pathlib
import subprocess
import sys


def main() -> int:
    validator, args = sys.argv[1], sys.argv[2:]
    report_dir = pathlib.Path(args[args.index("--report-dir") + 1])
    run = subprocess.run(
        [validator, *args, "--avoid-http-redirect", "--report-type", "tsv"],
        capture_output=True,
        text=True,
        check=False,
    )
    print(run.stdout)
    print(run.stderr, file=sys.stderr)
    reports = sorted(report_dir.glob("*.tsv"))
    if not reports:
        print("the validator wrote no report", file=sys.stderr)
        return 1
    with reports[-1].open(encoding="utf-8") as report:
        rows = list(csv.DictReader(report, delimiter="\t", quoting=csv.QUOTE_NONE))
    for row in rows:
        print(f"{row['Result']} {row['Assertion']} {row['Method']} {row['URI']}: {row['Message']}")
    tested = {row["Assertion"] for row in rows if row["Result"] != "NOT_TESTED"}
    untested = sorted({row["Assertion"] for row in rows} - tested)
    print("\nnot tested:", ", ".join(untested))
    failed = [row for row in rows if row["Result"] == "FAIL"]
    return 1 if failed or run.returncode != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
