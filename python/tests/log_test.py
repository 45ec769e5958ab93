"""refit's messages in Python: from the moment `refit` is imported they reach
Python's logging (the logger "refit"), also when refit logs from a thread of
its own that holds no GIL; set_log_handler sends them elsewhere; the
interpreter exits cleanly with the handler installed.

The messages enter through _refit._log, which calls refit::log (the same
function every library message goes through) in C++.
Each test names the mutation of the binding it catches.
"""
import logging
import os
import subprocess
import sys
import threading
import unittest

import refit

TIMEOUT_S = 10  # a delivered message arrives in far less; a lost one fails the test


class _Capture(logging.Handler):
    """Keeps the records of the "refit" logger; `arrived` is set at the first one."""

    def __init__(self):
        super().__init__(level=logging.DEBUG)
        self.records = []
        self.arrived = threading.Event()

    def emit(self, record):
        self.records.append(record)
        self.arrived.set()


class LoggingRoute(unittest.TestCase):
    def setUp(self):
        self.capture = _Capture()
        self.logger = logging.getLogger("refit")
        self.logger.addHandler(self.capture)
        self.old_level = self.logger.level
        self.logger.setLevel(logging.DEBUG)

    def tearDown(self):
        self.logger.removeHandler(self.capture)
        self.logger.setLevel(self.old_level)
        refit.set_log_handler(refit._to_logging)

    def _first_record(self):
        self.assertTrue(self.capture.arrived.wait(TIMEOUT_S), "no record reached logging")
        return self.capture.records[0]

    # Mutation caught: a record without refit's level or source.
    def test_a_message_reaches_logging_with_its_level_and_source(self):
        refit._refit._log("warning", "refit test", "a pool fell back to host memory")
        record = self._first_record()
        self.assertEqual(record.levelno, logging.WARNING)
        self.assertEqual(record.getMessage(), "refit test: a pool fell back to host memory")
        self.assertEqual(record.refit_source, "refit test")

    # Mutation caught: a sink that calls Python without taking the GIL (crashes
    # or corrupts the interpreter when refit logs from its own threads).
    def test_a_message_from_a_thread_without_the_gil_arrives(self):
        refit._refit._log("error", "engine rank 3", "lost trainer rank 1", from_thread=True)
        record = self._first_record()
        self.assertEqual(record.levelno, logging.ERROR)
        self.assertEqual(record.getMessage(), "engine rank 3: lost trainer rank 1")

    # Mutation caught: set_log_handler ignoring its argument.
    def test_set_log_handler_sends_messages_to_the_callable(self):
        got = []
        done = threading.Event()

        def handler(level, source, message):
            got.append((level, source, message))
            done.set()

        refit.set_log_handler(handler)
        refit._refit._log("info", "refit coordinator", "setup complete")
        self.assertTrue(done.wait(TIMEOUT_S))
        self.assertEqual(got, [("info", "refit coordinator", "setup complete")])
        self.assertEqual(self.capture.records, [])

    def test_a_handler_that_is_not_callable_is_refused(self):
        with self.assertRaises(TypeError):
            refit.set_log_handler(42)


class Shutdown(unittest.TestCase):
    # Mutations caught (both tried): no atexit hook (_stop_logging): the
    # messages still queued at exit are lost, or the delivery thread is inside
    # Python while the interpreter finalizes; an import that installs no
    # handler (the messages stay on stderr). The child process only imports
    # refit and logs from a thread of its own just before exiting.
    def test_the_interpreter_exits_cleanly_with_messages_in_flight(self):
        code = ("import logging, sys, refit\n"
                "logging.basicConfig(stream=sys.stdout, level=logging.INFO, format='%(message)s')\n"
                "for i in range(200):\n"
                "    refit._refit._log('info', 'refit test', 'message %d' % i, from_thread=True)\n")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                               timeout=60)
        self.assertEqual(child.returncode, 0, child.stderr)
        # Every queued message was delivered before exit, in order.
        lines = child.stdout.splitlines()
        self.assertEqual(lines, ["refit test: message %d" % i for i in range(200)], child.stderr)


if __name__ == "__main__":
    unittest.main()
