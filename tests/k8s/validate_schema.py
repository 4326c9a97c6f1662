#!/usr/bin/python3
"""Validates rendered Kubernetes manifests against the Kubernetes API schema.

The schema is the one Debian ships: python3-kubernetes 22.6 (the Kubernetes 1.22 API),
whose model classes are generated from the API's OpenAPI document. Each model lists its
fields with their JSON names and types (`attribute_map`, `openapi_types`), and its setters
reject None for required fields and values outside an enum. Every object is decoded
strictly against them: an unknown field, a value of the wrong type, a missing required
field or a value outside an enum is an error naming the object and the field's path.

Fields added to the API after 1.22 that the chart uses are listed in NEWER below, with
their types from the Kubernetes API reference; nothing else is accepted beyond 1.22.
Objects whose apiVersion is not a Kubernetes API group (e.g. the Prometheus Operator's
ServiceMonitor) are reported as not checked here.

    validate_schema.py MANIFESTS.yaml   # exits 0 when every object is valid, else 1
"""

import inspect
import re
import sys

import yaml
from kubernetes.client import Configuration, models

# batch/v1 Job.spec.podFailurePolicy (Kubernetes 1.26 beta, 1.31 GA).
NEWER = {
    "V1JobSpec": {"podFailurePolicy": "V1PodFailurePolicy"},
    "V1PodFailurePolicy": {"rules": "list[V1PodFailurePolicyRule]"},
    "V1PodFailurePolicyRule": {
        "action": "str",
        "onExitCodes": "V1PodFailurePolicyOnExitCodesRequirement",
        "onPodConditions": "list[V1PodFailurePolicyOnPodConditionsPattern]",
    },
    "V1PodFailurePolicyOnExitCodesRequirement": {
        "containerName": "str",
        "operator": "str",
        "values": "list[int]",
    },
    "V1PodFailurePolicyOnPodConditionsPattern": {"type": "str", "status": "str"},
}
NEWER_REQUIRED = {
    "V1PodFailurePolicy": {"rules"},
    "V1PodFailurePolicyRule": {"action"},
    "V1PodFailurePolicyOnExitCodesRequirement": {"operator", "values"},
    "V1PodFailurePolicyOnPodConditionsPattern": {"type", "status"},
}
NEWER_ENUMS = {
    ("V1PodFailurePolicyRule", "action"): {"FailJob", "FailIndex", "Ignore", "Count"},
    ("V1PodFailurePolicyOnExitCodesRequirement", "operator"): {"In", "NotIn"},
    ("V1PodFailurePolicyOnPodConditionsPattern", "status"): {"True", "False", "Unknown"},
}

# The client types resource.Quantity as a string; the API also takes a number there.
QUANTITY_FIELDS = {
    ("V1ResourceRequirements", "limits"),
    ("V1ResourceRequirements", "requests"),
    ("V1EmptyDirVolumeSource", "sizeLimit"),
}

# apiVersion groups of the Kubernetes API itself (the core group is "").
KUBERNETES_GROUPS = {"", "batch", "apps", "policy", "rbac.authorization.k8s.io",
                     "networking.k8s.io", "scheduling.k8s.io", "autoscaling"}


class Schema:
    """Fields, required fields and enum checks of one model class."""

    def __init__(self, name):
        self.name = name
        self.fields = {}  # JSON name -> (python attribute or None, type string)
        self.required = set(NEWER_REQUIRED.get(name, ()))
        self.klass = getattr(models, name, None)
        if self.klass is not None:
            for attr, type_name in self.klass.openapi_types.items():
                json_name = self.klass.attribute_map[attr]
                self.fields[json_name] = (attr, type_name)
                setter = getattr(self.klass, attr).fset
                if "must not be `None`" in inspect.getsource(setter):
                    self.required.add(json_name)
        for json_name, type_name in NEWER.get(name, {}).items():
            self.fields[json_name] = (None, type_name)
        if not self.fields:
            raise KeyError(name)

    def check_enum(self, json_name, value):
        """The model's own setter check (allowed values), or NEWER_ENUMS."""
        allowed = NEWER_ENUMS.get((self.name, json_name))
        if allowed is not None:
            return None if value in allowed else f"{value!r} is not one of {sorted(allowed)}"
        attr = self.fields[json_name][0]
        if attr is None or self.klass is None:
            return None
        instance = self.klass.__new__(self.klass)
        instance.local_vars_configuration = Configuration()
        try:
            setattr(instance, attr, value)
        except ValueError as error:
            return str(error)
        return None


SCHEMAS = {}


def schema(name):
    if name not in SCHEMAS:
        SCHEMAS[name] = Schema(name)
    return SCHEMAS[name]


def check(value, type_name, where, errors, quantity=False):
    """Checks `value` against a client type string; appends errors naming `where`."""
    if value is None:
        return  # the API treats an explicit null as absent
    list_match = re.fullmatch(r"list\[(.+)\]", type_name)
    dict_match = re.fullmatch(r"dict\(str, (.+)\)", type_name)
    if list_match:
        if not isinstance(value, list):
            errors.append(f"{where}: expected a list, found {value!r}")
            return
        for i, item in enumerate(value):
            check(item, list_match.group(1), f"{where}[{i}]", errors)
    elif dict_match:
        if not isinstance(value, dict):
            errors.append(f"{where}: expected a map, found {value!r}")
            return
        for key, item in value.items():
            if not isinstance(key, str):
                errors.append(f"{where}: key {key!r} is not a string")
            check(item, dict_match.group(1), f"{where}.{key}", errors, quantity)
    elif type_name == "str":
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not isinstance(value, str) and not (quantity and numeric):
            errors.append(f"{where}: expected a string, found {value!r}")
    elif type_name == "int":
        if not isinstance(value, int) or isinstance(value, bool):
            errors.append(f"{where}: expected an integer, found {value!r}")
    elif type_name == "bool":
        if not isinstance(value, bool):
            errors.append(f"{where}: expected true or false, found {value!r}")
    elif type_name == "float":
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            errors.append(f"{where}: expected a number, found {value!r}")
    elif type_name == "object":
        pass  # IntOrString and free-form fields
    else:
        check_object(value, type_name, where, errors)


def check_object(value, type_name, where, errors):
    if not isinstance(value, dict):
        errors.append(f"{where}: expected an object ({type_name}), found {value!r}")
        return
    s = schema(type_name)
    for json_name in sorted(s.required - value.keys()):
        errors.append(f"{where}.{json_name}: required field missing ({type_name})")
    for json_name, item in value.items():
        path = f"{where}.{json_name}" if where else json_name
        if json_name not in s.fields:
            errors.append(f"{path}: unknown field (not in {type_name})")
            continue
        field_type = s.fields[json_name][1]
        check(item, field_type, path, errors, (type_name, json_name) in QUANTITY_FIELDS)
        if field_type in ("str", "int", "bool") and item is not None:
            problem = s.check_enum(json_name, item)
            if problem:
                errors.append(f"{path}: {problem}")


def validate(document):
    """Returns (checked, errors) for one manifest."""
    api_version, kind = document.get("apiVersion", ""), document.get("kind", "")
    group, _, version = api_version.rpartition("/")
    name = (document.get("metadata") or {}).get("name", "?")
    label = f"{kind} {name}"
    if group not in KUBERNETES_GROUPS:
        return False, []
    type_name = version[0].upper() + version[1:] + kind
    try:
        schema(type_name)
    except KeyError:
        return True, [f"{label}: {api_version} {kind} is not a Kubernetes 1.22 API type"]
    errors = []
    check_object(document, type_name, "", errors)
    return True, [f"{label}: {e}" for e in errors]


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with open(sys.argv[1], encoding="utf-8") as f:
        documents = [d for d in yaml.safe_load_all(f) if d]
    failures = 0
    for document in documents:
        checked, errors = validate(document)
        label = f"{document.get('apiVersion')} {document.get('kind')} " \
                f"{(document.get('metadata') or {}).get('name')}"
        if not checked:
            print(f"not checked (not a Kubernetes API group): {label}")
        elif errors:
            failures += 1
            for e in errors:
                print(f"invalid: {e}")
        else:
            print(f"valid: {label}")
    if not documents:
        print("no manifests")
        return 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
