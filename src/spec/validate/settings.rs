//! Settings (`settings`): the PBKDF of new keyslots, `parallelism` and `memory_budget_kib`.

use super::{
    p, Ctx, Issue, PbkdfSettings, ARGON2_MEMORY_KIB, ARGON2_MIN_ITERATIONS, DEFAULT_PARALLELISM,
    PBKDF2_MIN_ITERATIONS,
};
use crate::spec::model::{FleetFile, PbkdfType, SettingsFile};
use crate::spec::Fleet;

/// Checks `settings` and returns `parallelism` (default [`DEFAULT_PARALLELISM`]).
///
/// Issues, in this order: those of [`check_pbkdf`], `keyplan::plan::parallelism`
/// (`parallelism: 0`), `keyplan::plan::memory_budget` (`memory_budget_kib: 0`).
pub(super) fn check_settings(settings: &SettingsFile, cx: &mut Ctx) -> usize {
    if let Some(pbkdf) = &settings.pbkdf {
        check_pbkdf(pbkdf, cx);
    }

    let parallelism = settings.parallelism.unwrap_or(DEFAULT_PARALLELISM);
    if parallelism == 0 {
        cx.push(Issue {
            path: p(&["settings", "parallelism"]),
            code: "keyplan::plan::parallelism",
            message: "`parallelism` is 0: no device could be worked on".to_owned(),
            label: "must be 1 or more".to_owned(),
            help: format!(
                "set `parallelism` to 1 or more (devices worked on at once), or remove it for the default {DEFAULT_PARALLELISM}"
            ),
            also: Vec::new(),
        });
    }

    if settings.memory_budget_kib == Some(0) {
        cx.push(Issue {
            path: p(&["settings", "memory_budget_kib"]),
            code: "keyplan::plan::memory_budget",
            message: "`memory_budget_kib` is 0: no PBKDF run could start".to_owned(),
            label: "must be 1 or more".to_owned(),
            help: "set the KiB the PBKDF runs of one apply may use at once, or remove it for the default (half the available memory)".to_owned(),
            also: Vec::new(),
        });
    }
    parallelism
}

/// `settings.pbkdf` against the limits cryptsetup 2.6 enforces when it adds a keyslot, so a
/// bad value is refused here rather than by `luksAddKey` in the middle of a run (after a new
/// key version was staged).
///
/// Issues, all `keyplan::plan::pbkdf`, in this order: `iterations` below cryptsetup's minimum
/// for the type, `iter_time_ms: 0`, for Argon2 `memory_kib` outside [`ARGON2_MEMORY_KIB`],
/// settings that would mean nothing (`iter_time_ms` beside `iterations`; `memory_kib` or
/// `parallel` with pbkdf2), and for Argon2 `parallel: 0`.
fn check_pbkdf(pbkdf: &PbkdfSettings, cx: &mut Ctx) {
    let at = |f: &str| p(&["settings", "pbkdf", f]);
    let argon2 = pbkdf.kind != PbkdfType::Pbkdf2;
    let kind = match pbkdf.kind {
        PbkdfType::Argon2id => "argon2id",
        PbkdfType::Argon2i => "argon2i",
        PbkdfType::Pbkdf2 => "pbkdf2",
    };
    if let Some(i) = pbkdf.iterations {
        let min = if argon2 {
            ARGON2_MIN_ITERATIONS
        } else {
            PBKDF2_MIN_ITERATIONS
        };
        if i < min {
            cx.push(Issue {
                path: at("iterations"),
                code: "keyplan::plan::pbkdf",
                message: format!(
                    "`iterations: {i}` is too low for {kind}: cryptsetup refuses fewer than {min}"
                ),
                label: format!("at least {min}"),
                help: format!(
                    "set `iterations` to {min} or more, or remove it (and set `iter_time_ms`) to let cryptsetup choose by benchmark"
                ),
                also: Vec::new(),
            });
        }
    }
    if let Some(t) = pbkdf.iter_time_ms {
        if t == 0 {
            cx.push(Issue {
                path: at("iter_time_ms"),
                code: "keyplan::plan::pbkdf",
                message: "`iter_time_ms: 0` asks for a PBKDF that takes no time".to_owned(),
                label: "must be 1 or more".to_owned(),
                help: "set `iter_time_ms` to the unlock time wanted in milliseconds (cryptsetup's default is 2000), or remove it".to_owned(),
                also: Vec::new(),
            });
        }
    }
    if let Some(m) = pbkdf.memory_kib {
        let (lo, hi) = ARGON2_MEMORY_KIB;
        if argon2 && !(lo..=hi).contains(&m) {
            cx.push(Issue {
                path: at("memory_kib"),
                code: "keyplan::plan::pbkdf",
                message: format!(
                    "`memory_kib: {m}` is outside what cryptsetup accepts for {kind} ({lo} KiB to {hi} KiB = 4 GiB)"
                ),
                label: format!("must be {lo} to {hi}"),
                help: format!(
                    "set `memory_kib` between {lo} and {hi} (e.g. 1048576 for 1 GiB), no more than the smallest machine that must unlock the device has; or remove it for cryptsetup's default"
                ),
                also: Vec::new(),
            });
        }
    }
    check_pbkdf_ignored(pbkdf, argon2, cx);
    if let Some(0) = pbkdf.parallel {
        if argon2 {
            cx.push(Issue {
                path: at("parallel"),
                code: "keyplan::plan::pbkdf",
                message: "`parallel: 0`: Argon2 needs at least one thread".to_owned(),
                label: "must be 1 or more".to_owned(),
                help: "set `parallel` to 1 or more (cryptsetup uses at most the number of CPUs), or remove it for cryptsetup's default".to_owned(),
                also: Vec::new(),
            });
        }
    }
}

/// Settings that would be ignored: `iter_time_ms` beside `iterations`, and Argon2's memory and
/// threads with `type: pbkdf2`.
fn check_pbkdf_ignored(pbkdf: &PbkdfSettings, argon2: bool, cx: &mut Ctx) {
    let at = |f: &str| p(&["settings", "pbkdf", f]);
    if let (Some(_), Some(t)) = (pbkdf.iterations, pbkdf.iter_time_ms) {
        cx.push(Issue {
            path: at("iter_time_ms"),
            code: "keyplan::plan::pbkdf",
            message: format!(
                "`iter_time_ms: {t}` beside `iterations`: forced iterations take no benchmark, so the unlock time would be ignored"
            ),
            label: "meaningless beside `iterations`".to_owned(),
            help: "keep one: `iterations` for a fixed count, or `iter_time_ms` for a count cryptsetup measures for that unlock time".to_owned(),
            also: Vec::new(),
        });
    }
    if !argon2 {
        for (field, set) in [
            ("memory_kib", pbkdf.memory_kib.is_some()),
            ("parallel", pbkdf.parallel.is_some()),
        ] {
            if set {
                cx.push(Issue {
                    path: at(field),
                    code: "keyplan::plan::pbkdf",
                    message: format!(
                        "`{field}` with `type: pbkdf2`: PBKDF2 has no memory cost and no threads, so it would be ignored"
                    ),
                    label: "meaningless for pbkdf2".to_owned(),
                    help: format!(
                        "remove `{field}`, or set `type: argon2id` (LUKS2) to use it"
                    ),
                    also: Vec::new(),
                });
            }
        }
    }
}

/// `settings.fleet`, with defaults ([`Fleet::default`]).
///
/// Issues, `keyplan::plan::fleet`, in this order: `max_concurrent_nodes: 0`,
/// `max_failed_nodes: 0`, a `namespace` that is not a DNS-1123 label (lowercase letters,
/// digits and `-`, at most 63 characters, as Kubernetes requires of namespace names).
pub(super) fn check_fleet(fleet: Option<&FleetFile>, cx: &mut Ctx) -> Fleet {
    let mut out = Fleet::default();
    let Some(f) = fleet else {
        return out;
    };
    let at = |field: &str| p(&["settings", "fleet", field]);
    let issue = |field: &str, message: String, label: &str, help: String| Issue {
        path: at(field),
        code: "keyplan::plan::fleet",
        message,
        label: label.to_owned(),
        help,
        also: Vec::new(),
    };
    for (field, value, slot, what) in [
        (
            "max_concurrent_nodes",
            f.max_concurrent_nodes,
            &mut out.max_concurrent_nodes,
            "no node could ever apply",
        ),
        (
            "max_failed_nodes",
            f.max_failed_nodes,
            &mut out.max_failed_nodes,
            "the rollout would be stopped before it starts",
        ),
    ] {
        match value {
            Some(0) => cx.push(issue(
                field,
                format!("`{field}` is 0: {what}"),
                "must be 1 or more",
                format!("set `{field}` to 1 or more, or remove it for the default 1"),
            )),
            Some(n) => *slot = n,
            None => {}
        }
    }
    if let Some(ns) = &f.namespace {
        if super::syntax::is_dns_label(ns) {
            out.namespace = ns.clone();
        } else {
            cx.push(issue(
                "namespace",
                format!("`namespace` {ns:?} is not a Kubernetes namespace name"),
                "not a DNS-1123 label",
                "use lowercase letters, digits and `-`, starting and ending with a letter or digit, at most 63 characters, e.g. `keyplan`".to_owned(),
            ));
        }
    }
    out
}
