//! `keyplan device forget`: stop remembering a device that left the plan for good
//! ([`crate::ops::device`]).

use super::*;

/// `keyplan device` and its subcommand.
#[derive(Debug, Args)]
pub struct DeviceArgs {
    /// The device subcommand.
    #[command(subcommand)]
    pub command: DeviceCommand,
}

/// `keyplan device` subcommands.
#[derive(Debug, Subcommand)]
pub enum DeviceCommand {
    /// Stop remembering a device that left the plan for good (the state directory's
    /// devices.json): the key versions it may hold are then no longer kept for it, and a
    /// device that cannot be read no longer holds back every version's destruction.
    Forget {
        /// The device's id when keyplan last worked on it (as `plan` names it).
        id: String,
        /// The plan file (`-f`, `--plan`).
        #[command(flatten)]
        plan: PlanArg,
        /// The LUKS UUID of the one to forget, when several devices had that id.
        #[arg(long, value_name = "UUID")]
        uuid: Option<String>,
        /// Forget it even though it is present now with the same LUKS UUID: the next
        /// rotation may retire the key versions it holds, and it then opens with no key the
        /// KMS holds.
        #[arg(long)]
        even_if_present: bool,
    },
}

/// Runs `keyplan device ...`.
pub(super) fn run(cli: &Cli, args: &DeviceArgs) -> Result<Exit> {
    match &args.command {
        DeviceCommand::Forget {
            id,
            plan,
            uuid,
            even_if_present,
        } => cmd_device_forget(cli, plan, id, uuid.as_deref(), *even_if_present),
    }
}

/// `keyplan device forget ID`: removes a device gone for good from the state directory's
/// registry ([`ops::device::forget`]).
pub(super) fn cmd_device_forget(
    cli: &Cli,
    arg: &PlanArg,
    id: &str,
    uuid: Option<&str>,
    even_if_present: bool,
) -> Result<Exit> {
    let plan = load_plan(cli, arg)?;
    let engine = Engine::open(plan.clone()).or_report(&plan)?;
    let gone = ops::device::forget(&engine, id, uuid, even_if_present).or_report(&plan)?;
    for (u, e) in &gone {
        outln!(
            "Forgot device {} ({}, LUKS UUID {u}): the key versions it may hold are no longer kept for it.",
            e.id,
            e.path.display()
        );
    }
    Ok(Exit::Success)
}
