"""`pip install .` into fresh virtual environments, one per Python, and what runs there.

    python -m bench.fresh_install [--pythons python3.11,python3.12,python3.13]
                                  [--extras-on python3.13] [--keep DIR]

For each Python: a new venv, `pip install <this repository>` (the runtime only, as the
proxy's image installs it), then

* `prism-proxy --help`, `prism-sim --help` and `prism-loadgen --help` run (exit 0);
* none of the `loadgen` extra's distributions is installed (numpy, matplotlib, ...);
* `prism-loadgen trace rag` exits 2 naming `pip install 'prism-serving[loadgen]'`;
* a smoke: prism-sim and prism-proxy started from that venv on free loopback ports, one
  chat completion and one `/generate` through the proxy (stdlib HTTP client: 200 each);

and on the `--extras-on` Pythons also `pip install '.[loadgen]'` and a small
`prism-loadgen trace rag`. Prints one line per check and a summary per Python; exits 1
when any check failed. Too slow for `make test` (minutes: pip builds the wheel and
installs from the registry); docs/install.md quotes its output.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from loadgen.cli import EXTRA_HINT, LOADGEN_EXTRA_MODULES
from loadgen.stack.processes import engine_args, proxy_args

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Report:
    python: str
    version: str = "?"
    checks: list[tuple[str, bool, str]] = field(default_factory=list)

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append((name, ok, detail))
        print(f"  [{'ok' if ok else 'FAIL'}] {name}{': ' + detail if detail else ''}", flush=True)
        return ok

    @property
    def ok(self) -> bool:
        return all(ok for _, ok, _ in self.checks)


def run(args: Sequence[str], timeout_s: float = 900.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, check=False)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http(url: str, body: dict | None = None, timeout_s: float = 60.0) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_up(url: str, process: subprocess.Popen[bytes], timeout_s: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if http(url + "/health", timeout_s=2.0)[0] == 200:
                return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def smoke(report: Report, bin_dir: Path, workdir: Path) -> None:
    """prism-sim and prism-proxy from the venv; a chat and a /generate through."""
    sim_port, proxy_port = free_port(), free_port()
    logs = [open(workdir / name, "wb") for name in ("sim.log", "proxy.log")]  # noqa: SIM115
    sim = subprocess.Popen(
        [str(bin_dir / "prism-sim"), *engine_args({"port": sim_port, "speed": 20})],
        stdout=logs[0], stderr=subprocess.STDOUT, cwd=workdir,
    )  # fmt: skip
    proxy = None
    try:
        sim_url = f"http://127.0.0.1:{sim_port}"
        if not report.check("prism-sim serves", wait_up(sim_url, sim)):
            return
        proxy = subprocess.Popen(
            [str(bin_dir / "prism-proxy"), *proxy_args({"port": proxy_port, "backend": sim_url})],
            stdout=logs[1], stderr=subprocess.STDOUT, cwd=workdir,
        )  # fmt: skip
        url = f"http://127.0.0.1:{proxy_port}"
        if not report.check("prism-proxy serves in front of it", wait_up(url, proxy)):
            return
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        status, body = http(url + "/v1/chat/completions", chat)
        content = json.loads(body)["choices"][0]["message"]["content"] if status == 200 else ""
        report.check("a chat through the proxy", status == 200, f"HTTP {status} {content!r}")
        generate = {"text": "hello", "sampling_params": {"max_new_tokens": 4}}
        status, body = http(url + "/generate", generate)
        report.check("/generate through the proxy", status == 200, f"HTTP {status}")
    finally:
        for process in (proxy, sim):
            if process is not None:
                process.terminate()
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
        for log in logs:
            log.close()


def find_python(name: str) -> str | None:
    """`name` when it runs; else pyenv's interpreter of that name (its shims refuse a
    version that is not selected)."""
    found = shutil.which(name)
    if found is not None and run([found, "-c", "pass"], timeout_s=60).returncode == 0:
        return found
    for candidate in sorted(Path.home().glob(f".pyenv/versions/*/bin/{name}")):
        return str(candidate)
    return None


def required_by(py: str, name: str) -> list[str]:
    """The installed distributions that require `name` (pip show's Required-by)."""
    shown = run([py, "-m", "pip", "show", name]).stdout
    line = next((ln for ln in shown.splitlines() if ln.startswith("Required-by:")), "")
    return [part.strip() for part in line.partition(":")[2].split(",") if part.strip()]


def check_python(python: str, extras: bool, keep: Path | None) -> Report:
    report = Report(python)
    found = find_python(python)
    print(f"{python}:", flush=True)
    if not report.check("interpreter found", found is not None, found or "not found"):
        return report
    workdir = Path(tempfile.mkdtemp(prefix=f"prism-install-{python}-", dir=keep))
    python = found
    venv = workdir / "venv"
    made = run([python, "-m", "venv", str(venv)])
    if not report.check("venv", made.returncode == 0, made.stderr.strip()[-300:]):
        return report
    bin_dir = venv / "bin"
    py = str(bin_dir / "python")
    report.version = run([py, "-c", "import sys; print(sys.version.split()[0])"]).stdout.strip()
    started = time.monotonic()
    # a copy: pip builds in the source tree's build/ otherwise
    source = workdir / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".venv*", ".git", "runs", "build", "*.egg-info", "__pycache__", ".*cache*"))  # fmt: skip
    installed = run([py, "-m", "pip", "install", "-q", str(source)])
    detail = f"{time.monotonic() - started:.0f} s" if installed.returncode == 0 else (
        installed.stderr.strip()[-600:])  # fmt: skip
    if not report.check("pip install .", installed.returncode == 0, detail):
        return report
    for command in ("prism-proxy", "prism-sim", "prism-loadgen"):
        result = run([str(bin_dir / command), "--help"], timeout_s=120)
        report.check(f"{command} --help", result.returncode == 0, result.stderr.strip()[-300:])
    listed = run([py, "-m", "pip", "list", "--format=json"]).stdout
    names = {entry["name"].lower() for entry in json.loads(listed or "[]")}
    # The extra's modules are named as their distributions (tests/test_packaging.py).
    # One that the runtime's own dependencies require (tqdm: huggingface-hub, under
    # tokenizers) is theirs, not the load generator's.
    present = {name: required_by(py, name) for name in sorted(LOADGEN_EXTRA_MODULES & names)}
    pulled = [name for name, users in present.items() if not users]
    notes = "; ".join(f"{name} (required by {', '.join(users)})" for name, users in present.items()
                      if users)  # fmt: skip
    report.check(
        "no load-generator packages in the runtime install", not pulled,
        f"{len(names)} distributions" + (f"; found {pulled}" if pulled else "")
        + (f"; {notes}" if notes else ""),
    )  # fmt: skip
    trace = run([str(bin_dir / "prism-loadgen"), "trace", "rag", "--out", str(workdir / "t")])
    report.check(
        "prism-loadgen trace without the extra: exit 2 naming the extra",
        trace.returncode == 2 and EXTRA_HINT in trace.stderr, trace.stderr.strip(),
    )  # fmt: skip
    smoke(report, bin_dir, workdir)
    if extras:
        started = time.monotonic()
        installed = run([py, "-m", "pip", "install", "-q", f"{source}[loadgen]"])
        detail = f"{time.monotonic() - started:.0f} s" if installed.returncode == 0 else (
            installed.stderr.strip()[-600:])  # fmt: skip
        if report.check("pip install '.[loadgen]'", installed.returncode == 0, detail):
            out = workdir / "trace.jsonl"
            trace = run([str(bin_dir / "prism-loadgen"), "trace", "rag", "--num-requests", "20",
                         "--out", str(out)])  # fmt: skip
            report.check("prism-loadgen trace rag with the extra", trace.returncode == 0,
                         (trace.stdout + trace.stderr).strip()[-300:])  # fmt: skip
    if keep is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pythons", default="python3.11,python3.12,python3.13")
    parser.add_argument("--extras-on", default="python3.13", help="also install [loadgen]")
    parser.add_argument("--keep", type=Path, default=None, help="keep the venvs under DIR")
    args = parser.parse_args()
    extras_on = set(filter(None, args.extras_on.split(",")))
    reports = [
        check_python(python, python in extras_on, args.keep)
        for python in filter(None, args.pythons.split(","))
    ]
    print()
    for report in reports:
        passed = sum(ok for _, ok, _ in report.checks)
        print(f"{report.python} ({report.version}): {passed}/{len(report.checks)} checks passed")
    return 0 if all(report.ok for report in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
