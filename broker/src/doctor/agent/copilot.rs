//! The GitHub Copilot CLI row of doctor's host-agent table: Courier's hook file in the Copilot
//! home as install wrote it, and a trusted Copilot binary with its dist dir's code. Nothing is
//! checked when Copilot is neither set up nor present.

use super::Context;
use crate::doctor::Check;
use crate::store::Store;

pub(super) fn checks(ctx: &Context) -> Vec<Check> {
    let Some(setup) = ctx.manifest.and_then(|m| m.copilot.as_ref()) else {
        let home = ctx.env.copilot_home.clone().map(std::path::PathBuf::from).or_else(|| ctx.env.home.as_ref().map(|h| h.join(".copilot")));
        return match home.is_some_and(|h| h.is_dir()) {
            true => vec![Check::warn(
                "GitHub Copilot CLI is set up here but Courier is not registered with it: its sessions get no messages",
                Some("broker install".into()),
            )],
            false => Vec::new(),
        };
    };
    let hooks = match std::fs::read_to_string(&setup.hooks_file) {
        Ok(text) if text == setup.written => Check::ok(format!("Copilot CLI hooks registered in {}", setup.hooks_file.display())),
        Ok(_) => Check::warn(format!("{} changed since install", setup.hooks_file.display()), Some("broker install".into())),
        Err(e) => Check::fail(format!("Copilot CLI hook file {}: {e}", setup.hooks_file.display()), "broker install"),
    };
    let binaries: Vec<_> = Store::open(ctx.state_dir)
        .and_then(|s| s.trusted_host_files(crate::copilot::HOST))
        .map(|files| files.into_iter().filter(|f| f.role == crate::copilot::trust::BINARY).collect())
        .unwrap_or_default();
    // With a person key set, only the rows the person signed count (store/hosts.rs).
    let key = crate::person::PersonKey::current();
    let counting = binaries.iter().filter(|f| f.honoured(&key)).count();
    let trust = match (binaries.len(), counting) {
        (0, _) => Check::fail(
            "no GitHub Copilot CLI binary is trusted: every Copilot hook is refused (untrusted_copilot)",
            "broker trust-copilot PATH-OF-THE-NATIVE-BINARY",
        ),
        (n, 0) => Check::fail(
            format!("{n} GitHub Copilot CLI binary digest(s) recorded, none signed by the person key: every Copilot hook is refused (untrusted_copilot)"),
            "broker trust-copilot PATH-OF-THE-NATIVE-BINARY (with the person's passphrase)",
        ),
        (_, n) => Check::ok(format!("{n} GitHub Copilot CLI binary digest(s) trusted, with the code each unpacks")),
    };
    vec![hooks, trust]
}
