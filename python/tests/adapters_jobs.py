"""The role processes of refit.adapters' GPU proof and speed bench (gpu_adapters_proof.py,
gpu_adapters_bench.py): start one (spawn), wait for several with a deadline (wait_procs),
hand addresses and results between them through files written atomically (publish,
save_json, wait_for), and print the cases and the last line "SUMMARY: PASS|FAIL: ..."
(print_results, print_summary). No torch, no GPU: the parents use it too.
"""
import json
import os
import subprocess
import sys
import time

TIMEOUTS = dict(setup_timeout=180, refit_timeout=120)


def save_json(path, value):
    with open(path + ".tmp", "w") as f:
        json.dump(value, f)
    os.replace(path + ".tmp", path)


def wait_for(path, seconds=300):
    """The text of `path` once another process wrote it (atomically)."""
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {seconds} s")
        time.sleep(0.05)
    with open(path) as f:
        return f.read().strip()


def publish(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def spawn(script, role_args, out, log_name):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with open(os.path.join(out, log_name + ".log"), "w") as log:  # a file, never a pipe that could fill
        return subprocess.Popen([sys.executable, os.path.abspath(script), "--out", out] + role_args, env=env,
                                stdout=log, stderr=subprocess.STDOUT)


def wait_procs(procs, out, seconds):
    """Waits for every process until all exited, one failed, or `seconds` passed, then kills
    and reaps the rest (a survivor would wait for its dead peer); (all exited 0, lines)."""
    deadline = time.monotonic() + seconds
    while [p.poll() for p in procs.values()].count(None) and time.monotonic() < deadline:  # polls every one
        if any(p.returncode not in (None, 0) for p in procs.values()):
            break
        time.sleep(0.2)
    ok, lines = True, []
    for role, p in procs.items():
        killed = ""
        if p.poll() is None:
            p.kill()
            p.wait()
            killed = f"[killed: still running after {seconds} s, or a peer failed]\n"
        if p.returncode != 0:
            ok = False
            with open(os.path.join(out, role + ".log")) as log:
                text = killed + log.read()
            tail = "\n".join("    " + line for line in text.splitlines()[-40:])
            lines.append(f"  {role} process exited {p.returncode}:\n{tail}")
    return ok, lines


def print_results(results):
    """Each case of [(name, ok, lines)]: PASS|FAIL and its name, then its lines."""
    for name, ok, lines in results:
        print(f"{'PASS' if ok else 'FAIL'} {name}", flush=True)
        for line in lines:
            print(line, flush=True)


def print_summary(proof, results):
    """The cases as one JSON line, then "SUMMARY: PASS|FAIL: ..."; the exit status (0 only on PASS)."""
    failed = [name for name, ok, _ in results if not ok]
    print(json.dumps({"proof": proof, "cases": [{"case": n, "pass": ok} for n, ok, _ in results]}))
    print(f"SUMMARY: {'PASS' if not failed else 'FAIL'}: {len(results) - len(failed)}/{len(results)} cases passed"
          + (f"; failed: {', '.join(failed)}" if failed else ""), flush=True)
    return 0 if not failed else 1
