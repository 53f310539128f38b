"""The kernel tests' worker process (interpreted.py): Triton's interpreter on in it, never in pytest's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


class Worker:
    def __init__(self):
        env = {**os.environ, "TRITON_INTERPRET": "1"}
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("interpreted.py"))], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def __call__(self, fn: str, **kwargs):
        self.proc.stdin.write(json.dumps(dict(fn=fn, **kwargs)) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the interpreter worker exited ({self.proc.wait()})")
        answer = json.loads(line)
        if "error" in answer:
            raise AssertionError("in the interpreter worker:\n" + answer["error"])
        return answer["ok"]

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def interpreted():
    pytest.importorskip("triton", reason="triton has no wheel for this platform (Linux x86-64 only); "
                                         "pip install 'iattention[kernel]' where it has")
    worker = Worker()
    yield worker
    worker.close()
