#!/usr/bin/env python3
"""Every shell block of README.md runs as written (label readme).

Usage: readme_test.py README.md BIN_DIR [--timeout SECONDS] [--only LINE]

A shell block is a fenced block tagged sh, bash or shell. Each one runs, as
a newcomer would paste it, in a fresh temporary directory, in its own process
group, under `bash -e -o pipefail` (a failing line fails the block), with
BIN_DIR (the build directory holding `refit`) ahead on PATH: what the
README's `export PATH="$PWD/build:$PATH"` does. A block whose first line is

    # needs: <what>                        (a GPU, other hosts)
    # not run by the README test: <why>    (it builds the project, runs the suite)

is skipped and counted. The test fails, naming each failed block by its line
in README.md and its first line, with its exit status and output, when a
block exits non-zero or runs past the time limit, and when it found no block
to run. Background processes a block leaves behind are killed when it ends
(so a block whose foreground command fails reports its status at once).

Mutations caught (tried): a README block with a wrong flag
(`--transprt tcp` in the demo block: "The following arguments were not
expected") fails naming its line and first line; the push block without its wait for the port
file fails (`cat: port: No such file or directory`); a fence parser that
finds no block fails ("no shell block ran").
"""

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

SHELL_TAGS = {"sh", "bash", "shell"}
FENCE = re.compile(r"^```\s*([A-Za-z0-9_+-]*)\s*$")
SKIP_MARKERS = (re.compile(r"^#\s*needs:\s*(.+)$"),
                re.compile(r"^#\s*not run by the README test:\s*(.+)$"))


class Block:
    def __init__(self, line, text):
        self.line = line  # README line of the block's first line
        self.text = text
        self.first = text.splitlines()[0] if text.strip() else ""

    def skip_reason(self):
        for marker in SKIP_MARKERS:
            m = marker.match(self.first.strip())
            if m:
                return m.group(1).strip()
        return None


def shell_blocks(readme_text):
    """The README's fenced shell blocks, in order."""
    blocks, lines, start, tag = [], readme_text.splitlines(), None, None
    body = []
    for number, line in enumerate(lines, start=1):
        m = FENCE.match(line)
        if start is None and m:
            start, tag, body = number + 1, m.group(1).lower(), []
        elif start is not None and line.strip() == "```":
            if tag in SHELL_TAGS:
                blocks.append(Block(start, "\n".join(body) + "\n"))
            start = None
        elif start is not None:
            body.append(line)
    return blocks


def kill_group(pgid):
    """Kills what is left of a block's process group; True if anything was."""
    try:
        os.killpg(pgid, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False


def run_block(block, bin_dir, timeout):
    """Runs one block; returns (ok, exit status or None, seconds, output)."""
    env = dict(os.environ)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    with tempfile.TemporaryDirectory(prefix="refit-readme-") as tmp, \
            tempfile.TemporaryFile() as output:
        start = time.monotonic()
        proc = subprocess.Popen(["bash", "-e", "-o", "pipefail", "-c", block.text], cwd=tmp,
                                env=env, stdin=subprocess.DEVNULL, stdout=output,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            status = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc.pid)
            proc.wait()
            status = None
        seconds = time.monotonic() - start
        left = kill_group(proc.pid)  # background jobs the block did not wait for
        output.seek(0)
        out = output.read().decode(errors="replace")
    if left:
        out += "\n(readme_test: killed processes the block left running)\n"
    return status == 0, status, seconds, out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("readme")
    parser.add_argument("bin_dir")
    parser.add_argument("--timeout", type=float, default=60, help="seconds per block (default 60)")
    parser.add_argument("--only", type=int, help="run only the block starting at this README line")
    args = parser.parse_args()
    bin_dir = os.path.abspath(args.bin_dir)
    name = os.path.basename(args.readme)
    with open(args.readme, encoding="utf-8") as f:
        blocks = shell_blocks(f.read())

    ran, skipped, failed = 0, [], []
    for block in blocks:
        if args.only is not None and block.line != args.only:
            continue
        reason = block.skip_reason()
        if reason is not None:
            skipped.append(f"line {block.line} ({reason})")
            print(f"skip  {name}:{block.line}: needs or not run: {reason}", flush=True)
            continue
        ok, status, seconds, out = run_block(block, bin_dir, args.timeout)
        ran += 1
        print(f"{'ok  ' if ok else 'FAIL'}  {name}:{block.line}: {block.first}  ({seconds:.1f} s)",
              flush=True)
        if not ok:
            why = f"ran past {args.timeout:g} s" if status is None else f"exit status {status}"
            failed.append(block.line)
            print(f"{name} line {block.line}, the block starting `{block.first}` failed "
                  f"({why}); its output:\n{out}", file=sys.stderr, flush=True)

    print(f"README shell blocks: ran {ran}, failed {len(failed)}, skipped {len(skipped)}"
          + (f": {'; '.join(skipped)}" if skipped else ""))
    if ran == 0:
        print("readme_test: no shell block ran (is the README's fence syntax still ```sh?)",
              file=sys.stderr)
        return 1
    if failed:
        print(f"readme_test: failed blocks at {name} lines " + ", ".join(map(str, failed)),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
