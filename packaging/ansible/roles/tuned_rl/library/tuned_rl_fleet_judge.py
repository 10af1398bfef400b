#!/usr/bin/python
"""Ansible module: judge treated nodes against control nodes through Prometheus (tuned-rl fleet judge)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: tuned_rl_fleet_judge
short_description: Compare the treated nodes' latency with the untreated nodes' over the same hours
description:
  - Runs C(tuned-rl fleet judge --json) where the task runs (the controller, with C(delegate_to)): it reads
    every node's C(tuned_rl_runqueue_latency_seconds) histogram from Prometheus's HTTP API and decides
    whether the treated nodes' p999 is worse than the control nodes' beyond the tolerance.
  - Returns C(outcome) (pass, fail or inconclusive), C(reason) and each node's figures; it fails the
    task only when the judge could not run (bad input, Prometheus unreadable). What to do on C(fail)
    is the play's: the roll-out play rolls the wave back.
  - Check mode reads nothing (nothing was applied, so there is nothing to judge) and says what it
    would compare.
options:
  prometheus:
    description: The Prometheus server, http://HOST:9090.
    type: str
    required: true
  treated:
    description: The treated nodes, by the value of C(node_label) on their series.
    type: list
    elements: str
    required: true
  control:
    description: The control (untreated) nodes, by the value of C(node_label).
    type: list
    elements: str
    required: true
  selector:
    description: Label matchers every node's series must match, such as job="tuned-rl",node_class="a100".
    type: str
    default: ""
  node_label:
    description: The label that names a node.
    type: str
    default: instance
  window:
    description: Seconds of the window judged, ending now (the soak).
    type: float
    default: 900
  step:
    description: Seconds of a sub-window, at least the scrape interval.
    type: float
    default: 60
  changed_at:
    description: Unix seconds at which the treated nodes changed; each node's window before it is
      compared too (so a node's own level leaves the test). Not given, nodes are compared as they are.
    type: float
  tolerance:
    description: A treated p999 this much worse (0.1 is x1.1) is not a regression.
    type: float
    default: 0.1
  harm:
    description: A pass rules out a treated p999 this many times the control's.
    type: float
    default: 1.5
  executable:
    description: The tuned-rl command where the task runs.
    type: str
    default: tuned-rl
"""

RETURN = r"""
outcome:
  description: pass, fail or inconclusive (the judge's verdict); "not judged" in check mode.
  type: str
  returned: always
reason:
  description: What decided, with its figures.
  type: str
  returned: always
nodes:
  description: Each node's figures (p999, waits, the sub-windows left out and why).
  type: list
  returned: when judged
report:
  description: The judge's whole --json report.
  type: dict
  returned: when judged
"""

import json

from ansible.module_utils.basic import AnsibleModule

OUTCOMES = {0: "pass", 1: "fail", 3: "inconclusive"}


def command(params):
    line = [params["executable"], "fleet", "judge", "--prometheus", params["prometheus"],
            "--treated-nodes", ",".join(params["treated"]), "--control-nodes", ",".join(params["control"]),
            "--node-label", params["node_label"], "--window", f"{params['window']:g}", "--step",
            f"{params['step']:g}", "--tolerance", f"{params['tolerance']:g}", "--harm", f"{params['harm']:g}",
            "--json"]
    if params["selector"]:
        line += ["--selector", params["selector"]]
    if params["changed_at"] is not None:
        line += ["--changed-at", f"{params['changed_at']:.3f}"]
    return line


def main():
    module = AnsibleModule(
        argument_spec={
            "prometheus": {"type": "str", "required": True},
            "treated": {"type": "list", "elements": "str", "required": True},
            "control": {"type": "list", "elements": "str", "required": True},
            "selector": {"type": "str", "default": ""},
            "node_label": {"type": "str", "default": "instance"},
            "window": {"type": "float", "default": 900.0},
            "step": {"type": "float", "default": 60.0},
            "changed_at": {"type": "float"},
            "tolerance": {"type": "float", "default": 0.1},
            "harm": {"type": "float", "default": 1.5},
            "executable": {"type": "str", "default": "tuned-rl"},
        },
        supports_check_mode=True,
    )
    params = module.params
    if not params["treated"] or not params["control"]:
        module.fail_json(msg="the fleet judge needs treated and control nodes, at least one of each "
                             f"(treated: {len(params['treated'])}, control: {len(params['control'])})")
    if module.check_mode:
        module.exit_json(changed=False, outcome="not judged", command=command(params),
                         reason=f"check mode: would compare {len(params['treated'])} treated node(s) "
                                f"({', '.join(params['treated'])}) with {len(params['control'])} control node(s) "
                                f"({', '.join(params['control'])}) over the last {params['window']:g} s, from "
                                f"{params['prometheus']}")
    rc, out, err = module.run_command(command(params))
    if rc not in OUTCOMES:
        module.fail_json(msg=f"tuned-rl fleet judge exited {rc}: {err.strip() or out.strip()}", rc=rc)
    try:
        report = json.loads(out)
    except ValueError:
        module.fail_json(msg=f"tuned-rl fleet judge exited {rc} without a report: {err.strip()}", rc=rc)
    module.exit_json(changed=False, outcome=OUTCOMES[rc], reason=report.get("reason", ""),
                     nodes=report.get("nodes", []), report=report, command=command(params))


if __name__ == "__main__":
    main()
