"""docs/glossary.md names the code behind each word; every name it gives must exist, so a rename that forgets the
glossary fails here. One word, one meaning in the code too: a public class or function name is defined once in the
product (`dra_driver/`, protoc output aside), but for the listed exceptions, a list that can only shrink."""

from __future__ import annotations

import ast
import importlib
import re
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GLOSSARY = ROOT / "docs" / "glossary.md"
PRODUCT = ROOT / "dra_driver"
# `dra_driver.some.module` or `dra_driver.some.module:Name`, in backticks.
REFERENCE = re.compile(r"`(dra_driver(?:\.\w+)+)(?::(\w+))?`")


def references(text: str) -> list[tuple[str, str | None]]:
    return [(m.group(1), m.group(2)) for m in REFERENCE.finditer(text)]


def missing(module: str, name: str | None) -> str | None:
    """Why the reference does not resolve; None when it does."""
    try:
        loaded = importlib.import_module(module)
    except ModuleNotFoundError:
        return f"{module}: no such module"
    if name is not None and not hasattr(loaded, name):
        return f"{module}:{name}: no such name in the module"
    return None


def test_every_code_name_in_the_glossary_exists() -> None:
    found = references(GLOSSARY.read_text(encoding="utf-8"))
    assert len(found) >= 30, "the glossary's code references were not found; did the `module:Name` form change?"
    problems = [p for module, name in found if (p := missing(module, name)) is not None]
    assert not problems, "docs/glossary.md names code that does not exist:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    "reference", ["`dra_driver.resourceapi:NoSuchThing`", "`dra_driver.no_such_module`"], ids=["name", "module"]
)
def test_a_stale_reference_is_caught(reference: str) -> None:
    [(module, name)] = references(f"| word | meaning | {reference} |")
    assert missing(module, name) is not None


# Public names defined in more than one product module today, each with the modules (relative to dra_driver/).
# An entry may only go: a name duplicated anew, a third definition of a listed name, or an entry that is no longer
# a duplicate (remove it) fails the test.
_ENGINE_MERGE = "removed by the one-engine merge (issue 22 item 1)"
_ONE_INTERFACE = "one interface, implemented once per backend or command: the same meaning, kept"
_TO_RENAME = "two meanings under one name: to rename (issue 22 item 4)"
DUPLICATES_ALLOWED: dict[str, tuple[frozenset[str], str]] = {
    name: (frozenset(modules), why)
    for name, modules, why in [
        # The twin classes of the GPU driver's and the ComputeDomain driver's claim engines.
        ("CheckpointStore", ["kubeletplugin/checkpoint.py", "plugin/checkpoint.py"], _ENGINE_MERGE),
        ("FaultPoints", ["kubeletplugin/faults.py", "plugin/faults.py"], _ENGINE_MERGE),
        ("build_slices", ["computedomain/plugin/slices.py", "slices/builder.py"], _ENGINE_MERGE),
        ("node_clique", ["computedomain/plugin/app.py", "inventory/fabric.py"], _ENGINE_MERGE),
        # Each command module exposes `add_arguments` and `run` to commands/dispatch.py; each NVML backend (fake,
        # real) the same MIG calls. (`run` in controller/operator.py runs the controller: to rename.)
        ("add_arguments", [f"commands/{m}.py" for m in ("compute_domain_daemon", "compute_domain_plugin",
                                                        "controller", "explain", "health", "inventory",
                                                        "kubelet_plugin", "status")], _ONE_INTERFACE),
        ("run", [f"commands/{m}.py" for m in ("compute_domain_daemon", "compute_domain_plugin", "controller",
                                              "explain", "health", "inventory", "kubelet_plugin", "status")]
         + ["controller/operator.py"], _ONE_INTERFACE),
        *((name, ["nvml/fake/mig.py", "nvml/real/mig.py"], _ONE_INTERFACE) for name in (
            "compute_instance_profiles", "create_compute_instance", "create_gpu_instance",
            "destroy_compute_instance", "destroy_gpu_instance", "mig_devices", "set_mig_mode")),
        # Two things under one name.
        ("Attempt", ["controller/leader.py", "slices/publisher.py"], _TO_RENAME),
        ("CliqueConflict", ["computedomain/daemon/clique.py", "controller/computedomains/status.py"], _TO_RENAME),
        ("Device", ["allocation/model.py", "cdi/model.py"], _TO_RENAME),
        ("DeviceResult", ["kubeletplugin/driver.py", "resourceapi/claim.py"], _TO_RENAME),
        ("Problem", ["controller/admission.py", "errors.py"], _TO_RENAME),
        ("TimeSlice", ["nvml/types.py", "plugin/effects/time_slice.py"], _TO_RENAME),
        ("describe", ["commands/health.py", "plugin/devicemetadata.py"], _TO_RENAME),
        ("owner_reference", ["controller/computedomains/objects.py", "policy/render.py"], _TO_RENAME),
        ("parse_node", ["allocation/model.py", "nvml/fake/nodefile.py"], _TO_RENAME),
        ("status_patch", ["controller/computedomains/status.py", "controller/reconcile.py"], _TO_RENAME),
        ("type_name", ["cel/runtime.py", "strictdecode.py"], _TO_RENAME),
    ]
}


def public_definitions(root: Path) -> dict[str, set[str]]:
    """Public (no leading `_`) module-level class and function name -> the modules defining it, under `root`."""
    found: dict[str, set[str]] = defaultdict(set)
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if relative.parts[0] == "_gen":
            continue
        for node in ast.parse(path.read_text(encoding="utf-8"), str(path)).body:
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith("_"):
                found[node.name].add(relative.as_posix())
    return found


def duplicate_problems(found: dict[str, set[str]]) -> list[str]:
    problems = []
    for name, modules in sorted(found.items()):
        allowed = DUPLICATES_ALLOWED.get(name)
        if len(modules) > 1 and (allowed is None or not modules <= allowed[0]):
            problems.append(f"{name} is defined in {sorted(modules)}: one name, one meaning (docs/glossary.md)")
    for name, (allowed_modules, _why) in sorted(DUPLICATES_ALLOWED.items()):
        if len(found.get(name, set())) < 2 or found[name] != allowed_modules:
            problems.append(f"{name}: the allowed duplicate is gone or moved ({sorted(found.get(name, set()))}); "
                            "shrink DUPLICATES_ALLOWED")
    return problems


def test_a_public_name_is_defined_once_in_the_product() -> None:
    problems = duplicate_problems(public_definitions(PRODUCT))
    assert not problems, "\n".join(problems)


def test_a_new_duplicate_and_a_stale_exception_are_caught() -> None:
    found = public_definitions(PRODUCT)
    found["SharingSettings"] = found["SharingSettings"] | {"plugin/new.py"}
    assert any(p.startswith("SharingSettings is defined") for p in duplicate_problems(found))
    found["CheckpointStore"] = {"plugin/checkpoint.py"}
    assert any(p.startswith("CheckpointStore: the allowed duplicate is gone") for p in duplicate_problems(found))
