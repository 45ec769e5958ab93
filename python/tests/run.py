"""Runs one test module (python/tests/<name>.py) with unittest, verbosely.

Exit status: 0 when its tests passed, 1 when one failed, 77 (ctest's
SKIP_RETURN_CODE) when every test skipped, so ctest reports the file as
skipped with the reasons printed above instead of as passed.

Usage: python3 run.py registration_test
"""
import sys
import unittest


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: run.py <test module>")
    suite = unittest.defaultTestLoader.loadTestsFromName(sys.argv[1])
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    if not result.wasSuccessful():
        sys.exit(1)
    if result.testsRun and len(result.skipped) == result.testsRun:
        sys.exit(77)


if __name__ == "__main__":
    main()
