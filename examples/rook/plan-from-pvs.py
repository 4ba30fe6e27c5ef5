#!/usr/bin/env python3
"""Write a keyplan plan for the encrypted OSDs of a Rook cluster (OSDs on PVCs backed by local
block PersistentVolumes), one device per OSD, each on its node, each with its own key: the
Secret `rook-ceph-osd-encryption-key-<pvc>` Rook wrote (data key `dmcrypt-key`), adopted in
place by the first `keyplan apply` (docs/operations.md, "Migrating from Rook").

    kubectl get pv -o json | examples/rook/plan-from-pvs.py --namespace rook-ceph > keyplan.yaml
    keyplan validate -f keyplan.yaml

With `--role`, writes instead the RBAC `keyplan agent` needs for that plan: the whole of
deploy/kubernetes/rbac.yaml, for your cluster.

- In the fleet namespace (`--role NAMESPACE`, default keyplan) the Role `keyplan-agent`
  (exactly `keyplan::fleet::api::AGENT_CALLS`): `get`/`update` of the rollout slot Leases
  keyplan-rollout-0 .. keyplan-rollout-<N-1> (N: `--max-concurrent-nodes`, the plan's
  `settings.fleet.max_concurrent_nodes`) and of the node reports keyplan-node-<node>, one per
  node of the plan, by `resourceNames`; `create` of Leases, `create`/`list` of ConfigMaps and
  `create` of Events, which RBAC cannot limit by name. Never `update` of every ConfigMap,
  which would let a node's token rewrite the plan and the agent configuration.
- In `--namespace` the Role `keyplan-osd-keys`: `get`, `update` and `delete` of exactly the
  Secrets the plan names (by `resourceNames`), and `create` of Secrets (not limitable by name;
  keyplan's check before an apply asks for it).
- A RoleBinding of each to the ServiceAccount `keyplan` of the fleet namespace.

Give it the same `--namespace`, `--storage-class` and `--max-concurrent-nodes` as the plan,
and regenerate both when OSDs, nodes or `--max-concurrent-nodes` change:

    kubectl get pv -o json > pvs.json
    examples/rook/plan-from-pvs.py --max-concurrent-nodes 2 < pvs.json > keyplan.yaml
    examples/rook/plan-from-pvs.py --max-concurrent-nodes 2 --role < pvs.json > rbac.yaml

Reads the PersistentVolume list (core/v1 PersistentVolumeList JSON) on stdin and takes the PVs
that are `Bound` to a claim in `--namespace` (Rook's namespace) and, when given, of
`--storage-class`, are raw block volumes (`spec.volumeMode: Block`, as Rook's OSDs on PVC are),
have a `spec.local.path` (the block device on the node) and pin one node in
`spec.nodeAffinity` (`kubernetes.io/hostname`, whose value is the node name on most clusters;
check with `kubectl get nodes --show-labels` where it is not). Prints YAML on stdout; the PVs
of that namespace it skips are listed on stderr with the reason, those in `Filesystem` mode
(Rook's mons on PVC, for example; a PV without `volumeMode` is one) counted on one line (PVs
of other namespaces are not Rook's and skipped silently). Names and paths are written as
plain YAML scalars where that reads back as the same string, else quoted (a JSON string), so
a claim named `null`, `true` or `1e3` stays a name. Exits 1, printing nothing on stdout, when
the input is not a PersistentVolume list, when `--max-concurrent-nodes` is below 1, or, with
`--role`, when no OSD is found (a rule with no `resourceNames` would grant every Secret or
ConfigMap of the namespace).
"""

import argparse
import hashlib
import json
import re
import sys

HOSTNAME_LABEL = "kubernetes.io/hostname"
SECRET_PREFIX = "rook-ceph-osd-encryption-key-"
ROLE_NAME = "keyplan-osd-keys"
AGENT_ROLE_NAME = "keyplan-agent"
SERVICE_ACCOUNT = "keyplan"
SLOT_PREFIX = "keyplan-rollout-"
REPORT_PREFIX = "keyplan-node-"
# An object name: a DNS-1123 subdomain.
DNS_SUBDOMAIN_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# A namespace name: a DNS-1123 label.
NAMESPACE_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
# A scalar that may be written plain, in block and in flow context ...
PLAIN_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*")
# ... unless YAML (1.1 or 1.2) would read it as something other than a string: null, a
# boolean, a number (decimal, binary, octal, hex, sexagesimal, exponent), infinity, NaN or a
# timestamp.
NOT_A_STRING = (
    {"~", "null", "true", "false", "yes", "no", "on", "off", "y", "n"},
    re.compile(
        r"[-+]?(0b[01_]+|0o?[0-7_]+|0x[0-9a-f_]+|[0-9][0-9_]*(\.[0-9_.]*)?(e[-+]?[0-9]+)?"
        r"|\.[0-9][0-9_.]*(e[-+]?[0-9]+)?|[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?|\.inf)"
        r"|\.nan"
    ),
    re.compile(r"[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}"),
)


def y(s):
    """`s` as a YAML scalar that reads back as the string `s`: plain when that is safe, else a
    JSON string (which YAML reads as the same string)."""
    words, number, timestamp = NOT_A_STRING
    plain = (
        PLAIN_RE.fullmatch(s)
        and s.lower() not in words
        and not number.fullmatch(s.lower())
        and not timestamp.match(s)
    )
    return s if plain else json.dumps(s)


def node_of(pv):
    """The one node the PV's required node affinity names, or None."""
    terms = (((pv.get("spec") or {}).get("nodeAffinity") or {}).get("required") or {}).get(
        "nodeSelectorTerms"
    ) or []
    values = set()
    for term in terms:
        for e in term.get("matchExpressions") or []:
            if e.get("key") == HOSTNAME_LABEL and e.get("operator") == "In":
                values.update(e.get("values") or [])
    return values.pop() if len(values) == 1 else None


def report_name(node):
    """The ConfigMap name of node's report, as `keyplan::fleet::report::report_name` writes
    it: keyplan-node-<node>, or for a node name over 240 bytes its first 200 and a hash."""
    raw = node.encode()
    if len(raw) <= 240:
        return REPORT_PREFIX + node
    tag = hashlib.sha256(raw).hexdigest()[:16]
    try:
        head = raw[:200].decode()
    except UnicodeDecodeError:
        head = node
    return f"{REPORT_PREFIX}{head.rstrip('.-')}-{tag}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--namespace", default="rook-ceph", help="Rook's namespace (default rook-ceph)")
    ap.add_argument("--storage-class", help="only PVs of this StorageClass")
    ap.add_argument("--rotate-after", default="90d", help="rotate_after of every key (default 90d)")
    ap.add_argument(
        "--max-concurrent-nodes",
        type=int,
        default=1,
        help="settings.fleet.max_concurrent_nodes of the plan; with --role, the rollout slot "
        "Leases granted (default 1)",
    )
    ap.add_argument(
        "--policy",
        nargs="?",
        const="keyplan",
        metavar="NAMESPACE",
        help="write the plan's admission policy instead of the plan: the ValidatingAdmissionPolicy "
        "that holds each agent (ServiceAccount keyplan of NAMESPACE, default keyplan) to its own "
        "node's report, slot, Events and OSD Secrets, and its binding",
    )
    ap.add_argument(
        "--role",
        nargs="?",
        const="keyplan",
        metavar="NAMESPACE",
        help="write the plan's RBAC instead of the plan: the agent's Role in NAMESPACE (the fleet "
        "namespace, default keyplan) and the Secrets Role in --namespace, each bound to the "
        "ServiceAccount keyplan of NAMESPACE",
    )
    args = ap.parse_args()
    if args.max_concurrent_nodes < 1:
        sys.exit(
            f"--max-concurrent-nodes {args.max_concurrent_nodes} is below 1; nothing was written"
        )
    if args.role is not None and args.policy is not None:
        sys.exit("--role and --policy write different files; give one; nothing was written")
    for what, ns in (("--namespace", args.namespace), ("--role", args.role), ("--policy", args.policy)):
        if ns is not None:
            if not NAMESPACE_RE.match(ns):
                sys.exit(f"{what} {ns!r} is not a Kubernetes namespace name; nothing was written")

    try:
        doc = json.load(sys.stdin)
    except json.JSONDecodeError as e:
        sys.exit(f"stdin is not JSON ({e}); pipe `kubectl get pv -o json` in")
    if not isinstance(doc, dict) or not isinstance(doc.get("items", []), list):
        sys.exit("stdin is not a PersistentVolume list (`kubectl get pv -o json`)")
    osds = find_osds(doc.get("items") or [], args)
    if args.role is not None:
        write_role(osds, args)
    elif args.policy is not None:
        write_policy(osds, args)
    else:
        write_plan(osds, args)
    print(f"{len(osds)} OSDs on {len({n for _, n, _ in osds})} nodes", file=sys.stderr)


def find_osds(pvs, args):
    """The (pvc, node, path) of each OSD PV, in no order; prints each skipped PV on stderr."""
    osds = []
    claims = set()
    not_block = []
    for pv in pvs:
        name = (pv.get("metadata") or {}).get("name", "?")
        spec = pv.get("spec") or {}
        claim = spec.get("claimRef") or {}
        if claim.get("namespace") != args.namespace:
            continue
        if args.storage_class and spec.get("storageClassName") != args.storage_class:
            continue
        # Kubernetes defaults volumeMode to Filesystem; an OSD on PVC is a Block volume.
        if spec.get("volumeMode", "Filesystem") != "Block":
            not_block.append(name)
            continue
        path = (spec.get("local") or {}).get("path")
        node = node_of(pv)
        phase = (pv.get("status") or {}).get("phase", "Bound")
        pvc = claim.get("name")
        why = None
        if phase != "Bound":
            why = f"phase {phase}, not Bound"
        elif not pvc:
            why = "claimRef has no name"
        elif pvc in claims:
            why = f"claim {pvc} already has a PV"
        elif not path:
            why = "no spec.local.path"
        elif not node:
            why = f"no single {HOSTNAME_LABEL} node affinity"
        if why:
            print(f"skipped PV {name}: {why}", file=sys.stderr)
            continue
        claims.add(pvc)
        osds.append((pvc, node, path))
    if not_block:
        print(
            f"skipped {len(not_block)} PV(s) of namespace {args.namespace} not in volumeMode Block "
            f"({', '.join(not_block)}): a Filesystem PV (a mon's, for example) is no OSD device",
            file=sys.stderr,
        )
    return osds


def write_plan(osds, args):
    """Prints the plan: one key (its Rook Secret) and one device per OSD."""
    out = [
        "# Generated by examples/rook/plan-from-pvs.py; one key per OSD (its Rook Secret).",
        "version: 1",
        "kms:",
        f"  rook: {{ provider: kubernetes, namespace: {y(args.namespace)} }}",
        "keys:" if osds else "keys: {}",
    ]
    for pvc, _, _ in sorted(osds):
        out.append(
            f"  {y(pvc)}: {{ kms: rook, name: {y(SECRET_PREFIX + pvc)}, "
            f"rotate_after: {y(args.rotate_after)} }}"
        )
    out.append("devices:" if osds else "devices: {}")
    for pvc, node, path in sorted(osds):
        out.append(f"  {y(pvc)}: {{ path: {json.dumps(path)}, node: {y(node)}, keys: [{y(pvc)}] }}")
    out += [
        "settings:",
        f"  fleet: {{ max_concurrent_nodes: {args.max_concurrent_nodes}, max_failed_nodes: 1 }}",
    ]
    print("\n".join(out))


def write_role(osds, args):
    """Prints the plan's RBAC: the agent's Role in the fleet namespace (slot Leases and node
    reports by name), the Role of the plan's Secrets (get/update/delete by name, create), and
    a RoleBinding of each to the agent's ServiceAccount."""
    if not osds:
        sys.exit(
            f"no OSD PV found in namespace {args.namespace}, so no Secret to grant; nothing was "
            "written (a Role with no resourceNames would grant every Secret of the namespace)"
        )
    fleet = args.role
    slots = [f"{SLOT_PREFIX}{i}" for i in range(args.max_concurrent_nodes)]
    reports = sorted({report_name(node) for _, node, _ in osds})
    secrets = [SECRET_PREFIX + pvc for pvc, _, _ in sorted(osds)]

    def q(names):
        return "[" + ", ".join(json.dumps(n) for n in names) + "]"

    def meta(name, namespace):
        return [
            "metadata:",
            f"  name: {name}",
            f"  namespace: {y(namespace)}",
            "  labels:",
            "    app.kubernetes.io/name: keyplan",
            "    app.kubernetes.io/component: agent",
            "    app.kubernetes.io/part-of: keyplan",
        ]

    def binding(name, namespace):
        return [
            "apiVersion: rbac.authorization.k8s.io/v1",
            "kind: RoleBinding",
            *meta(name, namespace),
            "roleRef:",
            "  apiGroup: rbac.authorization.k8s.io",
            "  kind: Role",
            f"  name: {name}",
            "subjects:",
            "  - kind: ServiceAccount",
            f"    name: {SERVICE_ACCOUNT}",
            f"    namespace: {y(fleet)}",
        ]

    out = [
        "# Generated by examples/rook/plan-from-pvs.py --role: keyplan agent's RBAC for a plan of",
        f"# {len(osds)} OSD(s) on {len(reports)} node(s), max_concurrent_nodes "
        f"{args.max_concurrent_nodes}. Regenerate it when",
        "# they change; deploy/kubernetes/rbac.yaml explains every rule.",
        "apiVersion: rbac.authorization.k8s.io/v1",
        "kind: Role",
        *meta(AGENT_ROLE_NAME, fleet),
        "rules:",
        '  - apiGroups: ["coordination.k8s.io"]',
        '    resources: ["leases"]',
        "    # The rollout slots keyplan-rollout-0 .. keyplan-rollout-<max_concurrent_nodes - 1>.",
        f"    resourceNames: {q(slots)}",
        '    verbs: ["update"]',
        '  - apiGroups: ["coordination.k8s.io"]',
        '    resources: ["leases"]',
        "    # A slot's first holder creates it; a waiting agent watches them all.",
        '    verbs: ["create", "list", "watch"]',
        '  - apiGroups: [""]',
        '    resources: ["configmaps"]',
        "    # The report of each node of the plan; never keyplan-plan or keyplan-agent.",
        "    resourceNames:",
        *(f"      - {json.dumps(r)}" for r in reports),
        '    verbs: ["get", "update"]',
        '  - apiGroups: [""]',
        '    resources: ["configmaps"]',
        "    # A node's first report, and the list and watch of all reports. Never add update here.",
        '    verbs: ["create", "list", "watch"]',
        '  - apiGroups: [""]',
        '    resources: ["events"]',
        "    # A repeated Event is patched (its count), not written again.",
        '    verbs: ["create", "patch"]',
        "---",
        *binding(AGENT_ROLE_NAME, fleet),
        "---",
        "# get, update and delete of the OSD encryption key Secrets the plan names, by name only;",
        "# create of Secrets, which RBAC cannot limit by name (a known over-grant: keyplan's check",
        "# before an apply asks for it).",
        "apiVersion: rbac.authorization.k8s.io/v1",
        "kind: Role",
        *meta(ROLE_NAME, args.namespace),
        "rules:",
        '  - apiGroups: [""]',
        '    resources: ["secrets"]',
        "    resourceNames:",
        *(f"      - {json.dumps(n)}" for n in secrets),
        '    verbs: ["get", "update", "delete"]',
        '  - apiGroups: [""]',
        '    resources: ["secrets"]',
        '    verbs: ["create"]',
        "---",
        *binding(ROLE_NAME, args.namespace),
    ]
    print("\n".join(out))


# What the agents' ServiceAccount may write, node by node (deploy/kubernetes/admission-policy.yaml
# explains every rule). `{user}` and `{secrets}` are filled in by write_policy; CEL string
# literals are single-quoted (Kubernetes names hold no quote).
POLICY = """\
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: keyplan-agent-node-scope
  labels:
    app.kubernetes.io/name: keyplan
    app.kubernetes.io/component: agent
    app.kubernetes.io/part-of: keyplan
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - apiGroups: [""]
        apiVersions: ["*"]
        operations: ["CREATE", "UPDATE", "DELETE"]
        resources: ["configmaps", "events", "secrets"]
      - apiGroups: ["coordination.k8s.io"]
        apiVersions: ["*"]
        operations: ["CREATE", "UPDATE", "DELETE"]
        resources: ["leases"]
  matchConditions:
    - name: the-keyplan-agents
      expression: {user}
  variables:
    - name: node
      expression: "has(request.userInfo.extra) && 'authentication.kubernetes.io/node-name' in request.userInfo.extra && size(request.userInfo.extra['authentication.kubernetes.io/node-name']) == 1 ? request.userInfo.extra['authentication.kubernetes.io/node-name'][0] : ''"
    - name: name
      expression: "request.operation == 'DELETE' ? oldObject.metadata.name : object.metadata.name"
    - name: report
      expression: "'keyplan-node-' + variables.node"
    - name: holder
      expression: "request.resource.resource == 'leases' && request.operation != 'DELETE' && has(object.spec) && has(object.spec.holderIdentity) ? object.spec.holderIdentity : ''"
    - name: oldHolder
      expression: "request.resource.resource == 'leases' && request.operation == 'UPDATE' && has(oldObject.spec) && has(oldObject.spec.holderIdentity) ? oldObject.spec.holderIdentity : ''"
    - name: secretsByNode
      expression: {secrets}
    - name: ownSecrets
      expression: "variables.node in variables.secretsByNode ? variables.secretsByNode[variables.node] : []"
  validations:
    - expression: "variables.node != ''"
      reason: Forbidden
      message: "a keyplan agent's credential must name its node (user extra authentication.kubernetes.io/node-name): use the pod's projected service-account token, not a token without a pod"
    - expression: "variables.node == '' || request.resource.resource != 'configmaps' || (request.operation != 'DELETE' && variables.name == variables.report)"
      reason: Forbidden
      messageExpression: "'node ' + variables.node + ' may write only its own report, ConfigMap ' + variables.report + '; refused: ' + request.operation + ' of ConfigMap ' + variables.name"
    - expression: "variables.node == '' || request.resource.resource != 'leases' || (variables.name.startsWith('keyplan-rollout-') && (request.operation == 'CREATE' ? variables.holder == variables.node : request.operation == 'UPDATE' && (variables.holder == variables.node || (variables.oldHolder == variables.node && variables.holder == ''))))"
      reason: Forbidden
      messageExpression: "'node ' + variables.node + ' may hold a rollout slot only as itself and release only a slot it holds; refused: ' + request.operation + ' of Lease ' + variables.name + ' (holder ' + variables.oldHolder + ' -> ' + variables.holder + ')'"
    - expression: "variables.node == '' || request.resource.resource != 'events' || (request.operation != 'DELETE' && has(object.involvedObject.name) && object.involvedObject.name == variables.report && has(object.related) && has(object.related.name) && object.related.name == variables.node && (request.operation != 'UPDATE' || (has(oldObject.involvedObject.name) && oldObject.involvedObject.name == variables.report)))"
      reason: Forbidden
      messageExpression: "'node ' + variables.node + ' may write only Events about its own report (' + variables.report + ') and node; refused: ' + request.operation + ' of Event ' + variables.name"
    - expression: "variables.node == '' || request.resource.resource != 'secrets' || variables.ownSecrets.exists(s, variables.name == s || variables.name == s + '-keyplan' || (variables.name.startsWith(s + '-v') && variables.name.substring(size(s) + 2).matches('^[0-9]+$')))"
      reason: Forbidden
      messageExpression: "'node ' + variables.node + ' may write only the key Secrets of its own OSDs; refused: ' + request.operation + ' of Secret ' + variables.name"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: keyplan-agent-node-scope
  labels:
    app.kubernetes.io/name: keyplan
    app.kubernetes.io/component: agent
    app.kubernetes.io/part-of: keyplan
spec:
  policyName: keyplan-agent-node-scope
  validationActions: ["Deny"]"""


def write_policy(osds, args):
    """Prints the plan's admission policy: POLICY for the agents' ServiceAccount of the fleet
    namespace, with the Secrets of each node's OSDs."""
    if not osds:
        sys.exit(
            f"no OSD PV found in namespace {args.namespace}; nothing was written (a policy "
            "without OSDs would refuse every key write)"
        )
    by_node = {}
    for pvc, node, _ in sorted(osds):
        for what, name in (("node", node), ("claim", pvc)):
            # CEL string literals are written single-quoted: only DNS-1123 names go in.
            if not DNS_SUBDOMAIN_RE.fullmatch(name):
                sys.exit(
                    f"{what} {name!r} is not a Kubernetes object name (lowercase letters, "
                    "digits, '-' and '.'); nothing was written"
                )
        by_node.setdefault(node, []).append(SECRET_PREFIX + pvc)
    # The policy lets a node write its Secrets' secret-per-version names too (<name>-keyplan,
    # <name>-v<N>): no such name may be another node's Secret.
    for node, names in by_node.items():
        for other, theirs in by_node.items():
            for mine in names:
                for t in theirs if other != node else []:
                    if t == mine + "-keyplan" or re.fullmatch(re.escape(mine) + r"-v[0-9]+", t):
                        sys.exit(
                            f"Secret {t} of node {other} is also a version name of {mine} of "
                            f"node {node}, so the policy could not keep them apart; nothing "
                            "was written"
                        )
    cel = "{" + ", ".join(
        f"'{node}': [" + ", ".join(f"'{n}'" for n in names) + "]"
        for node, names in sorted(by_node.items())
    ) + "}"
    user = f"system:serviceaccount:{args.policy}:{SERVICE_ACCOUNT}"
    print(
        "\n".join(
            [
                "# Generated by examples/rook/plan-from-pvs.py --policy: what each keyplan agent may",
                f"# write, for a plan of {len(osds)} OSD(s) on {len(by_node)} node(s). Regenerate it with rbac.yaml",
                "# when they change; deploy/kubernetes/admission-policy.yaml explains every rule.",
                POLICY.format(
                    user=json.dumps(f"request.userInfo.username == '{user}'"),
                    secrets=json.dumps(cel),
                ),
            ]
        )
    )


if __name__ == "__main__":
    main()
