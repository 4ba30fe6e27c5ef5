//! Settings (`settings`): the PBKDF of new keyslots, `parallelism` and `memory_budget_kib`.

use super::{
    p, Ctx, Issue, PbkdfSettings, ARGON2_MEMORY_KIB, ARGON2_MIN_ITERATIONS, DEFAULT_PARALLELISM,
    PBKDF2_MIN_ITERATIONS,
};
use crate::spec::model::{PbkdfType, SettingsFile};

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
/// for the type, `iter_time_ms: 0`, and for Argon2 `memory_kib` outside [`ARGON2_MEMORY_KIB`]
/// and `parallel: 0`.
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
