"""Checks the Dockerfile and docker-compose.yml as far as a machine without
a Docker engine can (scripts/check-container runs this):

- docker-compose.yml parses; the gateway waits for a healthy postgres:16
  with a named volume; every file it mounts or reads exists (an env file as
  its committed .example); the config it mounts is one the gateway accepts;
  the database's password (POSTGRES_*) is not in the gateway's environment,
  and the gateway is its container's PID 1;
- the Dockerfile builds with the command CI's own builds use (cargo build
  --locked --bin acp-gateway, here with --release), copies only what
  exists, and runs unprivileged with a health check and a data volume;
- the image's command, run as the image runs it (its ENV, ENTRYPOINT and
  CMD, with the binary CI built), refuses to listen on 0.0.0.0 without a
  token; after the documented first-token command it starts, and the
  image's HEALTHCHECK command succeeds against it.
"""

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
GATEWAY = Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target") / "debug" / "acp-gateway"
failures = []


def check(condition, what):
    if not condition:
        failures.append(what)
    return condition


def dockerfile_stages(text):
    """[(stage name, [(instruction, argument)])], continuation lines joined."""
    logical, current = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        current += " " + stripped.rstrip("\\").strip() if current else stripped.rstrip("\\").strip()
        if not stripped.endswith("\\"):
            logical.append(current)
            current = ""
    stages = []
    for line in logical:
        instruction, _, argument = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            name = argument.split(" AS ")[-1].strip() if " AS " in argument else argument
            stages.append((name, []))
        elif stages:
            stages[-1][1].append((instruction, argument.strip()))
    return stages


def check_compose():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose.get("services", {})
    postgres, gateway = services.get("postgres", {}), services.get("gateway", {})
    check(str(postgres.get("image", "")).startswith("postgres:16"), "compose: postgres is postgres:16")
    check(postgres.get("healthcheck", {}).get("test"), "compose: postgres has a healthcheck")
    depends = gateway.get("depends_on", {})
    check(
        isinstance(depends, dict) and depends.get("postgres", {}).get("condition") == "service_healthy",
        "compose: the gateway waits for a healthy postgres",
    )
    check(gateway.get("build") == "." and (ROOT / "Dockerfile").is_file(), "compose: the gateway builds ./Dockerfile")
    declared = set((compose.get("volumes") or {}).keys())
    config_mount = None
    for service_name, service in services.items():
        env_files = service.get("env_file", [])
        for env_file in [env_files] if isinstance(env_files, str) else env_files:
            path = ROOT / env_file
            check(path.is_file() or Path(str(path) + ".example").is_file(), f"compose: {service_name} env_file {env_file} (or its .example)")
        for volume in service.get("volumes", []):
            source, target, *mode = volume.split(":")
            if source.startswith((".", "/")):
                check((ROOT / source).exists(), f"compose: {service_name} mounts {source}, which exists")
                if target.endswith(".toml"):
                    config_mount = (ROOT / source, target, mode)
            else:
                check(source in declared, f"compose: volume {source} is declared")
    check(postgres.get("volumes") and any(":" in v and not v.startswith((".", "/")) for v in postgres["volumes"]), "compose: postgres keeps its data in a named volume")
    if check(config_mount is not None, "compose: the gateway's config is mounted"):
        source, target, mode = config_mount
        check(mode == ["ro"], "compose: the config is mounted read-only")
        check(target in gateway.get("command", []), "compose: the gateway is started with the mounted config")
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, DATABASE_URL=f"sqlite://{tmp}/check.db")
            accepted = subprocess.run([str(GATEWAY), "token", "list", "--config", str(source)], env=env, capture_output=True, text=True)
            check(accepted.returncode == 0, f"compose: the gateway accepts {source.relative_to(ROOT)}: {accepted.stderr.strip()}")
    gateway_keys, postgres_keys = environment_keys(gateway), environment_keys(postgres)
    check({"POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB"} <= postgres_keys, "compose: postgres's env example sets its user, password and database")
    check({"DATABASE_URL", "DATABASE_URL_FILE"} & gateway_keys, "compose: the gateway's env example gives it its database")
    check(not {k for k in gateway_keys if k.startswith("POSTGRES_")}, "compose: no POSTGRES_* variable (the database's password) in the gateway's environment")
    check(not gateway.get("init"), "compose: the gateway is its container's PID 1 (an init's environment would be readable by agents of the gateway's user)")


def environment_keys(service):
    """The variables a service's environment gets: its env files (their committed
    .example where there is one) and its `environment`."""
    keys = set()
    env_files = service.get("env_file", [])
    for env_file in [env_files] if isinstance(env_files, str) else env_files:
        path = ROOT / env_file
        example = Path(str(path) + ".example")
        path = example if example.is_file() else path
        if path.is_file():
            keys |= {line.split("=", 1)[0].strip() for line in path.read_text().splitlines() if "=" in line and not line.lstrip().startswith("#")}
    environment = service.get("environment") or {}
    keys |= set(environment) if isinstance(environment, dict) else {e.split("=", 1)[0] for e in environment}
    return keys


def check_dockerfile():
    stages = dict(dockerfile_stages((ROOT / "Dockerfile").read_text()))
    build, runtime = stages.get("build", []), stages.get("runtime", [])
    check(build and runtime, "Dockerfile: stages build and runtime")
    runs = " ".join(arg for ins, arg in build if ins == "RUN")
    check("cargo build --release --locked --bin acp-gateway" in runs, "Dockerfile: the build runs cargo build --release --locked --bin acp-gateway")
    for ins, arg in build:
        if ins == "COPY" and not arg.startswith("--from"):
            for source in arg.split()[:-1]:
                check((ROOT / source).exists(), f"Dockerfile: COPY {source} exists")
    # What the sources embed (include_str!, include_bytes!, sqlx's migrate!) must be in the build.
    copied = {source.rstrip("/") for ins, arg in build if ins == "COPY" and not arg.startswith("--from") for source in arg.split()[:-1]}
    for rs in sorted((ROOT / "src").rglob("*.rs")):
        for included in re.findall(r'include_(?:str|bytes)!\(\s*"([^"]+)"', rs.read_text()):
            path = (rs.parent / included).resolve().relative_to(ROOT)
            check(path.parts[0] in copied, f"Dockerfile: COPY {path.parts[0]} ({rs.relative_to(ROOT)} embeds {path})")
    users = [arg for ins, arg in runtime if ins == "USER"]
    check(users and users[-1] not in ("root", "0"), "Dockerfile: the runtime runs unprivileged")
    runs = " ".join(arg for ins, arg in runtime if ins == "RUN")
    uid = re.search(r"useradd .*--uid (\d+)", runs)
    check(uid and users and users[-1] == uid.group(1), "Dockerfile: the runtime's USER is the user it creates")
    check(any(ins == "VOLUME" for ins, _ in runtime), "Dockerfile: a data volume")
    return runtime


def image_command(runtime):
    """The image's environment, command and health check."""
    env, entrypoint, cmd, health = {}, [], [], None
    for ins, arg in runtime:
        if ins == "ENV":
            for part in shlex.split(arg):
                key, _, value = part.partition("=")
                env[key] = value
        elif ins == "ENTRYPOINT":
            entrypoint = json.loads(arg)
        elif ins == "CMD":
            cmd = json.loads(arg)
        elif ins == "HEALTHCHECK":
            probe = arg.split(" CMD ", 1)[1]
            health = json.loads(probe) if probe.startswith("[") else ["sh", "-c", probe]
    return env, entrypoint + cmd, health


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_as_the_image(runtime):
    env, command, health = image_command(runtime)
    check(env.get("ACP_GATEWAY_LISTEN") == "0.0.0.0:8080", "Dockerfile: listens on 0.0.0.0:8080")
    check(command[:1] == ["acp-gateway"], "Dockerfile: runs acp-gateway")
    if not check(health, "Dockerfile: a HEALTHCHECK"):
        return
    port = free_port()
    with tempfile.TemporaryDirectory() as data:
        run_env = dict(os.environ, **env)
        run_env["ACP_GATEWAY_LISTEN"] = env["ACP_GATEWAY_LISTEN"].replace("8080", str(port))
        run_env["XDG_DATA_HOME"] = data
        run_env.pop("DATABASE_URL", None)
        argv = [str(GATEWAY)] + command[1:]
        refused = subprocess.run(argv, env=run_env, capture_output=True, text=True, timeout=60, cwd=data)
        check(refused.returncode != 0 and "refusing to listen" in refused.stderr + refused.stdout, "the image refuses to serve on 0.0.0.0 without a token")
        # The first token, as deploy/README.md says to create it.
        token = subprocess.run([str(GATEWAY), "token", "create", "--user", "admin", "--role", "operator"], env=run_env, capture_output=True, text=True, timeout=60, cwd=data)
        if not check(token.returncode == 0, f"the first token is created: {token.stderr}"):
            return
        gateway = subprocess.Popen(argv, env=run_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=data)
        try:
            listening = False
            for line in gateway.stdout:
                if "acp-gateway listening" in line:
                    listening = True
                    break
            if check(listening, "the image's command starts serving"):
                probe = [part.replace("8080", str(port)) for part in health]
                healthy = subprocess.run(probe, capture_output=True, text=True, timeout=30)
                check(healthy.returncode == 0, f"the image's HEALTHCHECK passes: {healthy.stderr.strip()}")
        finally:
            gateway.terminate()
            gateway.wait(timeout=30)


check_compose()
runtime = check_dockerfile()
run_as_the_image(runtime)
if failures:
    print("check-container: FAILED", *failures, sep="\n  ", file=sys.stderr)
    sys.exit(1)
print("check-container: docker-compose.yml and the Dockerfile check out")
