#!/usr/bin/python
"""Ansible module: apply a tuned-rl profile (verified, undoable), or roll it back."""

from __future__ import annotations

DOCUMENTATION = r"""
module: tuned_rl
short_description: Apply a tuned-rl profile, each step verified against the workload, or roll it back
description:
  - C(state=present) applies the profile with C(tuned-rl apply): each step is measured and kept or
    reverted. Nothing changes, and C(changed=false), when the same profile is already applied and every
    value it set still holds.
  - Check mode runs C(tuned-rl apply --dry-run) and reports C(changed) when the plan changes something;
    with C(--diff) it shows the host's live values before and the planned values after. On a node
    without tuned-rl yet (check mode installs nothing), it reports C(changed); given C(unpacked), the
    package's files unpacked to a temporary directory (the role does this with C(dpkg-deb -x)), it runs
    that package's own dry run with Debian's Python and shows the live and planned values all the same;
    without it, or where Debian's Python lacks a package the dry run imports (the package's own
    dependencies, which apt would install), the diff is the profile that would be applied, and the
    message names what is missing.
  - C(state=absent) rolls back everything tuned-rl applied on the host.
options:
  profile:
    description: Path of the profile on the managed host (needed for state=present).
    type: path
  content:
    description: The profile's text, for check mode on a host where the role has not put the profile
      in place yet (check mode copies nothing); used only when C(profile) does not exist.
    type: str
  state:
    type: str
    choices: [present, absent]
    default: present
  verify:
    description: Verify each step against the profile's [target] (false is apply --no-verify).
    type: bool
    default: true
  fail_on_reverted:
    description: Fail the host when a step was reverted (its tuning made the workload worse).
    type: bool
    default: false
  executable:
    description: The tuned-rl command.
    type: str
    default: tuned-rl
  state_dir:
    description: tuned-rl's state directory (its default when not given).
    type: path
  unpacked:
    description: Check mode on a node without tuned-rl - a directory holding the Debian package's files
      (C(dpkg-deb -x tuned-rl.deb DIR)), whose C(usr/bin/tuned-rl) plans the profile; nothing is installed.
    type: path
"""

RETURN = r"""
steps:
  description: Every step's outcome, reason and figures (apply), or every change restored (rollback).
  type: list
  returned: always
reverted:
  description: Titles of the steps that were reverted.
  type: list
  returned: state=present
"""

import json
import os
import re
import tempfile

from ansible.module_utils.basic import AnsibleModule


def run(module, *args):
    command = [module.params["executable"]]
    if module.params["state_dir"]:
        command += ["--state-dir", module.params["state_dir"]]
    rc, out, err = module.run_command(command + list(args))
    return rc, out, err


def json_of(module, rc, out, err, what):
    try:
        return json.loads(out)
    except ValueError:
        module.fail_json(msg=f"tuned-rl {what} exited {rc}: {err.strip() or out.strip()}", rc=rc)


def live_diff(plan):
    """Ansible's diff: live values before, planned values after, one line per change."""
    before, after = [], []
    for step in plan["steps"]:
        if step["outcome"] != "planned":
            continue
        for change in step["changes"]:
            before.append(f"{change['target']} = {change['before']}\n")
            after.append(f"{change['target']} = {change['after']}\n")
    return {"before": "".join(before), "after": "".join(after),
            "before_header": "live values", "after_header": f"profile {plan['profile']}"}


def executable_path(module):
    """The tuned-rl command's path on this node, or None where it is not installed (yet)."""
    executable = module.params["executable"]
    if os.sep in executable:
        return executable if os.access(executable, os.X_OK) else None
    return module.get_bin_path(executable)


# What the package's dry run imports, by the Debian package that provides it (debian/control's Depends).
DEBIAN_PACKAGES = {"numpy": "python3-numpy", "pluggy": "python3-pluggy", "psutil": "python3-psutil",
                   "pyroute2": "python3-pyroute2", "prometheus_client": "python3-prometheus-client",
                   "bcc": "python3-bpfcc"}


def profile_file(module, profile):
    """The profile's path, or (check mode, not in place yet) a temporary file of the ``content`` given."""
    if os.path.exists(profile) or module.params["content"] is None or not module.check_mode:
        return profile
    handle = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
    with handle:
        handle.write(module.params["content"])
    module.add_cleanup_file(handle.name)
    return handle.name


def shared_library_directories(root):
    """The directories under an unpacked tree's usr/lib and lib that hold shared libraries (Python's own
    directories apart), for LD_LIBRARY_PATH."""
    found = []
    for top in (os.path.join(root, "usr", "lib"), os.path.join(root, "lib")):
        for directory, subdirectories, files in os.walk(top):
            subdirectories[:] = [d for d in subdirectories if not d.startswith("python")]
            if any(re.search(r"\.so(\.|$)", name) for name in files):
                found.append(directory)
    return sorted(found)


def unpacked_plan(module, profile):
    """(plan, None) from the unpacked package's own dry run, or (None, why not)."""
    root = module.params["unpacked"]
    script = os.path.join(root, "usr", "bin", "tuned-rl")
    library = os.path.join(root, "usr", "lib", "python3", "dist-packages")
    if not (os.path.isfile(script) and os.path.isdir(library)):
        return None, f"{root} holds no unpacked tuned-rl package (usr/bin/tuned-rl)"
    with open(script, encoding="utf-8", errors="replace") as handle:
        first = handle.readline()
    words = first[2:].split() if first.startswith("#!") else []
    interpreter = words[0] if words else ""
    if not interpreter.startswith("/") or not os.access(interpreter, os.X_OK):
        return None, f"the package's interpreter ({interpreter or 'none named'}) is not on this node"
    command = [interpreter, script] + (["--state-dir", module.params["state_dir"]] if module.params["state_dir"]
                                       else []) + ["apply", profile, "--dry-run", "--json"]
    environment = {"PYTHONPATH": library}
    libraries = shared_library_directories(root)
    if libraries:  # unpacked dependencies' libraries (libblas3's, for numpy): not in ld.so's cache
        environment["LD_LIBRARY_PATH"] = ":".join(libraries)
    rc, out, err = module.run_command(command, environ_update=environment, cwd=root)
    missing = re.search(r"No module named '([A-Za-z0-9_]+)", err)
    if missing:
        # The dry run stops at the first import it lacks: ask the same interpreter for every one the
        # package depends on, so that the message names them all at once.
        names = [missing.group(1)] + [n for n in DEBIAN_PACKAGES if n != missing.group(1)]
        ask = ("import importlib.util, sys; print(' '.join(n for n in sys.argv[1:] "
               "if importlib.util.find_spec(n) is None))")
        rc, out, _ = module.run_command([interpreter, "-c", ask] + names[1:], environ_update=environment)
        lacking = [names[0]] + (out.split() if rc == 0 else [])
        packages = [DEBIAN_PACKAGES.get(name, "the Python module " + name) for name in lacking]
        return None, (f"its plan needs {', '.join(packages)}, which the package's install brings (apt) and this "
                      "node lacks")
    if rc != 0:
        return None, f"the package's dry run exited {rc}: {(err.strip() or out.strip())[-300:]}"
    try:
        return json.loads(out), None
    except ValueError:
        return None, "the package's dry run printed no plan"


def not_installed(module, profile):
    """Check mode on a node the role has not installed tuned-rl on yet: the profile would be applied,
    planned by the package's own files where the role unpacked them (``unpacked``)."""
    executable = module.params["executable"]
    if not module.check_mode:
        module.fail_json(msg=f"{executable} not found: tuned-rl is not installed on this node (the role's "
                             "tuned_rl_install: deb or pip installs it)")
    why = "its plan needs tuned-rl"
    if module.params["unpacked"]:
        plan, why = unpacked_plan(module, profile_file(module, profile))
        if plan is not None:
            result = {"changed": True, "steps": plan["steps"], "reverted": [],
                      "msg": f"tuned-rl is not installed yet ({executable} not found): once installed, the "
                             f"profile {profile} would be applied, each step verified; planned by the package's "
                             "own dry run, unpacked to a temporary directory"}
            if module._diff:
                result["diff"] = live_diff(plan)
            module.exit_json(**result)
    content = module.params["content"]
    if content is None and os.path.exists(profile):
        with open(profile, encoding="utf-8", errors="replace") as handle:
            content = handle.read()
    result = {"changed": True, "steps": [], "reverted": [],
              "msg": f"tuned-rl is not installed yet ({executable} not found): once installed, the profile "
                     f"{profile} would be applied, each step verified; {why}"}
    if module._diff:
        result["diff"] = {"before": "", "after": content or "", "before_header": f"tuned-rl not installed; {why}",
                          "after_header": f"profile {profile}, to be applied"}
    module.exit_json(**result)


def present(module):
    profile = module.params["profile"]
    if not profile:
        module.fail_json(msg="state=present needs profile")
    if executable_path(module) is None:
        not_installed(module, profile)
    profile = profile_file(module, profile)
    rc, out, err = run(module, "apply", profile, "--dry-run", "--json")
    if rc != 0:
        module.fail_json(msg=f"tuned-rl apply --dry-run exited {rc}: {err.strip()}", rc=rc)
    plan = json_of(module, rc, out, err, "apply --dry-run")
    status = json_of(module, *run(module, "status", "--json"), "status")
    holds = (status["digest"] is not None and status["digest"] == plan.get("digest") and not status["stale"]
             and all(c["state"] == "holds" for c in status["changes"]))
    if holds:
        module.exit_json(changed=False, steps=[], reverted=[], msg="the profile is applied and every value holds")
    changes = any(step["outcome"] == "planned" for step in plan["steps"]) or status["digest"] is not None
    result = {"changed": changes, "steps": plan["steps"], "reverted": []}
    if module._diff:
        result["diff"] = live_diff(plan)
    if module.check_mode or not changes:
        module.exit_json(**result)
    args = ["apply", profile, "--json"] + ([] if module.params["verify"] else ["--no-verify"])
    rc, out, err = run(module, *args)
    report = json_of(module, rc, out, err, "apply")
    result["steps"] = report["steps"]
    result["reverted"] = [s["step"] for s in report["steps"] if s["outcome"] == "reverted"]
    if rc != 0:
        module.fail_json(msg=f"tuned-rl apply failed (exit {rc}): a step failed and was undone", **result)
    if result["reverted"] and module.params["fail_on_reverted"]:
        module.fail_json(msg=f"steps reverted: {', '.join(result['reverted'])}", **result)
    module.exit_json(**result)


def absent(module):
    if executable_path(module) is None:
        module.exit_json(changed=False, steps=[], msg=f"{module.params['executable']} not found: tuned-rl is "
                         "not installed here, so it has applied nothing this role can roll back")
    status = json_of(module, *run(module, "status", "--json"), "status")
    applied = bool(status["changes"]) or status["profile"] is not None
    result = {"changed": applied, "steps": []}
    if module._diff and applied:
        result["diff"] = {"before": "".join(f"{c['target']} = {c['current']}\n" for c in status["changes"]),
                          "after": "".join(f"{c['target']} = {c['before']}\n" for c in status["changes"])}
    if module.check_mode or not applied:
        module.exit_json(**result)
    rc, out, err = run(module, "rollback", "--json")
    report = json_of(module, rc, out, err, "rollback")
    result["steps"] = report["changes"]
    if rc != 0:
        module.fail_json(msg=f"tuned-rl rollback exited {rc}", **result)
    module.exit_json(**result)


def main():
    module = AnsibleModule(
        argument_spec={
            "profile": {"type": "path"},
            "content": {"type": "str", "no_log": False},
            "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
            "verify": {"type": "bool", "default": True},
            "fail_on_reverted": {"type": "bool", "default": False},
            "executable": {"type": "str", "default": "tuned-rl"},
            "state_dir": {"type": "path"},
            "unpacked": {"type": "path"},
        },
        supports_check_mode=True,
    )
    (present if module.params["state"] == "present" else absent)(module)


if __name__ == "__main__":
    main()
