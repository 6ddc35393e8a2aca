"""Real processes for the simulation: the cloud service and edge clients,
each pinned to its own cores when the machine has them, and the link
emulator on a background event loop.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

from edge.report import EdgeReport
from shared.loop_thread import LoopThread
from sim.link.config import LinkConfig
from sim.link.emulator import LinkEmulator

__all__ = ["core_split", "pinned_env", "side_command", "CloudProcess", "BrokerProcess", "run_edge_process", "BackgroundLink", "process_cpu_s", "unlabelled",
           "process_rss_mb"]

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def core_split() -> tuple[set[int] | None, set[int] | None]:
    """(edge cores, cloud cores): disjoint halves of the usable cores, or (None, None) on one core."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return None, None
    if len(cores) < 2:
        return None, None
    half = len(cores) // 2
    return set(cores[:half]), set(cores[half:])


def side_command(script: str, module: str) -> list[str]:
    """How to start one side: its console script beside this interpreter, else ``python -m module``."""
    installed = Path(sys.executable).with_name(script)
    return [str(installed)] if installed.is_file() else [sys.executable, "-m", module]


def _pinned(cores: set[int] | None):
    if not cores:
        return None
    return lambda: os.sched_setaffinity(0, cores)


def pinned_env(cores: set[int] | None) -> tuple[dict, object]:
    """(environment, preexec_fn) for a child process pinned to ``cores`` with as many threads."""
    return _env(len(cores) if cores else None), _pinned(cores)


def _env(threads: int | None) -> dict:
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", PYTHONUNBUFFERED="1")
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds the process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def process_rss_mb(pid: int) -> float:
    """Resident memory of the process in MiB (Linux /proc; 0 when unreadable)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def unlabelled(samples: dict[str, dict[str, float]], name: str) -> float:
    """An unlabelled sample's value from a ``CloudProcess.scrape`` (0 if absent)."""
    return samples.get(name, {}).get("", 0.0)


class CloudProcess:
    """``splitspec-cloud serve`` as a child process; a context manager."""

    def __init__(self, target: str, cores: set[int] | None, startup_timeout_s: float = 600.0, port: int = 0,
                 extra_args: list[str] | tuple[str, ...] = ()) -> None:
        """``port``: where to serve (0: any free port; ``.port`` tells which once started).
        ``extra_args``: more ``serve`` flags (limits)."""
        self.extra_args = list(extra_args)
        self.target = target
        self.cores = cores
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen | None = None
        self.port = port
        self.metrics_port = 0
        self._log = tempfile.NamedTemporaryFile(prefix="splitspec-cloud-", suffix=".log", delete=False)

    def __enter__(self) -> CloudProcess:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.metrics_port = s.getsockname()[1]
        cmd = [*side_command("splitspec-cloud", "cloud.cli"), "serve", "--target", self.target, "--port", str(self.port),
               "--metrics-port", str(self.metrics_port), "--grace", "2", *self.extra_args]
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=self._log, text=True,
            env=_env(len(self.cores) if self.cores else None), preexec_fn=_pinned(self.cores),
        )
        deadline = time.monotonic() + self.startup_timeout_s
        line = ""
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            if line.startswith("splitspec cloud: serving"):
                self.port = int(line.rsplit(":", 1)[1])
                return self
        self._stop()
        tail = Path(self._log.name).read_text()[-2000:]
        raise RuntimeError(f"the cloud service did not start; its log is {self._log.name}:\n{tail}")

    def cpu_s(self) -> float:
        return process_cpu_s(self.proc.pid)

    def kill(self) -> None:
        """SIGKILL: a crash, as far as its clients can tell (no drain, every session lost)."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=20)

    def scrape(self) -> dict[str, dict[str, float]]:
        """The service's Prometheus samples now: name -> {its label values, comma-joined ("" when
        unlabelled) -> value}."""
        from prometheus_client.parser import text_string_to_metric_families

        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).read().decode()
        samples: dict[str, dict[str, float]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples.setdefault(sample.name, {})[",".join(sample.labels.values())] = float(sample.value)
        return samples

    def metric(self, name: str) -> float:
        """Current value of an unlabelled counter from the service's Prometheus endpoint (0 if absent)."""
        return unlabelled(self.scrape(), name)

    def _stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._log.close()

    def __exit__(self, exc_type, *exc) -> None:
        self._stop()
        if exc_type is None:  # keep the service's log only when something went wrong
            Path(self._log.name).unlink(missing_ok=True)
        else:
            print(f"the cloud service's log is {self._log.name}", file=sys.stderr)


class BrokerProcess:
    """``splitspec fleet broker`` (amqtt) as a child process on ``port`` (default: a free one)."""

    def __init__(self, port: int = 0, security_args: tuple[str, ...] = ()) -> None:
        """``security_args``: the broker's --tls-cert/--tls-key/--users flags (its URL is then mqtts:// with them)."""
        import socket

        if not port:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        self.port = port
        self.security_args = tuple(security_args)
        self.url = f"{'mqtts' if '--tls-cert' in security_args else 'mqtt'}://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> BrokerProcess:
        self.proc = subprocess.Popen([*side_command("splitspec", "sim.cli"), "fleet", "broker", "--port", str(self.port),
                                      *self.security_args],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=_env(None))
        line = self.proc.stdout.readline()
        if not line.startswith("splitspec fleet: broker on"):
            self.kill()
            raise RuntimeError(f"the MQTT broker did not start on port {self.port}")
        return self

    def kill(self) -> None:
        """SIGKILL: the broker and its retained messages are gone."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def __enter__(self) -> BrokerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


def run_edge_process(
    args: list[str], cores: set[int] | None, stream_to=None, timeout_s: float = 1800.0, check: bool = True,
    env: dict[str, str] | None = None,
) -> EdgeReport:
    """Run ``splitspec-edge ...`` with ``args``; returns its report.

    The child's streamed text goes to ``stream_to`` (a text file) when given.
    ``check`` False: a failed generation that still wrote its report returns
    it (``error`` set, the tokens made before the failure). ``env``: variables
    set on top of the pinned environment (a paired A/B's ``PYTHONPATH``).
    """
    with tempfile.TemporaryDirectory(prefix="splitspec-edge-") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [*side_command("splitspec-edge", "edge.cli"), *args, "--json-file", str(out)]
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=_env(len(cores) if cores else None) | (env or {}), preexec_fn=_pinned(cores),
        )
        errors: list[str] = []
        reader = threading.Thread(target=lambda: errors.append(proc.stderr.read()), daemon=True)
        reader.start()
        for chunk in iter(lambda: proc.stdout.read(1), ""):
            if stream_to is not None:
                stream_to.write(chunk)
                stream_to.flush()
        proc.wait(timeout=timeout_s)
        reader.join(timeout=5)
        if not out.exists() or (proc.returncode != 0 and check):
            raise RuntimeError(f"edge process failed ({proc.returncode}): {''.join(errors)[-2000:]}")
        return EdgeReport.from_json(json.loads(out.read_text()))


def cloud_behind_link(stack: ExitStack, link: LinkConfig, cores: set[int] | None) -> tuple[CloudProcess, BackgroundLink]:
    """The default target's cloud (``--shapes auto``) on ``cores``, behind an emulated ``link``, both closed
    with ``stack``: what the paired probes under docs/results run their edges against."""
    from cloud.models import resolve_target

    cloud = stack.enter_context(CloudProcess(str(resolve_target(None)), cores, extra_args=["--shapes", "auto"]))
    return cloud, stack.enter_context(BackgroundLink(link, cloud.port))


class BackgroundLink:
    """A ``LinkEmulator`` on its own thread; counters readable from any thread."""

    def __init__(self, config: LinkConfig, upstream_port: int) -> None:
        self.emulator = LinkEmulator(config, "127.0.0.1", 0, "127.0.0.1", upstream_port)
        self._loop = LoopThread("link-emulator")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.emulator.port}"

    def counters(self) -> tuple[int, int]:
        """(bytes up, bytes down) so far, all connections."""
        return self.emulator.bytes_up, self.emulator.bytes_down

    def arm_cuts(self, offsets) -> None:
        """``LinkEmulator.arm_cuts`` from any thread (an empty list disarms)."""

        async def arm() -> None:
            self.emulator.arm_cuts(offsets)

        self._loop.run(arm(), timeout=10)

    def __enter__(self) -> BackgroundLink:
        self._loop.start()
        self._loop.run(self.emulator.start(), timeout=10)
        return self

    def __exit__(self, *exc) -> None:
        self._loop.run(self.emulator.stop(), timeout=30)
        self._loop.stop()
