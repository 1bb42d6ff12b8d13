#!/usr/bin/env python3
"""Checks rendered Kubernetes manifests (`kubectl kustomize DIR`) offline.

  check_manifests.py RENDERED.yaml [ATOLL_BINARY]

1. Schema: every object against the API models of Debian's python3-kubernetes (generated from
   Kubernetes' OpenAPI spec): unknown fields, wrong types and missing required fields are errors.
2. Wiring: ConfigMaps, Secrets and claims that pods use exist in the set or are the ones the README
   says to create; probes and Services name container ports; Services select pods; an Indexed Job
   that forms an island has as many pods as WORLD_SIZE and its MASTER_ADDR is pod 0 of its headless
   Service.
3. atoll: every --flag a container passes to atoll is one its subcommand has (`atoll SUB --help`).
Exits 1 with one line per problem.
"""
import re
import shlex
import subprocess
import sys

import yaml
from kubernetes import client

# Created by the user before applying (README "Deployment"): not part of the manifests.
EXTERNAL = {("Secret", "atoll-run-token"), ("Secret", "atoll-tls"),
            ("PersistentVolumeClaim", "atoll-data")}

problems = []


def problem(where, what):
    problems.append(f"{where}: {what}")


def check_schema(value, type_name, where):
    """Walks `value` along the generated model `type_name` ("V1PodSpec", "list[V1Container]")."""
    if value is None:
        return
    if type_name.startswith("list["):
        if not isinstance(value, list):
            return problem(where, f"expected a list, got {type(value).__name__}")
        for i, item in enumerate(value):
            check_schema(item, type_name[5:-1], f"{where}[{i}]")
        return
    if type_name.startswith("dict("):
        if not isinstance(value, dict):
            return problem(where, f"expected a map, got {type(value).__name__}")
        inner = type_name[type_name.index(",") + 1:-1].strip()
        for key, item in value.items():
            check_schema(item, inner, f"{where}.{key}")
        return
    scalars = {"str": (str,), "int": (int,), "bool": (bool,), "float": (int, float),
               "datetime": (str,)}
    if type_name in scalars:
        ok = isinstance(value, scalars[type_name]) and not (
            type_name == "int" and isinstance(value, bool))
        if not ok:
            problem(where, f"expected {type_name}, got {value!r}")
        return
    if type_name == "object":  # IntOrString, Quantity, free-form
        return
    model = getattr(client.models, type_name)
    if not isinstance(value, dict):
        return problem(where, f"expected a {type_name} object, got {value!r}")
    fields = {json: attr for attr, json in model.attribute_map.items()}
    for key, item in value.items():
        if key not in fields:
            problem(where, f"unknown field '{key}' ({type_name})")
            continue
        check_schema(item, model.openapi_types[fields[key]], f"{where}.{key}")


def model_name(doc):
    version = doc["apiVersion"].split("/")[-1]
    return version[0].upper() + version[1:] + doc["kind"]


def pod_spec(doc):
    spec = doc.get("spec", {})
    if doc["kind"] in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
        return spec.get("template", {}).get("spec", {}), spec.get("template", {}).get("metadata", {})
    return None, None


def atoll_invocation(container):
    """The atoll subcommand and its arguments, from args or from a `sh -c` script."""
    command = container.get("command", [])
    args = container.get("args", [])
    if command[:2] == ["/bin/sh", "-c"] and args:
        words = shlex.split(args[0].replace(";", " ; "))
        if "/usr/local/bin/atoll" in words:
            rest = words[words.index("/usr/local/bin/atoll") + 1:]
            return rest[0], rest[1:]
        return None, []
    return (args[0], args[1:]) if args else (None, [])


def check_atoll_flags(doc, container, binary, where):
    sub, args = atoll_invocation(container)
    if sub is None:
        return problem(where, "runs no atoll subcommand")
    helptext = subprocess.run([binary, sub, "--help"], capture_output=True, text=True)
    if helptext.returncode != 0:
        return problem(where, f"'atoll {sub}' is not a subcommand")
    if container.get("command", [])[:2] == ["/bin/sh", "-c"]:
        flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", container["args"][0]))
    else:
        flags = set(a.split("=")[0] for a in args if a.startswith("--"))
    for flag in sorted(flags):
        if not re.search(re.escape(flag) + r"\b", helptext.stdout):
            problem(where, f"atoll {sub} has no flag {flag}")
    # What atoll listens on must be a declared container port.
    text = " ".join(container.get("args", []))
    declared = {p["containerPort"] for p in container.get("ports", [])}
    for flag, port in re.findall(r"(--(?:http-|metrics-)?listen)[ =]\S*:(\d+)", text):
        if int(port) not in declared:
            problem(where, f"{flag} port {port} is not a container port")


def main():
    docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
    binary = sys.argv[2] if len(sys.argv) > 2 else None
    api = client.ApiClient()
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for doc in docs:
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        name = model_name(doc)
        if not hasattr(client.models, name):
            problem(where, f"no API model {name}")
            continue
        check_schema(doc, name, where)
        try:  # the models' constructors refuse missing required fields
            api._ApiClient__deserialize(doc, name)
        except (ValueError, TypeError) as e:
            problem(where, str(e))

        spec, meta = pod_spec(doc)
        if spec is None:
            continue
        labels = (meta or {}).get("labels", {})
        for volume in spec.get("volumes", []):
            for kind, key, field in (("ConfigMap", "configMap", "name"),
                                     ("Secret", "secret", "secretName"),
                                     ("PersistentVolumeClaim", "persistentVolumeClaim", "claimName")):
                if key in volume:
                    ref = (kind, volume[key][field])
                    if ref not in names and ref not in EXTERNAL:
                        problem(where, f"volume {volume['name']}: no {kind} {ref[1]}")
        for c in spec.get("containers", []):
            cwhere = f"{where} container {c['name']}"
            ports = {p.get("name") for p in c.get("ports", [])} | {p["containerPort"] for p in c.get("ports", [])}
            for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                port = c.get(probe, {}).get("httpGet", {}).get("port")
                if port is not None and port not in ports:
                    problem(cwhere, f"{probe} port {port} is not a container port")
            for source in c.get("envFrom", []):
                ref = ("ConfigMap", source.get("configMapRef", {}).get("name"))
                if ref[1] and ref not in names:
                    problem(cwhere, f"envFrom: no ConfigMap {ref[1]}")
            env = {e["name"]: e for e in c.get("env", [])}
            for e in env.values():
                secret = e.get("valueFrom", {}).get("secretKeyRef")
                if secret and ("Secret", secret["name"]) not in names | EXTERNAL:
                    problem(cwhere, f"env {e['name']}: no Secret {secret['name']}")
            if doc["kind"] == "Job" and "WORLD_SIZE" in env:
                world = int(env["WORLD_SIZE"]["value"])
                job = doc["spec"]
                if job.get("completionMode") != "Indexed":
                    problem(where, "an island's ranks need completionMode: Indexed")
                if job.get("completions") != world or job.get("parallelism") != world:
                    problem(where, f"completions/parallelism must equal WORLD_SIZE ({world})")
                sub = spec.get("subdomain")
                if env["MASTER_ADDR"].get("value") != f"{doc['metadata']['name']}-0.{sub}":
                    problem(cwhere, f"MASTER_ADDR must be pod 0: {doc['metadata']['name']}-0.{sub}")
                if ("Service", sub) not in names:
                    problem(where, f"no headless Service {sub} for the ranks' DNS names")
            if binary and "atoll" in c.get("image", ""):
                check_atoll_flags(doc, c, binary, cwhere)
        # Services that select these pods must target their ports.
        for svc in (d for d in docs if d["kind"] == "Service"):
            selector = svc["spec"].get("selector", {})
            if selector and all(labels.get(k) == v for k, v in selector.items()):
                ports = {p.get("name") for c in spec["containers"] for p in c.get("ports", [])}
                ports |= {p["containerPort"] for c in spec["containers"] for p in c.get("ports", [])}
                for p in svc["spec"]["ports"]:
                    if p.get("targetPort", p["port"]) not in ports:
                        problem(f"Service/{svc['metadata']['name']}",
                                f"targetPort {p.get('targetPort', p['port'])} is no port of {where}")
    for svc in (d for d in docs if d["kind"] == "Service"):
        selector = svc["spec"].get("selector", {})
        selected = [d for d in docs if pod_spec(d)[1] is not None and
                    all(pod_spec(d)[1].get("labels", {}).get(k) == v for k, v in selector.items())]
        if not selected:
            problem(f"Service/{svc['metadata']['name']}", "selects no pods of these manifests")

    for p in problems:
        print(p)
    kinds = sorted(f"{k}/{n}" for k, n in names)
    print(f"{sys.argv[1]}: {len(docs)} objects, {len(problems)} problems: {', '.join(kinds)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
