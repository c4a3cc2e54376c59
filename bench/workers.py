"""The parent's handle on a worker process: start it, send it commands, read its answers.

Invariant: a worker's stdout is read by one thread that queues its messages (None at its end)
and its stderr by another that echoes it with a label and keeps its last lines; a command gets
exactly one answer or raises (WorkerGone: the process ended or did not answer in time, with the
end of its stderr; CommandFailed: the command raised in the worker, which goes on). ``close``
always leaves the process ended.
"""

import collections
import json
import queue
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional

from . import protocol

STDERR_LINES = 40


class WorkerGone(Exception):
    """The worker ended, or did not answer in time."""


class CommandFailed(Exception):
    """A command raised inside the worker (the text is the end of its traceback)."""


class Worker:
    """A process speaking protocol on its stdin and stdout."""

    def __init__(self, name: str, command: List[str], env: Dict[str, str], echo: bool = True):
        self.name = name
        self.messages: "queue.Queue[Optional[Dict[str, Any]]]" = queue.Queue()
        self.stderr_lines: collections.deque = collections.deque(maxlen=STDERR_LINES)
        self.echo = echo
        self.info: Dict[str, Any] = {}
        self.popen = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            bufsize=1,
        )
        threading.Thread(target=self._read_stdout, daemon=True).start()
        self._stderr_reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._stderr_reader.start()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def _read_stdout(self) -> None:
        for line in self.popen.stdout:
            try:
                message = protocol.decode(line.rstrip("\n"))
            except ValueError:
                message = None
            if message is not None:
                self.messages.put(message)
        self.messages.put(None)

    def _read_stderr(self) -> None:
        for line in self.popen.stderr:
            self.stderr_lines.append(line)
            if self.echo:
                sys.stderr.write(f"    {self.name}| {line}")

    def stderr_tail(self) -> str:
        return protocol.tail("".join(self.stderr_lines))

    def _gone(self, what: str) -> WorkerGone:
        if self.popen.poll() is None:
            return WorkerGone(f"{self.name}: {what}")
        self._stderr_reader.join(timeout=5)
        detail = self.stderr_tail()
        text = f"{self.name} exited with status {self.popen.returncode} {what}"
        return WorkerGone(f"{text}:\n{detail}" if detail else text)

    def receive(self, timeout_s: float) -> Dict[str, Any]:
        """The next message; raises WorkerGone at the end of output or after ``timeout_s``."""
        try:
            message = self.messages.get(timeout=max(0.0, timeout_s))
        except queue.Empty:
            raise self._gone(f"gave no answer in {timeout_s:g} s") from None
        if message is None:
            self.messages.put(None)  # stays at its end for later calls
            self.popen.wait()
            raise self._gone("before answering")
        return message

    def send(self, payload: Dict[str, Any]) -> None:
        try:
            self.popen.stdin.write(json.dumps(payload) + "\n")
            self.popen.stdin.flush()
        except (OSError, ValueError):
            self.popen.wait()
            raise self._gone("before the command could be sent") from None

    def request(self, command: str, timeout_s: float, **fields: Any) -> Dict[str, Any]:
        """Send ``command`` and return its result (see the module's invariant)."""
        self.send({"command": command, **fields})
        message = self.receive(timeout_s)
        if message["kind"] != "reply":
            raise WorkerGone(f"{self.name} said {message['kind']!r} in answer to {command!r}")
        if not message["ok"]:
            raise CommandFailed(message["error"])
        return message["result"]

    def wait_ready(self, timeout_s: float) -> Dict[str, Any]:
        """The first message: ``ready`` (returns the worker's facts) or why it cannot run
        (raises CommandFailed for skipped and setup_error, WorkerGone if it died first)."""
        message = self.receive(timeout_s)
        if message["kind"] == "ready":
            self.info = message.get("info", {})
            return self.info
        if message["kind"] == "skipped":
            raise CommandFailed(f"skipped: {message['reason']}")
        raise CommandFailed(message.get("reason", f"said {message['kind']!r} before ready"))

    def close(self, timeout_s: float = 30.0) -> None:
        """Close stdin (the signal to exit), wait up to ``timeout_s``, kill if it stays."""
        try:
            self.popen.stdin.close()
        except OSError:
            pass
        deadline = time.monotonic() + timeout_s
        try:
            self.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


def close_all(workers: List[Worker], timeout_s: float = 30.0) -> None:
    """Ask every worker to exit at once, then wait for each."""
    for worker in workers:
        try:
            worker.popen.stdin.close()
        except OSError:
            pass
    for worker in workers:
        worker.close(timeout_s)
