//! `keyplan validate`.

use super::*;

pub(super) fn cmd_validate(cli: &Cli, arg: &PlanArg, json: bool) -> Result<ExitCode> {
    match load_plan(cli, arg) {
        Ok(plan) => {
            if json {
                outln!(
                    "{}",
                    serde_json::json!({"format_version": "1.0", "valid": true, "error_count": 0, "warning_count": 0, "diagnostics": []})
                );
            } else {
                outln!(
                    "The plan file {} is valid: {} KMS, {} keys, {} devices.",
                    plan.source_path.display(),
                    plan.kms.len(),
                    plan.keys.len(),
                    plan.devices.len()
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) if json => {
            outln!(
                "{}",
                serde_json::json!({"format_version": "1.0", "valid": false, "error_count": 1, "warning_count": 0,
                    "diagnostics": [{"severity": "error", "summary": e.to_string(), "detail": format!("{e:?}")}]})
            );
            Ok(ExitCode::from(1))
        }
        Err(e) => Err(e),
    }
}
