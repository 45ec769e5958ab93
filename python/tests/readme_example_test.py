"""README.md's numpy example runs as written (label python).

The example is the fenced python block of README.md whose first line is
`# README example: numpy`. This test takes it out of the README, runs it in
a fresh interpreter (this one's, with this PYTHONPATH: the built package) in
a temporary directory, and checks that it exits 0 within the time limit and
printed both refits' reports and the job's end. tests/readme_test.py runs
the README's shell blocks; this file handles the Python block.
"""
import os
import re
import subprocess
import sys
import tempfile
import unittest

try:
    import numpy  # noqa: F401
except ImportError:
    numpy = None

README = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "README.md")
MARKER = "# README example: numpy"
FENCE = re.compile(r"^```\s*([A-Za-z0-9_+-]*)\s*$")


def python_blocks(text):
    """[(line of the block's first line, its text)] of the fenced python blocks."""
    blocks, start, tag, body = [], None, None, []
    for number, line in enumerate(text.splitlines(), start=1):
        if start is None and FENCE.match(line):
            start, tag, body = number + 1, FENCE.match(line).group(1).lower(), []
        elif start is not None and line.strip() == "```":
            if tag in ("python", "py"):
                blocks.append((start, "\n".join(body) + "\n"))
            start = None
        elif start is not None:
            body.append(line)
    return blocks


def example():
    with open(README) as f:
        marked = [(line, text) for line, text in python_blocks(f.read()) if text.startswith(MARKER + "\n")]
    return marked


class ReadmeNumpyExample(unittest.TestCase):
    # Catches: the marker removed or the block no longer fenced as python (the
    # example would silently stop being run), two blocks with the marker.
    def test_the_readme_has_exactly_one_marked_block(self):
        self.assertEqual(len(example()), 1, f"README.md needs one ```python block starting with '{MARKER}'")

    # Catches: a README example that no longer runs (an API renamed, a wrong
    # argument, the trainer never finishing so the engine thread hangs: the
    # time limit), and one that runs but prints no report (Trainer.refit
    # returning None again prints "None").
    @unittest.skipIf(numpy is None, "numpy is not installed for this python (Debian: python3-numpy)")
    def test_the_example_runs_and_prints_its_reports(self):
        (line, text), = example()
        with tempfile.TemporaryDirectory(prefix="refit-readme-py-") as tmp:
            path = os.path.join(tmp, "example.py")
            with open(path, "w") as f:
                f.write(text)
            try:
                done = subprocess.run([sys.executable, path], cwd=tmp, capture_output=True, text=True, timeout=120)
            except subprocess.TimeoutExpired as e:
                self.fail(f"README.md line {line}: the numpy example ran past 120 s:\n{e.stdout}\n{e.stderr}")
        said = f"README.md line {line}, the numpy example, exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        self.assertEqual(done.returncode, 0, said)
        for version in (1, 2):
            self.assertRegex(done.stdout, rf"(?m)^refit {version}: \d+ bytes in [0-9.]+ s \([0-9.e+-]+ GB/s\); waited ",
                             said)
        self.assertIn("job: 2 refits committed", done.stdout, said)


if __name__ == "__main__":
    unittest.main()
