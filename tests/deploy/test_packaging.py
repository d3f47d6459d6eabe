"""The packaging and deployment files: Dockerfile (statically: no Docker engine runs here), the systemd
unit (its hardening; ``systemd-analyze verify`` and ``security``), the Kubernetes manifests (locked
down, no default secret, a NetworkPolicy) and the Prometheus rules (``promtool check rules``): they
parse, agree with each other and with the daemon, and every ``compactord_*`` name under ``deploy/`` is
checked against a running daemon's ``/metrics``. Tests that need ``systemd-analyze`` or ``promtool``
skip, saying which package has it, where the tool is absent.
"""

from __future__ import annotations

import json
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from compactord.config import KEYS_BY_NAME, settings_from_properties
from compactord.embedded import free_port
from compactord.properties import load_properties
from tests.support.daemon import DaemonProcess, compact, write_conf

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
UNIT = DEPLOY / "systemd" / "compactord.service"
KUBERNETES = DEPLOY / "kubernetes"
CONF_PATH = "/etc/compactord/broker.conf"
SECRET_NAME = "compactord-secrets"
COMMAND = ["compactord", "run", "--config", CONF_PATH]
METRIC_NAME = re.compile(r"\bcompactord_[a-z_]+")


# -- Dockerfile --------------------------------------------------------------------------------------


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined and comments dropped."""
    instructions: list[tuple[str, str]] = []
    current = ""
    for line in (ROOT / "Dockerfile").read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):  # a comment inside a continued instruction
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        word, _, args = current.partition(" ")
        instructions.append((word.upper(), args.strip()))
        current = ""
    assert not current, "the Dockerfile ends inside a continued line"
    return instructions


def args_of(name: str) -> list[str]:
    return [args for word, args in dockerfile() if word == name]


def test_dockerfile_base_is_a_pinned_slim_bookworm_python_3_11() -> None:
    froms = args_of("FROM")
    assert len(froms) == 1, froms
    image = froms[0].split()[0]
    # a full tag (3.11.PATCH), never latest or a moving 3.11; bookworm because trixie has no Java 17
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?", image), image


def test_dockerfile_installs_java_17_without_recommends_and_cleans_the_lists() -> None:
    runs = args_of("RUN")
    java = [run for run in runs if "openjdk-17-jre-headless" in run]
    assert len(java) == 1, "openjdk-17-jre-headless must be installed by one RUN"
    assert "apt-get update" in java[0] and "--no-install-recommends" in java[0]
    assert "rm -rf /var/lib/apt/lists/*" in java[0], "the apt lists must be removed in the same layer"
    env = " ".join(args_of("ENV"))
    assert "JAVA_HOME=" in env
    assert "PYSPARK_PYTHON=/usr/local/bin/python" in env


def test_dockerfile_installs_the_package_from_the_copied_tree() -> None:
    copied = " ".join(args_of("COPY"))
    for needed in ("pyproject.toml", "README.md", "compactord"):  # pyproject's readme= needs README.md
        assert needed in copied
    # The copied tree with the s3 extra (boto3), so that the image serves an s3:// ledger root too.
    assert any(re.search(r"pip install --no-cache-dir '\.\[s3\]'(\s|$)", run) for run in args_of("RUN"))
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    assert any(dep.startswith("boto3") for dep in extras["s3"])
    ignore = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    assert "*" in ignore and "!compactord" in ignore, ".dockerignore must keep .venv and data/ out"


def test_dockerfile_runs_as_a_system_user_that_is_not_root() -> None:
    assert any("useradd --system" in run for run in args_of("RUN"))
    users = args_of("USER")
    assert users, "no USER: the daemon would run as root"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")


def test_dockerfile_volume_port_healthcheck_and_command() -> None:
    volumes = " ".join(args_of("VOLUME"))
    assert "/var/lib/compactord" in volumes
    assert args_of("EXPOSE") == ["8642"]
    (health,) = args_of("HEALTHCHECK")
    assert health.split()[0].startswith("--") or health.startswith("CMD")
    command = health[health.index("CMD") + 3:].strip()
    # slim images have no curl: the check is Python's urllib, against /healthz
    assert "urllib" in command and "http://127.0.0.1:8642/healthz" in command and "curl" not in command
    (cmd,) = args_of("CMD")
    assert json.loads(cmd) == COMMAND
    entrypoints = args_of("ENTRYPOINT")
    assert entrypoints in ([], ['["/usr/bin/tini", "--"]']), "only an init that forwards signals may wrap it"


def test_dockerfile_default_config_binds_everywhere_with_a_token_file_and_the_volume_root() -> None:
    (run,) = [run for run in args_of("RUN") if CONF_PATH in run and "printf" in run]
    props = load_properties("\n".join(re.findall(r"'([A-Za-z][\w.]*=[^']*)'", run)))
    assert set(props) <= set(KEYS_BY_NAME), set(props) - set(KEYS_BY_NAME)
    assert props["httpBindAddress"] == "0.0.0.0"
    assert props["httpAuthToken"] == "file:/run/secrets/compactord-token"
    assert props["compactedLedgerRoot"] == "/var/lib/compactord/ledgers"
    assert props.get("httpPort", "8642") == "8642"


# -- systemd -----------------------------------------------------------------------------------------


def unit_entries() -> dict[str, dict[str, list[str]]]:
    sections: dict[str, dict[str, list[str]]] = {}
    section = ""
    for line in UNIT.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            sections[section] = {}
            continue
        key, _, value = line.partition("=")
        sections[section].setdefault(key, []).append(value)
    return sections


def test_systemd_unit_settings() -> None:
    service = {key: values[-1] for key, values in unit_entries()["Service"].items()}
    assert service["User"] == "compactord" and service["DynamicUser"] == "no"
    assert service["Restart"] == "on-failure"
    assert shlex.split(service["ExecStart"]) == ["/opt/compactord/bin/compactord", *COMMAND[1:]]
    assert service["KillSignal"] == "SIGTERM"
    # SIGTERM to the daemon only: with control-group mode the Spark JVM would die under a running switch
    assert service["KillMode"] == "mixed"
    assert int(service["TimeoutStopSec"]) >= 120
    assert service["StateDirectory"] == "compactord"
    assert service["PrivateTmp"] == "yes"
    assert "MemoryDenyWriteExecute" not in service, "Java's JIT needs writable and executable memory"


def test_systemd_unit_names_no_documentation_that_nothing_installs() -> None:
    # pip puts no documents on the host: a file: path would make `systemctl help compactord` fail
    documents = unit_entries()["Unit"].get("Documentation", [])
    assert not [d for d in documents if d.startswith("file:")], documents


HARDENING = {
    "NoNewPrivileges": "yes", "CapabilityBoundingSet": "", "AmbientCapabilities": "",
    "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes", "PrivateDevices": "yes",
    "ProtectKernelTunables": "yes", "ProtectKernelModules": "yes", "ProtectKernelLogs": "yes",
    "ProtectControlGroups": "yes", "RestrictNamespaces": "yes", "LockPersonality": "yes",
    "RestrictRealtime": "yes", "RestrictSUIDSGID": "yes", "SystemCallArchitectures": "native",
    "SystemCallErrorNumber": "EPERM",
}


def test_systemd_unit_is_hardened_as_far_as_spark_allows() -> None:
    entries = unit_entries()["Service"]
    service = {key: values[-1] for key, values in entries.items()}
    assert {key: service.get(key) for key in HARDENING} == HARDENING
    # the only writable places: the StateDirectory holding the ledger root, and the private /tmp
    assert service["ReadWritePaths"].split() == ["/var/lib/compactord"]
    assert service["WorkingDirectory"] == "/var/lib/compactord"
    # the JVM, py4j and the brokers: loopback TCP, unix sockets, IPv4/IPv6; nothing else
    assert set(service["RestrictAddressFamilies"].split()) == {"AF_UNIX", "AF_INET", "AF_INET6"}
    # an allow list the JVM survives (it keeps @resources), minus what needs privileges
    assert entries["SystemCallFilter"] == ["@system-service", "~@privileged"]
    assert 1024 <= int(service["TasksMax"]) <= 8192, "the JVM runs hundreds of threads"
    text = UNIT.read_text(encoding="utf-8")
    assert re.search(r"(?m)^# MemoryMax=\d+G$", text), "MemoryMax guidance, with a figure"
    for absent in ("MemoryDenyWriteExecute", "PrivateNetwork", "ProcSubset", "DynamicUser=yes"):
        assert absent not in service, f"{absent} breaks Spark or the install (see the unit's comments)"


def test_systemd_analyze_security_scores_the_unit_ok(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed on this machine (Debian: apt-get install systemd)")
    copy = tmp_path / UNIT.name
    copy.write_text(UNIT.read_text(encoding="utf-8"), encoding="utf-8")
    result = subprocess.run([analyze, "security", "--offline=yes", "--no-pager", str(copy)],
                            check=False, capture_output=True, text=True, timeout=60)
    output = result.stdout + result.stderr
    if "--offline" in output and ("unrecognized" in output or "unknown" in output.lower()):
        pytest.skip("this systemd-analyze has no `security --offline` (systemd 250 or later has it)")
    score = re.search(r"Overall exposure level for compactord\.service: (\d+\.\d+)", output)
    assert score, output
    # 1.4 with systemd 252; 7.0 before the hardening. Newer systemd versions weigh a little differently.
    assert float(score.group(1)) <= 2.0, output


def test_systemd_unit_does_not_restart_a_bad_config_and_gives_up_on_an_unwritable_root() -> None:
    entries = unit_entries()
    service = {key: values[-1] for key, values in entries["Service"].items()}
    unit = {key: values[-1] for key, values in entries["Unit"].items()}
    assert "2" in service["RestartPreventExitStatus"].split()  # a bad config value fails the same way again
    assert "74" not in service["RestartPreventExitStatus"].split()  # an unmounted disk may come back...
    assert 1 < int(unit["StartLimitBurst"]) <= 10 and int(unit["StartLimitIntervalSec"]) > 0  # ...a few times


def installed_console_script() -> Path:
    candidate = Path(sys.prefix) / "bin" / "compactord"
    if candidate.exists():
        return candidate
    found = shutil.which("compactord")
    assert found, "the compactord console script is not installed (pip install -e .)"
    return Path(found)


def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed on this machine (Debian: apt-get install systemd)")
    script = installed_console_script()
    text = UNIT.read_text(encoding="utf-8")
    text = text.replace("ExecStart=/opt/compactord/bin/compactord ", f"ExecStart={script} ", 1)
    text = text.replace("/opt/compactord/bin/python", sys.executable)
    # an existing user; root, because systemd-analyze warns about nobody
    text = re.sub(r"(?m)^User=compactord$", "User=root", text)
    text = re.sub(r"(?m)^Group=compactord$", "Group=root", text)
    copy = tmp_path / "compactord.service"
    copy.write_text(text, encoding="utf-8")
    result = subprocess.run([analyze, "verify", str(copy)], check=False, capture_output=True, text=True,
                            timeout=60)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    # systemd-analyze only warns about unknown keys and bad values: any line about the unit is a failure
    assert "compactord.service" not in output, output


# -- YAML: every file parses ------------------------------------------------------------------------


def yaml_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))


@pytest.mark.parametrize("path", yaml_files(), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_yaml_file_under_deploy_parses(path: Path) -> None:
    documents = [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc is not None]
    assert documents, f"{path} holds no YAML document"


def test_the_dashboard_is_json() -> None:
    json.loads((DEPLOY / "grafana" / "compactord-dashboard.json").read_text(encoding="utf-8"))


# -- Kubernetes --------------------------------------------------------------------------------------


def manifests() -> dict[str, dict[str, Any]]:
    """kind -> the one object of that kind under deploy/kubernetes (the kustomization excluded)."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(KUBERNETES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc and doc.get("kind") != "Kustomization":
                assert doc["kind"] not in found, f"two {doc['kind']} objects"
                found[doc["kind"]] = doc
    return found


def _bytes(quantity: str) -> int:
    """Kubernetes (4Gi, 512Mi) and Spark/JVM (2g, 512m) sizes in bytes."""
    match = re.fullmatch(r"(\d+)([KMGT]i?|[kmgt]b?)?", quantity.strip())
    assert match, quantity
    unit = (match.group(2) or "").lower().rstrip("ib")
    return int(match.group(1)) * 1024 ** " kmgt".index(unit or " ")


def container() -> dict[str, Any]:
    (only,) = manifests()["Deployment"]["spec"]["template"]["spec"]["containers"]
    return only


def broker_conf() -> dict[str, str]:
    return load_properties(manifests()["ConfigMap"]["data"]["broker.conf"])


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text(encoding="utf-8"))
    others = {p.name for p in KUBERNETES.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == others
    # no Secret: a default token in the repository would be deployed by whoever forgets to change it
    assert set(manifests()) == {"Deployment", "ConfigMap", "Service", "PersistentVolumeClaim",
                                "NetworkPolicy"}


def test_deployment_one_writer_probes_and_scrape_annotations() -> None:
    deployment = manifests()["Deployment"]
    spec = deployment["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]
    c = container()
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": 8642}
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    for probe in (c["readinessProbe"], c["livenessProbe"]):
        assert ports.get(probe["httpGet"]["port"], probe["httpGet"]["port"]) == 8642
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "8642"
    assert annotations["prometheus.io/path"] == "/metrics"
    assert c["args"] == COMMAND
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    stop_timeout = int({k: v[-1] for k, v in unit_entries()["Service"].items()}["TimeoutStopSec"])
    assert pod["spec"]["terminationGracePeriodSeconds"] >= stop_timeout, "long enough for a switch to finish"


def test_deployment_mounts_the_config_the_secret_and_the_ledger_claim() -> None:
    objects = manifests()
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in container()["volumeMounts"]}
    by_source = {next(k for k in v if k != "name"): (v, mounts[name]) for name, v in volumes.items()}
    config, config_path = by_source["configMap"]
    assert config["configMap"]["name"] == objects["ConfigMap"]["metadata"]["name"]
    assert f"{config_path}/broker.conf" == CONF_PATH
    secret, secret_path = by_source["secret"]
    assert secret["secret"]["secretName"] == SECRET_NAME
    claim, claim_path = by_source["persistentVolumeClaim"]
    assert claim["persistentVolumeClaim"]["claimName"] == objects["PersistentVolumeClaim"]["metadata"]["name"]
    assert objects["PersistentVolumeClaim"]["spec"]["accessModes"] == ["ReadWriteOnce"]

    conf = broker_conf()
    assert conf["compactedLedgerRoot"].startswith(claim_path + "/")
    secret_files = set(secret_items().values())
    for key in ("httpAuthToken", "kafkaSaslPassword"):
        value = conf[key]
        assert value.startswith(f"file:{secret_path}/"), f"{key} must be read from the Secret, not given here"
        assert value.rsplit("/", 1)[1] in secret_files, f"{key} names a file the Secret does not hold"


def test_configmap_broker_conf_is_valid_and_holds_no_secret(tmp_path: Path) -> None:
    conf = broker_conf()
    unknown = {k for k in conf if k not in KEYS_BY_NAME and not k.startswith("spark.")}
    assert not unknown, f"keys the loader does not know: {unknown}"
    for name, key in KEYS_BY_NAME.items():
        if key.secret and conf.get(name):
            assert conf[name].startswith("file:"), f"{name} holds a secret in the ConfigMap"
    # Validate every value as the daemon would, with secret files where the Secret's volume puts them.
    local: dict[str, str] = {}
    for name, value in conf.items():
        if value.startswith("file:"):
            path = tmp_path / value.rsplit("/", 1)[1]
            path.write_text(secrets.token_hex(32) + "\n", encoding="utf-8")
            value = f"file:{path}"
        local[name] = value
    settings = settings_from_properties(local, env={})
    assert settings.http_bind_address == "0.0.0.0" and settings.http_auth_token
    assert settings.http_port == container()["ports"][0]["containerPort"]


def secret_items() -> dict[str, str]:
    """key -> file name of the Secret's volume (every key listed, so that a missing key stops the pod)."""
    pod = manifests()["Deployment"]["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if "secret" in v]
    return {item["key"]: item["path"] for item in volume["secret"]["items"]}


def test_no_secret_with_a_default_value_and_the_readme_creates_the_one_the_pod_mounts() -> None:
    for path in KUBERNETES.rglob("*"):
        if path.suffix in (".yaml", ".yml"):
            kinds = {doc.get("kind") for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc}
            assert "Secret" not in kinds, f"{path.name}: create the Secret with kubectl instead"
    readme = (DEPLOY / "README.md").read_text(encoding="utf-8")
    (command,) = [line for line in readme.splitlines() if line.startswith("kubectl create secret generic")]
    words = shlex.split(command)
    assert words[4] == SECRET_NAME
    created = dict(word.removeprefix("--from-file=").split("=", 1)
                   for word in words if word.startswith("--from-file="))
    assert set(created) == set(secret_items()), "the README must create every key the pod mounts"
    assert "openssl rand" in readme


def test_pod_runs_locked_down_with_a_read_only_root_and_writable_volumes_where_spark_writes() -> None:
    pod = manifests()["Deployment"]["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    c = container()
    security = c["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["runAsNonRoot"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security.get("privileged", False) is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    for context in (security, pod["securityContext"]):
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    writable = {m["mountPath"]: volumes[m["name"]] for m in c["volumeMounts"] if not m.get("readOnly")}

    def volume_holding(path: str) -> dict[str, Any]:
        mount = max((m for m in writable if path == m or path.startswith(m + "/")), key=len, default=None)
        assert mount, f"{path} is on the read-only root file system"
        return writable[mount]

    conf = broker_conf()
    assert "persistentVolumeClaim" in volume_holding(conf["compactedLedgerRoot"])
    # java.io.tmpdir, the JVM's hsperfdata, Python's tempfile and Spark's shuffle files and spills
    for scratch in ("/tmp", conf["spark.local.dir"]):
        assert "emptyDir" in volume_holding(scratch), scratch
    # the image's HOME and WORKDIR (Spark may write there) are the claim
    (workdir,) = args_of("WORKDIR")
    assert "persistentVolumeClaim" in volume_holding(workdir)


def test_network_policy_lets_in_the_api_port_and_out_the_brokers_and_dns() -> None:
    objects = manifests()
    policy = objects["NetworkPolicy"]["spec"]
    labels = objects["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= labels.items()
    assert sorted(policy["policyTypes"]) == ["Egress", "Ingress"]
    (ingress,) = policy["ingress"]
    assert ingress["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert {"name": "http", "containerPort": 8642, "protocol": "TCP"} in container()["ports"]
    sources = ingress["from"]
    assert {"podSelector": {}} in sources, "the namespace's own pods"
    assert all(set(s) <= {"podSelector", "namespaceSelector"} for s in sources), "no ipBlock: not the world"
    assert any(s.get("namespaceSelector", {}).get("matchLabels", {}).get("kubernetes.io/metadata.name")
               == "monitoring" for s in sources), "Prometheus"
    allowed_out = {(p["port"], p.get("protocol", "TCP")) for rule in policy["egress"] for p in rule["ports"]}
    servers = broker_conf()["kafkaBootstrapServers"].split(",")
    broker_ports = {int(server.rsplit(":", 1)[1]) for server in servers}
    assert allowed_out == {(port, "TCP") for port in broker_ports} | {(53, "UDP"), (53, "TCP")}


def test_memory_limits_leave_room_beyond_the_spark_driver_heap() -> None:
    c = container()
    resources = c["resources"]
    assert resources["requests"]["memory"] == resources["limits"]["memory"], "no overcommit of the heap"
    limit = _bytes(resources["limits"]["memory"])
    conf = broker_conf()
    heap = _bytes(conf["spark.driver.memory"])
    # Measured: the driver JVM is about heap + 0.3 GB; each Python read worker 230-250 MB; the daemon
    # and Spark's planning daemons about 0.5 GB more. 2 GiB above the heap covers two workers.
    assert heap + 2 * 1024**3 <= limit, f"spark.driver.memory={conf['spark.driver.memory']} vs limit {limit}"
    cores = re.fullmatch(r"local\[(\d+)\]", conf["sparkMaster"])
    assert cores, "in the pod Spark runs in local mode with an explicit core count"
    assert int(cores.group(1)) <= float(resources["requests"]["cpu"])


def test_service_exposes_the_http_port_of_the_pod() -> None:
    objects = manifests()
    service = objects["Service"]["spec"]
    (port,) = service["ports"]
    assert port["port"] == 8642 and port["targetPort"] == "http"
    labels = objects["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert service["selector"].items() <= labels.items()
    assert objects["Deployment"]["spec"]["selector"]["matchLabels"].items() <= labels.items()


# -- Prometheus rules --------------------------------------------------------------------------------


def alert_rules() -> dict[str, dict[str, Any]]:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text(encoding="utf-8"))
    found = {}
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "labels", "annotations", "keep_firing_for"}, rule
            assert rule["alert"] not in found
            found[rule["alert"]] = rule
    return found


def test_alerts_cover_failures_uncleanable_backlog_staleness_corruption_missing_and_down() -> None:
    exprs = " ; ".join(rule["expr"] for rule in alert_rules().values())
    for needed in ('up{job="compactord"} == 0', 'compactord_compactions_total{result="failed"}',
                   "compactord_uncleanable_topics > 0", "compactord_backlog_",
                   "compactord_seconds_since_last_success >", "compactord_ledger_corrupt",
                   "compactord_topics_missing_on_broker", "compactord_topic_max_lag_seconds"):
        assert needed in exprs, needed
    assert "CompactordCompactionDelayHigh" in alert_rules()


def test_promtool_accepts_the_alert_rules() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed on this machine (Debian: apt-get install prometheus)")
    result = subprocess.run([promtool, "check", "rules", str(DEPLOY / "prometheus" / "alerts.yml")],
                            check=False, capture_output=True, text=True, timeout=60)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    # promtool prints lint findings (duplicate rules) and still exits 0
    assert f"SUCCESS: {len(alert_rules())} rules found" in output and "WARNING" not in output, output


# -- README and CI -----------------------------------------------------------------------------------


def test_readme_test_command_is_the_one_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", readme, flags=re.MULTILINE | re.DOTALL)
    assert len(blocks) >= 2, "README.md should give the run command, then the test command"
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
                if line.strip() and not line.strip().startswith("#")]
    assert blocks[1].strip() == ci_lines[-1]


# -- every compactord_* name under deploy/ is served by a running daemon -----------------------------


def names_used_in_deploy() -> set[str]:
    names: set[str] = set()
    for path in DEPLOY.rglob("*"):
        if path.is_file():
            names |= set(METRIC_NAME.findall(path.read_text(encoding="utf-8", errors="replace")))
    return names


_SERIES_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
}


def servable_names(exposition: str) -> tuple[set[str], set[str]]:
    """(series names the text can hold for its declared families, series names with samples now).

    A family with labels has no sample until a label set exists; its names are still the daemon's. A
    counter ``x`` is served as ``x_total`` (and ``x_created``), never as ``x``.
    """
    declared: set[str] = set()
    sampled: set[str] = set()
    for family in text_string_to_metric_families(exposition):
        declared |= {family.name + suffix for suffix in _SERIES_SUFFIXES.get(family.type, ("",))}
        sampled |= {sample.name for sample in family.samples}
    return declared, sampled


# Served by a cluster's members only (clusterName); tests/daemon/test_cluster_faults.py checks them on a member.
CLUSTER_ONLY = {"compactord_unowned_coordination_partitions"}


@pytest.mark.slow
def test_every_metric_name_in_deploy_is_served_by_a_running_daemon(kafka: Any, broker: Any,
                                                                   tmp_path: Path) -> None:
    used = names_used_in_deploy()
    assert "compactord_compactions_total" in used and len(used) >= 10, used
    topic = kafka.topic(partitions=2, prefix="deploy")
    kafka.produce(topic, [(f"k{i % 10}", f"v{i}", i % 2) for i in range(100)])
    token = "t0ken-from-a-file"
    (tmp_path / "token").write_text(token + "\n", encoding="utf-8")
    port = free_port()
    conf = write_conf(tmp_path / "broker.conf", {
        "kafkaBootstrapServers": broker.bootstrap,
        "compactedLedgerRoot": str(tmp_path / "ledgers"),
        "httpPort": str(port),
        "httpAuthToken": f"file:{tmp_path / 'token'}",
        "sparkMaster": "local[2]",
        "spark.driver.memory": "1g",
        # the monitor measures only this topic and never triggers (every threshold off)
        "compactionTopicsPattern": topic,
        "brokerServiceCompactionThresholdInBytes": "0",
        "brokerServiceCompactionMonitorIntervalInSeconds": "2",
    })
    daemon = DaemonProcess(conf, tmp_path / "daemon.log", port, tmp_path / "ledgers", token).start()
    try:
        daemon.wait_ready()
        with daemon.client(token=None) as anonymous:
            # what probes and scrapers ask needs no token; the API does
            assert anonymous.get("/healthz").status_code == 200
            assert anonymous.get(f"/v1/topics/{topic}/compaction").status_code == 401
        compact(daemon, topic)
        with daemon.client(token=None) as anonymous:
            deadline = time.monotonic() + 60
            while True:  # until a monitor pass after the compaction has set the backlog series
                response = anonymous.get("/metrics")
                assert response.status_code == 200
                text = response.text
                settled = f'compactord_backlog_records{{topic="{topic}"}} 0.0' in text
                if settled or time.monotonic() > deadline:
                    break
                time.sleep(1.0)
        declared, sampled = servable_names(text)
        missing = used - declared - CLUSTER_ONLY
        assert not missing, f"named under deploy/ but not served: {sorted(missing)}"
        # the per-topic series of the dashboard and the alerts exist after one compaction
        families = {f.name: f for f in text_string_to_metric_families(text)}
        ours = {(s.name, s.labels.get("result")): s.value for f in families.values() for s in f.samples
                if s.labels.get("topic") == topic}
        assert ours[("compactord_compactions_total", "succeeded")] == 1
        assert ours[("compactord_compacted_entries", None)] == 10
        assert ("compactord_seconds_since_last_success", None) in ours
        assert ("compactord_compaction_duration_seconds_count", None) in ours
        assert ("compactord_backlog_records", None) in ours, "no monitor pass after the compaction"
        assert ("compactord_ledger_corrupt", None) in ours
        assert {"compactord_uncleanable_topics", "compactord_ready", "compactord_running_tasks"} <= sampled
    finally:
        code = daemon.stop()
    assert code == 0, f"SIGTERM should stop the daemon cleanly (exit {code})\n{daemon.log_text()[-3000:]}"
