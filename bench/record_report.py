"""Records one `refit bench --json` report and prints its line (the GPU bench scripts' shared step).

Usage: record_report.py REPORT NAME JSONL ERRFILE [FIELD=VALUE ...]

Appends the report to JSONL with "name" (and each FIELD, a JSON value when it parses
as one, else the string) added, and prints one line: the name, the extra fields,
verified, the median refit time (refits after the first), the refit's bytes and the
bytes its floor is measured on, refit and copy GB/s, the ratio to the floor, the
gathered and duplicate bytes where the job had sharded trainers, and the error. A
missing or unreadable report prints the end of ERRFILE instead and records nothing.
"""
import json
import sys


def main(argv):
    if len(argv) < 5:
        sys.exit(__doc__)
    report_path, name, jsonl, err_path = argv[1:5]
    extra = {}
    for item in argv[5:]:
        key, _, value = item.partition("=")
        try:
            extra[key] = json.loads(value)
        except ValueError:
            extra[key] = value
    try:
        with open(report_path) as f:
            r = json.load(f)
    except (OSError, ValueError) as e:
        with open(err_path) as f:
            print(f"{name:<36} no report ({e}): {f.read()[-800:]}")
        return 0
    r["name"] = name
    r.update(extra)
    with open(jsonl, "a") as f:
        f.write(json.dumps(r) + "\n")
    b = r.get("bench", {})
    secs = sorted(x["seconds"] for x in r.get("refits", [])[1:]) or [0]
    fields = "".join(f"{k}={v} " for k, v in extra.items())
    sharded = (f"gathered={r.get('gathered_bytes', 0) / 1e9:.2f} GB dup={r.get('duplicate_bytes')} "
               if "gathered_bytes" in r else "")
    print(f"{name:<36} {fields}verified={r.get('verified')} median={secs[len(secs) // 2] * 1e3:8.2f} ms "
          f"bytes={r.get('bytes_per_refit', 0) / 1e9:.3f} GB floor_bytes={b.get('ceiling_bytes', 0) / 1e9:.3f} GB "
          f"{sharded}refit={b.get('median_gbps', 0):8.1f} GB/s copy={b.get('ceiling_gbps', 0):8.1f} GB/s "
          f"x{b.get('floor_ratio', 0):.3f} of floor {r.get('error', '')[:300]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
