#!/usr/bin/env python3
"""Write a keyplan plan for the encrypted OSDs of a Rook cluster (OSDs on PVCs backed by local
block PersistentVolumes), one device per OSD, each on its node, each with its own key: the
Secret `rook-ceph-osd-encryption-key-<pvc>` Rook wrote (data key `dmcrypt-key`), adopted in
place by the first `keyplan apply` (README, "Migrating from Rook").

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
    if args.role is not None:
        for what, ns in (("--namespace", args.namespace), ("--role", args.role)):
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
        '    verbs: ["get", "update"]',
        '  - apiGroups: ["coordination.k8s.io"]',
        '    resources: ["leases"]',
        '    verbs: ["create"]',
        '  - apiGroups: [""]',
        '    resources: ["configmaps"]',
        "    # The report of each node of the plan; never keyplan-plan or keyplan-agent.",
        "    resourceNames:",
        *(f"      - {json.dumps(r)}" for r in reports),
        '    verbs: ["get", "update"]',
        '  - apiGroups: [""]',
        '    resources: ["configmaps"]',
        "    # A node's first report, and the list of all reports. Never add update here.",
        '    verbs: ["create", "list"]',
        '  - apiGroups: [""]',
        '    resources: ["events"]',
        '    verbs: ["create"]',
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


if __name__ == "__main__":
    main()
