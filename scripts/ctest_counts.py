#!/usr/bin/env python3
"""Counts one ctest run for scripts/test.sh, skipped tests apart.

Usage: ctest_counts.py JUNIT_XML TEST_DIR SKIPS_FILE

Reads the JUnit report ctest wrote (--output-junit), prints
"PASSED FAILED SKIPPED" on stdout, and appends one line per skipped test to
SKIPS_FILE: "label<TAB>reason<TAB>test". A test counts as skipped when ctest
did not run it to a verdict (status "notrun"): a GoogleTest GTEST_SKIP
(gtest_discover_tests registers every test with SKIP_REGULAR_EXPRESSION
"[  SKIPPED ]"; the GPU tests skip this way without a CUDA device, the ucx
tests without UCX) or a script's SKIP_RETURN_CODE 77 (the python tests).
The label comes from `ctest --show-only=json-v1`; the reason is the message
after GoogleTest's "Skipped" line, else the output's last line.
"""

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

GTEST_SKIPPED_LINE = re.compile(r":\d+: Skipped$")


def labels_by_test(test_dir):
    out = subprocess.run(["ctest", "--test-dir", test_dir, "--show-only=json-v1"],
                         check=True, capture_output=True, text=True).stdout
    labels = {}
    for test in json.loads(out).get("tests", []):
        for prop in test.get("properties", []):
            if prop.get("name") == "LABELS":
                labels[test["name"]] = ",".join(prop.get("value", []))
    return labels


def skip_reason(output, fallback):
    lines = [line.strip() for line in output.splitlines()]
    for i, line in enumerate(lines):
        if GTEST_SKIPPED_LINE.search(line):
            rest = [l for l in lines[i + 1:] if l and not l.startswith("[")]
            if rest:
                return rest[0]
    rest = [l for l in lines if l and not l.startswith("[")]
    return rest[-1] if rest else fallback


def shorten(reason, limit=120):
    """The reason cut at a word before `limit` characters (it ends a long line)."""
    if len(reason) <= limit:
        return reason
    return reason[:limit].rsplit(" ", 1)[0] + " ..."


def main():
    junit, test_dir, skips_file = sys.argv[1:4]
    root = ET.parse(junit).getroot()
    labels = labels_by_test(test_dir)
    passed = failed = skipped = 0
    with open(skips_file, "a", encoding="utf-8") as skips:
        for case in root.iter("testcase"):
            name = case.get("name", "")
            if case.get("status") == "notrun" or case.find("skipped") is not None:
                skipped += 1
                marker = case.find("skipped")
                fallback = marker.get("message", "skipped") if marker is not None else "skipped"
                reason = skip_reason(case.findtext("system-out") or "", fallback)
                reason = shorten(" ".join(reason.replace("\t", " ").split()))
                skips.write(f"{labels.get(name) or 'no label'}\t{reason}\t{name}\n")
            elif case.find("failure") is not None or case.get("status") == "fail":
                failed += 1
            else:
                passed += 1
    print(passed, failed, skipped)


if __name__ == "__main__":
    main()
