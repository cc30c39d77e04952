"""Run what `deploy/` ships on this machine's loopback: the services of a compose file
(proxy, prism-sim, SGLang, smg) with exactly the settings it renders with
`deploy/.env.example`, started from their images' ENTRYPOINT, CMD, ENV and HEALTHCHECK.

`docker-compose config` (Debian's v1, no Docker engine needed) renders the file; each
service's program is its image's entrypoint plus its compose command (or the image's
CMD), its environment the image's ENV plus its compose environment. Only what cannot
apply outside the containers is replaced, by one rule each:

* **addresses**: every service name and network alias is 127.0.0.1; every port a
  service listens on (a `--*port` flag, a `*_PORT` variable) gets a free loopback port,
  and every `http://name:port` (and `127.0.0.1:port` inside a service's own healthcheck)
  follows; binds to 0.0.0.0 or to an alias (`--*host`, `*_HOST`) become 127.0.0.1;
* **paths**: the model directory mounted from `MODEL_DIR` (`/models/...`) is the model
  the caller gives (SGLang's tiny CPU model here); the images' `PRISM_CACHE_DIR` is this
  machine's prism cache, where the builtin tokenizer the images build at build time is;
* **programs**: the images' interpreters and console scripts (`python`, `python3`,
  `prism-proxy`, `prism-sim`) resolve, through a directory first on `PATH`, to this
  checkout's Python (smg's pinned venv for the smg image, the SGLang venv for SGLang's),
  run with the checkout as working directory so that its packages are the ones imported;
* **SGLang on a CPU**: `sglang_cpu.serve`'s `CPU_ARGS` (CPU device, torch attention,
  no CUDA graphs, a small memory fraction in place of the GPU's, sleep when idle), a
  KV pool of `SGLANG_KV_TOKENS` and `sglang_environment()`; the engine's other flags and
  its whole environment are the compose file's.

Services of other images (Prometheus, Grafana) are not started here (tests/
test_deploy_stack.py runs the Prometheus binary against the CPU stack).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import yaml

from loadgen.stack.processes import free_port
from prism_proxy.config_sources import build_config
from prism_tokens.tokenizer import default_cache_dir

REPO = Path(__file__).resolve().parents[1]
ENV_EXAMPLE = REPO / "deploy" / ".env.example"
LOOPBACK = "127.0.0.1"
SGLANG_KV_TOKENS = 16384
PROFILES = [None, "scale-out", "scale-out-sidecars"]
# Which program a service runs, by the Dockerfile its image is built from.
KINDS = {
    "deploy/proxy.Dockerfile": "proxy",
    "deploy/sim.Dockerfile": "sim",
    "deploy/sglang.Dockerfile": "sglang",
    "deploy/smg.Dockerfile": "smg",
}
_URL = re.compile(r"\b(https?://)?([A-Za-z0-9][\w.-]*):(\d{2,5})\b")
# `--port`, `--control-port`, `--prometheus-port` (not `--enable-cache-report`).
_PORT_FLAG = re.compile(r"--(?:[A-Za-z0-9]+-)*port")
_HOST_FLAG = re.compile(r"--(?:[A-Za-z0-9]+-)*host")


def has_compose() -> bool:
    return shutil.which("docker-compose") is not None


# The values `deploy/.env.example` leaves to the user (docs/deploy.md: generate each).
SECRETS = (
    "PRISM_CONTROL_TOKEN", "PRISM_ENGINE_API_KEY", "PRISM_ENGINE_ADMIN_API_KEY",
    "GRAFANA_ADMIN_PASSWORD",
)  # fmt: skip


def env_file_with_token(directory: Path, token: str) -> Path:
    """`deploy/.env.example` with the values it leaves to the user (`cp deploy/.env.example
    .env` and set the secrets, as docs/deploy.md says) filled in: the control token
    `token`, the other secrets `<NAME>-<token>`; every other line as shipped."""
    text = ENV_EXAMPLE.read_text()
    for name in SECRETS:
        value = token if name == "PRISM_CONTROL_TOKEN" else f"{name.lower()}-{token}"
        text, count = re.subn(rf"^{name}=$", f"{name}={value}", text, count=1, flags=re.M)
        assert count == 1, f"deploy/.env.example no longer leaves {name} empty"
    path = directory / "deploy.env"
    path.write_text(text)
    return path


def env_file_values(path: Path) -> dict[str, str]:
    return dict(re.findall(r"^(\w+)=(.*)$", path.read_text(), flags=re.M))


def render(compose_file: str, env_file: Path) -> dict[str, Any]:
    """`docker-compose --env-file F -f FILE config`, from a clean environment (no PRISM_*
    or COMPOSE_* of the caller's leaks into the interpolation)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PRISM_", "COMPOSE_"))}
    result = subprocess.run(
        ["docker-compose", "--env-file", str(env_file), "-f", compose_file, "config"],
        cwd=REPO, env=clean, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


@dataclass(frozen=True)
class Image:
    """What a Dockerfile sets for its containers."""

    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    env: dict[str, str]
    healthcheck: str | None  # shell form
    expose: tuple[str, ...]  # the port of its API first


def read_image(dockerfile: str) -> Image:
    text = (REPO / dockerfile).read_text().replace("\\\n", " ")

    def exec_form(instruction: str) -> tuple[str, ...]:
        match = re.search(rf"^{instruction} (\[.*\])\s*$", text, flags=re.M)
        return tuple(json.loads(match.group(1))) if match else ()

    env: dict[str, str] = {}
    for line in re.findall(r"^ENV (.+)$", text, flags=re.M):
        env.update(pair.split("=", 1) for pair in shlex.split(line))
    check = re.search(r"^HEALTHCHECK .*?\bCMD (.+)$", text, flags=re.M)
    expose = tuple(re.findall(r"^EXPOSE (\d+)", text, flags=re.M))
    return Image(exec_form("ENTRYPOINT"), exec_form("CMD"), env, check and check.group(1), expose)


@dataclass
class Service:
    """One compose service as its container would run it (before localization)."""

    name: str
    kind: str
    argv: list[str]
    env: dict[str, str]
    healthcheck: list[str] | None  # argv (compose CMD form, or `sh -c` for a Dockerfile's)
    depends_on: list[str]
    aliases: list[str]
    profiles: list[str]
    volumes: list[str]
    expose: list[str]
    published: list[str]  # container ports published to the host


def services_of(config: Mapping[str, Any]) -> dict[str, Service]:
    """The services built from this repository's Dockerfiles."""
    out: dict[str, Service] = {}
    for name, spec in config["services"].items():
        dockerfile = (spec.get("build") or {}).get("dockerfile")
        if dockerfile not in KINDS:
            continue
        image = read_image(dockerfile)
        entrypoint = list(spec.get("entrypoint") or image.entrypoint)
        command = list(spec.get("command") or image.cmd)
        check = (spec.get("healthcheck") or {}).get("test")
        if check:
            assert check[0] == "CMD", check
            healthcheck = [str(a) for a in check[1:]]
        elif image.healthcheck:
            healthcheck = ["sh", "-c", image.healthcheck]
        else:
            healthcheck = None
        env = {**image.env, **{k: str(v) for k, v in (spec.get("environment") or {}).items()}}
        aliases = [
            alias
            for network in (spec.get("networks") or {}).values()
            for alias in ((network or {}).get("aliases") or [])
        ]
        out[name] = Service(
            name=name,
            kind=KINDS[dockerfile],
            argv=[str(a) for a in (*entrypoint, *command)],
            env=env,
            healthcheck=healthcheck,
            depends_on=list(spec.get("depends_on") or []),
            aliases=aliases,
            profiles=list(spec.get("profiles") or []),
            volumes=[str(v) for v in spec.get("volumes") or []],
            expose=list(image.expose),
            published=[
                str(p).split("/")[0].split(":")[-1]
                for p in spec.get("ports") or spec.get("published") or []
            ],
        )
    return out


def in_profile(service: Service, profile: str | None) -> bool:
    return not service.profiles or profile in service.profiles


def set_ports(service: Service) -> list[str]:
    """The container ports its `--*port` flags and `*_PORT` variables set."""
    ports = [
        service.argv[i + 1] for i, arg in enumerate(service.argv[:-1]) if _PORT_FLAG.fullmatch(arg)
    ]
    return ports + [value for key, value in service.env.items() if key.endswith("_PORT")]


def listening_ports(service: Service) -> list[str]:
    """The container ports a service listens on: the ports its image EXPOSEs (its API
    first), then those its flags and variables set."""
    ports = list(service.expose)
    return ports + [port for port in set_ports(service) if port not in ports]


@dataclass
class Loopback:
    """Where each service lives on this machine: names → 127.0.0.1, container ports →
    free loopback ports. `same` maps a service to another whose process stands in for
    it (one real SGLang for the replicas of the GPU file)."""

    services: dict[str, Service]
    model_dir: Path | None = None
    model_mount: Path | None = None  # the host directory mounted as the model directory
    same: dict[str, str] = field(default_factory=dict)
    ports: dict[tuple[str, str], int] = field(default_factory=dict)

    def owner(self, host: str, self_name: str | None = None) -> str | None:
        if host in (LOOPBACK, "localhost"):
            return self_name
        for service in self.services.values():
            if host == service.name or host in service.aliases:
                return self.same.get(service.name, service.name)
        return None

    def port(self, service: str, container_port: str) -> int:
        key = (self.same.get(service, service), str(container_port))
        if key not in self.ports:
            self.ports[key] = free_port()
        return self.ports[key]

    def url(self, service: str, container_port: str) -> str:
        return f"http://{LOOPBACK}:{self.port(service, container_port)}"

    def _addresses(self, text: str, self_name: str | None) -> str:
        def replace(match: re.Match[str]) -> str:
            scheme, host, port = match.groups()
            owner = self.owner(host, self_name)
            if owner is None:
                return match.group(0)
            return f"{scheme or ''}{LOOPBACK}:{self.port(owner, port)}"

        return _URL.sub(replace, text)

    def _paths(self, service: Service, text: str) -> str:
        """A path inside the mounted model directory is the given model."""
        if self.model_dir is None or self.model_mount is None:
            return text
        for volume in service.volumes:
            source, target = volume.split(":")[:2]
            if Path(source) == self.model_mount and (
                text == target or text.startswith(target + "/")
            ):
                return str(self.model_dir)
        return text

    def _value(self, service: Service, text: str) -> str:
        return self._paths(service, self._addresses(text, service.name))

    def argv(self, service: Service) -> list[str]:
        out: list[str] = []
        args = service.argv
        for i, arg in enumerate(args):
            flag = args[i - 1] if i else ""
            if _PORT_FLAG.fullmatch(flag):
                out.append(str(self.port(service.name, arg)))
            elif _HOST_FLAG.fullmatch(flag) and (arg == "0.0.0.0" or self.owner(arg)):
                out.append(LOOPBACK)
            else:
                out.append(self._value(service, arg))
        return out

    def env(self, service: Service) -> dict[str, str]:
        out: dict[str, str] = {}
        for key, value in service.env.items():
            if key.endswith("_PORT"):
                value = str(self.port(service.name, value))
            elif key.endswith("_LISTEN") and value.startswith("0.0.0.0:"):
                # a listener on all of the container's addresses (PRISM_METRICS_LISTEN)
                value = f"{LOOPBACK}:{self.port(service.name, value.rpartition(':')[2])}"
            elif key.endswith("_HOST") and (value == "0.0.0.0" or self.owner(value)):
                value = LOOPBACK
            elif key == "PRISM_CACHE_DIR":
                value = str(default_cache_dir())  # this machine's, as its user set it
            else:
                value = self._value(service, value)
            out[key] = value
        return out

    def healthcheck(self, service: Service) -> list[str] | None:
        if service.healthcheck is None:
            return None
        return [self._addresses(arg, service.name) for arg in service.healthcheck]


def console_scripts() -> dict[str, str]:
    """`name → module:function` of this project's console scripts."""
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]


def program_dir(directory: Path, python: str) -> Path:
    """A directory to put first on PATH: `python`, `python3` and the project's console
    scripts, each running `python` from this checkout."""
    directory.mkdir(parents=True, exist_ok=True)
    # Scripts, not symlinks: a venv's python finds its venv by the path it is run as.
    scripts = {name: f"exec {shlex.quote(python)}" for name in ("python", "python3")}
    for name, target in console_scripts().items():
        module, function = target.split(":")
        code = f"import sys; from {module} import {function}; sys.argv[0] = {name!r}; "
        code += f"sys.exit({function}())"
        scripts[name] = f"exec {shlex.quote(python)} -c {shlex.quote(code)}"
    for name, command in scripts.items():
        script = directory / name
        script.write_text(f'#!/bin/sh\n{command} "$@"\n')
        script.chmod(0o755)
    return directory


@dataclass
class Running:
    """One started service."""

    service: Service
    process: subprocess.Popen[bytes]
    log_path: Path
    argv: list[str]
    env: dict[str, str]

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the service's process group, SIGKILL it after the grace period."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=grace_s)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


# The Python each image's programs run on here.
Pythons = Mapping[str, str]


class Stack:
    """The services of one compose file and profile, started in dependency order, each
    healthy (its healthcheck passes; smg: its readiness) before its dependents start."""

    def __init__(
        self,
        config: Mapping[str, Any],
        profile: str | None,
        workdir: Path,
        *,
        pythons: Pythons,
        model_dir: Path | None = None,
        model_mount: Path | None = None,
        same: Mapping[str, str] | None = None,
        loopback: Loopback | None = None,
        extra_args: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        everything = services_of(config)
        self.services = {n: s for n, s in everything.items() if in_profile(s, profile)}
        self.loopback = loopback or Loopback(everything, model_dir, model_mount, dict(same or {}))
        self.workdir = workdir
        self.pythons = pythons
        self.extra_args = extra_args or {}
        self.running: dict[str, Running] = {}

    def order(self) -> list[str]:
        done: list[str] = []

        def visit(name: str) -> None:
            if name in done:
                return
            for dependency in self.services[name].depends_on:
                visit(dependency)
            done.append(name)

        for name in self.services:
            visit(name)
        return done

    def process_env(self, service: Service) -> dict[str, str]:
        kind = service.kind
        bin_dir = program_dir(self.workdir / f"bin-{kind}", self.pythons[kind])
        base = {k: v for k, v in os.environ.items() if not k.startswith(("PRISM_", "COMPOSE_"))}
        base["PATH"] = f"{bin_dir}{os.pathsep}{base.get('PATH', '')}"
        if kind == "sglang":
            from sglang_cpu.serve import sglang_environment

            base = sglang_environment(base)
        if kind == "smg":
            from loadgen.stack.peer_lines import OFFLINE_ENV

            base.update(OFFLINE_ENV)
        return {**base, **self.loopback.env(service)}

    def process_argv(self, service: Service) -> list[str]:
        """The service's argv, localized; an EXPOSEd port that nothing sets (the
        program's default) is moved to its loopback port with the program's `--port`."""
        argv = self.loopback.argv(service)
        for port in service.expose:
            if port not in set_ports(service):
                argv += ["--port", str(self.loopback.port(service.name, port))]
        if service.kind == "sglang":
            from sglang_cpu.serve import CPU_ARGS

            argv += [*CPU_ARGS, "--max-total-tokens", str(SGLANG_KV_TOKENS)]
        return [*argv, *self.extra_args.get(service.name, ())]

    def start(self, name: str, timeout_s: float) -> Running:
        service = self.services[name]
        argv, env = self.process_argv(service), self.process_env(service)
        log_path = self.workdir / f"{name}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        running = Running(service, process, log_path, argv, env)
        self.running[name] = running
        try:
            self.wait_healthy(running, timeout_s)
        except BaseException:
            raise RuntimeError(f"{name} did not start:\n{running.log_text()[-4000:]}") from None
        return running

    def wait_healthy(self, running: Running, timeout_s: float) -> None:
        """Run the service's healthcheck until it passes (Docker's `service_healthy`);
        smg, which ships none, until its `/readiness` answers 200."""
        check = self.loopback.healthcheck(running.service)
        deadline = time.monotonic() + timeout_s
        while True:
            if running.process.poll() is not None:
                raise RuntimeError(f"exited with code {running.process.returncode}")
            if check is not None:
                done = subprocess.run(
                    check, cwd=REPO, env=running.env, capture_output=True, timeout=30, check=False
                )
                if done.returncode == 0:
                    return
            else:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(self.base_url(running.service.name) + "/readiness").is_success:
                        return
            if time.monotonic() > deadline:
                raise TimeoutError(f"not healthy after {timeout_s:.0f} s")
            time.sleep(0.2)

    def base_url(self, name: str) -> str:
        """The URL of a service's first listening port (its HTTP API)."""
        return self.loopback.url(name, listening_ports(self.services[name])[0])

    def up(
        self, timeout_s: Callable[[Service], float], skip: frozenset[str] = frozenset()
    ) -> Stack:
        for name in self.order():
            if name not in skip and name not in self.running:
                self.start(name, timeout_s(self.services[name]))
        return self

    def down(self) -> None:
        for name in reversed(list(self.running)):
            self.running.pop(name).stop()

    def of_kind(self, kind: str) -> list[str]:
        return [name for name, service in self.services.items() if service.kind == kind]


@contextlib.contextmanager
def stack_up(stack: Stack, timeout_s: Callable[[Service], float], **kwargs: Any) -> Iterator[Stack]:
    try:
        yield stack.up(timeout_s, **kwargs)
    finally:
        stack.down()


def dockerfile_examples(variables: Mapping[str, str]) -> dict[str, Any]:
    """The `docker build -f F -t NAME .` and `docker run [-p P] [-e K=V] NAME [ARGS]`
    lines of the Dockerfiles' headers as a compose-like config: one service per run
    line, named by its image, its arguments in place of the image's CMD (as `docker
    run` does), `$NAME` in them taken from `variables`. `published` lists the
    container ports each line publishes."""
    services: dict[str, Any] = {}
    for dockerfile in KINDS:
        header = re.match(r"(?:#.*\n)*", (REPO / dockerfile).read_text()).group(0)
        text = re.sub(r"\\\n#\s*", " ", header)
        images = {name: path for path, name in re.findall(r"docker build -f (\S+) -t (\S+)", text)}
        for line in re.findall(r"docker run (.+)", text):
            words = shlex.split(re.sub(r"\$(\w+)", lambda m: variables[m.group(1)], line))
            env, published = {}, []
            while words[0].startswith("-"):
                option, value = words[0], words[1]
                words = words[2:]
                if option == "-e":
                    key, _, env_value = value.partition("=")
                    env[key] = env_value
                elif option == "-p":
                    published.append(value.split(":")[-1])
            image, args = words[0], words[1:]
            services[image] = {
                "build": {"dockerfile": images.get(image, dockerfile)},
                "environment": env,
                "command": args or None,
                "published": published,
            }
    return {"services": services}


# --- what the deployment tests check on a running stack ----------------------------


def chat(base_url: str, api_key: str | None = None) -> Any:
    """One chat with the real openai client, the model named as the server lists it;
    `api_key`: what a server that requires a key (smg with `--api-key`) wants."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    models = httpx.get(base_url + "/v1/models", headers=headers, timeout=30)
    model = models.json()["data"][0]["id"]
    client = openai.OpenAI(base_url=base_url + "/v1", api_key=api_key or "unused", timeout=120)
    try:
        return client.chat.completions.create(
            model=model,
            messages=[
                {"role": "system", "content": "You answer in one word."},
                {"role": "user", "content": "Name a colour."},
            ],
            max_tokens=4,
        )
    finally:
        client.close()


def assert_served(answer: Any) -> None:
    assert answer.choices[0].message.role == "assistant"
    assert isinstance(answer.choices[0].message.content, str)
    assert answer.usage.prompt_tokens > 0 and answer.usage.completion_tokens >= 1


def assert_runs_with_its_settings(stack: Stack, name: str, engine_url: str) -> None:
    """The proxy's settings by its own account match what its environment gave it, and
    automatic pacing learned the engine's limits (through smg too), once per replica."""
    env = stack.running[name].env
    expected = build_config({}, {k: v for k, v in env.items() if k.startswith("PRISM_")})
    proxy_url = stack.base_url(name)
    settings = httpx.get(proxy_url + "/server_info", timeout=30).json()["prism"]["settings"]
    assert settings["policy"] == expected.policy
    assert settings["qas_variant"] == expected.qas_variant
    mode = {None: "auto"}.get(expected.prefill_batch, "fixed")
    assert settings["prefill_batch"]["mode"] == mode
    mode = {None: "auto"}.get(expected.max_inflight, "fixed")
    assert settings["backstop"]["mode"] == mode
    assert settings["control_rpcs"] == len(expected.control_urls) > 0
    assert settings["backend_replicas"] == expected.replicas
    if expected.max_inflight is None:
        key = expected.engine_api_key
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        engine = httpx.get(engine_url + "/server_info", headers=headers, timeout=30).json()
        running = engine["internal_states"][0]["effective_max_running_requests_per_dp"]

        def backstop() -> int:
            info = httpx.get(proxy_url + "/server_info", timeout=30).json()
            return int(info["prism"]["inflight_limit"])

        eventually(lambda: backstop() == expected.replicas * running, timeout_s=60)


def accepted_epoch(control_url: str, token: str) -> int:
    """The epoch of the last priority table a DART control RPC took."""
    headers = {"Authorization": f"Bearer {token}"}
    stats = httpx.get(control_url + "/prism/stats", headers=headers, timeout=30)
    assert stats.status_code == 200, stats.text
    return int(stats.json()["accepted_epoch"])


def eventually(predicate: Callable[[], bool], timeout_s: float) -> None:
    """Poll until `predicate()` holds (a wait for a background effect, not a timing
    assertion)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached before the deadline"
        time.sleep(0.1)
