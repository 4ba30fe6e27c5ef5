//! One node's part of a plan (fleet mode, docs/fleet.md): a plan may describe a whole cluster,
//! each device naming the Kubernetes node it is on (`node:`); `plan`, `apply` and `status` on a
//! host act only on the devices of its node and on the keys they list. `validate` checks the
//! whole file.

use std::collections::{BTreeMap, BTreeSet};

use super::Plan;

/// What [`Plan::for_node`] left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeScope {
    /// The node this plan was cut for.
    pub node: String,
    /// Devices of the plan on other nodes: count by node name.
    pub elsewhere: BTreeMap<String, usize>,
    /// Keys left out because no device of this node lists them (their devices are elsewhere,
    /// or they are on no device at all in a plan that names nodes), in id order.
    pub keys_left_out: Vec<String>,
    /// Of [`NodeScope::keys_left_out`], those no device of the whole plan lists: no node
    /// rotates them.
    pub keys_unused: Vec<String>,
    /// Devices of the plan on this node.
    pub devices_here: usize,
}

impl NodeScope {
    /// One line for people, or `None` when nothing was left out: e.g. `node n1: 12 devices of
    /// the plan are on other nodes (n2: 5, n3: 7) and 3 keys are used only there; keyplan on
    /// those nodes handles them`.
    pub fn note(&self) -> Option<String> {
        let devices: usize = self.elsewhere.values().sum();
        let mut parts = Vec::new();
        let mut by_node: Vec<String> = self
            .elsewhere
            .iter()
            .take(5)
            .map(|(n, c)| format!("{n}: {c}"))
            .collect();
        if self.elsewhere.len() > 5 {
            by_node.push(format!("{} more nodes", self.elsewhere.len() - 5));
        }
        if self.devices_here == 0 {
            parts.push(format!(
                "node {}: no device of the plan is on this node (the plan's devices are on {}); if this host is one of those, give its node with `--node` or `$NODE_NAME`",
                self.node,
                by_node.join(", ")
            ));
        } else if devices > 0 {
            let elsewhere_keys = self.keys_left_out.len() - self.keys_unused.len();
            let keys = match elsewhere_keys {
                0 => String::new(),
                1 => " and 1 key is used only there".to_string(),
                n => format!(" and {n} keys are used only there"),
            };
            parts.push(format!(
                "node {}: {devices} device{} of the plan {} on other nodes ({}){keys}; keyplan on those nodes handles them",
                self.node,
                if devices == 1 { "" } else { "s" },
                if devices == 1 { "is" } else { "are" },
                by_node.join(", ")
            ));
        }
        if !self.keys_unused.is_empty() {
            parts.push(format!(
                "no device of the plan lists key{} {}, so no node rotates {}: in a plan for several nodes a key belongs to the node of its devices",
                if self.keys_unused.len() == 1 { "" } else { "s" },
                self.keys_unused.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", "),
                if self.keys_unused.len() == 1 { "it" } else { "them" },
            ));
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

impl Plan {
    /// This plan's holder id in KMS holder records ([`crate::kms::Kms::hold`], invariant I7):
    /// `<node>:<state directory>`, the node being the one the plan was cut down to
    /// ([`Plan::for_node`]), else the host name (lowercase); the state directory is absolute.
    /// Two plans on one host have distinct state directories (each has its own lock), and a
    /// node's agent keeps its state directory across restarts, so the id names one plan
    /// stably. The directory is canonical (symlinks, `..` and a trailing `/` resolved; for a
    /// directory not created yet, its parent), so every spelling of it gives the same id.
    pub fn holder(&self) -> String {
        format!(
            "{}:{}",
            self.holder_node(),
            canonical(&self.state_dir).display()
        )
    }

    /// The node part of [`Plan::holder`]: the node the plan was cut down to, else the host
    /// name (lowercase).
    pub fn holder_node(&self) -> String {
        match (&self.node, &self.scope) {
            (Some(n), _) => n.clone(),
            (None, Some(s)) => s.node.clone(),
            (None, None) => this_node(None).unwrap_or_default(),
        }
    }

    /// Whether any device names a node (a plan for a cluster rather than one host).
    pub fn names_nodes(&self) -> bool {
        self.devices.values().any(|d| d.node.is_some())
    }

    /// This plan cut down to node `node`: the devices whose `node` is `node` or unset (the
    /// running host), and the keys those devices list; [`Plan::scope`] says what was left
    /// out. A plan that names no node is returned unchanged (every device is this host's), so
    /// single-host plans behave as before. KMS instances and settings are kept whole.
    ///
    /// A key no device lists is kept only in a plan that names no node: in a cluster plan no
    /// one node owns it. Linear in the number of devices.
    pub fn for_node(mut self, node: &str) -> Plan {
        self.node = Some(node.to_string());
        if !self.names_nodes() {
            return self;
        }
        let listed: BTreeSet<String> = self
            .devices
            .values()
            .flat_map(|d| d.keys.iter().map(|k| k.key.clone()))
            .collect();
        let mut elsewhere: BTreeMap<String, usize> = BTreeMap::new();
        let mut others: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        self.devices.retain(|_, d| match d.node.as_deref() {
            Some(n) if n != node => {
                *elsewhere.entry(n.to_string()).or_default() += 1;
                for k in &d.keys {
                    others
                        .entry(k.key.clone())
                        .or_default()
                        .insert(n.to_string());
                }
                false
            }
            _ => true,
        });
        let used: BTreeSet<&str> = self
            .devices
            .values()
            .flat_map(|d| d.keys.iter().map(|k| k.key.as_str()))
            .collect();
        let keys_left_out: Vec<String> = self
            .keys
            .keys()
            .filter(|k| !used.contains(k.as_str()))
            .cloned()
            .collect();
        for k in &keys_left_out {
            self.keys.remove(k);
        }
        self.peers = others
            .into_iter()
            .filter(|(k, _)| used.contains(k.as_str()))
            .collect();
        let keys_unused = keys_left_out
            .iter()
            .filter(|k| !listed.contains(*k))
            .cloned()
            .collect();
        self.scope = Some(NodeScope {
            node: node.to_string(),
            elsewhere,
            keys_unused,
            devices_here: self.devices.len(),
            keys_left_out,
        });
        self
    }
}

/// The node keyplan runs on: `explicit` (`--node`, which clap also takes from `$NODE_NAME`, as
/// the downward API sets it in a pod) when given, else the host name (gethostname(2)),
/// lowercased as Kubernetes names nodes.
///
/// Errors: a text saying why when `explicit` is empty or not a Kubernetes node name (a
/// DNS-1123 subdomain), so a typo in a DaemonSet is not a node that silently matches nothing.
pub fn this_node(explicit: Option<&str>) -> Result<String, String> {
    match explicit {
        Some(n) if super::validate::is_node_name(n) => Ok(n.to_string()),
        Some(n) => Err(format!(
            "--node (or $NODE_NAME) {n:?} is not a Kubernetes node name: give the node's name as `kubectl get nodes` shows it (lowercase letters, digits, `-` and `.`), or unset it to use the host name"
        )),
        None => Ok(gethostname::gethostname()
            .to_string_lossy()
            .trim()
            .to_ascii_lowercase()),
    }
}

/// `dir` made absolute and canonical: `fs::canonicalize` of it, else of its nearest existing
/// ancestor with the rest appended, else [`std::path::absolute`].
fn canonical(dir: &std::path::Path) -> std::path::PathBuf {
    let abs = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
    if let Ok(c) = std::fs::canonicalize(&abs) {
        return c;
    }
    let mut rest = Vec::new();
    let mut at = abs.as_path();
    while let Some(parent) = at.parent() {
        if let Some(name) = at.file_name() {
            rest.push(name.to_os_string());
        }
        if let Ok(mut c) = std::fs::canonicalize(parent) {
            for part in rest.iter().rev() {
                c.push(part);
            }
            return c;
        }
        at = parent;
    }
    abs
}
